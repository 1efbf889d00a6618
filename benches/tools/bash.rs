//! The bash tool (`Toolbox::run(Bash, {"command": "true"})`) vs a bare `bash -c true` spawned
//! with `std::process`, interleaved call by call so that both see the same machine load.
//!
//! Also measured, to show where the tool's overhead goes: starting the supervisor binary alone
//! (given no request it exits at once), which is the cost of a supervisor per command — both
//! `podhost-exec`, the one podhost uses, and `podhost-full __exec`, its fallback (the whole
//! program, which runs the commands of `serve`, `pod`, `mcp` and `run`);
//! and CPU time (user + system, of this process and its waited-for descendants) per call, which
//! unlike wall time does not grow when other work competes for the CPUs.
//!
//! Confinement's cost, in the same interleaved loop: the bash tool with confinement off, with the
//! default Landlock policy, and with hidden paths (a data directory under `/tmp`, so `/` and
//! `/tmp` are split into one rule per entry); and a `read` call (a fresh thread restricting itself
//! to the workspace) with and without confinement.
//!
//! Isolation's cost (a pod or BYOH host), in another interleaved loop: the bash tool of an
//! isolated session — its commands in the session's namespaces, forked by the session holder —
//! against today's Landlock-only call (the default policy, and with a data directory hidden
//! under `/tmp`, which splits `/tmp` into a rule per entry) and a bare `bash -c true`, as a
//! ratio; also with the
//! namespaces turned off (the Landlock-only level of an isolated host: every capability dropped,
//! the session's cgroup joined), and the one-off cost of starting a session's holder. The
//! holder's processes are not this process's children, so the session's CPU column counts
//! podhost's side only; compare wall times.
//!
//! The system-call filter's cost, which every command pays (the tool cannot run without it, so
//! its parts are measured apart, in another interleaved loop): building it (the supervisor does,
//! per command), installing it (the command's process does, once; a session's command installs
//! only the rest its holder's filter leaves, measured too), and a bare `bash -c true`
//! started from a thread under the filter (so bash runs under it, as a command does) against one
//! started from a thread without it; their sum against the bash tool call measured in the same
//! loop is the filter's share of a command. `cargo bench --bench tools filter` runs this part
//! alone.
//!
//! The supervisor is the `podhost-exec` binary cargo builds for this bench
//! (`CARGO_BIN_EXE_podhost-exec`, release profile under `cargo bench`), so no separate build
//! step is needed:
//! `cargo bench --bench tools bash`.
//!
//! On a machine shared with other CPU-bound work, wall times measure the run queue more than the
//! tool: each call hands off between three processes (podhost, supervisor, shell), and each
//! hand-off can wait for a time slice. Run the bench binary under `chrt -f 10` there to see the
//! tool's own latency; the CPU figures are meaningful either way.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use podhost::exec::{BaseEnv, CommandEnv, Confinement, ExecConfig, Executor, ResourceLimits};
use podhost::floor::workspace::Workspace;
use podhost::tools::{CallContext, ToolName, Toolbox};
use serde_json::json;

use crate::smoke;

/// Rounds, calls of each kind per round, and warm-up calls: a measurement's, or a smoke run's.
fn scale() -> (usize, usize, usize) {
    smoke::pick((5, 200, 20), (1, 3, 1))
}

