//! What podhost and a command's supervisor say to each other over the control socket.
//!
//! The supervisor's stdin is one end of a Unix socket pair. podhost writes one [`Request`] (JSON)
//! and shuts down its sending side; the supervisor reads to end-of-file, runs the command, and
//! answers with one [`Status`] line just before it exits. The request never travels in `argv` or
//! the environment: a command running as the same user can read `/proc/<supervisor>/cmdline` and
//! `/proc/<supervisor>/environ`.
//!
//! Invariant: a supervisor that reports nothing has failed — "the command exited 1" is always a
//! status line, so the two cannot be confused.
//!
//! Non-goals: versioning. Both ends are the same binary.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::ResourceLimits;

/// The largest request a supervisor accepts: a command (under 128 KiB) plus its environment.
pub const MAX_REQUEST_BYTES: u64 = 8 << 20;

/// The largest status line a supervisor sends (an error message), and podhost reads.
pub const MAX_STATUS_BYTES: u64 = 64 << 10;

/// One command for a supervisor to run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// podhost's pid: the supervisor exits at once if its parent is already someone else (podhost
    /// died before the supervisor could ask to be told of its death).
    pub parent: u32,
    /// The shell, run as `<shell> -c <command>`.
    #[serde(with = "bytes_path")]
    pub shell: PathBuf,
    pub command: String,
    /// The working directory of the shell.
    #[serde(with = "bytes_path")]
    pub cwd: PathBuf,
    /// The shell's whole environment (the supervisor's own is empty).
    pub env: Vec<(String, String)>,
    pub limits: ResourceLimits,
    /// Confinement applied in the shell's process just before it execs.
    pub confine: Confine,
}

/// What a session holder (`podhost-exec __session`, see `session::holder`) is asked to build:
/// the namespaces and the view of the file system every command of the session runs in. Sent
/// as the first message on the holder's socket.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionRequest {
    /// podhost's pid (see [`Request::parent`]).
    pub parent: u32,
    /// Make a user namespace that maps this uid and gid to themselves (podhost is not root);
    /// `None`: podhost is root and needs none.
    pub userns: Option<CommandUser>,
    /// A PID namespace with its own `/proc` (off where a fresh `/proc` is refused).
    pub pid_namespace: bool,
    /// `cgroup.procs` files the holder joins before anything else, one per hierarchy: every
    /// process of the session is then counted and limited there.
    #[serde(with = "bytes_paths")]
    pub cgroup_procs: Vec<PathBuf>,
    /// A network namespace of the session's own (no route to the host's loopback or its
    /// interfaces); `None`: the host's network.
    pub network: Option<SessionNetwork>,
    /// The session's workspace and temporary directory on a disk image of their own, sized to
    /// its quota (see `exec::disk`); `None`: the host's directories, bound back.
    pub disk: Option<SessionDisk>,
    /// The workspace as a copy-on-write view of a template (see `exec::overlay`); `None`: the
    /// workspace as it is.
    #[serde(default)]
    pub overlay: Option<SessionOverlay>,
    pub view: View,
    /// The Landlock rules of the session's commands and whether their network is denied: the
    /// holder builds their ruleset once, inside the view, for every command whose rules these
    /// are (see `confine::Prebuilt`); `None`: each command builds its own.
    #[serde(default)]
    pub landlock: Option<(Landlock, bool)>,
}

/// A workspace the holder mounts as an overlay of a template (see `exec::overlay`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionOverlay {
    /// The template: the read-only lower layer.
    #[serde(with = "bytes_path")]
    pub lower: PathBuf,
    /// The workspace: where the overlay is seen, and (without a disk of the session's own) its
    /// upper layer.
    #[serde(with = "bytes_path")]
    pub target: PathBuf,
    /// The kernel's work directory beside the upper layer, on its file system (without a disk;
    /// with one, its `work` directory is used).
    #[serde(with = "bytes_path")]
    pub work: PathBuf,
    /// The template's owner, shown as the session's command user (an idmapped lower layer) when
    /// they differ and podhost is root; `None`: shown as it is.
    pub map_owner: Option<(CommandUser, CommandUser)>,
}

