//! `podhost tool NAME --input JSON`: exit 0 when the tool ran (also when it failed), 2 with a
//! clear message when the input was refused before anything ran.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::support::{full_bin, installed_bins, podhost_bin};

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

/// The command line of the process that ran a `podhost tool bash` command (its supervisor, or
/// the init of its PID namespace, pid 1, where its parent podhost is outside: `$PPID` 0), as
/// the command sees it, with `podhost` run from `bin` and the read-only system `read_only`
/// (`on`, `off`).
fn supervisor_of_a_command(bin: &std::path::Path, read_only: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(bin)
        .env("PODHOST_READ_ONLY_SYSTEM", read_only)
        .args(["tool", "bash", "--workspace"])
        .arg(dir.path())
        .arg("--input")
        .arg(
            json!({"command": "p=$PPID; [ $p = 0 ] && p=1; tr '\\0' ' ' < /proc/$p/cmdline"})
                .to_string(),
        )
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let outcome = stdout_json(&out);
    assert_eq!(outcome["output"]["exitCode"], 0, "{outcome}");
    outcome["output"]["stdout"].as_str().unwrap().to_owned()
}

/// A copy of the test build of podhost in a directory of its own, with those of `beside` (of
/// `podhost-full`, `podhost-exec`) beside it.
fn installed(beside: &[&str]) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    for (from, name) in installed_bins() {
        if name == "podhost" || beside.contains(&name) {
            std::fs::copy(from, dir.path().join(name)).unwrap();
        }
    }
    let podhost = dir.path().join("podhost");
    (dir, podhost)
}

/// `podhost tool bash`'s command runs under a supervisor forked from podhost, or (with the
/// read-only system, which podhost builds in its own process, as root or in a user namespace of
/// its own) in a PID namespace whose init shares podhost's memory: either way its command line
/// is podhost's, whether `podhost-exec` lies beside it or not.
fn expected_parent(podhost: &std::path::Path) -> String {
    format!("{} tool bash --workspace ", podhost.display())
}

