//! `podhost mcp` driven by MCP clients nobody here wrote: the official Python SDK's over stdio
//! and streamable HTTP (both protocol styles), the official TypeScript SDK's over stdio. Each
//! lists the tools, calls each one, has the calls that must be refused refused, runs calls
//! concurrently, and cancels a long command — whose processes must then be gone. Over HTTP it is
//! also attacked — requests a browser page can forge, a flood of half-open connections under a
//! low open-file limit — and must refuse them and keep serving the Python SDK's client. Started
//! from a terminal, it must keep its commands from opening that terminal.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::harness::{T, client_script, clients, output, podhost, python};
use crate::support::podhost_bin;

pub(crate) const TOKEN: &str = "mcp-test-credential-81c2";

/// What every Python run must report, whatever the transport.
fn check_python_report(report: &Value, workspace: &std::path::Path) {
    let hint = |name: &str, ro: bool, de: bool, id: bool, ow: bool, title: &str, req: Value| {
        json!({"name": name, "title": title, "read_only": ro, "destructive": de,
               "idempotent": id, "open_world": ow, "required": req})
    };
    assert_eq!(
        report["tools"],
        json!([
            hint(
                "bash",
                false,
                true,
                false,
                true,
                "Run a shell command",
                json!(["command"])
            ),
            hint(
                "read",
                true,
                false,
                true,
                false,
                "Read a file",
                json!(["path"])
            ),
            hint(
                "write",
                false,
                true,
                true,
                false,
                "Write a file",
                json!(["path", "content"])
            ),
            hint(
                "edit",
                false,
                true,
                false,
                false,
                "Edit a file",
                json!(["path", "old_string", "new_string"])
            ),
            hint(
                "grep",
                true,
                false,
                true,
                false,
                "Search file contents",
                json!(["pattern"])
            ),
            hint(
                "glob",
                true,
                false,
                true,
                false,
                "Find files by name",
                json!(["pattern"])
            ),
            hint(
                "bash_output",
                true,
                false,
                false,
                false,
                "Read a background process's output",
                json!(["id"])
            ),
            hint(
                "bash_kill",
                false,
                true,
                true,
                false,
                "Stop a background process",
                json!(["id"])
            ),
        ])
    );
    let ok = |text: &str| json!({"is_error": false, "text": text});
    assert_eq!(
        report["calls"],
        json!({
            "write": ok(r#"{"bytes":9,"path":"notes/hello.txt"}"#),
            "read": ok("1\thi there"),
            "edit": ok(r#"{"path":"notes/hello.txt","replacements":1,"snippet":"1\thello there"}"#),
            "grep": ok("notes/hello.txt:1:hello there"),
            "glob": ok("notes/hello.txt"),
            "bash": ok(r#"{"exitCode":3,"stderr":"oops\n","stdout":"hello there\n"}"#),
        })
    );
    // An object output is also structuredContent, the value its text holds; the SDK validated
    // it against the tool's outputSchema (or the call would have failed).
    assert_eq!(
        report["output_schemas"],
        json!(["bash", "write", "edit", "bash_output", "bash_kill"])
    );
    let parsed = |tool: &str| {
        serde_json::from_str::<Value>(report["calls"][tool]["text"].as_str().unwrap()).unwrap()
    };
    assert_eq!(
        report["structured"],
        json!({"write": parsed("write"), "read": null, "edit": parsed("edit"), "grep": null,
               "glob": null, "bash": parsed("bash")})
    );
    let root = std::fs::canonicalize(workspace).unwrap();
    let parent = root.parent().unwrap().display().to_string();
    let err = |text: String| json!({"is_error": true, "text": text});
    assert_eq!(
        report["refused"],
        json!({
            "read_outside": err(format!(
                "sandbox.path_denied: /etc/hostname is outside the allowed directories ({}).",
                root.display()
            )),
            "write_outside": err(format!(
                "sandbox.path_denied: {parent}/escape.txt is outside the allowed directories ({}).",
                root.display()
            )),
            "bad_field": err("sandbox.invalid_input: Invalid read input: unknown field `file_path`, \
                              expected one of `path`, `offset`, `limit`.".to_owned()),
            "unknown_tool": "There is no tool named \"nope\". The tools are bash, read, write, \
                             edit, grep, glob, bash_output and bash_kill.",
        })
    );
    assert!(!std::path::Path::new(&parent).join("escape.txt").exists());
    let concurrent = report["concurrent_seconds"].as_f64().unwrap();
    assert!(
        concurrent < 2.5,
        "three 1 s commands took {concurrent} s: not concurrent"
    );
    assert_eq!(
        (
            &report["cancel"]["processes"],
            &report["cancel"]["left_running"]
        ),
        (&json!(2), &json!(0)),
        "{}",
        report["cancel"]
    );
}

/// Runs a client to its end and parses the JSON report it prints.
async fn report(mut cmd: tokio::process::Command) -> Value {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let out = output(cmd).await;
    assert_eq!(
        out.code, 0,
        "the client failed:\n{}\n{}",
        out.stdout, out.stderr
    );
    serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {}", out.stdout))
}

#[tokio::test]
async fn the_python_sdk_drives_it_over_stdio() {
    let ws = tempfile::tempdir().unwrap();
    let mut cmd = tokio::process::Command::new(python());
    cmd.arg(client_script("mcp_check.py"))
        .arg("stdio")
        .arg(podhost_bin())
        .arg(ws.path())
        .arg("legacy")
        .env("RUST_LOG", "warn");
    let r = report(cmd).await;
    check_python_report(&r, ws.path());
}

/// A running `podhost mcp --listen`, its URL, and what it writes to stderr.
pub(crate) struct Http {
    _child: tokio::process::Child,
    url: String,
    stderr: Arc<Mutex<String>>,
}

impl Http {
    /// `host:port`.
    pub(crate) fn addr(&self) -> &str {
        self.url
            .trim_start_matches("http://")
            .trim_end_matches("/mcp")
    }
}

async fn serve_http(ws: &std::path::Path, extra: &[&str]) -> Http {
    serve_http_with(ws, extra, Some(TOKEN), None, &[]).await
}

/// `podhost mcp --listen` on a free loopback port, with `token` as its credential (or none),
/// with `open_files`, under that open-file limit (soft and hard, set by a shell before it), and
/// the variables `env` set.
pub(crate) async fn serve_http_with(
    ws: &std::path::Path,
    extra: &[&str],
    token: Option<&str>,
    open_files: Option<u64>,
    env: &[(&str, &str)],
) -> Http {
    let args = ["mcp", "--listen", "127.0.0.1:0", "--workspace"];
    let mut cmd = podhost(&args);
    if let Some(n) = open_files {
        // The same clean environment, through a shell that lowers the limit first.
        let template = cmd;
        cmd = tokio::process::Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(format!("ulimit -n {n} && exec \"$0\" \"$@\""))
            .arg(podhost_bin())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (k, v) in template.as_std().get_envs() {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
    }
    cmd.arg(ws).args(extra).envs(env.iter().copied());
    if let Some(t) = token {
        cmd.env("PODHOST_TOKEN", t);
    }
    let mut child = cmd.spawn().unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let stderr = Arc::new(Mutex::new(String::new()));
    let url = tokio::time::timeout(T, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            stderr.lock().unwrap().push_str(&format!("{line}\n"));
            if let Some((_, url)) = line.split_once(" at ") {
                return url.to_owned();
            }
        }
        panic!(
            "podhost mcp ended before it listened:\n{}",
            stderr.lock().unwrap()
        );
    })
    .await
    .unwrap();
    // Keep draining stderr so podhost never blocks on it.
    let sink = stderr.clone();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            sink.lock().unwrap().push_str(&format!("{line}\n"));
        }
    });
    Http {
        _child: child,
        url,
        stderr,
    }
}

