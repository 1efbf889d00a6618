//! A throwaway PostgreSQL cluster for tests: Debian's `postgresql` binaries, `initdb` into a
//! temporary directory, a server on a free loopback port with its socket in that directory, one
//! database per test.
//!
//! One cluster serves a whole test process (started on first use, about a second). A watchdog
//! process stops it and removes its directory once the test process is gone, however it ended
//! (a static is never dropped, and a killed process runs no destructor); a cluster whose
//! watchdog died too is stopped by the next run.
//!
//! PostgreSQL refuses to run as root: when the tests run as root (CI), `initdb`, the server and
//! the watchdog run as `nobody` (std's `CommandExt::uid/gid`, which also drops supplementary
//! groups), in a directory chowned to it.
//!
//! A test of TLS starts a cluster of its own ([`TestPg::start_tls`]) that takes TLS connections
//! only: its certificate and key are the test's (the key 0600 and the server's, as PostgreSQL
//! requires), `pg_hba.conf` lets the role `app` in with a SCRAM password over TLS (`hostssl`)
//! and rejects every plain TCP connection (`hostnossl … reject`), so a connection that
//! succeeds is proven to use TLS. The superuser comes in over the Unix socket only.
//!
//! Without the binaries the tests that need PostgreSQL say so and skip — except under CI
//! (`CI` set), where they fail: `.ci/run` installs `postgresql`.
#![allow(dead_code)]

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// `nobody:nogroup`.
const NOBODY: (u32, u32) = (65534, 65534);
const PREFIX: &str = "podhost-pg-";

/// Where Debian's postgresql-15 puts the server binaries; `PODHOST_PG_BINDIR` overrides.
fn bindir() -> PathBuf {
    std::env::var_os("PODHOST_PG_BINDIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/lib/postgresql/15/bin"))
}

/// A throwaway cluster.
#[derive(Debug)]
pub struct TestPg {
    dir: PathBuf,
    pub port: u16,
    run_as: Option<(u32, u32)>,
    /// Whether it takes TLS connections only, from the role `app`.
    tls: bool,
}

/// The password of the role `app` of a TLS cluster.
pub const APP_PASSWORD: &str = "pg-app-pass-5e1d9c";

static SHARED: OnceLock<Option<TestPg>> = OnceLock::new();
static DATABASES: AtomicUsize = AtomicUsize::new(0);

/// Whether PostgreSQL is installed; under CI it must be.
pub fn installed() -> bool {
    if bindir().join("initdb").exists() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "PostgreSQL is not installed ({} has no initdb): .ci/run installs the postgresql \
         package",
        bindir().display()
    );
    false
}

/// Says that a test skips its PostgreSQL part.
pub fn say_skipped() {
    eprintln!(
        "PostgreSQL is not installed ({}): skipping this test's PostgreSQL part",
        bindir().display()
    );
}

