//! The local front: `podhost tool` runs one tool, `podhost run` one agent task, in a local
//! workspace.
//!
//! `podhost run` has the same loop, tools and model client as the endpoint; the transcript is
//! printed as it goes and kept in memory only. `ask_user` reads the answer from stdin when stdin
//! is a terminal; otherwise the question ends the run.

use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};

use tokio_util::sync::CancellationToken;

use crate::agent::turn::{self, TurnEnd};
use crate::chat::client::{ModelClient, ModelError, RetryPolicy};
use crate::chat::message::{ApiKey, ChatMessage, ModelEndpoint, Role};
use crate::chat::session::{ChatTurn, DEFAULT_MAX_STEPS, Front, SessionError, step_limit_message};
use crate::exec::ExecSettings;
use crate::floor::codes::exit;
use crate::floor::text::truncate_middle;
use crate::floor::workspace::Workspace;
use crate::tools::{CallContext, ToolError, ToolName, ToolOutcome, Toolbox, ToolboxBuilder, codes};

/// `podhost tool`'s configuration.
#[derive(Clone, Debug)]
pub struct ToolConfig {
    /// The tool's name, as typed (checked when it runs).
    pub name: String,
    /// The tool's input as JSON text, or `-` for stdin.
    pub input: String,
    /// The workspace directory.
    pub workspace: PathBuf,
    pub exec: ExecSettings,
}

/// `podhost run`'s configuration.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// The OpenAI-compatible base URL.
    pub base_url: String,
    pub model: String,
    /// The environment variable that holds the API key, if any.
    pub api_key_env: Option<String>,
    pub workspace: PathBuf,
    /// The task for the agent.
    pub task: String,
    pub exec: ExecSettings,
}

/// Why a local command could not run.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// Bad input or configuration: nothing ran (exit 2).
    #[error("{0}")]
    Usage(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Tool(#[from] ToolError),
}

/// The toolbox of a local workspace: paths are host paths.
fn toolbox(workspace: &Path, exec: &ExecSettings) -> Result<Toolbox, LocalError> {
    let ws = Workspace::new(workspace, None)
        .map_err(|e| LocalError::Usage(format!("--workspace: {}: {e}", workspace.display())))?;
    if let Some(tmp) = &exec.confine.tmp {
        std::fs::create_dir_all(tmp)
            .map_err(|e| LocalError::Usage(format!("--tmp-dir: {}: {e}", tmp.display())))?;
    }
    let supervisor = crate::exec::find_supervisor().map_err(|source| LocalError::Io {
        what: "could not find podhost's own executable".into(),
        source,
    })?;
    Ok(ToolboxBuilder::new(exec, supervisor).build(ws, None))
}

/// Prints each message as it is added.
struct PrintFront {
    key: Option<ApiKey>,
    interactive: bool,
}

fn show(m: &ChatMessage) {
    let text = truncate_middle(m.content.as_deref().unwrap_or_default(), 4000).0;
    match m.role {
        Role::Tool => println!(
            "[tool {}]\n{text}\n",
            m.tool_call_id.as_deref().unwrap_or_default()
        ),
        role => {
            let name = format!("{role:?}").to_lowercase();
            if !text.is_empty() {
                println!("[{name}]\n{text}\n");
            }
            for c in m.calls() {
                println!(
                    "[{name} calls {} {}]\n{}\n",
                    c.function.name,
                    c.id,
                    truncate_middle(&c.function.arguments, 2000).0
                );
            }
        }
    }
}

impl Front for PrintFront {
    async fn appended(&mut self, messages: &[ChatMessage]) -> Result<(), SessionError> {
        messages.iter().for_each(show);
        Ok(())
    }

    fn api_key(&self) -> Option<ApiKey> {
        self.key.clone()
    }

    fn answers_questions(&self) -> bool {
        self.interactive
    }

    async fn ask(&mut self, question: &str) -> Option<String> {
        println!("[question] {question}\n> ");
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

/// Runs the task; exit 0 when the agent answered, 1 when the model call failed, 130 when
/// interrupted.
pub async fn run(args: RunConfig) -> Result<i32, LocalError> {
    let key = match &args.api_key_env {
        // Read once and removed from podhost's environment: only its memory holds the key.
        Some(var) => Some(ApiKey::new(
            crate::exec::confine::take_secret_env(var).ok_or_else(|| {
                LocalError::Usage(format!("--api-key-env: the variable {var} is not set"))
            })?,
        )),
        None => None,
    };
    let toolbox = toolbox(&args.workspace, &args.exec)?;
    let client = ModelClient::new(RetryPolicy::default())?;
    let conn = ModelEndpoint {
        base_url: args.base_url.clone(),
        model: args.model.clone(),
        generation_settings: Default::default(),
    };
    let task = ChatMessage::user(args.task.clone());
    show(&task);
    let front = PrintFront {
        key,
        interactive: std::io::stdin().is_terminal(),
    };
    let mut host = ChatTurn::new(front, client, conn, toolbox, vec![task]);
    let cancel = CancellationToken::new();
    let on_signal = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            on_signal.cancel();
        }
    });
    let end = turn::drive(&mut host, 0, &cancel).await;
    Ok(match end {
        Ok(TurnEnd::Completed { .. }) => exit::OK,
        Ok(TurnEnd::InputRequired { calls }) => {
            let asked: Vec<String> = calls.iter().map(|c| c.args.to_string()).collect();
            eprintln!(
                "podhost run: the agent asked for input ({}) and stdin is not a terminal",
                asked.join(", ")
            );
            exit::OK
        }
        Ok(TurnEnd::Failed { message, .. }) => {
            eprintln!("podhost run: {message}");
            exit::FAILURE
        }
        Ok(TurnEnd::Cancelled) => 130,
        Ok(TurnEnd::Yielded) => {
            eprintln!("podhost run: {}", step_limit_message(DEFAULT_MAX_STEPS));
            exit::FAILURE
        }
        Ok(other) => {
            eprintln!("podhost run: the turn ended unexpectedly: {other:?}");
            exit::FAILURE
        }
        Err(e) => {
            eprintln!("podhost run: {e}");
            exit::FAILURE
        }
    })
}

