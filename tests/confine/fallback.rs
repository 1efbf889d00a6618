//! The Landlock-only level of an isolated host, where namespaces are refused (most Kubernetes
//! seccomp profiles; forced here with `namespaces: false`, which `PODHOST_NAMESPACES=off` sets):
//! `/dev` limited to a few nodes, no capabilities, and podhost's state put back when a command
//! changed its mode.

use std::os::unix::fs::PermissionsExt;

use podhost::exec::confine::Guard;
use podhost::tools::{ToolName, ToolboxBuilder};
use pretty_assertions::assert_eq;
use serde_json::json;

use crate::{Host, assert_still_works, bash, isolated_settings, run};

#[tokio::test]
async fn without_namespaces_devices_are_limited_and_the_level_says_so() {
    check_landlock_level(&Host::new()).await;
}

/// What the Landlock-only level guarantees, checked by the tests of stronger levels where this
/// machine allows no namespaces: the level says so, devices are limited to a few nodes, the
/// secrets stay unreadable, no capabilities, and the next call works.
pub async fn check_landlock_level(host: &Host) {
    let tb = host.isolated(|s| s.namespaces = false);
    let level = tb.executor().confinement().level();
    assert_eq!(
        (
            level.namespaces,
            level.pid_namespace,
            level.devices,
            level.command_capabilities
        ),
        ("none", false, "listed nodes", "none")
    );
    let out = bash(
        host,
        &tb,
        &format!(
            "head -c1 /dev/loop0 2>&1 | sed 's/^.*: //'; echo x > /dev/null && echo null ok; \
             head -c1 /dev/urandom | wc -c; grep -E '^CapBnd' /proc/self/status; \
             for f in {} {} {}; do cat $f 2>&1 | sed 's/^.*: //'; done",
            host.other_ws.join("notes.txt").display(),
            host.data.join("podhost.db").display(),
            host.join.display()
        ),
    )
    .await;
    assert_eq!(
        out,
        json!({
            "exitCode": 0,
            "stdout": "Permission denied\nnull ok\n1\nCapBnd:\t0000000000000000\n\
                       Permission denied\nPermission denied\nPermission denied\n",
            "stderr": ""
        })
    );
    assert_still_works(&tb).await;
    eprintln!("checked the Landlock-only level (namespaces none): devices, secrets, capabilities");
}

/// Landlock cannot stop `chmod`: a command that may change the data directory's mode (here root,
/// asked for, which owns it) opens it up, and podhost puts the mode back after the command.
#[tokio::test]
async fn a_changed_mode_of_podhosts_state_is_put_back_after_the_command() {
    let host = Host::new();
    std::fs::set_permissions(&host.data, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::set_permissions(
        host.data.join("podhost.db"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let mut settings = isolated_settings();
    settings.namespaces = false;
    settings.root_asked = true;
    settings.uid_pool = None;
    let exec = podhost::exec::ExecSettings {
        shell: None,
        limits: podhost::exec::ResourceLimits::default(),
        confine: settings,
    };
    let tb = ToolboxBuilder::new(&exec, crate::support::supervisor_bin().to_path_buf())
        .confine(|c| {
            c.hide(&host.data)
                .guard(Guard::private_dir(&host.data, 0o700))
        })
        .build(
            podhost::floor::workspace::Workspace::new(&host.ws, None).unwrap(),
            Some(&host.tmp),
        )
        .unwrap();
    let out = bash(
        &host,
        &tb,
        "chmod 777 ROOT/data && chmod 666 ROOT/data/podhost.db && stat -c %a ROOT/data"
            .replace("ROOT", host.root.to_str().unwrap())
            .as_str(),
    )
    .await;
    // The change itself is not refused at this level (that is what the namespaces add) …
    assert_eq!(out, json!({"exitCode": 0, "stdout": "777\n", "stderr": ""}));
    // … but it is undone before the call returns.
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(
        (mode(&host.data), mode(&host.data.join("podhost.db"))),
        (0o700, 0o600)
    );
    let read = run(&tb, ToolName::Read, json!({"path": "hello.txt"})).await;
    assert!(read.is_completed(), "{read:?}");
}
