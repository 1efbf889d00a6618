//! The network filter (BYOH and local modes): with it, a command can open no socket but a Unix
//! one; without it (the default), it reaches a port the test listens on.

use std::io::Read;
use std::net::TcpListener;

use podhost::exec::confine::Settings;
use pretty_assertions::assert_eq;
use serde_json::json;

use crate::{Host, assert_still_works, bash};

/// Python that connects to 127.0.0.1:`port` and sends `hello`, printing the error if it fails.
fn connect(port: u16) -> String {
    format!(
        "python3 -c '
import socket
try:
    socket.create_connection((\"127.0.0.1\", {port}), timeout=5).sendall(b\"hello\")
    print(\"connected\")
except OSError as e:
    print(type(e).__name__, e)
'"
    )
}

#[tokio::test]
async fn the_network_is_denied_when_configured() {
    let host = Host::new();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let tb = host.toolbox(host.confinement(&Settings {
        deny_network: true,
        ..Settings::default()
    }));
    let out = bash(
        &host,
        &tb,
        &format!(
            "{}; exec 3<>/dev/tcp/127.0.0.1/{port}; \
             python3 -c 'import socket; a, b = socket.socketpair(); a.send(b\"unix ok\"); print(b.recv(9).decode())'",
            connect(port)
        ),
    )
    .await;
    assert_eq!(
        out,
        json!({
            "exitCode": 0,
            "stdout": "PermissionError [Errno 1] Operation not permitted\nunix ok\n",
            "stderr": format!(
                "/bin/bash: socket: Operation not permitted\n\
                 /bin/bash: line 8: /dev/tcp/127.0.0.1/{port}: Operation not permitted\n"
            )
        })
    );
    listener.set_nonblocking(true).unwrap();
    assert!(listener.accept().is_err(), "a connection got through");
    assert_still_works(&tb).await;
}

#[tokio::test]
async fn the_network_is_allowed_by_default() {
    let host = Host::new();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let tb = host.confined();
    let out = bash(&host, &tb, &connect(port)).await;
    assert_eq!(
        out,
        json!({"exitCode": 0, "stdout": "connected\n", "stderr": ""})
    );
    // The connection is queued: accept it now and read what the command sent.
    let (mut conn, _) = listener.accept().unwrap();
    let mut got = String::new();
    conn.read_to_string(&mut got).unwrap();
    assert_eq!(got, "hello");
}
