//! podhost's side of one command: start its supervisor, hand it the request, capture its output,
//! and end it on time.
//!
//! Owns: the supervisor's process (spawned with an empty environment, the control socket as its
//! stdin and two pipes as stdout and stderr — or, in a session, forked by the session's holder
//! with those three descriptors, and known to podhost by the pidfd it sends first), the timeout
//! and cancellation, and the bounds that make a call return on time whatever the command does.
//!
//! Invariants:
//! * The call returns within `timeout` + [`KILL_BOUND`] + [`DRAIN_BOUND`] (and a little work),
//!   even if the supervisor hangs or something still holds the pipes.
//! * On timeout or cancellation the supervisor gets SIGTERM and kills the tree itself; if it has
//!   not exited after [`KILL_BOUND`], it is stopped, every descendant found below it is SIGKILLed,
//!   and then it is.
//! * A call whose future is dropped still ends its command: the guard SIGTERMs the supervisor
//!   and a task reaps it.
//! * The supervisor is spawned from the calling task's thread (an async worker, never a
//!   `spawn_blocking` thread): `PR_SET_PDEATHSIG` fires when the *thread* that forked it exits.
//!
//! Non-goals: what the model sees (the bash tool shapes it), where commands may write (confine).

use std::io;
use std::os::fd::OwnedFd;
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

use super::capture::{OutStream, StreamCapture, capture};
use super::protocol::{MAX_STATUS_BYTES, Request, Status};
use super::session::SessionSlot;
use super::{ExecConfig, ExecError, ExecOutput, ExecRequest, SUPERVISOR_ARG, procs, reaper, sys};

/// How long the supervisor may take to kill the tree after SIGTERM before podhost does it.
const KILL_BOUND: Duration = Duration::from_secs(3);
/// How long the pipes may stay open after the supervisor has exited (only an escaped process
/// could hold them) before podhost stops reading.
const DRAIN_BOUND: Duration = Duration::from_secs(2);
/// SIGKILL sweeps podhost makes below a stopped supervisor before giving up.
const BACKSTOP_SWEEPS: usize = 50;

/// Exit code reported for a command that timed out (as `timeout(1)` does).
pub const EXIT_TIMED_OUT: i32 = 124;
/// Exit code reported for a cancelled command (as a shell does for SIGINT).
pub const EXIT_CANCELLED: i32 = 130;

/// How the supervisor's watch ended.
enum Ended {
    Exited(i32),
    TimedOut,
    Cancelled,
}

pub(super) async fn execute(
    config: &ExecConfig,
    session: Option<&SessionSlot>,
    req: ExecRequest,
) -> Result<ExecOutput, ExecError> {
    let request = request(config, &req)?.encode().map_err(io::Error::other)?;

    let (ctl, sent, mut sup, stdout, stderr) = match session {
        None => {
            let (ours, theirs, sent) = control_pair(&request)?;
            let (sup, stdout, stderr) = start_supervisor(config, theirs)?;
            (ours, sent, sup, stdout, stderr)
        }
        Some(slot) => launch_in_session(slot, &request).await?,
    };

    let stop = CancellationToken::new();
    let captures = async {
        tokio::join!(
            capture(
                stdout,
                StreamCapture::new(req.stream_chars),
                stop.clone(),
                req.live.as_deref().map(|l| (l, OutStream::Stdout)),
            ),
            capture(
                stderr,
                StreamCapture::new(req.stream_chars),
                stop.clone(),
                req.live.as_deref().map(|l| (l, OutStream::Stderr)),
            ),
        )
    };
    tokio::pin!(captures);
    let mut captured = None;
    let ended = {
        let control = control(&mut sup, ctl, &request[sent..], req.timeout, &req.cancel);
        tokio::pin!(control);
        loop {
            tokio::select! {
                ended = &mut control => break ended,
                c = &mut captures, if captured.is_none() => captured = Some(c),
            }
        }
    };
    if matches!(ended, Err(ExecError::Supervisor { .. })) {
        // The supervisor died without killing the tree. If podhost is a subreaper, what it left
        // is re-parented here: kill it now, not at the next SIGCHLD (a one-shot `podhost tool`
        // would have exited by then, handing it to init).
        if nix::sys::prctl::get_child_subreaper().unwrap_or(false) {
            let _ = tokio::task::spawn_blocking(reaper::sweep_all).await;
        }
    }
    let (out, err) = match captured {
        Some(c) => c,
        None => match tokio::time::timeout(DRAIN_BOUND, &mut captures).await {
            Ok(c) => c,
            Err(_) => {
                tracing::warn!("command output still open after its supervisor exited");
                stop.cancel();
                captures.await
            }
        },
    };
    // A forked supervisor that reported ends by itself; its session waits for it before the
    // next command instead of this call waiting for its exit (see `SessionSlot::settle`).
    if let (Some(slot), Some(pidfd)) = (session, sup.reported()) {
        slot.settle(pidfd);
    }
    output(ended?, out, err)
}

