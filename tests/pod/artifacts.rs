//! Artifacts over a real channel: an in-process pod whose run handler hands each granted run's
//! channel to the test ([`crate::driven_runs`]), which drives `podhost::nylorun::artifacts`
//! against the fake core's store. This module: reads, file writes, resumes, scope. Spilling, the
//! outputs export and skills are in `artifacts_*`.

use std::time::Duration;

use podhost::nylorun::artifacts::{ArtifactError, FileTarget, FolderStart, FolderTarget};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::driven_runs::{Driven, Pod, within};
use crate::fake_core::Event;

fn bytes(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

fn target(key: &str, name: &str) -> FileTarget {
    FileTarget {
        key: key.to_owned(),
        name: Some(name.to_owned()),
        ..FileTarget::default()
    }
}

#[tokio::test]
async fn a_file_goes_up_in_chunks_and_comes_back_pinned_to_its_version() {
    let mut pod = Pod::start().await;
    let run = pod
        .run("run-a", "ses_a", json!({"chunkBytes": 1024}), json!({}))
        .await;
    let a = run.artifacts();
    let body = bytes(5000);
    let w = within(a.write_file(&target("k1", "data.bin"), &body))
        .await
        .unwrap();
    assert_eq!(
        (w.artifact.version, w.artifact.size, w.created),
        (1, 5000, true)
    );
    assert_eq!(
        pod.write_ops(),
        [
            "begin",
            "chunk@0",
            "chunk@1024",
            "chunk@2048",
            "chunk@3072",
            "chunk@4096",
            "commit"
        ]
    );
    assert_eq!(
        pod.writes()[0],
        json!({"op": "begin", "runId": "run-a", "key": "k1", "name": "data.bin", "size": 5000})
    );
    let id = w.artifact.artifact_id.clone();
    assert_eq!(pod.core.artifacts().file_bytes("ses_a", &id, 1), body);

    // A second version; reading the first stays on it, every later chunk naming it.
    let v2 = within(a.write_file(
        &FileTarget {
            key: "k2".into(),
            artifact_id: Some(id.clone()),
            ..FileTarget::default()
        },
        b"second",
    ))
    .await
    .unwrap();
    assert_eq!(v2.artifact.version, 2);
    let (meta, back) = within(a.read_to_end(&id, None, 1 << 20)).await.unwrap();
    assert_eq!((meta.version, back), (2, b"second".to_vec()));
    let before = pod.requests("artifact.read").len();
    let (meta, back) = within(a.read_to_end(&id, Some(1), 1 << 20)).await.unwrap();
    assert_eq!((meta.version, meta.size), (1, 5000));
    assert_eq!(back, body);
    let reads: Vec<Value> = pod.requests("artifact.read")[before..].to_vec();
    let asked: Vec<(Value, Value)> = reads
        .iter()
        .map(|p| (p["version"].clone(), p["offset"].clone()))
        .collect();
    assert_eq!(
        asked,
        vec![
            (json!(1), Value::Null),
            (json!(1), json!(1024)),
            (json!(1), json!(2048)),
            (json!(1), json!(3072)),
            (json!(1), json!(4096)),
        ]
    );
    // The metadata alone: `length: 0`.
    let meta = within(a.metadata(&id, None)).await.unwrap();
    assert_eq!(
        (meta.version, meta.size, meta.name.as_str()),
        (2, 6, "data.bin")
    );
    assert_eq!(pod.requests("artifact.read").last().unwrap()["length"], 0);
    // Past the limit of this read: refused before any more is fetched.
    let e = within(a.read_to_end(&id, Some(1), 4000)).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("artifact {id} is 5000 bytes, past the 4000-byte limit of this read")
    );
    run.finish();
}

#[tokio::test]
async fn a_chunk_whose_answer_is_lost_is_sent_again_and_taken_once() {
    let mut pod = Pod::start().await;
    let run = pod
        .run("run-l", "ses_l", json!({"chunkBytes": 1024}), json!({}))
        .await;
    let a = run
        .artifacts()
        .with_request_timeout(Duration::from_millis(300));
    pod.core
        .artifacts()
        .drop_answer("artifact.write", Some("chunk"), 1);
    let body = bytes(3000);
    let w = within(a.write_file(&target("k", "x.bin"), &body))
        .await
        .unwrap();
    assert_eq!(
        pod.write_ops(),
        [
            "begin",
            "chunk@0",
            "chunk@1024",
            "chunk@1024",
            "chunk@2048",
            "commit"
        ]
    );
    // The lost request was given up with an abort frame before it was sent again.
    let aborts = pod
        .core
        .events()
        .iter()
        .filter(|e| matches!(e, Event::FromPod { frame, .. } if frame["t"] == "abort"))
        .count();
    assert_eq!(aborts, 1);
    assert_eq!(
        pod.core
            .artifacts()
            .file_bytes("ses_l", &w.artifact.artifact_id, 1),
        body
    );
    run.finish();
}

