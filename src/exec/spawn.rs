//! podhost's side of one command: start its supervisor, hand it the request, capture its output,
//! and end it on time.
//!
//! Owns: the supervisor's process (spawned with an empty environment, the control socket as its
//! stdin and two pipes as stdout and stderr), the timeout and cancellation, and the bounds that
//! make a call return on time whatever the command does.
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
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

use super::capture::{StreamCapture, capture};
use super::protocol::{MAX_STATUS_BYTES, Request, Status};
use super::{ExecConfig, ExecError, ExecOutput, ExecRequest, SUPERVISOR_ARG, procs, reaper};

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
    req: ExecRequest,
) -> Result<ExecOutput, ExecError> {
    super::validate_command(&req.command).map_err(ExecError::InvalidCommand)?;
    if !req.cwd.is_dir() {
        return Err(ExecError::NoCwd(req.cwd));
    }
    let request = Request {
        parent: std::process::id(),
        shell: config.shell.clone(),
        command: req.command,
        cwd: req.cwd,
        // execve cannot carry a NUL; such a variable could only fail the start.
        env: config
            .env
            .build(&req.env)
            .into_iter()
            .filter(|(_, v)| !v.contains('\0'))
            .collect(),
        limits: config.limits.clone(),
        confine: req.confine,
    }
    .encode()
    .map_err(io::Error::other)?;

    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    ours.set_nonblocking(true)?;
    // Queue the request before the supervisor exists, so that it can read it at once instead of
    // waiting for podhost to be scheduled again (under load, each such wait costs milliseconds).
    // A request larger than the socket buffer is finished after the spawn.
    let sent = prefill(&ours, &request)?;
    let ctl = UnixStream::from_std(ours)?;
    let mut cmd = Command::new(&config.supervisor);
    cmd.arg(SUPERVISOR_ARG)
        .env_clear()
        .stdin(Stdio::from(OwnedFd::from(theirs)))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child =
        reaper::spawn_registered(|| cmd.spawn(), Child::id).map_err(|source| ExecError::Spawn {
            path: config.supervisor.clone(),
            source,
        })?;
    // Closes our copy of the supervisor's end of the socket, so its exit reads as end-of-file.
    drop(cmd);
    let mut sup = Supervised::new(child);
    let (Some(stdout), Some(stderr)) = (sup.stdout(), sup.stderr()) else {
        return Err(ExecError::Io(io::Error::other(
            "the supervisor has no output pipes",
        )));
    };

    let stop = CancellationToken::new();
    let captures = async {
        tokio::join!(
            capture(stdout, StreamCapture::new(req.stream_chars), stop.clone()),
            capture(stderr, StreamCapture::new(req.stream_chars), stop.clone()),
        )
    };
    tokio::pin!(captures);
    let control = control(&mut sup, ctl, &request[sent..], req.timeout, &req.cancel);
    tokio::pin!(control);
    let mut captured = None;
    let ended = loop {
        tokio::select! {
            ended = &mut control => break ended,
            c = &mut captures, if captured.is_none() => captured = Some(c),
        }
    };
    if matches!(ended, Err(ExecError::Supervisor { .. })) {
        // The supervisor died without killing the tree. If podhost is a subreaper, what it left
        // is re-parented here: kill it now, not at the next SIGCHLD (a one-shot `podhost tool`
        // would have exited by then, handing it to init).
        if nix::sys::prctl::get_child_subreaper().unwrap_or(false) {
            let _ = tokio::task::spawn_blocking(reaper::sweep).await;
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
    let (exit_code, timed_out, cancelled) = match ended? {
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
    })
}

/// Sends the request, then waits for the status, the timeout or cancellation — whichever comes
/// first — and returns once the supervisor has been reaped.
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
        }
        let _ = ctl.shutdown().await;
        let mut line = Vec::new();
        let _ = (&mut ctl)
            .take(MAX_STATUS_BYTES)
            .read_to_end(&mut line)
            .await;
        let exit = sup.wait().await;
        (line, exit)
    };
    let how = tokio::select! {
        (line, exit) = finished => return interpret(&line, exit?),
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

/// The command's end from the supervisor's status line and exit status.
fn interpret(line: &[u8], exit: ExitStatus) -> Result<Ended, ExecError> {
    match Status::decode(line) {
        Some(Status::Exited(code)) => Ok(Ended::Exited(code)),
        Some(Status::Signaled(sig)) => Ok(Ended::Exited(128 + sig)),
        // Someone other than podhost sent the supervisor SIGTERM: report it as the signal.
        Some(Status::Killed) => Ok(Ended::Exited(128 + libc::SIGTERM)),
        Some(Status::Error(message)) => Err(ExecError::Start { message }),
        None => Err(ExecError::Supervisor {
            message: format!("it ended ({exit}) without reporting how the command ended"),
        }),
    }
}

/// The supervisor process, ended and reaped however the call ends.
struct Supervised {
    child: Option<Child>,
    pid: i32,
}

impl Supervised {
    fn new(child: Child) -> Self {
        let pid = child.id().map_or(0, |p| p as i32);
        Supervised {
            child: Some(child),
            pid,
        }
    }

    fn stdout(&mut self) -> Option<tokio::process::ChildStdout> {
        self.child.as_mut()?.stdout.take()
    }

    fn stderr(&mut self) -> Option<tokio::process::ChildStderr> {
        self.child.as_mut()?.stderr.take()
    }

    /// Waits for the supervisor to exit and reaps it.
    async fn wait(&mut self) -> io::Result<ExitStatus> {
        let child = self
            .child
            .as_mut()
            .ok_or_else(|| io::Error::other("the supervisor was already reaped"))?;
        let status = child.wait().await?;
        self.child = None;
        reaper::deregister(self.pid);
        Ok(status)
    }

    /// SIGTERM (the supervisor kills the tree), then the backstop if it takes too long.
    async fn terminate(&mut self) -> io::Result<()> {
        let Some(child) = self.child.as_mut() else {
            return Ok(());
        };
        send(child, Signal::SIGTERM);
        if let Ok(status) = tokio::time::timeout(KILL_BOUND, self.wait()).await {
            return status.map(drop);
        }
        tracing::warn!(
            pid = self.pid,
            "command supervisor ignored SIGTERM; killing its tree"
        );
        if let Some(mut child) = self.child.take() {
            backstop(&mut child).await;
            reaper::deregister(self.pid);
        }
        Ok(())
    }
}

impl Drop for Supervised {
    /// The call was abandoned (its future dropped) while the supervisor ran: end it anyway.
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        send(&child, Signal::SIGTERM);
        let pid = self.pid;
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    if tokio::time::timeout(KILL_BOUND, child.wait())
                        .await
                        .is_err()
                    {
                        backstop(&mut child).await;
                    }
                    reaper::deregister(pid);
                });
            }
            // No runtime left: tokio's orphan queue reaps the child; the SIGTERM ends the tree.
            Err(_) => reaper::deregister(pid),
        }
    }
}

/// Signals the supervisor if it has not been reaped (so its pid is still its own).
fn send(child: &Child, sig: Signal) {
    if let Some(pid) = child.id() {
        let _ = kill(Pid::from_raw(pid as i32), sig);
    }
}

/// The supervisor did not finish killing the tree: stop it (so nothing below it is reaped and
/// every orphan stays re-parented to it), SIGKILL everything below it until nothing lives, then
/// SIGKILL it and reap it.
async fn backstop(child: &mut Child) {
    let Some(pid) = child.id() else {
        return;
    };
    send(child, Signal::SIGSTOP);
    for _ in 0..BACKSTOP_SWEEPS {
        let live: Vec<_> = procs::descendants(pid as i32)
            .into_iter()
            .filter(|p| !p.is_zombie())
            .collect();
        if live.is_empty() {
            break;
        }
        procs::signal_all(&live, Signal::SIGKILL);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _ = child.start_kill();
    if tokio::time::timeout(KILL_BOUND, child.wait())
        .await
        .is_err()
    {
        tracing::error!(pid, "command supervisor survived SIGKILL");
    }
}
