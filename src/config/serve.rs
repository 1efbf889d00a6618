//! `podhost serve`'s flags, into a [`ServeConfig`].

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::exec::ExecArgs;
use super::origins::Origins;
use super::pod::{SettingsError, is_listen_address};
use super::tls::TlsArgs;
use crate::byoh::ServeConfig;
use crate::floor::secret::Secret;

/// `podhost serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The address to listen on. Without a credential only a loopback address is allowed.
    #[arg(long, env = "PODHOST_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// The data directory: one workspace per session, and the SQLite store unless --store names
    /// PostgreSQL. Replicas sharing a PostgreSQL store mount the same directory.
    #[arg(long, env = "PODHOST_DATA", default_value = "./podhost-data")]
    pub data: PathBuf,
    /// The session store: a PostgreSQL URL (postgres://user:password@host:5432/db) for several
    /// replicas; unset, SQLite in the data directory (one replica).
    #[arg(long, env = "PODHOST_STORE", hide_env_values = true)]
    pub store: Option<Secret>,
    /// With a PostgreSQL store: seconds a replica's claim on a running turn holds unless renewed
    /// (it renews every third of it); a replica that stops is noticed this long after, and its
    /// turns are taken over.
    #[arg(long, env = "PODHOST_LEASE_SECS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(2..=20))]
    pub lease_secs: u64,
    /// The credential callers send as `Authorization: Bearer …` (prefer the environment or a
    /// file: a flag shows in the process list).
    #[arg(long, env = "PODHOST_TOKEN", hide_env_values = true)]
    pub token: Option<Secret>,
    /// A file holding the credential (surrounding whitespace ignored).
    #[arg(long, env = "PODHOST_TOKEN_FILE", conflicts_with = "token")]
    pub token_file: Option<PathBuf>,
    /// Most turns running at once; past it, submit answers 409 and the caller retries.
    #[arg(long, env = "PODHOST_MAX_RUNNING", default_value_t = 32,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_running: u32,
    /// Seconds a finished session (and its workspace) is kept.
    #[arg(long, env = "PODHOST_RETENTION_SECS", default_value_t = 86_400)]
    pub retention_secs: u64,
    /// Seconds a turn interrupted by a restart waits for a retried submit to bring a fresh key
    /// before it is reported failed.
    #[arg(long, env = "PODHOST_ORPHAN_GRACE_SECS", default_value_t = 30)]
    pub orphan_grace_secs: u64,
    /// Model calls one submission may make before its turn is stopped as failed.
    #[arg(long, env = "PODHOST_MAX_STEPS", default_value_t = 500,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_steps: u32,
    /// Attempts per model call (429, 5xx and transport errors are retried with backoff).
    #[arg(long, env = "PODHOST_MODEL_ATTEMPTS", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(1..=20))]
    pub model_attempts: u32,
    /// Start even though the data directory holds session workspaces while its database is
    /// missing or empty (every earlier invocation is then unknown: 404).
    #[arg(long, env = "PODHOST_START_AFRESH")]
    pub start_afresh: bool,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub exec: ExecArgs,
    /// Which settings were given as flags (filled in by `Cli::parse_args`).
    #[arg(skip)]
    pub origins: Origins,
}

impl ServeArgs {
    /// The plain configuration, or every problem found, each naming its flag or variable; pure
    /// (the token file is read when serving starts).
    pub fn config(&self) -> Result<ServeConfig, SettingsError> {
        let mut problems = Vec::new();
        let listen = self.origins.name("PODHOST_LISTEN");
        if !is_listen_address(&self.listen) {
            problems.push(format!(
                "{listen}: {:?} is not host:port (such as 127.0.0.1:8080 or [::]:8080)",
                self.listen
            ));
        }
        if self
            .token
            .as_ref()
            .is_some_and(|t| t.expose().trim().is_empty())
        {
            problems.push(format!(
                "{}: the credential is empty",
                self.origins.name("PODHOST_TOKEN")
            ));
        }
        if !problems.is_empty() {
            return Err(SettingsError::new("serve", problems));
        }
        Ok(ServeConfig {
            listen_setting: listen,
            listen: self.listen.clone(),
            data: self.data.clone(),
            store: self.store.clone(),
            store_setting: self.origins.name("PODHOST_STORE"),
            lease: Duration::from_secs(self.lease_secs),
            token: self.token.clone(),
            token_file: self.token_file.clone(),
            max_running: self.max_running as usize,
            retention: Duration::from_secs(self.retention_secs),
            orphan_grace: Duration::from_secs(self.orphan_grace_secs),
            max_steps: self.max_steps,
            model_attempts: self.model_attempts,
            tls: self.tls.settings(&self.origins),
            start_afresh: self.start_afresh,
            exec: self.exec.settings(),
        })
    }
}
