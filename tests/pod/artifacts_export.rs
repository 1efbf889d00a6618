//! The outputs folder saved at a completed turn's end.

use std::os::unix::fs::symlink;
use std::path::Path;

use podhost::nylorun::artifacts::export::{
    ExportOutcome, ExportProblem, ExportedFile, export_outputs,
};
use podhost::nylorun::artifacts::read_for_model;
use podhost::tools::ToolOutcome;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::driven_runs::{Pod, within};

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn put(root: &Path, rel: &str, bytes: &[u8]) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, bytes).unwrap();
}

fn exported(rel: &str, bytes: &[u8]) -> ExportedFile {
    ExportedFile {
        path: rel.to_owned(),
        size: bytes.len() as u64,
        sha256: sha(bytes),
    }
}

fn skipped(path: Option<&str>, reason: &str, message: &str, limit: Option<u64>) -> ExportProblem {
    ExportProblem {
        path: path.map(str::to_owned),
        reason: reason.to_owned(),
        message: message.to_owned(),
        limit,
    }
}

fn outputs(pod: &Pod) -> std::path::PathBuf {
    pod.dirs.workspace.join("outputs")
}

#[tokio::test]
async fn nested_files_become_one_folder_version_with_their_sizes_and_hashes() {
    let mut pod = Pod::start().await;
    let run = pod
        .run("run-e", "ses_e", json!({"chunkBytes": 1024}), json!({}))
        .await;
    let out = outputs(&pod);
    let big: Vec<u8> = (0..3000u32).map(|i| (i % 253) as u8).collect();
    put(&out, "report.md", b"# Report\n");
    put(&out, "data/big.bin", &big);
    put(&out, "data/sub/deep.txt", b"deep");
    put(&out, "empty.txt", b"");
    std::fs::create_dir_all(out.join("nothing/here")).unwrap();

    let report = within(export_outputs(
        &run.artifacts(),
        &pod.toolbox(),
        &out,
        &run.turn,
    ))
    .await;
    let want = vec![
        exported("data/big.bin", &big),
        exported("data/sub/deep.txt", b"deep"),
        exported("empty.txt", b""),
        exported("report.md", b"# Report\n"),
    ];
    assert_eq!(report.stored, want);
    assert_eq!((report.skipped.len(), report.failed.len()), (0, 0));
    let ExportOutcome::Written { artifact, created } = &report.outcome else {
        panic!("{:?}", report.outcome);
    };
    assert_eq!(
        (
            artifact.kind.as_str(),
            artifact.name.as_str(),
            artifact.version,
            *created
        ),
        ("folder", "outputs", 1, true)
    );
    let files = pod
        .core
        .artifacts()
        .folder_files("ses_e", &artifact.artifact_id, 1);
    let want_files: Vec<(String, u64, String)> = want
        .iter()
        .map(|f| (f.path.clone(), f.size, f.sha256.clone()))
        .collect();
    assert_eq!(files, want_files);
    // The wire: the big file in chunks past chunkBytes, the others inline.
    let writes = pod.writes();
    assert_eq!(
        writes[0],
        json!({"op": "begin", "runId": "run-e", "key": "outputs:turn_run-e", "kind": "folder",
               "name": "outputs", "sameName": true})
    );
    let ops: Vec<String> = writes
        .iter()
        .map(|p| match p["op"].as_str().unwrap() {
            "file" => format!(
                "file {} inline={}",
                p["path"].as_str().unwrap(),
                p.get("base64").is_some()
            ),
            "chunk" => format!(
                "chunk@{} {}",
                p["offset"],
                p["sha256"].as_str().unwrap() == sha(&big)
            ),
            op => op.to_owned(),
        })
        .collect();
    assert_eq!(
        ops,
        [
            "begin",
            "file data/big.bin inline=false",
            "chunk@0 true",
            "chunk@1024 true",
            "chunk@2048 true",
            "file data/sub/deep.txt inline=true",
            "file empty.txt inline=true",
            "file report.md inline=true",
            "commit",
        ]
    );
    assert_eq!(report.claims(), Vec::<(&str, Value)>::new());
    // The model reading the folder is told what it is.
    let id = artifact.artifact_id.clone();
    assert_eq!(
        within(read_for_model(&run.artifacts(), &json!({"artifactId": id}))).await,
        ToolOutcome::completed(format!(
            "[artifact {id} \"outputs\" version 1 (no media type, 3013 bytes) is a folder; \
             read_artifact reads file artifacts only]"
        ))
    );
    run.finish();
}

