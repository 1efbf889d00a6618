//! Starts the real `podhost serve` binary on a free loopback port and talks to it.
//!
//! The store is SQLite in the data directory, or — with `PODHOST_TEST_STORE=postgres` — a
//! database of the throwaway PostgreSQL cluster, one per data directory (kept across restarts
//! of the server on that directory), so that the same behaviour tests run against both.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::pg::TestPg;
use crate::support::podhost_bin;

pub const TOKEN: &str = "test-credential-3f9a";
pub const T: Duration = Duration::from_secs(10);

/// A running `podhost serve`; killed (SIGKILL) when dropped.
pub struct Serve {
    pub child: Child,
    pub url: String,
    pub data: PathBuf,
    logs: Arc<Mutex<String>>,
    pub http: reqwest::Client,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Kills (SIGKILL) and reaps a child when dropped, also when a test fails first.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Settings for one server.
#[derive(Clone, Default)]
pub struct Options {
    pub env: Vec<(String, String)>,
    pub token: Option<String>,
    /// The open-file limits (soft, hard) the server starts with, set by a shell before it.
    pub open_files: Option<(u64, u64)>,
    /// The uid (and gid) the server runs as, instead of the tests' own.
    pub user: Option<u32>,
}

impl Options {
    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.to_owned(), v.to_owned()));
        self
    }
}

/// Whether the behaviour tests run against PostgreSQL (`PODHOST_TEST_STORE=postgres`).
pub fn on_postgres() -> bool {
    std::env::var("PODHOST_TEST_STORE").is_ok_and(|v| v == "postgres")
}

/// The lease of the servers the tests start on PostgreSQL: short, so that a restart takes up
/// the turns its predecessor left within the tests' timeouts.
pub const TEST_LEASE_SECS: &str = "3";

/// The PostgreSQL database of the data directory `data`, created on first use.
pub fn store_url(data: &Path) -> Option<String> {
    let file = data.with_extension("pg-url");
    if let Ok(url) = std::fs::read_to_string(&file) {
        return Some(url);
    }
    let url = TestPg::shared()?.fresh_db();
    std::fs::create_dir_all(file.parent()?).unwrap();
    std::fs::write(&file, &url).unwrap();
    Some(url)
}

/// Spawns `podhost serve` with `opts` and the data directory `data`; returns the child and its
/// captured stderr, or the exit status and stderr if it stopped before listening.
pub fn spawn(data: &Path, opts: &Options) -> Result<(Child, String, Arc<Mutex<String>>), String> {
    let mut cmd = match opts.open_files {
        Some((soft, hard)) => {
            let mut sh = Command::new("/bin/sh");
            sh.arg("-c")
                .arg(format!(
                    "ulimit -S -n {soft} && ulimit -H -n {hard} && exec \"$0\" \"$@\""
                ))
                .arg(podhost_bin());
            sh
        }
        None => Command::new(podhost_bin()),
    };
    cmd.arg("serve")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("PODHOST_LISTEN", "127.0.0.1:0")
        .env("PODHOST_DATA", data)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(t) = &opts.token {
        cmd.env("PODHOST_TOKEN", t);
    }
    for (k, v) in &opts.env {
        cmd.env(k, v);
    }
    if let Some(id) = opts.user {
        use std::os::unix::process::CommandExt;
        cmd.uid(id).gid(id);
    }
    let set = |k: &str| opts.env.iter().any(|(n, _)| n == k);
    if on_postgres() && !set("PODHOST_STORE") {
        let url = store_url(data).expect("PODHOST_TEST_STORE=postgres needs PostgreSQL");
        cmd.env("PODHOST_STORE", url);
    }
    if !set("PODHOST_LEASE_SECS") && (on_postgres() || set("PODHOST_STORE")) {
        cmd.env("PODHOST_LEASE_SECS", TEST_LEASE_SECS);
    }
    let mut child = cmd.spawn().expect("spawn podhost serve");
    let stderr = child.stderr.take().unwrap();
    let logs = Arc::new(Mutex::new(String::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    let sink = logs.clone();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if let Some(rest) = line.split("listening on http://").nth(1) {
                let addr: String = rest.chars().take_while(|c| !c.is_whitespace()).collect();
                if let Some(tx) = tx.take() {
                    let _ = tx.send(addr);
                }
            }
            let mut l = sink.lock().unwrap();
            l.push_str(&line);
            l.push('\n');
        }
    });
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(addr) => Ok((child, format!("http://{addr}"), logs)),
        Err(_) => {
            // It stopped (refused to start) or hangs without listening: either way, reap it.
            let _ = child.kill();
            let code = child.wait().ok().and_then(|s| s.code());
            let text = logs.lock().unwrap().clone();
            Err(format!("exit code {code:?}\n{text}"))
        }
    }
}

impl Serve {
    /// A server with the test credential on a fresh data directory under `dir`.
    pub fn start(dir: &Path) -> Serve {
        Serve::start_with(dir, Options::default())
    }

    pub fn start_with(dir: &Path, mut opts: Options) -> Serve {
        let _ = rustls::crypto::ring::default_provider().install_default();
        opts.token.get_or_insert_with(|| TOKEN.to_owned());
        let data = dir.join("data");
        let (child, url, logs) = spawn(&data, &opts).unwrap_or_else(|e| panic!("{e}"));
        Serve {
            child,
            url,
            data,
            logs,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
        }
    }

    pub fn logs(&self) -> String {
        self.logs.lock().unwrap().clone()
    }

