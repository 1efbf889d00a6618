//! podhost's own process, attacked from a command it runs (the real binary, `podhost tool`):
//! its environment and memory through `/proc`, ptrace, and signals. The command finds podhost as
//! the parent of its supervisor (`$PPID`), or, in a PID namespace of its own, as that
//! namespace's init, which shares podhost's memory (see `against_podhost`).

use std::ffi::OsString;
use std::path::Path;

use pretty_assertions::assert_eq;
use serde_json::json;

use crate::{Host, SECRET, completed, podhost_tool};

/// The environment podhost is started with: a secret it reads (and scrubs) and a setting that
/// is no secret (so it stays in the environment block).
const ENV: [(&str, &str); 2] = [
    ("PODHOST_TOKEN", SECRET),
    ("PODHOST_CANARY_SETTING", "canary-visible"),
];

/// Shell that sets `$P` to podhost's pid and `$S` to the command's supervisor's, then runs
/// `body`; pids are printed as `PID` and `SUP`. Under a supervisor (a session holder, where
/// there is one, lies between it and podhost), podhost is the first process named `podhost`
/// above it. In a PID namespace of its own (`podhost tool` where it builds the view; `$PPID`
/// is 0 there, podhost being outside), both are the namespace's init, pid 1, which shares
/// podhost's memory and environment: its first line says which.
fn against_podhost(body: &str) -> serde_json::Value {
    json!({ "command": format!(
        "if [ $PPID = 0 ]; then echo pid-namespace; P=1; S=1; else echo supervisor; \
           P=$(cut -d' ' -f4 /proc/$PPID/stat); \
           while [ \"$(cat /proc/$P/comm)\" != podhost ] && [ \"$P\" -gt 1 ]; do \
             P=$(cut -d' ' -f4 /proc/$P/stat); done; S=$PPID; fi; \
         {{ {body}; }} 2>&1 | sed \"s#/proc/$P/#/proc/PID/#g; s#($P)#(PID)#g; \
           s#/proc/$S/#/proc/SUP/#g; s#($S)#(SUP)#g\""
    )})
}

/// The output of an [`against_podhost`] command, and `expected` as it reads there: where the
/// command ran in a PID namespace of its own, its supervisor is podhost's init too (`PID`).
fn as_run(stdout: &str, expected: &str) -> (String, String) {
    let (mode, rest) = stdout.split_once('\n').unwrap_or((stdout, ""));
    match mode {
        "pid-namespace" => (rest.to_owned(), expected.replace("SUP", "PID")),
        "supervisor" => (rest.to_owned(), expected.to_owned()),
        other => panic!("no mode line: {other}"),
    }
}