#[tokio::test]
async fn the_python_sdk_drives_it_over_streamable_http_in_both_protocol_styles() {
    for mode in ["legacy", "auto"] {
        let ws = tempfile::tempdir().unwrap();
        let server = serve_http(ws.path(), &[]).await;
        let mut cmd = tokio::process::Command::new(python());
        cmd.arg(client_script("mcp_check.py"))
            .args(["http", &server.url, TOKEN, mode])
            .env("PODHOST_TEST_WORKSPACE", ws.path());
        let r = report(cmd).await;
        // The SDK words every HTTP refusal alike; the status itself (401) is checked below.
        assert_eq!(
            r["wrong_token"], "MCPError: Server returned an error response",
            "{mode}"
        );
        check_python_report(&r, ws.path());
    }
}

#[tokio::test]
async fn the_typescript_sdk_drives_it_over_stdio() {
    let ws = tempfile::tempdir().unwrap();
    // ESM resolves the SDK next to the script: run it from the clients' node directory.
    let script = clients().join("node/mcp_check.mjs");
    std::fs::copy(client_script("mcp_check.mjs"), &script).unwrap();
    let mut cmd = tokio::process::Command::new("node");
    cmd.arg(&script)
        .arg(podhost_bin())
        .arg(ws.path())
        .env("RUST_LOG", "warn");
    let r = report(cmd).await;
    let ok = |text: &str| json!({"is_error": false, "text": text});
    let root = std::fs::canonicalize(ws.path()).unwrap();
    assert_eq!(
        r,
        json!({
            "server": "podhost",
            "tools": [
                {"name": "bash", "read_only": false, "destructive": true},
                {"name": "read", "read_only": true, "destructive": false},
                {"name": "write", "read_only": false, "destructive": true},
                {"name": "edit", "read_only": false, "destructive": true},
                {"name": "grep", "read_only": true, "destructive": false},
                {"name": "glob", "read_only": true, "destructive": false},
                {"name": "bash_output", "read_only": true, "destructive": false},
                {"name": "bash_kill", "read_only": false, "destructive": true},
            ],
            "calls": {
                "write": ok(r#"{"bytes":8,"path":"a.txt"}"#),
                "read": ok("1\tone\n2\ttwo"),
                "edit": ok(r#"{"path":"a.txt","replacements":1,"snippet":"1\tone\n2\t2"}"#),
                "grep": ok("a.txt:1:one"),
                "glob": ok("a.txt"),
                "bash": ok(r#"{"exitCode":0,"stderr":"","stdout":"2\n"}"#),
            },
            "outside": {"is_error": true, "text": format!(
                "sandbox.path_denied: /etc/podhost-escape is outside the allowed directories ({}).",
                root.display()
            )},
            "cancelled_call": "rejected: -32001",
            "cancel": {"processes": 2, "left_running": 0},
        })
    );
}

#[tokio::test]
async fn http_refuses_requests_without_the_credential_and_other_hosts_without_one() {
    let ws = tempfile::tempdir().unwrap();
    let server = serve_http(ws.path(), &[]).await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"}}});
    for auth in [None, Some("Bearer wrong"), Some("Basic abc")] {
        let mut req = http
            .post(&server.url)
            .header("accept", "application/json, text/event-stream")
            .json(&init);
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let resp = tokio::time::timeout(T, req.send()).await.unwrap().unwrap();
        assert_eq!(resp.status(), 401, "{auth:?}");
        assert_eq!(resp.headers()["www-authenticate"], "Bearer");
    }
    let resp = http
        .post(&server.url)
        .header("accept", "application/json, text/event-stream")
        .header("authorization", format!("Bearer {TOKEN}"))
        .json(&init)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);

    // Without a credential, only loopback.
    let mut cmd = podhost(&["mcp", "--listen", "0.0.0.0:0", "--workspace"]);
    cmd.arg(ws.path());
    let out = output(cmd).await;
    assert_eq!(
        (out.code, out.stderr.trim_end()),
        (
            2,
            "podhost mcp: refusing to serve the tools on 0.0.0.0:0 without a credential: set \
             PODHOST_TOKEN or PODHOST_TOKEN_FILE, or listen on a loopback address"
        )
    );
}

/// The official Python SDK's client: initializes, lists the tools and runs `echo hi` through
/// `bash`; prints what it got as JSON.
const LIST_AND_CALL: &str = r#"
import json, sys
import anyio
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

async def main():
    url, token = sys.argv[1], sys.argv[2]
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with create_mcp_http_client(headers=headers) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                tools = await session.list_tools()
                echo = await session.call_tool("bash", {"command": "echo hi"})
    text = "".join(getattr(c, "text", "") for c in echo.content)
    print(json.dumps({"tools": [t.name for t in tools.tools], "echo": json.loads(text)["stdout"]}))

anyio.run(main)
"#;

/// A real MCP client's session against `server` succeeds: the eight tools listed, a call run.
async fn a_client_is_served(server: &Http, token: Option<&str>) {
    let mut cmd = tokio::process::Command::new(python());
    cmd.args(["-c", LIST_AND_CALL, &server.url, token.unwrap_or("")]);
    let r = report(cmd).await;
    assert_eq!(
        r,
        json!({"tools": ["bash", "read", "write", "edit", "grep", "glob", "bash_output",
                         "bash_kill"], "echo": "hi\n"})
    );
}

/// Sends one raw HTTP/1.1 request (the head exactly as given, `Content-Length` and
/// `Connection: close` added); answers the status and the body as JSON (or as a string). A
/// body without a length (an event stream) is not waited for: it answers `null`.
async fn raw(addr: &str, head: &str, body: &str) -> (u16, Value) {
    let mut sock = tokio::time::timeout(T, TcpStream::connect(addr))
        .await
        .unwrap()
        .unwrap();
    let request = format!(
        "{head}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    sock.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let (head, rest) = loop {
        let n = tokio::time::timeout(T, sock.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "closed before the headers: {answer:?}");
        answer.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&answer).into_owned();
        if let Some((head, rest)) = text.split_once("\r\n\r\n") {
            break (head.to_owned(), rest.as_bytes().to_vec());
        }
    };
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {head}"));
    let length = head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse::<usize>().ok())?
    });
    let Some(length) = length else {
        return (status, Value::Null);
    };
    let mut body = rest;
    while body.len() < length {
        let n = tokio::time::timeout(T, sock.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "closed inside the body");
        body.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&body).into_owned();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, body)
}

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}"#;