    /// The last lines of the log, for failure messages.
    pub fn log_tail(&self) -> String {
        let logs = self.logs();
        let lines: Vec<&str> = logs
            .lines()
            .filter(|l| !l.contains("\"/get_status\""))
            .collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Sends a request with the credential; answers the status and the JSON body.
    pub async fn call(
        &self,
        method: &str,
        route: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let url = format!("{}{route}", self.url);
        let req = match method {
            "GET" => self.http.get(url),
            _ => self.http.post(url),
        }
        .bearer_auth(TOKEN);
        let req = match body {
            Some(b) => req.json(&b),
            None => req,
        };
        self.send(req, T)
            .await
            .unwrap_or_else(|e| panic!("request to {route}: {e}"))
    }

    /// Sends `req`, waiting up to `within`: the status and the JSON body, or why no answer
    /// came (a timeout, a dropped connection), which a client that retries, as Oumi does,
    /// retries.
    async fn send(
        &self,
        req: reqwest::RequestBuilder,
        within: Duration,
    ) -> Result<(StatusCode, Value), String> {
        let resp = tokio::time::timeout(within, req.send())
            .await
            .map_err(|_| format!("request timed out after {within:?}"))?
            .map_err(|e| format!("request failed: {e}"))?;
        let status = resp.status();
        let text = resp
            .text()
            .await
            .map_err(|e| format!("reading the answer: {e}"))?;
        let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok((status, v))
    }

    /// `submit`, answering why no answer came instead of failing the test.
    pub async fn try_submit(&self, body: Value) -> Result<(StatusCode, Value), String> {
        let req = self
            .http
            .post(format!("{}/submit", self.url))
            .bearer_auth(TOKEN)
            .json(&body);
        self.send(req, T).await
    }

    pub async fn submit(&self, body: Value) -> (StatusCode, Value) {
        self.call("POST", "/submit", Some(body)).await
    }

    pub async fn status(&self, id: &str) -> (StatusCode, Value) {
        self.call("GET", &format!("/get_status?invocation_id={id}"), None)
            .await
    }

    pub async fn collect(&self, id: &str) -> (StatusCode, Value) {
        self.call("GET", &format!("/collect_output?invocation_id={id}"), None)
            .await
    }

    pub async fn cancel(&self, session: &str, id: &str) -> (StatusCode, Value) {
        self.call(
            "POST",
            "/cancel",
            Some(json!({"protocol_version": "1", "session_id": session, "invocation_id": id})),
        )
        .await
    }

    /// Sends `n` copies of `body` to `/submit` at once; answers every response.
    pub async fn submit_concurrently(
        self: &std::sync::Arc<Self>,
        body: Value,
        n: usize,
    ) -> Vec<(StatusCode, Value)> {
        let calls: Vec<_> = (0..n)
            .map(|_| {
                let (s, body) = (self.clone(), body.clone());
                tokio::spawn(async move { s.submit(body).await })
            })
            .collect();
        let mut out = Vec::with_capacity(n);
        for c in calls {
            out.push(c.await.unwrap());
        }
        out
    }

    /// Polls `get_status` (as Oumi does) until the status is `want`, within `timeout`.
    pub async fn wait_status(&self, id: &str, want: &str, timeout: Duration) -> Value {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let (code, body) = self.status(id).await;
            assert_eq!(code, StatusCode::OK, "{body}");
            if body["status"] == want {
                return body;
            }
            if tokio::time::Instant::now() > deadline {
                panic!(
                    "{id} did not become {want} in {timeout:?}: {body}\n{}",
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The workspace directory of a session (as the server names it).
    pub fn workspace(&self, session: &str) -> PathBuf {
        podhost::byoh::sandbox::workspace_dir(&self.data, session)
    }

    /// A file of `session`'s workspace as its commands see it, `None` when there is none: on
    /// the host's directory, or, where the session has a disk of its own (see `exec::disk`), in
    /// its image, read with debugfs after a `sync` (the image is mounted in the session's
    /// namespace only).
    pub fn read_file(&self, session: &str, rel: &str) -> Option<String> {
        let image = podhost::byoh::sandbox::session_disk_image(&self.data, session);
        if !image.exists() {
            return std::fs::read_to_string(self.workspace(session).join(rel)).ok();
        }
        nix::unistd::sync();
        let out = Command::new("debugfs")
            .arg("-R")
            .arg(format!("cat /ws/{rel}"))
            .arg(&image)
            .output()
            .expect("debugfs (e2fsprogs)");
        let err = String::from_utf8_lossy(&out.stderr);
        if err.contains("File not found") {
            return None;
        }
        Some(String::from_utf8(out.stdout).unwrap())
    }
}

/// A start body for `fake`'s model with `key`.
pub fn start(session: &str, id: &str, task: &str, base_url: &str, key: Option<&str>) -> Value {
    let mut conn = json!({"base_url": base_url, "model": "fake-model"});
    if let Some(k) = key {
        conn["api_key"] = json!(k);
    }
    json!({
        "protocol_version": "1",
        "session_id": session,
        "invocation_id": id,
        "session_action": "start",
        "input_messages": [{"role": "user", "content": task}],
        "model_connection": conn,
    })
}

/// A resume body answering `answers` (`(call id, text)`).
pub fn resume(
    session: &str,
    id: &str,
    answers: &[(&str, &str)],
    base_url: &str,
    key: &str,
) -> Value {
    let messages: Vec<Value> = answers
        .iter()
        .map(|(c, t)| json!({"role": "tool", "tool_call_id": c, "content": t}))
        .collect();
    json!({
        "protocol_version": "1",
        "session_id": session,
        "invocation_id": id,
        "session_action": "resume",
        "input_messages": messages,
        "model_connection": {"base_url": base_url, "model": "fake-model", "api_key": key},
    })
}

/// The status object the protocol expects.
pub fn status_obj(session: &str, id: &str, status: &str) -> Value {
    json!({"protocol_version": "1", "session_id": session, "invocation_id": id, "status": status})
}
