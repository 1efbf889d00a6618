//! The Containerfiles themselves: the package list the README documents, and the multi-stage
//! variant (which CI cannot build without a registry) kept in step with the main one.

use pretty_assertions::assert_eq;

use crate::fixture::repo;

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap()
}

/// The packages of the Containerfile's `ARG PACKAGES="…"`.
fn containerfile_packages(containerfile: &str) -> Vec<String> {
    let line = containerfile
        .lines()
        .find_map(|l| l.trim().strip_prefix("ARG PACKAGES="))
        .expect("the Containerfile has no ARG PACKAGES=\"…\" line");
    line.trim_matches('"')
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_image_has_the_tools_agents_reach_for() {
    assert_eq!(
        containerfile_packages(&read("Containerfile")),
        [
            "bash",
            "ca-certificates",
            "coreutils",
            "curl",
            "findutils",
            "git",
            "procps",
            "python3"
        ]
    );
}

/// The lines of the last stage (from its `FROM`), without comments and blank lines.
fn runtime_stage(containerfile: &str) -> Vec<String> {
    let lines: Vec<&str> = containerfile
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let from = lines.iter().rposition(|l| l.starts_with("FROM ")).unwrap();
    lines[from..].iter().map(|l| l.to_string()).collect()
}

#[test]
fn the_multistage_variant_builds_the_same_runtime_stage() {
    let main = read("Containerfile");
    let multistage = read("image/Containerfile.multistage");
    let expected: Vec<String> = runtime_stage(&main)
        .into_iter()
        .map(|l| {
            l.replace(
                "COPY target/release/",
                "COPY --from=build /src/target/release/",
            )
        })
        .collect();
    assert_eq!(runtime_stage(&multistage), expected);
    let base = |text: &str| {
        text.lines()
            .find(|l| l.starts_with("ARG BASE="))
            .map(str::to_owned)
    };
    assert_eq!(base(&multistage), base(&main));
}

#[tokio::test]
async fn the_image_carries_the_oci_labels_of_what_it_was_built_from() {
    let Some(image) = crate::fixture::image().await else {
        return;
    };
    let labels = image
        .podman
        .ok(
            [
                "image",
                "inspect",
                "--format",
                "{{json .Labels}}",
                crate::fixture::IMAGE,
            ],
            std::time::Duration::from_secs(60),
        )
        .await;
    let all: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(labels.trim()).unwrap();
    // The builder adds its own (`io.buildah.version`); these are the image's.
    let labels: serde_json::Map<String, serde_json::Value> = all
        .into_iter()
        .filter(|(k, _)| k.starts_with("org.opencontainers.image."))
        .collect();
    assert_eq!(
        serde_json::Value::Object(labels),
        serde_json::json!({
            "org.opencontainers.image.title": "podhost",
            "org.opencontainers.image.description": "A sandboxed agent harness: the Nylorun pod host",
            "org.opencontainers.image.licenses": "Apache-2.0",
            "org.opencontainers.image.version": env!("CARGO_PKG_VERSION"),
            "org.opencontainers.image.revision": env!("BUILD_GIT_REVISION"),
            "org.opencontainers.image.source": crate::fixture::SOURCE,
            "org.opencontainers.image.created": crate::fixture::CREATED,
        })
    );
}
