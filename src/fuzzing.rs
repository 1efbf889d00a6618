//! The bodies of podhost's fuzz targets (`fuzz/`), compiled only into test and fuzz builds (the
//! `fuzzing` feature): each takes arbitrary bytes, feeds them to one parser or checker of
//! podhost, and panics when an invariant breaks. `cargo test` replays the kept corpora through
//! the same functions (`tests/fuzz_corpus.rs`).
//!
//! Invariants checked, beyond "no panic": a frame that parses serializes back to itself; the
//! canonical JSON is idempotent and the request hash is 64 lowercase hex digits; a path that
//! resolves stays inside the workspace's roots, through `..` and symlinks; an edit that fails
//! leaves the file as it was, one that succeeds writes the new text.
//!
//! Non-goals: finding slow inputs (libFuzzer's `-timeout` does), bash (fuzzed commands are
//! never run).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::Value;

use crate::byoh::protocol::{CancelRequest, SubmitRequest};
use crate::floor::workspace::{Access, Workspace};
use crate::nylorun::artifacts::wire::{ReadAnswer, WriteAnswer};
use crate::nylorun::link::canonical::{canonical, request_hash};
use crate::nylorun::link::channel::parse_answer;
use crate::nylorun::link::protocol::{Frame, HelloAnswer, LeaseAnswer, RenewAnswer, RunGrant};
use crate::nylorun::turn::turn_start::TurnStart;
use crate::tools::{ToolName, ToolOutcome, Toolbox};

fn json(data: &[u8]) -> Option<Value> {
    serde_json::from_slice(data).ok()
}

/// The Harness API frame decoder: what `channel` does with a text message.
pub fn frame(data: &[u8]) {
    let Some(v) = json(data) else { return };
    let Ok(f) = serde_json::from_value::<Frame>(v) else {
        return;
    };
    let _ = f.check();
    let back = serde_json::to_value(&f).expect("a frame serializes");
    let again: Frame = serde_json::from_value(back).expect("a serialized frame parses");
    assert_eq!(again, f, "a frame does not survive a round trip");
}

/// Canonical JSON and the request hash.
pub fn canonical_hash(data: &[u8]) {
    let Some(v) = json(data) else { return };
    let c = canonical(&v);
    let reparsed: Value = serde_json::from_str(&c).expect("canonical JSON parses");
    assert_eq!(canonical(&reparsed), c, "canonical JSON is not idempotent");
    let h = request_hash(&v);
    assert!(
        h.len() == 64
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        "{h}"
    );
    assert_eq!(request_hash(&reparsed), h);
}

/// A TurnStart, and every answer of core podhost parses.
pub fn core_answers(data: &[u8]) {
    let Some(v) = json(data) else { return };
    if let Ok(ts) = TurnStart::parse(&v) {
        let grant = RunGrant {
            run_id: "r".into(),
            session_id: ts.checkpoint.session_id.clone(),
            turn_id: ts.checkpoint.turn_id.clone(),
            epoch: 1,
            token: None,
            token_expires_at: None,
        };
        let _ = ts.check(&grant);
        let _ = ts.yield_after();
    }
    if let Ok(a) = parse_answer::<LeaseAnswer>("lease", v.clone()) {
        let _ = a.run.check();
    }
    if let Ok(a) = parse_answer::<HelloAnswer>("hello", v.clone()) {
        let _ = a.check();
    }
    let _ = parse_answer::<RenewAnswer>("lease.renew", v.clone());
    let _ = parse_answer::<ReadAnswer>("artifact.read", v.clone());
    if let Ok(WriteAnswer::Open(o)) = parse_answer::<WriteAnswer>("artifact.write", v) {
        let _ = o.check();
    }
}

/// The BYOH request bodies and their protocol rules.
pub fn byoh_bodies(data: &[u8]) {
    if let Ok(req) = serde_json::from_slice::<SubmitRequest>(data) {
        let _ = req.validate();
        let _ = req.validate_resume();
        let creds = req.model_connection.credentials();
        for m in &req.input_messages {
            let mut m = m.clone();
            creds.scrub_message(&mut m);
            let text = serde_json::to_string(&m).expect("a message serializes");
            assert!(!creds.leak_in(&text), "a credential is stored: {text}");
        }
        // A connection whose URL breaks the rules is refused before anything is stored.
        if let Ok(conn) = req.model_connection.checked() {
            let stored = conn.stored();
            // What is stored never carries a credential of the submission.
            assert!(
                !creds.leak_in(stored.base_url.as_str()),
                "a credential is stored: {}",
                stored.base_url
            );
            // A URL that had to be redacted is kept in memory for the calls.
            assert_eq!(
                conn.url_has_credentials(),
                stored.base_url != *conn.base_url
            );
        }
    }
    if let Ok(req) = serde_json::from_slice::<CancelRequest>(data) {
        let _ = req.validate();
    }
}

