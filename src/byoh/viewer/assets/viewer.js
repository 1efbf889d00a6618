// The viewer's one script (served from /ui/assets/, so the page's Content-Security-Policy
// needs no 'unsafe-inline'): sign-in and cancel post JSON, and pages with `data-live` follow
// their rows through server-sent events (a list's first page, `data-grow`, also adds the rows
// it lacks: sessions submitted after it loaded). Text from the server is only ever set as
// textContent, never as markup, and rows are built with createElement.
"use strict";

function postJson(url, body) {
  return fetch(url, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
    credentials: "same-origin",
  });
}

async function messageOf(resp) {
  try {
    const body = await resp.json();
    return (body.error && body.error.message) || resp.statusText;
  } catch (e) {
    return resp.status + " " + resp.statusText;
  }
}

function signIn(form) {
  const out = document.getElementById("signin-result");
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const credential = document.getElementById("credential").value;
    const resp = await postJson("/ui/signin", { credential });
    if (resp.ok) {
      window.location.assign("/ui/");
    } else {
      out.textContent = await messageOf(resp);
    }
  });
}

function cancelButton(button) {
  const out = document.getElementById("cancel-result");
  button.addEventListener("click", async () => {
    button.disabled = true;
    const resp = await postJson("/ui/cancel", {
      invocation_id: button.dataset.invocation,
      session_id: button.dataset.session,
      csrf: button.dataset.csrf,
    });
    if (resp.ok) {
      out.textContent = "cancelled (status: " + (await resp.json()).status + ")";
    } else {
      out.textContent = await messageOf(resp);
      button.disabled = false;
    }
  });
}

// The element of row `id`: a table row with that data-id, or the facts of one session.
function rowOf(root, id) {
  if (root.tagName !== "TABLE") return root;
  for (const tr of root.querySelectorAll("tbody tr")) {
    if (tr.dataset.id === id) return tr;
  }
  return null;
}

// The cells of a list row after its first (the link and the session id), in the table's
// order, each with its class: the same cells the server draws.
const CELLS = [
  ["status", "status"], ["started", ""], ["duration", ""], ["steps", ""],
  ["tool_calls", ""], ["tokens_in", ""], ["tokens_out", ""], ["error", "err"],
];

// A new, empty row for session `row` (the live update fills its cells).
function newRow(row) {
  const tr = document.createElement("tr");
  tr.dataset.id = row.id;
  const first = document.createElement("td");
  const link = document.createElement("a");
  link.href = "/ui/session?" + new URLSearchParams({ id: row.id });
  link.textContent = row.id;
  const session = document.createElement("div");
  session.className = "sub";
  session.textContent = row.session;
  first.append(link, session);
  tr.append(first);
  for (const [field, cls] of CELLS) {
    const td = document.createElement("td");
    td.dataset.f = field;
    if (cls) td.className = cls;
    tr.append(td);
  }
  return tr;
}

// The element of row `id`; on a growing list (its first page), a row it lacks is added
// after `prev` (the row before it in the event, newest first), or at the top.
function rowOrNew(root, row, prev) {
  const el = rowOf(root, row.id);
  if (el || root.dataset.grow === undefined) return el;
  const tr = newRow(row);
  if (prev) prev.after(tr);
  else root.tBodies[0].prepend(tr);
  const empty = document.querySelector("p.empty");
  if (empty) empty.remove();
  return tr;
}

function follow(root) {
  const source = new EventSource(root.dataset.live);
  source.addEventListener("rows", (ev) => {
    let prev = null;
    for (const row of JSON.parse(ev.data)) {
      const el = rowOrNew(root, row, prev);
      if (!el) continue;
      prev = el;
      for (const [field, value] of Object.entries(row)) {
        const cell = el.querySelector('[data-f="' + field + '"]');
        if (!cell || cell.textContent === value) continue;
        cell.textContent = value;
        if (field === "status") cell.className = "status st-" + value;
      }
    }
  });
}

document.addEventListener("DOMContentLoaded", () => {
  const form = document.getElementById("signin");
  if (form) signIn(form);
  const cancel = document.getElementById("cancel");
  if (cancel) cancelButton(cancel);
  for (const root of document.querySelectorAll("[data-live]")) follow(root);
});
