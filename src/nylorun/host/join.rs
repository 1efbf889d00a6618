//! Joining core and staying joined (v5 §9, v2 notes §6.3).
//!
//! Owns: `POST …/host/join` and `POST …/host/renew`, the volume id file, the held host token,
//! and what a join answer feeds the command environment: the egress token (shared with every
//! command through [`Egress`]) and the CA bundle.
//!
//! Invariants:
//! * The join token is read afresh from its file at every join, so a reset's new token is
//!   picked up by the next attempt; it never appears in a log line or an error.
//! * `<harness root>/volume-id` is created once (mode 0600) and never rewritten.
//! * Join and renew never overlap: one operation at a time, under one async lock.
//! * Retries never end on their own: a refused join (401) is retried slowly
//!   (`join_retry`), anything else with jittered exponential backoff, until joined or shut down.
//!
//! Non-goals: the WebSocket (`channel`), running the join's setup (`setup`).

use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use reqwest::{StatusCode, Url};
use tokio_util::sync::CancellationToken;

use crate::exec::egress;
use crate::exec::env::Egress;
use crate::floor::backoff::{Backoff, sleep_or_cancel};
use crate::floor::secret::Secret;
use crate::floor::text::error_chain;
use crate::nylorun::link::protocol::{
    HostErrorBody, HostJoinAnswer, HostJoinRequest, HostToken, JOIN_PATH, RENEW_PATH, Setup,
};

/// The volume id file under the harness root.
pub const VOLUME_ID_FILE: &str = "volume-id";
/// The largest join or renew answer read (it may carry the setup's input files).
const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;
/// Each join or renew request must finish within this (the reference: 15 s).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// Why a join or renew did not give a host token.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error("core refused the {op} of sandbox {sandbox} (HTTP 401): {message}")]
    Refused {
        op: &'static str,
        sandbox: String,
        message: String,
    },
    #[error("core found the {op} request of sandbox {sandbox} malformed (HTTP 400): {message}")]
    Invalid {
        op: &'static str,
        sandbox: String,
        message: String,
    },
    #[error("core could not {op} sandbox {sandbox} now (HTTP {status}): {message}")]
    Unavailable {
        op: &'static str,
        sandbox: String,
        status: u16,
        message: String,
    },
    #[error("could not reach core to {op} sandbox {sandbox}: {message}")]
    Transport {
        op: &'static str,
        sandbox: String,
        message: String,
    },
    #[error("core's {op} answer for sandbox {sandbox} is malformed: {message}")]
    BadAnswer {
        op: &'static str,
        sandbox: String,
        message: String,
    },
    #[error("could not read the join token from {path} (NYLORUN_SANDBOX_JOIN_FILE): {message}")]
    JoinFile { path: PathBuf, message: String },
}

impl JoinError {
    /// A refusal of the credential or body (400/401): renewing will not help, joining may.
    pub fn is_refusal(&self) -> bool {
        matches!(self, JoinError::Refused { .. } | JoinError::Invalid { .. })
    }
}

/// Why podhost's own state under the harness root cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("could not use the harness root {path}: {source}")]
    Root {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("could not read or create {path}: {source}")]
    VolumeId {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "{path} holds {content:?}, which is not a volume id (1 to 64 letters, digits or '-'); it is never rewritten, so fix or remove it"
    )]
    BadVolumeId { path: PathBuf, content: String },
}

fn is_volume_id(s: &str) -> bool {
    (1..=64).contains(&s.len()) && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
}