#[tokio::test]
async fn a_commit_whose_answer_is_lost_is_reconciled_by_its_key() {
    let mut pod = Pod::start().await;
    let run = pod
        .run("run-c", "ses_c", json!({"chunkBytes": 1024}), json!({}))
        .await;
    let a = run
        .artifacts()
        .with_request_timeout(Duration::from_millis(300));
    pod.core
        .artifacts()
        .drop_answer("artifact.write", Some("commit"), 0);
    let w = within(a.write_file(&target("kc", "x.bin"), &bytes(2000)))
        .await
        .unwrap();
    assert_eq!(
        pod.write_ops(),
        [
            "begin",
            "chunk@0",
            "chunk@1024",
            "commit",
            "commit",
            "begin"
        ]
    );
    // The second commit found the upload gone; the key named the version the first wrote.
    assert_eq!((w.artifact.version, w.created), (1, false));
    assert_eq!(pod.core.artifacts().list("ses_c").len(), 1);
    run.finish();
}

#[tokio::test]
async fn a_body_that_fits_is_one_begin_and_a_written_key_sends_nothing_more() {
    let mut pod = Pod::start().await;
    let run = pod.run("run-k", "ses_k", json!({}), json!({})).await;
    let a = run.artifacts();
    let t = FileTarget {
        effect_id: Some(run.effect("call_1")),
        content_type: Some("text/plain".into()),
        ..target("same-key", "note.txt")
    };
    let first = within(a.write_file(&t, b"hello")).await.unwrap();
    let again = within(a.write_file(&t, b"hello")).await.unwrap();
    assert_eq!((first.created, again.created), (true, false));
    assert_eq!(first.artifact, again.artifact);
    assert_eq!(pod.write_ops(), ["begin", "begin"]);
    assert_eq!(
        pod.writes()[0],
        json!({"op": "begin", "runId": "run-k", "key": "same-key", "name": "note.txt",
               "contentType": "text/plain", "size": 5, "effectId": "turn_run-k:0:tool:call_1",
               "base64": "aGVsbG8="})
    );
    assert_eq!(pod.core.artifacts().list("ses_k").len(), 1);
    assert_eq!(
        pod.core
            .artifacts()
            .effect_of("ses_k", &first.artifact.artifact_id, 1),
        Some("turn_run-k:0:tool:call_1".to_owned())
    );
    // An effect that is not a tool call of this turn is core's `invalid`.
    let bad = FileTarget {
        effect_id: Some("turn_other:0:tool:c".into()),
        ..target("k-bad", "b.txt")
    };
    let e = within(a.write_file(&bad, b"x")).await.unwrap_err();
    assert_eq!(
        e,
        ArtifactError::Invalid {
            op: "begin",
            message: "turn_other:0:tool:c is not a tool call of the run's turn".into()
        }
    );
    run.finish();
}

#[tokio::test]
async fn limits_are_clear_errors_and_an_upload_that_fails_is_aborted() {
    let mut pod = Pod::start().await;
    let run = pod
        .run("run-x", "ses_x", json!({"chunkBytes": 1024}), json!({}))
        .await;
    let a = run
        .artifacts()
        .with_request_timeout(Duration::from_millis(200));
    pod.core.artifacts().set_limits(4000, 1 << 20, 1 << 20);
    let e = within(a.write_file(&target("big", "big.bin"), &bytes(5000)))
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "An artifact of 5000 bytes is past the limit (limitBytes 4000)"
    );
    assert!(matches!(
        e,
        ArtifactError::LimitExceeded { op: "begin", .. }
    ));
    // Three lost answers in a row: no answer at all; the open upload is aborted.
    for _ in 0..3 {
        pod.core
            .artifacts()
            .drop_answer("artifact.write", Some("chunk"), 0);
    }
    let e = within(a.write_file(&target("lost", "l.bin"), &bytes(3000)))
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "core did not answer chunk after 3 attempts of 200ms each"
    );
    assert_eq!(
        pod.write_ops(),
        ["begin", "begin", "chunk@0", "chunk@0", "chunk@0", "abort"]
    );
    assert_eq!(pod.core.artifacts().open_uploads(), 0);
    run.finish();
}

