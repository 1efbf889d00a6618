//! A huge file read through the real binary, with the peak memory of that process.

use super::*;
use pretty_assertions::assert_eq;

const RSS_PROBE: &str = "PODHOST_TEST_RSS_PROBE";
/// The peak resident memory allowed to `podhost tool read` of the last page of a ~200 MiB file.
const RSS_BOUND_KIB: i64 = 48 * 1024;

#[tokio::test]
async fn a_huge_files_last_page_is_read_in_bounded_memory() {
    use std::io::Write as _;
    let dir = tempfile::tempdir().unwrap();
    let lines: u64 = 2_100_000;
    let pad = "abcdefghijklmnopqrstuvwxyz".repeat(4)[..91].to_owned();
    {
        let mut out = std::io::BufWriter::with_capacity(
            1 << 20,
            fs::File::create(dir.path().join("big.txt")).unwrap(),
        );
        for n in 1..=lines {
            writeln!(out, "{n:07} {pad}").unwrap();
        }
        out.flush().unwrap();
    }
    assert_eq!(
        fs::metadata(dir.path().join("big.txt")).unwrap().len(),
        lines * 100
    );

    // The probe runs this test binary again, alone, so that the only child it waits for is
    // podhost and its children's peak RSS is podhost's.
    let report = dir.path().join("report.json");
    let spec = json!({
        "workspace": dir.path(),
        "input": json!({"path": "big.txt", "offset": lines - 999, "limit": 1000}).to_string(),
        "report": report,
    });
    let mut probe = tokio::process::Command::new(std::env::current_exe().unwrap());
    probe
        .args([
            "--exact",
            "files::huge::rss_probe",
            "--ignored",
            "--test-threads=1",
        ])
        .env(RSS_PROBE, spec.to_string())
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true);
    let status = tokio::time::timeout(Duration::from_secs(120), probe.status())
        .await
        .expect("the probe timed out")
        .unwrap();
    assert!(status.success(), "probe failed: {status}");
    let report: Value = serde_json::from_slice(&fs::read(&report).unwrap()).unwrap();
    assert_eq!(report["status"], 0, "{report}");

    let expected: Vec<String> = (lines - 999..=lines)
        .map(|n| format!("{n}\t{n:07} {pad}"))
        .collect();
    let outcome: ToolOutcome =
        serde_json::from_str(report["stdout"].as_str().unwrap().trim_end()).unwrap();
    assert_eq!(outcome, completed(expected.join("\n")));
    let peak = report["max_rss_kib"].as_i64().unwrap();
    assert!(
        peak < RSS_BOUND_KIB,
        "podhost read the last page of a 200 MiB file with a peak RSS of {peak} KiB"
    );
}

/// Not a test of its own: run by `a_huge_files_last_page_is_read_in_bounded_memory` in a process
/// of its own.
#[test]
#[ignore = "a helper process of a_huge_files_last_page_is_read_in_bounded_memory"]
fn rss_probe() {
    let spec: Value = serde_json::from_str(&std::env::var(RSS_PROBE).unwrap()).unwrap();
    let out = std::process::Command::new(podhost_bin())
        .args(["tool", "read", "--input"])
        .arg(spec["input"].as_str().unwrap())
        .arg("--workspace")
        .arg(spec["workspace"].as_str().unwrap())
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let usage =
        nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN).unwrap();
    let report = json!({
        "status": out.status.code(),
        "stdout": String::from_utf8_lossy(&out.stdout),
        "stderr": String::from_utf8_lossy(&out.stderr),
        // Linux reports ru_maxrss in KiB.
        "max_rss_kib": usage.max_rss(),
    });
    fs::write(spec["report"].as_str().unwrap(), report.to_string()).unwrap();
}
