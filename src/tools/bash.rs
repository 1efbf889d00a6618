//! `bash {command, timeout?}`: runs a command line in the workspace through `exec`.
//!
//! Owns: the input rules (timeout 1..=600 s, default 120; a command `exec` can start) and the
//! output object `{exitCode, stdout, stderr, truncated?, timedOut?, replacedBytes?}`, optional keys
//! present only when true or non-zero.
//!
//! Invariants: a command that ran is `completed`, whatever its exit code — also when it timed out
//! (exit 124 and a line on stderr saying so) or was cancelled (exit 130, likewise); the output so
//! far is kept in both. Each stream is at most 30,000 characters plus the omission marker.
//!
//! Non-goals: processes, capture, limits, environment (all in `exec`).

use std::time::Duration;

use serde::Deserialize;
use serde_json::{Map, Value};

use super::{CallContext, ToolError, ToolName, ToolOutcome, Toolbox, codes};
use crate::exec::{ExecError, ExecOutput, ExecRequest, validate_command};

/// Seconds a command may run when the call does not say.
pub const DEFAULT_TIMEOUT_SECS: u64 = 120;
/// The longest timeout a call may ask for.
pub const MAX_TIMEOUT_SECS: u64 = 600;
/// Characters of each stream the model sees (first half, marker, last half).
pub const STREAM_CHARS: usize = 30_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BashInput {
    pub command: String,
    /// Seconds; 1..=600.
    pub timeout: Option<u64>,
}

pub async fn execute(
    tb: &Toolbox,
    input: BashInput,
    ctx: &CallContext,
) -> Result<ToolOutcome, ToolError> {
    let (req, timeout) = match request(tb, input, ctx) {
        Ok(r) => r,
        Err(refused) => return Ok(refused),
    };
    outcome(tb.executor().execute(req).await, timeout)
}

/// [`execute`] under a supervisor forked from this process (`podhost tool`, see
/// `exec::oneshot`): no async runtime, no supervisor program. The signal that stopped the
/// command comes back beside the outcome. Only where the executor `supervises_here`.
pub fn execute_here(
    tb: &Toolbox,
    input: BashInput,
    ctx: &CallContext,
) -> (
    Result<ToolOutcome, ToolError>,
    Option<nix::sys::signal::Signal>,
) {
    let (req, timeout) = match request(tb, input, ctx) {
        Ok(r) => r,
        Err(refused) => return (Ok(refused), None),
    };
    match tb.executor().execute_here(req) {
        Ok(one) => (outcome(Ok(one.output), timeout), one.stopped_by),
        Err(e) => (outcome(Err(e), timeout), None),
    }
}

/// The command a call asks for and its timeout in seconds, or the outcome that refuses its
/// input.
pub(super) fn request(
    tb: &Toolbox,
    input: BashInput,
    ctx: &CallContext,
) -> Result<(ExecRequest, u64), ToolOutcome> {
    let timeout = match input.timeout {
        None => DEFAULT_TIMEOUT_SECS,
        Some(t @ 1..=MAX_TIMEOUT_SECS) => t,
        Some(t) => {
            return Err(ToolOutcome::failed(
                codes::INVALID_INPUT,
                format!(
                    "Invalid bash input: timeout must be between 1 and {MAX_TIMEOUT_SECS} \
                     seconds, got {t}."
                ),
            ));
        }
    };
    if let Err(message) = validate_command(&input.command) {
        return Err(ToolOutcome::failed(codes::INVALID_INPUT, message));
    }
    // A private temporary directory is the default; the call's own variables may still say
    // otherwise (writes elsewhere then fail loudly).
    let mut env = Vec::with_capacity(ctx.env.len() + 3);
    if let Some(tmp) = &tb.rules().tmp {
        let tmp = tmp.to_string_lossy().into_owned();
        for name in ["TMPDIR", "TMP", "TEMP"] {
            env.push((name.to_owned(), tmp.clone()));
        }
    }
    env.extend(ctx.env.iter().cloned());
    let req = ExecRequest {
        command: input.command,
        cwd: tb.workspace().root().to_path_buf(),
        env,
        timeout: Duration::from_secs(timeout),
        cancel: ctx.cancel.clone(),
        stream_chars: STREAM_CHARS,
        confine: tb.rules().command.clone(),
        file_size_cap: None,
        live: None,
    };
    Ok((req, timeout))
}

/// The call's outcome from how its command ended.
fn outcome(ended: Result<ExecOutput, ExecError>, timeout: u64) -> Result<ToolOutcome, ToolError> {
    match ended {
        Ok(out) => Ok(ToolOutcome::completed(output(out, timeout))),
        Err(ExecError::InvalidCommand(message)) => {
            Ok(ToolOutcome::failed(codes::INVALID_INPUT, message))
        }
        Err(ExecError::Start { message }) => Ok(ToolOutcome::failed(
            codes::START_FAILED,
            format!("The command could not be started: {message}"),
        )),
        Err(fault) => Err(ToolError::Exec {
            tool: ToolName::Bash,
            fault,
        }),
    }
}

