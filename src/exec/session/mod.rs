//! Sessions: the namespaces and view of the file system a workspace's commands share, made once
//! by a holder process and kept while the workspace's toolbox lives.
//!
//! Owns: podhost's side of a holder — starting it ([`Session::start`]), handing it each command
//! ([`Session::launch`]), restarting it when it died ([`SessionSlot`]) and killing it with the
//! toolbox. The holder itself is [`holder`]; the view it builds, [`view`]; what the host lets
//! it build, `exec::probe`.
//!
//! Why a holder and not a namespace per command: a fresh mount + PID namespace with its view
//! costs about 0.75 ms (1 ms in a user namespace) per command, past the bash tool's overhead
//! goal; made once per session and forked into, it costs nothing per command, and the holder
//! forking the supervisor also saves the supervisor's `exec` (see `benches/tools/bash.rs`).
//!
//! Invariants:
//! * A session's processes never outlive its toolbox or podhost (see [`holder`]).
//! * A holder that died (its session's memory limit, say) is started again for the next
//!   command; a command never silently runs outside the view it was meant for.
//! * The holder is spawned from an async worker thread (its parent-death signal is tied to the
//!   spawning thread, and blocking-pool threads exit when idle).
//! * A command is answered once its supervisor has reported, not once it has exited; the
//!   session's next command starts only after that exit, so no command sees an earlier one's
//!   supervisor ([`SessionSlot::settle`]).
//!
//! Non-goals: what the view holds (`Confinement::for_workspace`), the command's own supervision
//! (`supervise`, unchanged inside a session).

pub mod holder;
pub mod sockets;
pub mod view;

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::process::{Child, Command};

use tokio_util::sync::CancellationToken;

use super::net::{self, Exit};
use super::protocol::SessionRequest;
use super::{ExecError, reaper, sys};

/// How long a holder may take to build its view.
const START_BOUND: Duration = Duration::from_secs(10);
/// How long a holder asked to stop may take before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// A running holder: its socket and its process.
#[derive(Debug)]
pub struct Session {
    sock: AsyncFd<OwnedFd>,
    holder: Option<Child>,
    pid: i32,
    /// The holder's pidfd: readable once it has exited (its namespaces are then going away,
    /// even if the socket has not hung up yet).
    pidfd: Option<OwnedFd>,
    /// Stops serving the session's way out (see `exec::net`) when the session goes.
    exit: CancellationToken,
    /// The holder's mount namespace: where the session's files are as its commands see them.
    mntns: Option<OwnedFd>,
}

impl Session {
    /// Starts a holder (the `supervisor` binary, as `__session`) for `req` and waits until it has
    /// built the view, or says why it could not; then serves the session's way out as `exit`
    /// says, when it has one.
    pub async fn start(
        supervisor: &Path,
        req: &SessionRequest,
        exit: Option<&Exit>,
    ) -> Result<Session, ExecError> {
        if crate::failpoint_fails!("sandbox.session_refused") {
            return Err(ExecError::Session {
                message: "refused (the failpoint sandbox.session_refused)".into(),
            });
        }
        let mut session = Session::spawn(supervisor, req)?;
        let mut answer = [0u8; 4096];
        let got = tokio::time::timeout(START_BOUND, session.recv(&mut answer)).await;
        let (n, fds) = match got {
            Ok(Ok(got)) => got,
            Ok(Err(e)) => return Err(ExecError::Io(e)),
            Err(_) => {
                return Err(ExecError::Session {
                    message: format!("it did not build the view within {START_BOUND:?}"),
                });
            }
        };
        let answer = &answer[..n];
        if answer == holder::READY {
            let mut fds = fds.into_iter();
            session.mntns = fds.next();
            match (fds.next(), exit, req.network.and_then(|n| n.forward_port)) {
                (Some(listener), Some(exit), Some(_)) => {
                    let budget = net::Budget::process();
                    net::serve(listener, exit.clone(), budget, session.exit.clone())?;
                }
                (None, _, None) if session.mntns.is_some() => {}
                _ => {
                    return Err(ExecError::Session {
                        message: "it answered ready without what it was asked to make".to_owned(),
                    });
                }
            }
            return Ok(session);
        }
        let message = match std::str::from_utf8(answer) {
            Ok(text) if text.starts_with(holder::FAILED_PREFIX) => {
                text[holder::FAILED_PREFIX.len()..].to_owned()
            }
            _ if n == 0 => {
                let status = match session.holder.as_mut() {
                    Some(c) => c.wait().await.map(|s| s.to_string()).unwrap_or_default(),
                    None => String::new(),
                };
                format!("it ended ({status}) before building the view")
            }
            _ => "it answered something else than ready".to_owned(),
        };
        Err(ExecError::Session { message })
    }

