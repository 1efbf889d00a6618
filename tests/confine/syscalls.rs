//! The system-call filter and the session keyring, attacked from real commands: a Python script
//! (`ctypes`, raw `syscall(2)`) makes each call the filter must refuse and prints the errno it
//! got, on every front — a BYOH session (a toolbox isolated as `podhost serve` isolates its
//! sessions, in-process), a pod (`podhost tool --isolate`: the pod's isolation, the real
//! binary), local `podhost tool` as root and as an unprivileged user — and at every namespace
//! level of a session holder (`root`, `userns`, `userns-noproc`, `none`). A key planted in a
//! uid's user keyring (as a session before the filter could have left it) cannot be read by a
//! later session of that uid, and no session can add one. Ordinary tools keep working, and
//! podhost keeps serving after each attack.
//!
//! The arguments are chosen so that the filter's answer shows: with its installation skipped
//! (tried by hand, Linux 6.18), a BYOH session's command got `ok` from `add_key`, `keyctl`,
//! `request_key`, `userfaultfd(UFFD_USER_MODE_ONLY)`, a user-space `perf_event_open`,
//! `io_uring_setup`, `unshare(CLONE_NEWUSER)` (and, inside that namespace, `unshare(CLONE_NEWNS)`,
//! `clone(CLONE_NEWNET)` and `fsopen`), `clone3`, `quotactl(Q_SYNC)`,
//! `personality(ADDR_NO_RANDOMIZE)`, `socket(AF_VSOCK)` and `sysfs`, and its x32 call ran; the
//! calls that need a capability the command lacks got the kernel's own `EPERM` (or `EINVAL`,
//! `ENOSYS`) instead.

use std::ffi::OsString;
use std::path::Path;

use podhost::exec::confine::Settings;
use podhost::exec::protocol::{CommandUser, SessionRequest};
use podhost::exec::session::SessionSlot;
use podhost::floor::workspace::Workspace;
use podhost::tools::{Toolbox, ToolboxBuilder};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::support::{executor, supervisor_bin};
use crate::{
    Host, NOBODY, SECRET, assert_still_works, bash, completed, has_namespaces, isolated_settings,
    podhost_tool,
};

/// What the attack script defines before its calls: `call(label, nr, *args)` prints
/// `label: ok` or `label: ERRNO` (`raw(nr, *args)` returns the result); `s(bytes)` and `mem(n)`
/// give addresses of C strings and of zeroed memory that live as long as the script.
const PRELUDE: &str = r#"import ctypes, errno, os, struct, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
keep = []
def s(b):
    p = ctypes.create_string_buffer(b)
    keep.append(p)
    return ctypes.addressof(p)
def mem(n, init=b""):
    p = ctypes.create_string_buffer(init.ljust(n, b"\0"), n)
    keep.append(p)
    return ctypes.addressof(p)
def raw(nr, *args):
    return libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
def call(label, nr, *args):
    ctypes.set_errno(0)
    r = raw(nr, *args)
    e = ctypes.get_errno()
    if label.startswith("clone"):
        if r == 0:
            os._exit(0)
        if r > 0:
            os.waitpid(r, 0x40000000)
    print(f"{label}: {'ok' if r >= 0 else errno.errorcode.get(e, e)}", flush=True)
perf = bytearray(128)
struct.pack_into("IIQ", perf, 0, 1, 128, 9)
struct.pack_into("Q", perf, 40, 1 | 1 << 5 | 1 << 6)
perf = mem(128, bytes(perf))
handle = mem(136, struct.pack("I", 128))
"#;

