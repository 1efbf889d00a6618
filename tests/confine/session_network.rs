//! A session's network namespace (pod and BYOH hosts): from a session's commands, nothing that
//! listens on the host is reachable — a TCP port on loopback (podhost's own, a PostgreSQL), a
//! UNIX socket wherever it lies, an abstract socket — neither directly nor through the proxy
//! that is the session's one way out; what lies beyond the host is reached through that proxy.
//! Where this machine allows no network namespace, each test checks the host-network level and
//! says so.

use std::io::Read;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use pretty_assertions::assert_eq;
use serde_json::json;

use crate::pg::TestPg;
use crate::{Host, assert_still_works, bash, elsewhere, marker};
use podhost::exec::confine::Level;
use podhost::exec::net::Network;

/// Whether sessions get a network namespace here; says so when they do not.
fn has_session_network() -> bool {
    let probe = podhost::exec::probe::probe_host(crate::support::supervisor_bin());
    if !probe.network {
        eprintln!(
            "this machine gives sessions no network namespace ({}): checking that the level \
             says `host` instead",
            probe.refused.join("; ")
        );
    }
    probe.network
}

/// The level of an isolated host, as its health endpoint reports it.
fn level(host: &Host, deny_network: bool) -> Level {
    let mut settings = crate::isolated_settings();
    settings.deny_network = deny_network;
    host.confinement(&settings).level()
}

/// Python that tries each address (`host:port`, a path, or `@name` for an abstract socket) and
/// prints how each attempt ended.
const CONNECT: &str = r#"python3 -c '
import socket, sys
for addr in sys.argv[1:]:
    if ":" in addr:
        host, port = addr.rsplit(":", 1)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        s, target = socket.socket(family), (host.strip("[]"), int(port))
    else:
        s, target = socket.socket(socket.AF_UNIX), addr.replace("@", "\0")
    s.settimeout(5)
    try:
        s.connect(target)
        print(addr, "connected")
    except OSError as e:
        print(addr, type(e).__name__)
' "#;

/// A UNIX socket listening at `path`, open to everyone, removed when dropped.
struct Socket(
    PathBuf,
    #[allow(dead_code)] std::os::unix::net::UnixListener,
);

impl Socket {
    fn bind(path: PathBuf) -> Socket {
        let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
        l.set_nonblocking(true).unwrap();
        Socket(path, l)
    }