    /// Spawns the holder with `req` already queued on its socket.
    fn spawn(supervisor: &Path, req: &SessionRequest) -> Result<Session, ExecError> {
        let (ours, theirs) = sys::seqpacket_pair()?;
        let request = serde_json::to_vec(req).map_err(io::Error::other)?;
        // Queued before the holder exists, so it reads it at once.
        sys::send_with_fds(ours.as_raw_fd(), &request, &[])?;
        set_nonblocking(&ours)?;
        let mut cmd = Command::new(supervisor);
        cmd.arg(holder::SESSION_ARG)
            .env_clear()
            .stdin(Stdio::from(theirs))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = reaper::spawn_registered(|| cmd.spawn(), Child::id).map_err(|source| {
            ExecError::Spawn {
                path: supervisor.to_path_buf(),
                source,
            }
        })?;
        drop(cmd);
        let pid = child.id().map_or(0, |p| p as i32);
        Ok(Session {
            sock: sys::async_fd(ours, Interest::READABLE | Interest::WRITABLE)?,
            holder: Some(child),
            pid,
            pidfd: sys::pidfd_open(pid).ok(),
            exit: CancellationToken::new(),
            mntns: None,
        })
    }

    async fn recv(&self, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
        loop {
            let mut guard = self.sock.readable().await?;
            match guard.try_io(|fd| sys::recv_with_fds(fd.as_raw_fd(), buf)) {
                Ok(got) => return got,
                Err(_would_block) => continue,
            }
        }
    }

    /// Hands the holder one command: its control socket and output pipes. An error means the
    /// holder is gone.
    pub async fn launch(&self, fds: [&OwnedFd; 3]) -> io::Result<()> {
        let raw = fds.map(AsRawFd::as_raw_fd);
        loop {
            let mut guard = self.sock.writable().await?;
            match guard.try_io(|fd| sys::send_with_fds(fd.as_raw_fd(), holder::LAUNCH, &raw)) {
                Ok(sent) => return sent,
                Err(_would_block) => continue,
            }
        }
    }

    /// A descriptor of the session's mount namespace, for a thread to join
    /// ([`enter_mount_namespace`]).
    pub fn mount_namespace(&self) -> io::Result<OwnedFd> {
        match &self.mntns {
            Some(ns) => ns.try_clone(),
            None => Err(io::Error::other(
                "the session holder gave no mount namespace",
            )),
        }
    }

    /// Whether the holder has exited or hung up (its session is gone, or going).
    fn is_gone(&self) -> bool {
        let exited = self
            .pidfd
            .as_ref()
            .is_some_and(|fd| sys::poll_now(fd.as_raw_fd(), libc::POLLIN) != 0);
        let events = sys::poll_now(self.sock.as_raw_fd(), 0);
        exited || events & (libc::POLLHUP | libc::POLLERR) != 0
    }
}

impl Drop for Session {
    /// The toolbox is gone: so is the session, and with it every process in it. The holder is
    /// asked to stop (SIGTERM: O SIGKILLs H, pid 1 of the session, and reaps it), and killed
    /// after [`STOP_GRACE`] if it has not. Killing O outright would leave H, dying, to
    /// re-parent to podhost as an adopted orphan, whose reaping walks all of `/proc`
    /// (`reaper::sweep_all`) at every session's end.
    fn drop(&mut self) {
        self.exit.cancel();
        let Some(mut child) = self.holder.take() else {
            return;
        };
        let pid = self.pid;
        match tokio::runtime::Handle::try_current() {
            Ok(rt) if pid > 0 => {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGTERM,
                );
                rt.spawn(async move {
                    if tokio::time::timeout(STOP_GRACE, child.wait())
                        .await
                        .is_err()
                    {
                        let _ = child.start_kill();
                        let _ = child.wait().await;
                    }
                    reaper::deregister(pid);
                });
            }
            Ok(rt) => {
                let _ = child.start_kill();
                rt.spawn(async move {
                    let _ = child.wait().await;
                    reaper::deregister(pid);
                });
            }
            Err(_) => {
                let _ = child.start_kill();
                reaper::deregister(pid);
            }
        }
    }
}

