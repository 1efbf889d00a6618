//! The image's configuration: what a pod that runs it gets without saying anything.

use pretty_assertions::assert_eq;
use serde::Deserialize;

use crate::fixture::{CALL_WITHIN, IMAGE, image};

/// The parts of the image configuration a pod depends on.
#[derive(Debug, Deserialize, PartialEq)]
#[serde(rename_all = "PascalCase")]
struct ImageConfig {
    entrypoint: Option<Vec<String>>,
    cmd: Option<Vec<String>>,
    user: String,
    working_dir: String,
    env: Vec<String>,
}

#[tokio::test]
async fn the_image_runs_podhost_pod_as_uid_1000_in_the_workspace() {
    let Some(image) = image().await else { return };
    let out = image
        .podman
        .ok(
            ["image", "inspect", "--format", "{{json .Config}}", IMAGE],
            CALL_WITHIN,
        )
        .await;
    let config: ImageConfig = serde_json::from_str(&out).unwrap();
    assert_eq!(
        config,
        ImageConfig {
            entrypoint: Some(vec!["/usr/local/bin/podhost".into(), "pod".into()]),
            cmd: None,
            user: "1000:1000".into(),
            working_dir: "/workspace".into(),
            env: vec![
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
                "HOME=/harness/home".into(),
                "PODHOST_LOG_FORMAT=json".into(),
            ],
        }
    );
}
