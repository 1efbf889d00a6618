//! What a web page can make the operator's browser send to `podhost serve`: cross-site "simple"
//! POSTs (no preflight), requests from a foreign `Origin`, and — through DNS rebinding — requests
//! under the page's own `Host` name whose answers it could read. Each is refused before any
//! route sees it, with the endpoint's JSON error body, and the server keeps serving.

use std::time::Duration;

use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::harness::{KillOnDrop, Options, Serve, T, TOKEN, spawn, start};
use crate::openai_fake::{FakeModel, Reply};

/// A server without a credential (the README's first command), on loopback; its address.
struct Open {
    _child: KillOnDrop,
    addr: String,
    _dir: tempfile::TempDir,
}

fn open_server() -> Open {
    let dir = tempfile::tempdir().unwrap();
    let (child, url, _) = spawn(&dir.path().join("data"), &Options::default()).unwrap();
    Open {
        _child: KillOnDrop(child),
        addr: url.trim_start_matches("http://").to_owned(),
        _dir: dir,
    }
}

/// Sends one raw HTTP/1.1 request to `addr` (the headers exactly as given, `Connection: close`
/// added) and answers the status code and the body as JSON.
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
    tokio::time::timeout(T, sock.read_to_end(&mut answer))
        .await
        .unwrap()
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer}"));
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let body = serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.to_owned()));
    (status, body)
}

fn error(message: &str) -> Value {
    json!({"error": {"message": message}})
}

/// `/healthz` still answers 200 with `Host: 127.0.0.1:…`, with `auth` (a header line or none).
async fn still_serving(addr: &str, auth: &str) {
    let (code, body) = raw(
        addr,
        &format!("GET /healthz HTTP/1.1\r\nHost: {addr}{auth}"),
        "",
    )
    .await;
    assert_eq!((code, &body["status"]), (200, &json!("ok")), "{body}");
}

/// The bodies a page can post cross-site without a preflight, by their `Content-Type` line.
const SIMPLE: &[(&str, &str)] = &[
    ("text/plain", "\r\nContent-Type: text/plain"),
    (
        "text/plain; charset=utf-8",
        "\r\nContent-Type: text/plain; charset=utf-8",
    ),
    (
        "application/x-www-form-urlencoded",
        "\r\nContent-Type: application/x-www-form-urlencoded",
    ),
    (
        "multipart/form-data; boundary=x",
        "\r\nContent-Type: multipart/form-data; boundary=x",
    ),
    ("", ""),
];

#[tokio::test]
async fn cross_site_simple_posts_to_submit_get_415_and_start_nothing() {
    let fake = FakeModel::start("fake-model", None).await;
    fake.push([Reply::text("started")]);
    let body = start("s", "i", "run this", &fake.base_url(), None).to_string();
    let open = open_server();
    let dir = tempfile::tempdir().unwrap();
    let guarded = Serve::start(dir.path());
    let guarded_addr = guarded.url.trim_start_matches("http://").to_owned();
    let auth = format!("\r\nAuthorization: Bearer {TOKEN}");
    for (addr, auth) in [(open.addr.as_str(), ""), (guarded_addr.as_str(), &auth)] {
        for (kind, line) in SIMPLE {
            let head = format!("POST /submit HTTP/1.1\r\nHost: {addr}{auth}{line}");
            let what = if kind.is_empty() {
                "a POST must send its body as JSON, with Content-Type: application/json (this \
                 one has no Content-Type)"
                    .to_owned()
            } else {
                format!(
                    "a POST must send its body as JSON, with Content-Type: application/json, \
                     not {kind:?}"
                )
            };
            // As a form posted from a file or a redirect sends it: no Origin.
            assert_eq!(raw(addr, &head, &body).await, (415, error(&what)), "{kind}");
            // Without the credential, as a page sends it, the credential check refuses it
            // first where one is set.
            let bare = format!("POST /submit HTTP/1.1\r\nHost: {addr}{line}");
            let want = if auth.is_empty() {
                error(&what)
            } else {
                error("an Authorization: Bearer credential is required")
            };
            let code = if auth.is_empty() { 415 } else { 401 };
            assert_eq!(raw(addr, &bare, &body).await, (code, want), "{kind}");
            // As a page's form or fetch() sends it: the page's Origin, refused first.
            let (code, answer) = raw(
                addr,
                &format!("{head}\r\nOrigin: https://evil.example"),
                &body,
            )
            .await;
            assert_eq!(code, 403, "{kind} from a foreign origin: {answer}");
        }
        // A method that is no route runs no handler: it keeps its 405.
        let (code, answer) = raw(
            addr,
            &format!("POST /get_status?invocation_id=i HTTP/1.1\r\nHost: {addr}{auth}"),
            "",
        )
        .await;
        assert_eq!(
            (code, answer),
            (405, error("/get_status does not accept POST"))
        );
        // Nothing was started: the invocation is unknown and the model was never called.
        let (code, answer) = raw(
            addr,
            &format!("GET /get_status?invocation_id=i HTTP/1.1\r\nHost: {addr}{auth}"),
            "",
        )
        .await;
        assert_eq!(
            (code, answer),
            (404, error("no invocation \"i\" was ever submitted"))
        );
        still_serving(addr, auth).await;
    }
    assert_eq!(fake.count(), 0);
}

