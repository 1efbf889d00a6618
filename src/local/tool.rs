//! `podhost tool NAME --input JSON`: one tool call in a local workspace, its outcome as JSON on
//! stdout.
//!
//! Exit codes: 0 when the tool ran (its outcome may be a failure: a command's non-zero exit, no
//! match), 2 when the input was refused before it could run, 130 or 143 when a signal stopped
//! it (the command's whole process tree killed; the outcome so far is still printed).
//!
//! A `bash` call runs without an async runtime, its command's supervisor forked from podhost
//! ([`Call::run_here`], see `exec::oneshot`): no second program to load and no control socket.
//! The file tools (and a command in a session
//! whose holder podhost cannot be itself) run on a current-thread runtime ([`Call::run`]).

use std::io::{Read, Write};
use std::path::PathBuf;

use nix::sys::signal::Signal;
use tokio_util::sync::CancellationToken;

use super::{LocalEnv, LocalError, Stop, StopSignal, exit_code, toolbox, withheld_note};
use crate::exec::ExecSettings;
use crate::floor::codes::exit;
use crate::tools::{CallContext, ToolName, ToolOutcome, Toolbox, codes};

/// `podhost tool`'s configuration.
#[derive(Clone, Debug)]
pub struct ToolConfig {
    /// The tool.
    pub name: ToolName,
    /// The tool's input as JSON text, or `-` for stdin.
    pub input: String,
    /// The workspace directory.
    pub workspace: PathBuf,
    pub env: LocalEnv,
    pub exec: ExecSettings,
}

/// The most bytes of input read from stdin.
const MAX_INPUT_BYTES: u64 = 16 << 20;

/// A `podhost tool` call ready to run: the tool, its input and the workspace's toolbox.
pub struct Call {
    name: ToolName,
    input: serde_json::Value,
    toolbox: Toolbox,
}

/// Checks the tool's name and input (read from stdin for `-`) and builds the workspace's
/// toolbox; says on stderr which `--env` variables are not set. Needs no async runtime.
pub fn prepare(args: ToolConfig) -> Result<Call, LocalError> {
    let name = args.name;
    let raw = if args.input == "-" {
        let mut s = String::new();
        std::io::stdin()
            .take(MAX_INPUT_BYTES)
            .read_to_string(&mut s)
            .map_err(|source| LocalError::Io {
                what: "reading the input from stdin".into(),
                source,
            })?;
        s
    } else {
        args.input
    };
    let input: serde_json::Value = match serde_json::from_str(&raw) {
        Ok(v @ serde_json::Value::Object(_)) => v,
        Ok(_) => return Err(LocalError::Usage("--input must be a JSON object".into())),
        Err(e) => {
            return Err(LocalError::Usage(format!("--input is not valid JSON: {e}")));
        }
    };
    let (toolbox, withheld) = toolbox(&args.workspace, &args.exec, &args.env)?;
    if !withheld.unset.is_empty()
        && let Some(note) = withheld_note(&crate::exec::env::Withheld {
            credentials: Vec::new(),
            unset: withheld.unset.clone(),
        })
    {
        eprintln!("podhost tool: {note}");
    }
    Ok(Call {
        name,
        input,
        toolbox,
    })
}

impl Call {
    /// Runs a `bash` call under a supervisor forked from this process, without an async
    /// runtime (see `exec::oneshot`); the exit code. The caller must be single-threaded: the
    /// stop signals are blocked and read here. `None` for any other call, or when the
    /// workspace's commands run in a session: then use [`run`](Self::run).
    ///
    /// SIGINT and SIGTERM end the command (its whole tree killed) and the call with 130 or 143,
    /// the outcome so far printed; SIGHUP and SIGQUIT kill the tree, then end podhost as they
    /// would have without it.
    pub fn run_here(&self) -> Option<Result<i32, LocalError>> {
        if self.name != ToolName::Bash {
            return None;
        }
        let ctx = CallContext::new(CancellationToken::new());
        let (outcome, stopped_by) = self.toolbox.bash_here(&self.input, &ctx)?;
        let stop = match stopped_by {
            None => None,
            Some(Signal::SIGINT) => Some(StopSignal::Interrupt),
            Some(Signal::SIGTERM) => Some(StopSignal::Terminate),
            Some(other) => crate::exec::oneshot::die_of(other),
        };
        Some(outcome.map_err(LocalError::from).map(|o| report(&o, stop)))
    }

