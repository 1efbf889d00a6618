//! How commands run, as flags: the limits, the shell and the confinement, into an
//! [`ExecSettings`].

use std::path::PathBuf;

use clap::Args;
use clap::builder::BoolishValueParser;

use crate::exec::confine::Settings;
use crate::exec::protocol::CommandUser;
use crate::exec::{ExecSettings, ResourceLimits};

/// How commands run: limits and the shell.
#[derive(Clone, Debug, Args)]
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
    /// The shell commands run with; default `bash`, or `sh` where bash is missing.
    #[arg(long, env = "PODHOST_SHELL")]
    pub shell: Option<PathBuf>,
    #[command(flatten)]
    pub confine: ConfineArgs,
}

/// How commands and file tools are confined (see `exec::confine`).
#[derive(Clone, Debug, Args)]
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
    /// supplementary groups.
    #[arg(long, env = "PODHOST_COMMAND_USER", value_parser = command_user)]
    pub command_user: Option<CommandUser>,
    /// Testing only: use at most this Landlock ABI (0 behaves as a kernel without Landlock).
    #[arg(long, env = "PODHOST_LANDLOCK_ABI_MAX", hide = true)]
    pub landlock_abi_max: Option<u8>,
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
        Settings {
            enabled: self.confine,
            require: self.require_confinement,
            deny_network: self.deny_network,
            hidden: self.confine_deny.clone(),
            tmp: self.tmp_dir.clone(),
            user,
            abi_max: self.landlock_abi_max,
        }
    }
}

fn on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" | "true" | "1" => Ok(true),
        "off" | "false" | "0" => Ok(false),
        _ => Err(format!("expected on or off, got {s:?}")),
    }
}

/// `uid[:gid]` (the gid defaults to the uid), or a user name (its primary group).
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
        if uid == 0 {
            return Err("the command user must not be root".to_owned());
        }
        return Ok(CommandUser { uid, gid });
    }
    match nix::unistd::User::from_name(s) {
        Ok(Some(u)) if u.uid.is_root() => Err("the command user must not be root".to_owned()),
        Ok(Some(u)) => Ok(CommandUser {
            uid: u.uid.as_raw(),
            gid: u.gid.as_raw(),
        }),
        Ok(None) => Err(format!("no user named {s:?}")),
        Err(e) => Err(format!("could not look up the user {s:?}: {e}")),
    }
}

impl ExecArgs {
    /// The plain settings a front runs commands with.
    pub fn settings(&self) -> ExecSettings {
        ExecSettings {
            shell: self.shell.clone(),
            limits: self.limits(),
            confine: self.confine.settings(),
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn command_users_parse_and_root_is_refused() {
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
        for (bad, message) in [
            ("0", "the command user must not be root"),
            ("root", "the command user must not be root"),
            ("12x", "\"12x\" is not a uid or gid"),
            ("no-such-user-here", "no user named \"no-such-user-here\""),
        ] {
            assert_eq!(command_user(bad), Err(message.to_owned()), "{bad}");
        }
    }
}
