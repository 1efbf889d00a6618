//! The Agent's setup from a join on a new disk: input files and setup commands, run once before
//! the pod takes turns (v5 §9 item 2).
//!
//! Owns: running the setup and the marker `<harness root>/setup-done` that keeps a restart from
//! running it again. `seeded: true` (the disk starts from a disk version) is recorded the same
//! way, with nothing run.
//!
//! Decisions (v5 gives no more than "input files and setup commands"):
//! * The shape is assumed and read leniently (see [`Setup`]).
//! * Files are written through the toolbox (`Toolbox::replace_file`): the write tool's path
//!   rules and confinement, atomically under the file's lock, with `mode` when given.
//! * A file's bytes are inline (`base64`, else `content`), or fetched from its `url` with `curl`
//!   run as a setup command is (the pod's egress proxy and trust bundle), at most
//!   [`SETUP_FETCH_MAX_BYTES`]; a `sha256` is checked either way. A file with no bytes and no
//!   `url` fails the setup with a reason: podhost never writes an empty stand-in for a file.
//! * Commands run through the bash tool, in order, one at a time with the pod's; each gets
//!   its `timeout` (seconds, at most the bash tool's 600), else 600: setup commands install
//!   things and the bash default of 120 s is often too short.
//! * The first failing command stops the setup: later commands usually build on earlier ones.
//!   It is logged with its exit code and the tail of its stderr, and recorded in the marker.
//! * A failed setup does **not** block turns: v5 gives the pod no way to report it to anyone but
//!   its log, and a pod that never takes a turn would leave the session stuck with no word of
//!   why; the agent sees the workspace as the setup left it. The marker is written either way,
//!   so a restart does not run commands that may not be safe to run twice.

use std::path::Path;

use base64::Engine as _;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::nylorun::link::protocol::{Setup, SetupCommand, SetupFile};
use crate::tools::files::FileRead;
use crate::tools::{CallContext, ToolError, ToolName, ToolOutcome, Toolbox};

/// The marker file under the harness root.
pub const SETUP_MARKER: &str = "setup-done";
/// The bash tool's ceiling, and the setup default.
const SETUP_TIMEOUT_SECS: u64 = 600;
/// Characters of a failing command's stderr kept in the log.
const STDERR_TAIL_CHARS: usize = 2000;
/// The largest input file fetched from a `url`.
pub const SETUP_FETCH_MAX_BYTES: u64 = 32 << 20;

/// How the setup went.
#[derive(Clone, Debug, PartialEq)]
pub enum SetupResult {
    /// The marker was there: it ran (or was skipped) before.
    AlreadyDone,
    /// The join said `seeded: true`.
    Seeded,
    /// The join carried no setup.
    Nothing,
    Done {
        files: usize,
        commands: usize,
    },
    Failed {
        step: String,
        message: String,
    },
}

/// Runs the setup once, if there is one and the marker is absent.
pub async fn apply_once(
    harness_root: &Path,
    toolbox: &Toolbox,
    setup: Option<Setup>,
    seeded: Option<bool>,
    cancel: &CancellationToken,
) -> SetupResult {
    let marker = harness_root.join(SETUP_MARKER);
    if marker.exists() {
        tracing::info!("the setup ran before (setup-done); not running it again");
        return SetupResult::AlreadyDone;
    }
    if seeded == Some(true) {
        write_marker(
            &marker,
            &json!({"status": "seeded", "at": super::iso_now()}),
        );
        tracing::info!("the disk is seeded: no setup to run");
        return SetupResult::Seeded;
    }
    let Some(setup) = setup else {
        return SetupResult::Nothing;
    };
    tracing::info!(
        files = setup.files.len(),
        commands = setup.commands.len(),
        "running the Agent's setup"
    );
    let result = apply(toolbox, &setup, cancel).await;
    let record = match &result {
        SetupResult::Done { files, commands } => {
            tracing::info!(files, commands, "setup done");
            json!({"status": "done", "files": files, "commands": commands, "at": super::iso_now()})
        }
        SetupResult::Failed { step, message } => {
            tracing::error!(%step, %message, "setup failed; taking turns anyway");
            json!({"status": "failed", "step": step, "message": message, "at": super::iso_now()})
        }
        _ => Value::Null,
    };
    // Cancelled (shutdown) part way: no marker, so the next start runs it whole.
    if !cancel.is_cancelled() {
        write_marker(&marker, &record);
    }
    result
}

