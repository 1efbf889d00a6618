//! `podhost tool NAME --input JSON`: exit 0 when the tool ran (also when it failed), 2 with a
//! clear message when the input was refused before anything ran.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::support::{podhost_bin, supervisor_bin};

fn tool(dir: &std::path::Path, args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(podhost_bin())
        .arg("tool")
        .args(args)
        .arg("--workspace")
        .arg(dir)
        .env_remove("PODHOST_WORKSPACE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(s) = stdin {
        input.write_all(s.as_bytes()).unwrap();
    }
    drop(input);
    child.wait_with_output().unwrap()
}

fn stdout_json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn a_tool_that_ran_exits_zero_and_prints_its_outcome() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "one\ntwo\n").unwrap();
    let out = tool(
        dir.path(),
        &["read", "--input", r#"{"path":"a.txt"}"#],
        None,
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout_json(&out),
        json!({"kind": "completed", "output": "1\tone\n2\ttwo"})
    );

    // A failure of the call itself is still a run: exit 0, the outcome says what failed.
    let out = tool(
        dir.path(),
        &["read", "--input", r#"{"path":"missing.txt"}"#],
        None,
    );
    assert_eq!(out.status.code(), Some(0));
    let path = dir.path().canonicalize().unwrap().join("missing.txt");
    assert_eq!(
        stdout_json(&out),
        json!({"kind": "failed", "code": "sandbox.not_found", "message": format!("No file at {}", path.display())})
    );
}

#[test]
fn input_can_come_from_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let out = tool(
        dir.path(),
        &["bash", "--input", "-"],
        Some(r#"{"command":"echo hi"}"#),
    );
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        stdout_json(&out),
        json!({"kind": "completed", "output": {"exitCode": 0, "stdout": "hi\n", "stderr": ""}})
    );
}

#[test]
fn refused_input_exits_two_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&[&str], &str); 4] = [
        (
            &["rm", "--input", "{}"],
            "error: invalid value 'rm' for '<TOOL>'\n  [possible values: bash, read, write, edit, grep, glob]\n\nFor more information, try '--help'.\n",
        ),
        (
            &["read", "--input", "[1]"],
            "podhost tool: --input must be a JSON object\n",
        ),
        (
            &["read", "--input", "{path"],
            "podhost tool: --input is not valid JSON: key must be a string at line 1 column 2\n",
        ),
        (
            &["read", "--input", r#"{"file_path":"a"}"#],
            "podhost tool: Invalid read input: unknown field `file_path`, expected one of `path`, \
             `offset`, `limit`.\n",
        ),
    ];
    for (args, message) in cases {
        let out = tool(dir.path(), args, None);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert_eq!(String::from_utf8_lossy(&out.stderr), message, "{args:?}");
    }
}

#[test]
fn a_missing_workspace_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let out = tool(&missing, &["read", "--input", r#"{"path":"a"}"#], None);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with(&format!(
            "podhost tool: --workspace: {}: ",
            missing.display()
        )),
        "{err}"
    );
}

/// The command line of the process that ran a `podhost tool bash` command (its supervisor), as
/// the command sees it, with `podhost` run from `bin`: `__exec`, podhost's child; or, with the
/// read-only system where the kernel allows a mount namespace, `__session`, forked by the
/// session holder that built the namespace (both the same supervisor binary).
fn supervisor_of_a_command(bin: &std::path::Path, read_only: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(bin)
        .env("PODHOST_READ_ONLY_SYSTEM", read_only)
        .args(["tool", "bash", "--workspace"])
        .arg(dir.path())
        .arg("--input")
        .arg(json!({"command": "tr '\\0' ' ' < /proc/$PPID/cmdline"}).to_string())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let outcome = stdout_json(&out);
    assert_eq!(outcome["output"]["exitCode"], 0, "{outcome}");
    outcome["output"]["stdout"].as_str().unwrap().to_owned()
}

/// A copy of the test build of podhost in a directory of its own, with `podhost-exec` beside it
/// or not.
fn installed(with_supervisor: bool) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let podhost = dir.path().join("podhost");
    std::fs::copy(podhost_bin(), &podhost).unwrap();
    if with_supervisor {
        std::fs::copy(supervisor_bin(), dir.path().join("podhost-exec")).unwrap();
    }
    (dir, podhost)
}

/// How the supervisor is started with the read-only system on: under a session holder where
/// the kernel allows a mount namespace (the command's mount namespace is then not this
/// process's), else on its own.
fn read_only_verb() -> &'static str {
    let out = Command::new(podhost_bin())
        .args(["tool", "bash", "--input"])
        .arg(json!({"command": "readlink /proc/self/ns/mnt"}).to_string())
        .output()
        .unwrap();
    let theirs = stdout_json(&out)["output"]["stdout"]
        .as_str()
        .unwrap()
        .trim()
        .to_owned();
    let ours = std::fs::read_link("/proc/self/ns/mnt").unwrap();
    if theirs != ours.to_string_lossy() {
        "__session"
    } else {
        println!("no mount namespace here: commands run without the read-only system");
        "__exec"
    }
}

