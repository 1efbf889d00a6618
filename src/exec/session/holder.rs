//! The session holder, `podhost-exec __session`: builds a session's namespaces and view once,
//! then starts each of the session's commands inside them.
//!
//! ```text
//! podhost ──spawn──► O (podhost-exec __session; its own session)
//!   │  stdin: the session socket (SOCK_SEQPACKET)        │ [unshare(USER) + id maps]
//!   │                                                     └─clone(NEWNS|NEWIPC[|NEWPID])─► H
//!   │                                                           H = pid 1: builds the view,
//!   │                                                           keeps one S forked ahead
//!   │  per command: "c" + [control socket, stdout, stderr] ──►  S takes it ("t" to H, which
//!   │                                                           forks the next S) and runs it
//!   └◄── S's pidfd, first thing on the control socket             (see `supervise`)
//! ```
//!
//! * **O** (the outer process, podhost's child) joins a fresh session keyring (the session's
//!   `@s`, see `confine::syscalls`) and the session's cgroups, makes the user namespace when
//!   podhost is not root (and maps its own uid and gid into it), and clones H into fresh
//!   mount, IPC and (usually) PID namespaces. Then it only waits: when H ends it
//!   exits with H's status; when podhost dies (its parent-death signal) or sends SIGTERM, it
//!   SIGKILLs H. O is exec'ed, hence dumpable again (podhost is not), which the user namespace's
//!   id maps need.
//! * **H** (pid 1 of the session) builds the view (`view`) — mounting the session's disk in it,
//!   when it has one (`exec::disk`), and its workspace's overlay of a template (`exec::overlay`,
//!   whose id map O makes) — and its network (`exec::net`), answers `ok` with its mount
//!   namespace (and the network's listening socket) attached, or `error …`, on the socket,
//!   ignores SIGCHLD (the kernel reaps its children and every orphan of the session),
//!   and keeps one supervisor forked ahead of the next command: the fork and the new process's
//!   first touches of its code (a fork copies no page-table entry of the binary's text, so each
//!   code page would fault in again) cost about a tenth of a millisecond a command, paid while
//!   no command waits. It forks the next as soon as one has taken a command, so a session's commands may
//!   run side by side; between commands a session has one idle supervisor more. It dies with O
//!   (parent-death SIGKILL), and with it every process of the session: the kernel kills a PID
//!   namespace whose init ends. It ends by itself when podhost closes the socket.
//! * **S** (one per command) maps its code into its page tables, waits on the session socket,
//!   takes one command, covers the host's sockets bound since the last look (`sockets`), puts
//!   the three descriptors it was sent in place (control socket on stdin, the output pipes on
//!   stdout and stderr) and runs the ordinary supervisor, inside the view: its Landlock
//!   ruleset is the one H built from inside once (while each rule's path still names the same
//!   file, see `confine::Prebuilt`), its `/proc` walk sees the session's PID namespace, the
//!   command's orphans come back to it (a child subreaper in the same PID namespace). Its first
//!   message on the control socket is its own pidfd, so podhost can signal it (timeout,
//!   cancellation) although it is not podhost's child.
//!
//! Invariants:
//! * H and S are forked from single-threaded processes, so they may run any code.
//! * The holder makes its namespaces and mounts unfiltered, then puts itself under the
//!   system-call filter but `mount` and `mount_setattr` (its sockets' covers) before it says
//!   `ok`; each command adds a filter refusing those (and the network, when denied), so that it
//!   runs under exactly the whole filter (see `confine::syscalls::confine_holder`).
//! * A holder that cannot build the view says why on the socket and runs no command.
//! * Nothing of the session outlives podhost: podhost → O (parent-death SIGTERM) → H
//!   (parent-death SIGKILL) → every process in its PID namespace.
//!
//! Non-goals: choosing what the view holds (podhost decides, see `Confinement::for_workspace`).

use std::os::fd::{AsRawFd, OwnedFd};
use std::process::ExitCode;

use nix::sys::signal::{SigSet, Signal};

