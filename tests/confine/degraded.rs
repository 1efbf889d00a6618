//! A kernel without Landlock (pretended with the hidden `--landlock-abi-max 0`): podhost starts,
//! says loudly that commands are not confined, and runs them; with
//! `PODHOST_REQUIRE_CONFINEMENT` it refuses to start instead.

use pretty_assertions::assert_eq;
use serde_json::json;

use crate::{Host, completed, podhost_tool};

#[test]
fn without_landlock_podhost_starts_and_warns() {
    let host = Host::new();
    let mut args = host.tool_args();
    args.extend(["--landlock-abi-max".into(), "0".into()]);
    let (outcome, stderr, code) = podhost_tool(
        "bash",
        &args,
        &json!({"command": "echo ran"}),
        &[("NO_COLOR", "1")],
        None,
    );
    assert_eq!(
        (code, completed(&outcome).clone()),
        (0, json!({"exitCode": 0, "stdout": "ran\n", "stderr": ""}))
    );
    // One warning line (after its timestamp and level) that says what is missing.
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    let message = lines[0]
        .split_once("podhost::exec::confine")
        .map(|(_, m)| m);
    let message = message.map(|m| {
        m.replace("\u{1b}[2m", "")
            .replace("\u{1b}[0m", "")
            .replace("\u{1b}[3m", "")
    });
    // Where local use gets a read-only system, its commands share a session holder (and so a
    // session keyring); elsewhere each command gets one.
    let keyring = if podhost::exec::probe::probe_host(crate::support::supervisor_bin())
        .namespaces
        .any()
    {
        "per session"
    } else {
        "per command"
    };
    assert_eq!(
        message,
        Some(format!(
            ": commands and file tools are NOT confined: they can read everything podhost's user \
             can (set PODHOST_REQUIRE_CONFINEMENT to refuse to start instead) confinement=no \
             Landlock (the kernel has none), signal scoping off, network filter off, syscall \
             filter docker-default, session keyring {keyring}, non-dumpable on, no_new_privs \
             on, command user podhost's own"
        ))
    );
}

#[test]
fn require_confinement_refuses_to_start_without_landlock() {
    let host = Host::new();
    let mut args = host.tool_args();
    args.extend(["--landlock-abi-max".into(), "0".into()]);
    let (outcome, stderr, code) = podhost_tool(
        "bash",
        &args,
        &json!({"command": "echo ran"}),
        &[("PODHOST_REQUIRE_CONFINEMENT", "1")],
        None,
    );
    assert_eq!(
        (code, outcome, stderr.as_str()),
        (
            1,
            serde_json::Value::Null,
            "podhost: confinement is required (PODHOST_REQUIRE_CONFINEMENT), but this kernel has \
             no Landlock; refusing to start\n"
        )
    );
}

#[test]
fn require_confinement_starts_where_landlock_is() {
    let host = Host::new();
    let (outcome, stderr, code) = podhost_tool(
        "bash",
        &host.tool_args(),
        &json!({"command": "echo ran"}),
        &[("PODHOST_REQUIRE_CONFINEMENT", "true")],
        None,
    );
    assert_eq!(
        (code, completed(&outcome).clone(), stderr.as_str()),
        (
            0,
            json!({"exitCode": 0, "stdout": "ran\n", "stderr": ""}),
            ""
        )
    );
}
