//! The model's `read_artifact {artifactId, version?, offset?, length?}` tool: podhost's own
//! (a `harness` target effect), for reading a spilled result or any file artifact of the session.
//!
//! Invariants: one call reads at most [`READ_ARTIFACT_MAX_BYTES`] (v2 notes §7.5); the answer is
//! valid text cut on a character boundary, headed by what was read and, when bytes are left,
//! followed by the exact offset and version to continue with — so pages read one after another
//! join into the artifact's bytes. Binary content and folders get a note instead of bytes.
//! Every failure is a failed outcome the model can act on, never a panic.

use std::sync::OnceLock;

use serde::Deserialize;
use serde_json::Value;

use super::{ArtifactError, Artifacts};
use crate::tools::{ToolDefinition, ToolOutcome};

/// The most bytes one `read_artifact` call returns.
pub const READ_ARTIFACT_MAX_BYTES: u64 = 32 * 1024;

/// Failure codes of `read_artifact`.
pub mod codes {
    pub const INVALID_INPUT: &str = crate::floor::codes::tool::INVALID_INPUT;
    pub const NOT_FOUND: &str = "artifact.not_found";
    pub const INVALID: &str = "artifact.invalid";
    pub const UNAVAILABLE: &str = "artifact.unavailable";
}

const SOURCE: &str = include_str!("../../../../tools/read_artifact.json");

/// The model-facing definition (tools/read_artifact.json).
pub fn read_artifact_definition() -> &'static ToolDefinition {
    static PARSED: OnceLock<ToolDefinition> = OnceLock::new();
    PARSED.get_or_init(|| {
        // The file is checked by the test below; a broken one still yields a named tool.
        serde_json::from_str(SOURCE).unwrap_or_else(|_| ToolDefinition {
            name: "read_artifact".to_owned(),
            description: String::new(),
            input_schema: serde_json::json!({"type": "object"}),
            output_schema: None,
        })
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Input {
    artifact_id: String,
    version: Option<u64>,
    offset: Option<u64>,
    length: Option<u64>,
}

fn invalid_input(message: impl std::fmt::Display) -> ToolOutcome {
    ToolOutcome::failed(
        codes::INVALID_INPUT,
        format!("Invalid read_artifact input: {message}."),
    )
}

/// Runs one `read_artifact` call.
pub async fn read_for_model(artifacts: &Artifacts, args: &Value) -> ToolOutcome {
    let input: Input = match Input::deserialize(args) {
        Ok(i) => i,
        Err(e) => return invalid_input(e),
    };
    if input.artifact_id.is_empty() {
        return invalid_input("artifactId is empty");
    }
    if input.version == Some(0) {
        return invalid_input("version starts at 1");
    }
    if input.length == Some(0) {
        return invalid_input("length must be at least 1");
    }
    let id = input.artifact_id.as_str();
    let offset = input.offset.unwrap_or(0);
    let length = input
        .length
        .unwrap_or(READ_ARTIFACT_MAX_BYTES)
        .min(READ_ARTIFACT_MAX_BYTES);
    let chunk = match artifacts
        .read_chunk(id, input.version, offset, Some(length))
        .await
    {
        Ok(c) => c,
        Err(e) => return read_failed(artifacts, id, input.version, offset, e).await,
    };
    let meta = &chunk.meta;
    let what = format!(
        "artifact {id} \"{}\" version {} ({}, {} bytes)",
        meta.name,
        meta.version,
        meta.content_type.as_deref().unwrap_or("no media type"),
        meta.size
    );
    if meta.is_folder() {
        return ToolOutcome::completed(format!(
            "[{what} is a folder; read_artifact reads file artifacts only]"
        ));
    }
    if chunk.bytes.is_empty() {
        return ToolOutcome::completed(format!(
            "[{what}: offset {offset} is its end; nothing more to read]"
        ));
    }
    let Some((start, text)) = text_of(&chunk.bytes, chunk.eof) else {
        return ToolOutcome::completed(format!(
            "[{what}: bytes from offset {offset} are binary, not text; read_artifact shows text only]"
        ));
    };
    let start = offset + start as u64;
    let end = start + text.len() as u64;
    let mut out = format!("[{what}: offset {start}, {} bytes shown]\n", text.len());
    out.push_str(text);
    if end < meta.size {
        out.push_str(&format!(
            "\n[{} bytes left: continue with offset {end} and version {}]",
            meta.size - end,
            meta.version
        ));
    }
    ToolOutcome::completed(out)
}

/// The bytes as text: leading continuation bytes (an offset inside a character) skipped, a
/// trailing partial character left for the next page unless this is the end. `None` when the
/// rest is not UTF-8 or holds NUL bytes. Returns the bytes skipped at the start and the text.
fn text_of(bytes: &[u8], eof: bool) -> Option<(usize, &str)> {
    let skip = bytes
        .iter()
        .take(3)
        .take_while(|b| (**b & 0xC0) == 0x80)
        .count();
    let body = &bytes[skip..];
    let text = match std::str::from_utf8(body) {
        Ok(t) => t,
        Err(e) if !eof && e.error_len().is_none() && e.valid_up_to() > 0 => {
            // Only an incomplete character at the very end: cut before it.
            std::str::from_utf8(&body[..e.valid_up_to()]).ok()?
        }
        Err(_) => return None,
    };
    if text.is_empty() || text.contains('\0') {
        return None;
    }
    Some((skip, text))
}

async fn read_failed(
    artifacts: &Artifacts,
    id: &str,
    version: Option<u64>,
    offset: u64,
    e: ArtifactError,
) -> ToolOutcome {
    let which = match version {
        Some(v) => format!("artifact {id} version {v}"),
        None => format!("artifact {id}"),
    };
    match e {
        ArtifactError::NotFound { .. } => ToolOutcome::failed(
            codes::NOT_FOUND,
            format!("There is no {which} this session can read."),
        ),
        ArtifactError::Invalid { message, .. } => {
            // The likely cause is an offset past the end: say so with the size.
            if offset > 0
                && let Ok(meta) = artifacts.metadata(id, version).await
                && offset > meta.size
            {
                return ToolOutcome::failed(
                    codes::INVALID_INPUT,
                    format!(
                        "Offset {offset} is past the end of {which} ({} bytes).",
                        meta.size
                    ),
                );
            }
            ToolOutcome::failed(
                codes::INVALID,
                format!("Reading {which} was refused: {message}"),
            )
        }
        other => ToolOutcome::Failed {
            code: codes::UNAVAILABLE.to_owned(),
            message: format!("Reading {which} failed: {other}"),
            retryable: Some(true),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_definition_parses_and_names_the_tool() {
        let def: ToolDefinition = serde_json::from_str(SOURCE).unwrap();
        assert_eq!(def.name, "read_artifact");
        assert_eq!(def.input_schema["type"], "object");
        assert_eq!(def.input_schema["additionalProperties"], false);
        assert_eq!(
            def.input_schema["properties"]["length"]["maximum"],
            READ_ARTIFACT_MAX_BYTES
        );
        assert_eq!(read_artifact_definition(), &def);
    }

    #[test]
    fn text_pages_cut_on_character_boundaries() {
        let s = "aé😀".as_bytes(); // 1 + 2 + 4 bytes
        assert_eq!(text_of(&s[..5], false), Some((0, "aé")));
        assert_eq!(text_of(&s[..5], true), None, "a cut character at the end");
        assert_eq!(text_of(&s[2..], true), Some((1, "😀")));
        assert_eq!(text_of(b"a\0b", true), None);
        assert_eq!(text_of(&[0xff, 0x41], true), None);
    }
}
