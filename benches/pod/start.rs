//! `podhost pod` from spawn to its `hello` (joined, connected, said hello), against spawning
//! `podhost --version` to its exit: the ratio is what the start-up of a pod adds to starting the
//! binary. Then the pod's idle RSS: connected, one lease waiting, nothing to do.
//!
//! `PODHOST_MEASURE_LOG=<file>` writes each run's log lines there, timestamped, to see where
//! the start-up time goes.

use std::time::{Duration, Instant};

use crate::fake_core::{CoreOptions, FakeCore};
use crate::pod_launch::{PodDirs, pod_env};
use crate::smoke;

fn rss_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub async fn main() {
    let rounds = smoke::pick(9, 2);
    let bin = crate::support::podhost_bin();
    let mut times = Vec::new();
    let mut bare = Vec::new();
    let mut rss = Vec::new();
    for _ in 0..rounds {
        let start = Instant::now();
        let status = tokio::process::Command::new(bin)
            .arg("--version")
            .stdout(std::process::Stdio::null())
            .status()
            .await
            .unwrap();
        assert!(status.success());
        bare.push(start.elapsed().as_secs_f64() * 1000.0);

        let core = FakeCore::start(CoreOptions::default()).await;
        let dirs = PodDirs::new(&core);
        let env = pod_env(&core, &dirs);
        let start = Instant::now();
        let mut child = tokio::process::Command::new(bin)
            .arg("pod")
            .env_clear()
            .envs(env)
            .stderr(match std::env::var("PODHOST_MEASURE_LOG") {
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
        tokio::time::sleep(Duration::from_millis(500)).await;
        let pid = child.id().unwrap();
        rss.push((rss_kib(pid, "VmRSS:"), rss_kib(pid, "VmHWM:")));
        child.kill().await.unwrap();
    }
    let (min, max) = (
        times.iter().copied().fold(f64::INFINITY, f64::min),
        times.iter().copied().fold(0.0, f64::max),
    );
    let (t, b) = (median(&mut times), median(&mut bare));
    smoke::check_positive("start to hello, and `podhost --version`", &[t, b]);
    rss.sort();
    println!(
        "start to hello: median {t:.1} ms (min {min:.1}, max {max:.1}) over {rounds} runs of {}; \
         `podhost --version` to exit: median {b:.1} ms; ratio {:.1}",
        bin.display(),
        t / b
    );
    println!(
        "idle RSS: median {} KiB (peak {} KiB)",
        rss[rss.len() / 2].0,
        rss[rss.len() / 2].1
    );
}