/// The line a cancelled command's stderr ends with.
pub const CANCELLED_NOTE: &str = "Command was cancelled and killed.";

/// The output object the model sees.
fn output(out: ExecOutput, timeout_secs: u64) -> Value {
    let truncated = out.stdout.omitted_chars > 0 || out.stderr.omitted_chars > 0;
    let replaced = out.stdout.replaced + out.stderr.replaced;
    let mut stderr = out.stderr.text;
    if out.timed_out {
        push_line(
            &mut stderr,
            &format!("Command timed out after {timeout_secs}s and was killed."),
        );
    } else if out.cancelled {
        push_line(&mut stderr, CANCELLED_NOTE);
    }
    if let Some(note) = &out.limit_note {
        push_line(&mut stderr, note);
    }
    let mut map = Map::new();
    map.insert("exitCode".into(), out.exit_code.into());
    map.insert("stdout".into(), out.stdout.text.into());
    map.insert("stderr".into(), stderr.into());
    if truncated {
        map.insert("truncated".into(), true.into());
    }
    if out.timed_out {
        map.insert("timedOut".into(), true.into());
    }
    if replaced > 0 {
        map.insert("replacedBytes".into(), replaced.into());
    }
    Value::Object(map)
}

/// Appends `line` on a line of its own.
pub(super) fn push_line(text: &mut String, line: &str) {
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(line);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::Captured;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    fn text(s: &str) -> Captured {
        Captured {
            text: s.to_owned(),
            ..Captured::default()
        }
    }

    #[test]
    fn optional_keys_appear_only_when_set() {
        let plain = ExecOutput {
            exit_code: 3,
            stdout: text("out"),
            stderr: text(""),
            timed_out: false,
            cancelled: false,
            limit_note: None,
        };
        assert_eq!(
            output(plain.clone(), 5),
            json!({"exitCode": 3, "stdout": "out", "stderr": ""})
        );
        let timed_out = ExecOutput {
            exit_code: 124,
            stdout: Captured {
                text: "x".into(),
                omitted_chars: 7,
                replaced: 2,
            },
            stderr: text("partial"),
            timed_out: true,
            ..plain
        };
        assert_eq!(
            output(timed_out, 5),
            json!({
                "exitCode": 124, "stdout": "x",
                "stderr": "partial\nCommand timed out after 5s and was killed.",
                "truncated": true, "timedOut": true, "replacedBytes": 2
            })
        );
    }

    /// What MCP clients validate the output against (`tools/bash.json`'s `output_schema`):
    /// every key, optional ones included, declared with its type; the required ones always set.
    #[test]
    fn the_output_is_what_the_definition_declares() {
        let schema = crate::tools::ToolName::Bash
            .definition()
            .output_schema
            .clone()
            .unwrap();
        let every_key = ExecOutput {
            exit_code: 124,
            stdout: Captured {
                text: "x".into(),
                omitted_chars: 7,
                replaced: 2,
            },
            stderr: text(""),
            timed_out: true,
            cancelled: false,
            limit_note: None,
        };
        let types = |out: &Value| -> Vec<(String, &'static str)> {
            let type_of = |v: &Value| match v {
                Value::Bool(_) => "boolean",
                Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
                Value::String(_) => "string",
                _ => "other",
            };
            let map = out.as_object().unwrap();
            map.iter().map(|(k, v)| (k.clone(), type_of(v))).collect()
        };
        let declared: Vec<(String, &str)> = schema["properties"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v["type"].as_str().unwrap()))
            .collect();
        let mut produced = types(&output(every_key, 5));
        produced.push(("backgroundId".to_owned(), "string"));
        let mut declared = declared;
        produced.sort();
        declared.sort();
        assert_eq!(produced, declared);
        let plain = output(
            ExecOutput {
                exit_code: 0,
                stdout: text(""),
                stderr: text(""),
                timed_out: false,
                cancelled: false,
                limit_note: None,
            },
            5,
        );
        let mut keys: Vec<&str> = plain
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        // An ordinary call's object (the first branch) or a background start's (the second).
        let required = |branch: usize| -> Vec<&str> {
            let mut keys: Vec<&str> = schema["anyOf"][branch]["required"]
                .as_array()
                .unwrap()
                .iter()
                .map(|k| k.as_str().unwrap())
                .collect();
            keys.sort_unstable();
            keys
        };
        assert_eq!(required(1), ["backgroundId"]);
        let required = required(0);
        assert_eq!(required, keys);
    }
}
