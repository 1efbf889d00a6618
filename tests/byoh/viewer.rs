//! The session viewer at `/ui/`: sign-in with the credential and the cookie it sets, pages that
//! need that cookie, untrusted text escaped under a Content-Security-Policy without
//! `unsafe-inline`, cancel only with the page's CSRF token, and the browser defences of the
//! API (foreign `Origin` and `Host`, non-JSON posts) holding for `/ui/` too. The real-browser
//! checks are in `viewer_browser`.

use pretty_assertions::assert_eq;
use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::{Value, json};

use crate::harness::{Options, Serve, T, TOKEN, spawn, start};
use crate::openai_fake::{FakeModel, Reply};

/// What a transcript may hold that must never act in a browser.
pub const XSS: &str = "<script>alert('xss')</script> \"><img src=x onerror=alert(1)> \
                       <a href=\"javascript:alert(2)\">click</a>";

/// The policy the viewer's answers carry.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; \
                   base-uri 'none'";

/// A client that does not follow redirects (they are what is checked).
fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(T)
        .build()
        .unwrap()
}

/// `POST /ui/signin` with `credential` and extra headers: the status, the headers, the body.
async fn sign_in(
    s: &Serve,
    credential: &str,
    extra: &[(&str, &str)],
) -> (StatusCode, HeaderMap, Value) {
    let mut req = client()
        .post(format!("{}/ui/signin", s.url))
        .json(&json!({ "credential": credential }));
    for (k, v) in extra {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let (status, headers) = (resp.status(), resp.headers().clone());
    let body = resp.json().await.unwrap_or(Value::Null);
    (status, headers, body)
}

/// The cookie a sign-in with the right credential sets (`name=value`).
async fn cookie(s: &Serve) -> String {
    let (status, headers, _) = sign_in(s, TOKEN, &[]).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let set = headers["set-cookie"].to_str().unwrap();
    set.split(';').next().unwrap().to_owned()
}

/// `GET route` with `cookie` (if any): the status, the headers, the body as text.
async fn get(s: &Serve, route: &str, cookie: Option<&str>) -> (StatusCode, HeaderMap, String) {
    let mut req = client().get(format!("{}{route}", s.url));
    if let Some(c) = cookie {
        req = req.header("cookie", c);
    }
    let resp = req.send().await.unwrap();
    let (status, headers) = (resp.status(), resp.headers().clone());
    (status, headers, resp.text().await.unwrap())
}

#[tokio::test]
async fn sign_in_refuses_a_wrong_credential_and_sets_a_strict_cookie() {
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start(dir.path());
    let (status, headers, body) = sign_in(&s, "not-the-credential", &[]).await;
    assert_eq!(
        (status, body),
        (
            StatusCode::UNAUTHORIZED,
            json!({"error": {"message": "the credential is wrong"}})
        )
    );
    assert!(headers.get("set-cookie").is_none());
    let (_, headers, _) = sign_in(&s, TOKEN, &[]).await;
    let set = headers["set-cookie"].to_str().unwrap();
    let (value, flags) = set.split_once(';').unwrap();
    assert_eq!(flags, " Path=/ui; HttpOnly; SameSite=Strict");
    let digest = value.strip_prefix("podhost_ui=").unwrap();
    assert!(
        digest.len() == 64 && digest.chars().all(|c| c.is_ascii_hexdigit()),
        "{set}"
    );
    assert!(!set.contains(TOKEN));
    // Behind a TLS front the cookie is for HTTPS only.
    let (_, headers, _) = sign_in(&s, TOKEN, &[("x-forwarded-proto", "https")]).await;
    let set = headers["set-cookie"].to_str().unwrap();
    assert_eq!(
        set.split_once(';').unwrap().1,
        " Path=/ui; HttpOnly; SameSite=Strict; Secure"
    );
}

#[tokio::test]
async fn pages_need_the_cookie() {
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start(dir.path());
    for route in ["/ui/", "/ui/session?id=i"] {
        for c in [None, Some("podhost_ui=0000")] {
            let (status, headers, _) = get(&s, route, c).await;
            assert_eq!(
                (status, headers["location"].to_str().unwrap()),
                (StatusCode::SEE_OTHER, "/ui/signin"),
                "{route} {c:?}"
            );
        }
    }
    let (status, _, body) = get(&s, "/ui/events", None).await;
    assert_eq!(
        (status, serde_json::from_str::<Value>(&body).unwrap()),
        (
            StatusCode::UNAUTHORIZED,
            json!({"error": {"message": "sign in at /ui/signin first"}})
        )
    );
    // The bearer credential of the API does not open the pages either.
    let resp = client()
        .get(format!("{}/ui/", s.url))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);
    let c = cookie(&s).await;
    let (status, headers, body) = get(&s, "/ui/", Some(&c)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(headers["content-type"], "text/html; charset=utf-8");
    assert!(body.contains("<h1>Sessions</h1>"), "{body}");
}

/// Runs a session whose task, answer and command output hold [`XSS`]; answers the server.
async fn hostile_session(dir: &std::path::Path) -> (Serve, FakeModel) {
    let fake = FakeModel::start("fake-model", Some("k")).await;
    let command = format!("printf '%s' {}", shell_quote(XSS));
    fake.push([
        Reply::call("c1", "bash", json!({ "command": command })),
        Reply::text(XSS),
    ]);
    let s = Serve::start(dir);
    s.submit(start("s-1", "i-1", XSS, &fake.base_url(), Some("k")))
        .await;
    s.wait_status("i-1", "completed", T).await;
    (s, fake)
}

fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "'\\''"))
}