/// The call's result: how the command ended and what it wrote.
fn output(ended: Ended, out: StreamCapture, err: StreamCapture) -> Result<ExecOutput, ExecError> {
    let (exit_code, timed_out, cancelled) = match ended {
        Ended::Exited(code) => (code, false, false),
        Ended::TimedOut => (EXIT_TIMED_OUT, true, false),
        Ended::Cancelled => (EXIT_CANCELLED, false, true),
    };
    Ok(ExecOutput {
        exit_code,
        stdout: out.finish(),
        stderr: err.finish(),
        timed_out,
        cancelled,
        limit_note: None,
    })
}

/// The supervisor's request for `req`, checked: a command `exec` can start, a working directory
/// that exists. `podhost tool`, which supervises its one command itself, builds the same.
pub(super) fn request(config: &ExecConfig, req: &ExecRequest) -> Result<Request, ExecError> {
    super::validate_command(&req.command).map_err(ExecError::InvalidCommand)?;
    if !req.cwd.is_dir() {
        return Err(ExecError::NoCwd(req.cwd.clone()));
    }
    Ok(Request {
        parent: std::process::id(),
        shell: config.shell.clone(),
        command: req.command.clone(),
        cwd: req.cwd.clone(),
        // execve cannot carry a NUL; such a variable could only fail the start.
        env: config
            .env
            .build(&req.env)
            .into_iter()
            .filter(|(_, v)| !v.contains('\0'))
            .collect(),
        limits: {
            let mut limits = config.limits.clone();
            if let Some(cap) = req.file_size_cap {
                limits.file_size = Some(limits.file_size.map_or(cap, |f| f.min(cap)));
            }
            limits
        },
        confine: req.confine.clone(),
    })
}

/// An output pipe, as podhost reads it.
type Stream = Box<dyn AsyncRead + Unpin + Send>;

/// Spawns the supervisor binary with `ctl` as its stdin.
fn start_supervisor(
    config: &ExecConfig,
    ctl: std::os::unix::net::UnixStream,
) -> Result<(Supervised, Stream, Stream), ExecError> {
    let mut cmd = Command::new(&config.supervisor);
    cmd.arg(SUPERVISOR_ARG)
        .env_clear()
        .stdin(Stdio::from(OwnedFd::from(ctl)))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child =
        reaper::spawn_registered(|| cmd.spawn(), Child::id).map_err(|source| ExecError::Spawn {
            path: config.supervisor.clone(),
            source,
        })?;
    // Closes our copy of the supervisor's end of the socket, so its exit reads as end-of-file.
    drop(cmd);
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(ExecError::Io(io::Error::other(
            "the supervisor has no output pipes",
        )));
    };
    Ok((Supervised::child(child), Box::new(stdout), Box::new(stderr)))
}

