//! `podhost run`: one agent task in a local workspace, with the same loop, tools and model client
//! as the endpoint, the transcript printed as it goes and kept in memory only.
//!
//! `ask_user` reads the answer from stdin when stdin is a terminal; otherwise the question ends
//! the run.

use std::io::IsTerminal;

use tokio_util::sync::CancellationToken;

use super::openai::{ModelClient, RetryPolicy};
use super::protocol::{ApiKey, ChatMessage, Role, StoredConnection};
use super::session::{ChatTurn, DEFAULT_MAX_STEPS, Front, SessionError};
use super::{ServeError, install_crypto_provider};
use crate::agent::turn::{self, TurnEnd};
use crate::config::{RunArgs, local_toolbox};
use crate::error::exit;
use crate::floor::text::truncate_middle;

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
pub async fn run(args: RunArgs) -> Result<i32, ServeError> {
    install_crypto_provider();
    let key = match &args.api_key_env {
        // Read once and removed from podhost's environment: only its memory holds the key.
        Some(var) => Some(ApiKey::new(
            crate::exec::confine::take_secret_env(var).ok_or_else(|| {
                ServeError::Config(format!("--api-key-env: the variable {var} is not set"))
            })?,
        )),
        None => None,
    };
    let toolbox = match local_toolbox(&args.workspace, &args.exec) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("podhost run: {e}");
            return Ok(exit::USAGE);
        }
    };
    let client = ModelClient::new(RetryPolicy::default())?;
    let conn = StoredConnection {
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
    let end = turn::run(&mut host, 0, &cancel).await;
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
            eprintln!(
                "podhost run: {}",
                super::session::step_limit_message(DEFAULT_MAX_STEPS)
            );
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