/// What a holder is asked to mount (see `exec::disk`): sent in the session request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionDisk {
    /// The image file (made when missing).
    #[serde(with = "bytes_path")]
    pub image: PathBuf,
    /// Its size: the session's quota.
    pub bytes: u64,
    /// Where each of `disk::DIRS` is bound, in order: the workspace, the temporary directory.
    #[serde(with = "bytes_paths")]
    pub targets: Vec<PathBuf>,
    /// Who owns the directories (the session's command user).
    pub owner: CommandUser,
}

/// A session's network namespace: loopback only, and at most one way out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionNetwork {
    /// The holder listens on `127.0.0.1:<port>` inside the namespace and hands the listening
    /// socket to podhost, which serves it (the session's proxy, see `exec::net`); `None`:
    /// loopback only, nothing leaves.
    pub forward_port: Option<u16>,
}

/// A command's view of the file system: the host's, read-only, with podhost's state covered by
/// empty mounts, a minimal `/dev` and the writable places bound back (see `session::view`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct View {
    /// Bound back writable at their own paths (workspace roots, the temporary directory).
    #[serde(with = "bytes_paths")]
    pub writable: Vec<PathBuf>,
    /// Bound back read-only at their own paths, also beneath a covered directory (the egress CA
    /// bundle, `/skills`).
    #[serde(with = "bytes_paths")]
    pub readonly: Vec<PathBuf>,
    /// Covered by an empty read-only mount (a directory) or by an empty device file (a file):
    /// podhost's state, other sessions, host socket directories.
    #[serde(with = "bytes_paths")]
    pub hidden: Vec<PathBuf>,
    /// Bytes of the session's private `/dev/shm`.
    pub shm_bytes: u64,
    /// Keep the host's `/dev` (read-only mounts; its devices still usable) instead of a minimal
    /// one: local use, whose commands are the user's own.
    pub host_dev: bool,
    /// Leave the host's UNIX sockets reachable (local use) instead of covering each one.
    pub host_sockets: bool,
}

/// The confinement of one command, built by podhost ([`Confinement::for_workspace`]) and applied
/// by the supervisor in the shell's process just before it execs.
///
/// [`Confinement::for_workspace`]: super::confine::Confinement::for_workspace
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Confine {
    /// The Landlock rules; `None` when Landlock is off or the kernel has none.
    pub landlock: Option<Landlock>,
    /// Deny every socket family but `AF_UNIX` (a seccomp filter; with Landlock ≥ 4 also every
    /// TCP bind and connect).
    pub deny_network: bool,
    /// The user the shell runs as, when podhost runs as root and drops commands to another user.
    pub user: Option<CommandUser>,
    /// Drop every capability (bounding, inheritable, ambient, permitted, effective) and lock the
    /// securebits, whatever the user: on a pod or BYOH host. Otherwise (local use) a root
    /// command keeps a container's usual set (`ROOT_KEEPS`).
    #[serde(default)]
    pub no_capabilities: bool,
    /// `cgroup.procs` files the supervisor joins before it starts the shell (commands that run
    /// without a session holder); the limits of those groups then bind the command.
    #[serde(default, with = "bytes_paths")]
    pub cgroup_procs: Vec<PathBuf>,
}

/// Landlock file-system rules, as paths: the supervisor (or a file tool's thread) opens them
/// when it builds the ruleset, so a rule always names what is at the path at that moment (a
/// session's holder builds its commands' ruleset once, used while every path still names the
/// file it named then: see `confine::Prebuilt`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Landlock {
    /// The Landlock ABI to use: at most what the kernel offers, at least 1.
    pub abi: u8,
    /// Read-only grants (read, list, execute), canonical.
    #[serde(with = "bytes_paths")]
    pub read: Vec<PathBuf>,
    /// Read-write grants, canonical.
    #[serde(with = "bytes_paths")]
    pub write: Vec<PathBuf>,
    /// Paths no grant reaches, canonical: a grant above one is split around it; a grant strictly
    /// beneath one is an explicit exception and stays.
    #[serde(with = "bytes_paths")]
    pub hidden: Vec<PathBuf>,
    /// The hidden paths whose names may be listed: a directory split only around these gets a
    /// list-only rule (which, being inherited, lists the names beneath them too).
    #[serde(with = "bytes_paths")]
    pub names_visible: Vec<PathBuf>,
    /// Scope signals and abstract Unix sockets to the sandbox (ABI ≥ 6).
    pub scoped: bool,
}

