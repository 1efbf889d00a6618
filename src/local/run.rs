//! `podhost run`: one agent task in a local workspace, with an output contract.
//!
//! Owns: the task (an argument, or stdin with `-`), the instructions (podhost's, then the
//! workspace's `AGENTS.md`, then `--system`), the API key (read once from its variable and
//! removed from podhost's environment), the front that answers `ask_user` from a terminal, and
//! how the turn's end becomes a status and an exit code (`floor::codes::exit`).
//!
//! Output: in text mode, activity for people on stderr (`render`), the final answer alone on
//! stdout, and a closing summary line; with `--json`, the events of [`super::events`] on stdout.
//! `-o FILE` also writes the answer to a file.
//!
//! Invariants:
//! * Exit 0 only when the task ended with an answer; every other end has its own code and a
//!   `run.finished` event naming it.
//! * A stop (SIGINT, SIGTERM) ends the run with 130 or 143 once what was in flight — a model
//!   call, or a command and its whole process tree — is cancelled.
//! * The key is never given to a command (`--env` refuses its variable), printed, or written to
//!   an event.

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use url::Url;

use super::events::{Event, RunStatus};
use super::observe::{Endpoint, Observed};
use super::render::Sink;
use super::{LocalEnv, LocalError, Stop, toolbox};
use crate::agent::turn::{self, TurnEnd};
use crate::chat::client::{ModelClient, RetryPolicy};
use crate::chat::message::{ApiKey, ChatMessage, KeySource, ModelEndpoint};
use crate::chat::session::{ChatLimits, ChatTurn, Front, SessionError, step_limit_message};
use crate::exec::ExecSettings;
use crate::floor::codes::{self, exit};
use crate::floor::secret::redacted_url;
use crate::floor::tls::{TlsSettings, client_config};
use crate::floor::workspace::Access;
use crate::tools::Toolbox;
use crate::tools::background::Jobs;

/// The most bytes of a task read from stdin.
pub const MAX_TASK_BYTES: usize = 1 << 20;
/// The most bytes of `AGENTS.md` added to the instructions; the rest is cut (and the cut said).
pub const MAX_AGENTS_MD_BYTES: usize = 64 * 1024;

/// Where the task comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Task {
    Text(String),
    /// `-`: read stdin to its end.
    Stdin,
}

/// The model to ask, and where each part of the connection came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelChoice {
    /// An `http://` or `https://` URL with a host (parsed and checked by the configuration).
    pub base_url: Url,
    /// `--base-url`, `OPENAI_BASE_URL` or `default`.
    pub base_url_from: &'static str,
    pub model: String,
    /// The variable holding the API key; `None` to send none.
    pub api_key_env: Option<String>,
    /// Generation settings merged into every request (temperature, max tokens, reasoning
    /// effort), as given.
    pub generation: Map<String, Value>,
    /// Ask for streamed answers.
    pub stream: bool,
}

/// `podhost run`'s configuration.
#[derive(Clone, Debug)]
pub struct RunConfig {
    pub model: ModelChoice,
    pub task: Task,
    pub workspace: PathBuf,
    pub max_steps: u32,
    /// The model's context window, compaction threshold and inputs, as configured.
    pub limits: ChatLimits,
    /// `--system`: added to the instructions, last.
    pub system: Option<String>,
    /// Events on stdout instead of text for people.
    pub json: bool,
    /// `-o`: also write the answer here.
    pub output_file: Option<PathBuf>,
    pub env: LocalEnv,
    /// Which CA certificates to trust besides the system's, for the model endpoint.
    pub tls: TlsSettings,
    pub exec: ExecSettings,
    /// Most background processes the task runs at once.
    pub max_background: usize,
}

/// The front of a local run: a terminal answers questions, when there is one.
struct RunFront {
    interactive: bool,
}

impl Front for RunFront {
    async fn appended(&mut self, _messages: &[ChatMessage]) -> Result<(), SessionError> {
        Ok(())
    }

    fn answers_questions(&self) -> bool {
        self.interactive
    }

    async fn ask(&mut self, question: &str) -> Option<String> {
        eprint!("? {question}\n> ");
        tokio::task::spawn_blocking(|| {
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).ok()?;
            Some(line.trim_end().to_owned())
        })
        .await
        .ok()
        .flatten()
    }
}

/// How the run ended, before it is reported.
struct End {
    status: RunStatus,
    code: i32,
    answer: Option<String>,
    questions: Option<Vec<String>>,
    error: Option<String>,
}

