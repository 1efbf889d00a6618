//! How commands run, as flags: the limits, the shell and the confinement, into an
//! [`ExecSettings`].

use std::path::PathBuf;

use clap::Args;
use clap::builder::BoolishValueParser;

use crate::exec::cgroup::CgroupLimits;
use crate::exec::confine::{Settings, UidRange};
use crate::exec::net::Network;
use crate::exec::protocol::CommandUser;
use crate::exec::{ExecSettings, ResourceLimits};

/// How commands run: limits and the shell.
#[derive(Clone, Debug, Args)]
#[command(next_help_heading = "Commands")]
pub struct ExecArgs {
    /// Most open files per command (RLIMIT_NOFILE).
    #[arg(long, env = "PODHOST_LIMIT_OPEN_FILES", default_value_t = 4096)]
    pub limit_open_files: u64,
    /// Most processes of the command's user while it runs (RLIMIT_NPROC); 0 for no limit.
    #[arg(long, env = "PODHOST_LIMIT_PROCESSES", default_value_t = 4096)]
    pub limit_processes: u64,
    /// Largest file a command may write, in MiB (RLIMIT_FSIZE); 0 for no limit.
    #[arg(long, env = "PODHOST_LIMIT_FILE_SIZE_MB", default_value_t = 8192)]
    pub limit_file_size_mb: u64,
    /// CPU seconds per command (RLIMIT_CPU); 0 for no limit.
    #[arg(long, env = "PODHOST_LIMIT_CPU_SECONDS", default_value_t = 0)]
    pub limit_cpu_seconds: u64,
    /// Pod and BYOH hosts: MiB of memory a session's processes may use together (a cgroup
    /// limit, which binds root too); 0 for no limit.
    #[arg(long, env = "PODHOST_LIMIT_MEMORY_MB", default_value_t = 8192)]
    pub limit_memory_mb: u64,
    /// Pod and BYOH hosts: a session's CPU share against the others, 1 to 10000 (100 is an
    /// equal share; a cgroup weight).
    #[arg(long, env = "PODHOST_CPU_WEIGHT", default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub cpu_weight: u64,
    /// The shell commands run with; default `bash`, or `sh` where bash is missing.
    #[arg(long, env = "PODHOST_SHELL")]
    pub shell: Option<PathBuf>,
    #[command(flatten)]
    pub confine: ConfineArgs,
}

impl ExecArgs {
    /// What clap makes of these flags when none is given and none of their variables is set
    /// (for `ToolArgs::plain`; a test holds the two to the same values).
    pub(super) fn defaults() -> ExecArgs {
        ExecArgs {
            limit_open_files: 4096,
            limit_processes: 4096,
            limit_file_size_mb: 8192,
            limit_cpu_seconds: 0,
            limit_memory_mb: 8192,
            cpu_weight: 100,
            shell: None,
            confine: ConfineArgs {
                confine: true,
                require_confinement: false,
                deny_network: false,
                confine_deny: Vec::new(),
                tmp_dir: None,
                command_user: None,
                namespaces: true,
                session_network: true,
                session_allow_networks: Vec::new(),
                read_only_system: true,
                uid_pool: UidRange {
                    first: 400_000,
                    last: 465_535,
                },
                landlock_abi_max: None,
                isolate: false,
            },
        }
    }
}

/// Background processes (`bash` with `run_in_background`, `bash_output`, `bash_kill`): `serve`,
/// `run` and `mcp` offer them, a pod never does.
#[derive(Clone, Debug, Args)]
#[command(next_help_heading = "Commands")]
pub struct BackgroundArgs {
    /// Most background processes a session runs at once (serve: one invocation; run: the task;
    /// mcp: one client session); one more is refused with a tool error.
    #[arg(long, env = "PODHOST_MAX_BACKGROUND",
          default_value_t = crate::tools::background::DEFAULT_MAX as u64,
          value_parser = clap::value_parser!(u64).range(1..=256))]
    pub max_background: u64,
}

impl BackgroundArgs {
    /// The cap, as a count.
    pub fn max(&self) -> usize {
        usize::try_from(self.max_background).unwrap_or(usize::MAX)
    }
}