/// A workspace's session, started at its first command and again if its holder died.
#[derive(Debug)]
pub struct SessionSlot {
    supervisor: PathBuf,
    request: SessionRequest,
    /// What serves the session's way out, when its network has one.
    exit: Option<Exit>,
    current: tokio::sync::Mutex<Option<Arc<Session>>>,
    /// The pidfds of supervisors that reported their command's end and are exiting.
    settling: std::sync::Mutex<Vec<OwnedFd>>,
}

impl SessionSlot {
    pub fn new(supervisor: PathBuf, request: SessionRequest, exit: Option<Exit>) -> Self {
        SessionSlot {
            supervisor,
            request,
            exit,
            current: tokio::sync::Mutex::new(None),
            settling: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Keeps the pidfd of a supervisor that reported its command's end: it only exits now (its
    /// command's tree is dead, its output let go), and the next command waits for that (see
    /// [`SessionSlot::launch`]), so no command sees an earlier one's supervisor among its
    /// session's processes or in its limits.
    pub(crate) fn settle(&self, pidfd: OwnedFd) {
        if sys::poll_now(pidfd.as_raw_fd(), libc::POLLIN) == 0 {
            lock(&self.settling).push(pidfd);
        }
    }

    /// Waits until every supervisor [`settle`](Self::settle) kept has exited; one still there
    /// after `grace` (it reported, so nothing of its command is left) is killed.
    async fn settled(&self, grace: Duration) {
        let pending = std::mem::take(&mut *lock(&self.settling));
        for pidfd in pending {
            if sys::poll_now(pidfd.as_raw_fd(), libc::POLLIN) != 0 {
                continue;
            }
            let Ok(fd) = sys::async_fd(pidfd, Interest::READABLE) else {
                continue;
            };
            if tokio::time::timeout(grace, fd.readable()).await.is_err() {
                tracing::warn!("a command's supervisor did not exit after reporting; killing it");
                sys::pidfd_send_signal(fd.get_ref(), libc::SIGKILL);
                let _ = tokio::time::timeout(grace, fd.readable()).await;
            }
        }
    }

    /// The session's request when a single-threaded process can build its view in itself, as
    /// `podhost tool bash` does for its one command (see `exec::oneshot`): a view alone — no user
    /// or PID namespace (podhost is root), no network, disk or cgroup of the session's own.
    pub(crate) fn view_only(&self) -> Option<&SessionRequest> {
        let r = &self.request;
        (r.userns.is_none()
            && !r.pid_namespace
            && r.network.is_none()
            && r.disk.is_none()
            && r.overlay.is_none()
            && r.cgroup_procs.is_empty()
            && self.exit.is_none())
        .then_some(r)
    }

    /// The pid of the running holder (podhost's child), if one runs: for diagnostics and tests.
    pub fn holder_pid(&self) -> Option<i32> {
        let current = self.current.try_lock().ok()?;
        current.as_ref().filter(|s| !s.is_gone()).map(|s| s.pid)
    }

    /// Forgets `session` when its holder is gone (the next launch starts a new one); whether it
    /// was.
    pub async fn discard_if_gone(&self, session: &Arc<Session>) -> bool {
        if !session.is_gone() {
            return false;
        }
        let mut current = self.current.lock().await;
        if current.as_ref().is_some_and(|s| Arc::ptr_eq(s, session)) {
            *current = None;
        }
        true
    }

    /// The running session, started (or restarted) first when it is not.
    pub async fn running(&self) -> Result<Arc<Session>, ExecError> {
        let mut current = self.current.lock().await;
        if let Some(s) = current.as_ref().filter(|s| !s.is_gone()) {
            return Ok(s.clone());
        }
        let started =
            Arc::new(Session::start(&self.supervisor, &self.request, self.exit.as_ref()).await?);
        *current = Some(started.clone());
        Ok(started)
    }

    /// Whether the session's files live in its mount namespace alone (a disk of its own, or
    /// a workspace that is an overlay of a template), so that the file tools must join it.
    pub fn files_inside(&self) -> bool {
        self.request.disk.is_some() || self.request.overlay.is_some()
    }

    /// The image of the session's own disk, when it has one.
    pub fn disk_image(&self) -> Option<&std::path::Path> {
        self.request.disk.as_ref().map(|d| d.image.as_path())
    }

    /// Hands the command's descriptors to the session's holder, starting (or restarting) it;
    /// the session it went to.
    pub async fn launch(&self, fds: [&OwnedFd; 3]) -> Result<Arc<Session>, ExecError> {
        self.settled(STOP_GRACE).await;
        for attempt in 0..2 {
            let session = self.running().await?;
            match session.launch(fds).await {
                Ok(()) => return Ok(session),
                Err(e) if attempt == 0 => {
                    tracing::warn!(error = %e, "the session holder is gone; starting it again");
                    let mut current = self.current.lock().await;
                    if current.as_ref().is_some_and(|s| Arc::ptr_eq(s, &session)) {
                        *current = None;
                    }
                }
                Err(e) => return Err(ExecError::Io(e)),
            }
        }
        Err(ExecError::Session {
            message: "it could not be started".to_owned(),
        })
    }
}

/// Moves the calling thread (a fresh one, which ends with its call) into a session's mount
/// namespace: see [`sys::enter_mount_namespace`].
pub fn enter_mount_namespace(ns: &OwnedFd) -> io::Result<()> {
    sys::enter_mount_namespace(ns)
}

/// `m` locked, whether or not a thread panicked holding it (a list of descriptors stays whole).
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    let flags = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFL)?;
    let flags = nix::fcntl::OFlag::from_bits_retain(flags) | nix::fcntl::OFlag::O_NONBLOCK;
    nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFL(flags))?;
    Ok(())
}