impl End {
    fn failed(status: RunStatus, code: i32, error: String) -> Self {
        End {
            status,
            code,
            answer: None,
            questions: None,
            error: Some(error),
        }
    }
}

/// Checks what the command line asked before anything runs, and takes the model's API key.
fn usage(cfg: &RunConfig) -> Result<Option<ApiKey>, LocalError> {
    if let Some(file) = &cfg.output_file {
        let parent = file
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new("."));
        if !parent.is_dir() {
            return Err(LocalError::Usage(format!(
                "-o {}: the directory {} does not exist",
                file.display(),
                parent.display()
            )));
        }
    }
    if let Some(var) = &cfg.model.api_key_env
        && cfg.env.pass.contains(var)
    {
        return Err(LocalError::Usage(format!(
            "--env {var}: that variable holds the model's API key, which commands never get"
        )));
    }
    Ok(match &cfg.model.api_key_env {
        // Read once and removed from podhost's environment: only its memory holds the key.
        Some(var) => Some(ApiKey::new(
            crate::exec::confine::take_secret_env(var).ok_or_else(|| {
                LocalError::Usage(format!("the API key variable {var} is not set"))
            })?,
        )),
        None => None,
    })
}

impl End {
    /// How a run a signal stopped ends.
    fn stopped(signal: super::StopSignal) -> Self {
        End::failed(
            match signal {
                super::StopSignal::Interrupt => RunStatus::Interrupted,
                super::StopSignal::Terminate => RunStatus::Terminated,
            },
            signal.exit_code(),
            format!("stopped by {}", signal.name()),
        )
    }

    /// How a run ends, from how its turn ended.
    fn of(ended: Result<TurnEnd, impl std::fmt::Display>, max_steps: u32) -> Self {
        match ended {
            Ok(TurnEnd::Completed { candidate }) => {
                let answer = candidate.text_output();
                if answer.trim().is_empty() {
                    End::failed(
                        RunStatus::ModelFailed,
                        exit::MODEL_FAILED,
                        "the model ended the task without an answer (its last message is empty)"
                            .to_owned(),
                    )
                } else {
                    End {
                        status: RunStatus::Completed,
                        code: exit::OK,
                        answer: Some(answer),
                        questions: None,
                        error: None,
                    }
                }
            }
            Ok(TurnEnd::InputRequired { calls }) => {
                let questions: Vec<String> = calls
                    .iter()
                    .map(|c| match c.args.get("question").and_then(Value::as_str) {
                        Some(q) => q.to_owned(),
                        None => c.args.to_string(),
                    })
                    .collect();
                End {
                    status: RunStatus::InputRequired,
                    code: exit::INPUT_REQUIRED,
                    answer: None,
                    questions: Some(questions),
                    error: Some(
                        "the agent asked a question, and there is no terminal to answer it (stdin \
                         is not a terminal, or held the task)"
                            .to_owned(),
                    ),
                }
            }
            Ok(TurnEnd::Yielded) => End::failed(
                RunStatus::StepLimit,
                exit::STEP_LIMIT,
                step_limit_message(max_steps).replace("PODHOST_MAX_STEPS", "--max-steps"),
            ),
            Ok(TurnEnd::Failed { code, message }) if code.ends_with(codes::model::CANCELLED) => {
                End::failed(RunStatus::Error, exit::FAILURE, message)
            }
            Ok(TurnEnd::Failed { message, .. }) => End::failed(
                RunStatus::ModelFailed,
                exit::MODEL_FAILED,
                format!("the model call failed: {message}"),
            ),
            Ok(TurnEnd::Cancelled) => {
                End::failed(RunStatus::Error, exit::FAILURE, "cancelled".into())
            }
            Ok(TurnEnd::Waiting { effect_ids }) => End::failed(
                RunStatus::Error,
                exit::FAILURE,
                format!("the turn waits on {effect_ids:?}, which a local run cannot give"),
            ),
            Err(e) => End::failed(RunStatus::Error, exit::FAILURE, e.to_string()),
        }
    }
}

