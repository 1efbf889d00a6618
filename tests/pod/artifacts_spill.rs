//! Spilling tool results too large for one record entry, and the model's `read_artifact`.

use podhost::nylorun::artifacts::{Artifacts, read_for_model};
use podhost::nylorun::turn::spill::fit_outcome;
use podhost::tools::ToolOutcome;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::driven_runs::{Pod, within};

/// The first 4 KiB and the last 1 KiB of `text` on character boundaries, written here from the
/// spec rather than taken from podhost.
fn expected_preview(text: &str) -> String {
    let mut head = 4096;
    while !text.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = text.len() - 1024;
    while !text.is_char_boundary(tail) {
        tail += 1;
    }
    format!("{}\n…\n{}", &text[..head], &text[tail..])
}

/// About `n` bytes of text with two- and three-byte characters, so page and preview cuts fall
/// inside characters.
fn text_of(n: usize) -> String {
    let mut s = String::with_capacity(n + 64);
    let mut i = 0;
    while s.len() < n {
        s.push_str(&format!("line {i}: héllo wörld — ünïcödé ✓\n"));
        i += 1;
    }
    s
}

/// Reads artifact `id` whole through `read_for_model`, page by page, checking every page's
/// header and footer; returns the text and the number of pages.
async fn read_back(a: &Artifacts, id: &str, name: &str, size: usize) -> (String, usize) {
    let mut got = String::new();
    let mut offset = 0usize;
    let mut pages = 0;
    while offset < size {
        let out = within(read_for_model(
            a,
            &json!({"artifactId": id, "version": 1, "offset": offset}),
        ))
        .await;
        let ToolOutcome::Completed { output } = out else {
            panic!("page at {offset}: {out:?}");
        };
        let page = output.as_str().unwrap();
        let (header, rest) = page.split_once('\n').unwrap();
        let n: usize = header
            .rsplit_once(", ")
            .unwrap()
            .1
            .trim_end_matches(" bytes shown]")
            .parse()
            .unwrap();
        assert_eq!(
            header,
            format!(
                "[artifact {id} \"{name}\" version 1 (text/plain, {size} bytes): offset {offset}, {n} bytes shown]"
            )
        );
        assert!(
            n <= 32 * 1024 && n > 32 * 1024 - 4 || offset + n == size,
            "{n}"
        );
        let (body, footer) = rest.split_at(n);
        let next = offset + n;
        let want_footer = if next < size {
            format!(
                "\n[{} bytes left: continue with offset {next} and version 1]",
                size - next
            )
        } else {
            String::new()
        };
        assert_eq!(footer, want_footer);
        got.push_str(body);
        offset = next;
        pages += 1;
    }
    (got, pages)
}

#[tokio::test]
async fn a_5_mb_output_is_stored_once_and_read_back_whole_in_32_kib_pages() {
    let mut pod = Pod::start().await;
    let run = pod.run("run-s", "ses_s", json!({}), json!({})).await;
    let a = run.artifacts();
    let text = text_of(5 << 20);
    let effect = run.effect("call_read");
    let value = json!({"kind": "completed", "output": text});
    let fitted = within(fit_outcome(&a, &effect, "read", value)).await;

    let stored = pod.core.artifacts().list("ses_s");
    assert_eq!(stored.len(), 1);
    let id = stored[0]["artifactId"].as_str().unwrap().to_owned();
    assert_eq!(
        fitted,
        json!({"kind": "completed", "output": {
            "truncated": true, "artifactId": id, "size": text.len(),
            "preview": expected_preview(&text),
        }})
    );
    assert_eq!(
        (
            stored[0]["name"].clone(),
            stored[0]["contentType"].clone(),
            stored[0]["size"].clone()
        ),
        (
            json!("read-result.txt"),
            json!("text/plain"),
            json!(text.len())
        )
    );
    assert_eq!(
        pod.core.artifacts().effect_of("ses_s", &id, 1),
        Some(effect.clone())
    );
    // One begin carrying the body (it fits a 16 MiB chunk), keyed by the effect and the hash.
    let writes = pod.writes();
    assert_eq!(writes.len(), 1);
    let key = writes[0]["key"].as_str().unwrap();
    assert_eq!(
        key,
        format!(
            "{effect}:spill:whole:{}",
            hex::encode(<sha2::Sha256 as sha2::Digest>::digest(text.as_bytes()))
        )
    );

    let (back, pages) = read_back(&a, &id, "read-result.txt", text.len()).await;
    assert!(back == text, "the text read back differs");
    // Pages are 32 KiB, less at most 3 bytes of a character left for the next page.
    assert!(
        pages >= text.len().div_ceil(32 * 1024) && pages <= text.len().div_ceil(32 * 1024 - 3),
        "{pages} pages"
    );
    // Every read asked for 32 KiB of version 1.
    let reads = pod.requests("artifact.read");
    assert_eq!(reads.len(), pages);
    assert!(
        reads
            .iter()
            .all(|p| p["length"] == 32 * 1024 && p["version"] == 1)
    );
    run.finish();
}