#[tokio::test]
async fn untrusted_text_is_escaped_under_a_policy_without_inline_code() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _fake) = hostile_session(dir.path()).await;
    let c = cookie(&s).await;
    for route in ["/ui/", "/ui/session?id=i-1", "/ui/signin"] {
        let (status, headers, body) = get(&s, route, Some(&c)).await;
        assert_eq!(status, StatusCode::OK, "{route}: {body}");
        assert_eq!(headers["content-security-policy"], CSP, "{route}");
        assert_eq!(headers["x-content-type-options"], "nosniff");
        assert!(!CSP.contains("unsafe-inline"));
        // No markup but the page's own: every script is the embedded file, no inline style.
        assert_eq!(
            body.matches("<script").count(),
            body.matches("<script src=\"/ui/assets/viewer.js\" defer></script>")
                .count(),
            "{route}: {body}"
        );
        for raw in ["<img", "<a href=\"javascript:", "style="] {
            assert!(!body.contains(raw), "{route} holds {raw:?}: {body}");
        }
    }
    let (_, _, page) = get(&s, "/ui/session?id=i-1", Some(&c)).await;
    let escaped = "&lt;script&gt;alert(&#39;xss&#39;)&lt;/script&gt; &quot;&gt;&lt;img src=x \
                   onerror=alert(1)&gt; &lt;a href=&quot;javascript:alert(2)&quot;&gt;click\
                   &lt;/a&gt;";
    // The task, the command's output and the answer: each shown, as text.
    assert_eq!(page.matches(escaped).count(), 3, "{page}");
    assert!(page.contains("call: bash"), "{page}");
    // The timeline: two model calls and the command, as bars of the server's SVG.
    assert_eq!(
        (
            page.matches("<svg class=\"timeline\"").count(),
            page.matches("<g class=\"model\"><title>model call ")
                .count(),
            page.matches("<g class=\"tool\"><title>bash: ").count()
        ),
        (1, 2, 1),
        "{page}"
    );
    // The command's exit code and how long it took (from when its call and its result were
    // stored), then its output.
    let exit = page.split("<p class=\"exit\">").nth(1).unwrap_or_default();
    let exit = exit.split("</p>").next().unwrap();
    assert!(
        exit.starts_with("exit code 0, took ") && exit.ends_with(" s"),
        "{exit}"
    );
    assert!(page.contains(" s</p><h4>stdout</h4>"), "{page}");
    // The assets are served from the binary, with their types.
    let (status, headers, js) = get(&s, "/ui/assets/viewer.js", None).await;
    assert_eq!(
        (status, &headers["content-type"]),
        (
            StatusCode::OK,
            &"text/javascript; charset=utf-8".parse().unwrap()
        )
    );
    assert!(js.contains("EventSource"));
}