#[tokio::test]
async fn http_refuses_what_a_browser_can_forge_with_and_without_a_credential() {
    let ws = tempfile::tempdir().unwrap();
    for token in [Some(TOKEN), None] {
        let server = serve_http_with(ws.path(), &[], token, None, &[]).await;
        let addr = server.addr();
        let port = addr.rsplit(':').next().unwrap();
        let auth = token.map_or(String::new(), |t| format!("\r\nAuthorization: Bearer {t}"));
        let post = |host: &str, extra: &str| {
            format!(
                "POST /mcp HTTP/1.1\r\nHost: {host}{auth}\r\nAccept: application/json, \
                 text/event-stream{extra}"
            )
        };
        let json = "\r\nContent-Type: application/json";
        // A page's fetch() or form from another origin (the preflight of a JSON POST too).
        for origin in ["https://evil.example", "null", "http://localhost:1"] {
            let refused = json!({"error": format!(
                "the Origin {origin:?} is not this server's: podhost answers no request that a \
                 page from another origin makes a browser send"
            )});
            for head in [
                post(addr, &format!("{json}\r\nOrigin: {origin}")),
                format!("OPTIONS /mcp HTTP/1.1\r\nHost: {addr}{auth}\r\nOrigin: {origin}"),
                format!("GET /mcp HTTP/1.1\r\nHost: {addr}{auth}\r\nOrigin: {origin}"),
            ] {
                let (code, body) = raw(addr, &head, INITIALIZE).await;
                assert_eq!((code, body), (403, refused.clone()), "{token:?} {head}");
            }
        }
        // Cross-site simple POSTs: no preflight, so no Origin is needed to send them.
        for (kind, line) in [
            ("text/plain", "\r\nContent-Type: text/plain"),
            (
                "application/x-www-form-urlencoded",
                "\r\nContent-Type: application/x-www-form-urlencoded",
            ),
            (
                "multipart/form-data; boundary=x",
                "\r\nContent-Type: multipart/form-data; boundary=x",
            ),
        ] {
            let (code, body) = raw(addr, &post(addr, line), INITIALIZE).await;
            assert_eq!(
                (code, body),
                (
                    415,
                    json!({"error": format!(
                        "a POST must send its body as JSON, with Content-Type: \
                         application/json, not {kind:?}"
                    )})
                ),
                "{token:?} {kind}"
            );
        }
        let (code, body) = raw(addr, &post(addr, ""), INITIALIZE).await;
        assert_eq!(code, 415, "{token:?} no Content-Type: {body}");
        // A DNS-rebinding page's name: refused while no credential is set.
        let (code, body) = raw(
            addr,
            &post(&format!("evil.example:{port}"), json),
            INITIALIZE,
        )
        .await;
        if token.is_none() {
            assert_eq!(
                (code, body),
                (
                    403,
                    json!({"error": "the Host \"evil.example\" does not name this server: \
                                     without a credential podhost answers only requests \
                                     addressed to localhost, 127.0.0.1, [::1] (set a credential \
                                     to be reached by other names)"})
                )
            );
            let (code, _) = raw(addr, &post(&format!("localhost:{port}"), json), INITIALIZE).await;
            assert_eq!(code, 200, "a loopback name is this server");
        } else {
            assert_eq!(code, 200, "with a credential any name: {body}");
        }
        a_client_is_served(&server, token).await;
    }
}