#[tokio::test]
async fn without_a_credential_a_foreign_host_is_refused_and_a_rebinding_page_reads_nothing() {
    let fake = FakeModel::start("fake-model", None).await;
    fake.push([Reply::text("a private answer")]);
    let open = open_server();
    let addr = open.addr.as_str();
    let port = addr.rsplit(':').next().unwrap();
    // The operator's own evaluator: a session with a transcript.
    let body = start("s", "i", "a private task", &fake.base_url(), None).to_string();
    let json = "\r\nContent-Type: application/json";
    let (code, _) = raw(
        addr,
        &format!("POST /submit HTTP/1.1\r\nHost: localhost:{port}{json}"),
        &body,
    )
    .await;
    assert_eq!(code, 202);
    let collect = format!("GET /collect_output?invocation_id=i HTTP/1.1\r\nHost: {addr}");
    tokio::time::timeout(T, async {
        while raw(addr, &collect, "").await.0 != 200 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap();
    let refused = |host: &str| {
        error(&format!(
            "the Host {host:?} does not name this server: without a credential podhost answers \
             only requests addressed to localhost, 127.0.0.1, [::1] (set a credential to be \
             reached by other names)"
        ))
    };
    // A page at http://evil.example:<port>/ whose name now resolves to 127.0.0.1: every route
    // is refused under its name, the reads first.
    for route in [
        "GET /collect_output?invocation_id=i",
        "GET /get_status?invocation_id=i",
        "GET /healthz",
        "GET /metrics",
        "GET /openapi.yaml",
    ] {
        for host in [
            format!("evil.example:{port}"),
            "evil.example".to_owned(),
            format!("EVIL.example:{port}"),
        ] {
            let (code, answer) = raw(addr, &format!("{route} HTTP/1.1\r\nHost: {host}"), "").await;
            assert_eq!(
                (code, answer),
                (403, refused("evil.example")),
                "{route} {host}"
            );
        }
    }
    let (code, answer) = raw(
        addr,
        &format!("POST /submit HTTP/1.1\r\nHost: evil.example:{port}{json}"),
        &start("s2", "i2", "x", &fake.base_url(), None).to_string(),
    )
    .await;
    assert_eq!((code, answer), (403, refused("evil.example")));
    // The loopback names, with or without the port, are this server.
    for host in [
        format!("localhost:{port}"),
        "localhost".to_owned(),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
    ] {
        let (code, answer) = raw(
            addr,
            &format!("GET /collect_output?invocation_id=i HTTP/1.1\r\nHost: {host}"),
            "",
        )
        .await;
        assert_eq!(code, 200, "{host}: {answer}");
        assert_eq!(answer["messages"][0]["content"], "a private answer");
    }
    let (code, _) = raw(
        addr,
        &format!("GET /get_status?invocation_id=i2 HTTP/1.1\r\nHost: {addr}"),
        "",
    )
    .await;
    assert_eq!(code, 404, "the forged submission started nothing");
    still_serving(addr, "").await;
}

#[tokio::test]
async fn a_foreign_origin_is_refused_with_and_without_a_credential() {
    let fake = FakeModel::start("fake-model", None).await;
    let open = open_server();
    let dir = tempfile::tempdir().unwrap();
    let guarded = Serve::start(dir.path());
    let guarded_addr = guarded.url.trim_start_matches("http://").to_owned();
    let auth = format!("\r\nAuthorization: Bearer {TOKEN}");
    let json = "\r\nContent-Type: application/json";
    let body = start("s", "i", "x", &fake.base_url(), None).to_string();
    for (addr, auth) in [(open.addr.as_str(), ""), (guarded_addr.as_str(), &auth)] {
        for origin in [
            "https://evil.example",
            "http://evil.example",
            "null",
            "http://localhost:1",
        ] {
            let refused = error(&format!(
                "the Origin {origin:?} is not this server's: podhost answers no request that a \
                 page from another origin makes a browser send"
            ));
            for (head, body) in [
                (format!("POST /submit HTTP/1.1{json}"), body.as_str()),
                (
                    "GET /collect_output?invocation_id=i HTTP/1.1".to_owned(),
                    "",
                ),
                ("GET /healthz HTTP/1.1".to_owned(), ""),
            ] {
                let head = format!("{head}\r\nHost: {addr}{auth}\r\nOrigin: {origin}");
                let (code, answer) = raw(addr, &head, body).await;
                assert_eq!((code, answer), (403, refused.clone()), "{head}");
            }
        }
        // A browser's preflight for a cross-site JSON POST fails: OPTIONS is no route.
        let (code, answer) = raw(
            addr,
            &format!(
                "OPTIONS /submit HTTP/1.1\r\nHost: {addr}{auth}\r\nOrigin: https://evil.example\r\n\
                 Access-Control-Request-Method: POST\r\n\
                 Access-Control-Request-Headers: content-type"
            ),
            "",
        )
        .await;
        assert_eq!(
            (code, answer),
            (405, error("/submit does not accept OPTIONS"))
        );
        // The server's own origin is not foreign.
        let (code, answer) = raw(
            addr,
            &format!("GET /healthz HTTP/1.1\r\nHost: {addr}{auth}\r\nOrigin: http://{addr}"),
            "",
        )
        .await;
        assert_eq!((code, &answer["status"]), (200, &json!("ok")), "{answer}");
        let (code, _) = raw(
            addr,
            &format!("GET /get_status?invocation_id=i HTTP/1.1\r\nHost: {addr}{auth}"),
            "",
        )
        .await;
        assert_eq!(code, 404, "nothing was started");
        still_serving(addr, auth).await;
    }
    assert_eq!(fake.count(), 0);
}

/// With a credential, the kubelet and Prometheus reach the probes by the pod's IP, without the
/// credential; Oumi's evaluator reaches the routes by any name, with it.
#[tokio::test]
async fn with_a_credential_the_probes_and_routes_answer_under_any_host() {
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start(dir.path());
    let addr = s.url.trim_start_matches("http://").to_owned();
    for host in ["10.1.2.3:8080", "podhost-serve.evals.svc", "evil.example"] {
        for probe in ["/livez", "/readyz", "/metrics"] {
            let (code, _) = raw(&addr, &format!("GET {probe} HTTP/1.1\r\nHost: {host}"), "").await;
            assert_eq!(code, 200, "{probe} as {host}");
        }
        let (code, body) = raw(
            &addr,
            &format!("GET /healthz HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}"),
            "",
        )
        .await;
        assert_eq!((code, &body["status"]), (200, &json!("ok")), "{host}");
        // Without the credential, as a rebinding page would be.
        let (code, _) = raw(&addr, &format!("GET /healthz HTTP/1.1\r\nHost: {host}"), "").await;
        assert_eq!(code, 401, "{host}");
    }
    // As Oumi's evaluator sends a submission: JSON, no Origin, the credential.
    let (code, body) = s
        .submit(start("s", "i", "x", "http://127.0.0.1:9/v1", None))
        .await;
    assert_eq!(code, reqwest::StatusCode::ACCEPTED, "{body}");
}
