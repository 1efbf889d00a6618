//! Files and commands see one workspace, under load: many sessions at once, each writing a file
//! with `write`, reading it back with `bash` and with `read`, step after step, while busy loops
//! hold every core. Not one read may miss what the write before it wrote.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use pretty_assertions::assert_eq;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{Options, Serve, T, start};
use crate::openai_fake::{FakeModel, Reply};

const SESSIONS: usize = 20;
const SEQUENCES: usize = 50;

/// What session `s` writes in its file `k`.
fn content(s: &str, k: usize) -> String {
    format!("{s} wrote {k}")
}

/// Busy loops on every core until dropped.
struct Load(Arc<AtomicBool>, Vec<std::thread::JoinHandle<()>>);

impl Load {
    fn start() -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let threads = (0..cores)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        x = std::hint::black_box(
                            x.wrapping_mul(6364136223846793005).wrapping_add(1),
                        );
                    }
                })
            })
            .collect();
        Load(stop, threads)
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
        for t in self.1.drain(..) {
            let _ = t.join();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_sessions_write_then_read_with_bash_and_read_under_load_and_never_miss() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", None).await;
    // Each step: write file k, `cat` it, `read` it — in this order, in one answer; then the
    // next k, until SEQUENCES are done.
    fake.respond_with(|body| {
        let messages = body["messages"].as_array().unwrap();
        let session = messages[1]["content"].as_str().unwrap().to_owned();
        let k = messages.iter().filter(|m| m["role"] == "assistant").count();
        if k == SEQUENCES {
            return Reply::text("done");
        }
        let file = format!("f{k}.txt");
        Reply::calls(&[
            (
                &format!("w{k}"),
                "write",
                json!({"path": file, "content": content(&session, k)}),
            ),
            (
                &format!("b{k}"),
                "bash",
                json!({"command": format!("cat {file}")}),
            ),
            (&format!("r{k}"), "read", json!({"path": file})),
        ])
    });
    let s = Arc::new(Serve::start_with(
        dir.path(),
        Options::default().env("PODHOST_MAX_STEPS", "100"),
    ));
    let _load = Load::start();
    for n in 0..SESSIONS {
        let (code, body) = s
            .submit(start(
                &format!("s{n}"),
                &format!("i{n}"),
                &format!("s{n}"),
                &fake.base_url(),
                None,
            ))
            .await;
        assert_eq!(code, StatusCode::ACCEPTED, "{body}");
    }
    let mut misses = Vec::new();
    for n in 0..SESSIONS {
        let (session, id) = (format!("s{n}"), format!("i{n}"));
        s.wait_status(&id, "completed", T * 30).await;
        let (code, out) = s.collect(&id).await;
        assert_eq!(code, StatusCode::OK);
        let results: std::collections::HashMap<String, String> = out["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "tool")
            .map(|m| {
                (
                    m["tool_call_id"].as_str().unwrap().to_owned(),
                    m["content"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        assert_eq!(results.len(), 3 * SEQUENCES, "{session}");
        for k in 0..SEQUENCES {
            let want = content(&session, k);
            let bash: Value = serde_json::from_str(&results[&format!("b{k}")]).unwrap();
            if bash["stdout"] != want.as_str() || bash["exitCode"] != 0 {
                misses.push(format!("{session} bash {k}: {bash}"));
            }
            let read = &results[&format!("r{k}")];
            if !read.contains(&want) {
                misses.push(format!("{session} read {k}: {read}"));
            }
        }
    }
    println!(
        "{} write→bash→read sequences in {SESSIONS} sessions under load: {} misses",
        SESSIONS * SEQUENCES,
        misses.len()
    );
    assert_eq!(misses, Vec::<String>::new());
}
