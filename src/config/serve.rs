//! `podhost serve`'s flags, into a [`ServeConfig`].

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::exec::{ExecArgs, Sessions};
use super::http::HttpArgs;
use super::origins::Origins;
use super::pod::{SettingsError, is_listen_address};
use super::tls::TlsArgs;
use crate::agent::media::ModelFiles;
use crate::byoh::ServeConfig;
use crate::chat::session::ChatLimits;
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
    /// replicas; unset, SQLite in the data directory (one replica). A URL with a password is
    /// refused here (a command line is readable by every process): give it in PODHOST_STORE.
    #[arg(long, env = "PODHOST_STORE", hide_env_values = true)]
    pub store: Option<Secret>,
    /// With a PostgreSQL store: seconds a replica's claim on a running turn holds unless renewed
    /// (it renews every third of it); a replica that stops is noticed this long after, and its
    /// turns are taken over.
    #[arg(long, env = "PODHOST_LEASE_SECS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(2..=20))]
    pub lease_secs: u64,
    /// The credential callers send as `Authorization: Bearer …`, from the environment
    /// (PODHOST_TOKEN) or --token-file: on the command line, where every process can read it, it
    /// is refused.
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
    #[command(flatten)]
    pub http: HttpArgs,
    /// MiB a session's workspace and temporary directory may hold together: on a file system of
    /// their own where podhost can make one (a writer past it gets ENOSPC), else measured (past
    /// it, commands are stopped and writes refused until files are deleted); 0 for no quota.
    #[arg(long, env = "PODHOST_SESSION_DISK_MB", default_value_t = 10240)]
    pub session_disk_mb: u64,
    /// Hold each session's quota with a file system of its own (a loop-mounted image in the
    /// data directory, sized to the quota; podhost as root, with namespaces): on or off
    /// (measured).
    #[arg(long, env = "PODHOST_SESSION_DISK_FS", default_value = "on",
          value_parser = crate::config::exec::on_off, action = clap::ArgAction::Set)]
    pub session_disk_fs: bool,
    /// MiB the data directory must keep free; below it, new submissions are answered 503 (which
    /// Oumi retries); 0 for no floor.
    #[arg(long, env = "PODHOST_MIN_FREE_MB", default_value_t = 256)]
    pub min_free_mb: u64,
    /// A directory whose files every new session's workspace starts with: an overlay of it in
    /// the session's view where the kernel allows one, else copied in when the session's
    /// workspace is made (cloned per file where the data directory's file system can, btrfs or
    /// xfs); never changed by sessions. Outside the data directory.
    #[arg(long, env = "PODHOST_WORKSPACE_TEMPLATE")]
    pub workspace_template: Option<PathBuf>,
    /// How the template reaches a workspace, instead of what start-up finds: overlay, reflink
    /// or copy.
    #[arg(long, env = "PODHOST_WORKSPACE_TEMPLATE_LEVEL", hide = true,
          value_parser = ["overlay", "reflink", "copy"])]
    pub workspace_template_level: Option<String>,
    /// Start even though the data directory holds session workspaces while its database is
    /// missing or empty (every earlier invocation is then unknown: 404).
    #[arg(long, env = "PODHOST_START_AFRESH")]
    pub start_afresh: bool,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub model: ModelLimitsArgs,
    #[command(flatten)]
    pub exec: ExecArgs,
    /// Which settings were given as flags (filled in by `Cli::parse_args`).
    #[arg(skip)]
    pub origins: Origins,
}

/// The secrets given as flags: a command line is readable by every process on the machine
/// (`/proc/<pid>/cmdline`, `ps`), a session's commands included where no PID namespace hides
/// podhost. The credential, and a store URL that holds a password, must come from the
/// environment or a file.
pub(super) fn secrets_on_the_command_line(
    origins: &Origins,
    token: Option<&Secret>,
    store: Option<&Secret>,
) -> Vec<String> {
    let mut problems = Vec::new();
    let flag = |var: &str| {
        let name = origins.name(var);
        name.starts_with("--").then_some(name)
    };
    if let (Some(flag), Some(_)) = (flag("PODHOST_TOKEN"), token) {
        problems.push(format!(
            "{flag}: a credential on the command line is readable by every process on this \
             machine; give it in PODHOST_TOKEN or a file (--token-file)"
        ));
    }
    if let (Some(flag), Some(url)) = (flag("PODHOST_STORE"), store)
        && crate::byoh::store::holds_password(url.expose())
    {
        problems.push(format!(
            "{flag}: the URL holds a password, and a command line is readable by every process \
             on this machine; give the URL in PODHOST_STORE"
        ));
    }
    problems
}