#[tokio::test]
async fn http_accepts_the_bearer_scheme_in_any_case() {
    let ws = tempfile::tempdir().unwrap();
    let server = serve_http(ws.path(), &[]).await;
    let addr = server.addr();
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        let head = format!(
            "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nAuthorization: {scheme} {TOKEN}\r\n\
             Accept: application/json, text/event-stream\r\nContent-Type: application/json"
        );
        let (code, body) = raw(addr, &head, INITIALIZE).await;
        assert_eq!(code, 200, "{scheme}: {body}");
    }
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nAuthorization: bearer wrong\r\n\
         Accept: application/json, text/event-stream\r\nContent-Type: application/json"
    );
    assert_eq!(
        raw(addr, &head, INITIALIZE).await,
        (401, json!({"error": "the credential is wrong"}))
    );
}

/// Raises this test process's open-file limit to its hard limit (the attack opens many sockets).
fn more_files() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
}

/// At `nofile=1024`, 1,100 half-open connections used to leave `podhost mcp` unable to accept
/// anyone. Now its cap (lowered to what the limit holds) closes the oldest connections that are
/// not inside a request, and a real client's session goes through.
#[tokio::test]
async fn a_flood_of_half_open_connections_under_nofile_1024_does_not_keep_a_client_out() {
    more_files();
    let ws = tempfile::tempdir().unwrap();
    let server = serve_http_with(
        ws.path(),
        &["--http-header-timeout-secs", "120"],
        Some(TOKEN),
        Some(1024),
        &[],
    )
    .await;
    let warned = "the open-file limit cannot hold PODHOST_HTTP_MAX_CONNECTIONS; lowering it to 512";
    assert!(
        server.stderr.lock().unwrap().contains(warned),
        "{}",
        server.stderr.lock().unwrap()
    );
    let mut socks = Vec::new();
    for i in 0..1100 {
        let mut sock = tokio::time::timeout(T, TcpStream::connect(server.addr()))
            .await
            .unwrap()
            .unwrap();
        // Half send nothing; half start their headers and stop.
        if i % 2 == 1 {
            sock.write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                .await
                .unwrap();
        }
        socks.push(sock);
    }
    a_client_is_served(&server, Some(TOKEN)).await;
    // The oldest were closed to make room (a read ends at once), the newest are still open.
    let mut probe = [0u8; 1];
    for sock in socks.iter_mut().take(100) {
        let read = tokio::time::timeout(Duration::from_secs(5), sock.read(&mut probe)).await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "an old half-open connection is still open"
        );
    }
    let open = socks[socks.len() - 400..]
        .iter()
        .filter(|s| matches!(s.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock))
        .count();
    assert!(open >= 300, "only {open} of the newest 400 are open");
    a_client_is_served(&server, Some(TOKEN)).await;
}