    /// Runs the call on the async runtime (file tools, or commands in a session); `stop` ends
    /// it early.
    pub async fn run(self, stop: Stop) -> Result<i32, LocalError> {
        let outcome = self
            .toolbox
            .call(
                self.name,
                &self.input,
                &CallContext::new(stop.token().child_token()),
            )
            .await?;
        Ok(report(&outcome, stop.signal()))
    }
}

/// The whole of `podhost tool` once its configuration is checked: a `bash` call runs on this
/// thread under a supervisor forked from this process (no async runtime, no supervisor
/// program, see `exec::oneshot`); any other call (or a command in a session) on a
/// current-thread runtime. The process's exit code. Call it single-threaded.
pub fn main(config: ToolConfig) -> i32 {
    let call = match prepare(config) {
        Ok(call) => call,
        Err(e) => return exit_code("tool", Err(e)),
    };
    if let Some(result) = call.run_here() {
        return exit_code("tool", result);
    }
    // The init started for a command run here has no use (see exec::oneshot::start_early).
    crate::exec::oneshot::end_early();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("podhost: could not start the async runtime: {e}");
            return exit::FAILURE;
        }
    };
    runtime.block_on(async {
        // Orphans of commands whose supervisor died re-parent to podhost, which kills them.
        if let Err(e) = crate::exec::reaper::start() {
            tracing::warn!("could not become a child subreaper: {e}");
        }
        match Stop::on_signals() {
            Ok(stop) => exit_code("tool", call.run(stop).await),
            Err(e) => {
                eprintln!("podhost tool: {e}");
                exit::FAILURE
            }
        }
    })
}

/// Prints the outcome on stdout (a call a stop signal ended as `sandbox.cancelled`); the exit
/// code.
fn report(outcome: &ToolOutcome, stopped: Option<StopSignal>) -> i32 {
    let outcome = match stopped {
        Some(signal) => cancelled(outcome, signal),
        None => outcome.clone(),
    };
    // A closed stdout (`… | head -c 1`) ends quietly: whoever stopped reading wants no more.
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", serde_json::json!(outcome)).and_then(|()| out.flush());
    }
    if let Some(signal) = stopped {
        return signal.exit_code();
    }
    match outcome {
        ToolOutcome::Failed { code, message, .. } if code == codes::INVALID_INPUT => {
            eprintln!("podhost tool: {message}");
            exit::USAGE
        }
        _ => exit::OK,
    }
}

/// A call `signal` stopped, as `sandbox.cancelled`: a command's output so far (already within
/// the tool's caps) follows the message, so nothing it printed is lost.
fn cancelled(outcome: &ToolOutcome, signal: StopSignal) -> ToolOutcome {
    let ToolOutcome::Completed { output } = outcome else {
        return outcome.clone();
    };
    let mut message = format!(
        "Stopped by {}: the call was cancelled and its processes killed.",
        signal.name()
    );
    for stream in ["stdout", "stderr"] {
        let text = output[stream].as_str().unwrap_or_default();
        // The tool's own note says what the message already says.
        let text = text
            .strip_suffix(crate::tools::bash::CANCELLED_NOTE)
            .unwrap_or(text);
        if !text.is_empty() {
            message.push_str(&format!("\n{stream} so far:\n{text}"));
        }
    }
    ToolOutcome::failed(codes::CANCELLED, message)
}