use super::view;
use crate::exec::protocol::{Landlock, SessionNetwork, SessionRequest};
use crate::exec::sys::{self, StepError};

/// `argv[1]` that makes the supervisor binary a session holder.
pub const SESSION_ARG: &str = "__session";

/// The largest session request the holder reads.
const MAX_SESSION_REQUEST: usize = 1 << 20;

/// The message podhost sends for each command (with three descriptors).
pub const LAUNCH: &[u8] = b"c";
/// The holder's answers once it has tried to build the view.
pub const READY: &[u8] = b"ok";
pub const FAILED_PREFIX: &str = "error ";

/// Exit code of a holder that could not even report.
const EXIT_BROKEN: u8 = 125;

/// The holder's `main` (O): see the module doc.
pub fn main() -> ExitCode {
    sys::close_from(3);
    // Its own session: if O dies first, H and what is left are not in podhost's session, so
    // podhost's reaper kills and reaps them. The session's commands rely on it (a session
    // without a controlling terminal, not podhost's: see `supervise`), so no session, no holder;
    // it fails only for a process-group leader, which podhost never makes O.
    if nix::unistd::setsid().is_err() {
        return ExitCode::from(EXIT_BROKEN);
    }
    let waited = waited_signals();
    if waited.thread_block().is_err() || sys::set_parent_death_signal(libc::SIGTERM).is_err() {
        return ExitCode::from(EXIT_BROKEN);
    }
    let sock = 0;
    let req = match read_request(sock) {
        Ok(req) => req,
        Err(e) => {
            report(sock, &format!("bad session request: {e}"));
            return ExitCode::from(EXIT_BROKEN);
        }
    };
    if u32::try_from(nix::unistd::getppid().as_raw()).ok() != Some(req.parent) {
        return ExitCode::from(EXIT_BROKEN);
    }
    match start(&req, sock) {
        // `_life` stays open while O waits: H sees it close when O dies.
        Ok((h, _life)) => ExitCode::from(wait_for(h, &waited)),
        Err(e) => {
            report(sock, &e.to_string());
            ExitCode::from(EXIT_BROKEN)
        }
    }
}

/// What O waits for: its child's end, and the signals that mean "stop the session".
fn waited_signals() -> SigSet {
    let mut set = SigSet::empty();
    for sig in [
        Signal::SIGCHLD,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGQUIT,
    ] {
        set.add(sig);
    }
    set
}

fn read_request(sock: i32) -> Result<SessionRequest, String> {
    let mut buf = vec![0u8; MAX_SESSION_REQUEST];
    let (n, _) = sys::recv_with_fds(sock, &mut buf).map_err(|e| e.to_string())?;
    if n == 0 {
        return Err("none arrived".to_owned());
    }
    serde_json::from_slice(&buf[..n]).map_err(|e| e.to_string())
}

fn report(sock: i32, message: &str) {
    let line = format!("{FAILED_PREFIX}{message}");
    let _ = sys::send_with_fds(sock, line.as_bytes(), &[]);
}

