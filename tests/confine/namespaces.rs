//! Commands of an isolated host (a pod, a BYOH host) run in their session's namespaces: the
//! system read-only, podhost's state and other sessions behind empty mounts, a minimal `/dev`,
//! host sockets masked, no capabilities, a cgroup that binds root. Each attack fails and the
//! next call works. Where this machine allows no namespaces, each test checks the Landlock-only
//! level instead and says so.

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use pretty_assertions::assert_eq;
use serde_json::json;

use crate::{
    Host, assert_still_works, bash, elsewhere, has_namespaces, marker, processes_with, run,
};
use podhost::tools::ToolName;

/// Every metadata change outside the workspace fails with EROFS, for the session's uid and for a
/// command asked to run as root alike; the files keep their modes, owners and times.
#[tokio::test]
async fn chmod_chown_and_touch_outside_the_workspace_fail_with_erofs() {
    if !has_namespaces() {
        return crate::fallback::check_landlock_level(&Host::new()).await;
    }
    let host = Host::new();
    let outside = elsewhere();
    let sibling = outside.path().join("sibling.txt");
    std::fs::write(&sibling, "a file of the system").unwrap();
    // A file the session's uid owns outside its workspace: DAC alone would let it change it.
    let owned = outside.path().join("owned-by-the-session.txt");
    std::fs::write(&owned, "x").unwrap();
    let before = |p: &std::path::Path| {
        let m = std::fs::metadata(p).unwrap();
        (m.mode(), m.uid(), m.mtime())
    };
    for root_asked in [false, true] {
        let tb = host.isolated(|s| {
            s.root_asked = root_asked;
            if root_asked {
                s.uid_pool = None;
            }
        });
        let uid = bash(&host, &tb, "id -u").await["stdout"].clone();
        let uid: u32 = uid.as_str().unwrap().trim().parse().unwrap();
        std::os::unix::fs::chown(&owned, Some(uid), Some(uid)).unwrap();
        let (sib, own, data) = (before(&sibling), before(&owned), before(&host.data));
        let out = bash(
            &host,
            &tb,
            &format!(
                "for f in {} {} {}; do \
                   chmod 777 $f; chown 0:0 $f; touch -d 2001-01-01 $f; done 2>&1 | sed 's/^.*: //'; \
                 touch here && chmod 600 here && stat -c %a here",
                sibling.display(),
                owned.display(),
                host.data.display()
            ),
        )
        .await;
        // `touch` opens the file for writing first: a file the session does not own and may
        // not write is refused by its mode before the read-only mount is reached.
        let sibling_touch = if root_asked {
            "Read-only file system"
        } else {
            "Permission denied"
        };
        let want = [
            "Read-only file system",
            "Read-only file system",
            sibling_touch,
        ]
        .iter()
        .chain(&["Read-only file system"; 6])
        .map(|l| format!("{l}\n"))
        .collect::<String>();
        assert_eq!(
            out,
            json!({"exitCode": 0, "stdout": want + "600\n", "stderr": ""}),
            "root asked: {root_asked}"
        );
        assert_eq!(
            (before(&sibling), before(&owned), before(&host.data)),
            (sib, own, data)
        );
        assert_still_works(&tb).await;
    }
}