/// The volume's id: read from `<root>/volume-id`, or created there once (a UUID, mode 0600).
pub fn volume_id(root: &Path) -> Result<String, StateError> {
    std::fs::create_dir_all(root).map_err(|source| StateError::Root {
        path: root.to_path_buf(),
        source,
    })?;
    let path = root.join(VOLUME_ID_FILE);
    let verr = |source| StateError::VolumeId {
        path: path.clone(),
        source,
    };
    match std::fs::read_to_string(&path) {
        Ok(s) => {
            let id = s.trim();
            if is_volume_id(id) {
                Ok(id.to_owned())
            } else {
                Err(StateError::BadVolumeId {
                    path: path.clone(),
                    content: id.chars().take(80).collect(),
                })
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let id = uuid::Uuid::new_v4().to_string();
            // create_new: two starts racing both keep the first id.
            let created = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path);
            match created {
                Ok(mut f) => {
                    f.write_all(format!("{id}\n").as_bytes()).map_err(verr)?;
                    f.sync_all().map_err(verr)?;
                    Ok(id)
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => volume_id(root),
                Err(e) => Err(verr(e)),
            }
        }
        Err(e) => Err(verr(e)),
    }
}

/// The join and renew calls.
#[derive(Clone, Debug)]
pub struct HostClient {
    http: reqwest::Client,
    join_url: Url,
    renew_url: Url,
    sandbox_id: String,
    pod_uid: String,
    join_file: PathBuf,
    volume_id: Option<String>,
}

impl HostClient {
    pub fn new(
        base: &Url,
        sandbox_id: &str,
        pod_uid: &str,
        join_file: &Path,
        volume_id: Option<String>,
        tls: &Arc<rustls::ClientConfig>,
    ) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(rustls::ClientConfig::clone(tls))
            .timeout(REQUEST_TIMEOUT)
            // Core is reached directly: a proxy in podhost's own environment is not for it.
            .no_proxy()
            .build()?;
        let mut join_url = base.clone();
        join_url.set_path(JOIN_PATH);
        let mut renew_url = base.clone();
        renew_url.set_path(RENEW_PATH);
        Ok(HostClient {
            http,
            join_url,
            renew_url,
            sandbox_id: sandbox_id.to_owned(),
            pod_uid: pod_uid.to_owned(),
            join_file: join_file.to_path_buf(),
            volume_id,
        })
    }

    pub fn sandbox_id(&self) -> &str {
        &self.sandbox_id
    }

    fn read_join_token(&self) -> Result<Secret, JoinError> {
        let jerr = |message: String| JoinError::JoinFile {
            path: self.join_file.clone(),
            message,
        };
        let text = std::fs::read_to_string(&self.join_file).map_err(|e| jerr(e.to_string()))?;
        let token = text.trim();
        if token.is_empty() {
            return Err(jerr("the file is empty".to_owned()));
        }
        Ok(Secret::new(token))
    }

    /// `POST …/host/join` with a freshly read join token.
    pub async fn join(&self) -> Result<HostJoinAnswer, JoinError> {
        let body = HostJoinRequest {
            sandbox_id: self.sandbox_id.clone(),
            pod_uid: self.pod_uid.clone(),
            join_token: self.read_join_token()?,
            volume_id: self.volume_id.clone(),
        };
        let request = self.http.post(self.join_url.clone()).json(&body);
        self.send("join", request).await
    }

    /// `POST …/host/renew` with the host token as bearer.
    pub async fn renew(&self, token: &HostToken) -> Result<HostJoinAnswer, JoinError> {
        let request = self
            .http
            .post(self.renew_url.clone())
            .header("Authorization", format!("Bearer {}", token.expose()));
        self.send("renew", request).await
    }

    async fn send(
        &self,
        op: &'static str,
        request: reqwest::RequestBuilder,
    ) -> Result<HostJoinAnswer, JoinError> {
        let sandbox = self.sandbox_id.clone();
        // reqwest's own errors may quote the URL, never a header or body: safe to show.
        let mut resp = request.send().await.map_err(|e| JoinError::Transport {
            op,
            sandbox: sandbox.clone(),
            message: error_chain(&e),
        })?;
        let status = resp.status();
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| JoinError::Transport {
            op,
            sandbox: sandbox.clone(),
            message: error_chain(&e),
        })? {
            if body.len() + chunk.len() > MAX_ANSWER_BYTES {
                return Err(JoinError::BadAnswer {
                    op,
                    sandbox,
                    message: format!("the answer is larger than {MAX_ANSWER_BYTES} bytes"),
                });
            }
            body.extend_from_slice(&chunk);
        }
        let message = || {
            serde_json::from_slice::<HostErrorBody>(&body)
                .map(|b| format!("{}: {}", b.error.code, b.error.message))
                .unwrap_or_else(|_| String::from_utf8_lossy(&body).chars().take(200).collect())
        };
        match status {
            StatusCode::OK => serde_json::from_slice(&body).map_err(|e| JoinError::BadAnswer {
                op,
                sandbox,
                message: e.to_string(),
            }),
            StatusCode::UNAUTHORIZED => Err(JoinError::Refused {
                op,
                sandbox,
                message: message(),
            }),
            StatusCode::BAD_REQUEST => Err(JoinError::Invalid {
                op,
                sandbox,
                message: message(),
            }),
            s => Err(JoinError::Unavailable {
                op,
                sandbox,
                status: s.as_u16(),
                message: message(),
            }),
        }
    }
}