/// `podhost tool bash`'s command runs under a supervisor forked from podhost (its command line
/// podhost's), whether `podhost-exec` lies beside it or not, with the read-only system off or
/// on (built in podhost's own process where it may make a mount namespace as root; a session
/// holder's supervisor otherwise).
fn expected_parent(podhost: &std::path::Path, dir: &std::path::Path, on: bool) -> String {
    if on && read_only_verb() == "__session" && !nix::unistd::geteuid().is_root() {
        return format!("{} __session ", dir.join("podhost-exec").display());
    }
    format!("{} tool bash --workspace ", podhost.display())
}

#[test]
fn commands_run_under_a_fork_of_podhost_tool_with_podhost_exec_beside_it() {
    let (dir, podhost) = installed(true);
    for (setting, on) in [("off", false), ("on", true)] {
        let parent = supervisor_of_a_command(&podhost, setting);
        let want = expected_parent(&podhost, dir.path(), on);
        assert!(
            parent.starts_with(&want),
            "{setting}: {parent:?} vs {want:?}"
        );
    }
}

#[test]
fn commands_run_under_a_fork_of_podhost_tool_without_podhost_exec() {
    let (dir, podhost) = installed(false);
    let parent = supervisor_of_a_command(&podhost, "off");
    let want = expected_parent(&podhost, dir.path(), false);
    assert!(parent.starts_with(&want), "{parent:?} vs {want:?}");
    if nix::unistd::geteuid().is_root() {
        let parent = supervisor_of_a_command(&podhost, "on");
        assert!(parent.starts_with(&want), "{parent:?} vs {want:?}");
    }
}

/// The mount namespace a `podhost tool bash` command runs in, with `failpoints` set (if any).
fn mount_namespace_of_a_command(failpoints: Option<&str>) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(podhost_bin());
    cmd.args(["tool", "bash", "--workspace"])
        .arg(dir.path())
        .arg("--input")
        .arg(json!({"command": "readlink /proc/self/ns/mnt; pwd; touch made"}).to_string());
    if let Some(f) = failpoints {
        cmd.env("PODHOST_FAILPOINTS", f);
    }
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let outcome = stdout_json(&out);
    assert_eq!(outcome["kind"], "completed", "{outcome}");
    assert_eq!(outcome["output"]["exitCode"], 0, "{outcome}");
    let stdout = outcome["output"]["stdout"].as_str().unwrap();
    let mut lines = stdout.lines();
    let ns = lines.next().unwrap().to_owned();
    // Wherever it ran, the command started in its workspace and could write there.
    let cwd = std::fs::canonicalize(dir.path()).unwrap();
    assert_eq!(lines.next(), Some(cwd.to_str().unwrap()), "{outcome}");
    assert!(dir.path().join("made").exists(), "{outcome}");
    ns
}

/// A root `podhost tool bash` holding `CAP_SYS_ADMIN` does not probe the host's namespaces
/// (the probe's forks and namespaces would be on the command's path): it makes its command's
/// namespaces itself. Where the kernel refuses them at once, or refuses a step of the view once
/// they were made, podhost goes back to its own namespaces and working directory and the
/// command runs without the read-only system, as where a probe had found none — never a
/// failed call.
#[test]
fn a_root_podhost_tool_falls_back_where_the_kernel_refuses_the_view() {
    let ours = std::fs::read_link("/proc/self/ns/mnt")
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let normal = mount_namespace_of_a_command(None);
    // CAP_SYS_ADMIN (bit 21) in the effective set: root without it is probed as before.
    let sys_admin = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << 21) != 0);
    if !nix::unistd::geteuid().is_root() || !sys_admin {
        println!(
            "not root with CAP_SYS_ADMIN: podhost tool probes the namespaces as before (the \
             fallback is such a root's); checked that the failpoints change nothing"
        );
        for f in ["oneshot.view_refused=fail", "oneshot.view_fails=fail"] {
            assert_eq!(
                mount_namespace_of_a_command(Some(f)) == ours,
                normal == ours,
                "{f}"
            );
        }
        return;
    }
    if normal == ours {
        println!("this kernel gives root no mount namespace: the fallback is the normal path");
    }
    for f in ["oneshot.view_refused=fail", "oneshot.view_fails=fail"] {
        assert_eq!(
            mount_namespace_of_a_command(Some(f)),
            ours,
            "{f}: the command runs in podhost's own namespace"
        );
    }
}