impl TestPg {
    /// The cluster of this test process, started on first use; `None` (after saying so) when
    /// PostgreSQL is not installed and this is not CI.
    pub fn shared() -> Option<&'static TestPg> {
        let pg = SHARED.get_or_init(|| installed().then(|| TestPg::start(None)));
        if pg.is_none() {
            say_skipped();
        }
        pg.as_ref()
    }

    /// A cluster of its own that takes TLS connections only, with the server certificate
    /// `cert_pem` and its key `key_pem`; `None` (after saying so) when PostgreSQL is not
    /// installed and this is not CI.
    pub fn start_tls(cert_pem: &str, key_pem: &str) -> Option<TestPg> {
        if !installed() {
            say_skipped();
            return None;
        }
        Some(TestPg::start(Some((cert_pem, key_pem))))
    }

    fn start(tls: Option<(&str, &str)>) -> TestPg {
        stop_leftovers();
        let dir = tempfile::Builder::new()
            .prefix(PREFIX)
            .tempdir()
            .expect("tempdir")
            .keep();
        let run_as = nix::unistd::geteuid().is_root().then_some(NOBODY);
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).expect("chown");
        }
        std::fs::write(dir.join("owner.pid"), std::process::id().to_string()).expect("pid");
        let mut pg = TestPg {
            dir,
            port: 0,
            run_as,
            tls: tls.is_some(),
        };
        let out = pg
            .cmd("initdb")
            .arg("-D")
            .arg(pg.data())
            .args(["-U", "podhost", "--auth=trust", "--no-sync", "-E", "UTF8"])
            .args(["--locale=C.UTF-8"])
            .output()
            .expect("initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        pg.watchdog();
        let options = tls
            .map(|(cert, key)| pg.set_up_tls(cert, key))
            .unwrap_or_default();
        // A free port: bind 0, read it, release it. Another process may take it first; then
        // the server does not start and another port is tried.
        for _ in 0..5 {
            pg.port = free_port();
            let ok = pg
                .cmd("pg_ctl")
                .arg("-D")
                .arg(pg.data())
                .arg("-l")
                .arg(pg.dir.join("log"))
                .args(["-w", "-t", "60", "-o"])
                .arg(format!(
                    "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off \
                     -c synchronous_commit=off -c full_page_writes=off -c max_connections=300\
                     {options}",
                    pg.port,
                    pg.dir.display()
                ))
                .arg("start")
                .stdout(Stdio::null())
                .status()
                .expect("pg_ctl")
                .success();
            if ok {
                eprintln!("throwaway PostgreSQL on 127.0.0.1:{}", pg.port);
                if pg.tls {
                    pg.admin(format!("CREATE ROLE app LOGIN PASSWORD '{APP_PASSWORD}'"));
                }
                return pg;
            }
        }
        panic!(
            "PostgreSQL did not start: {}",
            std::fs::read_to_string(pg.dir.join("log")).unwrap_or_default()
        );
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// Writes the certificate and key (0600, the server's) and a `pg_hba.conf` for TLS only;
    /// answers the server's options that turn TLS on.
    fn set_up_tls(&self, cert: &str, key: &str) -> String {
        let write = |name: &str, text: &str| {
            let path = self.dir.join(name);
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .and_then(|mut f| f.write_all(text.as_bytes()))
                .expect("write a TLS file of the cluster");
            if let Some((uid, gid)) = self.run_as {
                std::os::unix::fs::chown(&path, Some(uid), Some(gid)).expect("chown");
            }
            path
        };
        let cert = write("server.crt", cert);
        let key = write("server.key", key);
        // initdb made the file, the server's and 0600: rewriting it keeps both.
        std::fs::write(
            self.data().join("pg_hba.conf"),
            "# TYPE    DATABASE USER    ADDRESS       METHOD\n\
             local     all      podhost                trust\n\
             hostssl   all      app     127.0.0.1/32  scram-sha-256\n\
             hostnossl all      all     0.0.0.0/0     reject\n\
             hostnossl all      all     ::/0          reject\n",
        )
        .expect("write pg_hba.conf");
        format!(
            " -c ssl=on -c ssl_cert_file={} -c ssl_key_file={}",
            cert.display(),
            key.display()
        )
    }

    fn cmd(&self, prog: &str) -> Command {
        let mut c = Command::new(bindir().join(prog));
        c.env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("LC_ALL", "C.UTF-8");
        if let Some((uid, gid)) = self.run_as {
            c.uid(uid).gid(gid);
        }
        c
    }

    /// Stops the server and removes the directory once this process is gone.
    fn watchdog(&self) {
        let script = format!(
            "while [ -d /proc/{pid} ]; do sleep 1; done; \
             {pg_ctl} -D {data} -m immediate -w stop >/dev/null 2>&1; rm -rf {dir}",
            pid = std::process::id(),
            pg_ctl = bindir().join("pg_ctl").display(),
            data = self.data().display(),
            dir = self.dir.display(),
        );
        let mut c = Command::new("/bin/sh");
        c.args(["-c", &script])
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some((uid, gid)) = self.run_as {
            c.uid(uid).gid(gid);
        }
        // It outlives this process by design; should it end first, a thread reaps it.
        let mut watchdog = c.spawn().expect("start the PostgreSQL watchdog");
        std::thread::spawn(move || watchdog.wait());
    }

    /// The URL of database `db` over TCP: as the superuser, or on a TLS cluster as `app` with
    /// its password (no `sslmode`: the test says which).
    pub fn url(&self, db: &str) -> String {
        if self.tls {
            format!("postgres://app:{APP_PASSWORD}@127.0.0.1:{}/{db}", self.port)
        } else {
            format!("postgres://podhost@127.0.0.1:{}/{db}", self.port)
        }
    }

    /// The connection string of database `db` as the superuser, over the Unix socket.
    pub fn admin_url(&self, db: &str) -> String {
        format!(
            "host={} port={} user=podhost dbname={db}",
            self.dir.display(),
            self.port
        )
    }

    /// A new, empty database (a copy of template1, on a TLS cluster `app`'s); answers its URL.
    pub fn fresh_db(&self) -> String {
        let name = format!(
            "t{}_{}",
            std::process::id(),
            DATABASES.fetch_add(1, Ordering::SeqCst)
        );
        let owner = if self.tls { " OWNER app" } else { "" };
        self.admin(format!("CREATE DATABASE {name}{owner}"));
        self.url(&name)
    }

    /// Runs `sql` as the superuser, over the Unix socket.
    fn admin(&self, sql: String) {
        let admin = self.admin_url("postgres");
        // On its own thread and runtime: callers may be sync, or inside a runtime.
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let (client, conn) = tokio_postgres::connect(&admin, tokio_postgres::NoTls)
                    .await
                    .expect("connect to the throwaway PostgreSQL");
                let driver = tokio::spawn(conn);
                client.batch_execute(&sql).await.expect(&sql);
                drop(client);
                let _ = driver.await;
            });
        })
        .join()
        .expect("run SQL as the superuser");
    }

    /// Runs `sql` on database `url` (as the cluster's superuser).
    pub async fn execute(url: &str, sql: &str) {
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        let driver = tokio::spawn(conn);
        client.batch_execute(sql).await.expect("execute");
        drop(client);
        let _ = driver.await;
    }
}

impl TestPg {
    /// Every row of the store's tables in database `url`, as text (to look for what must
    /// never be stored).
    pub async fn dump(url: &str) -> String {
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        let driver = tokio::spawn(conn);
        let mut out = String::new();
        for table in ["invocations", "messages", "session_uids"] {
            let sql = format!("SELECT t::text FROM {table} t");
            for row in client.query(&sql, &[]).await.expect("dump") {
                out.push_str(row.get::<_, &str>(0));
                out.push('\n');
            }
        }
        drop(client);
        let _ = driver.await;
        out
    }
}

/// Stops the clusters of earlier test processes whose watchdog died with them.
fn stop_leftovers() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let dir = e.path();
        let is_ours = dir
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(PREFIX));
        let Some(pid) = is_ours
            .then(|| std::fs::read_to_string(dir.join("owner.pid")).ok())
            .flatten()
        else {
            continue;
        };
        if Path::new(&format!("/proc/{}", pid.trim())).exists() {
            continue;
        }
        let mut c = Command::new(bindir().join("pg_ctl"));
        c.arg("-D")
            .arg(dir.join("data"))
            .args(["-m", "immediate", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if nix::unistd::geteuid().is_root() {
            c.uid(NOBODY.0).gid(NOBODY.1);
        }
        let _ = c.status();
        let _ = std::fs::remove_dir_all(&dir);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}