/// A workspace with a file, a directory, and symlinks that leave it, made once.
fn workspace() -> &'static (Workspace, Vec<PathBuf>) {
    static WS: OnceLock<(Workspace, Vec<PathBuf>)> = OnceLock::new();
    WS.get_or_init(|| {
        let base = std::env::temp_dir().join(format!("podhost-fuzz-{}", std::process::id()));
        let root = base.join("workspace");
        let tmp = base.join("tmp");
        for d in [&root.join("dir/sub"), &tmp] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(root.join("dir/file.txt"), "x\n").unwrap();
        std::fs::write(base.join("secret.txt"), "outside\n").unwrap();
        let link = |to: &str, at: &str| {
            let _ = std::os::unix::fs::symlink(to, root.join(at));
        };
        link("/", "to-root");
        link("../secret.txt", "to-secret");
        link("dir", "to-dir");
        link("loop-b", "loop-a");
        link("loop-a", "loop-b");
        let ws = Workspace::new(&root, Some(Path::new("/workspace")))
            .unwrap()
            .with_root(&tmp, Some(Path::new("/tmp")), true);
        let roots = vec![root.canonicalize().unwrap(), tmp.canonicalize().unwrap()];
        (ws, roots)
    })
}

/// Path resolution: whatever the input, a resolved path is inside an allowed root.
pub fn paths(data: &[u8]) {
    let input = String::from_utf8_lossy(data);
    let (ws, roots) = workspace();
    for access in [Access::Read, Access::Write] {
        if let Ok(r) = ws.resolve(&input, access) {
            assert!(
                roots.iter().any(|root| r.host.starts_with(root)),
                "{input:?} resolved to {} outside the roots",
                r.host.display()
            );
        }
    }
}

/// The six tools' inputs: each parses or is refused with an outcome, never a panic.
pub fn tool_inputs(data: &[u8]) {
    let Some(v) = json(data) else { return };
    use crate::tools::parse;
    if let Ok(b) = parse::<crate::tools::bash::BashInput>(ToolName::Bash, &v) {
        let _ = crate::exec::validate_command(&b.command);
    }
    let _ = parse::<crate::tools::read::ReadInput>(ToolName::Read, &v);
    let _ = parse::<crate::tools::write::WriteInput>(ToolName::Write, &v);
    let _ = parse::<crate::tools::edit::EditInput>(ToolName::Edit, &v);
    let _ = parse::<crate::tools::grep::GrepInput>(ToolName::Grep, &v);
    let _ = parse::<crate::tools::glob::GlobInput>(ToolName::Glob, &v);
    // The paths they name resolve inside the roots, or are refused.
    if let Some(path) = v.get("path").and_then(Value::as_str) {
        paths(path.as_bytes());
    }
}

/// The edit tool's matching, on a real file: `data` is `flags, text, 0xff, old, 0xff, new`.
pub fn edit(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut parts = rest.splitn(3, |b| *b == 0xff);
    let (Some(text), Some(old), Some(new)) = (parts.next(), parts.next(), parts.next()) else {
        return;
    };
    let (Ok(old), Ok(new)) = (std::str::from_utf8(old), std::str::from_utf8(new)) else {
        return;
    };
    static TB: OnceLock<(tokio::runtime::Runtime, Toolbox, PathBuf)> = OnceLock::new();
    let (rt, tb, file) = TB.get_or_init(|| {
        let root = std::env::temp_dir().join(format!("podhost-fuzz-edit-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        let ws = Workspace::new(&root, Some(Path::new("/workspace"))).unwrap();
        let executor = crate::exec::Executor::new(crate::exec::ExecConfig {
            supervisor: PathBuf::from("/nonexistent/podhost-exec"),
            shell: crate::exec::find_shell(None),
            env: crate::exec::CommandEnv::new(
                crate::exec::BaseEnv {
                    home: root.clone(),
                    ..crate::exec::BaseEnv::default()
                },
                None,
            ),
            limits: crate::exec::ResourceLimits::default(),
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        (rt, Toolbox::new(ws, executor), root.join("f.txt"))
    });
    std::fs::write(file, text).unwrap();
    let input = serde_json::json!({
        "path": "f.txt", "old_string": old, "new_string": new, "replace_all": flags & 1 == 1,
    });
    let ctx = crate::tools::CallContext::default();
    let outcome = rt
        .block_on(tb.call(ToolName::Edit, &input, &ctx))
        .expect("no harness fault");
    let after = std::fs::read(file).unwrap();
    match outcome {
        ToolOutcome::Failed { .. } => assert_eq!(after, text, "a failed edit changed the file"),
        ToolOutcome::Completed { .. } => {
            // Line endings are the file's, not new_string's (a CR of new_string next to a newline
            // may become part of the line's own ending), and a U+FEFF that lands at the file's
            // start reads as its byte-order mark: compare without either.
            let folded = |s: &str| s.replace(['\r', '\u{feff}'], "");
            // The file keeps its encoding (a legacy one, UTF-16): read it as `read` does. A NUL
            // (given in new_string, or moved into the first bytes) makes it binary, as `write`
            // would have: then nothing else may have.
            let after_text = match crate::tools::encoding::decode(&after) {
                Ok(d) => d.text,
                Err(crate::tools::encoding::EncodingError::Binary) => {
                    assert!(
                        new.contains('\0') || text.contains(&0),
                        "an edit without a NUL made the file binary"
                    );
                    return;
                }
                Err(e) => panic!("an edited file does not decode: {e}"),
            };
            assert!(
                folded(&after_text).contains(&folded(new)),
                "the edited file lacks new_string"
            );
        }
    }
}