/// Runs the task; the exit code says how it ended (see the module doc).
pub async fn run(cfg: RunConfig, stop: Stop) -> Result<i32, LocalError> {
    let task = read_task(&cfg.task)?;
    let key = usage(&cfg)?;
    let (toolbox, withheld) = toolbox(&cfg.workspace, &cfg.exec, &cfg.env)?;
    let sink = Sink::new(cfg.json);
    let (instructions, sources, agents_note) =
        instructions(&toolbox, cfg.system.as_deref()).await?;
    let run_id = uuid::Uuid::new_v4().to_string();
    sink.emit(Event::RunStarted {
        schema: super::events::SCHEMA_ID,
        version: env!("CARGO_PKG_VERSION"),
        run_id: run_id.clone(),
        model: cfg.model.model.clone(),
        base_url: redacted_url(&cfg.model.base_url).to_string(),
        base_url_from: cfg.model.base_url_from.to_owned(),
        api_key_from: key.as_ref().and(cfg.model.api_key_env.clone()),
        workspace: toolbox.workspace().root().to_string_lossy().into_owned(),
        cwd: current_dir(),
        tools: tool_names(),
        max_steps: cfg.max_steps,
        stream: cfg.model.stream,
        instructions: sources,
        withheld_env: withheld.credentials.clone(),
    });
    if !cfg.json {
        for note in [super::withheld_note(&withheld), agents_note]
            .into_iter()
            .flatten()
        {
            eprintln!("podhost run: {note}");
        }
    }

    let (progress_tx, progress_rx) = tokio::sync::watch::channel(0u64);
    let jobs = Jobs::new(cfg.max_background);
    let toolbox = toolbox.with_background(jobs.clone());
    let turn = chat_turn(&cfg, key, toolbox, (task, &instructions), progress_tx).await?;
    let endpoint = Endpoint {
        base_url: redacted_url(&cfg.model.base_url).to_string(),
        from: cfg.model.base_url_from,
    };
    let mut host = Observed::new(turn, sink.clone(), endpoint.clone());
    let progress_done = tokio_util::sync::CancellationToken::new();
    let progress = host.watch_progress(progress_rx, progress_done.clone());
    let ended = turn::drive(&mut host, 0, stop.token()).await;
    progress_done.cancel();
    let _ = progress.await;
    // The task's background processes end with it.
    jobs.close().await;

    let mut end = End::of(ended, cfg.max_steps);
    end.error = end.error.map(|e| endpoint.hinted(&e));
    // A signal wins over whatever the cancelled turn ended with.
    if let Some(signal) = stop.signal() {
        end = End::stopped(signal);
    }

    Ok(deliver(
        &sink,
        (run_id, end),
        cfg.output_file.as_deref(),
        cfg.json,
    ))
}

/// The chat turn of the task: the model client (reporting the bytes of answers received on
/// `progress`), the endpoint, the context limits (asking the server's listing when they need
/// it), the task and the instructions.
async fn chat_turn(
    cfg: &RunConfig,
    key: Option<ApiKey>,
    toolbox: Toolbox,
    (task, instructions): (String, &str),
    progress: tokio::sync::watch::Sender<u64>,
) -> Result<ChatTurn<RunFront>, LocalError> {
    let tls = client_config(&cfg.tls).map_err(|e| LocalError::Usage(e.to_string()))?;
    let client = ModelClient::new(RetryPolicy::default(), tls)?
        .streaming(cfg.model.stream)
        .with_progress(progress);
    let conn = ModelEndpoint {
        base_url: cfg.model.base_url.clone(),
        model: cfg.model.model.clone(),
        generation_settings: cfg.model.generation.clone(),
    };
    let front = RunFront {
        interactive: cfg.task != Task::Stdin && std::io::stdin().is_terminal(),
    };
    let mut limits = cfg.limits.clone();
    if limits.needs_listing() {
        let facts = client.model_facts(&conn, key.as_ref()).await;
        limits = limits.complete(facts);
    }
    let key = KeySource::fixed(key);
    Ok(ChatTurn::new(
        front,
        client,
        conn,
        key,
        toolbox,
        vec![ChatMessage::user(task)],
    )
    .with_max_steps(cfg.max_steps)
    .with_instructions(instructions)
    .with_context(limits, Default::default()))
}