    fn was_reached(&self) -> bool {
        self.1.accept().is_ok()
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A directory under `/home` for the socket there (made world-traversable; removed on drop).
struct HomeDir(PathBuf);

impl Drop for HomeDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn home_dir() -> Option<HomeDir> {
    let dir = PathBuf::from("/home").join(marker("podhost-test"));
    std::fs::create_dir_all(&dir).ok()?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).ok()?;
    Some(HomeDir(dir))
}

/// Every listener of the host a session might try: a loopback port standing for podhost's own
/// API, a PostgreSQL on loopback (its TCP port and its socket), sockets in `/tmp`, `/var/lib`
/// (or the build's directory) and `/home`, an abstract socket. None is reached, directly or
/// through the session's proxy; the next call works.
#[tokio::test]
async fn a_session_reaches_nothing_that_listens_on_the_host() {
    let host = Host::new();
    if !crate::has_namespaces() || !has_session_network() {
        assert_eq!(level(&host, false).network, "host");
        return;
    }
    let api = TcpListener::bind("127.0.0.1:0").unwrap();
    api.set_nonblocking(true).unwrap();
    let api_port = api.local_addr().unwrap().port();
    let v6 = TcpListener::bind("[::1]:0").ok();
    let mut targets = vec![
        format!("127.0.0.1:{api_port}"),
        format!("localhost:{api_port}"),
    ];
    if let Some(l) = &v6 {
        targets.push(format!("[::1]:{}", l.local_addr().unwrap().port()));
    }
    let pg = TestPg::shared();
    if let Some(pg) = pg {
        targets.push(format!("127.0.0.1:{}", pg.port));
    }
    let name = marker("podhost-test");
    let outside = elsewhere();
    let mut sockets = vec![
        Socket::bind(PathBuf::from(format!("/tmp/{name}.sock"))),
        Socket::bind(outside.path().join("s.sock")),
    ];
    let home = home_dir();
    match &home {
        Some(h) => sockets.push(Socket::bind(h.0.join("s.sock"))),
        None => eprintln!("/home cannot be written here: no socket there"),
    }
    let abstract_listener = {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let l = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
        l.set_nonblocking(true).unwrap();
        l
    };
    let mut paths: Vec<String> = sockets.iter().map(|s| s.0.display().to_string()).collect();
    paths.push(format!("@{name}"));
    let tb = host.isolated(|_| {});
    let all: Vec<String> = targets.iter().chain(&paths).cloned().collect();
    let out = bash(&host, &tb, &format!("{CONNECT}{}", all.join(" "))).await;
    let expected: String = targets
        .iter()
        .map(|t| format!("{t} ConnectionRefusedError\n"))
        .chain(paths.iter().map(|p| {
            // A covered socket is a device node now; a hidden directory has nothing in it.
            let why = if p.starts_with("/tmp/") {
                "FileNotFoundError"
            } else {
                "ConnectionRefusedError"
            };
            format!("{} {why}\n", host.redact(p))
        }))
        .collect();
    assert_eq!(
        out,
        json!({"exitCode": 0, "stdout": expected, "stderr": ""}),
        "directly"
    );
    // Through the proxy: each loopback name is refused with the reason, before any connection.
    let curls: Vec<String> = targets
        .iter()
        .map(|t| format!("curl -sS -m 10 --noproxy '' -x http://127.0.0.1:3128 http://{t}/"))
        .collect();
    let out = bash(&host, &tb, &curls.join("; ")).await;
    let text = out["stdout"].as_str().unwrap();
    assert_eq!(
        text.lines().count(),
        targets.len(),
        "one refusal per target: {out}"
    );
    for line in text.lines() {
        assert!(
            line.starts_with("podhost: ") && line.contains("the host's loopback"),
            "{line}"
        );
    }
    assert!(api.accept().is_err(), "the loopback port was reached");
    for s in &sockets {
        assert!(!s.was_reached(), "{} was reached", s.0.display());
    }
    assert!(
        abstract_listener.accept().is_err(),
        "the abstract socket was reached"
    );
    assert_eq!(level(&host, false).network, "namespace");
    assert_still_works(&tb).await;
}

/// The proxy refuses every way of naming the host itself: the unspecified address, the host's
/// own interface addresses, the link-local range where cloud metadata answers; a CONNECT tunnel
/// is refused likewise.
#[tokio::test]
async fn the_proxy_refuses_every_name_of_the_host() {
    let host = Host::new();
    if !crate::has_namespaces() || !has_session_network() {
        assert_eq!(level(&host, false).network, "host");
        return;
    }
    let api = TcpListener::bind("0.0.0.0:0").unwrap();
    api.set_nonblocking(true).unwrap();
    let port = api.local_addr().unwrap().port();
    let mut names = vec![
        format!("0.0.0.0:{port}"),
        format!("169.254.169.254:{port}"),
        format!("127.1.2.3:{port}"),
    ];
    if let Some(own) = own_address() {
        names.push(format!("{own}:{port}"));
    }
    let tb = host.isolated(|_| {});
    let mut script = String::new();
    for n in &names {
        script.push_str(&format!(
            "curl -sS -m 10 http://{n}/ ; curl -sS -m 10 -p -o /dev/null https://{n}/ 2>&1 | \
             sed 's/ after .*//'; "
        ));
    }
    let out = bash(&host, &tb, &script).await;
    let text = out["stdout"].as_str().unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2 * names.len(), "{out}");
    for pair in lines.chunks(2) {
        assert!(pair[0].starts_with("podhost: "), "{pair:?}");
        assert_eq!(
            pair[1], "curl: (56) CONNECT tunnel failed, response 403",
            "{pair:?}"
        );
    }
    assert!(api.accept().is_err(), "the host's port was reached");
    assert_still_works(&tb).await;
}

/// An address of this host that is not loopback, if it has one.
fn own_address() -> Option<std::net::IpAddr> {
    let out = Command::new("hostname").arg("-I").output().ok()?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .find_map(|a| a.parse().ok())
}

/// A host beyond this one: a network namespace of the test's own, joined to this host by a veth
/// pair, with an HTTP server in it. Needs root and `ip` (iproute2).
struct Peer {
    name: String,
    server: Child,
    addr: String,
    /// The pair's network: private (`10.213.0.0/16`), as a cluster's or a VPC's would be.
    network: Network,
}