/// Each call of the attack: its label, its arguments after the label (Python), and the answer
/// the filter gives.
fn attacks() -> Vec<(&'static str, String, &'static str)> {
    use libc::*;
    const KEY_SPEC_SESSION_KEYRING: i32 = -3;
    const KEY_SPEC_USER_KEYRING: i32 = -4;
    const AT_FDCWD: i32 = -100;
    const Q_SYNC_USRQUOTA: u32 = 0x8000_0100;
    const ADDR_NO_RANDOMIZE: u32 = 0x0040000;
    let mut calls = vec![
        (
            "add_key into @u",
            format!(
                "{SYS_add_key}, s(b'user'), s(b'b5-probe'), s(b'payload'), 7, \
                 {KEY_SPEC_USER_KEYRING}"
            ),
            "EPERM",
        ),
        (
            "add_key into @s",
            format!(
                "{SYS_add_key}, s(b'user'), s(b'b5-probe'), s(b'payload'), 7, \
                 {KEY_SPEC_SESSION_KEYRING}"
            ),
            "EPERM",
        ),
        (
            "keyctl get @u",
            format!("{SYS_keyctl}, 0, {KEY_SPEC_USER_KEYRING}, 0"),
            "EPERM",
        ),
        (
            "keyctl get @s",
            format!("{SYS_keyctl}, 0, {KEY_SPEC_SESSION_KEYRING}, 0"),
            "EPERM",
        ),
        (
            "request_key",
            format!("{SYS_request_key}, s(b'user'), s(b'b5-probe'), 0, 0"),
            "EPERM",
        ),
        ("bpf", format!("{SYS_bpf}, 0, mem(128), 128"), "EPERM"),
        ("userfaultfd", format!("{SYS_userfaultfd}, 1"), "EPERM"),
        (
            "perf_event_open",
            format!("{SYS_perf_event_open}, perf, 0, -1, -1, 0"),
            "EPERM",
        ),
        (
            "io_uring_setup",
            format!("{SYS_io_uring_setup}, 1, mem(120)"),
            "EPERM",
        ),
        (
            "unshare(CLONE_NEWUSER)",
            format!("{SYS_unshare}, {CLONE_NEWUSER}"),
            "EPERM",
        ),
        (
            "unshare(CLONE_NEWNS)",
            format!("{SYS_unshare}, {CLONE_NEWNS}"),
            "EPERM",
        ),
        (
            "setns",
            format!("{SYS_setns}, os.open('/proc/self/ns/uts', os.O_RDONLY), 0"),
            "EPERM",
        ),
        (
            "clone(CLONE_NEWNET)",
            format!("{SYS_clone}, {}, 0, 0, 0, 0", CLONE_NEWNET | SIGCHLD),
            "EPERM",
        ),
        (
            "clone(CLONE_NEWUSER)",
            format!("{SYS_clone}, {}, 0, 0, 0, 0", CLONE_NEWUSER | SIGCHLD),
            "EPERM",
        ),
        ("clone3", format!("{SYS_clone3}, mem(88), 88"), "ENOSYS"),
        (
            "mount tmpfs",
            format!("{SYS_mount}, s(b'tmpfs'), s(b'.'), s(b'tmpfs'), 0, 0"),
            "EPERM",
        ),
        ("umount2", format!("{SYS_umount2}, s(b'/'), 2"), "EPERM"),
        (
            "pivot_root",
            format!("{SYS_pivot_root}, s(b'.'), s(b'.')"),
            "EPERM",
        ),
        ("fsopen", format!("{SYS_fsopen}, s(b'tmpfs'), 0"), "EPERM"),
        (
            "open_tree",
            format!("{SYS_open_tree}, {AT_FDCWD}, s(b'/'), 1"),
            "EPERM",
        ),
        (
            "open_by_handle_at",
            format!("{SYS_open_by_handle_at}, {AT_FDCWD}, handle, 0"),
            "EPERM",
        ),
        (
            "kexec_load",
            format!("{SYS_kexec_load}, 0, 0, 0, 0"),
            "EPERM",
        ),
        (
            "init_module",
            format!("{SYS_init_module}, mem(16), 16, s(b'')"),
            "EPERM",
        ),
        (
            "delete_module",
            format!("{SYS_delete_module}, s(b'podhost_none'), 0"),
            "EPERM",
        ),
        ("swapon", format!("{SYS_swapon}, s(b'swap'), 0"), "EPERM"),
        ("reboot", format!("{SYS_reboot}, 0, 0, 0, 0"), "EPERM"),
        ("acct", format!("{SYS_acct}, 0"), "EPERM"),
        (
            "clock_settime",
            format!("{SYS_clock_settime}, 0, mem(16)"),
            "EPERM",
        ),
        ("syslog", format!("{SYS_syslog}, 10, 0, 0"), "EPERM"),
        (
            "quotactl(Q_SYNC)",
            format!("{SYS_quotactl}, {Q_SYNC_USRQUOTA}, 0, 0, 0"),
            "EPERM",
        ),
        (
            "personality(ADDR_NO_RANDOMIZE)",
            format!("{SYS_personality}, {ADDR_NO_RANDOMIZE}"),
            "EPERM",
        ),
        (
            "socket(AF_ALG)",
            format!("{SYS_socket}, {AF_ALG}, {SOCK_SEQPACKET}, 0"),
            "EPERM",
        ),
        (
            "socket(AF_VSOCK)",
            format!("{SYS_socket}, {AF_VSOCK}, {SOCK_STREAM}, 0"),
            "EPERM",
        ),
        // What the filter lets through, as Docker's profile does.
        (
            "personality(query)",
            format!("{SYS_personality}, 0xffffffff"),
            "ok",
        ),
        (
            "socket(AF_INET)",
            format!("{SYS_socket}, {AF_INET}, {SOCK_STREAM}, 0"),
            "ok",
        ),
        ("adjtimex (read)", format!("{SYS_adjtimex}, mem(208)"), "ok"),
    ];
    if cfg!(target_arch = "x86_64") {
        #[cfg(target_arch = "x86_64")]
        calls.extend([
            ("iopl", format!("{SYS_iopl}, 3"), "EPERM"),
            ("ioperm", format!("{SYS_ioperm}, 128, 1, 1"), "EPERM"),
            ("sysfs", format!("{SYS_sysfs}, 3"), "EPERM"),
            ("ustat", format!("{SYS_ustat}, 0, mem(32)"), "EPERM"),
            ("uselib", format!("{SYS_uselib}, s(b'')"), "EPERM"),
        ]);
    }
    calls
}