/// The directory podhost was started in, as `run.started` names it (empty if it is gone).
fn current_dir() -> String {
    std::env::current_dir()
        .map(|d| d.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The names of the tools offered to the model, in the order it is offered them.
fn tool_names() -> Vec<String> {
    crate::chat::session::tool_specs()
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
        .collect()
}

/// Writes the answer where it goes (the output file, stdout) and emits the run's last event;
/// returns the exit code, which a failed write turns into a failure.
fn deliver(
    sink: &Sink,
    (run_id, mut end): (String, End),
    output_file: Option<&Path>,
    json: bool,
) -> i32 {
    if let (Some(answer), Some(file)) = (&end.answer, output_file)
        && let Err(e) = std::fs::write(file, answer)
    {
        // The answer is not lost: it still goes to stdout (or the event).
        end.code = exit::FAILURE;
        end.error = Some(format!(
            "could not write the answer to {}: {e}",
            file.display()
        ));
    }
    if !json && let Some(answer) = &end.answer {
        // A closed stdout (`podhost run … | head -1`) ends quietly, as in `podhost tool`.
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", answer.trim_end_matches('\n')).and_then(|()| out.flush());
    }
    sink.emit(Event::RunFinished {
        run_id,
        status: end.status,
        exit_code: end.code,
        answer: end.answer,
        questions: end.questions,
        error: end.error,
        summary: sink.summary(),
    });
    end.code
}

/// The task's text.
fn read_task(task: &Task) -> Result<String, LocalError> {
    let text = match task {
        Task::Text(t) => t.clone(),
        Task::Stdin => {
            let mut buf = Vec::new();
            std::io::stdin()
                .take(MAX_TASK_BYTES as u64 + 1)
                .read_to_end(&mut buf)
                .map_err(|source| LocalError::Io {
                    what: "reading the task from stdin".into(),
                    source,
                })?;
            if buf.len() > MAX_TASK_BYTES {
                return Err(LocalError::Usage(format!(
                    "the task on stdin is larger than {MAX_TASK_BYTES} bytes"
                )));
            }
            String::from_utf8(buf)
                .map_err(|_| LocalError::Usage("the task on stdin is not UTF-8".into()))?
        }
    };
    if text.trim().is_empty() {
        return Err(LocalError::Usage(match task {
            Task::Stdin => "the task on stdin is empty".into(),
            Task::Text(_) => "the task is empty".into(),
        }));
    }
    Ok(text)
}

/// The instructions added to podhost's own: the workspace's `AGENTS.md` (read through the
/// toolbox, confined like a file tool), then `--system`. Also their sources, and a note when
/// `AGENTS.md` was cut.
async fn instructions(
    toolbox: &Toolbox,
    system: Option<&str>,
) -> Result<(String, Vec<String>, Option<String>), LocalError> {
    let mut text = String::new();
    let mut sources = Vec::new();
    let mut note = None;
    let resolved = toolbox.workspace().resolve("AGENTS.md", Access::Read);
    if let Ok(r) = resolved
        && r.exists
    {
        let host = r.host.clone();
        let read = toolbox
            .confined("agents-md", &[], move || {
                read_prefix(&host, MAX_AGENTS_MD_BYTES)
            })
            .await?;
        let (body, cut) = read.map_err(|e| LocalError::Io {
            what: format!("could not read {}", r.host.display()),
            source: e,
        })?;
        if cut {
            note = Some(format!(
                "AGENTS.md is larger than {MAX_AGENTS_MD_BYTES} bytes; the instructions hold its \
                 first {MAX_AGENTS_MD_BYTES}"
            ));
        }
        if !body.trim().is_empty() {
            text.push_str("The workspace's AGENTS.md says:\n\n");
            text.push_str(body.trim_end());
            if cut {
                text.push_str(&format!(
                    "\n\n[AGENTS.md is cut here, at {MAX_AGENTS_MD_BYTES} bytes]"
                ));
            }
            sources.push("AGENTS.md".to_owned());
        }
    }
    if let Some(s) = system.filter(|s| !s.trim().is_empty()) {
        if !text.is_empty() {
            text.push_str("\n\n");
        }
        text.push_str(s.trim_end());
        sources.push("--system".to_owned());
    }
    Ok((text, sources, note))
}

/// The first `max` bytes of a regular file as text (cut on a character boundary), and whether
/// it was cut.
fn read_prefix(path: &std::path::Path, max: usize) -> std::io::Result<(String, bool)> {
    use crate::floor::workspace::OpenError;
    let file = crate::floor::workspace::open_regular(path).map_err(|e| match e {
        OpenError::Io(e) => e,
        OpenError::NotFound => std::io::Error::from(std::io::ErrorKind::NotFound),
        OpenError::NotAFile(kind) => std::io::Error::other(format!("it is {kind}, not a file")),
        OpenError::Symlink => std::io::Error::other("it was replaced by a symbolic link"),
    })?;
    let mut buf = Vec::new();
    file.take(max as u64 + 1).read_to_end(&mut buf)?;
    let cut = buf.len() > max;
    buf.truncate(max);
    let mut text = String::from_utf8_lossy(&buf).into_owned();
    if cut && text.ends_with('\u{FFFD}') {
        // A character split by the cut.
        text.pop();
    }
    Ok((text, cut))
}
