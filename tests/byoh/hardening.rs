//! The HTTP listener under attack: half-open connections by the thousand, slow headers, stalled
//! and oversized bodies, a data directory out of space. Each test asserts that the attack fails
//! and that `/healthz` still answers within a second.

use std::time::Duration;

use pretty_assertions::assert_eq;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::harness::{Options, Serve, T, TOKEN, start};

/// `/healthz` must answer within this, whatever else the server is going through.
const HEALTHY: Duration = Duration::from_secs(1);

/// Raises this test process's open-file limit to its hard limit (the attacks open many sockets).
fn more_files() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
}

fn addr(s: &Serve) -> String {
    s.url.trim_start_matches("http://").to_owned()
}

/// `/healthz` answers 200 within [`HEALTHY`], on a fresh connection.
async fn assert_healthy(s: &Serve) {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let resp = tokio::time::timeout(
        HEALTHY,
        client
            .get(format!("{}/healthz", s.url))
            .bearer_auth(TOKEN)
            .send(),
    )
    .await
    .unwrap_or_else(|_| panic!("/healthz did not answer within {HEALTHY:?}"))
    .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
}

/// The kubelet's probes (`/livez`, `/readyz`, no credential) answer 200 within [`HEALTHY`]: they
/// go through the same listener, cap and timeouts as every route.
async fn assert_probes_answer(s: &Serve) {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    for probe in ["/livez", "/readyz"] {
        let resp = tokio::time::timeout(HEALTHY, client.get(format!("{}{probe}", s.url)).send())
            .await
            .unwrap_or_else(|_| panic!("{probe} did not answer within {HEALTHY:?}"))
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{probe}");
    }
}

/// Reads until the server closes the connection (end of file or a reset), within `within`;
/// returns what was read.
async fn closed_within(sock: &mut TcpStream, within: Duration) -> String {
    let mut got = Vec::new();
    let read = tokio::time::timeout(within, async {
        let mut buf = [0u8; 4096];
        loop {
            match sock.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(
        read.is_ok(),
        "the connection is still open after {within:?}"
    );
    String::from_utf8_lossy(&got).into_owned()
}

/// Resident memory of a process, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[tokio::test]
async fn a_thousand_half_open_connections_do_not_keep_healthz_from_answering() {
    more_files();
    let dir = tempfile::tempdir().unwrap();
    // Long enough for the count below to see every connection still open.
    let s = Serve::start_with(
        dir.path(),
        Options::default().env("PODHOST_HTTP_HEADER_TIMEOUT_SECS", "120"),
    );
    let before = rss_kib(s.child.id());
    let mut socks = Vec::new();
    for i in 0..1000 {
        let mut sock = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr(&s)))
            .await
            .unwrap()
            .unwrap();
        // Half send nothing; half start their headers and stop.
        if i % 2 == 1 {
            sock.write_all(b"POST /submit HTTP/1.1\r\nHost: x\r\n")
                .await
                .unwrap();
        }
        socks.push(sock);
    }
    assert_healthy(&s).await;
    assert_probes_answer(&s).await;
    let during = rss_kib(s.child.id());
    // Still all open: 1,000 is below the default cap.
    let mut probe = [0u8; 1];
    let open = socks
        .iter()
        .filter(|sock| matches!(sock.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock))
        .count();
    assert_eq!(open, 1000);
    // A connection waiting for its headers costs a few KiB, not a buffer per byte declared.
    assert!(
        during < before + 64 * 1024,
        "RSS grew from {before} KiB to {during} KiB"
    );
    drop(socks);
    assert_healthy(&s).await;
}

/// The `Max open files` limits (soft, hard) of a process.
fn open_file_limits(pid: u32) -> (u64, u64) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let mut n = line
        .trim_start_matches("Max open files")
        .split_whitespace()
        .map(|v| v.parse().unwrap());
    (n.next().unwrap(), n.next().unwrap())
}