/// The x32 call (x86-64's 32-bit ABI) the script makes in a child: the filter kills it.
const X32_CHILD: &str = r#"x32 = "import ctypes; ctypes.CDLL(None).syscall(0x40000000 | 39)"
r = subprocess.run([sys.executable, "-c", x32])
print(f"x32 getpid: signal {-r.returncode}")
"#;

/// The attack script and the output it must print.
fn attack_script() -> (String, String) {
    let mut script = PRELUDE.to_owned();
    let mut want = String::new();
    for (label, args, answer) in attacks() {
        script.push_str(&format!("call({label:?}, {args})\n"));
        want.push_str(&format!("{label}: {answer}\n"));
    }
    if cfg!(target_arch = "x86_64") {
        script.push_str(X32_CHILD);
        want.push_str("x32 getpid: signal 31\n");
    }
    (script, want)
}

/// Writes the attack script into `ws` (readable by every uid) and returns the command that runs
/// it.
fn plant_attack(ws: &Path) -> (String, String) {
    let (script, want) = attack_script();
    write_script(ws, "attack.py", &script);
    ("python3 attack.py".to_owned(), want)
}

/// The attack from `tb`'s workspace: every call gets the filter's answer, and the next call works.
async fn attack_toolbox(host: &Host, tb: &Toolbox, what: &str) {
    let (command, want) = plant_attack(tb.workspace().root());
    let out = bash(host, tb, &command).await;
    assert_eq!(
        out,
        json!({"exitCode": 0, "stdout": want, "stderr": ""}),
        "{what}"
    );
    assert_still_works(tb).await;
}

/// A BYOH session (as `podhost serve` isolates one: namespaces, its uid from the pool, no
/// capabilities) is refused every dangerous call.
#[tokio::test]
async fn a_byoh_session_is_refused_the_dangerous_calls() {
    let host = Host::new();
    let tb = host.isolated(|_| {});
    let level = tb.executor().confinement().level();
    assert_eq!(
        (level.syscall_filter, level.session_keyring),
        (
            "docker-default",
            if has_namespaces() {
                "per session"
            } else {
                "per command"
            }
        )
    );
    attack_toolbox(&host, &tb, "a BYOH session").await;
    // The session's holder (pid 1 of its PID namespace) runs under the filter but the mounts
    // it still makes, and each command under that and a filter of its own refusing the rest:
    // a command spends a few instructions' installation, not the whole filter's.
    let out = bash(
        &host,
        &tb,
        "grep Seccomp_filters /proc/self/status /proc/1/status",
    )
    .await;
    let want = if has_namespaces() {
        "/proc/self/status:Seccomp_filters:\t2\n/proc/1/status:Seccomp_filters:\t1\n"
    } else {
        eprintln!("no namespaces here: no holder, each command installs the whole filter");
        "/proc/self/status:Seccomp_filters:\t1\n"
    };
    if has_namespaces() {
        assert_eq!(out["stdout"], want, "{out}");
    } else {
        assert!(out["stdout"].as_str().unwrap().starts_with(want), "{out}");
    }
}

