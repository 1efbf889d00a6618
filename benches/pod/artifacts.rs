//! The outputs export of one large file against the work it cannot avoid (reading, hashing and
//! base64-encoding the bytes once), and reading a spilled result back in 32 KiB pages against
//! reading it in one chunk. Both sides run in this process against the fake core, so the ratio
//! is what the upload path adds.

use std::io::Read;
use std::time::{Duration, Instant};

use base64::Engine as _;
use podhost::nylorun::artifacts::export::{ExportOutcome, export_outputs};
use podhost::nylorun::artifacts::read_for_model;
use podhost::nylorun::turn::spill::fit_outcome;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::driven_runs::{Pod, within};
use crate::smoke;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

pub async fn main() {
    let mut pod = Pod::start().await;
    let mib = smoke::pick(64usize, 4);
    let size = mib << 20;
    let out = pod.dirs.workspace.join("outputs");
    std::fs::create_dir_all(&out).unwrap();
    let mut bytes = vec![0u8; size];
    for (i, block) in bytes.chunks_mut(4096).enumerate() {
        block.fill((i % 251) as u8);
    }
    std::fs::write(out.join("big.bin"), &bytes).unwrap();
    drop(bytes);

    let mut export = Vec::new();
    let mut baseline = Vec::new();
    for i in 0..smoke::pick(5, 1) {
        let run = pod
            .run(
                &format!("run-m{i}"),
                &format!("ses_m{i}"),
                json!({}),
                json!({}),
            )
            .await;
        let a = run.artifacts();
        let start = Instant::now();
        let report = within(export_outputs(&a, &pod.toolbox(), &out, &run.turn)).await;
        export.push(start.elapsed());
        assert!(
            matches!(report.outcome, ExportOutcome::Written { .. }),
            "{report:?}"
        );
        run.finish();

        let path = out.join("big.bin");
        let start = Instant::now();
        tokio::task::spawn_blocking(move || {
            let mut f = std::fs::File::open(path).unwrap();
            let mut h = Sha256::new();
            let mut buf = vec![0u8; 16 << 20];
            let mut encoded = 0usize;
            loop {
                let n = f.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                h.update(&buf[..n]);
                encoded += base64::engine::general_purpose::STANDARD
                    .encode(&buf[..n])
                    .len();
            }
            (hex::encode(h.finalize()), encoded)
        })
        .await
        .unwrap();
        baseline.push(start.elapsed());
    }
    let (e, b) = (median(export), median(baseline));
    println!(
        "export of one {mib} MiB file: median {e:?} ({:.0} MiB/s); read+hash+base64 once: {b:?}; ratio {:.1}",
        mib as f64 / e.as_secs_f64(),
        e.as_secs_f64() / b.as_secs_f64()
    );

    let run = pod.run("run-p", "ses_p", json!({}), json!({})).await;
    let a = run.artifacts();
    // Past the record's limit (the fake core's recordEntryBytes, 960 KiB), so it is spilled.
    let spilled = smoke::pick(5usize << 20, 2 << 20);
    let text: String = "spilled line of text\n".repeat(spilled / 21);
    let fitted = within(fit_outcome(
        &a,
        &run.effect("c"),
        "read",
        json!({"kind": "completed", "output": text}),
    ))
    .await;
    let Some(id) = fitted["output"]["artifactId"].as_str().map(str::to_owned) else {
        panic!("a {spilled}-byte result was not spilled: {fitted}");
    };
    let start = Instant::now();
    let (_, whole) = within(a.read_to_end(&id, None, 16 << 20)).await.unwrap();
    let one = start.elapsed();
    assert_eq!(whole.len(), text.len());
    let start = Instant::now();
    let mut offset = 0usize;
    let mut pages = 0;
    while offset < text.len() {
        let page = within(read_for_model(
            &a,
            &json!({"artifactId": id, "version": 1, "offset": offset}),
        ))
        .await;
        smoke::check(
            page.is_completed(),
            format_args!("read_artifact at {offset}: {page:?}"),
        );
        offset += 32 * 1024;
        pages += 1;
    }
    let paged = start.elapsed();
    println!(
        "{} KiB spilled result: one chunk {one:?}; {pages} read_artifact pages {paged:?} ({:?} a page); ratio {:.1}",
        spilled >> 10,
        paged / pages,
        paged.as_secs_f64() / one.as_secs_f64()
    );
    run.finish();
}