#[tokio::test]
async fn a_replayed_spill_writes_nothing_new() {
    let mut pod = Pod::start().await;
    let run = pod.run("run-p", "ses_p", json!({}), json!({})).await;
    let a = run.artifacts();
    let effect = run.effect("call_1");
    let value = json!({"kind": "completed", "output": "z".repeat(2 << 20)});
    let first = within(fit_outcome(&a, &effect, "grep", value.clone())).await;
    let again = within(fit_outcome(&a, &effect, "grep", value)).await;
    assert_eq!(first, again);
    let stored = pod.core.artifacts().list("ses_p");
    assert_eq!(stored.len(), 1);
    let id = stored[0]["artifactId"].as_str().unwrap();
    assert_eq!(pod.core.artifacts().versions("ses_p", id).len(), 1);
    // The replay's begin carried the same key and was answered `written`, `created: false`.
    let writes = pod.writes();
    assert_eq!(writes.len(), 2);
    assert_eq!(writes[0]["key"], writes[1]["key"]);
    let answers: Vec<Value> = pod
        .core
        .events()
        .into_iter()
        .filter_map(|e| match e {
            crate::fake_core::Event::ToPod { frame, .. } if frame["r"]["status"] == "written" => {
                Some(frame["r"]["created"].clone())
            }
            _ => None,
        })
        .collect();
    assert_eq!(answers, vec![json!(true), json!(false)]);
    run.finish();
}

#[tokio::test]
async fn a_refused_store_keeps_the_preview_and_says_why() {
    let mut pod = Pod::start().await;
    let run = pod.run("run-d", "ses_d", json!({}), json!({})).await;
    pod.core.artifacts().set_limits(1 << 20, 1 << 20, 1 << 20);
    let a = run.artifacts();
    let text = text_of(2_000_000);
    let fitted = within(fit_outcome(
        &a,
        &run.effect("call_1"),
        "read",
        json!({"kind": "completed", "output": text}),
    ))
    .await;
    assert_eq!(
        fitted,
        json!({"kind": "completed", "output": {
            "truncated": true,
            "dropped": format!("An artifact of {} bytes is past the limit (limitBytes 1048576)", text.len()),
            "size": text.len(),
            "preview": expected_preview(&text),
        }})
    );
    assert_eq!(pod.core.artifacts().list("ses_d"), Vec::<Value>::new());
    run.finish();
}