/// The toolbox of a session whose holder makes a user namespace but no PID namespace, as on a
/// host that refuses a fresh `/proc` (`userns-noproc`; here root maps itself, and the command
/// stays root without capabilities, since a pool uid has no mapping in that namespace).
fn userns_noproc_toolbox(host: &Host) -> Toolbox {
    let mut settings = isolated_settings();
    settings.root_asked = true;
    settings.uid_pool = None;
    let confinement = host.confinement(&settings);
    let ws = Workspace::new(&host.ws, Some(Path::new("/workspace"))).unwrap();
    let view = confinement.for_workspace(&ws).view.unwrap();
    let exec = executor(&host.ws)
        .with_confinement(confinement)
        .with_session(SessionSlot::new(
            supervisor_bin().to_path_buf(),
            SessionRequest {
                parent: std::process::id(),
                userns: Some(CommandUser {
                    uid: nix::unistd::geteuid().as_raw(),
                    gid: nix::unistd::getegid().as_raw(),
                }),
                pid_namespace: false,
                cgroup_procs: Vec::new(),
                network: None,
                disk: None,
                overlay: None,
                view,
                landlock: None,
            },
            None,
        ));
    Toolbox::new(ws, exec)
}

/// A session holder makes its namespaces and mounts unfiltered and its commands run filtered at
/// every level: `root` (above), `userns-noproc` (a user namespace without a PID namespace) and
/// `none` (no holder); `userns` is the unprivileged podhost's below.
#[tokio::test]
async fn the_holder_works_and_its_commands_are_filtered_at_every_level() {
    let host = Host::new();
    if nix::unistd::geteuid().is_root() && has_namespaces() {
        let tb = userns_noproc_toolbox(&host);
        // Without a PID namespace the host's processes are in view (podhost's among them); the
        // user namespace maps one uid.
        let out = bash(
            &host,
            &tb,
            "ps -e | wc -l; awk '{print $3}' /proc/self/uid_map",
        )
        .await;
        let lines: Vec<u32> = out["stdout"]
            .as_str()
            .unwrap()
            .lines()
            .map(|l| l.trim().parse().unwrap())
            .collect();
        assert!(lines[0] > 6 && lines[1] == 1, "{out}");
        attack_toolbox(&host, &tb, "userns-noproc").await;
    } else {
        eprintln!("not root with namespaces here: the userns-noproc holder is not made");
    }
    let none = host.isolated(|s| s.namespaces = false);
    assert_eq!(none.executor().confinement().level().namespaces, "none");
    attack_toolbox(&host, &none, "namespaces none").await;
    // Without a holder each command's supervisor joins a keyring of its own: two commands, two
    // keyrings, neither podhost's.
    let mut seen = Vec::new();
    for _ in 0..2 {
        let out = bash(&host, &none, "cat /proc/keys").await;
        let mine = session_keyrings(out["stdout"].as_str().unwrap());
        assert_eq!(mine.len(), 1, "{out}");
        seen.extend(mine);
    }
    assert_ne!(seen[0], seen[1]);
    assert!(!seen.contains(&podhosts_session_keyring()), "{seen:?}");
}

/// podhost's own session keyring (the test process is podhost here), as `/proc/keys` names it.
fn podhosts_session_keyring() -> String {
    python_as(
        nix::unistd::geteuid().as_raw(),
        &format!(
            "{PRELUDE}\nprint('%08x' % raw({}, 0, -3, 0))",
            libc::SYS_keyctl
        ),
    )
    .trim()
    .to_owned()
}

/// `podhost tool` arguments for `host`'s workspace, isolated as a pod's when `isolate`.
fn tool_args(host: &Host, isolate: bool) -> Vec<OsString> {
    let mut args = host.tool_args();
    if isolate {
        args.push("--isolate".into());
    }
    args
}

/// Runs the attack through the real binary (`podhost tool bash`) and checks it whole.
fn attack_tool(host: &Host, isolate: bool, as_nobody: Option<&Path>, what: &str) -> String {
    let (command, want) = plant_attack(&host.ws);
    let (outcome, stderr, code) = podhost_tool(
        "bash",
        &tool_args(host, isolate),
        &json!({ "command": command }),
        &[("RUST_LOG", "podhost::exec::confine=debug")],
        as_nobody,
    );
    assert_eq!(code, 0, "{what}: {stderr}");
    assert_eq!(
        completed(&outcome),
        &json!({"exitCode": 0, "stdout": want, "stderr": ""}),
        "{what}"
    );
    stderr
}