/// podhost raises its open-file limit to the hard limit at start (each connection holds a
/// descriptor). Where even the hard limit cannot hold the connection cap, the cap is lowered
/// with a warning, and a flood past it still leaves `/healthz` served.
#[tokio::test]
async fn the_open_file_limit_is_raised_and_lowers_the_connection_cap_it_cannot_hold() {
    more_files();
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start_with(
        dir.path(),
        Options {
            open_files: Some((256, 4096)),
            ..Options::default()
        },
    );
    assert_eq!(open_file_limits(s.child.id()), (4096, 4096));
    assert_healthy(&s).await;
    drop(s);
    // A hard limit of 600 holds 600 - 512 (kept for the store, commands and model calls) = 88
    // connections: the default cap of 4096 cannot be kept.
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start_with(
        dir.path(),
        Options {
            open_files: Some((600, 600)),
            ..Options::default()
        },
    );
    assert_eq!(open_file_limits(s.child.id()), (600, 600));
    let warned = s.logs().lines().any(|l| {
        l.contains(
            "the open-file limit cannot hold PODHOST_HTTP_MAX_CONNECTIONS; lowering it to 88",
        )
    });
    assert!(warned, "{}", s.logs());
    let mut socks = Vec::new();
    for _ in 0..300 {
        let mut sock = TcpStream::connect(addr(&s)).await.unwrap();
        sock.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
        socks.push(sock);
    }
    assert_healthy(&s).await;
    // The oldest were closed to stay within the cap (and within the open-file limit).
    for sock in socks.iter_mut().take(100) {
        assert_eq!(closed_within(sock, Duration::from_secs(5)).await, "");
    }
    assert_healthy(&s).await;
}

#[tokio::test]
async fn at_the_connection_cap_the_oldest_unfinished_connections_are_closed_first() {
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start_with(
        dir.path(),
        Options::default().env("PODHOST_HTTP_MAX_CONNECTIONS", "50"),
    );
    let mut socks = Vec::new();
    for _ in 0..80 {
        let mut sock = TcpStream::connect(addr(&s)).await.unwrap();
        sock.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
        socks.push(sock);
    }
    // Each health check takes a connection too: the oldest half-open ones made room.
    for _ in 0..5 {
        assert_healthy(&s).await;
    }
    assert_probes_answer(&s).await;
    let (first, last) = socks.split_at_mut(30);
    for sock in first.iter_mut() {
        assert_eq!(closed_within(sock, Duration::from_secs(5)).await, "");
    }
    let mut probe = [0u8; 1];
    let open = last
        .iter()
        .filter(|sock| matches!(sock.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock))
        .count();
    assert!(
        open >= 40,
        "only {open} of the newest 50 half-open connections are open"
    );
}

