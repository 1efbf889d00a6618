// The viewer's one script (served from /ui/assets/, so the page's Content-Security-Policy
// needs no 'unsafe-inline'): sign-in and cancel post JSON, and pages with `data-live` follow
// their rows through server-sent events. Text from the server is only ever set as
// textContent, never as markup.
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

function follow(root) {
  const source = new EventSource(root.dataset.live);
  source.addEventListener("rows", (ev) => {
    for (const row of JSON.parse(ev.data)) {
      const el = rowOf(root, row.id);
      if (!el) continue;
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