pub fn main() {
    let (rounds, iterations, warm_up) = scale();
    let supervisor = PathBuf::from(env!("CARGO_BIN_EXE_podhost-exec"));
    let fallback = PathBuf::from(env!("CARGO_BIN_EXE_podhost-full"));
    let shell = podhost::exec::find_shell(None);
    let dir = tempfile::tempdir().unwrap();
    let ws = Workspace::new(dir.path(), None).unwrap();
    let env = CommandEnv::new(
        BaseEnv {
            home: ws.root().to_path_buf(),
            ..BaseEnv::default()
        },
        None,
    );
    std::fs::write(dir.path().join("small.txt"), "one\ntwo\nthree\n").unwrap();
    let exec = Executor::new(ExecConfig {
        supervisor: supervisor.clone(),
        shell: shell.clone(),
        env,
        limits: ResourceLimits::default(),
    });
    let toolbox = Toolbox::new(ws.clone(), exec.clone());
    let off = Toolbox::new(
        ws.clone(),
        exec.clone().with_confinement(Confinement::off()),
    );
    let data = tempfile::tempdir().unwrap();
    let hiding = Toolbox::new(
        ws,
        exec.clone()
            .with_confinement(Confinement::default().hide(data.path())),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let input = json!({"command": "true"});
    let ctx = CallContext::default();
    let tool = || {
        measure(|| {
            let out = rt
                .block_on(toolbox.call(ToolName::Bash, &input, &ctx))
                .unwrap();
            ran(&out);
        })
    };
    let bash_on = |tb: &Toolbox| {
        measure(|| {
            let out = rt.block_on(tb.call(ToolName::Bash, &input, &ctx)).unwrap();
            ran(&out);
        })
    };
    let read_input = json!({"path": "small.txt"});
    let read_on = |tb: &Toolbox| {
        measure(|| {
            let out = rt
                .block_on(tb.call(ToolName::Read, &read_input, &ctx))
                .unwrap();
            assert!(out.is_completed(), "{out:?}");
        })
    };
    let bare = || timed(Command::new(&shell).args(["-c", "true"]), true);
    let supervisor_alone = || timed(Command::new(&supervisor).arg("__exec"), false);
    let fallback_alone = || timed(Command::new(&fallback).arg("__exec"), false);

    println!(
        "bash tool vs bare `{} -c true` ({rounds} rounds × {iterations}, interleaved)",
        shell.display()
    );
    println!("supervisor: {}", supervisor.display());
    for _ in 0..warm_up {
        tool();
        bare();
        supervisor_alone();
        fallback_alone();
    }
    let (mut all_tool, mut all_bare, mut all_sup) = (Vec::new(), Vec::new(), Vec::new());
    let mut all_fallback = Vec::new();
    for round in 1..=rounds {
        let (mut t, mut b, mut s) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..iterations {
            t.push(tool());
            b.push(bare());
            s.push(supervisor_alone());
            all_fallback.push(fallback_alone());
        }
        report(&format!("round {round}"), &t, &b, &s);
        all_tool.extend(t);
        all_bare.extend(b);
        all_sup.extend(s);
    }
    report("all", &all_tool, &all_bare, &all_sup);
    let ((s, sc), (f, fc)) = (medians(&all_sup), medians(&all_fallback));
    println!(
        "supervisor start alone: podhost-exec wall {s:.3} ms, cpu {sc:.3} ms; \
         `podhost-full __exec` (the fallback) wall {f:.3} ms, cpu {fc:.3} ms"
    );

    println!(
        "confinement ({} kernel Landlock ABI, {rounds} rounds × {iterations}, interleaved)",
        podhost::exec::confine::kernel_abi()
    );
    let mut series: [Vec<Sample>; 5] = Default::default();
    for _ in 0..warm_up {
        bash_on(&off);
        bash_on(&toolbox);
        bash_on(&hiding);
        read_on(&off);
        read_on(&toolbox);
    }
    for _ in 0..rounds {
        for _ in 0..iterations {
            series[0].push(bash_on(&off));
            series[1].push(bash_on(&toolbox));
            series[2].push(bash_on(&hiding));
            series[3].push(read_on(&off));
            series[4].push(read_on(&toolbox));
        }
    }
    let m: Vec<(f64, f64)> = series.iter().map(|s| medians(s)).collect();
    isolation(&rt, &supervisor, &shell, [&toolbox, &hiding], &bare);
    syscall_filter_cost();
    for (label, (wall, cpu), base) in [
        ("bash, confinement off", m[0], m[0]),
        ("bash, Landlock (default policy)", m[1], m[0]),
        ("bash, Landlock + hidden data dir", m[2], m[0]),
        ("read, confinement off", m[3], m[3]),
        ("read, Landlock (fresh thread)", m[4], m[3]),
    ] {
        println!(
            "{label:>34}: wall {wall:.3} ms ({:+.3} ms, {:.2}×) | cpu {cpu:.3} ms ({:+.3} ms)",
            wall - base.0,
            wall / base.0,
            cpu - base.1
        );
    }
}

/// The isolated session's bash call against today's Landlock-only call (the default policy, and
/// with a hidden data directory under `/tmp`, whose cost grows with the entries of `/tmp`) and a
/// bare bash.
fn isolation(
    rt: &tokio::runtime::Runtime,
    supervisor: &std::path::Path,
    shell: &std::path::Path,
    [landlock, hiding]: [&Toolbox; 2],
    bare: &dyn Fn() -> Sample,
) {
    let (rounds, iterations, warm_up) = scale();
    use podhost::exec::confine::Settings;
    use podhost::exec::{ExecSettings, ResourceLimits};
    use podhost::tools::ToolboxBuilder;
    let root = nix::unistd::geteuid().is_root();
    let settings = |namespaces: bool| ExecSettings {
        shell: Some(shell.to_path_buf()),
        limits: ResourceLimits::default(),
        confine: Settings {
            isolate: true,
            namespaces,
            helper: Some(supervisor.to_path_buf()),
            // Room for every workspace made below (each keeps its uid).
            uid_pool: root.then_some(podhost::exec::confine::UidRange {
                first: 490_000,
                last: 490_099,
            }),
            cgroup: podhost::exec::cgroup::CgroupLimits {
                pids: Some(4096),
                memory_bytes: Some(1 << 30),
                // No cpu group: a real-time task (`chrt`) may not join one.
                cpu_weight: None,
            },
            ..Settings::default()
        },
    };
    let data = tempfile::tempdir().unwrap();
    // Each workspace is handed a uid of the pool of its own, as the store would.
    let build = |namespaces: bool, name: &str, uid: u32| {
        let ws = data.path().join(name);
        let tmp = data.path().join(format!("{name}-tmp"));
        std::fs::create_dir_all(&ws).unwrap();
        std::fs::create_dir_all(&tmp).unwrap();
        ToolboxBuilder::new(&settings(namespaces), supervisor.to_path_buf())
            .build_as(
                Workspace::new(&ws, None).unwrap(),
                Some(&tmp),
                root.then_some(uid),
            )
            .unwrap()
    };
    let session = build(true, "session", 490_000);
    let level = session.executor().confinement().level();
    let no_ns = build(false, "no-ns", 490_001);
    let input = json!({"command": "true"});
    let ctx = CallContext::default();
    let call = |tb: &Toolbox| {
        measure(|| {
            let out = rt.block_on(tb.call(ToolName::Bash, &input, &ctx)).unwrap();
            ran(&out);
        })
    };
    println!(
        "isolation (namespaces: {}, cgroups: {}, command user: {}; {rounds} rounds × {iterations}, interleaved)",
        level.namespaces,
        level.cgroups,
        level.uid_pool.as_deref().unwrap_or("podhost's own")
    );
    for _ in 0..warm_up {
        bare();
        call(landlock);
        call(hiding);
        call(&session);
        call(&no_ns);
    }
    let mut series: [Vec<Sample>; 5] = Default::default();
    for _ in 0..rounds {
        for _ in 0..iterations {
            series[0].push(bare());
            series[1].push(call(landlock));
            series[2].push(call(hiding));
            series[3].push(call(&session));
            series[4].push(call(&no_ns));
        }
    }
    // A session's start: the first call of a fresh toolbox, less a warm call.
    let mut starts = Vec::new();
    for i in 0..smoke::pick(20, 2) {
        let fresh = build(true, &format!("fresh-{i}"), 490_002 + i as u32);
        let first = call(&fresh).wall;
        let warm = call(&fresh).wall;
        starts.push(first.saturating_sub(warm));
    }
    starts.sort();
    let m: Vec<f64> = series.iter().map(|s| medians(s).0).collect();
    let (bare_ms, landlock_ms) = (m[0], m[1]);
    for (label, wall) in [
        ("bare bash -c true", m[0]),
        ("bash, Landlock only (today)", m[1]),
        ("bash, Landlock + hidden dir in /tmp", m[2]),
        ("bash, isolated session (namespaces)", m[3]),
        ("bash, isolated, namespaces off", m[4]),
    ] {
        println!(
            "{label:>38}: wall {wall:.3} ms | vs bare {:+.3} ms ({:.2}×) | vs Landlock only \
             {:+.3} ms ({:.2}×)",
            wall - bare_ms,
            wall / bare_ms,
            wall - landlock_ms,
            wall / landlock_ms
        );
    }
    println!(
        "{:>38}: {:.3} ms (median of {})",
        "session start (first call - warm call)",
        starts[starts.len() / 2].as_secs_f64() * 1e3,
        starts.len()
    );
}

/// What the system-call filter costs a command: building and installing it, and `bash -c true`
/// under it against a bare one, interleaved with the bash tool call (see the module doc).
pub fn syscall_filter_cost() {
    let (rounds, iterations, warm_up) = scale();
    use podhost::exec::confine::syscall_filter;
    let supervisor = PathBuf::from(env!("CARGO_BIN_EXE_podhost-exec"));
    let shell = podhost::exec::find_shell(None);
    let dir = tempfile::tempdir().unwrap();
    let ws = Workspace::new(dir.path(), None).unwrap();
    let exec = Executor::new(ExecConfig {
        supervisor,
        shell: shell.clone(),
        env: CommandEnv::new(
            BaseEnv {
                home: ws.root().to_path_buf(),
                ..BaseEnv::default()
            },
            None,
        ),
        limits: ResourceLimits::default(),
    });
    let toolbox = Toolbox::new(ws, exec);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (input, ctx) = (json!({"command": "true"}), CallContext::default());
    let tool = || {
        measure(|| {
            let out = rt
                .block_on(toolbox.call(ToolName::Bash, &input, &ctx))
                .unwrap();
            ran(&out);
        })
    };
    let bare = || timed(Command::new(&shell).args(["-c", "true"]), true);
    // A thread under the filter that starts `bash -c true` on request: bash inherits the filter.
    let (ask, asked) = std::sync::mpsc::channel::<()>();
    let (tell, told) = std::sync::mpsc::channel::<Sample>();
    let filtered = {
        let shell = shell.clone();
        let program = syscall_filter(false).unwrap();
        std::thread::spawn(move || {
            nix::sys::prctl::set_no_new_privs().unwrap();
            seccompiler::apply_filter(&program).unwrap();
            for () in asked {
                let sample = timed(Command::new(&shell).args(["-c", "true"]), true);
                if tell.send(sample).is_err() {
                    break;
                }
            }
        })
    };
    let under_filter = || {
        ask.send(()).unwrap();
        told.recv().unwrap()
    };
    let build = || {
        let start = Instant::now();
        std::hint::black_box(syscall_filter(false).unwrap());
        start.elapsed()
    };
    // Installing it on a fresh thread (the program built beforehand, as the supervisor does).
    let install = || {
        let program = syscall_filter(false).unwrap();
        std::thread::spawn(move || {
            nix::sys::prctl::set_no_new_privs().unwrap();
            let start = Instant::now();
            seccompiler::apply_filter(&program).unwrap();
            start.elapsed()
        })
        .join()
        .unwrap()
    };
    // Installing what a command of a session adds on a thread already under its holder's
    // filter (see `confine::syscalls::confine_holder`).
    let (holder_filter, rest_filter) = podhost::exec::confine::split_filter(false).unwrap();
    let install_rest = || {
        let (holder, rest) = (holder_filter.clone(), rest_filter.clone());
        std::thread::spawn(move || {
            nix::sys::prctl::set_no_new_privs().unwrap();
            seccompiler::apply_filter(&holder).unwrap();
            let start = Instant::now();
            seccompiler::apply_filter(&rest).unwrap();
            start.elapsed()
        })
        .join()
        .unwrap()
    };
    println!(
        "system-call filter ({} instructions, a session command's rest {}; {rounds} rounds × \
         {iterations}, interleaved)",
        syscall_filter(false).unwrap().len(),
        rest_filter.len()
    );
    for _ in 0..warm_up {
        bare();
        under_filter();
        tool();
        build();
        install();
        install_rest();
    }
    let (mut all, mut builds, mut installs, mut rests) =
        (<[Vec<Sample>; 3]>::default(), vec![], vec![], vec![]);
    for round in 1..=rounds {
        let mut series: [Vec<Sample>; 3] = Default::default();
        for _ in 0..iterations {
            series[0].push(bare());
            series[1].push(under_filter());
            series[2].push(tool());
            builds.push(build());
            installs.push(install());
            rests.push(install_rest());
        }
        let [b, f, t] = [0, 1, 2].map(|i| medians(&series[i]));
        println!(
            "{:>8}: bash -c true bare {:.3} ms, under the filter {:.3} ms ({:.3}×, {:+.3} ms); \
             bash tool {:.3} ms | cpu bare {:.3} ms, under the filter {:.3} ms",
            format!("round {round}"),
            b.0,
            f.0,
            f.0 / b.0,
            f.0 - b.0,
            t.0,
            b.1,
            f.1
        );
        for (a, s) in all.iter_mut().zip(series) {
            a.extend(s);
        }
    }
    drop(ask);
    let _ = filtered.join();
    let us = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2].as_secs_f64() * 1e6
    };
    let (build_us, install_us, rest_us) = (us(builds), us(installs), us(rests));
    let [b, f, t] = [0, 1, 2].map(|i| medians(&all[i]));
    let cost = build_us / 1e3 + install_us / 1e3 + (f.0 - b.0);
    println!(
        "{:>8}: bash -c true bare {:.3} ms, under the filter {:.3} ms ({:.3}×, {:+.3} ms); \
         build {build_us:.1} µs, install {install_us:.1} µs, a session command's rest under its \
         holder's {rest_us:.1} µs ({:.2}× the whole) (medians)",
        "all",
        b.0,
        f.0,
        f.0 / b.0,
        f.0 - b.0,
        rest_us / install_us
    );
    println!(
        "the filter's cost per command: {cost:.3} ms (build + install + bash under it) of a \
         {:.3} ms bash tool call: {:.1}%, a ratio of {:.3}× against the same call without it",
        t.0,
        100.0 * cost / t.0,
        t.0 / (t.0 - cost)
    );
}

