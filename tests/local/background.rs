//! Background processes in `podhost mcp` (driven by the official Python SDK, which validates
//! every structured result against the tool's `outputSchema`) and `podhost run`: a server
//! started with `run_in_background` answers later calls, its output is read in disjoint pieces,
//! `bash_kill` stops a whole tree (`setsid` and double-forked children included), the session's
//! cap is a clear tool error, and nothing is left once the session or the run ended.
//!
//! "Nothing left" is checked by unique arguments (`sleep 99<n>.<pid>`, the server's directory)
//! that no process may carry afterwards.

use std::time::{Duration, Instant};

use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::harness::{output, python, run_cmd};
use crate::openai_fake::{FakeModel, Reply};
use crate::support::podhost_bin;

/// A number no other process carries in its arguments.
fn marker(n: u32) -> String {
    format!("98{n}.{}", std::process::id())
}

/// Whether any process's command line holds `marker`.
fn process_with(marker: &str) -> bool {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .any(|e| {
            std::fs::read(e.path().join("cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(marker))
                .unwrap_or(false)
        })
}

/// Waits until no process carries any of `markers`.
async fn assert_gone(markers: &[String], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Some(left) = markers.iter().find(|m| process_with(m)) {
        assert!(Instant::now() < deadline, "{left} outlived {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One MCP session over stdio: a server in the background, two reads of its log, a tree
/// killed, the cap crossed. Prints a JSON report.
const SESSION: &str = r#"
import json, os, sys
import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

podhost, ws, port, www, a, b = sys.argv[1:7]

def alive(marker):
    # This script's own arguments hold the markers (also as /proc/self).
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or pid == str(os.getpid()):
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    return True
        except OSError:
            pass
    return False

async def main():
    params = StdioServerParameters(command=podhost, args=["mcp", "--workspace", ws],
                                   env={**os.environ, "PODHOST_MAX_BACKGROUND": "2"})
    out = {}
    async with stdio_client(params) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()

            async def call(name, args):
                res = await s.call_tool(name, args)
                text = "".join(getattr(c, "text", "") for c in res.content)
                return res.structured_content if not res.is_error else {"error": text}

            out["server"] = await call("bash", {"run_in_background": True, "command":
                f"mkdir -p {www} && echo one > {www}/one.txt && echo two > {www}/two.txt && "
                f"exec python3 -u -m http.server {port} --bind 127.0.0.1 --directory {www}"})
            out["tree"] = await call("bash", {"run_in_background": True, "command":
                f"(setsid sh -c 'sleep {a}' &); setsid sleep {b} & wait"})
            out["third"] = await call("bash", {"command": "sleep 1", "run_in_background": True})
            out["reads"] = {}
            for name in ["one", "two"]:
                got = await call("bash", {"command":
                    f"for i in $(seq 200); do curl -sf http://127.0.0.1:{port}/{name}.txt && "
                    "exit 0; sleep 0.05; done; exit 1"})
                assert got["stdout"] == f"{name}\n", got
                text = ""
                with anyio.fail_after(10):
                    while f"GET /{name}.txt" not in text:
                        read = await call("bash_output", {"id": "bg-1"})
                        assert read["running"] is True, read
                        text += read["stdout"] + read["stderr"]
                out["reads"][name] = text
            with anyio.fail_after(10):
                while not (alive(a) and alive(b)):
                    await anyio.sleep(0.02)
            out["kill"] = await call("bash_kill", {"id": "bg-2"})
            # Killed: gone once the kernel has reaped them.
            with anyio.move_on_after(10):
                while alive(a) or alive(b):
                    await anyio.sleep(0.02)
            out["tree_left"] = alive(a) or alive(b)
            out["unknown"] = await call("bash_output", {"id": "bg-7"})
    print(json.dumps(out), flush=True)

anyio.run(main)
"#;

#[tokio::test]
async fn an_mcp_session_runs_reads_kills_and_ends_its_background_processes() {
    let ws = tempfile::tempdir().unwrap();
    let port = free_port().to_string();
    let www = format!("www-{}", marker(0));
    let (a, b) = (marker(1), marker(2));
    let mut cmd = tokio::process::Command::new(python());
    cmd.args(["-c", SESSION])
        .arg(podhost_bin())
        .arg(ws.path())
        .args([&port, &www, &a, &b])
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let out = output(cmd).await;
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let mut r: Value = serde_json::from_str(out.stdout.trim()).unwrap();
    let reads = r["reads"].take();
    assert_eq!(
        r,
        json!({
            "server": {"backgroundId": "bg-1"},
            "tree": {"backgroundId": "bg-2"},
            "third": {"error": "sandbox.background_limit: 2 background processes are running, \
                the most this session may run at once. Stop one with bash_kill (or wait for one \
                to end) before starting another."},
            "reads": null,
            "kill": {"running": false, "exitCode": 130, "stdout": "",
                     "stderr": "The process and everything it started were killed."},
            "tree_left": false,
            "unknown": {"error": "sandbox.not_found: There is no background process \"bg-7\": \
                the ids are bg-1, bg-2."},
        })
    );
    // Each read has only what came after the one before it.
    let (one, two) = (
        reads["one"].as_str().unwrap(),
        reads["two"].as_str().unwrap(),
    );
    assert!(
        one.contains("GET /one.txt") && !one.contains("GET /two.txt"),
        "{one}"
    );
    assert!(
        two.contains("GET /two.txt") && !two.contains("GET /one.txt"),
        "{two}"
    );
    // The session ended with the client: its server with it.
    assert_gone(&[www], "the MCP session").await;
}

#[tokio::test]
async fn podhost_run_kills_its_background_processes_when_it_exits() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some(crate::harness::KEY)).await;
    let (a, b) = (marker(3), marker(4));
    fake.push([
        Reply::call(
            "b1",
            "bash",
            json!({"command": format!("(setsid sh -c 'sleep {a}' &); sleep {b}"),
                   "run_in_background": true}),
        ),
        Reply::call(
            "w1",
            "bash",
            json!({"command": format!(
            "for i in $(seq 200); do pgrep -f 'sleep {a}' >/dev/null && exit 0; sleep 0.05; \
             done; exit 1")}),
        ),
        Reply::text("Started.\n"),
    ]);
    let out = output(run_cmd(&fake, dir.path(), &["start it"])).await;
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "Started.\n"),
        "{}",
        out.stderr
    );
    let asked = fake.requests();
    let last = asked.last().unwrap().body["messages"]
        .as_array()
        .unwrap()
        .clone();
    let results: Vec<&Value> = last.iter().filter(|m| m["role"] == "tool").collect();
    assert_eq!(results[0]["content"], r#"{"backgroundId":"bg-1"}"#);
    assert_eq!(
        results[1]["content"],
        r#"{"exitCode":0,"stderr":"","stdout":""}"#
    );
    assert_gone(&[a, b], "podhost run").await;
}