#[test]
fn commands_run_under_a_fork_of_podhost_tool_with_or_without_podhost_exec() {
    let beside: [&[&str]; 2] = [&["podhost-full", "podhost-exec"], &[]];
    for with in beside {
        let (_dir, podhost) = installed(with);
        for setting in ["off", "on"] {
            let parent = supervisor_of_a_command(&podhost, setting);
            let want = expected_parent(&podhost);
            assert!(
                parent.starts_with(&want),
                "{with:?}, read-only system {setting}: {parent:?} vs {want:?}"
            );
        }
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
        not_root_falls_back(&ours, &normal);
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

/// The fallback of a podhost tool that is not root with CAP_SYS_ADMIN: it makes its command's
/// namespaces in a user namespace of its own where the kernel gives one. Refused at once, the
/// command runs without the read-only system; a step of the view refused once the mount
/// namespace is made cannot be undone there (podhost's user namespace does not own the host's
/// mount namespace, so it cannot go back), and the call fails, saying so.
fn not_root_falls_back(ours: &str, normal: &str) {
    assert_eq!(
        mount_namespace_of_a_command(Some("oneshot.view_refused=fail")),
        ours,
        "refused at once: the command runs in podhost's own namespace"
    );
    if normal == ours {
        println!("no user namespace for this user here: the fallback is the normal path");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(podhost_bin())
        .env("PODHOST_FAILPOINTS", "oneshot.view_fails=fail")
        .args(["tool", "bash", "--workspace"])
        .arg(dir.path())
        .args(["--input", r#"{"command":"true"}"#])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(out.stdout.is_empty(), "{out:?}");
    assert!(
        stderr.contains(
            "could not build the command view (build the view (the failpoint \
             oneshot.view_fails): Function not implemented (os error 38)); in a user namespace \
             of its own, podhost cannot return to the host's mount namespace"
        ),
        "{stderr}"
    );
}

/// `podhost` hands every command but `tool` to `podhost-full` beside it, by `exec`: the same
/// process, with the same arguments, `argv[0]` included. Seen from outside, on a `podhost mcp`
/// that has answered (only the whole program can).
#[test]
fn every_command_but_tool_becomes_podhost_full_in_the_same_process() {
    use std::io::BufRead;
    let (install, podhost) = installed(&["podhost-full", "podhost-exec"]);
    let ws = tempfile::tempdir().unwrap();
    let mut child = Command::new(&podhost)
        .args(["mcp", "--workspace"])
        .arg(ws.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "cli-test", "version": "1"}}});
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{initialize}").unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let answer = rx
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("podhost mcp answered initialize");
    let answer: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(answer["id"], 1, "{answer}");
    assert_eq!(
        answer["result"]["serverInfo"]["name"], "podhost",
        "{answer}"
    );
    let pid = child.id();
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    drop(stdin);
    let status = child.wait().unwrap();
    assert_eq!(comm, "podhost-full\n");
    assert_eq!(
        args,
        [
            podhost.to_str().unwrap(),
            "mcp",
            "--workspace",
            ws.path().to_str().unwrap()
        ]
    );
    assert!(status.success(), "{status:?}");
    drop(install);
}

/// What `podhost` prints for every command line but `tool …` is `podhost-full`'s own, word for
/// word and with its exit code (as run under the name `podhost`); `tool --help` is the same in
/// either.
#[test]
fn podhost_prints_what_podhost_full_prints() {
    use std::os::unix::process::CommandExt;
    let lines: [&[&str]; 7] = [
        &["--version"],
        &["--help"],
        &[],
        &["serve", "--help"],
        &["serve", "--no-such-flag"],
        &["no-such-command"],
        &["tool", "--help"],
    ];
    for args in lines {
        let front = Command::new(podhost_bin()).args(args).output().unwrap();
        let full = Command::new(full_bin())
            .arg0(podhost_bin())
            .args(args)
            .output()
            .unwrap();
        assert_eq!(
            (
                front.status.code(),
                String::from_utf8_lossy(&front.stdout),
                String::from_utf8_lossy(&front.stderr)
            ),
            (
                full.status.code(),
                String::from_utf8_lossy(&full.stdout),
                String::from_utf8_lossy(&full.stderr)
            ),
            "{args:?}"
        );
        assert!(
            !front.stdout.is_empty() || !front.stderr.is_empty(),
            "{args:?} printed nothing"
        );
    }
}

/// Without `podhost-full` beside it, `podhost` says where it looked for every command but
/// `tool`, which still runs.
#[test]
fn without_podhost_full_podhost_says_where_it_looked_and_tool_still_runs() {
    let (install, podhost) = installed(&[]);
    let out = Command::new(&podhost).arg("serve").output().unwrap();
    assert_eq!(
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned()
        ),
        (
            Some(1),
            String::new(),
            format!(
                "podhost: cannot start {}: No such file or directory (os error 2) (every \
                 command but `podhost tool` runs in podhost-full, installed beside podhost)\n",
                install.path().join("podhost-full").display()
            )
        )
    );
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("a.txt"), "one\n").unwrap();
    let out = Command::new(&podhost)
        .args([
            "tool",
            "read",
            "--input",
            r#"{"path":"a.txt"}"#,
            "--workspace",
        ])
        .arg(ws.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(stdout_json(&out)["kind"], "completed", "{out:?}");
}

/// `podhost`'s entry is the C library's `main`, not std's: a panic still ends the process with
/// status 101 and the panic's message, as std's start-up would make it (here a failpoint that
/// every `podhost tool` call passes, where the workspace's sandbox is made, panics).
#[test]
fn a_panic_in_podhost_tool_exits_101_with_its_message() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(podhost_bin())
        .args([
            "tool",
            "bash",
            "--input",
            r#"{"command":"true"}"#,
            "--workspace",
        ])
        .arg(dir.path())
        .env("PODHOST_FAILPOINTS", "sandbox.refused=panic")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(101), "{stderr}");
    assert!(
        stderr.contains("failpoint sandbox.refused: panic"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "{out:?}");
}

/// Started with stdin, stdout or stderr closed, `podhost tool` first opens `/dev/null` there (as
/// std's start-up does, which `podhost` skips), so none of its own descriptors (pipes, the
/// signal descriptor) takes a standard number: the call runs, answers where stdout is open,
/// and exits 0.
#[test]
fn closed_standard_descriptors_are_opened_on_dev_null_first() {
    let dir = tempfile::tempdir().unwrap();
    for (closed, stdout_open) in [
        ("<&-", true),
        (">&-", false),
        ("2>&-", true),
        ("<&- 2>&-", true),
        ("<&- >&- 2>&-", false),
    ] {
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!(
                r#"exec "$0" tool bash --input '{{"command":"echo out; echo err >&2"}}' --workspace "$1" {closed}"#
            ))
            .arg(podhost_bin())
            .arg(dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{closed}: {out:?}");
        if stdout_open {
            let v = stdout_json(&out);
            assert_eq!(v["output"]["stdout"], "out\n", "{closed}: {v}");
            assert_eq!(v["output"]["stderr"], "err\n", "{closed}: {v}");
        }
    }
}