/// Python that tries PTRACE_ATTACH on each pid given after it and prints the errno name (or
/// "attached").
const PTRACE: &str = "python3 -c '
import ctypes, errno, sys
libc = ctypes.CDLL(None, use_errno=True)
for pid in sys.argv[1:]:
    r = libc.ptrace(16, int(pid), None, None)
    print(\"attached\" if r == 0 else errno.errorcode[ctypes.get_errno()])
'";

fn run_as(args: &[OsString], input: &serde_json::Value, as_nobody: Option<&Path>) -> String {
    let (outcome, stderr, code) = podhost_tool("bash", args, input, &ENV, as_nobody);
    assert_eq!(code, 0, "{stderr}");
    let out = completed(&outcome);
    assert!(!outcome.to_string().contains(SECRET), "{outcome}");
    out["stdout"].as_str().unwrap().to_owned()
}

#[test]
fn podhosts_environment_and_memory_are_closed_to_its_commands() {
    let host = Host::new();
    let stdout = run_as(
        &host.tool_args(),
        &against_podhost(
            "cat /proc/$P/comm; cat /proc/$P/environ; cat /proc/$P/mem; cat /proc/$P/maps; \
             readlink /proc/$P/cwd || echo no cwd; cat /proc/$S/environ; echo end",
        ),
        None,
    );
    let (got, expected) = as_run(
        &stdout,
        "podhost\n\
         cat: /proc/PID/environ: Permission denied\n\
         cat: /proc/PID/mem: Permission denied\n\
         cat: /proc/PID/maps: Permission denied\n\
         no cwd\n\
         cat: /proc/SUP/environ: Permission denied\n\
         end\n",
    );
    assert_eq!(got, expected);
}

#[test]
fn ptrace_of_podhost_and_of_the_supervisor_fails() {
    let host = Host::new();
    let stdout = run_as(
        &host.tool_args(),
        &against_podhost(&format!("{PTRACE} $P $S")),
        None,
    );
    let (got, expected) = as_run(&stdout, "EPERM\nEPERM\n");
    assert_eq!(got, expected);
}

/// Landlock's signal scoping (ABI 6): a command cannot signal podhost or its supervisor, and
/// podhost answers as usual afterwards.
#[test]
fn commands_cannot_signal_podhost_or_their_supervisor() {
    let host = Host::new();
    let stdout = run_as(
        &host.tool_args(),
        &against_podhost("kill -TERM $P; kill -KILL $P; kill -KILL $S; echo alive"),
        None,
    );
    let (got, expected) = as_run(
        &stdout,
        "/bin/bash: line 1: kill: (PID) - Operation not permitted\n\
         /bin/bash: line 1: kill: (PID) - Operation not permitted\n\
         /bin/bash: line 1: kill: (SUP) - Operation not permitted\n\
         alive\n",
    );
    assert_eq!(got, expected);
}

/// Without Landlock, non-dumpable alone closes podhost to a command of the same (unprivileged)
/// user: podhost runs as nobody here, on a kernel pretending to have no Landlock. (Its
/// supervisor is not closed that way: it holds nothing the command lacks, but a command could
/// ptrace-stop it; podhost's timeout then kills it from outside.)
#[test]
fn without_landlock_non_dumpable_still_closes_podhost_to_the_same_user() {
    let _nobody = crate::nobody_lock();
    let host = Host::new();
    let podhost = host.open_to_everyone();
    let mut args = host.tool_args();
    args.extend(["--landlock-abi-max".into(), "0".into()]);
    let stdout = run_as(
        &args,
        &against_podhost(&format!(
            "id -u; cat /proc/$P/environ; cat /proc/$P/mem; {PTRACE} $P"
        )),
        Some(&podhost),
    );
    let (got, expected) = as_run(
        &stdout,
        "65534\n\
         cat: /proc/PID/environ: Permission denied\n\
         cat: /proc/PID/mem: Permission denied\n\
         EPERM\n",
    );
    assert_eq!(got, expected);
}

/// A secret read from podhost's environment is overwritten in the initial environment block
/// that `/proc/<pid>/environ` shows, while settings that are no secret stay. Seen from this test
/// (root with every capability, outside any sandbox), the one observer that may still read a
/// non-dumpable process.
#[test]
fn secrets_are_overwritten_in_podhosts_initial_environment() {
    use std::time::{Duration, Instant};
    let host = Host::new();
    let child = std::process::Command::new(crate::support::podhost_bin())
        .args(["tool", "bash"])
        .args(host.tool_args())
        .arg("--input")
        .arg(
            json!({"command": "touch started; while [ ! -e done ]; do sleep 0.05; done"})
                .to_string(),
        )
        .envs(ENV)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !host.ws.join("started").exists() {
        assert!(Instant::now() < deadline, "the command never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    let environ = std::fs::read(format!("/proc/{}/environ", child.id()));
    std::fs::write(host.ws.join("done"), "").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let mut podhost_vars: Vec<String> = environ
        .unwrap()
        .split(|&b| b == 0)
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .filter(|v| v.starts_with("PODHOST_"))
        .collect();
    podhost_vars.sort();
    assert_eq!(
        podhost_vars,
        vec![
            "PODHOST_CANARY_SETTING=canary-visible".to_owned(),
            format!("PODHOST_TOKEN={}", "*".repeat(SECRET.len())),
        ]
    );
}

/// A command of a root podhost keeps only a container's usual capabilities: no ptrace (which
/// would open a non-dumpable podhost's `/proc` files to it), no device nodes in the workspace
/// (which would read the disk beneath every path rule), no raising its limits back.
#[test]
fn root_commands_shed_dangerous_capabilities() {
    let host = Host::new();
    let stdout = run_as(
        &host.tool_args(),
        &json!({"command": "id -u; grep -E '^Cap(Inh|Bnd|Amb)' /proc/self/status; \
                            mknod disk b 8 0 2>&1; ulimit -Hn unlimited 2>&1; echo end"}),
        None,
    );
    assert_eq!(
        stdout,
        "0\nCapInh:\t0000000000000000\nCapBnd:\t00000000a00405fb\nCapAmb:\t0000000000000000\n\
         mknod: disk: Operation not permitted\n\
         /bin/bash: line 1: ulimit: open files: cannot modify limit: Operation not permitted\n\
         end\n"
    );
}

/// `PODHOST_COMMAND_USER`: a root podhost runs commands as another user, without its
/// supplementary groups; the workspace must be writable by that user.
#[test]
fn a_root_podhost_drops_commands_to_the_command_user() {
    let _nobody = crate::nobody_lock();
    let host = Host::new();
    let _ = host.open_to_everyone();
    let mut args = host.tool_args();
    args.extend(["--command-user".into(), "nobody".into()]);
    let stdout = run_as(
        &args,
        &json!({"command": "id -u; id -g; id -G; grep -E '^Cap(Eff|Prm)' /proc/self/status; \
                            touch made; stat -c %u made"}),
        None,
    );
    assert_eq!(
        stdout,
        "65534\n65534\n65534\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\n65534\n"
    );
}
