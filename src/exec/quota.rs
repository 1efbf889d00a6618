//! A session's disk quota on a BYOH host: how much its workspace and temporary directory may
//! hold, measured and enforced by podhost.
//!
//! Owns: measuring a session's usage ([`measure`], a walk bounded in time), the quota's state
//! ([`DiskQuota`]: the last usage seen), and the words a model reads when it is past it.
//!
//! How it binds (see `Executor::execute` and `Toolbox::call`):
//! * While a command runs, its session's usage is measured every [`POLL`]; past the quota, and
//!   past what the session used when the command started (so a command may still delete), the
//!   command is stopped and its outcome says why.
//! * After every command the usage is measured again; past the quota, the outcome says so, and
//!   `write` and `edit` are refused until files are deleted.
//! * No single file may outgrow the quota: `RLIMIT_FSIZE` is at most the quota, which the kernel
//!   enforces on every write, `fallocate` included (a poll could not stop that in time).
//!
//! Non-goals: kernel quotas (this kernel and most container file systems offer none to
//! podhost; a data directory on a size-limited file system per session is the operator's
//! choice), other file systems than the session's own directories.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often a running command's session is measured.
pub const POLL: Duration = Duration::from_millis(500);
/// How long one measurement may take; past it, what was counted is a lower bound.
pub const BUDGET: Duration = Duration::from_millis(300);

/// What a walk found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Bytes allocated on disk (blocks, not lengths: a sparse file counts what it holds).
    pub bytes: u64,
    /// The walk finished within its budget (otherwise `bytes` is a lower bound).
    pub complete: bool,
}

/// Sums the disk usage beneath `dirs` (not following symlinks; a file with several links
/// counted once), within `budget`.
pub fn measure(dirs: &[PathBuf], budget: Duration) -> Usage {
    let deadline = Instant::now() + budget;
    let mut seen: HashSet<(u64, u64)> = HashSet::new();
    let mut bytes = 0u64;
    let mut stack: Vec<PathBuf> = dirs.to_vec();
    let mut steps = 0u32;
    while let Some(path) = stack.pop() {
        steps = steps.wrapping_add(1);
        if steps.is_multiple_of(64) && Instant::now() >= deadline {
            return Usage {
                bytes,
                complete: false,
            };
        }
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.nlink() > 1 && !meta.is_dir() && !seen.insert((meta.dev(), meta.ino())) {
            continue;
        }
        bytes = bytes.saturating_add(meta.blocks().saturating_mul(512));
        if meta.is_dir()
            && let Ok(entries) = std::fs::read_dir(&path)
        {
            stack.extend(entries.flatten().map(|e| e.path()));
        }
    }
    Usage {
        bytes,
        complete: true,
    }
}

/// One session's quota and the last usage seen.
#[derive(Debug)]
pub struct DiskQuota {
    bytes: u64,
    dirs: Vec<PathBuf>,
    last: Mutex<Option<Usage>>,
}

impl DiskQuota {
    pub fn new(bytes: u64, dirs: Vec<PathBuf>) -> Self {
        DiskQuota {
            bytes,
            dirs,
            last: Mutex::new(None),
        }
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Measures now (blocking: call off the async workers) and remembers it.
    pub fn measure(&self) -> Usage {
        let usage = measure(&self.dirs, BUDGET);
        if let Ok(mut last) = self.last.lock() {
            *last = Some(usage);
        }
        usage
    }

    /// The usage last measured.
    pub fn last(&self) -> Option<Usage> {
        self.last.lock().ok().and_then(|l| *l)
    }

    /// Whether `usage` is past the quota.
    pub fn exceeded_by(&self, usage: Usage) -> bool {
        usage.bytes > self.bytes
    }

    /// Why a running command was stopped.
    pub fn stopped_message(&self, usage: Usage) -> String {
        format!(
            "The command was stopped: the session's files use {}, over its disk quota of {}. \
             Delete files to go on.",
            mib(usage.bytes),
            mib(self.bytes)
        )
    }

    /// What a command's outcome says when it left the session past its quota.
    pub fn over_message(&self, usage: Usage) -> String {
        format!(
            "The session's files now use {}, over its disk quota of {}: commands that write \
             more are stopped, and write and edit are refused, until files are deleted.",
            mib(usage.bytes),
            mib(self.bytes)
        )
    }

    /// Why a `write` or `edit` is refused.
    pub fn refused_message(&self, usage: Usage) -> String {
        format!(
            "The session's files use {}, over its disk quota of {}. Delete files (with bash) \
             before writing more.",
            mib(usage.bytes),
            mib(self.bytes)
        )
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1u32 << 20))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn usage_counts_blocks_once_per_file_and_follows_no_symlink() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().to_path_buf();
        std::fs::create_dir(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/a"), vec![1u8; 64 << 10]).unwrap();
        std::fs::hard_link(root.join("sub/a"), root.join("b")).unwrap();
        std::os::unix::fs::symlink("/usr", root.join("link")).unwrap();
        let one = measure(std::slice::from_ref(&root), BUDGET);
        assert!(one.complete);
        let file = std::fs::metadata(root.join("sub/a")).unwrap().blocks() * 512;
        assert!(
            one.bytes >= file && one.bytes < file + (64 << 10),
            "{one:?}"
        );
        let quota = DiskQuota::new(file / 2, vec![root.clone()]);
        assert!(quota.exceeded_by(quota.measure()));
        assert_eq!(quota.last(), Some(one));
    }
}