/// Receives a forked supervisor's pidfd, its first message on the control socket; `None` when
/// the socket closed first (the supervisor never started).
pub(super) async fn recv_pidfd(ctl: &tokio::net::UnixStream) -> io::Result<Option<OwnedFd>> {
    let mut mark = [0u8; 1];
    loop {
        ctl.readable().await?;
        match ctl.try_io(Interest::READABLE, || {
            sys::recv_with_fds(ctl.as_raw_fd(), &mut mark)
        }) {
            Ok((0, _)) => return Ok(None),
            Ok((_, mut fds)) if &mark[..] == super::supervise::PIDFD_MARK => {
                return Ok(fds.pop());
            }
            Ok(_) => {
                return Err(io::Error::other(
                    "the supervisor's first message was not its pidfd",
                ));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot() -> SessionSlot {
        let request = SessionRequest {
            parent: std::process::id(),
            userns: None,
            pid_namespace: false,
            cgroup_procs: Vec::new(),
            network: None,
            disk: None,
            overlay: None,
            view: super::super::protocol::View::default(),
            landlock: None,
        };
        SessionSlot::new(PathBuf::from("/nonexistent"), request, None)
    }

    /// A process that exits after `secs`, and its pidfd.
    fn exits_after(secs: &str) -> (std::process::Child, OwnedFd) {
        let child = std::process::Command::new("sleep")
            .arg(secs)
            .spawn()
            .unwrap();
        let pidfd = sys::pidfd_open(child.id() as i32).unwrap();
        (child, pidfd)
    }

    #[tokio::test]
    async fn the_next_command_waits_for_a_reported_supervisor_to_exit() {
        let slot = slot();
        let (mut child, pidfd) = exits_after("0.3");
        slot.settle(pidfd);
        assert_eq!(lock(&slot.settling).len(), 1);
        slot.settled(Duration::from_secs(10)).await;
        // Exited (a zombie until reaped here): `settled` returned no sooner.
        assert!(child.try_wait().unwrap().is_some());
        assert!(lock(&slot.settling).is_empty());
    }

    #[tokio::test]
    async fn a_supervisor_gone_already_is_not_kept_and_one_that_stays_is_killed() {
        let slot = slot();
        let (mut gone, pidfd) = exits_after("0");
        let _ = gone.wait();
        slot.settle(pidfd);
        assert!(lock(&slot.settling).is_empty());
        let (mut stuck, pidfd) = exits_after("60");
        slot.settle(pidfd);
        slot.settled(Duration::from_millis(200)).await;
        let status = stuck.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
    }
}