#[tokio::test]
async fn reads_see_only_the_runs_session() {
    let mut pod = Pod::start().await;
    let elsewhere = pod
        .core
        .artifacts()
        .seed_file("ses_other", "secret.txt", b"no");
    let mine = pod
        .core
        .artifacts()
        .seed_file("ses_r", "mine.txt", b"0123456789");
    let run = pod
        .run("run-r", "ses_r", json!({"chunkBytes": 4}), json!({}))
        .await;
    let a = run.artifacts();
    for id in [elsewhere.as_str(), "art_missing"] {
        let e = within(a.read_chunk(id, None, 0, None)).await.unwrap_err();
        assert_eq!(
            e,
            ArtifactError::NotFound {
                message: format!("Artifact {id} was not found")
            }
        );
    }
    let c = within(a.read_chunk(&mine, None, 4, None)).await.unwrap();
    assert_eq!((c.bytes, c.eof), (b"4567".to_vec(), false));
    // More than chunkBytes is held to it.
    let c = within(a.read_chunk(&mine, None, 8, Some(100)))
        .await
        .unwrap();
    assert_eq!((c.bytes, c.eof), (b"89".to_vec(), true));
    assert_eq!(pod.requests("artifact.read").last().unwrap()["length"], 4);
    let c = within(a.read_chunk(&mine, None, 10, None)).await.unwrap();
    assert_eq!((c.bytes, c.eof), (Vec::new(), true));
    let e = within(a.read_chunk(&mine, None, 11, None))
        .await
        .unwrap_err();
    assert_eq!(
        e,
        ArtifactError::Invalid {
            op: "read",
            message: "Offset 11 is past the end (10 bytes)".into()
        }
    );
    run.finish();
}

#[tokio::test]
async fn an_upload_left_open_ends_with_the_run() {
    let mut pod = Pod::start().await;
    let run = pod.run("run-o", "ses_o", json!({}), json!({})).await;
    let a = run.artifacts();
    let upload_id = match within(a.begin_folder(&FolderTarget {
        key: "open".into(),
        name: "left".into(),
        artifact_id: None,
        same_name: false,
    }))
    .await
    .unwrap()
    {
        FolderStart::Open(up) => up.upload_id().to_owned(),
        FolderStart::Written(_) => panic!("a new key answered written"),
    };
    assert_eq!(pod.core.artifacts().open_uploads(), 1);
    let mark = pod.core.mark();
    run.finish();
    pod.output_answered(mark).await;
    assert_eq!(pod.core.artifacts().dropped_at_run_end(), vec![upload_id]);
    assert_eq!(pod.core.artifacts().open_uploads(), 0);
    assert_eq!(pod.core.artifacts().list("ses_o"), Vec::<Value>::new());
}