/// Joins the cgroups, makes the namespaces and clones H; returns H's pid (in O's namespace) and
/// O's end of the pipe that tells H when O is gone.
fn start(req: &SessionRequest, sock: i32) -> Result<(libc::pid_t, OwnedFd), StepError> {
    // Every process of the session inherits this keyring: none shares podhost's or another
    // session's `@s`.
    crate::exec::confine::join_session_keyring().map_err(|e| {
        StepError::new(
            "join a fresh session keyring",
            e.raw_os_error().unwrap_or(libc::EIO),
        )
    })?;
    for procs in &req.cgroup_procs {
        std::fs::write(procs, "0").map_err(|e| {
            StepError::new(
                format!("join the cgroup {}", procs.display()),
                e.raw_os_error().unwrap_or(libc::EIO),
            )
        })?;
    }
    let mut prepared = view::prepare(&req.view, req.pid_namespace, req.userns.is_some())?;
    if let Some(disk) = &req.disk {
        prepared.disk = Some((disk.clone(), crate::exec::disk::prepare(disk)?));
    }
    if let Some(overlay) = &req.overlay {
        // Here, in the host's PID namespace and before any user namespace of the session's.
        let idmap = match overlay.map_owner {
            Some((from, to)) if req.userns.is_none() => {
                Some(crate::exec::overlay::idmap(from, to)?)
            }
            _ => None,
        };
        prepared.overlay = Some((overlay.clone(), idmap, req.userns.is_some()));
    }
    let (life_r, life_w) =
        sys::pipe().map_err(|e| StepError::new("pipe", e.raw_os_error().unwrap_or(libc::EIO)))?;
    if let Some(ids) = req.userns {
        sys::enter_user_namespace(ids.uid, ids.gid)?;
    }
    let mut flags = libc::CLONE_NEWNS | libc::CLONE_NEWIPC;
    if req.pid_namespace {
        flags |= libc::CLONE_NEWPID;
    }
    if req.network.is_some() {
        flags |= libc::CLONE_NEWNET;
    }
    let h = sys::fork_with("make the session's namespaces", flags)?;
    if h == 0 {
        drop(life_w);
        holder(
            sock,
            &mut prepared,
            req.network,
            req.landlock.clone(),
            life_r,
        );
    }
    drop(life_r);
    // H alone holds the session socket now: when H is gone, podhost's sends fail at once.
    if let Ok(null) = std::fs::File::open("/dev/null") {
        let _ = sys::dup2("stdin", null.as_raw_fd(), sock);
    }
    Ok((h, life_w))
}

/// O's loop: exits with H's status when H ends; SIGKILLs H when told to stop.
fn wait_for(h: libc::pid_t, waited: &SigSet) -> u8 {
    loop {
        match sys::wait(h, libc::WNOHANG) {
            Ok((pid, status)) if pid == h => {
                return if libc::WIFEXITED(status) {
                    libc::WEXITSTATUS(status) as u8
                } else {
                    EXIT_BROKEN
                };
            }
            Ok(_) => {}
            Err(_) => return EXIT_BROKEN,
        }
        match waited.wait() {
            Ok(Signal::SIGCHLD) => {}
            Ok(_) | Err(_) => {
                sys::kill_now(h);
                let _ = sys::wait(h, 0);
                return EXIT_BROKEN;
            }
        }
    }
}

/// H: builds the view (and the network, in its own namespace), says so, and keeps a supervisor
/// forked ahead of each command. Never returns.
fn holder(
    sock: i32,
    prepared: &mut view::Prepared,
    network: Option<SessionNetwork>,
    landlock: Option<(Landlock, bool)>,
    life: OwnedFd,
) -> ! {
    if sys::set_parent_death_signal(libc::SIGKILL).is_err() || parent_gone(&life) {
        sys::exit_now(i32::from(EXIT_BROKEN));
    }
    if let Err(e) = prepared.build() {
        report(sock, &format!("could not build the command view: {e}"));
        sys::exit_now(i32::from(EXIT_BROKEN));
    }
    let forward = match network.map(set_up_network).transpose() {
        Ok(forward) => forward.flatten(),
        Err(e) => {
            report(
                sock,
                &format!("could not set up the session's network: {e}"),
            );
            sys::exit_now(i32::from(EXIT_BROKEN));
        }
    };
    // podhost's file tools join this view (a session's disk is mounted in it alone).
    let mntns = match std::fs::File::open("/proc/self/ns/mnt") {
        Ok(f) => OwnedFd::from(f),
        Err(e) => {
            report(
                sock,
                &format!("could not open the session's mount namespace: {e}"),
            );
            sys::exit_now(i32::from(EXIT_BROKEN));
        }
    };
    sys::set_signal_ignored(libc::SIGCHLD, true);
    prepare_commands(landlock.as_ref());
    let mut handed = vec![mntns.as_raw_fd()];
    handed.extend(forward.iter().map(AsRawFd::as_raw_fd));
    if sys::send_with_fds(sock, READY, &handed).is_err() {
        sys::exit_now(0);
    }
    // podhost holds them now; the session's processes must not.
    drop((mntns, forward, life));
    keep_one_ahead(sock, &mut prepared.sockets)
}