/// How commands and file tools are confined (see `exec::confine`).
#[derive(Clone, Debug, Args)]
#[command(next_help_heading = "Confinement")]
pub struct ConfineArgs {
    /// Confine commands and file tools with Landlock where the kernel has it: on or off.
    #[arg(long, env = "PODHOST_CONFINE", default_value = "on", value_parser = on_off, action = clap::ArgAction::Set)]
    pub confine: bool,
    /// Refuse to start unless commands and file tools can be confined (a kernel with Landlock).
    #[arg(long, env = "PODHOST_REQUIRE_CONFINEMENT", value_parser = BoolishValueParser::new())]
    pub require_confinement: bool,
    /// Deny commands the network: no socket but AF_UNIX (BYOH and local modes; a pod's egress
    /// goes through its proxy instead).
    #[arg(long, env = "PODHOST_DENY_NETWORK", value_parser = BoolishValueParser::new())]
    pub deny_network: bool,
    /// Paths commands and file tools may not reach, beyond podhost's own state (repeat the
    /// flag, or separate them with `:` in the environment).
    #[arg(
        long = "confine-deny",
        env = "PODHOST_CONFINE_DENY",
        value_delimiter = ':'
    )]
    pub confine_deny: Vec<PathBuf>,
    /// A private directory for commands' temporary files (`TMPDIR`); `/tmp` is then read-only.
    #[arg(long, env = "PODHOST_TMP_DIR")]
    pub tmp_dir: Option<PathBuf>,
    /// When podhost runs as root: the user commands run as (a name, or `uid[:gid]`), with no
    /// supplementary groups; `root` to run them as root (without capabilities). Unset, a pod's
    /// commands run as `nobody` and each BYOH session's as its own uid from the pool.
    #[arg(long, env = "PODHOST_COMMAND_USER", value_parser = command_user)]
    pub command_user: Option<CommandUser>,
    /// Pod and BYOH hosts: run each session's commands in namespaces of their own (a read-only
    /// system, podhost's state and other sessions hidden, a minimal /dev, their own /proc) where
    /// the kernel allows: on or off (Landlock alone).
    #[arg(long, env = "PODHOST_NAMESPACES", default_value = "on", value_parser = on_off, action = clap::ArgAction::Set)]
    pub namespaces: bool,
    /// Pod and BYOH hosts, where namespaces are used: give each session a network namespace of
    /// its own, with no route to the host's loopback or its addresses (outbound connections go
    /// through podhost's proxy, or a pod's egress proxy): on or off (the host's network).
    #[arg(long, env = "PODHOST_SESSION_NETWORK", default_value = "on", value_parser = on_off, action = clap::ArgAction::Set)]
    pub session_network: bool,
    /// Pod and BYOH hosts: networks a session's proxy may reach although they are not global
    /// (private, unique local, …), comma-separated, such as `10.20.0.0/16,fd00:1::/64`. Never
    /// loopback, the host's own addresses, link-local (cloud metadata), multicast.
    #[arg(
        long,
        env = "PODHOST_SESSION_ALLOW_NETWORKS",
        value_delimiter = ',',
        value_parser = clap::value_parser!(Network)
    )]
    pub session_allow_networks: Vec<Network>,
    /// Local use (`tool`, `run`, `mcp`): commands see the system read-only outside the
    /// workspace, the temporary directory and each --allow-write directory (a mount namespace,
    /// where the kernel allows one), so not even its metadata can change: on or off (Landlock
    /// alone keeps their writes in those places).
    #[arg(long, env = "PODHOST_READ_ONLY_SYSTEM", default_value = "on", value_parser = on_off, action = clap::ArgAction::Set)]
    pub read_only_system: bool,
    /// A root BYOH host: the uids sessions' commands run as, one per session (`first-last`;
    /// the default holds 65,536, and an idle session lends its uid once every one is taken).
    #[arg(long, env = "PODHOST_UID_POOL", default_value = "400000-465535", value_parser = uid_range)]
    pub uid_pool: UidRange,
    /// Testing only: use at most this Landlock ABI (0 behaves as a kernel without Landlock).
    #[arg(long, env = "PODHOST_LANDLOCK_ABI_MAX", hide = true)]
    pub landlock_abi_max: Option<u8>,
    /// Testing only: isolate `podhost tool`'s commands as a pod's are (namespaces, no
    /// capabilities, a cgroup, no root).
    #[arg(long, env = "PODHOST_ISOLATE", hide = true, value_parser = BoolishValueParser::new())]
    pub isolate: bool,
}

impl ConfineArgs {
    /// The settings, with the command user dropped (and a warning) unless podhost is root.
    fn settings(&self) -> Settings {
        let user = self.command_user.filter(|_| {
            let root = nix::unistd::geteuid().is_root();
            if !root {
                tracing::warn!("PODHOST_COMMAND_USER is ignored: podhost is not running as root");
            }
            root
        });
        let root_asked = user.is_some_and(|u| u.uid == 0);
        Settings {
            isolate: false,
            namespaces: self.namespaces,
            session_network: self.session_network,
            allow_networks: self.session_allow_networks.clone(),
            read_only_system: self.read_only_system,
            helper: None,
            uid_pool: None,
            root_asked,
            cgroup: CgroupLimits::default(),
            disk_quota: None,
            session_disk_fs: true,
            user: user.filter(|u| u.uid != 0),
            enabled: self.confine,
            require: self.require_confinement,
            deny_network: self.deny_network,
            hidden: self.confine_deny.clone(),
            tmp: self.tmp_dir.clone(),
            abi_max: self.landlock_abi_max,
        }
    }
}

pub(super) fn on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" | "true" | "1" => Ok(true),
        "off" | "false" | "0" => Ok(false),
        _ => Err(format!("expected on or off, got {s:?}")),
    }
}