#[tokio::test]
async fn cancel_needs_the_pages_csrf_token() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some("k")).await;
    fake.push([Reply::Hang(Box::new(Reply::text("late")))]);
    let s = Serve::start(dir.path());
    s.submit(start("s-1", "i-1", "wait", &fake.base_url(), Some("k")))
        .await;
    s.wait_status("i-1", "running", T).await;
    let c = cookie(&s).await;
    let (_, _, page) = get(&s, "/ui/session?id=i-1", Some(&c)).await;
    let csrf = page
        .split("data-csrf=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap_or_else(|| panic!("no cancel button: {page}"))
        .to_owned();
    let post = |csrf: String, cookie: &str| {
        client()
            .post(format!("{}/ui/cancel", s.url))
            .header("cookie", cookie)
            .json(&json!({"invocation_id": "i-1", "session_id": "s-1", "csrf": csrf}))
            .send()
    };
    let resp = post("0".repeat(64), &c).await.unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    assert_eq!(
        resp.json::<Value>().await.unwrap(),
        json!({"error": {"message": "the CSRF token is wrong: reload the session's page and cancel from it"}})
    );
    // The token alone, without the cookie, is not enough.
    let resp = post(csrf.clone(), "podhost_ui=0").await.unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(s.status("i-1").await.1["status"], "running");
    let resp = post(csrf, &c).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        resp.json::<Value>().await.unwrap(),
        json!({"status": "cancelled"})
    );
    assert_eq!(s.status("i-1").await.1["status"], "cancelled");
    fake.release();
}