#[tokio::test]
async fn a_missing_or_empty_outputs_directory_sends_nothing() {
    let mut pod = Pod::start().await;
    let run = pod.run("run-n", "ses_n", json!({}), json!({})).await;
    let out = outputs(&pod);
    let report = within(export_outputs(
        &run.artifacts(),
        &pod.toolbox(),
        &out,
        &run.turn,
    ))
    .await;
    assert_eq!(
        report.outcome,
        ExportOutcome::Nothing {
            reason: "there is no outputs directory".into()
        }
    );
    std::fs::create_dir_all(out.join("only/dirs")).unwrap();
    let report = within(export_outputs(
        &run.artifacts(),
        &pod.toolbox(),
        &out,
        &run.turn,
    ))
    .await;
    assert_eq!(
        report.outcome,
        ExportOutcome::Nothing {
            reason: "the outputs directory holds no files".into()
        }
    );
    assert_eq!(
        report.summary(),
        "No outputs saved: the outputs directory holds no files."
    );
    assert_eq!(pod.writes(), Vec::<Value>::new());
    run.finish();
}

#[tokio::test]
async fn a_file_past_the_per_file_limit_is_skipped_and_the_rest_stored() {
    let mut pod = Pod::start().await;
    let run = pod.run("run-f", "ses_f", json!({}), json!({})).await;
    pod.core.artifacts().set_limits(1 << 20, 1000, 1 << 20);
    let out = outputs(&pod);
    put(&out, "a.txt", b"aaa");
    put(&out, "big.bin", &[7u8; 5000]);
    put(&out, "z.txt", b"zzz");
    let report = within(export_outputs(
        &run.artifacts(),
        &pod.toolbox(),
        &out,
        &run.turn,
    ))
    .await;
    assert_eq!(
        report.stored,
        vec![exported("a.txt", b"aaa"), exported("z.txt", b"zzz")]
    );
    assert_eq!(
        report.skipped,
        vec![skipped(
            Some("big.bin"),
            "file_too_large",
            "5000 bytes is past the 1000-byte limit of one file",
            Some(1000)
        )]
    );
    assert!(matches!(
        report.outcome,
        ExportOutcome::Written { created: true, .. }
    ));
    assert_eq!(
        report.summary(),
        "Saved 2 file(s) of the outputs directory as the outputs folder, version 1. \
         big.bin: 5000 bytes is past the 1000-byte limit of one file (file_too_large)."
    );
    // A version was stored, so nothing is claimed; the skip is in the report and the log.
    assert_eq!(report.claims(), Vec::<(&str, Value)>::new());
    run.finish();
}

#[tokio::test]
async fn more_files_than_folder_entries_stores_the_first_by_path() {
    let mut pod = Pod::start().await;
    let run = pod
        .run("run-m", "ses_m", json!({"folderEntries": 3}), json!({}))
        .await;
    let out = outputs(&pod);
    for name in ["e", "c", "a", "d", "b"] {
        put(&out, &format!("{name}.txt"), name.as_bytes());
    }
    let report = within(export_outputs(
        &run.artifacts(),
        &pod.toolbox(),
        &out,
        &run.turn,
    ))
    .await;
    assert_eq!(
        report.stored,
        vec![
            exported("a.txt", b"a"),
            exported("b.txt", b"b"),
            exported("c.txt", b"c")
        ]
    );
    assert_eq!(
        report.skipped,
        vec![skipped(
            None,
            "too_many_files",
            "2 more file(s) past the limit of 3 files in one folder version",
            Some(3)
        )]
    );
    run.finish();
}

