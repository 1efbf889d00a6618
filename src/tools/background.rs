//! Background processes: `bash` with `run_in_background`, `bash_output` and `bash_kill`.
//!
//! Owns: [`Jobs`], the registry of one session's background commands (`serve`: one invocation,
//! kept across its `input_required` pauses; `run`: the process; `mcp`: one client session), the
//! ids the model names them by (`bg-1`, `bg-2`, …), and the output objects of the two tools.
//!
//! Invariants:
//! * A job is an ordinary command of the toolbox's executor — the same sandbox, cgroup, uid,
//!   namespaces, Landlock rules and egress as any `bash` call — without the call's timeout; its
//!   output streams into a bounded [`LiveOutput`], which each `bash_output` empties.
//! * At most `max` jobs run at once per registry; one more is a failed outcome that names the cap.
//! * No job outlives its registry: [`Jobs::close`] (a front's end of the session) kills every
//!   job's tree and waits for it; dropping the last handle cancels them all just the same (each
//!   supervisor then kills its tree), and podhost's own end ends the supervisors.
//! * A job's task holds the executor, never the registry, so a registry's end is never held up
//!   by its own jobs.
//!
//! Non-goals: which fronts offer jobs (the fronts decide; a pod never does), keeping a job past
//! its session.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Map, Value};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::bash::{self, BashInput, STREAM_CHARS, push_line};
use super::definitions::BACKGROUND_INPUT;
use super::{CallContext, ToolOutcome, Toolbox, codes};
use crate::exec::{Captured, ExecError, ExecOutput, Executor, LiveOutput};

/// Background processes a session may run at once unless configured otherwise.
pub const DEFAULT_MAX: usize = 8;
/// How long a job may run at most: the session's end stops it long before.
const NO_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);
/// Ended jobs kept for a last read; past this, the oldest ended one is forgotten.
const KEEP_ENDED: usize = 32;
/// How long [`Jobs::close`] waits for the jobs' trees to be killed (each supervisor's own bound
/// is shorter).
const CLOSE_BOUND: Duration = Duration::from_secs(10);
/// The line a killed job's stderr ends with.
pub const KILLED_NOTE: &str = "The process and everything it started were killed.";

/// One session's background jobs. Cheap to clone; the jobs die with the last clone.
#[derive(Clone)]
pub struct Jobs {
    inner: Arc<Registry>,
}

impl std::fmt::Debug for Jobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jobs")
            .field("max", &self.inner.max)
            .finish()
    }
}

struct Registry {
    max: usize,
    /// The parent of every job's token: cancelled when the registry ends.
    cancel: CancellationToken,
    tracker: TaskTracker,
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    next: u64,
    jobs: BTreeMap<u64, Arc<Job>>,
}

struct Job {
    output: Arc<LiveOutput>,
    cancel: CancellationToken,
    /// `Some` once the command ended and its tree is gone.
    end: watch::Receiver<Option<End>>,
}

/// How a job ended.
#[derive(Clone, Debug)]
enum End {
    Ran(ExecOutput),
    /// It could not be started or watched: the reason, in words for the model.
    Failed(String),
}