async fn apply(toolbox: &Toolbox, setup: &Setup, cancel: &CancellationToken) -> SetupResult {
    for (i, file) in setup.files.iter().enumerate() {
        let err = match write_file(toolbox, file, i, cancel).await {
            Ok(()) => continue,
            Err(e) => e,
        };
        return SetupResult::Failed {
            step: format!("file {} ({})", i + 1, file.path),
            message: err.to_string(),
        };
    }
    for (i, cmd) in setup.commands.iter().enumerate() {
        let (command, timeout) = match cmd {
            SetupCommand::Line(c) => (c.clone(), None),
            SetupCommand::Full { command, timeout } => (command.clone(), *timeout),
        };
        let timeout = timeout
            .unwrap_or(SETUP_TIMEOUT_SECS)
            .clamp(1, SETUP_TIMEOUT_SECS);
        let step = format!(
            "command {} ({})",
            i + 1,
            command.chars().take(200).collect::<String>()
        );
        let input = json!({"command": command, "timeout": timeout});
        let ctx = CallContext::new(cancel.child_token());
        let outcome = toolbox.call(ToolName::Bash, &input, &ctx).await;
        match outcome {
            Ok(ToolOutcome::Completed { output }) => {
                let code = output.get("exitCode").and_then(Value::as_i64).unwrap_or(-1);
                if code != 0 {
                    let stderr = output.get("stderr").and_then(Value::as_str).unwrap_or("");
                    let tail = tail_chars(stderr, STDERR_TAIL_CHARS);
                    tracing::error!(%step, exit_code = code, stderr_tail = %tail, "a setup command failed");
                    return SetupResult::Failed {
                        step,
                        message: format!("exit code {code}; stderr ends: {tail}"),
                    };
                }
            }
            Ok(ToolOutcome::Failed { code, message, .. }) => {
                return SetupResult::Failed {
                    step,
                    message: format!("{code}: {message}"),
                };
            }
            Err(e) => {
                return SetupResult::Failed {
                    step,
                    message: e.to_string(),
                };
            }
        }
    }
    SetupResult::Done {
        files: setup.files.len(),
        commands: setup.commands.len(),
    }
}

fn tail_chars(s: &str, n: usize) -> String {
    let count = s.chars().count();
    s.chars().skip(count.saturating_sub(n)).collect()
}

/// `mode` as a number, or an octal string (`"0644"`, `"755"`).
fn parse_mode(v: &Value) -> Option<u32> {
    match v {
        Value::Number(n) => n.as_u64().and_then(|m| u32::try_from(m).ok()),
        Value::String(s) => u32::from_str_radix(s.trim_start_matches("0o"), 8).ok(),
        _ => None,
    }
    .filter(|m| *m <= 0o7777)
}

/// Why a setup file was not written; the text is the setup's failure message.
#[derive(Debug, thiserror::Error)]
enum FileError {
    #[error("base64 of {path} does not decode: {source}")]
    Base64 {
        path: String,
        source: base64::DecodeError,
    },
    #[error(
        "{path} carries no bytes (base64 or content) and no url to fetch them from; no file was \
         written"
    )]
    NoBytes { path: String },
    #[error(
        "the bytes of {path} have SHA-256 {got}, not the {want} the setup names; no file was \
         written"
    )]
    Digest {
        path: String,
        got: String,
        want: String,
    },
    /// `mode` as the setup gave it (JSON).
    #[error("mode {mode} of {path} is not a permission mode")]
    Mode { mode: Value, path: String },
    /// The url (without credentials or query) and why the fetch failed.
    #[error("could not fetch {url}: {why}")]
    Fetch { url: String, why: String },
    /// The file tool refused the write (its message, as it tells the model).
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Tool(#[from] ToolError),
}

async fn write_file(
    toolbox: &Toolbox,
    file: &SetupFile,
    index: usize,
    cancel: &CancellationToken,
) -> Result<(), FileError> {
    let path = || file.path.clone();
    let bytes = match (&file.base64, &file.content, &file.url) {
        (Some(b64), _, _) => base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .map_err(|source| FileError::Base64 {
                path: path(),
                source,
            })?,
        (None, Some(text), _) => text.clone().into_bytes(),
        (None, None, Some(url)) => fetch(toolbox, url, index, cancel).await?,
        (None, None, None) => return Err(FileError::NoBytes { path: path() }),
    };
    if let Some(want) = &file.sha256 {
        let want = want
            .trim()
            .trim_start_matches("sha256:")
            .to_ascii_lowercase();
        let got = hex::encode(Sha256::digest(&bytes));
        if got != want {
            return Err(FileError::Digest {
                path: path(),
                got,
                want,
            });
        }
    }
    let mode = match &file.mode {
        Some(v) => Some(parse_mode(v).ok_or_else(|| FileError::Mode {
            mode: v.clone(),
            path: path(),
        })?),
        None => None,
    };
    toolbox
        .replace_file(&file.path, bytes, mode)
        .await?
        .map_err(FileError::Refused)
}