/// Sends `m` raw over the run's channel; returns `r`, or `{code, message}` of a refusal.
async fn raw(run: &Driven, m: &str, p: Value) -> Value {
    let mut call = within(run.channel.call(m, p)).await.unwrap();
    match within(call.response()).await {
        Ok(r) => r,
        Err(podhost::nylorun::link::channel::CallError::Remote { code, message, .. }) => {
            json!({"code": code.as_str(), "message": message})
        }
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test]
async fn the_fake_store_refuses_what_core_refuses() {
    let mut pod = Pod::start().await;
    let run = pod
        .run(
            "run-f",
            "ses_f",
            json!({"chunkBytes": 4, "folderEntries": 1}),
            json!({}),
        )
        .await;
    let w = |p: Value| {
        let mut p = p;
        p["runId"] = json!("run-f");
        p
    };
    let open = raw(
        &run,
        "artifact.write",
        w(json!({"op": "begin", "key": "k", "name": "a.bin"})),
    )
    .await;
    let up = open["uploadId"].clone();
    let cases = [
        (
            json!({"op": "chunk", "uploadId": up, "offset": 0, "base64": "AAAAAAA="}),
            json!({"code": "limit_exceeded", "message": "A chunk of 5 bytes is past chunkBytes 4"}),
        ),
        (
            json!({"op": "chunk", "uploadId": up, "offset": 0, "base64": "AAAA"}),
            json!({"status": "open", "uploadId": up, "maxBytes": 64 << 20, "received": 3}),
        ),
        // The last chunk again (its answer lost): acknowledged, not taken twice.
        (
            json!({"op": "chunk", "uploadId": up, "offset": 0, "base64": "AAAA"}),
            json!({"status": "open", "uploadId": up, "maxBytes": 64 << 20, "received": 3}),
        ),
        (
            json!({"op": "chunk", "uploadId": up, "offset": 1, "base64": "AAAA"}),
            json!({"code": "invalid", "message": "Offset 1 is not the 3 bytes received"}),
        ),
        (
            json!({"op": "chunk", "uploadId": "up_nope", "offset": 0, "base64": "AAAA"}),
            json!({"code": "invalid", "message": "Unknown upload up_nope"}),
        ),
        (
            json!({"op": "abort", "uploadId": "up_nope"}),
            json!({"status": "aborted"}),
        ),
        (
            json!({"op": "begin", "key": "k2", "name": "x", "extra": 1}),
            json!({"code": "invalid", "message": "Invalid artifact.write request: unknown field `extra`, expected one of `op`, `runId`, `key`, `kind`, `name`, `artifactId`, `sameName`, `contentType`, `size`, `effectId`, `base64`"}),
        ),
        (
            json!({"op": "begin", "key": "k3", "artifactId": "art_elsewhere"}),
            json!({"code": "not_found", "message": "Artifact art_elsewhere was not found"}),
        ),
    ];
    for (p, want) in cases {
        assert_eq!(raw(&run, "artifact.write", w(p.clone())).await, want, "{p}");
    }
    // A folder: one entry at most; bytes that do not match their hash end the upload.
    let folder = raw(
        &run,
        "artifact.write",
        w(json!({"op": "begin", "kind": "folder", "key": "f", "name": "out"})),
    )
    .await;
    let fu = folder["uploadId"].clone();
    let sha_abc = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(b"abc"));
    let file = |path: &str, b64: &str, sha: &str| {
        w(
            json!({"op": "file", "uploadId": fu, "path": path, "size": 3, "sha256": sha, "base64": b64}),
        )
    };
    let opened = |received: u64| {
        json!({"status": "open", "uploadId": fu, "maxBytes": 256 << 20,
               "maxFileBytes": 64 << 20, "maxEntries": 1, "received": received})
    };
    assert_eq!(
        raw(&run, "artifact.write", file("../x", "YWJj", &sha_abc)).await,
        json!({"code": "invalid", "message": "Invalid path \"../x\""})
    );
    assert_eq!(
        raw(&run, "artifact.write", file("a", "YWJj", &sha_abc)).await,
        opened(3)
    );
    assert_eq!(
        raw(&run, "artifact.write", file("b", "YWJj", &sha_abc)).await,
        json!({"code": "limit_exceeded", "message": "A folder holds at most 1 files (maxEntries)"})
    );
    let folder2 = raw(
        &run,
        "artifact.write",
        w(json!({"op": "begin", "kind": "folder", "key": "f2", "name": "out"})),
    )
    .await;
    let fu2 = folder2["uploadId"].clone();
    let bad = w(
        json!({"op": "file", "uploadId": fu2, "path": "a", "size": 3, "sha256": sha_abc, "base64": "YWJk"}),
    );
    assert_eq!(
        raw(&run, "artifact.write", bad).await,
        json!({"code": "invalid", "message": "The bytes of a do not match its sha256; the upload ended"})
    );
    assert_eq!(
        raw(
            &run,
            "artifact.write",
            w(json!({"op": "commit", "uploadId": fu2}))
        )
        .await,
        json!({"code": "invalid", "message": format!("Unknown upload {}", fu2.as_str().unwrap())})
    );
    // definition.file: only the run's definition's files.
    let d = format!("sha256:{}", "0".repeat(64));
    assert_eq!(
        raw(
            &run,
            "definition.file",
            json!({"runId": "run-f", "sha256": d})
        )
        .await,
        json!({"code": "invalid", "message": format!("{d} is not a file of the run's definition")})
    );
    // Another run's requests: not held here.
    assert_eq!(
        raw(
            &run,
            "artifact.read",
            json!({"runId": "run-other", "artifactId": "a"})
        )
        .await,
        json!({"code": "run_not_held", "message": "Run run-other is not held by this harness"})
    );
    run.finish();
}
