//! Process execution: the one place podhost starts processes.
//!
//! Owns: spawning a command under a per-command supervisor (its own session and process group,
//! stdin from `/dev/null`, a child subreaper that kills every descendant when the command ends,
//! times out or is cancelled), concurrent bounded capture of stdout and stderr, resource limits,
//! the command environment (`env`), the egress proxy variables and CA bundle (`egress`), and the
//! confinement that keeps commands away from podhost's secrets (`confine`). Also the minimal
//! init podhost splits off when it is a container's PID 1 (`init`).
//!
//! Invariants:
//! * A command never outlives its call: when the shell exits, times out or is cancelled, every
//!   process it started is killed — also those that called `setsid` or double-forked.
//! * A call returns on time even when a descendant holds the output pipes.
//! * Memory held for a command's output is bounded, whatever it prints.
//! * The environment is built from a clean base: nothing of podhost's own environment leaks.
//!
//! All `unsafe` in podhost lives in this module, each block with a `// SAFETY:` comment.

pub mod env;
pub mod init;

use std::path::PathBuf;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

pub use env::{BaseEnv, CommandEnv};

/// Per-command resource limits (`setrlimit`), each `None` for "inherit".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceLimits {
    /// `RLIMIT_NOFILE`: open files.
    pub open_files: Option<u64>,
    /// `RLIMIT_NPROC`: processes of the user (a fork bomb's ceiling).
    pub processes: Option<u64>,
    /// `RLIMIT_FSIZE`: the largest file a command may write, in bytes.
    pub file_size: Option<u64>,
    /// `RLIMIT_CPU`: CPU seconds.
    pub cpu_seconds: Option<u64>,
}

impl Default for ResourceLimits {
    fn default() -> Self {
        ResourceLimits {
            open_files: Some(4096),
            processes: Some(4096),
            file_size: Some(8 << 30),
            cpu_seconds: None,
        }
    }
}

/// How commands are started.
#[derive(Clone, Debug)]
pub struct ExecConfig {
    /// The podhost binary, re-executed as each command's supervisor.
    pub supervisor: PathBuf,
    /// The shell: `bash` if present, else `sh`.
    pub shell: PathBuf,
    pub env: CommandEnv,
    pub limits: ResourceLimits,
}

/// Starts commands. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Executor {
    config: std::sync::Arc<ExecConfig>,
}

impl Executor {
    pub fn new(config: ExecConfig) -> Self {
        Executor {
            config: std::sync::Arc::new(config),
        }
    }

    pub fn config(&self) -> &ExecConfig {
        &self.config
    }
}

/// One command to run.
#[derive(Clone, Debug)]
pub struct ExecRequest {
    pub command: String,
    pub cwd: PathBuf,
    /// Variables of this call, on top of the executor's environment.
    pub env: Vec<(String, String)>,
    pub timeout: Duration,
    pub cancel: CancellationToken,
    /// Characters of each stream the caller keeps (head and tail halves).
    pub stream_chars: usize,
}

/// One captured stream, already cut to the requested size.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Captured {
    /// Valid text: the first and last halves with the omission marker between them when cut.
    pub text: String,
    /// Characters left out of the middle.
    pub omitted_chars: u64,
    /// Bytes that were not UTF-8 (or were NUL) and were replaced with U+FFFD.
    pub replaced: u64,
}

/// How a command ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecOutput {
    /// The shell's exit code; 128+N for a signal; 124 on timeout; 130 on cancellation.
    pub exit_code: i32,
    pub stdout: Captured,
    pub stderr: Captured,
    pub timed_out: bool,
    pub cancelled: bool,
}

/// A fault of the executor itself (the command could not be started or watched).
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("could not start the command supervisor {path}: {source}")]
    Spawn {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the working directory {0} does not exist")]
    NoCwd(PathBuf),
    #[error("could not watch the command: {0}")]
    Io(#[from] std::io::Error),
}
