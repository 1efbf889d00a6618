//! Integration tests of the pod image: the Containerfile builds offline, and the image runs the
//! way a Nylorun pod runs it (uid 1000, read-only root, four writable paths, podhost as PID 1).
//!
//! They need podman, runc and debootstrap, as root (.ci/run installs them). Without them every
//! image test fails with a message saying so; `PODHOST_SKIP_IMAGE_TESTS=1` skips them on
//! purpose. `podhost health` is also tested here, against a fake endpoint, without podman. The
//! pod tests run turns too: the fake Model Gate and the fake artifact store listen on 127.0.0.1.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../support/mod.rs"]
mod support;

#[path = "../support/fake_core/mod.rs"]
mod fake_core;

#[path = "../support/fake_artifacts/mod.rs"]
mod fake_artifacts;

#[path = "../support/fake_journal.rs"]
mod fake_journal;

#[path = "../support/fake_gates.rs"]
mod fake_gates;

#[path = "../support/fake_toolgate.rs"]
mod fake_toolgate;

#[path = "../support/turn_fixture.rs"]
mod turn_fixture;

#[path = "../support/pg.rs"]
mod pg;

#[path = "../support/tls_front.rs"]
mod tls_front;

mod container;
mod containerfile;
mod files;
mod fixture;
mod health;
mod kube;
mod pid1;
mod pod;
mod pod_host;
mod podman;
mod turn;
mod turn_stop;