/// `bash_output` and `bash_kill` input: the id `bash` answered.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobInput {
    pub id: String,
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl Jobs {
    /// A registry that runs at most `max` jobs at once.
    pub fn new(max: usize) -> Self {
        Jobs::tracked(max, TaskTracker::new())
    }

    /// A registry whose jobs' tasks are tracked by `tracker` (shared by a front's sessions, so
    /// that the front can wait for every job's end; [`close`](Self::close) then waits for all).
    pub fn tracked(max: usize, tracker: TaskTracker) -> Self {
        Jobs {
            inner: Arc::new(Registry {
                max,
                cancel: CancellationToken::new(),
                tracker,
                table: Mutex::new(Table::default()),
            }),
        }
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.inner
            .table
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Jobs still running.
    pub fn running(&self) -> usize {
        self.table()
            .jobs
            .values()
            .filter(|j| j.end.borrow().is_none())
            .count()
    }

    /// Kills every job's tree and waits (boundedly) until they are gone. Jobs started later are
    /// refused.
    pub async fn close(&self) {
        self.inner.cancel.cancel();
        self.inner.tracker.close();
        if tokio::time::timeout(CLOSE_BOUND, self.inner.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!("background processes still ending after {CLOSE_BOUND:?}");
        }
    }

    /// The job `id` names, or the outcome that says there is none.
    fn find(&self, id: &str) -> Result<Arc<Job>, ToolOutcome> {
        let table = self.table();
        let found = id
            .strip_prefix("bg-")
            .and_then(|n| n.parse::<u64>().ok())
            .and_then(|n| table.jobs.get(&n));
        if let Some(job) = found {
            return Ok(job.clone());
        }
        let known: Vec<String> = table.jobs.keys().map(|n| format!("bg-{n}")).collect();
        let known = if known.is_empty() {
            "none was started in this session".to_owned()
        } else {
            format!("the ids are {}", known.join(", "))
        };
        Err(ToolOutcome::failed(
            codes::NOT_FOUND,
            format!("There is no background process {id:?}: {known}."),
        ))
    }
}

/// `bash`'s input where background processes are offered: the input without
/// `run_in_background`, and whether it asked for one (a refusal when that is not a boolean).
/// Where they are not, the key is an unknown field like any other.
pub(super) fn split_input(input: &Value) -> Result<(Cow<'_, Value>, bool), ToolOutcome> {
    let Some(asked) = input.get(BACKGROUND_INPUT) else {
        return Ok((Cow::Borrowed(input), false));
    };
    let Some(asked) = asked.as_bool() else {
        return Err(ToolOutcome::failed(
            codes::INVALID_INPUT,
            format!("Invalid bash input: {BACKGROUND_INPUT}: {asked} is not true or false."),
        ));
    };
    let mut rest = input.clone();
    if let Some(map) = rest.as_object_mut() {
        map.remove(BACKGROUND_INPUT);
    }
    Ok((Cow::Owned(rest), asked))
}

/// `bash` with `run_in_background`: starts the command as a job and answers its id at once.
pub(super) fn start(tb: &Toolbox, jobs: &Jobs, input: BashInput, ctx: &CallContext) -> ToolOutcome {
    let (mut req, _) = match bash::request(tb, input, ctx) {
        Ok(r) => r,
        Err(refused) => return refused,
    };
    if jobs.inner.cancel.is_cancelled() {
        return ToolOutcome::failed(codes::CANCELLED, "The session is ending.");
    }
    let output = Arc::new(LiveOutput::new(STREAM_CHARS));
    let cancel = jobs.inner.cancel.child_token();
    req.timeout = NO_TIMEOUT;
    req.cancel = cancel.clone();
    req.live = Some(output.clone());
    let (tx, end) = watch::channel(None);
    let id = {
        let mut table = jobs.table();
        let running = table
            .jobs
            .values()
            .filter(|j| j.end.borrow().is_none())
            .count();
        if running >= jobs.inner.max {
            return ToolOutcome::failed(
                codes::BACKGROUND_LIMIT,
                format!(
                    "{running} background processes are running, the most this session may run \
                     at once. Stop one with bash_kill (or wait for one to end) before starting \
                     another."
                ),
            );
        }
        table.next += 1;
        let id = table.next;
        table.jobs.insert(
            id,
            Arc::new(Job {
                output,
                cancel,
                end,
            }),
        );
        forget_old(&mut table);
        id
    };
    let executor = tb.executor().clone();
    jobs.inner.tracker.spawn(async move {
        let ended = executor.execute(req).await;
        check_state(&executor).await;
        let _ = tx.send(Some(match ended {
            Ok(out) => End::Ran(out),
            Err(ExecError::InvalidCommand(m)) => End::Failed(m),
            Err(e) => End::Failed(format!("The command could not be run: {e}")),
        }));
    });
    let mut map = Map::new();
    map.insert("backgroundId".into(), format!("bg-{id}").into());
    ToolOutcome::completed(Value::Object(map))
}

/// Forgets the oldest ended jobs past [`KEEP_ENDED`].
fn forget_old(table: &mut Table) {
    let ended: Vec<u64> = table
        .jobs
        .iter()
        .filter(|(_, j)| j.end.borrow().is_some())
        .map(|(n, _)| *n)
        .collect();
    for n in ended.iter().take(ended.len().saturating_sub(KEEP_ENDED)) {
        table.jobs.remove(n);
    }
}

/// Checks (and repairs) the modes of podhost's state after a job, as after any command.
async fn check_state(executor: &Executor) {
    let guards = executor.confinement().guards().to_vec();
    if guards.is_empty() {
        return;
    }
    let checked =
        tokio::task::spawn_blocking(move || crate::exec::confine::state::check(&guards)).await;
    if let Ok(Err(e)) = checked {
        tracing::error!(error = %e, "podhost's state is exposed and could not be repaired");
    }
}

/// `bash_output`: what the job wrote since the last read, and whether it still runs.
pub(super) fn output(jobs: &Jobs, input: JobInput) -> ToolOutcome {
    let job = match jobs.find(&input.id) {
        Ok(j) => j,
        Err(refused) => return refused,
    };
    // The end first: once it is set, every byte of the output is in the buffer.
    let end = job.end.borrow().clone();
    let (stdout, stderr) = job.output.take();
    ToolOutcome::completed(report(stdout, stderr, end.as_ref()))
}

/// `bash_kill`: kills the job's whole tree, waits until it is gone, and answers what it wrote
/// since the last read.
pub(super) async fn kill(jobs: &Jobs, input: JobInput) -> ToolOutcome {
    let job = match jobs.find(&input.id) {
        Ok(j) => j,
        Err(refused) => return refused,
    };
    job.cancel.cancel();
    let mut end = job.end.clone();
    // The supervisor's own bounds end the wait (or the registry's task was dropped).
    let _ = end.wait_for(Option::is_some).await;
    let end = end.borrow().clone();
    let (stdout, stderr) = job.output.take();
    ToolOutcome::completed(report(stdout, stderr, end.as_ref()))
}

/// The object both tools answer: `{running, stdout, stderr, exitCode?, truncated?,
/// replacedBytes?}`.
fn report(stdout: Captured, stderr: Captured, end: Option<&End>) -> Value {
    let truncated = stdout.omitted_chars > 0 || stderr.omitted_chars > 0;
    let replaced = stdout.replaced + stderr.replaced;
    let mut err = stderr.text;
    let mut exit = None;
    match end {
        None => {}
        Some(End::Ran(out)) => {
            exit = Some(out.exit_code);
            if out.cancelled {
                push_line(&mut err, KILLED_NOTE);
            }
            if let Some(note) = &out.limit_note {
                push_line(&mut err, note);
            }
        }
        Some(End::Failed(message)) => push_line(&mut err, message),
    }
    let mut map = Map::new();
    map.insert("running".into(), end.is_none().into());
    map.insert("stdout".into(), stdout.text.into());
    map.insert("stderr".into(), err.into());
    if let Some(code) = exit {
        map.insert("exitCode".into(), code.into());
    }
    if truncated {
        map.insert("truncated".into(), true.into());
    }
    if replaced > 0 {
        map.insert("replacedBytes".into(), replaced.into());
    }
    Value::Object(map)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::ToolName;
    use pretty_assertions::assert_eq;

    fn text(s: &str) -> Captured {
        Captured {
            text: s.to_owned(),
            ..Captured::default()
        }
    }

    fn keys(v: &Value) -> Vec<String> {
        let mut keys: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        keys.sort();
        keys
    }

    /// Both tools answer what their definitions declare: every key, the required ones always.
    #[test]
    fn reports_are_what_the_definitions_declare() {
        let ended = End::Ran(ExecOutput {
            exit_code: 130,
            stdout: Captured {
                text: "x".into(),
                omitted_chars: 3,
                replaced: 1,
            },
            stderr: text("late"),
            timed_out: false,
            cancelled: true,
            limit_note: None,
        });
        let every = report(
            Captured {
                text: "x".into(),
                omitted_chars: 3,
                replaced: 1,
            },
            text("late"),
            Some(&ended),
        );
        assert_eq!(every["stderr"], format!("late\n{KILLED_NOTE}"));
        assert_eq!(every["running"], false);
        let running = report(text("a"), text(""), None);
        for tool in ToolName::BACKGROUND {
            let schema = tool.definition().output_schema.clone().unwrap();
            let mut declared: Vec<String> = schema["properties"]
                .as_object()
                .unwrap()
                .keys()
                .cloned()
                .collect();
            declared.sort();
            assert_eq!(keys(&every), declared, "{tool}");
            let mut required: Vec<String> = schema["required"]
                .as_array()
                .unwrap()
                .iter()
                .map(|k| k.as_str().unwrap().to_owned())
                .collect();
            required.sort();
            assert_eq!(keys(&running), required, "{tool}");
        }
    }
}