#[tokio::test]
async fn symlinks_are_never_followed() {
    let mut pod = Pod::start().await;
    let run = pod.run("run-y", "ses_y", json!({}), json!({})).await;
    let out = outputs(&pod);
    let outside = pod.dirs.dir.path().join("secret");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("key.txt"), b"do not export").unwrap();
    put(&out, "ok.txt", b"ok");
    symlink(outside.join("key.txt"), out.join("link.txt")).unwrap();
    symlink(&outside, out.join("dir")).unwrap();
    let report = within(export_outputs(
        &run.artifacts(),
        &pod.toolbox(),
        &out,
        &run.turn,
    ))
    .await;
    assert_eq!(report.stored, vec![exported("ok.txt", b"ok")]);
    let link = "a symbolic link; links are not followed";
    assert_eq!(
        report.skipped,
        vec![
            skipped(Some("dir"), "symlink", link, None),
            skipped(Some("link.txt"), "symlink", link, None),
        ]
    );
    let ExportOutcome::Written { artifact, .. } = &report.outcome else {
        panic!("{:?}", report.outcome);
    };
    let files = pod
        .core
        .artifacts()
        .folder_files("ses_y", &artifact.artifact_id, 1);
    assert_eq!(files, vec![("ok.txt".to_owned(), 2, sha(b"ok"))]);

    // The outputs directory itself a link: nothing is followed, nothing sent, and said so.
    let run2 = pod.run("run-y2", "ses_y2", json!({}), json!({})).await;
    let aliased = pod.dirs.dir.path().join("alias");
    symlink(&outside, &aliased).unwrap();
    let before = pod.writes().len();
    let report = within(export_outputs(
        &run2.artifacts(),
        &pod.toolbox(),
        &aliased,
        &run2.turn,
    ))
    .await;
    let message = "no file of the outputs directory could be stored: the outputs directory is \
                   a symbolic link; links are not followed";
    assert_eq!(
        report.outcome,
        ExportOutcome::Skipped {
            reason: "symlink".into(),
            message: message.into(),
            limit: None
        }
    );
    assert_eq!(
        report.claims(),
        vec![(
            "artifact.export.skipped",
            json!({"name": "outputs", "reason": "symlink", "message": message})
        )]
    );
    assert_eq!(pod.writes().len(), before);
    run.finish();
    run2.finish();
}

#[tokio::test]
async fn an_unchanged_folder_adds_no_version_and_a_replayed_turn_sends_nothing_more() {
    let mut pod = Pod::start().await;
    let out = outputs(&pod);
    put(&out, "a.txt", b"same");
    let run = pod.run("run-u1", "ses_u", json!({}), json!({})).await;
    let first = within(export_outputs(
        &run.artifacts(),
        &pod.toolbox(),
        &out,
        &run.turn,
    ))
    .await;
    let ExportOutcome::Written {
        artifact,
        created: true,
    } = &first.outcome
    else {
        panic!("{:?}", first.outcome);
    };
    let id = artifact.artifact_id.clone();
    // The same turn again (a replay): its key is written, nothing more is sent.
    let before = pod.writes().len();
    let replay = within(export_outputs(
        &run.artifacts(),
        &pod.toolbox(),
        &out,
        &run.turn,
    ))
    .await;
    assert_eq!(
        replay.outcome,
        ExportOutcome::Written {
            artifact: artifact.clone(),
            created: false
        }
    );
    assert_eq!(pod.write_ops()[before..], ["begin"]);
    run.finish();
    // The next turn with the same files: unchanged, version 1 named.
    let run2 = pod.run("run-u2", "ses_u", json!({}), json!({})).await;
    let second = within(export_outputs(
        &run2.artifacts(),
        &pod.toolbox(),
        &out,
        &run2.turn,
    ))
    .await;
    let ExportOutcome::Unchanged { artifact } = &second.outcome else {
        panic!("{:?}", second.outcome);
    };
    assert_eq!(
        (artifact.artifact_id.as_str(), artifact.version),
        (id.as_str(), 1)
    );
    assert_eq!(pod.core.artifacts().versions("ses_u", &id).len(), 1);
    // A change makes version 2 of the same folder.
    put(&out, "a.txt", b"changed");
    let run3 = pod.run("run-u3", "ses_u", json!({}), json!({})).await;
    let third = within(export_outputs(
        &run3.artifacts(),
        &pod.toolbox(),
        &out,
        &run3.turn,
    ))
    .await;
    let ExportOutcome::Written {
        artifact,
        created: true,
    } = &third.outcome
    else {
        panic!("{:?}", third.outcome);
    };
    assert_eq!(
        (artifact.artifact_id.as_str(), artifact.version),
        (id.as_str(), 2)
    );
    run2.finish();
    run3.finish();
}