/// H's loop: keeps one supervisor forked ahead of the next command, waiting for it on the
/// session socket with its code already mapped (see [`ahead`]), and forks the next one as soon
/// as it says it has taken a command (commands of a session may run side by side). One that
/// ended without taking one (killed, or the fork failed: the session at its process limit) is
/// replaced after a pause; one that saw the socket end ends the session. Never returns.
fn keep_one_ahead(sock: i32, sockets: &mut view::SocketWatch) -> ! {
    let code = worth_mapping(sys::read_only_segments());
    let me = nix::unistd::getpid();
    loop {
        let forked = sys::pipe().map_err(drop).and_then(|(said_r, said_w)| {
            match sys::fork_with("fork a supervisor", 0) {
                Ok(0) => {
                    drop(said_r);
                    ahead(me, sock, sockets, &code, said_w)
                }
                Ok(_) => Ok(said_r),
                Err(_) => Err(()),
            }
        });
        let said = forked.map(|said_r| sys::read_byte(said_r.as_raw_fd()));
        match said {
            Ok(Ok(Some(TAKEN))) => {}
            Ok(Ok(Some(SOCKET_ENDED))) => sys::exit_now(0),
            Ok(Ok(Some(_))) => sys::exit_now(i32::from(EXIT_BROKEN)),
            // The next one after a pause, and the session ends here if podhost is gone.
            Ok(Ok(None) | Err(_)) | Err(()) => {
                if sys::poll_now(sock, 0) & (libc::POLLHUP | libc::POLLERR) != 0 {
                    sys::exit_now(0);
                }
                std::thread::sleep(REFORK_PAUSE);
            }
        }
    }
}

/// What a supervisor says to H on its pipe: it has taken a command off the session socket, the
/// socket has ended (podhost closed the session), or it failed.
const TAKEN: u8 = b't';
const SOCKET_ENDED: u8 = b'e';
const SOCKET_FAILED: u8 = b'f';

/// The most code a supervisor maps ahead ([`sys::populate`]): `podhost-exec` and its libraries
/// are a few megabytes; the whole `podhost` (a holder started as `podhost __session`) is not
/// worth it.
const MAX_POPULATED: usize = 8 << 20;

/// The segments a supervisor maps ahead: all of them, or none when they add up to more than
/// [`MAX_POPULATED`].
fn worth_mapping(segments: Vec<(usize, usize)>) -> Vec<(usize, usize)> {
    if segments.iter().map(|(_, len)| len).sum::<usize>() > MAX_POPULATED {
        return Vec::new();
    }
    segments
}

/// How long H waits before it forks again after a supervisor that ended without taking a
/// command.
const REFORK_PAUSE: std::time::Duration = std::time::Duration::from_millis(5);

/// A supervisor forked ahead: maps its code while no command waits on it, then takes the next
/// command from the session socket, covers the host sockets bound since the last look, and
/// supervises it ([`supervisor`]). Never returns.
fn ahead(
    holder: nix::unistd::Pid,
    sock: i32,
    sockets: &mut view::SocketWatch,
    code: &[(usize, usize)],
    said: OwnedFd,
) -> ! {
    if sys::set_parent_death_signal(libc::SIGKILL).is_err() || nix::unistd::getppid() != holder {
        sys::exit_now(i32::from(EXIT_BROKEN));
    }
    sys::populate(code);
    let mut buf = [0u8; 16];
    let [ctl, out, err] = loop {
        let (n, fds) = match sys::recv_with_fds(sock, &mut buf) {
            Ok((0, _)) => {
                // podhost closed the session: the kernel ends every process in it with H.
                let _ = sys::write_all(said.as_raw_fd(), &[SOCKET_ENDED]);
                sys::exit_now(0)
            }
            Ok(got) => got,
            Err(_) => {
                let _ = sys::write_all(said.as_raw_fd(), &[SOCKET_FAILED]);
                sys::exit_now(i32::from(EXIT_BROKEN))
            }
        };
        if let (LAUNCH, Ok(fds)) = (&buf[..n], <[OwnedFd; 3]>::try_from(fds)) {
            break fds;
        }
    };
    // H forks the next one now (or, failing to, ends: H's pipe is gone with its holder).
    if sys::write_all(said.as_raw_fd(), &[TAKEN]).is_err() {
        sys::exit_now(i32::from(EXIT_BROKEN));
    }
    drop(said);
    // Sockets the host bound since the last command are covered before this one starts. This
    // process's list of covered sockets is H's, which does not learn of the covers its
    // supervisors made: a socket covered by an earlier one is a device here now, and skipped.
    for socket in sockets.scan() {
        if let Ok(c) = sys::cpath(&socket) {
            let _ = view::cover_file(&c);
        }
    }
    supervisor(ctl, out, err)
}

