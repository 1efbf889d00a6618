//! The confinement level in force: what the policy of a front gives its commands, logged at
//! start-up and reported by the health endpoints.

use std::sync::OnceLock;

use serde::Serialize;

use super::{ConfineError, Confinement, is_non_dumpable, syscalls};

/// The log target of the level report: the confinement module's, where operators look for it.
const TARGET: &str = "podhost::exec::confine";

/// The confinement level in force: logged at start-up, reported by `/health` and `/healthz`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Level {
    /// The Landlock ABI commands and file tools are confined with; 0 for none (off, or the
    /// kernel has no Landlock).
    pub landlock_abi: u8,
    /// The Landlock ABI the kernel offers (0: none).
    pub kernel_landlock_abi: u8,
    /// Commands cannot signal (or connect to abstract sockets of) processes outside their
    /// sandbox: Landlock scoping, ABI ≥ 6.
    pub scoped_signals: bool,
    /// Commands can open no socket but `AF_UNIX`.
    pub network_filter: bool,
    /// The network commands are on: `host` (the host's own), `namespace` (a session's own
    /// network namespace, no route to the host's loopback or addresses, outbound connections
    /// through a proxy podhost serves), or `namespace, loopback only` (the network denied).
    pub network: &'static str,
    /// The system-call filter every command runs under: `docker-default` (Docker's default
    /// seccomp profile for a container without `CAP_SYS_ADMIN`: keyrings, `bpf`, `io_uring`,
    /// `perf_event_open`, `userfaultfd`, mounts, namespaces, modules, … refused), or `none`
    /// (this kernel or architecture takes no filter: every command then fails to start).
    pub syscall_filter: &'static str,
    /// The session keyring (`@s`) commands get: `per session` (a session holder joins a fresh
    /// one), `per command` (each command's supervisor does), or `unavailable` (the kernel has no
    /// keyrings, or a filter around podhost refuses them: commands cannot reach any either).
    pub session_keyring: &'static str,
    /// podhost is non-dumpable: its memory and environment are closed to same-user processes.
    pub non_dumpable: bool,
    /// Commands start with `no_new_privs` (always).
    pub no_new_privs: bool,
    /// The uid commands run as, when podhost drops them to another user.
    pub command_uid: Option<u32>,
    /// The namespaces commands run in: `root` or `userns` (mount, IPC and PID namespaces with
    /// the session's view), `userns-noproc` (no PID namespace), `none` (Landlock alone).
    pub namespaces: &'static str,
    /// Commands see their own session's processes only.
    pub pid_namespace: bool,
    /// What a command holds: `none` (every set empty), `container default` (a root command in
    /// local use), or `podhost's own` (none, since podhost is not root).
    pub command_capabilities: &'static str,
    /// The uids BYOH sessions' commands run as, one each (`first-last`).
    pub uid_pool: Option<String>,
    /// The cgroup hierarchy session limits are in: `v1`, `v2` or `none`.
    pub cgroups: &'static str,
    /// What binds a session's processes and memory: `cgroup` (root too), or `rlimit` (the
    /// process count does not bind root).
    pub limits: &'static str,
    /// Device files commands can open: `minimal /dev` (a view), `listed nodes` (Landlock), or
    /// `all` (local use).
    pub devices: &'static str,
    /// podhost checks and repairs the modes of its own state at each use.
    pub state_modes_checked: bool,
    /// A BYOH session's disk quota: `filesystem` (a file system of the session's own, sized to
    /// it: the kernel refuses writes past it), `measured` (podhost stops commands past it), or
    /// `none`.
    pub disk_quota: &'static str,
}

impl Level {
    /// Whether commands are confined by Landlock.
    pub fn is_confined(&self) -> bool {
        self.landlock_abi > 0
    }

    /// One line for logs.
    pub fn summary(&self) -> String {
        let landlock = if self.landlock_abi > 0 {
            format!(
                "Landlock ABI {} (kernel {})",
                self.landlock_abi, self.kernel_landlock_abi
            )
        } else if self.kernel_landlock_abi > 0 {
            format!(
                "no Landlock (off; kernel offers ABI {})",
                self.kernel_landlock_abi
            )
        } else {
            "no Landlock (the kernel has none)".to_owned()
        };
        let on = |b: bool| if b { "on" } else { "off" };
        let user = match (&self.uid_pool, self.command_uid) {
            (Some(pool), _) => format!("one uid per session from {pool}"),
            (None, Some(0)) => "root (asked for)".to_owned(),
            (None, Some(u)) => format!("uid {u}"),
            (None, None) => "podhost's own".to_owned(),
        };
        let mut text = format!(
            "{landlock}, signal scoping {}, network filter {}, syscall filter {}, session \
             keyring {}, non-dumpable {}, no_new_privs {}, command user {user}",
            on(self.scoped_signals),
            on(self.network_filter),
            self.syscall_filter,
            self.session_keyring,
            on(self.non_dumpable),
            on(self.no_new_privs),
        );
        if self.namespaces != "off" {
            text.push_str(&format!(
                ", namespaces {}{}, network {}, capabilities {}, devices {}, cgroups {} (limits \
                 by {}), state modes checked {}, disk quota {}",
                self.namespaces,
                if self.pid_namespace {
                    " with a PID namespace"
                } else {
                    ""
                },
                self.network,
                self.command_capabilities,
                self.devices,
                self.cgroups,
                self.limits,
                on(self.state_modes_checked),
                self.disk_quota,
            ));
        }
        text
    }
}

/// The level this process reported at start-up ([`report_startup`]).
static REPORTED: OnceLock<Level> = OnceLock::new();