#[tokio::test]
async fn the_browser_defences_hold_for_the_viewer() {
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start(dir.path());
    // A page elsewhere cannot sign in (foreign Origin) nor post a form (not JSON).
    let (status, _, body) = sign_in(&s, TOKEN, &[("origin", "https://evil.example")]).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let resp = client()
        .post(format!("{}/ui/signin", s.url))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("credential={TOKEN}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert!(resp.headers().get("set-cookie").is_none());
    // Without a credential: loopback names only (a rebinding page's Host is refused).
    let open = tempfile::tempdir().unwrap();
    let (child, url, _) = spawn(&open.path().join("data"), &Options::default()).unwrap();
    let _child = crate::harness::KillOnDrop(child);
    let resp = client()
        .get(format!("{url}/ui/"))
        .header("host", "rebound.example")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    // ... and no sign-in is asked for from loopback.
    let resp = client().get(format!("{url}/ui/")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let resp = client()
        .get(format!("{url}/ui/signin"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        (resp.status(), resp.headers()["location"].to_str().unwrap()),
        (StatusCode::SEE_OTHER, "/ui/")
    );
}

/// The first event of `/ui/events?query`, with the cookie: its name and its data as JSON.
async fn first_event(s: &Serve, query: &str, cookie: &str) -> (String, Value) {
    let mut resp = client()
        .get(format!("{}/ui/events?{query}", s.url))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut text = String::new();
    while !text.contains("\n\n") {
        let chunk = tokio::time::timeout(T, resp.chunk())
            .await
            .unwrap()
            .unwrap();
        text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
    }
    let event = text.split("\n\n").next().unwrap();
    let field = |name: &str| {
        event
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {event:?}"))
            .to_owned()
    };
    (
        field("event: "),
        serde_json::from_str(&field("data: ")).unwrap(),
    )
}

#[tokio::test]
async fn events_say_what_the_rows_are_now() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some("k")).await;
    fake.push([Reply::Hang(Box::new(Reply::text("done")))]);
    let s = Serve::start(dir.path());
    s.submit(start("s-1", "i-1", "wait", &fake.base_url(), Some("k")))
        .await;
    s.wait_status("i-1", "running", T).await;
    let c = cookie(&s).await;
    let (name, rows) = first_event(&s, "status=running", &c).await;
    assert_eq!(name, "rows");
    let row = &rows[0];
    assert_eq!(
        (
            rows.as_array().unwrap().len(),
            &row["id"],
            &row["status"],
            &row["steps"]
        ),
        (1, &json!("i-1"), &json!("running"), &json!("0"))
    );
    // `running` is said before the model is called: a release before the call arrives would
    // leave it hanging.
    fake.wait_requests(1, T).await;
    fake.release();
    s.wait_status("i-1", "completed", T).await;
    let (_, rows) = first_event(&s, "id=i-1", &c).await;
    assert_eq!(
        rows,
        json!([{"id": "i-1", "status": "completed", "error": ""}])
    );
    let (_, rows) = first_event(&s, "status=running", &c).await;
    assert_eq!(rows, json!([]));
}

#[tokio::test]
async fn the_workspace_shows_its_files_and_nothing_a_symlink_points_at() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some("k")).await;
    let command = "mkdir -p src && printf '<b>hi</b>' > src/a.txt && ln -s /etc/passwd leak \
                   && ln -s / up";
    fake.push([
        Reply::call("c1", "bash", json!({ "command": command })),
        Reply::text("done"),
    ]);
    // The workspace on the host's directory (not on a disk of its own, which only the
    // session's namespace mounts).
    let opts = Options::default().env("PODHOST_SESSION_DISK_FS", "off");
    let s = Serve::start_with(dir.path(), opts);
    s.submit(start(
        "s-1",
        "i-1",
        "make files",
        &fake.base_url(),
        Some("k"),
    ))
    .await;
    s.wait_status("i-1", "completed", T).await;
    let c = cookie(&s).await;
    let (status, _, tree) = get(&s, "/ui/files?id=i-1", Some(&c)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        tree.contains(
            "<summary>src/</summary><ul class=\"tree\"><li><a \
             href=\"/ui/files?id=i-1&amp;path=%2Fworkspace%2Fsrc%2Fa.txt\">a.txt</a> \
             <span class=\"sub\">9 B</span></li></ul>"
        ),
        "{tree}"
    );
    for link in ["leak", "up"] {
        assert!(!tree.contains(&format!(">{link}<")), "{tree}");
    }
    let file = |path: &str| {
        let route = format!("/ui/files?id=i-1&path={path}");
        let (s, c) = (&s, c.clone());
        async move { get(s, &route, Some(&c)).await }
    };
    let (_, _, text) = file("/workspace/src/a.txt").await;
    assert!(
        text.contains("<pre class=\"file\">&lt;b&gt;hi&lt;/b&gt;</pre>"),
        "{text}"
    );
    for outside in [
        "/workspace/leak",
        "/workspace/up/etc/passwd",
        "/etc/passwd",
        "../../etc/passwd",
    ] {
        let (status, _, text) = file(outside).await;
        assert_eq!(status, StatusCode::OK);
        assert!(!text.contains("root:"), "{outside}: {text}");
        assert!(!text.contains("<pre class=\"file\">"), "{outside}: {text}");
    }
    // Pages need the cookie here too.
    let (status, _, _) = get(&s, "/ui/files?id=i-1", None).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
}