#[tokio::test]
async fn bash_stdout_is_stored_as_text_and_the_exit_code_stays_in_view() {
    let mut pod = Pod::start().await;
    // A small record limit: 40,000 bytes, so 36,000 bytes of value.
    let run = pod
        .run(
            "run-b",
            "ses_b",
            json!({"recordEntryBytes": 40_000}),
            json!({}),
        )
        .await;
    let a = run.artifacts();
    let stdout = "é".repeat(30_000);
    let value = json!({"kind": "completed", "output": {
        "exitCode": 1, "stdout": stdout, "stderr": "warning: x\n", "truncated": true}});
    let fitted = within(fit_outcome(&a, &run.effect("call_b"), "bash", value)).await;
    let stored = pod.core.artifacts().list("ses_b");
    assert_eq!(stored.len(), 1);
    let id = stored[0]["artifactId"].as_str().unwrap().to_owned();
    assert_eq!(stored[0]["name"], "bash-result-stdout.txt");
    assert_eq!(
        fitted,
        json!({"kind": "completed", "output": {
            "exitCode": 1,
            "stdout": {"truncated": true, "artifactId": id, "size": 60_000,
                       "preview": expected_preview(&stdout)},
            "stderr": "warning: x\n",
            "truncated": true,
        }})
    );
    let (back, pages) = read_back(&a, &id, "bash-result-stdout.txt", 60_000).await;
    assert_eq!((back == stdout, pages), (true, 2));
    run.finish();
}

#[tokio::test]
async fn read_artifact_explains_what_it_cannot_show() {
    let mut pod = Pod::start().await;
    let blob =
        pod.core
            .artifacts()
            .seed_file("ses_m", "blob.bin", &[0, 1, 2, 3, 0xff, 9, 9, 9, 9, 9]);
    let note = pod
        .core
        .artifacts()
        .seed_file("ses_m", "note.txt", b"0123456789");
    let run = pod.run("run-m", "ses_m", json!({}), json!({})).await;
    let a = run.artifacts();
    let cases = [
        (
            json!({"artifactId": blob}),
            ToolOutcome::completed(format!(
                "[artifact {blob} \"blob.bin\" version 1 (application/octet-stream, 10 bytes): \
                 bytes from offset 0 are binary, not text; read_artifact shows text only]"
            )),
        ),
        (
            json!({"artifactId": note, "offset": 4, "length": 3}),
            ToolOutcome::completed(format!(
                "[artifact {note} \"note.txt\" version 1 (text/plain, 10 bytes): offset 4, 3 bytes shown]\n\
                 456\n[3 bytes left: continue with offset 7 and version 1]"
            )),
        ),
        (
            json!({"artifactId": note, "offset": 10}),
            ToolOutcome::completed(format!(
                "[artifact {note} \"note.txt\" version 1 (text/plain, 10 bytes): offset 10 is its end; nothing more to read]"
            )),
        ),
        (
            json!({"artifactId": note, "offset": 50}),
            ToolOutcome::failed(
                "tool.invalid_input",
                format!("Offset 50 is past the end of artifact {note} (10 bytes)."),
            ),
        ),
        (
            json!({"artifactId": "art_nope", "version": 2}),
            ToolOutcome::failed(
                "artifact.not_found",
                "There is no artifact art_nope version 2 this session can read.",
            ),
        ),
        (
            json!({"artifactId": note, "bogus": 1}),
            ToolOutcome::failed(
                "tool.invalid_input",
                "Invalid read_artifact input: unknown field `bogus`, expected one of \
                 `artifactId`, `version`, `offset`, `length`.",
            ),
        ),
        (
            json!({"artifactId": note, "length": 0}),
            ToolOutcome::failed(
                "tool.invalid_input",
                "Invalid read_artifact input: length must be at least 1.",
            ),
        ),
    ];
    for (args, want) in cases {
        assert_eq!(within(read_for_model(&a, &args)).await, want, "{args}");
    }
    // A length past 32 KiB is held to it.
    within(read_for_model(
        &a,
        &json!({"artifactId": note, "length": 1_000_000}),
    ))
    .await;
    assert_eq!(
        pod.requests("artifact.read").last().unwrap()["length"],
        32 * 1024
    );
    run.finish();
}