#[tokio::test]
async fn slow_headers_and_silent_kept_alive_connections_are_closed() {
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start_with(
        dir.path(),
        Options::default()
            .env("PODHOST_HTTP_HEADER_TIMEOUT_SECS", "1")
            .env("PODHOST_HTTP_IDLE_TIMEOUT_SECS", "2"),
    );
    // Headers that never finish: closed without an answer.
    let mut slow = TcpStream::connect(addr(&s)).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    // Nothing at all: closed too.
    let mut silent = TcpStream::connect(addr(&s)).await.unwrap();
    assert_eq!(closed_within(&mut slow, Duration::from_secs(5)).await, "");
    assert_eq!(closed_within(&mut silent, Duration::from_secs(5)).await, "");
    // A request answered, then silence: kept alive past the header timeout, closed after the
    // idle timeout.
    let mut kept = TcpStream::connect(addr(&s)).await.unwrap();
    kept.write_all(
        format!("GET /healthz HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let answered = closed_within(&mut kept, Duration::from_secs(6)).await;
    assert!(answered.starts_with("HTTP/1.1 200 OK\r\n"), "{answered}");
    assert_healthy(&s).await;
}

#[tokio::test]
async fn stalled_and_oversized_bodies_neither_pin_memory_nor_block_healthz() {
    more_files();
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start_with(
        dir.path(),
        Options::default().env("PODHOST_HTTP_BODY_TIMEOUT_SECS", "3"),
    );
    let before = rss_kib(s.child.id());
    let head = |len: u64| {
        format!(
            "POST /submit HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\
             Content-Type: application/json\r\nContent-Length: {len}\r\n\r\n"
        )
    };
    // 100 bodies declared at 40 MiB: refused with 413 before a byte of them is read.
    let mut oversized = Vec::new();
    for _ in 0..100 {
        let mut sock = TcpStream::connect(addr(&s)).await.unwrap();
        sock.write_all(head(40 << 20).as_bytes()).await.unwrap();
        sock.write_all(&[b'x'; 1024]).await.unwrap();
        oversized.push(sock);
    }
    for sock in &mut oversized {
        let answer = closed_within(sock, Duration::from_secs(10)).await;
        assert!(
            answer.starts_with("HTTP/1.1 413 Payload Too Large\r\n")
                && answer.ends_with(
                    r#"{"error":{"message":"the request body is larger than 10485760 bytes (10 MiB)"}}"#
                ),
            "{answer}"
        );
    }
    // 100 bodies declared at 9 MiB (under the limit) that stall after 64 KiB.
    let mut stalled = Vec::new();
    for _ in 0..100 {
        let mut sock = TcpStream::connect(addr(&s)).await.unwrap();
        sock.write_all(head(9 << 20).as_bytes()).await.unwrap();
        sock.write_all(&[b' '; 64 << 10]).await.unwrap();
        stalled.push(sock);
    }
    assert_healthy(&s).await;
    let during = rss_kib(s.child.id());
    // Nothing is allocated for what was declared but not sent: 100 × 9 MiB would be 900 MiB.
    assert!(
        during < before + 64 * 1024,
        "RSS grew from {before} KiB to {during} KiB"
    );
    // The body timeout closes them without an answer.
    for sock in &mut stalled {
        assert_eq!(closed_within(sock, Duration::from_secs(10)).await, "");
    }
    assert_healthy(&s).await;
}

#[tokio::test]
async fn unknown_routes_and_methods_get_the_json_error_body_and_the_scheme_ignores_case() {
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start(dir.path());
    let send = |req: reqwest::RequestBuilder| async move {
        let resp = tokio::time::timeout(Duration::from_secs(10), req.send())
            .await
            .unwrap()
            .unwrap();
        let status = resp.status();
        let body: Value = serde_json::from_str(&resp.text().await.unwrap()).unwrap();
        (status, body)
    };
    assert_eq!(
        send(s.http.get(format!("{}/nowhere", s.url)).bearer_auth(TOKEN)).await,
        (
            StatusCode::NOT_FOUND,
            json!({"error": {"message": "there is no route /nowhere"}})
        )
    );
    assert_eq!(
        send(
            s.http
                .delete(format!("{}/submit", s.url))
                .bearer_auth(TOKEN)
        )
        .await,
        (
            StatusCode::METHOD_NOT_ALLOWED,
            json!({"error": {"message": "/submit does not accept DELETE"}})
        )
    );
    for scheme in ["bearer", "BEARER", "bEaReR"] {
        let (status, body) = send(
            s.http
                .get(format!("{}/healthz", s.url))
                .header("authorization", format!("{scheme} {TOKEN}")),
        )
        .await;
        assert_eq!((status, &body["status"]), (StatusCode::OK, &json!("ok")));
    }
}

#[tokio::test]
async fn below_the_free_space_floor_new_work_is_503_and_known_work_is_answered() {
    let dir = tempfile::tempdir().unwrap();
    // A floor no file system meets: every new submission is refused, as on a full disk.
    let s = Serve::start_with(
        dir.path(),
        Options::default().env("PODHOST_MIN_FREE_MB", "1000000000"),
    );
    let (code, body) = s
        .submit(start("s1", "i1", "hi", "http://127.0.0.1:9/v1", None))
        .await;
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("the data directory has ")
            && message.ends_with(
                " MiB free, below the 1000000000 MiB podhost keeps free for its store; new work \
                 is refused until space is freed"
            ),
        "{message}"
    );
    assert_eq!(s.status("i1").await.0, StatusCode::NOT_FOUND);
    assert_healthy(&s).await;
    drop(s);
    // Work accepted before the disk filled keeps being answered.
    let s = Serve::start(dir.path());
    let (code, _) = s
        .submit(start("s2", "i2", "hi", "http://127.0.0.1:9/v1", None))
        .await;
    assert_eq!(code, StatusCode::ACCEPTED);
    drop(s);
    let s = Serve::start_with(
        dir.path(),
        Options::default().env("PODHOST_MIN_FREE_MB", "1000000000"),
    );
    let (code, body) = s
        .submit(start("s2", "i2", "hi", "http://127.0.0.1:9/v1", None))
        .await;
    assert!(
        [StatusCode::OK, StatusCode::ACCEPTED].contains(&code),
        "{code} {body}"
    );
    assert_eq!(body["invocation_id"], "i2");
}

/// The value of a sample of `/metrics` (`name` with its labels, as the text writes it); 0 when
/// the series does not exist yet.
async fn metric(s: &Serve, name: &str) -> f64 {
    let text = tokio::time::timeout(HEALTHY, s.http.get(format!("{}/metrics", s.url)).send())
        .await
        .unwrap_or_else(|_| panic!("/metrics did not answer within {HEALTHY:?}"))
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// Whether the server has not closed `sock` (nothing to read yet, no end of file).
fn still_open(sock: &TcpStream) -> bool {
    let mut probe = [0u8; 1];
    matches!(sock.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

#[tokio::test]
async fn stalled_bodies_past_the_cap_on_body_bytes_held_are_closed_and_healthz_still_answers() {
    more_files();
    let dir = tempfile::tempdir().unwrap();
    // The default cap, 64 MiB; a body timeout long enough to watch the bodies stall.
    let s = Serve::start_with(
        dir.path(),
        Options::default().env("PODHOST_HTTP_BODY_TIMEOUT_SECS", "10"),
    );
    const CAP: f64 = (64 << 20) as f64;
    const SENT: usize = 7 << 20;
    const BODIES: usize = 12;
    let head = format!(
        "POST /submit HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        10 << 20
    );
    // Twelve 10 MiB bodies that stall after 7 MiB: 84 MiB against the cap of 64.
    let senders: Vec<_> = (0..BODIES)
        .map(|_| {
            let (addr, head) = (addr(&s), head.clone());
            tokio::spawn(async move {
                let mut sock = TcpStream::connect(addr).await.unwrap();
                sock.write_all(head.as_bytes()).await.unwrap();
                // A body the server closes fails to send: that is the refusal.
                let _ = sock.write_all(&vec![b' '; SENT]).await;
                sock
            })
        })
        .collect();
    let mut socks = Vec::new();
    for sender in senders {
        socks.push(tokio::time::timeout(T, sender).await.unwrap().unwrap());
    }
    // Wait until every body is either held whole (7 MiB read) or closed; the bytes held never
    // pass the cap meanwhile.
    let settled = tokio::time::timeout(T, async {
        loop {
            let held = metric(&s, "podhost_http_body_bytes_held").await;
            assert!(held <= CAP, "{held} bytes held, past the cap of {CAP}");
            let open = socks.iter().filter(|sock| still_open(sock)).count();
            let refused = metric(&s, "podhost_http_bodies_refused_total{reason=\"held\"}").await;
            if held == (open * SENT) as f64 && refused == (BODIES - open) as f64 {
                return open;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let open = settled.unwrap_or_else(|_| panic!("the bodies did not settle\n{}", s.log_tail()));
    // At most nine 7 MiB bodies fit in 64 MiB; the others were closed without an answer.
    assert!((1..=9).contains(&open), "{open} bodies held of {BODIES}");
    for sock in socks.iter_mut().filter(|sock| !still_open(sock)) {
        assert_eq!(closed_within(sock, Duration::from_secs(1)).await, "");
    }
    assert_healthy(&s).await;
    assert_probes_answer(&s).await;
    // The body timeout closes the stalled ones, and what they held is given back.
    for sock in &mut socks {
        assert_eq!(closed_within(sock, Duration::from_secs(20)).await, "");
    }
    let held = tokio::time::timeout(T, async {
        loop {
            let held = metric(&s, "podhost_http_body_bytes_held").await;
            if held == 0.0 {
                return held;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert_eq!(held, Ok(0.0));
    assert_eq!(
        metric(&s, "podhost_http_bodies_refused_total{reason=\"timeout\"}").await,
        open as f64
    );
    assert_healthy(&s).await;
}

#[tokio::test]
async fn at_the_connection_cap_slow_bodies_make_room_for_healthz() {
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start_with(
        dir.path(),
        Options::default()
            .env("PODHOST_HTTP_MAX_CONNECTIONS", "16")
            .env("PODHOST_HTTP_BODY_TIMEOUT_SECS", "60"),
    );
    let head = format!(
        "POST /submit HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: 1000\r\nExpect: 100-continue\r\n\r\n"
    );
    // The cap filled with bodies that bring a byte and stall, each being read by its handler
    // (the server asks for the body once the handler reads it).
    let mut slow = Vec::new();
    for _ in 0..16 {
        let mut sock = TcpStream::connect(addr(&s)).await.unwrap();
        sock.write_all(head.as_bytes()).await.unwrap();
        let mut got = [0u8; 25];
        tokio::time::timeout(T, sock.read_exact(&mut got))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&got),
            "HTTP/1.1 100 Continue\r\n\r\n"
        );
        sock.write_all(b"{").await.unwrap();
        slow.push(sock);
    }
    // The first health check closes the body that has stalled longest, unanswered; the later
    // ones find the room a finished check leaves (or close the next stalled body).
    for _ in 0..3 {
        assert_healthy(&s).await;
    }
    assert_probes_answer(&s).await;
    assert_eq!(
        closed_within(&mut slow[0], Duration::from_secs(5)).await,
        ""
    );
    let open = slow.iter().filter(|sock| still_open(sock)).count();
    assert!(
        (11..=15).contains(&open),
        "{open} of the 16 slow bodies are open"
    );
}