/// Fetches `url` with `curl` in the sandbox, as a setup command runs (the egress proxy and
/// trust bundle in its environment; the URL passed as a variable, never through the shell's
/// parser), into a temporary file in the workspace that podhost then reads and removes.
async fn fetch(
    toolbox: &Toolbox,
    url: &str,
    index: usize,
    cancel: &CancellationToken,
) -> Result<Vec<u8>, FileError> {
    // In the workspace, where commands may write; removed once read.
    let out = format!(".podhost-setup-{}-{index}.part", std::process::id());
    let command = "curl --fail --silent --show-error --location --proto '=http,https' \
                   --max-filesize \"$SETUP_FILE_MAX\" --output \"$SETUP_FILE_OUT\" \
                   -- \"$SETUP_FILE_URL\"";
    let input = json!({"command": command, "timeout": SETUP_TIMEOUT_SECS});
    let ctx = CallContext {
        cancel: cancel.child_token(),
        env: vec![
            ("SETUP_FILE_URL".to_owned(), url.to_owned()),
            ("SETUP_FILE_OUT".to_owned(), out.clone()),
            (
                "SETUP_FILE_MAX".to_owned(),
                SETUP_FETCH_MAX_BYTES.to_string(),
            ),
        ],
    };
    let fetched = toolbox.call(ToolName::Bash, &input, &ctx).await;
    let result = match fetched {
        Ok(ToolOutcome::Completed { output }) => {
            let code = output.get("exitCode").and_then(Value::as_i64).unwrap_or(-1);
            if code == 0 {
                match toolbox.read_bytes(&out, SETUP_FETCH_MAX_BYTES).await {
                    Ok(FileRead::Bytes(b)) => Ok(b),
                    Ok(FileRead::Missing) => Err("the fetch wrote no file".to_owned()),
                    Ok(FileRead::Failed(ToolOutcome::Failed { message, .. })) => {
                        Err(format!("the fetched file could not be read: {message}"))
                    }
                    Ok(FileRead::Failed(_)) => Err("the fetched file could not be read".to_owned()),
                    Err(e) => Err(e.to_string()),
                }
            } else {
                let stderr = output.get("stderr").and_then(Value::as_str).unwrap_or("");
                let why = if code == 63 {
                    format!("it is past {SETUP_FETCH_MAX_BYTES} bytes")
                } else {
                    format!("curl exit code {code}: {}", tail_chars(stderr.trim(), 500))
                };
                Err(why)
            }
        }
        Ok(ToolOutcome::Failed { code, message, .. }) => Err(format!("{code}: {message}")),
        Err(e) => Err(e.to_string()),
    };
    // The temporary file goes either way (a partial one too).
    let rm = json!({"command": "rm -f -- \"$SETUP_FILE_OUT\"", "timeout": 10});
    let ctx = CallContext {
        cancel: cancel.child_token(),
        env: vec![("SETUP_FILE_OUT".to_owned(), out)],
    };
    let _ = toolbox.call(ToolName::Bash, &rm, &ctx).await;
    result.map_err(|why| FileError::Fetch {
        url: redact_url(url),
        why,
    })
}

/// A URL as logged: without any user-info (a credential) or query string.
fn redact_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut u) => {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.set_query(None);
            u.to_string()
        }
        Err(_) => "(an unparsable url)".to_owned(),
    }
}

fn write_marker(path: &Path, record: &Value) {
    if let Err(e) = std::fs::write(path, format!("{record}\n")) {
        tracing::error!(path = %path.display(), error = %e, "could not record that the setup ran");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_as_numbers_or_octal_text() {
        assert_eq!(parse_mode(&json!(420)), Some(0o644));
        assert_eq!(parse_mode(&json!("0755")), Some(0o755));
        assert_eq!(parse_mode(&json!("644")), Some(0o644));
        assert_eq!(parse_mode(&json!("rwx")), None);
        assert_eq!(parse_mode(&json!(0o17777)), None);
    }

    #[test]
    fn urls_are_logged_without_credentials() {
        assert_eq!(
            redact_url("https://user:pw@example.com/a/b.tgz?token=x"),
            "https://example.com/a/b.tgz"
        );
        assert_eq!(redact_url("not a url"), "(an unparsable url)");
    }

    #[test]
    fn stderr_tail_keeps_the_end() {
        assert_eq!(tail_chars("abcdef", 3), "def");
        assert_eq!(tail_chars("ab", 3), "ab");
    }
}
