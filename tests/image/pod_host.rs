//! A pod host started from the image the way a pod starts it: the image's own entrypoint with
//! the pod environment of spec v5 §9 and the join token mounted like a Secret.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use crate::fixture::{Container, Image};
use crate::podman::free_port;

/// Where the pod mounts the join token (a Secret) in these tests.
pub const JOIN_FILE: &str = "/run/secrets/nylorun/join-token";
/// The join token these tests mount.
pub const JOIN_TOKEN: &str = "join-token-1";
/// The pod host's shutdown deadline in these tests: everything ends within it after SIGTERM.
pub const SHUTDOWN_DEADLINE_MS: &str = "3000";

/// A pod host running in a container of the image, and what it was started with.
pub struct PodHost {
    pub container: Container,
    /// The loopback health port (the container shares the host's network).
    pub health_port: u16,
    /// Holds the join token file mounted into the container.
    _dir: tempfile::TempDir,
}

impl PodHost {
    /// Starts the image's entrypoint (`podhost pod`) with the pod environment pointing at
    /// `harness_url` and the join token mounted read-only like a Secret. The gates point at a
    /// port nothing listens on: no turn runs.
    pub async fn start(image: &'static Image, harness_url: &str) -> PodHost {
        Self::start_with(image, harness_url, "http://127.0.0.1:9", &[]).await
    }

    /// Like [`start`](Self::start), with the gates at `gates_url` (so turns reach a fake Model
    /// Gate) and `extra` variables added to, or replacing, the pod environment.
    pub async fn start_with(
        image: &'static Image,
        harness_url: &str,
        gates_url: &str,
        extra: &[(&str, &str)],
    ) -> PodHost {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("join-token");
        std::fs::write(&token, format!("{JOIN_TOKEN}\n")).unwrap();
        // A Secret's files are 0644 by default; uid 1000 must be able to read it.
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
        let health_port = free_port();
        let mut flags = vec![format!("--volume={}:{JOIN_FILE}:ro", token.display())];
        let health_port = health_port.to_string();
        let mut env = vec![
            ("NYLORUN_SANDBOX_ID", "sbx_test"),
            ("NYLORUN_POD_UID", "pod-uid-1"),
            ("NYLORUN_SANDBOX_JOIN_FILE", JOIN_FILE),
            ("NYLORUN_HARNESS_URL", harness_url),
            ("NYLORUN_GATES_URL", gates_url),
            ("NYLORUN_HARNESS_HEALTH_PORT", &health_port),
            ("PODHOST_POD_BACKOFF_BASE_MS", "50"),
            ("PODHOST_POD_BACKOFF_CAP_MS", "300"),
            ("PODHOST_POD_JOIN_RETRY_MS", "300"),
            ("PODHOST_POD_SHUTDOWN_DEADLINE_MS", SHUTDOWN_DEADLINE_MS),
        ];
        for (name, value) in extra {
            env.retain(|(n, _)| n != name);
            env.push((name, value));
        }
        for (name, value) in env {
            flags.push(format!("--env={name}={value}"));
        }
        let container = image.start(&flags, &[]).await;
        // Signals and the health listener are set up before this line: from here on a SIGTERM
        // is podhost's shutdown, not the default action.
        container
            .wait_log("podhost pod starting", Duration::from_secs(30))
            .await;
        PodHost {
            container,
            health_port: health_port.parse().unwrap(),
            _dir: dir,
        }
    }

    /// Runs `podhost tool bash` in the pod's running container (`podman exec`: uid 1000, in
    /// /workspace) and returns the tool's outcome.
    pub async fn bash(&self, command: &str) -> serde_json::Value {
        let input = serde_json::json!({ "command": command }).to_string();
        let out = self
            .container
            .exec(&["podhost", "tool", "bash", "--input", &input])
            .await;
        assert!(
            out.status.success(),
            "podhost tool bash failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }
}
