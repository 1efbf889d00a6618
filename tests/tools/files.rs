//! `read`, `write` and `edit` through the toolbox: paging, encodings, line endings, symlink
//! escapes, atomic replacement, concurrent edits, and a huge file read by the real binary.

mod edit;
mod escapes;
mod huge;
mod read;
mod write;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use podhost::tools::{ToolName, ToolOutcome, Toolbox, codes};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::support::{TestWorkspace, executor, podhost_bin};

fn completed(output: impl Into<Value>) -> ToolOutcome {
    ToolOutcome::completed(output)
}

fn failed(code: &str, message: impl Into<String>) -> ToolOutcome {
    ToolOutcome::failed(code, message)
}

fn put(ws: &TestWorkspace, rel: &str, bytes: impl AsRef<[u8]>) -> PathBuf {
    let path = ws.root().join(rel);
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).unwrap();
    }
    fs::write(&path, bytes).unwrap();
    path
}

async fn read(ws: &TestWorkspace, input: Value) -> ToolOutcome {
    ws.run(ToolName::Read, input).await
}

fn utf16(bom_and_order: &str, text: &str) -> Vec<u8> {
    let mut out = Vec::new();
    match bom_and_order {
        "le" => {
            out.extend_from_slice(b"\xFF\xFE");
            text.encode_utf16()
                .for_each(|u| out.extend_from_slice(&u.to_le_bytes()));
        }
        _ => {
            out.extend_from_slice(b"\xFE\xFF");
            text.encode_utf16()
                .for_each(|u| out.extend_from_slice(&u.to_be_bytes()));
        }
    }
    out
}

fn mode_of(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

fn dir_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

async fn edit(ws: &TestWorkspace, input: Value) -> ToolOutcome {
    ws.run(ToolName::Edit, input).await
}

/// Writes `before`, runs one edit, returns its outcome and the bytes afterwards.
async fn edit_bytes(
    before: &[u8],
    old: &str,
    new: &str,
    replace_all: bool,
) -> (ToolOutcome, Vec<u8>) {
    let ws = TestWorkspace::new();
    let path = put(&ws, "f.txt", before);
    let outcome = edit(
        &ws,
        json!({"path": "f.txt", "old_string": old, "new_string": new, "replace_all": replace_all}),
    )
    .await;
    (without_snippet(outcome), fs::read(path).unwrap())
}

/// An edit's outcome without its snippet: the tests of encodings and line endings look at the
/// bytes (`edit_returns_the_changed_lines_in_context` checks snippets).
fn without_snippet(mut outcome: ToolOutcome) -> ToolOutcome {
    if let ToolOutcome::Completed {
        output: serde_json::Value::Object(o),
    } = &mut outcome
    {
        o.remove("snippet");
    }
    outcome
}

fn replaced(n: usize) -> ToolOutcome {
    completed(json!({"path": "f.txt", "replacements": n}))
}

#[tokio::test]
async fn invalid_inputs_are_refused_with_what_is_wrong() {
    let ws = TestWorkspace::new();
    put(&ws, "a.txt", "a\n");
    let cases = [
        (
            ToolName::Read,
            json!({}),
            "Invalid read input: missing field `path`.",
        ),
        (
            ToolName::Read,
            json!({"path": "a.txt", "lines": 3}),
            "Invalid read input: unknown field `lines`, expected one of `path`, `offset`, `limit`.",
        ),
        (
            ToolName::Read,
            json!({"path": "a.txt", "limit": 0}),
            "Invalid read input: limit must be from 1 to 5000 (got 0).",
        ),
        (
            ToolName::Read,
            json!({"path": "a.txt", "limit": 5001}),
            "Invalid read input: limit must be from 1 to 5000 (got 5001).",
        ),
        (
            ToolName::Read,
            json!({"path": "a.txt", "offset": 0}),
            "Invalid read input: offset is 1-based and must be at least 1 (got 0).",
        ),
        (
            ToolName::Read,
            json!({"path": "a.txt", "offset": -1}),
            "Invalid read input: offset: invalid value: integer `-1`, expected u64.",
        ),
        (
            ToolName::Read,
            json!({"path": "a.txt", "limit": "3"}),
            "Invalid read input: limit: invalid type: string \"3\", expected u64.",
        ),
        (ToolName::Read, json!({"path": ""}), "The path is empty."),
        (
            ToolName::Write,
            json!({"path": "b.txt"}),
            "Invalid write input: missing field `content`.",
        ),
        (
            ToolName::Write,
            json!({"path": "b.txt", "content": "x", "mode": 420}),
            "Invalid write input: unknown field `mode`, expected `path` or `content`.",
        ),
        (
            ToolName::Edit,
            json!({"path": "a.txt", "old_string": "a"}),
            "Invalid edit input: missing field `new_string`.",
        ),
        (
            ToolName::Edit,
            json!({"path": "a.txt", "old_string": "a", "new_string": "b", "all": true}),
            "Invalid edit input: unknown field `all`, expected one of `path`, `old_string`, \
             `new_string`, `replace_all`.",
        ),
        (
            ToolName::Edit,
            json!({"path": "a.txt", "old_string": "", "new_string": "b"}),
            "Invalid edit input: old_string must not be empty (use write to create a file).",
        ),
    ];
    for (tool, input, message) in cases {
        assert_eq!(
            ws.run(tool, input.clone()).await,
            failed(codes::INVALID_INPUT, message),
            "{tool} {input}"
        );
    }
    assert!(!ws.root().join("b.txt").exists());
    assert_eq!(fs::read(ws.root().join("a.txt")).unwrap(), b"a\n");
}

#[tokio::test]
async fn a_cancelled_call_changes_nothing() {
    let ws = TestWorkspace::new();
    let path = put(&ws, "a.txt", "one\n");
    let cancel = tokio_util::sync::CancellationToken::new();
    cancel.cancel();
    let tb = ws.toolbox.clone();
    let outcomes = tokio::task::spawn_blocking(move || {
        use podhost::tools::{edit, read, write};
        let read_input = serde_json::from_value(json!({"path": "a.txt"})).unwrap();
        let write_input =
            serde_json::from_value(json!({"path": "a.txt", "content": "two\n"})).unwrap();
        let edit_input = serde_json::from_value(
            json!({"path": "a.txt", "old_string": "one", "new_string": "two"}),
        )
        .unwrap();
        [
            read::read(&tb, read_input, &cancel),
            write::write(&tb, write_input, &cancel),
            edit::edit(&tb, edit_input, &cancel),
        ]
    });
    let outcomes = tokio::time::timeout(Duration::from_secs(10), outcomes)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        outcomes,
        [
            failed(codes::CANCELLED, "The read was cancelled."),
            failed(
                codes::CANCELLED,
                "The write was cancelled; nothing was written."
            ),
            failed(
                codes::CANCELLED,
                "The edit was cancelled; the file was left unchanged."
            ),
        ]
    );
    assert_eq!(fs::read_to_string(path).unwrap(), "one\n");
    assert_eq!(dir_names(ws.root()), vec!["a.txt"]);
}