/// A command racing the viewer's read — swapping the file for a symlink to `/etc/passwd`, or
/// a directory in the middle of the path for a symlink to `/etc` — never gets the viewer to
/// show what is outside, and the server keeps serving.
#[tokio::test]
async fn a_path_swapped_for_a_symlink_while_it_is_read_shows_nothing_outside() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some("k")).await;
    let command = "mkdir -p d && printf inside > d/passwd && printf inside > passwd";
    fake.push([
        Reply::call("c1", "bash", json!({ "command": command })),
        Reply::text("done"),
    ]);
    let opts = Options::default().env("PODHOST_SESSION_DISK_FS", "off");
    let s = Serve::start_with(dir.path(), opts);
    s.submit(start(
        "s-1",
        "i-1",
        "make files",
        &fake.base_url(),
        Some("k"),
    ))
    .await;
    s.wait_status("i-1", "completed", T).await;
    let c = cookie(&s).await;
    let ws = s.workspace("s-1");
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let (ws, stop) = (ws.clone(), stop.clone());
        std::thread::spawn(move || {
            let (file, dir) = (ws.join("passwd"), ws.join("d"));
            let (link, real) = (ws.join("passwd.link"), ws.join("d.real"));
            while !stop.load(Ordering::Relaxed) {
                // The file becomes a symlink out, then a file again, each by one rename.
                let _ = std::os::unix::fs::symlink("/etc/passwd", &link);
                let _ = std::fs::rename(&link, &file);
                let _ = std::fs::write(&link, "inside");
                let _ = std::fs::rename(&link, &file);
                // The directory in the middle becomes a symlink to /etc, then itself again.
                let _ = std::fs::rename(&dir, &real);
                let _ = std::os::unix::fs::symlink("/etc", &dir);
                std::thread::yield_now();
                let _ = std::fs::remove_file(&dir);
                let _ = std::fs::rename(&real, &dir);
            }
        })
    };
    let (mut shown, mut last) = (0, String::new());
    for _ in 0..300 {
        for path in ["/workspace/passwd", "/workspace/d/passwd"] {
            let (status, _, text) =
                get(&s, &format!("/ui/files?id=i-1&path={path}"), Some(&c)).await;
            assert_eq!(status, StatusCode::OK, "{path}: {text}");
            assert!(!text.contains("root:"), "{path}: {text}");
            shown += usize::from(text.contains("<pre class=\"file\">inside</pre>"));
            last = text;
        }
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    // The files inside were shown between the swaps, and the server still serves.
    assert!(shown > 0, "{last}");
    let (status, _, text) = get(&s, "/ui/files?id=i-1&path=/workspace/d/passwd", Some(&c)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(text.contains("<pre class=\"file\">inside</pre>"), "{text}");
}

/// The list, its events and a session's page show the model's tokens in and out, summed over
/// every model call of the invocation; a model that sends no usage shows "—", not zero.
#[tokio::test]
async fn tokens_in_and_out_are_the_sums_of_the_models_usage() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some("k")).await;
    fake.push([
        Reply::call("c1", "bash", json!({ "command": "true" })),
        Reply::text("done"),
    ]);
    let s = Serve::start(dir.path());
    s.submit(start("s-1", "i-1", "count", &fake.base_url(), Some("k")))
        .await;
    s.wait_status("i-1", "completed", T).await;
    // The fake reports each request's tokens as its prompt tokens, and one completion token.
    let calls = fake.requests();
    let sent: u64 = calls.iter().map(|r| r.tokens).sum();
    assert_eq!(calls.len(), 2);
    let bare = FakeModel::start("fake-model", Some("k")).await;
    bare.push([Reply::Raw(json!({
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "done"},
                     "finish_reason": "stop"}]
    }))]);
    s.submit(start("s-2", "i-2", "count", &bare.base_url(), Some("k")))
        .await;
    s.wait_status("i-2", "completed", T).await;
    let c = cookie(&s).await;
    let (_, _, list) = get(&s, "/ui/", Some(&c)).await;
    let cells = |tokens_in: &str, tokens_out: &str| {
        format!(
            "<td data-f=\"tokens_in\">{tokens_in}</td><td data-f=\"tokens_out\">{tokens_out}</td>"
        )
    };
    assert!(
        list.contains("<th>Tokens in</th><th>Tokens out</th>"),
        "{list}"
    );
    assert!(list.contains(&cells(&sent.to_string(), "2")), "{list}");
    assert!(list.contains(&cells("—", "—")), "{list}");
    let (_, _, page) = get(&s, "/ui/session?id=i-1", Some(&c)).await;
    let shown = format!("<dt>Tokens in / out</dt><dd>{sent} / 2</dd>");
    assert!(page.contains(&shown), "{page}");
    let (_, _, page) = get(&s, "/ui/session?id=i-2", Some(&c)).await;
    assert!(
        page.contains("<dt>Tokens in / out</dt><dd>— / —</dd>"),
        "{page}"
    );
    let (_, rows) = first_event(&s, "", &c).await;
    let counts = |id: &str| {
        let row = rows
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == id)
            .unwrap();
        (row["tokens_in"].clone(), row["tokens_out"].clone())
    };
    assert_eq!(counts("i-1"), (json!(sent.to_string()), json!("2")));
    assert_eq!(counts("i-2"), (json!("—"), json!("—")));
}

