//! `podhost tool` writing into a pipe whose reader is gone (`… | head -c 1`).

use std::process::{Command, Stdio};

use crate::support::podhost_bin;

#[test]
fn a_closed_stdout_ends_quietly_without_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("big.txt"), "line\n".repeat(20_000)).unwrap();
    for _ in 0..5 {
        let (reader, writer) = std::io::pipe().unwrap();
        // The reader is gone before podhost writes a byte: every write fails with EPIPE.
        drop(reader);
        let out = Command::new(podhost_bin())
            .args(["tool", "read", "--workspace"])
            .arg(dir.path())
            .args(["--input", r#"{"path": "big.txt"}"#])
            .stdin(Stdio::null())
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert_eq!(out.status.code(), Some(0), "{stderr}");
    }
}
