//! Resource limits (`setrlimit`) for a command, prepared before `fork` and applied after it.
//!
//! Owns: turning [`ResourceLimits`] into the exact `setrlimit` calls, and applying them in the
//! forked child where only async-signal-safe calls are allowed.
//!
//! Invariants:
//! * Soft and hard limits are both set, so the command cannot raise them again (unless it holds
//!   `CAP_SYS_RESOURCE`).
//! * A limit above the current hard limit is clamped to it rather than failing the command: an
//!   unprivileged podhost cannot raise its own ceiling, and a lower ceiling is still a limit.
//! * [`Prepared::apply`] allocates nothing and calls only `setrlimit`.

use std::io;

use nix::sys::resource::{Resource, getrlimit, setrlimit};

use super::ResourceLimits;

/// The `setrlimit` calls for one command.
#[derive(Clone, Copy, Debug, Default)]
pub struct Prepared {
    calls: [Option<(Resource, u64)>; 5],
}

impl Prepared {
    /// Reads the current hard limits (in the parent, before forking) and clamps to them. A
    /// command never dumps core: a core is written outside its disk quota (by a root helper
    /// where `core_pattern` is a pipe) and may hold what its memory held.
    pub fn new(limits: &ResourceLimits) -> Self {
        let wanted = [
            (Resource::RLIMIT_NOFILE, limits.open_files),
            (Resource::RLIMIT_NPROC, limits.processes),
            (Resource::RLIMIT_FSIZE, limits.file_size),
            (Resource::RLIMIT_CPU, limits.cpu_seconds),
            (Resource::RLIMIT_CORE, Some(0)),
        ];
        let mut calls = [None; 5];
        for (slot, (resource, value)) in calls.iter_mut().zip(wanted) {
            if let Some(value) = value {
                let value = match getrlimit(resource) {
                    Ok((_, hard)) => value.min(hard),
                    Err(_) => value,
                };
                *slot = Some((resource, value));
            }
        }
        Prepared { calls }
    }

    /// Each `setrlimit` call as the kernel's resource number and the value, for a child that
    /// makes them with raw system calls (`exec::ahead`).
    pub fn calls(&self) -> Vec<(u32, u64)> {
        self.calls
            .iter()
            .flatten()
            .map(|(resource, value)| (*resource as u32, *value))
            .collect()
    }

    /// Sets every limit (soft = hard = the value). Async-signal-safe: runs between fork and exec.
    pub fn apply(&self) -> io::Result<()> {
        for (resource, value) in self.calls.iter().flatten() {
            setrlimit(*resource, *value, *value).map_err(io::Error::from)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn none_means_no_call_values_are_clamped_to_the_hard_limit_and_no_core_is_dumped() {
        let p = Prepared::new(&ResourceLimits {
            open_files: Some(u64::MAX),
            processes: None,
            file_size: Some(1 << 20),
            cpu_seconds: None,
        });
        let (_, hard_nofile) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        assert_eq!(
            p.calls,
            [
                Some((Resource::RLIMIT_NOFILE, hard_nofile)),
                None,
                Some((Resource::RLIMIT_FSIZE, 1 << 20)),
                None,
                Some((Resource::RLIMIT_CORE, 0)),
            ]
        );
    }
}