/// The control socket pair of one command, the request queued on podhost's end: (podhost's end,
/// the supervisor's end, the bytes of the request already queued).
fn control_pair(request: &[u8]) -> io::Result<(UnixStream, std::os::unix::net::UnixStream, usize)> {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    ours.set_nonblocking(true)?;
    // Queue the request before the supervisor exists, so that it can read it at once instead of
    // waiting for podhost to be scheduled again (under load, each such wait costs milliseconds).
    // A request larger than the socket buffer is finished after the spawn.
    let sent = prefill(&ours, request)?;
    if sent == request.len() {
        // The whole request is queued: its end-of-file goes with it, so the supervisor decodes
        // it on its first reads rather than waiting for podhost to be scheduled to say so.
        ours.shutdown(std::net::Shutdown::Write)?;
    }
    Ok((UnixStream::from_std(ours)?, theirs, sent))
}

/// A supervisor started inside a session: podhost's end of its control socket, the bytes of the
/// request already queued there, the supervisor, and its output pipes.
type Launched = (UnixStream, usize, Supervised, Stream, Stream);

/// Hands the command to its session's holder, whose supervisor forked ahead takes it inside the
/// session; the supervisor's pidfd is its first message on the control socket. A holder that
/// died just as the command was handed over is started again, once.
async fn launch_in_session(slot: &SessionSlot, request: &[u8]) -> Result<Launched, ExecError> {
    let mut retried = false;
    loop {
        let (ctl, theirs, sent) = control_pair(request)?;
        let (out_r, out_w) = sys::pipe()?;
        let (err_r, err_w) = sys::pipe()?;
        let theirs = OwnedFd::from(theirs);
        let session = slot.launch([&theirs, &out_w, &err_w]).await?;
        // Ours go: the pipes end when the command's copies do, the socket when the
        // supervisor's does.
        drop((theirs, out_w, err_w));
        let pidfd = tokio::time::timeout(KILL_BOUND, super::session::recv_pidfd(&ctl))
            .await
            .map_err(|_| ExecError::Supervisor {
                message: format!("the session did not start it within {KILL_BOUND:?}"),
            })??;
        let Some(pidfd) = pidfd else {
            if !retried && slot.discard_if_gone(&session).await {
                retried = true;
                continue;
            }
            return Err(ExecError::Supervisor {
                message: "the session could not start it (at its process limit?)".to_owned(),
            });
        };
        let stdout = tokio::net::unix::pipe::Receiver::from_owned_fd(out_r)?;
        let stderr = tokio::net::unix::pipe::Receiver::from_owned_fd(err_r)?;
        return Ok((
            ctl,
            sent,
            Supervised::pidfd(pidfd)?,
            Box::new(stdout),
            Box::new(stderr),
        ));
    }
}

/// Sends the request, then waits for the status, the timeout or cancellation — whichever comes
/// first — and returns once the supervisor has been reaped, or, for one a session holder forked
/// that reported, once it has reported: all it does after is exit (its output pipes let go, every
/// descendant dead), which costs it the teardown of a forked address space, a few hundred
/// microseconds this call's answer need not wait for.
async fn control(
    sup: &mut Supervised,
    mut ctl: UnixStream,
    unsent: &[u8],
    timeout: Duration,
    cancel: &CancellationToken,
) -> Result<Ended, ExecError> {
    let finished = async {
        // A supervisor that died at once fails this write; its missing status says so below.
        if !unsent.is_empty() {
            let _ = ctl.write_all(unsent).await;
            let _ = ctl.shutdown().await;
        }
        let line = read_status(&mut ctl).await;
        let exit = if sup.is_forked() && Status::decode(&line).is_some() {
            Ok(None)
        } else {
            sup.wait().await
        };
        (line, exit)
    };
    let how = tokio::select! {
        (line, exit) = finished => return interpret(&line, &exit?),
        _ = tokio::time::sleep(timeout) => Ended::TimedOut,
        _ = cancel.cancelled() => Ended::Cancelled,
    };
    crate::floor::metrics::command_killed(if matches!(how, Ended::TimedOut) {
        "timeout"
    } else {
        "cancel"
    });
    sup.terminate().await?;
    Ok(how)
}

