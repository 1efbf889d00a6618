//! The OpenAI-compatible client trusts the same roots as every other connection: a model
//! server behind a private CA is reached with `PODHOST_CA_FILE`, and refused without it.

use std::process::{Command, Stdio};

use pretty_assertions::assert_eq;

use crate::openai_fake::{FakeModel, Reply};
use crate::support::podhost_bin;
use crate::tls_front::{PrivateCa, addr_of};

fn run(base_url: &str, ca_file: Option<&std::path::Path>, dir: &std::path::Path) -> (i32, String) {
    let mut cmd = Command::new(podhost_bin());
    cmd.args(["run", "--base-url", base_url, "--model", "fake-model"])
        .arg("--workspace")
        .arg(dir)
        .arg("say hello")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .stdin(Stdio::null());
    if let Some(f) = ca_file {
        cmd.env("PODHOST_CA_FILE", f);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test]
async fn a_model_behind_a_private_ca_is_trusted_with_the_ca_file_only() {
    let ca = PrivateCa::new();
    let fake = FakeModel::start("fake-model", None).await;
    fake.push([Reply::text("Hello over TLS.")]);
    let port = ca.front(addr_of(&fake.base_url().replace("/v1", ""))).await;
    let url = format!("https://127.0.0.1:{port}/v1");
    let dir = tempfile::tempdir().unwrap();
    let ca_file = ca.write_ca(dir.path());

    let (code, out) = tokio::task::spawn_blocking({
        let (url, dir) = (url.clone(), dir.path().to_path_buf());
        move || run(&url, None, &dir)
    })
    .await
    .unwrap();
    // The model call failed: `podhost run`'s own exit code for it.
    assert_eq!(code, podhost::floor::codes::exit::MODEL_FAILED, "{out}");
    assert!(
        out.contains("invalid peer certificate: UnknownIssuer"),
        "{out}"
    );
    assert_eq!(fake.requests().len(), 0);

    let (code, out) = tokio::task::spawn_blocking({
        let dir = dir.path().to_path_buf();
        move || run(&url, Some(&ca_file), &dir)
    })
    .await
    .unwrap();
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("Hello over TLS."), "{out}");
    assert_eq!(fake.requests().len(), 1);
}
