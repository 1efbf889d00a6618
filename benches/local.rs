//! The cost of a `bash` call in local use, against a bare `bash -c true` measured in the same
//! run, interleaved call by call so all three see the same machine load:
//!
//! * **mcp**: a `tools/call` of `bash {"command": "true"}` to a running `podhost mcp` over
//!   stdio (a minimal JSON-RPC client: one line out, read until the answer's line), the session
//!   started once;
//! * **tool**: `podhost tool bash --input '{"command":"true"}'`, a fresh process per call (what a
//!   script pays: podhost's start-up, the command's sandbox, the shell);
//! * **bare**: `bash -c true` spawned with `std::process`.
//!
//! podhost runs from a copy of the build (see `support/installed.rs`), as it would be installed.
//!
//! Each round is measured on a quiet host, then again with 1,000 idle processes on it (`sleep`s
//! the bench starts and ends): a command's cost must not grow with the host's process count.
//!
//! Reports every round, medians over rounds and the ratios mcp/bare, tool/bare and mcp/tool,
//! against the goals (mcp/bare ≤ 1.5×, tool/bare ≤ 2×), and how much the idle processes moved
//! each ratio. Run with
//! `cargo bench --bench local`. On a machine shared with other CPU-bound work, wall times
//! measure the run queue too; compare ratios, not milliseconds. `PODHOST_BENCH_SMOKE=1` runs a
//! few calls of each, checked (see `benches/support/smoke.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/smoke.rs"]
mod smoke;

#[path = "support/installed.rs"]
mod installed;
use installed::installed;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// Rounds, calls of each kind per round, and warm-up calls: a measurement's, or a smoke run's.
fn scale() -> (usize, usize, usize) {
    smoke::pick((5, 40, 5), (1, 3, 1))
}

/// Idle processes started for the second half.
fn idle_processes() -> usize {
    smoke::pick(1000, 20)
}

/// Processes that sleep until dropped.
struct Idle(Vec<Child>);

impl Idle {
    fn start(n: usize) -> Idle {
        Idle(
            (0..n)
                .map(|_| {
                    Command::new("sleep")
                        .arg("3600")
                        .stdin(Stdio::null())
                        .spawn()
                        .unwrap()
                })
                .collect(),
        )
    }
}

impl Drop for Idle {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
        }
        for c in &mut self.0 {
            let _ = c.wait();
        }
    }
}

/// The three medians of one condition (ms): mcp, tool, bare.
type Medians = (f64, f64, f64);

/// Rounds of interleaved calls; prints every round and the medians.
fn measure(
    label: &str,
    calls: &mut [&mut dyn FnMut() -> Duration; 3],
    (rounds, iterations, warm_up): (usize, usize, usize),
) -> Medians {
    for _ in 0..warm_up {
        for c in calls.iter_mut() {
            c();
        }
    }
    let mut all = [Vec::new(), Vec::new(), Vec::new()];
    println!(
        "bash call through local use vs bare `bash -c true`, {label} ({rounds} rounds × \
         {iterations})"
    );
    for round in 1..=rounds {
        let mut this = [Vec::new(), Vec::new(), Vec::new()];
        for _ in 0..iterations {
            for (c, v) in calls.iter_mut().zip(this.iter_mut()) {
                v.push(c());
            }
        }
        let [mm, tm, bm] = this.clone().map(median);
        println!(
            "  round {round}: mcp {mm:.3} ms, tool {tm:.3} ms, bare {bm:.3} ms; mcp/bare {:.2}×, \
             tool/bare {:.2}×, mcp/tool {:.2}×",
            mm / bm,
            tm / bm,
            mm / tm
        );
        for (a, v) in all.iter_mut().zip(this) {
            a.extend(v);
        }
    }
    let [mm, tm, bm] = all.map(median);
    smoke::check_positive("mcp, tool and bare", &[mm, tm, bm]);
    println!(
        "median, {label}: mcp {mm:.3} ms, tool {tm:.3} ms, bare {bm:.3} ms; mcp/bare {:.2}× \
         (goal ≤ 1.5×), tool/bare {:.2}× (goal ≤ 2×), mcp/tool {:.2}×",
        mm / bm,
        tm / bm,
        mm / tm
    );
    (mm, tm, bm)
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
    let install = tempfile::tempdir().unwrap();
    let podhost = &installed(Path::new(env!("CARGO_BIN_EXE_podhost")), install.path());
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
    let mut tool = || {
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
    let mut bare = || {
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

    let mut calls: [&mut dyn FnMut() -> Duration; 3] = [&mut mcp, &mut tool, &mut bare];
    let quiet = measure("quiet host", &mut calls, scale());
    let idle = Idle::start(idle_processes());
    let busy = measure(
        &format!("{} idle processes on the host", idle.0.len()),
        &mut calls,
        scale(),
    );
    drop(idle);
    let moved = |a: Medians, b: Medians, f: fn(Medians) -> f64| f(b) / f(a);
    println!(
        "the idle processes moved mcp/bare by {:.2}× and tool/bare by {:.2}× (flat: 1.00×)",
        moved(quiet, busy, |(m, _, b)| m / b),
        moved(quiet, busy, |(_, t, b)| t / b),
    );
    drop(session);
    smoke::finish("local");
}
