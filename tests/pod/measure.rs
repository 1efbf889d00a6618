//! Figures for the report, not assertions: start of `podhost pod` to its `hello`, and its idle
//! RSS. Run against a release build:
//!
//! ```text
//! cargo build --release
//! PODHOST_MEASURE_BIN=target/release/podhost cargo test --test pod -- --ignored --nocapture measure
//! ```

use std::time::Instant;

use crate::fake_core::{CoreOptions, FakeCore};
use crate::{PodDirs, pod_env};

fn rss_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap()
}

#[tokio::test]
#[ignore = "a measurement; run it by hand against a release build"]
async fn measure_start_to_hello_and_idle_rss() {
    let bin = std::env::var("PODHOST_MEASURE_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| crate::support::podhost_bin().to_path_buf());
    let mut times = Vec::new();
    let mut rss = Vec::new();
    for _ in 0..9 {
        let core = FakeCore::start(CoreOptions::default()).await;
        let dirs = PodDirs::new(&core);
        let env = pod_env(&core, &dirs);
        let start = Instant::now();
        let mut child = tokio::process::Command::new(&bin)
            .arg("pod")
            .env_clear()
            .envs(env)
            .stderr(match std::env::var("PODHOST_MEASURE_LOG") {
                // Timestamped log lines of each run, to see where the start-up time goes.
                Ok(path) => std::fs::File::create(path).unwrap().into(),
                Err(_) => std::process::Stdio::null(),
            })
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        core.wait_request(0, "hello").await;
        times.push(start.elapsed().as_secs_f64() * 1000.0);
        // Idle: connected, one lease waiting, nothing to do. The pause lets start-up allocations
        // settle before RSS is read; it waits for no event.
        core.wait_request(0, "lease").await;
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let pid = child.id().unwrap();
        rss.push((rss_kib(pid, "VmRSS:"), rss_kib(pid, "VmHWM:")));
        child.kill().await.unwrap();
    }
    times.sort_by(|a, b| a.total_cmp(b));
    rss.sort();
    println!(
        "start to hello: median {:.1} ms (min {:.1}, max {:.1}) over {} runs of {}",
        times[times.len() / 2],
        times[0],
        times[times.len() - 1],
        times.len(),
        bin.display()
    );
    println!(
        "idle RSS: median {} KiB (peak {} KiB)",
        rss[rss.len() / 2].0,
        rss[rss.len() / 2].1
    );
}