/// A pod's commands (`podhost tool --isolate`: the pod's isolation; a root podhost runs them as
/// nobody) and local `podhost tool` commands (root's, with a container's capabilities) are
/// refused every dangerous call, and podhost ends its call normally.
#[test]
fn pod_and_local_commands_are_refused_the_dangerous_calls() {
    let _nobody = crate::nobody_lock();
    let host = Host::new();
    let _ = host.open_to_everyone();
    for (isolate, what) in [(true, "a pod"), (false, "local podhost tool")] {
        let stderr = attack_tool(&host, isolate, None, what);
        assert!(
            stderr.contains("syscall filter docker-default"),
            "{what}: {stderr}"
        );
    }
}

/// An unprivileged podhost (nobody): locally (Landlock only) and isolated (its sessions in a
/// user namespace, the `userns` level), its commands are refused the same calls.
#[test]
fn an_unprivileged_podhosts_commands_are_refused_the_dangerous_calls() {
    let _nobody = crate::nobody_lock();
    let host = Host::new();
    let podhost = host.open_to_everyone();
    for (isolate, what) in [(false, "local, as nobody"), (true, "isolated, as nobody")] {
        let stderr = attack_tool(&host, isolate, Some(&podhost), what);
        let level = stderr
            .lines()
            .find(|l| l.contains("are confined"))
            .unwrap_or_else(|| panic!("{what}: no level logged: {stderr}"));
        assert!(level.contains("syscall filter docker-default"), "{level}");
        if isolate && !level.contains("namespaces userns") {
            eprintln!("no user namespaces here ({level}): the Landlock-only level was attacked");
        }
    }
}

/// Python run as `uid` outside every sandbox (as a process of that uid that no filter held
/// could): adds a `user` key holding the secret to the uid's user keyring and prints its id.
fn plant_key(uid: u32) -> i64 {
    let out = python_as(
        uid,
        &format!(
            "{PRELUDE}\nprint(raw({}, s(b'user'), s(b'b5-secret'), s(b'{SECRET}'), {}, -4))",
            libc::SYS_add_key,
            SECRET.len()
        ),
    );
    let id: i64 = out.trim().parse().unwrap();
    assert!(id > 0, "could not plant a key as uid {uid}: {out}");
    id
}

/// What the key `id` holds, read as `uid` outside every sandbox.
fn read_key(uid: u32, id: i64) -> String {
    python_as(
        uid,
        &format!(
            "{PRELUDE}\nb = ctypes.create_string_buffer(256)\n\
             n = raw({}, 11, {id}, ctypes.addressof(b), 256)\n\
             print(b.raw[:n].decode() if n >= 0 else n)",
            libc::SYS_keyctl
        ),
    )
    .trim()
    .to_owned()
}

/// Unlinks the key `id` from `uid`'s user keyring (so the tests leave nothing behind).
fn drop_key(uid: u32, id: i64) {
    python_as(
        uid,
        &format!("{PRELUDE}\nraw({}, 9, {id}, -4)", libc::SYS_keyctl),
    );
}

