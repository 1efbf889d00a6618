//! The real MCP servers the fake Tool Gate forwards to: `@modelcontextprotocol/server-everything`
//! (npm) over stdio, and `mcp_server.py` (the official Python SDK, `mcp` on PyPI) over streamable
//! HTTP. `tests/mcp/install` puts both in [`install_dir`]; `.ci/run` runs it.
//!
//! Nothing here passes without them: a missing install fails the test with the command that
//! installs it.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncBufReadExt;
use tokio::sync::watch;

use crate::fake_toolgate::ServerSpec;

/// Where `tests/mcp/install` put the servers: `PODHOST_TEST_MCP_DIR`, else
/// `<target>/tmp/mcp-servers`.
pub fn install_dir() -> PathBuf {
    match std::env::var_os("PODHOST_TEST_MCP_DIR") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_TARGET_TMPDIR")).join("mcp-servers"),
    }
}

fn required(path: PathBuf) -> PathBuf {
    assert!(
        path.exists(),
        "{} is missing: the MCP test servers are not installed. Run `tests/mcp/install` (it \
         needs node with npm and python3 with venv; .ci/run runs it).",
        path.display()
    );
    path
}

/// server-everything's entry point.
pub fn everything_js() -> PathBuf {
    required(
        install_dir().join("node_modules/@modelcontextprotocol/server-everything/dist/index.js"),
    )
}

/// The venv's python, which has `mcp`.
pub fn python() -> PathBuf {
    required(install_dir().join("venv/bin/python"))
}

/// server-everything over stdio, as the gate would start it: a clean environment (its
/// `get-env` tool echoes every variable) holding only `PATH` and the server's credential.
pub fn everything(credential: &str) -> ServerSpec {
    ServerSpec::Stdio {
        program: PathBuf::from("node"),
        args: vec![everything_js().display().to_string(), "stdio".to_owned()],
        env: vec![
            (
                "PATH".to_owned(),
                std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".to_owned()),
            ),
            ("EVERYTHING_API_KEY".to_owned(), credential.to_owned()),
        ],
    }
}

/// `mcp_server.py` on streamable HTTP, on a port it picked; killed when dropped.
pub struct PyServer {
    pub url: String,
    child: tokio::process::Child,
    stderr: Arc<Mutex<Vec<String>>>,
    changed: watch::Sender<usize>,
}

impl PyServer {
    pub async fn start() -> PyServer {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/mcp_server.py");
        let mut child = tokio::process::Command::new(python())
            .arg(&script)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let changed = watch::Sender::new(0);
        let err = child.stderr.take().unwrap();
        let (lines, tx) = (stderr.clone(), changed.clone());
        tokio::spawn(async move {
            let mut r = tokio::io::BufReader::new(err).lines();
            while let Ok(Some(line)) = r.next_line().await {
                let n = {
                    let mut l = lines.lock().unwrap();
                    l.push(line);
                    l.len()
                };
                tx.send_replace(n);
            }
        });
        let out = child.stdout.take().unwrap();
        let mut r = tokio::io::BufReader::new(out).lines();
        let first = tokio::time::timeout(Duration::from_secs(60), r.next_line())
            .await
            .expect("the Python MCP server did not start within 60 s")
            .unwrap()
            .unwrap_or_default();
        let url = first
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("the Python MCP server said {first:?}"))
            .to_owned();
        PyServer {
            url,
            child,
            stderr,
            changed,
        }
    }

    pub fn spec(&self) -> ServerSpec {
        ServerSpec::Http {
            url: self.url.clone(),
        }
    }

    pub fn stderr(&self) -> Vec<String> {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits for a line of its stderr that contains `needle`.
    pub async fn wait_stderr(&self, needle: &str) -> String {
        let mut rx = self.changed.subscribe();
        let found = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                if let Some(l) = self.stderr().into_iter().find(|l| l.contains(needle)) {
                    return l;
                }
                rx.changed().await.unwrap();
            }
        })
        .await;
        found.unwrap_or_else(|_| {
            panic!(
                "the Python MCP server never said {needle:?}; it said:\n{}",
                self.stderr().join("\n")
            )
        })
    }

    pub fn kill(&mut self) {
        let _ = self.child.start_kill();
    }
}