/// A setuid binary gains nothing: the system is `nosuid` and read-only (a setuid copy cannot be
/// made there), the workspace `nosuid`, and commands start with `no_new_privs`.
#[tokio::test]
async fn a_setuid_root_binary_gives_no_root() {
    if !has_namespaces() {
        return crate::fallback::check_landlock_level(&Host::new()).await;
    }
    let host = Host::new();
    let outside = elsewhere();
    std::fs::set_permissions(outside.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let suid = outside.path().join("suid-bash");
    std::fs::copy("/bin/bash", &suid).unwrap();
    std::fs::set_permissions(&suid, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let plain = outside.path().join("plain-bash");
    std::fs::copy("/bin/bash", &plain).unwrap();
    let tb = host.isolated(|_| {});
    let out = bash(
        &host,
        &tb,
        &format!(
            "{0}/suid-bash -p -c 'id -u' | grep -qx 0 && echo ROOT-SHELL; \
             chmod 4755 {0}/plain-bash 2>&1 | sed 's/^.*: //'; \
             cp /bin/bash mine && chmod 4755 mine && ./mine -p -c 'id -u' | grep -qx 0 && echo ROOT; \
             echo done",
            outside.path().display()
        ),
    )
    .await;
    assert_eq!(
        out,
        json!({"exitCode": 0, "stdout": "Read-only file system\ndone\n", "stderr": ""})
    );
    assert_eq!(
        std::fs::metadata(&plain).unwrap().mode() & 0o7777,
        0o755,
        "the system copy stays as it was"
    );
    assert_still_works(&tb).await;
}

/// Commands see a minimal `/dev`: no disk, no loop device, and no capability to make one — for
/// the session's uid and for a command asked to run as root alike.
#[tokio::test]
async fn raw_block_devices_are_out_of_reach() {
    if !has_namespaces() {
        return crate::fallback::check_landlock_level(&Host::new()).await;
    }
    let host = Host::new();
    // Every block device of this machine.
    let mut blocks: Vec<String> = std::fs::read_dir("/dev")
        .unwrap()
        .flatten()
        .filter(|e| {
            use std::os::unix::fs::FileTypeExt;
            e.file_type().is_ok_and(|t| t.is_block_device())
        })
        .map(|e| e.path().display().to_string())
        .collect();
    blocks.sort();
    assert!(!blocks.is_empty(), "no block device to attack here");
    if !blocks.iter().any(|b| b.starts_with("/dev/loop")) {
        eprintln!("no loop device on this machine: the other block devices are attacked");
    }
    for root_asked in [false, true] {
        let tb = host.isolated(|s| {
            s.root_asked = root_asked;
            if root_asked {
                s.uid_pool = None;
            }
        });
        let out = bash(
            &host,
            &tb,
            &format!(
                "ls /dev | tr '\\n' ' '; echo; for d in {}; do head -c1 $d >/dev/null 2>&1 && echo read $d; done; \
                 mknod disk b 7 0 2>&1 | sed 's/^.*: //'; echo done",
                blocks.join(" ")
            ),
        )
        .await;
        assert_eq!(
            out,
            json!({
                "exitCode": 0,
                "stdout": "fd full null ptmx pts random shm stderr stdin stdout tty urandom zero \n\
                           Operation not permitted\ndone\n",
                "stderr": ""
            }),
            "root asked: {root_asked}"
        );
        assert_still_works(&tb).await;
    }
}

/// Host UNIX sockets: a root-only socket in /run is not there in the view, and an abstract
/// socket of the host is out of reach: in the session's own network namespace (whose abstract
/// names are its own) there is no such socket; without one, Landlock's scoping refuses it.
#[tokio::test]
async fn host_sockets_are_out_of_reach() {
    if !has_namespaces() {
        return crate::fallback::check_landlock_level(&Host::new()).await;
    }
    let host = Host::new();
    let name = marker("podhost-test");
    let path = std::path::PathBuf::from(format!("/run/{name}.sock"));
    let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    struct Remove(std::path::PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _remove = Remove(path.clone());
    let abstract_name = format!("\0{name}");
    let abstract_listener = {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(&abstract_name[1..]).unwrap();
        std::os::unix::net::UnixListener::bind_addr(&addr).unwrap()
    };
    for root_asked in [false, true] {
        let tb = host.isolated(|s| {
            s.root_asked = root_asked;
            if root_asked {
                s.uid_pool = None;
            }
        });
        let out = bash(
            &host,
            &tb,
            &format!(
                "ls -A /run /var/run; python3 -c '
import socket, sys
for addr in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(addr.replace(\"@\", \"\\0\"))
        print(\"connected\")
    except OSError as e:
        print(type(e).__name__, e.strerror)
' {} @{name}",
                path.display()
            ),
        )
        .await;
        assert_eq!(
            out,
            json!({
                "exitCode": 0,
                "stdout": format!(
                    "/run:\n\n/var/run:\nFileNotFoundError No such file or directory\n{}\n",
                    if podhost::exec::probe::probe_host(crate::support::supervisor_bin()).network
                    {
                        "ConnectionRefusedError Connection refused"
                    } else {
                        "PermissionError Operation not permitted"
                    }
                ),
                "stderr": ""
            }),
            "root asked: {root_asked}"
        );
        assert_still_works(&tb).await;
    }
    drop(abstract_listener);
}

/// Kills every process whose command line holds the marker when dropped: a bomb that got past
/// its call (the test failed) must not spin on beside the other tests.
struct KillMarked(String);

impl Drop for KillMarked {
    fn drop(&mut self) {
        // Killed pids can be replaced by forks in flight: a few rounds.
        for _ in 0..50 {
            let left = processes_with(&self.0);
            if left.is_empty() {
                return;
            }
            for pid in left {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

/// The `pids.max` of this process's group of sessions (`podhost-<pid>` in the pids hierarchy).
fn sessions_pids_max() -> Option<String> {
    let name = format!("podhost-{}", std::process::id());
    let mut dirs = vec![(std::path::PathBuf::from("/sys/fs/cgroup"), 0)];
    while let Some((dir, depth)) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).ok()?.flatten() {
            let path = entry.path();
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if entry.file_name() == name.as_str()
                && let Ok(max) = std::fs::read_to_string(path.join("pids.max"))
            {
                return Some(max.trim().to_owned());
            }
            if depth < 4 {
                dirs.push((path, depth + 1));
            }
        }
    }
    None
}

/// A fork bomb run as root (asked for) stops at the session's cgroup process limit, which binds
/// root where RLIMIT_NPROC does not; nothing of it outlives the call. The bomb is kept from
/// harming the machine or the tests beside it: its group holds at most 64 processes with a tenth
/// of a normal CPU share, the call ends after 3 s, and the test kills anything left of it.
#[tokio::test]
async fn a_fork_bomb_as_root_stops_at_the_cgroup_limit() {
    let host = Host::new();
    let tb = host.isolated(|s| {
        s.root_asked = true;
        s.uid_pool = None;
        s.cgroup.pids = Some(64);
        s.cgroup.cpu_weight = Some(10);
    });
    let level = tb.executor().confinement().level();
    if level.cgroups == "none" {
        // Never light a root bomb without a group to hold it: check what binds instead.
        eprintln!(
            "no writable cgroup here: the process limit is RLIMIT_NPROC, which root escapes; \
             checking that the level says so (the non-root bomb is limits.rs's test)"
        );
        assert_eq!(level.limits, "rlimit");
        return;
    }
    assert_eq!(level.limits, "cgroup");
    // The sessions together may hold three quarters of the host's pids, whatever each may.
    let pid_max: u64 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(
        sessions_pids_max().as_deref(),
        Some((pid_max / 4 * 3).to_string().as_str())
    );
    let m = marker("bomb");
    let _kill = KillMarked(m.clone());
    let out = run(
        &tb,
        ToolName::Bash,
        json!({
            "command": format!(
                "id -u; bash -c 'b() {{ b | b & }}; b; while :; do :; done' {m}"
            ),
            "timeout": 3
        }),
    )
    .await;
    let podhost::tools::ToolOutcome::Completed { output } = out else {
        panic!("{out:?}");
    };
    assert_eq!(
        (&output["exitCode"], &output["timedOut"], &output["stdout"]),
        (&json!(124), &json!(true), &json!("0\n"))
    );
    let err = output["stderr"].as_str().unwrap();
    assert!(
        err.contains("fork: retry: Resource temporarily unavailable"),
        "{err}"
    );
    assert_eq!(processes_with(&m), Vec::<i32>::new());
    assert_still_works(&tb).await;
}

/// One session sees nothing of another's processes: its own PID namespace and `/proc`.
#[tokio::test]
async fn ps_in_one_session_shows_nothing_of_another() {
    if !has_namespaces() {
        return crate::fallback::check_landlock_level(&Host::new()).await;
    }
    let host = Host::new();
    let a = host.isolated(|_| {});
    let b = host.isolated_session(&host.other_ws, &host.data.join("tmp/b"), |_| {});
    let m = marker("other-session");
    let cancel = tokio_util::sync::CancellationToken::new();
    let running = {
        let (b, cancel, m) = (b.clone(), cancel.clone(), m.clone());
        tokio::spawn(async move {
            let ctx = podhost::tools::CallContext::new(cancel);
            b.call(
                ToolName::Bash,
                &json!({"command": format!("exec -a {m} sleep 60")}),
                &ctx,
            )
            .await
        })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while processes_with(&m).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "session b's command never started"
        );
        tokio::task::yield_now().await;
    }
    let out = bash(
        &host,
        &a,
        // `[o]ther` matches the marker, not this command line that holds the pattern.
        &format!(
            "ps -eo args | grep -c '[o]{0}'; cat /proc/[0-9]*/cmdline | tr '\\0' ' ' | grep -c '[o]{0}'; \
             ps -eo pid=,ppid= | awk -v s=$PPID '!($2 == 1 && $1 > s)' | wc -l",
            &m[1..]
        ),
    )
    .await;
    // The session's holder and the command's supervisor (both `podhost-exec`), its shell, ps, awk
    // and wc: nothing else but the supervisor the holder forked ahead for the next command (its
    // child, started after this command's supervisor), not counted.
    assert_eq!(
        out,
        json!({"exitCode": 0, "stdout": "0\n0\n6\n", "stderr": ""})
    );
    cancel.cancel();
    let ended = tokio::time::timeout(std::time::Duration::from_secs(10), running)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(ended.is_completed(), "{ended:?}");
    assert_eq!(processes_with(&m), Vec::<i32>::new());
    assert_still_works(&a).await;
}

/// A command's answer comes before its supervisor's exit (see `SessionSlot::settle`), but no
/// command sees an earlier one's supervisor: back to back, each counts its session's processes
/// with the shell's own globbing and `read` (no child of its own) and finds the holder, its
/// supervisor and itself, every time, and at most one supervisor forked ahead for the next
/// command — a child of the holder started after its own supervisor (an earlier one started
/// before it) — which the holder does fork.
#[tokio::test]
async fn back_to_back_commands_never_see_an_earlier_supervisor() {
    if !has_namespaces() {
        return crate::fallback::check_landlock_level(&Host::new()).await;
    }
    let host = Host::new();
    let a = host.isolated(|_| {});
    let count = "n=0; ahead=0; for p in /proc/[0-9]*; do p=${p#/proc/}; \
                 read -r _ _ _ pp _ < /proc/$p/stat; \
                 if [ \"$pp\" = 1 ] && [ \"$p\" -gt \"$PPID\" ]; then ahead=$((ahead+1)); \
                 else n=$((n+1)); fi; done; echo $n $ahead";
    let mut seen_ahead = false;
    for _ in 0..40 {
        let out = bash(&host, &a, count).await;
        let stdout = out["stdout"].as_str().unwrap_or_default();
        assert!(
            stdout == "3 0\n" || stdout == "3 1\n",
            "holder, supervisor, shell and at most one ahead: {out}"
        );
        seen_ahead |= stdout == "3 1\n";
    }
    assert!(seen_ahead, "the holder never forked a supervisor ahead");
}

/// No capabilities at all, and the file tools act as the session's uid: a file `write` made is
/// one `bash` can append to, and the reverse.
#[tokio::test]
async fn commands_hold_no_capabilities_and_the_file_tools_share_their_uid() {
    let host = Host::new();
    let tb = host.isolated(|_| {});
    let out = bash(&host, &tb, "grep -E '^(Cap|NoNewPrivs)' /proc/self/status").await;
    assert_eq!(
        out,
        json!({
            "exitCode": 0,
            "stdout": "CapInh:\t0000000000000000\nCapPrm:\t0000000000000000\n\
                       CapEff:\t0000000000000000\nCapBnd:\t0000000000000000\n\
                       CapAmb:\t0000000000000000\nNoNewPrivs:\t1\n",
            "stderr": ""
        })
    );
    let wrote = run(
        &tb,
        ToolName::Write,
        json!({"path": "w.txt", "content": "from write\n"}),
    )
    .await;
    assert!(wrote.is_completed(), "{wrote:?}");
    let out = bash(
        &host,
        &tb,
        "echo from bash >> w.txt && echo made by bash > b.txt && id -u && stat -c %u w.txt",
    )
    .await;
    let lines: Vec<String> = out["stdout"]
        .as_str()
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(
        lines[0], lines[1],
        "write's file belongs to the command's uid"
    );
    if nix::unistd::geteuid().is_root() {
        assert_ne!(
            lines[0], "0",
            "a root podhost's commands do not run as root"
        );
    }
    let edited = run(
        &tb,
        ToolName::Edit,
        json!({"path": "b.txt", "old_string": "bash", "new_string": "bash, edited"}),
    )
    .await;
    assert!(edited.is_completed(), "{edited:?}");
    assert_eq!(
        std::fs::read_to_string(host.ws.join("w.txt")).unwrap(),
        "from write\nfrom bash\n"
    );
    assert_eq!(
        std::fs::read_to_string(host.ws.join("b.txt")).unwrap(),
        "made by bash, edited\n"
    );
}

/// A file nobody owns, in a directory outside the workspace and outside `/tmp` (which a pod's
/// commands, and so `--isolate` without `--tmp-dir`, may write); the directory lives as long as
/// the returned guard.
fn nobodys_file_elsewhere() -> (tempfile::TempDir, std::path::PathBuf) {
    let outside = elsewhere();
    std::fs::set_permissions(outside.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let owned = outside.path().join("nobodys.txt");
    std::fs::write(&owned, "mine").unwrap();
    std::os::unix::fs::chown(&owned, Some(crate::NOBODY), Some(crate::NOBODY)).unwrap();
    (outside, owned)
}

/// An unprivileged podhost (nobody) makes the same view inside a user namespace: a file the
/// command's own uid owns outside the workspace still cannot be changed, nor can podhost's own
/// data directory (which that uid owns too: DAC alone would allow it), which is an empty mount,
/// and `ps` shows the session alone: the holder, the supervisor, the shell, `ps`, `awk` and `wc`
/// (and the supervisor the holder forked ahead, not counted).
#[test]
fn an_unprivileged_podhost_isolates_in_a_user_namespace() {
    use std::ffi::OsString;
    let _nobody = crate::nobody_lock();
    let host = Host::new();
    let podhost = host.open_to_everyone();
    // podhost's state belongs to podhost's own uid, private, as `podhost serve` keeps it.
    std::os::unix::fs::chown(&host.data, Some(crate::NOBODY), Some(crate::NOBODY)).unwrap();
    std::fs::set_permissions(&host.data, std::fs::Permissions::from_mode(0o700)).unwrap();
    let data_before = {
        let m = std::fs::metadata(&host.data).unwrap();
        (m.mode(), m.uid(), m.mtime())
    };
    let (_outside, owned) = nobodys_file_elsewhere();
    let mut args: Vec<OsString> = vec!["--workspace".into(), host.ws.clone().into()];
    for p in [&host.harness, &host.join, &host.data] {
        args.extend(["--confine-deny".into(), p.clone().into()]);
    }
    args.push("--isolate".into());
    let (outcome, stderr, code) = crate::podhost_tool(
        "bash",
        &args,
        &json!({"command": format!(
            "id -u; for f in {0} {1}; do chmod 777 $f; chown 0:0 $f; touch -d 2001-01-01 $f; \
             done 2>&1 | sed 's/^.*: //'; ls -A {1}; \
             ps -eo pid=,ppid= | awk -v s=$PPID '!($2 == 1 && $1 > s)' | wc -l; \
             grep CapBnd /proc/self/status",
            owned.display(),
            host.data.display()
        )}),
        &[("RUST_LOG", "podhost::exec::confine=debug")],
        Some(&podhost),
    );
    assert_eq!(code, 0, "{stderr}");
    let level = stderr
        .lines()
        .find(|l| l.contains("are confined"))
        .unwrap_or_else(|| panic!("no confinement level in the log: {stderr}"));
    if !level.contains("namespaces userns with a PID namespace") {
        eprintln!("no user namespaces here ({level}): the Landlock-only level is checked instead");
        assert!(level.contains("namespaces none"), "{level}");
        return;
    }
    assert_eq!(
        crate::completed(&outcome),
        &json!({
            "exitCode": 0,
            "stdout": format!(
                "65534\n{}6\nCapBnd:\t0000000000000000\n",
                "Read-only file system\n".repeat(6)
            ),
            // An empty mount beneath, and Landlock still refuses to list it on top.
            "stderr": format!("ls: cannot open directory '{}': Permission denied\n", host.data.display())
        })
    );
    assert_eq!(
        std::fs::metadata(&owned).unwrap().mode() & 0o777,
        0o644,
        "the file kept its mode"
    );
    let data_after = {
        let m = std::fs::metadata(&host.data).unwrap();
        (m.mode(), m.uid(), m.mtime())
    };
    assert_eq!(
        data_after, data_before,
        "the data directory kept its mode, owner and time"
    );
}

/// An unprivileged `podhost tool bash` (nobody, no `--isolate`: local use) runs its command in
/// the read-only system, wherever the kernel lets nobody make a user namespace: a file nobody
/// owns outside the workspace keeps its mode and time, which Landlock alone would not keep.
/// podhost builds the view in its own process, in a user namespace of its own, and forks the
/// command's supervisor from there; the command holds no capability. The kernel's answer comes
/// from the probe helper run as nobody (`podhost-exec __probe namespaces`, a fresh process);
/// where it makes none, the Landlock-only fallback is checked instead, and said so.
#[test]
fn an_unprivileged_podhost_tool_runs_its_command_in_the_read_only_system() {
    use std::os::unix::process::CommandExt;
    let _nobody = crate::nobody_lock();
    let host = Host::new();
    let podhost = host.open_to_everyone();
    let (_outside, owned) = nobodys_file_elsewhere();
    let before = std::fs::metadata(&owned).unwrap();
    let probe = std::process::Command::new(podhost.with_file_name("podhost-exec"))
        .args(["__probe", "namespaces"])
        .uid(crate::NOBODY)
        .gid(crate::NOBODY)
        .output()
        .unwrap();
    let probe: serde_json::Value = serde_json::from_slice(&probe.stdout)
        .unwrap_or_else(|e| panic!("the probe printed no JSON ({e}): {probe:?}"));
    let ours = std::fs::read_link("/proc/self/ns/mnt").unwrap();
    let (outcome, stderr, code) = crate::podhost_tool(
        "bash",
        &host.tool_args(),
        &json!({"command": format!(
            "f={0}; {{ chmod 777 $f; touch -d 2001-01-01 $f; echo x >> $f; }} 2>&1 \
             | sed 's/^.*: //'; [ \"$(readlink /proc/self/ns/mnt)\" != '{1}' ] && echo own view; \
             grep CapEff /proc/self/status; \
             if [ $PPID = 0 ]; then p=1; else p=$(cut -d' ' -f4 /proc/$PPID/stat); fi; \
             cat /proc/$p/comm",
            owned.display(),
            ours.display()
        )}),
        &[],
        Some(&podhost),
    );
    assert_eq!(code, 0, "{stderr}");
    let after = std::fs::metadata(&owned).unwrap();
    if probe["namespaces"] == "none" {
        eprintln!(
            "nobody may make no namespaces here ({}): the Landlock-only fallback is checked",
            probe["refused"]
        );
        // Landlock still refuses the write; nothing refuses the metadata changes.
        assert_eq!(
            crate::completed(&outcome),
            &json!({
                "exitCode": 0,
                "stdout": "Permission denied\nCapEff:\t0000000000000000\npodhost\n",
                "stderr": ""
            })
        );
        return;
    }
    assert_eq!(
        crate::completed(&outcome),
        &json!({
            "exitCode": 0,
            // Built by podhost itself, in a user namespace of its own (no session holder
            // between it and the supervisor, or the PID namespace's init, pid 1), and the
            // command holds no capability in it.
            "stdout": format!(
                "{}own view\nCapEff:\t0000000000000000\npodhost\n",
                "Read-only file system\n".repeat(3)
            ),
            "stderr": ""
        }),
        "the probe found {probe}"
    );
    assert_eq!(
        (after.mode(), after.mtime()),
        (before.mode(), before.mtime()),
        "the file kept its mode and time"
    );
}

/// The same from a working directory nobody may not even search (a root-owned `0700`
/// directory): podhost notes nothing of its own namespaces to go back to there, so it needs no
/// access to where it was started; the command still starts in its workspace, in the view.
#[test]
fn an_unprivileged_podhost_tool_started_where_it_cannot_look_still_runs_its_command() {
    let _nobody = crate::nobody_lock();
    let host = Host::new();
    let podhost = host.open_to_everyone();
    let closed = tempfile::tempdir().unwrap();
    std::fs::set_permissions(closed.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    // Started there as root, then nobody (util-linux's setpriv): nobody could not enter it.
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&podhost)
        .args(["tool", "bash"])
        .args(host.tool_args())
        .arg("--input")
        .arg(json!({"command": "pwd; touch made && echo made"}).to_string())
        .current_dir(closed.path())
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let outcome: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        crate::completed(&outcome),
        &json!({
            "exitCode": 0,
            "stdout": format!("{}\nmade\n", host.ws.display()),
            "stderr": ""
        })
    );
}

/// A command past the session's memory limit is killed by the kernel (root or not), and the
/// outcome says which limit it met.
#[tokio::test]
async fn a_memory_hog_is_killed_at_the_session_limit_and_told_so() {
    let host = Host::new();
    let tb = host.isolated(|s| s.cgroup.memory_bytes = Some(64 << 20));
    if tb.executor().confinement().level().cgroups == "none" {
        eprintln!("no writable cgroup here: memory is limited per process (RLIMIT) only");
        return;
    }
    let out = bash(
        &host,
        &tb,
        "python3 -c 'x = bytearray(512 << 20); x[::4096] = b\"x\" * len(x[::4096])'; echo status $?",
    )
    .await;
    assert_eq!(
        (&out["exitCode"], &out["stdout"]),
        (&json!(0), &json!("status 137\n"))
    );
    let err = out["stderr"].as_str().unwrap();
    assert!(
        err.ends_with("A process was killed: the session reached its memory limit (64 MiB)."),
        "{err}"
    );
    assert_still_works(&tb).await;
}