/// `uid[:gid]` (the gid defaults to the uid), or a user name (its primary group); `root` (or
/// `0`) asks for root itself.
fn command_user(s: &str) -> Result<CommandUser, String> {
    let number = |v: &str| {
        v.parse::<u32>()
            .map_err(|_| format!("{v:?} is not a uid or gid"))
    };
    if s.starts_with(|c: char| c.is_ascii_digit()) {
        let (uid, gid) = match s.split_once(':') {
            Some((u, g)) => (number(u)?, number(g)?),
            None => (number(s)?, number(s)?),
        };
        return Ok(CommandUser { uid, gid });
    }
    match nix::unistd::User::from_name(s) {
        Ok(Some(u)) => Ok(CommandUser {
            uid: u.uid.as_raw(),
            gid: u.gid.as_raw(),
        }),
        Ok(None) => Err(format!("no user named {s:?}")),
        Err(e) => Err(format!("could not look up the user {s:?}: {e}")),
    }
}

/// `first-last`, both included.
fn uid_range(s: &str) -> Result<UidRange, String> {
    let bad = || format!("{s:?} is not a uid range such as 400000-400999");
    let (first, last) = s.split_once('-').ok_or_else(bad)?;
    let (first, last): (u32, u32) = (
        first.trim().parse().map_err(|_| bad())?,
        last.trim().parse().map_err(|_| bad())?,
    );
    if first == 0 || last < first {
        return Err(format!(
            "{s:?}: the range must start above 0 and not end before it starts"
        ));
    }
    Ok(UidRange { first, last })
}

/// Where a host's sessions come from, for the command user a root podhost picks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sessions {
    /// One session (a pod): one unprivileged user.
    One,
    /// Many (a BYOH host): one uid per session, from the pool.
    Many,
}

impl ExecArgs {
    /// The plain settings a front runs commands with (isolated only when the hidden test flag
    /// `--isolate` asks, as a pod's).
    pub fn settings(&self) -> ExecSettings {
        if self.confine.isolate {
            return self.isolated_settings(Sessions::One);
        }
        self.plain_settings()
    }

    fn plain_settings(&self) -> ExecSettings {
        ExecSettings {
            shell: self.shell.clone(),
            limits: self.limits(),
            confine: self.confine.settings(),
        }
    }

    /// The settings of a front that serves others (a pod, a BYOH host): sessions isolated
    /// (namespaces where the kernel allows, no capabilities, cgroup limits) and, when podhost is
    /// root and no command user is set, commands never run as root.
    pub fn isolated_settings(&self, sessions: Sessions) -> ExecSettings {
        let mut settings = self.plain_settings();
        let c = &mut settings.confine;
        c.isolate = true;
        let nonzero = |v: u64| (v > 0).then_some(v);
        c.cgroup = CgroupLimits {
            pids: nonzero(self.limit_processes),
            memory_bytes: nonzero(self.limit_memory_mb).map(|mb| mb.saturating_mul(1 << 20)),
            cpu_weight: Some(self.cpu_weight),
        };
        if nix::unistd::geteuid().is_root() && c.user.is_none() && !c.root_asked {
            match sessions {
                Sessions::Many => c.uid_pool = Some(self.confine.uid_pool),
                Sessions::One => c.user = Some(nobody()),
            }
        }
        settings
    }

    fn limits(&self) -> ResourceLimits {
        let nonzero = |v: u64| (v > 0).then_some(v);
        ResourceLimits {
            open_files: nonzero(self.limit_open_files),
            processes: nonzero(self.limit_processes),
            file_size: nonzero(self.limit_file_size_mb).map(|mb| mb.saturating_mul(1 << 20)),
            cpu_seconds: nonzero(self.limit_cpu_seconds),
        }
    }
}

/// The `nobody` user (65534 where it has no entry).
fn nobody() -> CommandUser {
    match nix::unistd::User::from_name("nobody") {
        Ok(Some(u)) => CommandUser {
            uid: u.uid.as_raw(),
            gid: u.gid.as_raw(),
        },
        _ => CommandUser {
            uid: 65534,
            gid: 65534,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn command_users_parse_and_root_must_be_asked_for_by_name() {
        assert_eq!(
            command_user("65534"),
            Ok(CommandUser {
                uid: 65534,
                gid: 65534
            })
        );
        assert_eq!(
            command_user("1000:100"),
            Ok(CommandUser {
                uid: 1000,
                gid: 100
            })
        );
        assert_eq!(
            command_user("nobody"),
            Ok(CommandUser {
                uid: 65534,
                gid: 65534
            })
        );
        // Root is asked for by name or number (commands then run as root, without
        // capabilities).
        for root in ["0", "root"] {
            assert_eq!(command_user(root), Ok(CommandUser { uid: 0, gid: 0 }));
        }
        assert_eq!(
            uid_range("400000-400999"),
            Ok(UidRange {
                first: 400_000,
                last: 400_999
            })
        );
        for bad in ["400000", "0-5", "9-3", "a-b"] {
            assert!(uid_range(bad).is_err(), "{bad}");
        }
        for (bad, message) in [
            ("12x", "\"12x\" is not a uid or gid"),
            ("no-such-user-here", "no user named \"no-such-user-here\""),
        ] {
            assert_eq!(command_user(bad), Err(message.to_owned()), "{bad}");
        }
    }
}