/// What the pod learned from its first join.
#[derive(Clone, Debug, Default)]
pub struct FirstJoin {
    pub setup: Option<Setup>,
    pub seeded: Option<bool>,
}

#[derive(Clone)]
struct Held {
    token: HostToken,
    epoch: i64,
}

/// Holds the host token and keeps it fresh; applies each answer to the command environment.
pub struct HostKeeper {
    client: HostClient,
    egress: Egress,
    harness_root: PathBuf,
    system_roots: PathBuf,
    backoff_base: Duration,
    backoff_cap: Duration,
    join_retry: Duration,
    op: tokio::sync::Mutex<()>,
    held: Mutex<Option<Held>>,
    first: Mutex<Option<FirstJoin>>,
}

impl HostKeeper {
    pub fn new(
        client: HostClient,
        egress: Egress,
        harness_root: &Path,
        backoff: (Duration, Duration),
        join_retry: Duration,
    ) -> Self {
        HostKeeper {
            client,
            egress,
            harness_root: harness_root.to_path_buf(),
            system_roots: PathBuf::from(egress::SYSTEM_ROOTS),
            backoff_base: backoff.0,
            backoff_cap: backoff.1,
            join_retry,
            op: tokio::sync::Mutex::new(()),
            held: Mutex::new(None),
            first: Mutex::new(None),
        }
    }