/// The supervisor's status line: what it wrote up to its newline, or up to its end (none, when
/// it died without reporting), bounded by [`MAX_STATUS_BYTES`].
async fn read_status(ctl: &mut UnixStream) -> Vec<u8> {
    let mut line = Vec::with_capacity(64);
    let mut buf = [0u8; 512];
    while (line.len() as u64) < MAX_STATUS_BYTES {
        match ctl.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                line.extend_from_slice(&buf[..n]);
                if buf[..n].contains(&b'\n') {
                    break;
                }
            }
        }
    }
    line
}

/// Writes as much of `request` as the (non-blocking) socket takes now; returns how much.
fn prefill(sock: &std::os::unix::net::UnixStream, request: &[u8]) -> io::Result<usize> {
    use std::io::Write;
    let mut sent = 0;
    while sent < request.len() {
        match (&*sock).write(&request[sent..]) {
            Ok(0) => break,
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(sent)
}

/// The command's end from the supervisor's status line and how the supervisor ended (`None`
/// for a supervisor a session holder forked, whose exit status only the holder reaps).
fn interpret(line: &[u8], exit: &Option<String>) -> Result<Ended, ExecError> {
    match Status::decode(line) {
        Some(Status::Exited(code)) => Ok(Ended::Exited(code)),
        Some(Status::Signaled(sig)) => Ok(Ended::Exited(128 + sig)),
        // Someone other than podhost sent the supervisor SIGTERM: report it as the signal.
        Some(Status::Killed) => Ok(Ended::Exited(128 + libc::SIGTERM)),
        Some(Status::Error(message)) => Err(ExecError::Start { message }),
        None => Err(ExecError::Supervisor {
            message: match exit {
                Some(exit) => format!("it ended ({exit}) without reporting how the command ended"),
                None => "it ended without reporting how the command ended".to_owned(),
            },
        }),
    }
}

/// The supervisor process, ended (and, when it is podhost's child, reaped) however the call
/// ends: podhost's child, or a supervisor a session holder forked, known by its pidfd.
struct Supervised {
    proc: Option<Proc>,
}

enum Proc {
    Child { child: Child, pid: i32 },
    Pidfd(AsyncFd<OwnedFd>),
}

impl Supervised {
    fn child(child: Child) -> Self {
        let pid = child.id().map_or(0, |p| p as i32);
        Supervised {
            proc: Some(Proc::Child { child, pid }),
        }
    }

    fn pidfd(fd: OwnedFd) -> io::Result<Self> {
        Ok(Supervised {
            proc: Some(Proc::Pidfd(sys::async_fd(
                fd,
                tokio::io::Interest::READABLE,
            )?)),
        })
    }

    /// Whether a session holder forked the supervisor (podhost knows it by its pidfd).
    fn is_forked(&self) -> bool {
        matches!(self.proc, Some(Proc::Pidfd(_)))
    }

    /// The pidfd of a forked supervisor not yet seen to exit, taken out of this guard (which then
    /// signals nothing when dropped): see [`SessionSlot::settle`].
    fn reported(&mut self) -> Option<OwnedFd> {
        if !self.is_forked() {
            return None;
        }
        match self.proc.take() {
            Some(Proc::Pidfd(fd)) => Some(fd.into_inner()),
            other => {
                self.proc = other;
                None
            }
        }
    }

    /// Waits for the supervisor to exit (and reaps it when it is podhost's child); how it ended,
    /// when podhost can know (its own child's status).
    async fn wait(&mut self) -> io::Result<Option<String>> {
        let ended = match self.proc.as_mut() {
            None => return Err(io::Error::other("the supervisor was already reaped")),
            Some(Proc::Child { child, pid }) => {
                let status = child.wait().await?;
                reaper::deregister(*pid);
                Some(status.to_string())
            }
            Some(Proc::Pidfd(fd)) => {
                // A pidfd turns readable when its process has exited.
                let _ready = fd.readable().await?;
                None
            }
        };
        self.proc = None;
        Ok(ended)
    }

    /// SIGTERM (the supervisor kills the tree), then the backstop if it takes too long.
    async fn terminate(&mut self) -> io::Result<()> {
        let Some(proc) = self.proc.as_ref() else {
            return Ok(());
        };
        proc.send(Signal::SIGTERM);
        if let Ok(status) = tokio::time::timeout(KILL_BOUND, self.wait()).await {
            return status.map(drop);
        }
        if let Some(proc) = self.proc.take() {
            tracing::warn!(
                pid = proc.pid(),
                "command supervisor ignored SIGTERM; killing its tree"
            );
            proc.backstop().await;
        }
        Ok(())
    }
}

impl Proc {
    /// The supervisor's pid in podhost's PID namespace, while it has not been reaped.
    fn pid(&self) -> Option<i32> {
        match self {
            Proc::Child { child, .. } => child.id().map(|p| p as i32),
            Proc::Pidfd(fd) => sys::pidfd_pid(fd.get_ref()),
        }
    }

    /// Signals the supervisor if it is still that process (a child not reaped; a pidfd always
    /// names its own process).
    fn send(&self, sig: Signal) {
        match self {
            Proc::Child { child, .. } => {
                if let Some(pid) = child.id() {
                    let _ = kill(Pid::from_raw(pid as i32), sig);
                }
            }
            Proc::Pidfd(fd) => {
                sys::pidfd_send_signal(fd.get_ref(), sig as i32);
            }
        }
    }

    /// The supervisor did not finish killing the tree: stop it (so nothing below it is reaped
    /// and every orphan stays re-parented to it), SIGKILL everything below it until nothing
    /// lives, then SIGKILL it (and reap it, when it is podhost's child).
    async fn backstop(mut self) {
        let pid = self.pid();
        self.send(Signal::SIGSTOP);
        if let Some(pid) = pid {
            for _ in 0..BACKSTOP_SWEEPS {
                let live: Vec<_> = procs::descendants(pid)
                    .into_iter()
                    .filter(|p| !p.is_zombie())
                    .collect();
                if live.is_empty() {
                    break;
                }
                procs::signal_all(&live, Signal::SIGKILL);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        self.send(Signal::SIGKILL);
        let ended = match &mut self {
            Proc::Child { child, pid } => {
                let ended = tokio::time::timeout(KILL_BOUND, child.wait()).await.is_ok();
                reaper::deregister(*pid);
                ended
            }
            Proc::Pidfd(fd) => tokio::time::timeout(KILL_BOUND, fd.readable())
                .await
                .is_ok(),
        };
        if !ended {
            tracing::error!(?pid, "command supervisor survived SIGKILL");
        }
    }
}

impl Drop for Supervised {
    /// The call was abandoned (its future dropped) while the supervisor ran: end it anyway.
    fn drop(&mut self) {
        let Some(proc) = self.proc.take() else {
            return;
        };
        proc.send(Signal::SIGTERM);
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    let mut sup = Supervised { proc: Some(proc) };
                    if tokio::time::timeout(KILL_BOUND, sup.wait()).await.is_err()
                        && let Some(proc) = sup.proc.take()
                    {
                        proc.backstop().await;
                    }
                });
            }
            // No runtime left: tokio's orphan queue reaps a child; the SIGTERM ends the tree.
            Err(_) => {
                if let Proc::Child { pid, .. } = proc {
                    reaper::deregister(pid);
                }
            }
        }
    }
}