/// The official Python SDK's client calls `bash` with the command given; prints the result's
/// stdout.
const CALL_LONG: &str = r#"
import json, sys
import anyio
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

async def main():
    url, token, command = sys.argv[1], sys.argv[2], sys.argv[3]
    async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                r = await session.call_tool("bash", {"command": command})
    text = "".join(getattr(c, "text", "") for c in r.content)
    print(json.dumps({"stdout": json.loads(text)["stdout"], "isError": r.is_error}))

anyio.run(main)
"#;

/// A tool call streams its answer (an event stream that stays open until the command ends).
/// It outlasts the idle timeout four times over while a flood of new connections fills the
/// cap, and still arrives whole: a connection is inside its request until its answer is
/// written, so neither the idle sweep nor the cap's eviction cuts it.
#[tokio::test]
async fn a_tool_call_longer_than_the_idle_timeout_is_answered_whole_through_a_flood() {
    more_files();
    let ws = tempfile::tempdir().unwrap();
    let server = serve_http_with(
        ws.path(),
        &[
            "--http-idle-timeout-secs",
            "1",
            "--http-max-connections",
            "16",
        ],
        Some(TOKEN),
        None,
        &[],
    )
    .await;
    let mut cmd = tokio::process::Command::new(python());
    cmd.args(["-c", CALL_LONG, &server.url, TOKEN, "sleep 4; echo late"]);
    let call = tokio::spawn(report(cmd));
    // While the command sleeps: new connections, past the cap, each one half a request.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut socks = Vec::new();
    for _ in 0..40 {
        let mut sock = tokio::time::timeout(T, TcpStream::connect(server.addr()))
            .await
            .unwrap()
            .unwrap();
        sock.write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            .await
            .unwrap();
        socks.push(sock);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = call.await.unwrap();
    assert_eq!(r, json!({"stdout": "late\n", "isError": false}));
    // The flood made room for itself: its oldest were closed, and podhost still serves.
    let mut probe = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(5), socks[0].read(&mut probe)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "the flood's oldest connection is still open"
    );
    a_client_is_served(&server, Some(TOKEN)).await;
}