/// What `podhost serve` and `podhost run` know of the model's limits.
#[derive(Debug, Args)]
#[command(next_help_heading = "Model")]
pub struct ModelLimitsArgs {
    /// The model's context window in tokens. Unset: 128000 (`run`: what the server's model
    /// listing says first, when it says; `serve` never asks it, the evaluator's key being for
    /// chat completions only); a call that overflows teaches the window the server names.
    #[arg(long, env = "PODHOST_CONTEXT_WINDOW",
          value_parser = clap::value_parser!(u64).range(1024..))]
    pub context_window: Option<u64>,
    /// Compact the history when the next prompt would pass this share of the context window
    /// less the answer's room (`max_tokens`): above 0, at most 1.
    #[arg(long, env = "PODHOST_COMPACT_AT", default_value_t = 0.8, value_parser = share)]
    pub compact_at: f64,
    /// The kinds of file the model reads besides text, comma-separated: image, pdf, office,
    /// audio, video (`text` alone: none). Unset: (`run` only) what the server's model listing
    /// says, else every file is sent and one the model refuses is replaced by a note.
    #[arg(long, env = "PODHOST_MODEL_INPUTS", value_delimiter = ',',
          value_parser = ["text", "image", "pdf", "office", "audio", "video"])]
    pub model_inputs: Option<Vec<String>>,
}

/// A share: a number above 0, at most 1.
fn share(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number"))?;
    if v > 0.0 && v <= 1.0 {
        Ok(v)
    } else {
        Err(format!("{v} is not above 0 and at most 1"))
    }
}

impl ModelLimitsArgs {
    /// The plain limits; pure.
    pub fn limits(&self) -> ChatLimits {
        ChatLimits {
            window: self.context_window,
            assumed: false,
            threshold: self.compact_at,
            files: ModelFiles {
                inputs: self.model_inputs.clone().map(|mut i| {
                    if !i.iter().any(|k| k == "text") {
                        i.insert(0, "text".to_owned());
                    }
                    i
                }),
                ..ModelFiles::default()
            },
        }
    }
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
        problems.extend(secrets_on_the_command_line(
            &self.origins,
            self.token.as_ref(),
            self.store.as_ref(),
        ));
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
            http: self.http.limits(),
            min_free_bytes: self.min_free_mb.saturating_mul(1 << 20),
            tls: self.tls.settings(&self.origins),
            limits: self.model.limits(),
            exec: {
                let mut exec = self.exec.isolated_settings(Sessions::Many);
                exec.confine.disk_quota = (self.session_disk_mb > 0)
                    .then(|| self.session_disk_mb.saturating_mul(1 << 20));
                exec.confine.session_disk_fs = self.session_disk_fs;
                exec
            },
            start_afresh: self.start_afresh,
            template: self.workspace_template.clone(),
            template_setting: self.origins.name("PODHOST_WORKSPACE_TEMPLATE"),
            template_level: self
                .workspace_template_level
                .as_deref()
                .and_then(crate::exec::template::Level::parse),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use pretty_assertions::assert_eq;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        model: ModelLimitsArgs,
    }

    #[test]
    fn model_limits_parse_and_refuse_what_is_out_of_range() {
        let w = Wrap::try_parse_from([
            "x",
            "--context-window",
            "8192",
            "--compact-at",
            "0.5",
            "--model-inputs",
            "image,pdf",
        ])
        .unwrap();
        let limits = w.model.limits();
        assert_eq!(limits.window, Some(8192));
        assert_eq!(limits.threshold, 0.5);
        assert_eq!(
            limits.files.inputs,
            Some(vec![
                "text".to_owned(),
                "image".to_owned(),
                "pdf".to_owned()
            ])
        );
        let err = |args: &[&str]| {
            Wrap::try_parse_from(std::iter::once("x").chain(args.iter().copied()))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        assert!(err(&["--compact-at", "1.5"]).contains("1.5 is not above 0 and at most 1"));
        assert!(err(&["--context-window", "10"]).contains("10 is not in 1024.."));
        assert!(err(&["--model-inputs", "smell"]).contains("invalid value 'smell'"));
    }
}