/// `podhost tool bash` reads the output pipes with a small buffer that grows while reads fill
/// it: output of every size, from a few bytes to many full pipes on both streams at once, is
/// captured whole up to the cap and counted exactly past it.
#[test]
fn one_shot_output_of_every_size_is_captured_and_counted_exactly() {
    let dir = tempfile::tempdir().unwrap();
    for n in [1usize, 4095, 4096, 4097, 9000, 70_000, 300_000] {
        // n characters on each stream: `a`s then a marker, `b`s then another on stderr.
        let command = format!(
            "head -c {n} /dev/zero | tr '\\0' a; printf END; \
             head -c {n} /dev/zero | tr '\\0' b >&2; printf FIN >&2"
        );
        let input = serde_json::json!({ "command": command }).to_string();
        let out = tool(dir.path(), &["bash", "--input", &input], None);
        let v = stdout_json(&out);
        for (stream, fill, end) in [("stdout", 'a', "END"), ("stderr", 'b', "FIN")] {
            let text = v["output"][stream]
                .as_str()
                .unwrap_or_else(|| panic!("{v}"));
            assert!(text.ends_with(end), "{n} {stream}: {text:.80}");
            let omitted: usize = match text.split_once("… [") {
                Some((_, rest)) => rest.split(' ').next().unwrap().parse().unwrap(),
                None => 0,
            };
            let marker = format!("\n… [{omitted} characters omitted] …\n");
            let kept = text
                .replace(&marker, "")
                .chars()
                .filter(|&c| c == fill)
                .count();
            assert_eq!(
                kept + omitted,
                n,
                "{n} {stream}: {kept} kept, {omitted} omitted"
            );
            if omitted == 0 {
                assert_eq!(text.len(), n + end.len(), "{n} {stream}");
            }
        }
    }
}

/// Whether the ELF executable at `path` names a program interpreter (the dynamic loader), and
/// whether it is position-independent (`ET_DYN`). x86-64 and aarch64 are little-endian ELF64.
fn elf_interpreter_and_pie(path: &std::path::Path) -> (bool, bool) {
    let elf = std::fs::read(path).unwrap();
    assert_eq!(
        &elf[..5],
        b"\x7fELF\x02",
        "{} is a 64-bit ELF",
        path.display()
    );
    let u16_at = |o: usize| u16::from_le_bytes(elf[o..o + 2].try_into().unwrap());
    let u32_at = |o: usize| u32::from_le_bytes(elf[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().unwrap());
    const ET_DYN: u16 = 3;
    const PT_INTERP: u32 = 3;
    let (phoff, phentsize, phnum) = (u64_at(0x20) as usize, u16_at(0x36), u16_at(0x38));
    let interp =
        (0..usize::from(phnum)).any(|i| u32_at(phoff + i * usize::from(phentsize)) == PT_INTERP);
    (interp, u16_at(0x10) == ET_DYN)
}

/// `podhost` (the front that runs `podhost tool`) is linked static at a fixed address by
/// `.cargo/link-podhost`: no dynamic loader, no shared libraries to map and no pointers to
/// relocate at each start. `podhost-full`, which runs the servers, stays dynamic and
/// position-independent (its DNS and user lookups go through the host's NSS modules).
#[test]
fn podhost_is_static_at_a_fixed_address_and_podhost_full_is_dynamic() {
    assert_eq!(
        elf_interpreter_and_pie(podhost_bin()),
        (false, false),
        "podhost: (has an interpreter, is position-independent); .cargo/link-podhost did not \
         link it static at a fixed address"
    );
    assert_eq!(
        elf_interpreter_and_pie(full_bin()),
        (true, true),
        "podhost-full"
    );
    let out = tool(
        tempfile::tempdir().unwrap().path(),
        &["bash", "--input", r#"{"command":"echo static"}"#],
        None,
    );
    assert_eq!(stdout_json(&out)["output"]["stdout"], "static\n", "{out:?}");
}

/// A call that runs no command never probes the namespaces a command would get (that probe's
/// forks and throw-away namespaces were most of a file tool call's time): with the probe made to
/// kill podhost, every file tool still answers. `podhost mcp`, whose commands may run in them,
/// does probe: the same failpoint kills it, so the failpoint is on the probe's path.
#[test]
fn only_calls_that_run_a_command_probe_the_namespaces() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "one\ntwo\n").unwrap();
    let calls = [
        ("read", json!({"path": "a.txt"})),
        ("grep", json!({"pattern": "two"})),
        ("glob", json!({"pattern": "*.txt"})),
        ("write", json!({"path": "b.txt", "content": "b\n"})),
        (
            "edit",
            json!({"path": "b.txt", "old_string": "b", "new_string": "c"}),
        ),
    ];
    for (name, input) in calls {
        let out = Command::new(podhost_bin())
            .args(["tool", name, "--input", &input.to_string(), "--workspace"])
            .arg(dir.path())
            .env("PODHOST_FAILPOINTS", "probe.namespaces=kill")
            .env_remove("PODHOST_WORKSPACE")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{name}: {out:?}");
        assert_eq!(stdout_json(&out)["kind"], "completed", "{name}: {out:?}");
    }
    assert_eq!(
        std::fs::read_to_string(dir.path().join("b.txt")).unwrap(),
        "c\n"
    );
    let mcp = Command::new(podhost_bin())
        .args(["mcp", "--workspace"])
        .arg(dir.path())
        .env("PODHOST_FAILPOINTS", "probe.namespaces=kill")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert_eq!(mcp.signal(), Some(libc::SIGKILL), "podhost mcp: {mcp:?}");
}