/// What H does once for all its commands, its view built: their Landlock ruleset, built inside
/// the view (an error is left for each command, which then builds its own and reports it); the
/// capabilities no command keeps, out of the bounding set; its own system-call filter; what each
/// command adds to it, built into the memory every supervisor is forked with.
fn prepare_commands(landlock: Option<&(Landlock, bool)>) {
    if let Some((spec, deny_network)) = landlock
        && let Ok(Some(prebuilt)) = crate::exec::confine::Prebuilt::build(spec, *deny_network)
    {
        prebuilt.keep();
    }
    crate::exec::confine::shed_bounding_set_ahead();
    // From here on the holder makes no namespace and no mount but its sockets' covers: it runs
    // under the system-call filter but those, and each command adds the rest (where the
    // kernel refuses, each command installs the whole filter, as without a holder).
    let _ = crate::exec::confine::confine_holder();
    crate::exec::confine::build_filters_ahead();
}

/// Brings up the new network namespace's loopback and, when the session has a way out, listens
/// on it for podhost (see `exec::net`).
fn set_up_network(network: SessionNetwork) -> Result<Option<OwnedFd>, StepError> {
    sys::loopback_up()?;
    let Some(port) = network.forward_port else {
        return Ok(None);
    };
    let listener =
        std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, port)).map_err(|e| {
            StepError::new(
                format!("listen on 127.0.0.1:{port}"),
                e.raw_os_error().unwrap_or(libc::EIO),
            )
        })?;
    Ok(Some(OwnedFd::from(listener)))
}

/// Whether O has already died (its end of the life pipe is closed; it never writes).
fn parent_gone(life: &OwnedFd) -> bool {
    sys::poll_now(life.as_raw_fd(), libc::POLLIN) & (libc::POLLHUP | libc::POLLERR | libc::POLLIN)
        != 0
}

/// S: the command's supervisor, inside the session. Never returns.
fn supervisor(ctl: OwnedFd, out: OwnedFd, err: OwnedFd) -> ! {
    sys::set_signal_ignored(libc::SIGCHLD, false);
    let placed = sys::dup2("control socket", ctl.as_raw_fd(), 0)
        .and_then(|()| sys::dup2("stdout", out.as_raw_fd(), 1))
        .and_then(|()| sys::dup2("stderr", err.as_raw_fd(), 2));
    if placed.is_err() {
        sys::exit_now(i32::from(EXIT_BROKEN));
    }
    drop((ctl, out, err));
    // The session's ruleset stays open for the command (see `confine::Prebuilt`).
    match crate::exec::confine::Prebuilt::kept() {
        Some(prebuilt) => sys::close_from_but(3, prebuilt.fd()),
        None => sys::close_from(3),
    }
    sys::exit_now(crate::exec::supervise::forked())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_supervisor_maps_its_code_ahead_up_to_a_bound() {
        let small = vec![(0x1000, 2 << 20), (0x40_0000, 1 << 20)];
        assert_eq!(worth_mapping(small.clone()), small);
        let at_bound = vec![(0x1000, MAX_POPULATED)];
        assert_eq!(worth_mapping(at_bound.clone()), at_bound);
        let past = vec![(0x1000, MAX_POPULATED - 4096), (0x200_0000, 8192)];
        assert_eq!(worth_mapping(past), Vec::new());
    }
}