/// A session submitted after the list's first page loaded is in that page's events, with all a
/// script needs to draw its row (the page is marked to grow); a filter it does not match
/// leaves it out, and a later page does not grow.
#[tokio::test]
async fn a_session_submitted_after_the_page_loaded_is_in_its_events() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some("k")).await;
    fake.push([Reply::Hang(Box::new(Reply::text("done")))]);
    let s = Serve::start(dir.path());
    let c = cookie(&s).await;
    let live = |page: &str| {
        let from = page
            .split("data-live=\"/ui/events?")
            .nth(1)
            .unwrap_or_else(|| panic!("no live table: {page}"));
        from.split('"').next().unwrap().replace("&amp;", "&")
    };
    let (_, _, first) = get(&s, "/ui/", Some(&c)).await;
    assert!(
        first.contains("<p class=\"empty\">No sessions.</p>"),
        "{first}"
    );
    assert!(first.contains("<table id=\"sessions\" data-live=\"/ui/events?status=&amp;q=&amp;before_ms=&amp;before_id=\" data-grow>"), "{first}");
    let (_, _, filtered) = get(&s, "/ui/?status=running&q=s-new", Some(&c)).await;
    let (_, _, other) = get(&s, "/ui/?q=s-other", Some(&c)).await;
    let (_, _, later) = get(&s, "/ui/?before_ms=1&before_id=i", Some(&c)).await;
    assert!(!later.contains("data-grow"), "{later}");
    s.submit(start("s-new", "i-new", "wait", &fake.base_url(), Some("k")))
        .await;
    s.wait_status("i-new", "running", T).await;
    let (_, rows) = first_event(&s, &live(&first), &c).await;
    let row = &rows[0];
    assert_eq!(
        (
            rows.as_array().unwrap().len(),
            &row["id"],
            &row["session"],
            &row["status"],
            &row["tokens_in"]
        ),
        (
            1,
            &json!("i-new"),
            &json!("s-new"),
            &json!("running"),
            &json!("—")
        )
    );
    // The start time as the page draws it: `YYYY-MM-DD HH:MM:SS`.
    let started = row["started"].as_str().unwrap();
    assert!(
        started.len() == 19 && started.as_bytes()[10] == b' ',
        "{started}"
    );
    let (_, rows) = first_event(&s, &live(&filtered), &c).await;
    assert_eq!(rows.as_array().unwrap().len(), 1, "{rows}");
    let (_, rows) = first_event(&s, &live(&other), &c).await;
    assert_eq!(rows, json!([]));
    fake.release();
}

/// An idle session over the template at the overlay level shows its merged workspace, as its
/// commands saw it: the template's files it left, its own, and neither the files it deleted
/// nor those of a directory it replaced (the overlay's marks are honoured).
#[tokio::test]
async fn an_idle_template_sessions_files_show_merged_with_the_template() {
    idle_template_session_shows_merged(None).await;
}

/// The same from an unprivileged `serve` (nobody), which runs in a user namespace of its own:
/// its sessions' overlays mark deletions with `user.` attributes, which the viewer's merged view
/// reads alike.
#[tokio::test]
async fn an_unprivileged_serves_idle_template_session_shows_merged_too() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("the tests do not run as root: serve cannot be started as another user");
        return;
    }
    idle_template_session_shows_merged(Some(65534)).await;
}