/// Logs the confinement level of a front starting up, remembers it for the health endpoints, and
/// refuses (`Err`) when `require` is set and commands would not be confined. A missing Landlock
/// is always a warning; a confined start is logged at `info` when `loud` (long-running fronts),
/// else at `debug` (one-shot `podhost tool`).
pub fn report_startup(
    confinement: &Confinement,
    require: bool,
    loud: bool,
) -> Result<Level, ConfineError> {
    let level = confinement.level();
    let _ = REPORTED.set(level.clone());
    confinement.check_required(require)?;
    if let Some(iso) = &confinement.isolation {
        if !iso.namespaces.pid_namespace() {
            tracing::warn!(
            target: TARGET,
                refused = %iso.refused.join("; "),
                "commands get no {}: {}",
                if iso.namespaces.any() { "PID namespace" } else { "namespaces" },
                if iso.namespaces.any() {
                    "they can see the host's processes"
                } else {
                    "Landlock alone confines them (with /dev limited to a few nodes, and the \
                     modes of podhost's state checked at each use)"
                }
            );
        }
        if let Err(why) = &iso.cgroups {
            tracing::warn!(
            target: TARGET,
                reason = %why,
                "no cgroup limits: processes are limited by RLIMIT_NPROC, which does not bind \
                 root, and memory per process only"
            );
        }
    }
    if level.syscall_filter == "none" {
        tracing::warn!(
            target: TARGET,
            "this kernel takes no seccomp filter for this architecture: every command will fail \
             to start (podhost never runs one without its system-call filter)"
        );
    }
    if !level.is_confined() {
        tracing::warn!(
            target: TARGET,
            confinement = %level.summary(),
            "commands and file tools are NOT confined: they can read everything podhost's user \
             can (set PODHOST_REQUIRE_CONFINEMENT to refuse to start instead)"
        );
    } else if loud {
        tracing::info!(target: TARGET, confinement = %level.summary(), "commands and file tools are confined");
    } else {
        tracing::debug!(target: TARGET, confinement = %level.summary(), "commands and file tools are confined");
    }
    Ok(level)
}

/// The level reported at start-up; before that (tests that build fronts in-process), the
/// default policy's.
pub fn reported() -> Level {
    REPORTED
        .get()
        .cloned()
        .unwrap_or_else(|| Confinement::default().level())
}

impl Confinement {
    /// The level this policy gives, with the process's own state (non-dumpable) read now.
    pub fn level(&self) -> Level {
        let root = nix::unistd::geteuid().is_root();
        let mut level = Level {
            landlock_abi: self.abi,
            kernel_landlock_abi: self.kernel_abi,
            scoped_signals: self.abi >= 6,
            network_filter: self.deny_network,
            network: "host",
            syscall_filter: if syscalls::filter_available() {
                "docker-default"
            } else {
                "none"
            },
            session_keyring: match (
                syscalls::keyrings_available(),
                self.uses_namespaces() || self.local_namespaces().is_some(),
            ) {
                (false, _) => "unavailable",
                (true, true) => "per session",
                (true, false) => "per command",
            },
            non_dumpable: is_non_dumpable(),
            no_new_privs: true,
            command_uid: self.user.map(|u| u.uid),
            namespaces: "off",
            pid_namespace: false,
            command_capabilities: if root && self.user.is_none() {
                "container default"
            } else {
                "podhost's own"
            },
            uid_pool: None,
            cgroups: "none",
            limits: "rlimit",
            devices: "all",
            state_modes_checked: false,
            disk_quota: "none",
        };
        let Some(iso) = &self.isolation else {
            return level;
        };
        level.namespaces = iso.namespaces.as_str();
        if iso.network && iso.namespaces.any() {
            // The namespace holds the network; no socket filter is needed inside it.
            level.network_filter = false;
            level.network = if self.deny_network {
                "namespace, loopback only"
            } else {
                "namespace"
            };
        }
        level.pid_namespace = iso.namespaces.pid_namespace();
        level.command_capabilities = "none";
        level.uid_pool = iso.uid_pool.as_ref().map(|p| p.range().to_string());
        if iso.root_asked {
            level.command_uid = Some(0);
        }
        if let Ok(cg) = &iso.cgroups {
            level.cgroups = cg.version().as_str();
            level.limits = "cgroup";
        }
        level.devices = if iso.namespaces.any() {
            "minimal /dev"
        } else if self.abi > 0 {
            "listed nodes"
        } else {
            "all"
        };
        level.state_modes_checked = true;
        level.disk_quota = match (iso.disk_quota, iso.disk_fs) {
            (Some(_), true) => "filesystem",
            (Some(_), false) => "measured",
            (None, _) => "none",
        };
        level
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::confine::Settings;
    use pretty_assertions::assert_eq;

    /// Every front reports the filter; the keyring is per command without a session holder.
    #[test]
    fn the_level_names_the_filter_and_the_session_keyring() {
        let keyring = if syscalls::keyrings_available() {
            "per command"
        } else {
            "unavailable"
        };
        for c in [
            Confinement::default(),
            Confinement::off(),
            Confinement::new(&Settings {
                isolate: true,
                namespaces: false,
                ..Settings::default()
            }),
        ] {
            let level = c.level();
            assert_eq!(
                (level.syscall_filter, level.session_keyring),
                ("docker-default", keyring)
            );
            assert!(
                level.summary().contains(&format!(
                    "syscall filter docker-default, session keyring {keyring}"
                )),
                "{}",
                level.summary()
            );
        }
    }
}
