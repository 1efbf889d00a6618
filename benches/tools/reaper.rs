//! What a child's exit costs podhost's reaper (`exec::reaper::sweep`, run on every SIGCHLD in
//! `serve`, `mcp` and `pod`), with few processes on the host and with 1,000 idle ones more,
//! against the walk of all of `/proc` it made before (`sweep_all`, now only for a supervisor
//! that died without reporting) and against a bare `bash -c true` spawned and waited for, the
//! baseline a command is measured by. Interleaved call by call, medians of each round and of
//! all rounds.
//!
//! `cargo bench --bench tools reaper` runs this part alone.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use podhost::exec::reaper;

use crate::smoke;

/// Rounds, calls of each kind per round, and the idle processes added.
fn scale() -> (usize, usize, usize) {
    smoke::pick((5, 200, 1000), (1, 3, 20))
}

/// `n` idle processes, grandchildren of this one (a shell in a process group of its own, in
/// this session, so the reaper never takes it for an orphan); killed with their group on drop.
struct Idle(std::process::Child);

impl Idle {
    fn start(n: usize) -> Idle {
        let child = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "i=0; while [ $i -lt {n} ]; do sleep 3600 & i=$((i+1)); done; echo up; wait"
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        let mut idle = Idle(child);
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(idle.0.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        smoke::check(
            line == "up\n",
            format_args!("the idle processes started: {line:?}"),
        );
        idle
    }
}

impl Drop for Idle {
    fn drop(&mut self) {
        let group = nix::unistd::Pid::from_raw(-(self.0.id() as i32));
        let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL);
        let _ = self.0.wait();
    }
}

fn time(f: impl FnOnce()) -> Duration {
    let start = Instant::now();
    f();
    start.elapsed()
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn processes() -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.parse::<u32>().is_ok())
        })
        .count()
}

pub fn main() {
    let (rounds, calls, extra) = scale();
    let bare = || {
        time(|| {
            let status = Command::new("bash").args(["-c", "true"]).status().unwrap();
            smoke::check(status.success(), "bash -c true");
        })
    };
    // Nothing here is an adopted orphan: every sweep finds none and kills nothing.
    let sweep = || time(|| smoke::check(reaper::sweep() == 0, "sweep found an orphan"));
    let sweep_all = || time(|| smoke::check(reaper::sweep_all() == 0, "sweep_all found one"));
    println!("the reaper's work per child exit ({rounds} rounds × {calls}, interleaved)");
    let mut table = Vec::new();
    for (label, n) in [("few", 0), ("+idle", extra)] {
        let _idle = (n > 0).then(|| Idle::start(n));
        let host = processes();
        let (mut all_b, mut all_s, mut all_w) = (Vec::new(), Vec::new(), Vec::new());
        for round in 1..=rounds {
            let (mut b, mut s, mut w) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..calls {
                b.push(bare());
                s.push(sweep());
                w.push(sweep_all());
            }
            println!(
                "  {label:>5} ({host} processes) round {round}: bash -c true {:?}, sweep {:?}, \
                 walk of /proc {:?}",
                median(&mut b),
                median(&mut s),
                median(&mut w)
            );
            all_b.extend(b);
            all_s.extend(s);
            all_w.extend(w);
        }
        table.push((
            label,
            host,
            median(&mut all_b),
            median(&mut all_s),
            median(&mut all_w),
        ));
    }
    println!(
        "| host | processes | bash -c true | sweep | ratio | walk of /proc (before) | ratio |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (label, host, b, s, w) in &table {
        let (bs, ss, ws) = (b.as_secs_f64(), s.as_secs_f64(), w.as_secs_f64());
        smoke::check_positive("reaper timings", &[bs, ss, ws]);
        println!(
            "| {label} | {host} | {b:?} | {s:?} | {:.4}× | {w:?} | {:.3}× |",
            ss / bs,
            ws / bs
        );
    }
    if let [(_, _, _, few, _), (_, _, _, idle, _)] = table[..] {
        println!(
            "sweep with the idle processes vs without: {:.2}× (flat is about 1)",
            idle.as_secs_f64() / few.as_secs_f64()
        );
    }
}