/// An idle session's merged workspace, on a server that runs as `user` when given (its
/// directory and the template made that user's, as its operator would leave them).
async fn idle_template_session_shows_merged(user: Option<u32>) {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("template");
    std::fs::create_dir_all(t.join("sub")).unwrap();
    std::fs::write(t.join("README"), "from the template").unwrap();
    std::fs::write(t.join("other.txt"), "kept from the template").unwrap();
    std::fs::write(t.join("sub/old.txt"), "old").unwrap();
    if let Some(id) = user {
        for p in [dir.path(), &t, &t.join("sub"), &t.join("README")] {
            std::os::unix::fs::chown(p, Some(id), Some(id)).unwrap();
        }
        let open = std::os::unix::fs::PermissionsExt::from_mode(0o755);
        std::fs::set_permissions(dir.path(), open).unwrap();
    }
    let fake = FakeModel::start("fake-model", Some("k")).await;
    let command = "rm README && rm -r sub && mkdir sub && printf new > sub/new.txt \
                   && printf mine > mine.txt";
    fake.push([
        Reply::call("c1", "bash", json!({ "command": command })),
        Reply::text("done"),
    ]);
    let opts = Options {
        user,
        ..Options::default()
    }
    .env("PODHOST_WORKSPACE_TEMPLATE", t.to_str().unwrap())
    .env("PODHOST_SESSION_DISK_FS", "off");
    let s = Serve::start_with(dir.path(), opts);
    let (_, health) = s.call("GET", "/healthz", None).await;
    let level = health["workspace_template"]["level"]
        .as_str()
        .unwrap()
        .to_owned();
    s.submit(start("s-1", "i-1", "change", &fake.base_url(), Some("k")))
        .await;
    s.wait_status("i-1", "completed", T).await;
    let c = cookie(&s).await;
    let (status, _, tree) = get(&s, "/ui/files?id=i-1", Some(&c)).await;
    assert_eq!(status, StatusCode::OK, "{tree}");
    let file = |name: &str| format!("path=%2Fworkspace%2F{name}\">");
    for shown in ["mine.txt", "other.txt", "sub%2Fnew.txt"] {
        assert!(tree.contains(&file(shown)), "{shown}: {tree}");
    }
    for gone in ["README", "sub%2Fold.txt"] {
        assert!(!tree.contains(&file(gone)), "{gone}: {tree}");
    }
    assert!(!tree.contains("template-note"), "{tree}");
    let (_, _, page) = get(&s, "/ui/files?id=i-1&path=/workspace/other.txt", Some(&c)).await;
    assert!(
        page.contains("<pre class=\"file\">kept from the template</pre>"),
        "{page}"
    );
    let (_, _, page) = get(&s, "/ui/files?id=i-1&path=/workspace/README", Some(&c)).await;
    assert!(page.contains("nothing is at /workspace/README"), "{page}");
    if level != "overlay" {
        eprintln!("sessions cannot mount an overlay here ({level}): a copied template is checked");
    }
    // The template itself is as it was.
    assert_eq!(
        std::fs::read_to_string(t.join("README")).unwrap(),
        "from the template"
    );
    let (code, _) = s.call("GET", "/healthz", None).await;
    assert_eq!(code, StatusCode::OK);
}