/// A uid and gid to run the shell as (supplementary groups are cleared).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandUser {
    pub uid: u32,
    pub gid: u32,
}

impl Request {
    pub fn encode(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec(self)
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

/// How the command ended, as the supervisor reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    /// The shell exited with this code.
    Exited(i32),
    /// The shell was killed by this signal.
    Signaled(i32),
    /// podhost (or podhost's death) asked the supervisor to stop; the tree was killed.
    Killed,
    /// The shell could not be started; the message says why.
    Error(String),
}

impl Status {
    /// The status line, newline-terminated. Newlines in an error message become spaces.
    pub fn encode(&self) -> String {
        match self {
            Status::Exited(code) => format!("exit {code}\n"),
            Status::Signaled(sig) => format!("signal {sig}\n"),
            Status::Killed => "killed\n".to_owned(),
            Status::Error(message) => format!("error {}\n", message.replace('\n', " ")),
        }
    }

    /// Parses a status line; `None` for anything else (including nothing at all).
    pub fn decode(line: &[u8]) -> Option<Self> {
        let line = std::str::from_utf8(line).ok()?.strip_suffix('\n')?;
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        match word {
            "exit" => rest.parse().ok().map(Status::Exited),
            "signal" => rest.parse().ok().map(Status::Signaled),
            "killed" if rest.is_empty() => Some(Status::Killed),
            "error" => Some(Status::Error(rest.to_owned())),
            _ => None,
        }
    }
}

/// Lists of paths as lists of byte arrays.
pub(crate) mod bytes_paths {
    use super::*;
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(paths: &[PathBuf], s: S) -> Result<S::Ok, S::Error> {
        let bytes: Vec<&[u8]> = paths.iter().map(|p| p.as_os_str().as_bytes()).collect();
        bytes.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<PathBuf>, D::Error> {
        let all = Vec::<Vec<u8>>::deserialize(d)?;
        Ok(all
            .into_iter()
            .map(|b| PathBuf::from(OsString::from_vec(b)))
            .collect())
    }
}

/// Paths as byte arrays, so that a path that is not UTF-8 still crosses.
pub(crate) mod bytes_path {
    use super::*;
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(path: &Path, s: S) -> Result<S::Ok, S::Error> {
        path.as_os_str().as_bytes().serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<PathBuf, D::Error> {
        let bytes = Vec::<u8>::deserialize(d)?;
        Ok(PathBuf::from(OsString::from_vec(bytes)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn request_round_trips_with_a_non_utf8_path() {
        let req = Request {
            parent: 42,
            shell: PathBuf::from("/bin/sh"),
            command: "echo 'hi'\n".to_owned(),
            cwd: PathBuf::from(OsString::from_vec(b"/tmp/\xff".to_vec())),
            env: vec![("A".to_owned(), "b c".to_owned())],
            limits: ResourceLimits::default(),
            confine: Confine {
                landlock: Some(Landlock {
                    abi: 6,
                    read: vec![PathBuf::from("/")],
                    write: vec![PathBuf::from(OsString::from_vec(b"/w/\xfe".to_vec()))],
                    hidden: vec![PathBuf::from("/harness")],
                    names_visible: vec![PathBuf::from("/harness")],
                    scoped: true,
                }),
                deny_network: true,
                user: Some(CommandUser {
                    uid: 65534,
                    gid: 65534,
                }),
                no_capabilities: true,
                cgroup_procs: vec![PathBuf::from("/sys/fs/cgroup/pids/p/cgroup.procs")],
            },
        };
        assert_eq!(Request::decode(&req.encode().unwrap()).unwrap(), req);
    }

    #[test]
    fn status_lines_round_trip_and_garbage_is_none() {
        for status in [
            Status::Exited(0),
            Status::Exited(255),
            Status::Signaled(9),
            Status::Killed,
            Status::Error("could not start".to_owned()),
        ] {
            assert_eq!(Status::decode(status.encode().as_bytes()), Some(status));
        }
        assert_eq!(
            Status::decode(Status::Error("a\nb".to_owned()).encode().as_bytes()),
            Some(Status::Error("a b".to_owned()))
        );
        for garbage in [&b""[..], b"exit 1", b"exit x\n", b"killed now\n", b"\xff\n"] {
            assert_eq!(Status::decode(garbage), None, "{garbage:?}");
        }
    }
}