/// Fails the run unless a bash call ran its command to a zero exit: a call that failed measured
/// nothing.
fn ran(out: &podhost::tools::ToolOutcome) {
    let ok =
        matches!(out, podhost::tools::ToolOutcome::Completed { output } if output["exitCode"] == 0);
    smoke::check(ok, format_args!("the bash tool ran `true`: {out:?}"));
}

/// One call's wall time and CPU time (ours and our waited-for descendants').
#[derive(Clone, Copy)]
pub(crate) struct Sample {
    wall: Duration,
    cpu: Duration,
}

fn cpu_time() -> Duration {
    use nix::sys::resource::{UsageWho, getrusage};
    let tv = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec() as u64) + Duration::from_micros(t.tv_usec() as u64)
    };
    [UsageWho::RUSAGE_SELF, UsageWho::RUSAGE_CHILDREN]
        .into_iter()
        .map(|who| {
            let u = getrusage(who).unwrap();
            tv(u.user_time()) + tv(u.system_time())
        })
        .sum()
}

pub(crate) fn measure(f: impl FnOnce()) -> Sample {
    let (cpu, start) = (cpu_time(), Instant::now());
    f();
    Sample {
        wall: start.elapsed(),
        cpu: cpu_time().saturating_sub(cpu),
    }
}

