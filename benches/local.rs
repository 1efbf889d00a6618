//! The cost of a `bash` call in local use, against a bare `bash -c true` measured in the same
//! run, interleaved call by call so all three see the same machine load:
//!
//! * **mcp**: a `tools/call` of `bash {"command": "true"}` to a running `podhost mcp` over
//!   stdio (a minimal JSON-RPC client: one line out, read until the answer's line), the session
//!   started once;
//! * **tool**: `podhost tool bash --input '{"command":"true"}'`, a fresh process per call (what a
//!   script pays: podhost's start-up, the supervisor, the shell);
//! * **bare**: `bash -c true` spawned with `std::process`.
//!
//! Reports medians over rounds and the ratios mcp/bare, tool/bare and mcp/tool. Run with
//! `cargo bench --bench local`. On a machine shared with other CPU-bound work, wall times
//! measure the run queue too; compare ratios, not milliseconds. `PODHOST_BENCH_SMOKE=1` runs a
//! few calls of each, checked (see `benches/support/smoke.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/smoke.rs"]
mod smoke;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// Rounds, calls of each kind per round, and warm-up calls: a measurement's, or a smoke run's.
fn scale() -> (usize, usize, usize) {
    smoke::pick((5, 40, 5), (1, 3, 1))
}

/// A `podhost mcp` session on stdio.
struct Session {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
}

impl Session {
    fn start(podhost: &Path, workspace: &Path) -> Session {
        let mut child = Command::new(podhost)
            .args(["mcp", "--workspace"])
            .arg(workspace)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut s = Session {
            stdin: child.stdin.take().unwrap(),
            stdout: BufReader::new(child.stdout.take().unwrap()),
            child,
            next_id: 1,
        };
        let init = s.request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "bench", "version": "0"}}),
        );
        assert_eq!(init["result"]["serverInfo"]["name"], "podhost", "{init}");
        s.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        s
    }

    fn send(&mut self, msg: &Value) {
        let mut line = msg.to_string();
        line.push('\n');
        self.stdin.write_all(line.as_bytes()).unwrap();
        self.stdin.flush().unwrap();
    }

    /// Sends a request and reads lines until its answer.
    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                self.stdout.read_line(&mut line).unwrap() > 0,
                "podhost mcp ended"
            );
            let v: Value = serde_json::from_str(&line).unwrap();
            if v["id"] == json!(id) {
                return v;
            }
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1000.0
}

fn main() {
    let (rounds, iterations, warm_up) = scale();
    let podhost = Path::new(env!("CARGO_BIN_EXE_podhost"));
    let dir = tempfile::tempdir().unwrap();
    let mut session = Session::start(podhost, dir.path());
    let input = json!({"command": "true"}).to_string();
    let call = json!({"name": "bash", "arguments": {"command": "true"}});

    let mut mcp = || {
        let t = Instant::now();
        let r = session.request("tools/call", call.clone());
        let took = t.elapsed();
        assert_eq!(r["result"]["isError"], false, "{r}");
        // The text is the bash tool's output object.
        let output: Value = r["result"]["content"][0]["text"]
            .as_str()
            .and_then(|t| serde_json::from_str(t).ok())
            .unwrap_or_default();
        smoke::check(
            output["exitCode"] == 0,
            format_args!("bash `true` through podhost mcp: {r}"),
        );
        took
    };
    let tool = || {
        let t = Instant::now();
        let out = Command::new(podhost)
            .args(["tool", "bash", "--input", &input, "--workspace"])
            .arg(dir.path())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let took = t.elapsed();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        took
    };
    let bare = || {
        let t = Instant::now();
        let status = Command::new("bash")
            .args(["-c", "true"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status()
            .unwrap();
        let took = t.elapsed();
        assert!(status.success());
        took
    };

    for _ in 0..warm_up {
        mcp();
        tool();
        bare();
    }
    let (mut m_all, mut t_all, mut b_all) = (Vec::new(), Vec::new(), Vec::new());
    println!("bash call through local use vs bare `bash -c true` ({rounds} rounds × {iterations})");
    for round in 1..=rounds {
        let (mut m, mut t, mut b) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..iterations {
            m.push(mcp());
            t.push(tool());
            b.push(bare());
        }
        let (mm, tm, bm) = (median(m.clone()), median(t.clone()), median(b.clone()));
        println!(
            "  round {round}: mcp {mm:.3} ms, tool {tm:.3} ms, bare {bm:.3} ms; mcp/bare {:.2}×, \
             tool/bare {:.2}×, mcp/tool {:.2}×",
            mm / bm,
            tm / bm,
            mm / tm
        );
        m_all.extend(m);
        t_all.extend(t);
        b_all.extend(b);
    }
    let (mm, tm, bm) = (median(m_all), median(t_all), median(b_all));
    smoke::check_positive("mcp, tool and bare", &[mm, tm, bm]);
    println!(
        "median: mcp {mm:.3} ms, tool {tm:.3} ms, bare {bm:.3} ms; mcp/bare {:.2}×, tool/bare \
         {:.2}×, mcp/tool {:.2}×",
        mm / bm,
        tm / bm,
        mm / tm
    );
    drop(session);
    smoke::finish("local");
}
