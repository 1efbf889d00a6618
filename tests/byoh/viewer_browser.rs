//! The session viewer in a real browser: Debian's `chromium`, headless, driven through
//! `chromedriver` by Selenium's WebDriver client (`tests/support/viewer_browser.py`; `.ci/run`
//! installs all three). A wrong credential is refused, sign-in leads to the list, a session's
//! page shows a command's output, hostile transcript text stays text (no alert, no element, no
//! request to the canary it names), a running session's row turns `completed` and a session
//! submitted after the list loaded appears on it, both without a reload; at a phone's width nothing but the table (in its own scrolling box) is wider than
//! the screen. Screenshots are kept in `target/tmp/viewer-browser/`.
//!
//! Where the browser cannot run, the test says so on stderr and passes only outside CI; with
//! `CI=true` it fails.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::harness::{Serve, T, TOKEN, start};
use crate::openai_fake::{FakeModel, Reply};

/// How long the browser gets for each part (it starts in a few seconds on a slow machine).
const BROWSER: Duration = Duration::from_secs(90);

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// Why the browser cannot run here, if it cannot.
fn missing() -> Option<String> {
    for bin in [CHROMIUM, CHROMEDRIVER] {
        if !Path::new(bin).exists() {
            return Some(format!(
                "{bin} is missing (apt-get install chromium chromium-driver)"
            ));
        }
    }
    let selenium = std::process::Command::new("python3")
        .args(["-c", "import selenium"])
        .status();
    if !selenium.is_ok_and(|s| s.success()) {
        return Some("python3 cannot import selenium (pip install selenium)".into());
    }
    None
}

/// A listener that counts the connections made to it: hostile text names it, and a browser
/// that acted on that text would connect.
async fn canary() -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let hits = Arc::new(AtomicUsize::new(0));
    let count = hits.clone();
    tokio::spawn(async move {
        while listener.accept().await.is_ok() {
            count.fetch_add(1, Ordering::SeqCst);
        }
    });
    (addr, hits)
}

fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "'\\''"))
}

#[tokio::test]
async fn the_viewer_works_in_a_real_browser() {
    if let Some(why) = missing() {
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "the browser test cannot run in CI: {why}"
        );
        eprintln!("SKIPPED the_viewer_works_in_a_real_browser: {why}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (canary, hits) = canary().await;
    let marker = "marker-7d1e";
    let hostile = format!(
        "<script>fetch('http://{canary}/script')</script> \"><img src=http://{canary}/img \
         onerror=alert(1)> <a href=\"javascript:alert(2)\">click</a> {marker}"
    );
    let fake = FakeModel::start("fake-model", Some("k")).await;
    fake.push([
        Reply::call(
            "c1",
            "bash",
            json!({ "command": format!("printf '%s' {}", shell_quote(&hostile)) }),
        ),
        Reply::text(&hostile),
    ]);
    let s = Serve::start(dir.path());
    s.submit(start(
        "s-done",
        "i-done",
        &hostile,
        &fake.base_url(),
        Some("k"),
    ))
    .await;
    s.wait_status("i-done", "completed", T).await;
    let before = fake.count();
    fake.push([Reply::Hang(Box::new(Reply::text("finished")))]);
    s.submit(start("s-run", "i-run", "wait", &fake.base_url(), Some("k")))
        .await;
    s.wait_status("i-run", "running", T).await;
    // `running` is said before the model is called; the release below must find the call
    // hanging, not come before it.
    fake.wait_requests(before + 1, T).await;

    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("viewer-browser");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/viewer_browser.py");
    let mut child = tokio::process::Command::new("python3")
        .arg(script)
        .args(["--url", &s.url, "--token", TOKEN, "--done", "i-done"])
        .args(["--running", "i-run", "--new", "i-new", "--marker", marker])
        .args(["--chromium", CHROMIUM, "--chromedriver", CHROMEDRIVER])
        .arg("--shots")
        .arg(&shots)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut stdin = child.stdin.take().unwrap();
    let line = tokio::time::timeout(BROWSER, lines.next_line())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(line.as_deref(), Some("watching"), "{}", s.log_tail());
    fake.push([Reply::text("new")]);
    s.submit(start("s-new", "i-new", "new", &fake.base_url(), Some("k")))
        .await;
    fake.release();
    stdin.write_all(b"released\n").await.unwrap();
    let line = tokio::time::timeout(BROWSER, lines.next_line())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(line.as_deref(), Some("ok"), "{}", s.log_tail());
    let status = tokio::time::timeout(BROWSER, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());
    assert_eq!(
        hits.load(Ordering::SeqCst),
        0,
        "the hostile text made the browser connect"
    );
    for shot in ["viewer-list.png", "viewer-session.png", "viewer-phone.png"] {
        assert!(shots.join(shot).metadata().unwrap().len() > 1000, "{shot}");
    }
}