/// Runs `cmd` to its end with stdin from /dev/null (and stdout/stderr captured when `capture`).
fn timed(cmd: &mut Command, capture: bool) -> Sample {
    cmd.stdin(Stdio::null());
    if !capture {
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
    }
    measure(|| {
        let out = cmd.output().unwrap();
        assert!(!capture || out.status.success(), "{out:?}");
    })
}

/// Medians of wall and CPU time, in ms.
pub(crate) fn medians(samples: &[Sample]) -> (f64, f64) {
    let ms = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2].as_secs_f64() * 1e3
    };
    (
        ms(samples.iter().map(|s| s.wall).collect()),
        ms(samples.iter().map(|s| s.cpu).collect()),
    )
}

fn report(label: &str, tool: &[Sample], bare: &[Sample], sup: &[Sample]) {
    let ((t, tc), (b, bc), (s, sc)) = (medians(tool), medians(bare), medians(sup));
    println!(
        "{label:>8}: wall: tool {t:.3} ms, bare {b:.3} ms, overhead {:.3} ms, ratio {:.2}× \
         (supervisor start alone {s:.3} ms) | cpu: tool {tc:.3} ms, bare {bc:.3} ms, \
         overhead {:.3} ms (supervisor start alone {sc:.3} ms)",
        t - b,
        t / b,
        tc - bc,
    );
}