#[tokio::test]
async fn a_refused_commit_stores_nothing_and_is_claimed() {
    let mut pod = Pod::start().await;
    let run = pod.run("run-t", "ses_t", json!({}), json!({})).await;
    let out = outputs(&pod);
    put(&out, "a.txt", b"0123456789");
    pod.core.artifacts().set_total_before_commit(5);
    let report = within(export_outputs(
        &run.artifacts(),
        &pod.toolbox(),
        &out,
        &run.turn,
    ))
    .await;
    let message = "The version adds 10 bytes; the Tenant has 5 left";
    assert_eq!(
        report.outcome,
        ExportOutcome::Skipped {
            reason: "tenant_total".into(),
            message: message.into(),
            limit: Some(5)
        }
    );
    assert_eq!(report.stored, Vec::new());
    assert_eq!(
        report.claims(),
        vec![(
            "artifact.export.skipped",
            json!({"name": "outputs", "reason": "tenant_total", "message": message, "limit": 5})
        )]
    );
    assert_eq!(pod.core.artifacts().list("ses_t"), Vec::<Value>::new());
    assert_eq!(pod.core.artifacts().open_uploads(), 0);
    run.finish();
}

#[tokio::test]
async fn a_file_whose_bytes_change_while_sent_fails_alone() {
    let mut pod = Pod::start().await;
    let run = pod
        .run("run-c", "ses_c", json!({"chunkBytes": 1024}), json!({}))
        .await;
    let out = outputs(&pod);
    put(&out, "a.txt", b"kept");
    put(&out, "big.bin", &[3u8; 2500]);
    put(&out, "z.txt", b"kept too");
    pod.core.artifacts().corrupt_next_folder_chunk();
    let report = within(export_outputs(
        &run.artifacts(),
        &pod.toolbox(),
        &out,
        &run.turn,
    ))
    .await;
    assert_eq!(
        report.failed,
        vec![skipped(
            Some("big.bin"),
            "rejected",
            "core ended the upload at this file, which was left out: core refused chunk: The \
             bytes of big.bin do not match its sha256; the upload ended",
            None
        )]
    );
    assert_eq!(
        report.stored,
        vec![exported("a.txt", b"kept"), exported("z.txt", b"kept too")]
    );
    assert!(matches!(
        report.outcome,
        ExportOutcome::Written { created: true, .. }
    ));
    // The first upload ended at the file's last chunk; the export began again without it.
    assert_eq!(
        pod.write_ops(),
        [
            "begin",
            "file",
            "file",
            "chunk@0",
            "chunk@1024",
            "chunk@2048",
            "abort",
            "begin",
            "file",
            "file",
            "commit"
        ]
    );
    assert_eq!(pod.core.artifacts().open_uploads(), 0);
    run.finish();
}