impl Peer {
    fn start() -> Option<Peer> {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("not root: no peer host for the outbound test");
            return None;
        }
        // Kernel interface names are at most 15 bytes.
        let n = std::process::id() % 100_000;
        let name = format!("phpeer{n}");
        let ip = |args: &[&str]| {
            Command::new("ip")
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        let (here, there) = (format!("phh{n}"), format!("php{n}"));
        let subnet = 64 + (n % 128);
        let (host_ip, peer_ip) = (format!("10.213.{subnet}.1"), format!("10.213.{subnet}.2"));
        let made = ip(&["netns", "add", &name])
            && ip(&[
                "link", "add", &here, "type", "veth", "peer", "name", &there, "netns", &name,
            ])
            && ip(&["addr", "add", &format!("{host_ip}/30"), "dev", &here])
            && ip(&["link", "set", &here, "up"])
            && ip(&[
                "netns",
                "exec",
                &name,
                "ip",
                "addr",
                "add",
                &format!("{peer_ip}/30"),
                "dev",
                &there,
            ])
            && ip(&["netns", "exec", &name, "ip", "link", "set", &there, "up"])
            && ip(&["netns", "exec", &name, "ip", "link", "set", "lo", "up"]);
        if !made {
            let _ = ip(&["netns", "del", &name]);
            // CI installs iproute2 and runs as root: there the test must run.
            assert!(
                std::env::var_os("CI").is_none(),
                "could not make a peer network namespace with ip (iproute2)"
            );
            eprintln!("could not make a peer network namespace with ip: no outbound test");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("index.html"), "hello from beyond\n").unwrap();
        let server = Command::new("ip")
            .args(["netns", "exec", &name, "python3", "-m", "http.server"])
            .args(["--bind", &peer_ip, "8080", "--directory"])
            .arg(dir.keep())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let peer = Peer {
            name,
            server,
            addr: format!("{peer_ip}:8080"),
            network: format!("10.213.{subnet}.0/30").parse().unwrap(),
        };
        // Ready once it answers from here.
        for _ in 0..100 {
            if std::net::TcpStream::connect(&peer.addr).is_ok() {
                return Some(peer);
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!("the peer's server did not start");
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let mut err = String::new();
        if let Some(e) = self.server.stderr.as_mut() {
            let _ = e.read_to_string(&mut err);
        }
        let _ = self.server.wait();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// What lies beyond the host is reached through the session's proxy — a plain request and a
/// CONNECT tunnel — and not around it: a connection that ignores the proxy has no route. The
/// peer's network is private, so the host allows it as an operator would
/// (`PODHOST_SESSION_ALLOW_NETWORKS`).
#[tokio::test]
async fn the_world_beyond_the_host_is_reached_through_the_proxy_only() {
    let host = Host::new();
    if !crate::has_namespaces() || !has_session_network() {
        assert_eq!(level(&host, false).network, "host");
        return;
    }
    let Some(peer) = Peer::start() else {
        return;
    };
    let tb = host.isolated(|s| s.allow_networks = vec![peer.network]);
    let out = bash(
        &host,
        &tb,
        &format!(
            "curl -sS -m 10 http://{0}/index.html; curl -sS -m 10 -p http://{0}/index.html; \
             {CONNECT}{0}",
            peer.addr
        ),
    )
    .await;
    assert_eq!(
        out,
        json!({
            "exitCode": 0,
            "stdout": format!(
                "hello from beyond\nhello from beyond\n{} OSError\n",
                peer.addr
            ),
            "stderr": ""
        })
    );
    assert_still_works(&tb).await;
}

/// A private network beyond the host (a cluster's services, a VPC's databases) is refused by
/// the proxy, with the reason and the setting that allows it, until the host allows it; an
/// allowed network lifts nothing else.
#[tokio::test]
async fn a_private_network_beyond_the_host_is_refused_unless_allowed() {
    let host = Host::new();
    if !crate::has_namespaces() || !has_session_network() {
        assert_eq!(level(&host, false).network, "host");
        return;
    }
    let Some(peer) = Peer::start() else {
        return;
    };
    let ip = peer.addr.split(':').next().unwrap();
    let script = format!(
        "curl -sS -m 10 http://{0}/index.html; curl -sS -m 10 -p -o /dev/null \
         http://{0}/index.html 2>&1 | sed 's/ after .*//'",
        peer.addr
    );
    let refused = bash(&host, &host.isolated(|_| {}), &script).await;
    assert_eq!(
        refused,
        json!({
            "exitCode": 0,
            "stdout": format!(
                "podhost: {ip} is a private address (10.0.0.0/8): a session's commands reach \
                 a network that is not global only when the host's \
                 PODHOST_SESSION_ALLOW_NETWORKS names it\n\
                 curl: (56) CONNECT tunnel failed, response 403\n"
            ),
            "stderr": ""
        })
    );
    // Allowing every IPv4 network still leaves the host's loopback out (`NO_PROXY` would keep
    // loopback direct, into the session's own).
    let everything: Network = "0.0.0.0/0".parse().unwrap();
    let tb = host.isolated(|s| s.allow_networks = vec![everything]);
    let out = bash(
        &host,
        &tb,
        &format!(
            "{script}; curl -sS -m 10 --noproxy '' -x http://127.0.0.1:3128 http://127.0.0.1:9/"
        ),
    )
    .await;
    assert_eq!(
        out,
        json!({
            "exitCode": 0,
            "stdout": "hello from beyond\npodhost: 127.0.0.1 is the host's loopback: a \
                       session's commands cannot reach the host's own services\n",
            "stderr": ""
        })
    );
    assert_still_works(&tb).await;
}

/// `--deny-network` in a namespace: loopback only. A command can serve and reach itself on
/// loopback, has no proxy, and reaches nothing else.
#[tokio::test]
async fn a_denied_network_is_loopback_only() {
    let host = Host::new();
    if !crate::has_namespaces() || !has_session_network() {
        let level = level(&host, true);
        assert_eq!((level.network, level.network_filter), ("host", true));
        return;
    }
    let api = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = api.local_addr().unwrap().port();
    let tb = host.isolated(|s| s.deny_network = true);
    let out = bash(
        &host,
        &tb,
        &format!(
            "env | grep -ci proxy; python3 -c '
import socket
s = socket.socket(); s.bind((\"127.0.0.1\", 0)); s.listen()
c = socket.create_connection(s.getsockname()); a, _ = s.accept(); c.sendall(b\"loopback ok\")
print(a.recv(20).decode())
'; {CONNECT}127.0.0.1:{port} 10.213.0.2:80 127.0.0.1:3128"
        ),
    )
    .await;
    assert_eq!(
        out,
        json!({
            "exitCode": 0,
            "stdout": format!(
                "0\nloopback ok\n127.0.0.1:{port} ConnectionRefusedError\n\
                 10.213.0.2:80 OSError\n127.0.0.1:3128 ConnectionRefusedError\n"
            ),
            "stderr": ""
        })
    );
    let level = level(&host, true);
    assert_eq!(
        (level.network, level.network_filter),
        ("namespace, loopback only", false)
    );
    assert_still_works(&tb).await;
}

/// The proxy's bounds: garbage gets a clear error, a request head past its limit is refused, a
/// connection past the session's cap is closed at once; the next request through the same proxy
/// still works.
#[tokio::test]
async fn the_proxy_refuses_what_it_cannot_read_and_keeps_serving() {
    let host = Host::new();
    if !crate::has_namespaces() || !has_session_network() {
        assert_eq!(level(&host, false).network, "host");
        return;
    }
    let tb = host.isolated(|_| {});
    let out = bash(
        &host,
        &tb,
        "python3 -c '
import socket
def ask(data):
    s = socket.create_connection((\"127.0.0.1\", 3128), timeout=10)
    try:
        s.sendall(data)
        return s.recv(200).decode(errors=\"replace\").split(\"\\r\\n\")[0]
    except OSError as e:
        return type(e).__name__
print(ask(b\"GET /relative HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n\"))
print(ask(b\"\\x00\\x01garbage\\r\\n\\r\\n\"))
print(ask(b\"GET http://x/ HTTP/1.1\\r\\nA: \" + b\"a\" * 70000 + b\"\\r\\n\\r\\n\"))
print(ask(b\"CONNECT 127.0.0.1:1 HTTP/1.1\\r\\n\\r\\n\"))
idle = [socket.create_connection((\"127.0.0.1\", 3128)) for _ in range(256)]
at_cap = ask(b\"CONNECT 127.0.0.1:1 HTTP/1.1\\r\\n\\r\\n\")
print(\"closed at the cap\" if at_cap in (\"\", \"ConnectionResetError\") else at_cap)
for c in idle:
    c.close()
import time
time.sleep(0.5)
print(ask(b\"CONNECT 127.0.0.1:1 HTTP/1.1\\r\\n\\r\\n\"))
'",
    )
    .await;
    assert_eq!(
        out,
        json!({
            "exitCode": 0,
            "stdout": "HTTP/1.1 400 Bad Request\nHTTP/1.1 400 Bad Request\n\
                       HTTP/1.1 431 Request Header Fields Too Large\n\
                       HTTP/1.1 403 Forbidden\nclosed at the cap\nHTTP/1.1 403 Forbidden\n",
            "stderr": ""
        })
    );
    assert_still_works(&tb).await;
}

/// A socket the host binds while a session lives — after its view was built, and again after
/// its server restarted at the same path — is covered before the session's next command.
#[tokio::test]
async fn a_socket_bound_after_the_session_started_is_covered_too() {
    let host = Host::new();
    if !crate::has_namespaces() {
        return crate::fallback::check_landlock_level(&host).await;
    }
    let outside = elsewhere();
    let path = outside.path().join("late.sock");
    let tb = host.isolated(|_| {});
    // The first command starts the session's holder and builds its view.
    assert_eq!(bash(&host, &tb, "echo up").await["stdout"], json!("up\n"));
    for round in ["bound late", "bound again"] {
        let socket = Socket::bind(path.clone());
        let out = bash(&host, &tb, &format!("{CONNECT}{}", path.display())).await;
        assert_eq!(
            out["stdout"],
            json!(format!(
                "{} ConnectionRefusedError\n",
                host.redact(&path.display().to_string())
            )),
            "{round}"
        );
        assert!(!socket.was_reached(), "{round}: the socket was reached");
        drop(socket);
    }
    assert_still_works(&tb).await;
}