/// The official Python SDK's client calls `bash`; prints the result's text, or the JSON-RPC
/// error it got instead.
const CALL_OR_ERROR: &str = r#"
import json, sys
import anyio
from mcp import ClientSession
from mcp import MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

async def main():
    url, token = sys.argv[1], sys.argv[2]
    async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                try:
                    r = await session.call_tool("bash", {"command": "echo hi"})
                    out = {"result": "".join(getattr(c, "text", "") for c in r.content),
                           "isError": r.is_error}
                except MCPError as e:
                    out = {"error": {"code": e.error.code, "message": e.error.message}}
    print(json.dumps(out))

anyio.run(main)
"#;

/// A fault of podhost's own — here the session holder that builds the read-only system cannot
/// start — reaches an MCP client as a JSON-RPC error, never as a tool result its model would
/// take for the tool's; the server keeps serving, and the next call runs once the host can.
#[tokio::test]
async fn a_fault_of_podhost_is_an_error_of_the_protocol_not_a_tool_result() {
    let ws = tempfile::tempdir().unwrap();
    let refuse = ws.path().join("refuse");
    std::fs::write(&refuse, "").unwrap();
    let failpoint = format!("sandbox.session_refused=fail-while({})", refuse.display());
    let server = serve_http_with(
        ws.path(),
        &[],
        Some(TOKEN),
        None,
        &[("PODHOST_FAILPOINTS", &failpoint)],
    )
    .await;
    let call = || {
        let mut cmd = tokio::process::Command::new(python());
        cmd.args(["-c", CALL_OR_ERROR, &server.url, TOKEN]);
        report(cmd)
    };
    let first = call().await;
    if first.get("result").is_some() {
        println!(
            "no mount namespace here: commands run without a session holder, so a holder that \
             cannot start is not exercised (checked: the call runs)"
        );
        assert_eq!(first["isError"], false, "{first}");
        return;
    }
    assert_eq!(
        first,
        json!({"error": {"code": -32603, "message": "podhost could not run bash: could not start \
               the command session: refused (the failpoint sandbox.session_refused)"}})
    );
    std::fs::remove_file(&refuse).unwrap();
    let second = call().await;
    assert_eq!(second["isError"], false, "{second}");
    assert_eq!(
        serde_json::from_str::<Value>(second["result"].as_str().unwrap()).unwrap()["stdout"],
        "hi\n"
    );
}