    /// Forgets the host token (core refused it at the upgrade): the next [`Self::ensure`] joins.
    pub fn forget(&self) {
        *self.held.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// The setup facts of the first join, once.
    pub fn take_first_join(&self) -> Option<FirstJoin> {
        self.first
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// Renews the held token (or joins when there is none or renewal is refused), retrying until
    /// it has a token. `None` when `cancel` fired first.
    pub async fn ensure(&self, cancel: &CancellationToken) -> Option<HostToken> {
        let _op = tokio::select! {
            g = self.op.lock() => g,
            _ = cancel.cancelled() => return None,
        };
        let mut backoff = Backoff::new(self.backoff_base, self.backoff_cap);
        let sandbox = self.client.sandbox_id().to_owned();
        loop {
            if cancel.is_cancelled() {
                return None;
            }
            let result = tokio::select! {
                r = self.renew_or_join() => r,
                _ = cancel.cancelled() => return None,
            };
            let delay = match result {
                Ok(token) => return Some(token),
                Err(
                    e @ (JoinError::Refused { op: "join", .. }
                    | JoinError::Invalid { op: "join", .. }),
                ) => {
                    tracing::error!(
                        sandbox = %sandbox,
                        error = %e,
                        retry_in = ?self.join_retry,
                        "the join was refused; retrying slowly (a reset writes a new join token, read at the next attempt)"
                    );
                    self.join_retry
                }
                Err(e @ JoinError::JoinFile { .. }) => {
                    tracing::error!(sandbox = %sandbox, error = %e, retry_in = ?self.join_retry, "cannot join yet");
                    self.join_retry
                }
                Err(e) => {
                    let d = backoff.next_delay();
                    tracing::warn!(sandbox = %sandbox, error = %e, retry_in = ?d, "join or renew failed; retrying");
                    d
                }
            };
            if !sleep_or_cancel(delay, cancel).await {
                return None;
            }
        }
    }

    async fn renew_or_join(&self) -> Result<HostToken, JoinError> {
        let held = self
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(held) = held {
            match self.client.renew(&held.token).await {
                Ok(answer) => {
                    tracing::debug!(epoch = answer.epoch, "host token renewed");
                    return self.apply(answer, false).await;
                }
                Err(e) if e.is_refusal() => {
                    tracing::warn!(error = %e, epoch = held.epoch, "the renewal was refused; joining again");
                    self.forget();
                }
                Err(e) => return Err(e),
            }
        }
        let answer = self.client.join().await?;
        tracing::info!(
            sandbox = %answer.sandbox_id,
            epoch = answer.epoch,
            expires_at = %answer.expires_at,
            "joined core"
        );
        self.apply(answer, true).await
    }

    /// Takes an answer: holds its host token, hands the egress token and CA to commands.
    async fn apply(&self, answer: HostJoinAnswer, joined: bool) -> Result<HostToken, JoinError> {
        self.egress
            .set_token(Some(answer.egress_token.expose().to_owned()));
        if !answer.ca_certificate.trim().is_empty() {
            let root = self.harness_root.clone();
            let roots = self.system_roots.clone();
            let ca = answer.ca_certificate.clone();
            let written =
                tokio::task::spawn_blocking(move || egress::write_bundle(&root, Some(&roots), &ca))
                    .await;
            match written {
                Ok(Ok((path, changed))) => {
                    if changed {
                        tracing::info!(path = %path.display(), "wrote the egress CA bundle");
                    }
                    self.egress.set_ca_bundle(Some(path));
                }
                Ok(Err(e)) => tracing::error!(error = %e, "could not write the egress CA bundle"),
                Err(e) => tracing::error!(error = %e, "the CA bundle writer failed"),
            }
        }
        if joined {
            let mut first = self.first.lock().unwrap_or_else(PoisonError::into_inner);
            if first.is_none() {
                *first = Some(FirstJoin {
                    setup: answer.setup.clone(),
                    seeded: answer.seeded,
                });
            }
        }
        let token = answer.host_token.clone();
        *self.held.lock().unwrap_or_else(PoisonError::into_inner) = Some(Held {
            token: token.clone(),
            epoch: answer.epoch,
        });
        Ok(token)
    }

    /// Renews every `interval` until `cancel`; a refused renewal joins again.
    pub async fn renew_loop(&self, interval: Duration, cancel: CancellationToken) {
        loop {
            if !sleep_or_cancel(interval, &cancel).await {
                return;
            }
            if self.ensure(&cancel).await.is_none() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn volume_id_is_created_once_with_mode_0600() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("harness");
        let id = volume_id(&root).unwrap();
        assert!(uuid::Uuid::parse_str(&id).is_ok(), "{id}");
        let path = root.join(VOLUME_ID_FILE);
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(volume_id(&root).unwrap(), id);
        std::fs::write(&path, "not/an id\n").unwrap();
        let e = volume_id(&root).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{} holds \"not/an id\", which is not a volume id (1 to 64 letters, digits or '-'); it is never rewritten, so fix or remove it",
                path.display()
            )
        );
    }

    #[test]
    fn backoff_doubles_within_jitter_and_caps() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(1000));
        let want = [100u64, 200, 400, 800, 1000, 1000];
        for w in want {
            let d = b.next_delay().as_millis() as u64;
            assert!((w / 2..=w).contains(&d), "{d} not in {}..={w}", w / 2);
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }
}