fn python_as(uid: u32, script: &str) -> String {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new("/usr/bin/python3");
    cmd.arg("-c").arg(script);
    if uid != nix::unistd::geteuid().as_raw() {
        cmd.uid(uid).gid(uid);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// The key attack of a session: add a key to `@u` and `@s`, and read the planted key by its id,
/// by a search of `@u`, and by `request_key`.
fn key_attack(id: i64) -> (String, String) {
    let (keyctl, add_key) = (libc::SYS_keyctl, libc::SYS_add_key);
    let script = format!(
        "{PRELUDE}\n\
         call('add_key into @u', {add_key}, s(b'user'), s(b'mine'), s(b'x'), 1, -4)\n\
         call('add_key into @s', {add_key}, s(b'user'), s(b'mine'), s(b'x'), 1, -3)\n\
         call('keyctl read', {keyctl}, 11, {id}, mem(256), 256)\n\
         call('keyctl search @u', {keyctl}, 10, -4, s(b'user'), s(b'b5-secret'), 0)\n\
         call('request_key', {}, s(b'user'), s(b'b5-secret'), 0, 0)\n",
        libc::SYS_request_key
    );
    let want = "add_key into @u: EPERM\nadd_key into @s: EPERM\nkeyctl read: EPERM\n\
                keyctl search @u: EPERM\nrequest_key: EPERM\n"
        .to_owned();
    (script, want)
}

/// Writes `script` into `ws` as `name`, readable by every uid.
fn write_script(ws: &Path, name: &str, script: &str) {
    use std::os::unix::fs::PermissionsExt;
    let path = ws.join(name);
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
}

/// The id of the session keyring a command possesses, from `/proc/keys` (which lists the keys
/// a process may view, as `cat /proc/keys` in a command printed them).
fn session_keyrings(keys: &str) -> Vec<String> {
    keys.lines()
        .filter(|l| l.contains(" keyring ") && l.contains(" _ses"))
        .map(|l| l.split_whitespace().next().unwrap().to_owned())
        .collect()
}

/// B5: two BYOH sessions given the same uid one after the other (the first swept, its uid
/// reused; a non-root podhost's sessions all share its uid). The first cannot add a key to
/// `@u` or `@s`; a key left in the uid's user keyring anyway (planted from outside, as a
/// process no filter held could) cannot be read by the second; each session has a session
/// keyring of its own, never podhost's.
#[tokio::test]
async fn a_later_byoh_session_of_the_same_uid_reads_no_key() {
    let host = Host::new();
    let root = nix::unistd::geteuid().is_root();
    let mut settings = isolated_settings();
    if let Some(pool) = &mut settings.uid_pool {
        pool.last = pool.first;
    }
    let builder = ToolboxBuilder::new(
        &podhost::exec::ExecSettings {
            shell: None,
            limits: podhost::exec::ResourceLimits::default(),
            confine: settings.clone(),
        },
        supervisor_bin().to_path_buf(),
    )
    .confine(|c| c.hide(&host.data));
    // Both sessions are handed the pool's one uid, as the store hands a swept session's uid to
    // the next.
    let session = |ws: &Path, tmp: &Path| {
        builder
            .build_as(
                Workspace::new(ws, Some(Path::new("/workspace"))).unwrap(),
                Some(tmp),
                settings.uid_pool.map(|p| p.first),
            )
            .unwrap()
    };
    let first = session(&host.ws, &host.tmp);
    let (command, want) = plant_attack(&host.ws);
    let out = bash(
        &host,
        &first,
        &format!("{command} && id -u && cat /proc/keys"),
    )
    .await;
    let stdout = out["stdout"].as_str().unwrap();
    assert!(stdout.starts_with(&want), "{out}");
    let rest: Vec<&str> = stdout[want.len()..].splitn(2, '\n').collect();
    let uid: u32 = rest[0].parse().unwrap();
    let first_keyring = session_keyrings(rest[1]);
    assert_eq!(first_keyring.len(), 1, "{out}");
    if root {
        assert_eq!(Some(uid), settings.uid_pool.map(|p| p.first));
    }
    drop(first);
    // The first session is swept: its workspace goes, and its uid is free again.
    std::fs::remove_dir_all(host.ws.parent().unwrap()).unwrap();

    let id = plant_key(uid);
    let second_ws = host.other_ws.clone();
    std::fs::write(second_ws.join("hello.txt"), "hello\n").unwrap();
    let second = session(&second_ws, &host.data.join("tmp/b"));
    let (script, want) = key_attack(id);
    write_script(&second_ws, "keys.py", &script);
    let out = bash(&host, &second, "python3 keys.py && id -u && cat /proc/keys").await;
    let stdout = out["stdout"].as_str().unwrap().to_owned();
    let read = read_key(uid, id);
    drop_key(uid, id);
    assert!(!stdout.contains(SECRET), "{stdout}");
    assert!(stdout.starts_with(&want), "{out}");
    let rest: Vec<&str> = stdout[want.len()..].splitn(2, '\n').collect();
    assert_eq!(
        rest[0],
        uid.to_string(),
        "the second session has the same uid"
    );
    let second_keyring = session_keyrings(rest[1]);
    assert_eq!(second_keyring.len(), 1, "{out}");
    assert_ne!(
        second_keyring, first_keyring,
        "a session keyring of its own"
    );
    // The key was there to be read, outside the sandbox: only the filter kept it.
    assert_eq!(read, SECRET);
    // podhost's own session keyring is neither.
    let own = podhosts_session_keyring();
    assert!(
        !first_keyring.contains(&own) && !second_keyring.contains(&own),
        "{own} {first_keyring:?} {second_keyring:?}"
    );
    assert_still_works(&second).await;
}

/// The same across two pods' sessions of one uid (a root podhost's pod commands run as nobody)
/// and two sessions of an unprivileged podhost (nobody): a key in nobody's user keyring is read
/// by neither, and neither can add one.
#[test]
fn later_sessions_of_pods_and_of_an_unprivileged_podhost_read_no_key() {
    let _nobody = crate::nobody_lock();
    let host = Host::new();
    let podhost = host.open_to_everyone();
    let id = plant_key(NOBODY);
    struct DropKey(i64);
    impl Drop for DropKey {
        fn drop(&mut self) {
            drop_key(NOBODY, self.0);
        }
    }
    let _drop = DropKey(id);
    let (script, want) = key_attack(id);
    write_script(&host.ws, "keys.py", &script);
    for (as_nobody, what) in [
        (None, "a pod"),
        (Some(podhost.as_path()), "an unprivileged podhost"),
    ] {
        let mut keyrings = Vec::new();
        for session in ["first", "second"] {
            let (outcome, stderr, code) = podhost_tool(
                "bash",
                &tool_args(&host, true),
                &json!({"command": "python3 keys.py && id -u && cat /proc/keys"}),
                &[],
                as_nobody,
            );
            assert_eq!(code, 0, "{what}, {session}: {stderr}");
            let out = completed(&outcome);
            let stdout = out["stdout"].as_str().unwrap();
            assert!(!stdout.contains(SECRET), "{stdout}");
            let head = format!("{want}{NOBODY}\n");
            assert!(stdout.starts_with(&head), "{what}, {session}: {out}");
            let mine = session_keyrings(&stdout[head.len()..]);
            assert_eq!(mine.len(), 1, "{what}, {session}: {out}");
            keyrings.push(mine);
        }
        assert_ne!(
            keyrings[0], keyrings[1],
            "{what}: each session its own keyring"
        );
    }
    assert_eq!(read_key(NOBODY, id), SECRET, "the key was there to be read");
}

/// Ordinary tools keep working under the filter: Python's multiprocessing and threads, a
/// subprocess (glibc's spawn tries `clone3` and falls back to `clone`), `git init`, background
/// jobs, `ps`, and tracing one's own child (`ptrace`).
#[tokio::test]
async fn ordinary_tools_keep_working_under_the_filter() {
    let command = "python3 -c '
import multiprocessing, subprocess, threading
with multiprocessing.Pool(2) as p:
    print(sum(p.map(abs, range(-3, 4))))
t = threading.Thread(target=print, args=(\"thread\",)); t.start(); t.join()
print(subprocess.run([\"echo\", \"spawned\"], capture_output=True, text=True).stdout.strip())
'; git init -q repo && git -C repo status --short && echo git; \
        (sleep 0.1; echo background) & wait; ps -o comm= -p $$; \
        strace -f -qq -e trace=none -o /dev/null true && echo traced";
    let want = json!({
        "exitCode": 0,
        "stdout": "12\nthread\nspawned\ngit\nbackground\nbash\ntraced\n",
        "stderr": ""
    });
    let host = Host::new();
    let isolated = host.isolated(|_| {});
    assert_eq!(
        bash(&host, &isolated, command).await,
        want,
        "a BYOH session"
    );
    assert_still_works(&isolated).await;
    // A workspace of its own: the session gave the first one to its uid, which git would mind.
    let host = Host::new();
    let (outcome, stderr, code) = podhost_tool(
        "bash",
        &host.tool_args(),
        &json!({ "command": command }),
        &[],
        None,
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(completed(&outcome), &want, "local podhost tool");
}

/// The level, as `/healthz` and the pod's `/health` show it, names the filter, and the keyring
/// the way each kind of front gives it.
#[test]
fn the_level_reports_the_filter_and_the_keyring() {
    let host = Host::new();
    let shown = |level: podhost::exec::confine::Level| {
        let v: Value = serde_json::to_value(level).unwrap();
        (v["syscall_filter"].clone(), v["session_keyring"].clone())
    };
    assert_eq!(
        shown(host.confinement(&Settings::default()).level()),
        (json!("docker-default"), json!("per command"))
    );
    let isolated = host.isolated(|_| {});
    let keyring = if has_namespaces() {
        "per session"
    } else {
        "per command"
    };
    assert_eq!(
        shown(isolated.executor().confinement().level()),
        (json!("docker-default"), json!(keyring))
    );
}