/// Ending a session with `DELETE /mcp` answers 204 No Content, as the official SDKs' clients
/// expect (they warn of a 202), and the session is gone afterwards.
#[tokio::test]
async fn ending_a_session_with_delete_answers_no_content() {
    let ws = tempfile::tempdir().unwrap();
    let server = serve_http_with(ws.path(), &[], Some(TOKEN), None, &[]).await;
    let url = format!("http://{}/mcp", server.addr());
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    let init = http
        .post(&url)
        .bearer_auth(TOKEN)
        .header("Accept", "application/json, text/event-stream")
        .header("Content-Type", "application/json")
        .body(INITIALIZE)
        .send()
        .await
        .unwrap();
    assert!(init.status().is_success(), "{init:?}");
    let id = init.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    drop(init);
    let ended = http
        .delete(&url)
        .bearer_auth(TOKEN)
        .header("mcp-session-id", &id)
        .header("mcp-protocol-version", "2025-11-25")
        .send()
        .await
        .unwrap();
    assert_eq!(ended.status(), 204, "{ended:?}");
    assert_eq!(ended.bytes().await.unwrap().len(), 0);
    // The session is gone: a request in it is answered 404, as the transport's spec says.
    let after = http
        .post(&url)
        .bearer_auth(TOKEN)
        .header("Accept", "application/json, text/event-stream")
        .header("Content-Type", "application/json")
        .header("mcp-session-id", &id)
        .header("mcp-protocol-version", "2025-11-25")
        .body(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(after.status(), 404, "{after:?}");
}

/// Starts `podhost mcp` (argv[1]) with a pseudo-terminal as its controlling terminal, calls
/// `bash` with argv[2] over stdio, and prints the terminal podhost has (its `tty_nr`) and the
/// call's result.
const CALL_WITH_A_TERMINAL: &str = r#"
import fcntl, json, os, subprocess, sys, termios
master, slave = os.openpty()
def take_terminal():
    os.setsid()
    fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
p = subprocess.Popen([sys.argv[1], "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                     stderr=subprocess.DEVNULL, preexec_fn=take_terminal, pass_fds=[slave])
def rpc(msg, answer=True):
    p.stdin.write((json.dumps(msg) + "\n").encode()); p.stdin.flush()
    return json.loads(p.stdout.readline()) if answer else None
rpc({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion":
     "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
rpc({"jsonrpc": "2.0", "method": "notifications/initialized"}, answer=False)
tty = int(open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()[4])
r = rpc({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
         "params": {"name": "bash", "arguments": {"command": sys.argv[2]}}})
p.stdin.close(); p.wait()
print(json.dumps({"podhost_tty": tty, "result": r["result"]["structuredContent"]}))
"#;

/// A command cannot reach the terminal podhost was started from, also where its session holder
/// (not a session per command) gives it its session: a prompt that opens `/dev/tty` fails at
/// once instead of reading the user's keyboard.
#[tokio::test]
async fn a_command_cannot_open_the_terminal_podhost_runs_in() {
    let ws = tempfile::tempdir().unwrap();
    let mut cmd = tokio::process::Command::new("python3");
    cmd.current_dir(ws.path()).args([
        "-c",
        CALL_WITH_A_TERMINAL,
        podhost_bin().to_str().unwrap(),
        "cat /dev/tty; echo \"status $?\"",
    ]);
    // The environment every test gives podhost (no PODHOST_ or credential-like variable of the
    // test run's), passed through the script.
    for (name, value) in podhost(&[]).as_std().get_envs() {
        match value {
            Some(v) => cmd.env(name, v),
            None => cmd.env_remove(name),
        };
    }
    let report = report(cmd).await;
    assert_ne!(
        report["podhost_tty"], 0,
        "podhost got no terminal: {report}"
    );
    let result = &report["result"];
    assert_eq!(result["stdout"], "status 1\n", "{report}");
    assert_eq!(
        result["stderr"], "cat: /dev/tty: No such device or address\n",
        "{report}"
    );
}