/// While a turn runs, the viewer reads through its toolbox, in the session's mount namespace:
/// a workspace on a disk of its own and over the template's overlay shows whole — the
/// template's files and the session's — as the session's commands see it. Once the turn has
/// ended, the viewer mounts nothing: it reads the disk's image in user space, the session's
/// own files (its changes to the template) under the workspace's rules: no link is followed.
#[tokio::test]
async fn a_running_sessions_files_show_as_its_commands_see_them() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("template");
    std::fs::create_dir_all(&t).unwrap();
    std::fs::write(t.join("README"), "from the template").unwrap();
    let fake = FakeModel::start("fake-model", Some("k")).await;
    let command = "printf s3cret > \"$TMPDIR/secret\" && ln -s ../tmp/secret leak \
                   && ln -s ../tmp up && mkdir zz && (cd zz && touch f{1..2001}) \
                   && head -c 1048577 /dev/zero | tr '\\0' a > big.txt \
                   && printf live > seen.txt && sleep 300";
    fake.push([
        Reply::call("c1", "bash", json!({ "command": command })),
        Reply::text("done"),
    ]);
    let opts = Options::default().env("PODHOST_WORKSPACE_TEMPLATE", t.to_str().unwrap());
    let s = Serve::start_with(dir.path(), opts);
    let (_, health) = s.call("GET", "/healthz", None).await;
    let level = health["workspace_template"]["level"].clone();
    s.submit(start("s-1", "i-1", "work", &fake.base_url(), Some("k")))
        .await;
    let c = cookie(&s).await;
    let file = |name: &str| format!("path=%2Fworkspace%2F{name}\">{name}</a>");
    // The command wrote its file and sleeps: the turn runs.
    let deadline = std::time::Instant::now() + T;
    let tree = loop {
        let (status, _, tree) = get(&s, "/ui/files?id=i-1", Some(&c)).await;
        assert_eq!(status, StatusCode::OK, "{tree}");
        if tree.contains(&file("seen.txt")) {
            break tree;
        }
        assert!(std::time::Instant::now() < deadline, "{tree}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert!(tree.contains(&file("README")), "{tree}");
    assert!(!tree.contains("template-note"), "{tree}");
    let (_, _, page) = get(&s, "/ui/files?id=i-1&path=/workspace/README", Some(&c)).await;
    assert!(
        page.contains("<pre class=\"file\">from the template</pre>"),
        "{page}"
    );
    let own_disk = podhost::byoh::sandbox::session_disk_image(&s.data, "s-1").exists();
    let (status, _) = s.cancel("s-1", "i-1").await;
    assert_eq!(status, StatusCode::OK);
    s.wait_status("i-1", "cancelled", T).await;
    // The turn's end unmounts the disk, which writes what the session wrote to the image.
    let deadline = std::time::Instant::now() + T;
    let after = loop {
        let (status, _, after) = get(&s, "/ui/files?id=i-1", Some(&c)).await;
        assert_eq!(status, StatusCode::OK, "{after}");
        if after.contains(&file("seen.txt")) {
            break after;
        }
        assert!(std::time::Instant::now() < deadline, "{after}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    for link in ["leak", "up"] {
        assert!(!after.contains(&format!(">{link}<")), "{after}");
    }
    if own_disk {
        assert_eq!(level, json!("overlay"), "{health}");
        // The image holds the overlay's upper layer: the session's files, not the template's.
        assert!(after.contains("id=\"template-note\""), "{after}");
        assert!(!after.contains(&file("README")), "{after}");
        let (_, _, seen) = get(&s, "/ui/files?id=i-1&path=/workspace/seen.txt", Some(&c)).await;
        assert!(seen.contains("<pre class=\"file\">live</pre>"), "{seen}");
        // The image's listing and reads keep the viewer's caps: 2,000 files (the first in path
        // order: `zz/` comes last), 1 MiB.
        assert!(after.contains("Only the first 2000 files."), "{after}");
        let (_, _, big) = get(&s, "/ui/files?id=i-1&path=/workspace/big.txt", Some(&c)).await;
        assert!(
            big.contains(
                "/workspace/big.txt is not shown: it is 1048577 bytes, past the 1048576 shown"
            ),
            "{big}"
        );
        for (path, why) in [
            (
                "/workspace/leak",
                "/workspace/leak is not shown: it is a symbolic link",
            ),
            (
                "/workspace/up/secret",
                "/workspace/up/secret is not shown: it is a symbolic link",
            ),
            ("/workspace/nothing", "nothing is at /workspace/nothing"),
            ("/workspace/../tmp/secret", "outside"),
        ] {
            let route = format!("/ui/files?id=i-1&path={path}");
            let (status, _, page) = get(&s, &route, Some(&c)).await;
            assert_eq!(status, StatusCode::OK, "{page}");
            assert!(page.contains(why), "{path}: {page}");
            assert!(!page.contains("s3cret"), "{path}: {page}");
        }
    } else {
        eprintln!(
            "sessions have no disk of their own here (template level {level}): the host's view \
             after the turn is checked"
        );
        assert!(after.contains(&file("seen.txt")), "{after}");
    }
}
