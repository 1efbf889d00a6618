//! `podhost tool NAME --input JSON`: one tool call in a local workspace, its outcome as JSON on
//! stdout.
//!
//! Exit codes: 0 when the tool ran (its outcome may be a failure: a command's non-zero exit, no
//! match), 2 when the input was refused before it could run, 130 or 143 when a signal stopped
//! it (the command's whole process tree killed; the outcome so far is still printed).

use std::io::{Read, Write};
use std::path::PathBuf;

use super::{LocalEnv, LocalError, Stop, toolbox, withheld_note};
use crate::exec::ExecSettings;
use crate::floor::codes::exit;
use crate::tools::{CallContext, ToolName, ToolOutcome, codes};

/// `podhost tool`'s configuration.
#[derive(Clone, Debug)]
pub struct ToolConfig {
    /// The tool's name, as typed (checked when it runs).
    pub name: String,
    /// The tool's input as JSON text, or `-` for stdin.
    pub input: String,
    /// The workspace directory.
    pub workspace: PathBuf,
    pub env: LocalEnv,
    pub exec: ExecSettings,
}

/// The most bytes of input read from stdin.
const MAX_INPUT_BYTES: u64 = 16 << 20;

pub async fn tool(args: ToolConfig, stop: Stop) -> Result<i32, LocalError> {
    let name: ToolName = args.name.parse().map_err(LocalError::Usage)?;
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
        args.input.clone()
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
    let outcome = toolbox
        .call(
            name.as_str(),
            &input,
            &CallContext::new(stop.token().child_token()),
        )
        .await?;
    // A closed stdout (`… | head -c 1`) ends quietly: whoever stopped reading wants no more.
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", serde_json::json!(outcome)).and_then(|()| out.flush());
    }
    if let Some(signal) = stop.signal() {
        return Ok(signal.exit_code());
    }
    Ok(match &outcome {
        ToolOutcome::Failed { code, message, .. } if code == codes::INVALID_INPUT => {
            eprintln!("podhost tool: {message}");
            exit::USAGE
        }
        _ => exit::OK,
    })
}