/// `podhost tool NAME --input JSON`: exit 0 when the tool ran (its outcome may be a failure),
/// 2 when the input was refused before it could run.
pub async fn tool(args: ToolConfig) -> Result<i32, LocalError> {
    let name: ToolName = args.name.parse().map_err(LocalError::Usage)?;
    let raw = if args.input == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .map_err(|source| LocalError::Io {
                what: "reading the input from stdin".into(),
                source,
            })?;
        s
    } else {
        args.input.clone()
    };
    let input: serde_json::Value = match serde_json::from_str(&raw) {
        Ok(v @ serde_json::Value::Object(_)) => v,
        Ok(_) => return Err(LocalError::Usage("--input must be a JSON object".into())),
        Err(e) => {
            return Err(LocalError::Usage(format!("--input is not valid JSON: {e}")));
        }
    };
    let toolbox = toolbox(&args.workspace, &args.exec)?;
    let cancel = CancellationToken::new();
    let on_signal = cancel.clone();
    // Registered before the tool starts (not when the task is first polled), so that a Ctrl-C at
    // any point cancels the call instead of killing podhost outright.
    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(|source| LocalError::Io {
        what: "listening for Ctrl-C".into(),
        source,
    })?;
    tokio::spawn(async move {
        if interrupt.recv().await.is_some() {
            on_signal.cancel();
        }
    });
    let outcome = toolbox
        .call(name.as_str(), &input, &CallContext::new(cancel))
        .await?;
    // A closed stdout (`… | head -c 1`) ends quietly: whoever stopped reading wants no more.
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", serde_json::json!(outcome)).and_then(|()| out.flush());
    }
    Ok(match &outcome {
        ToolOutcome::Failed { code, message, .. } if code == codes::INVALID_INPUT => {
            eprintln!("podhost tool: {message}");
            exit::USAGE
        }
        _ => exit::OK,
    })
}
