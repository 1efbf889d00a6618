//! The whole `podhost tool bash --input '{"command":"true"}'` process (a copy of the release
//! build cargo makes for this bench, as installed: see `support/installed.rs`) against a bare
//! `bash -c true` and against `bwrap --ro-bind / / --dev /dev --proc /proc bash -c true` (left
//! out, and said so, where `bwrap` is not installed), interleaved call by call; then the same
//! with 1,000 idle processes on the host (`sleep`s started for the part's duration). Every
//! round's medians are printed, then the median of the rounds' ratios. The same call through
//! `podhost-full tool` (the whole program, which `podhost` hands every other command to) is
//! measured in the same loop: what the smaller `podhost` binary saves a tool call.
//!
//! What it shows: what one tool call costs a script that runs `podhost tool` per command —
//! podhost's start, its confinement and its supervision of the command — against a shell alone
//! and against a common sandbox. `PODHOST_BENCH_PODHOST=/path/to/podhost` measures another
//! build (an older one, a stripped copy) in the same loop.
//!
//! `cargo bench --bench tools process` runs this part alone.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::bash::{Sample, measure, medians};
use crate::installed::installed;
use crate::smoke;

/// Rounds, calls of each kind per round, warm-up calls, idle processes.
fn scale() -> (usize, usize, usize, usize) {
    smoke::pick((5, 100, 10, 1000), (3, 2, 1, 20))
}

pub fn main() {
    let (rounds, iterations, warm_up, idle) = scale();
    let built = std::env::var_os("PODHOST_BENCH_PODHOST").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_podhost")),
        PathBuf::from,
    );
    let shell = podhost::exec::find_shell(None);
    let dir = tempfile::tempdir().unwrap();
    let install = tempfile::tempdir().unwrap();
    let podhost = installed(&built, install.path());
    let full = Some(podhost.with_file_name("podhost-full")).filter(|p| p.is_file());
    let bwrap = find_on_path("bwrap");
    if bwrap.is_none() {
        smoke::skipped("podhost tool vs bwrap", "bwrap is not installed");
    }
    println!(
        "`podhost tool bash` process ({}) vs `{} -c true`{} ({rounds} rounds × {iterations}, \
         interleaved)",
        podhost.display(),
        shell.display(),
        if bwrap.is_some() {
            " vs `bwrap --ro-bind / / --dev /dev --proc /proc bash -c true`"
        } else {
            " (bwrap not installed: left out)"
        }
    );
    let kinds = Kinds {
        podhost: &podhost,
        full: full.as_deref(),
        shell: &shell,
        bwrap: bwrap.as_deref(),
        workspace: dir.path(),
    };
    for _ in 0..warm_up {
        kinds.once();
    }
    kinds.rounds("quiet host", rounds, iterations);
    let mut sleepers = Sleepers::start(idle);
    for _ in 0..warm_up {
        kinds.once();
    }
    kinds.rounds(&format!("{idle} idle processes"), rounds, iterations);
    sleepers.stop();
}

/// The ways of running `true`, and where.
struct Kinds<'a> {
    podhost: &'a Path,
    /// `podhost-full` beside `podhost`, when there is one.
    full: Option<&'a Path>,
    shell: &'a Path,
    bwrap: Option<&'a Path>,
    workspace: &'a Path,
}

impl Kinds<'_> {
    /// One call of each kind, in order: podhost tool, bare bash, bwrap (when installed),
    /// podhost-full tool (when there is one).
    fn once(&self) -> [Option<Sample>; 4] {
        let tool = self.tool(self.podhost);
        let bare = run(Command::new(self.shell).args(["-c", "true"]));
        let bwrap = self.bwrap.map(|b| {
            run(Command::new(b)
                .args(["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"])
                .arg(self.shell)
                .args(["-c", "true"]))
        });
        let full = self.full.map(|f| self.tool(f));
        [Some(tool), Some(bare), bwrap, full]
    }

    /// `<binary> tool bash` running `true`, checked.
    fn tool(&self, binary: &Path) -> Sample {
        measure(|| {
            let out = Command::new(binary)
                .args([
                    "tool",
                    "bash",
                    "--input",
                    r#"{"command":"true"}"#,
                    "--workspace",
                ])
                .arg(self.workspace)
                .stdin(Stdio::null())
                .stderr(Stdio::inherit())
                .output()
                .unwrap();
            let outcome: serde_json::Value =
                serde_json::from_slice(&out.stdout).unwrap_or_default();
            smoke::check(
                out.status.success() && outcome["output"]["exitCode"] == 0,
                format_args!("{} tool bash ran `true`: {out:?}", binary.display()),
            );
        })
    }

    /// `rounds` rounds of `iterations` interleaved calls, each round's medians printed, then
    /// the median of the rounds.
    fn rounds(&self, label: &str, rounds: usize, iterations: usize) {
        println!("  {label}:");
        let mut ratios = (Vec::new(), Vec::new(), Vec::new());
        for round in 1..=rounds {
            let mut series: [Vec<Sample>; 4] = Default::default();
            for _ in 0..iterations {
                for (s, sample) in series.iter_mut().zip(self.once()) {
                    s.extend(sample);
                }
            }
            let [(t, _), (b, _)] = [medians(&series[0]), medians(&series[1])];
            smoke::check_positive("median wall time", &[t, b]);
            ratios.0.push(t / b);
            let vs_bwrap = if series[2].is_empty() {
                String::new()
            } else {
                let (w, _) = medians(&series[2]);
                ratios.1.push(t / w);
                format!(", bwrap {w:.3} ms → podhost/bwrap {:.2}×", t / w)
            };
            let vs_full = if series[3].is_empty() {
                String::new()
            } else {
                let (f, _) = medians(&series[3]);
                ratios.2.push(t / f);
                format!(
                    ", podhost-full tool {f:.3} ms → podhost/podhost-full {:.2}×",
                    t / f
                )
            };
            println!(
                "    round {round}: podhost tool {t:.3} ms, bash {b:.3} ms → podhost/bash {:.2}×\
                 {vs_bwrap}{vs_full}",
                t / b
            );
        }
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied()
        };
        let bwrap = median(ratios.1).map_or(String::new(), |r| format!(", podhost/bwrap {r:.2}×"));
        let full =
            median(ratios.2).map_or(String::new(), |r| format!(", podhost/podhost-full {r:.2}×"));
        println!(
            "    median of {rounds} rounds: podhost/bash {:.2}×{bwrap}{full}",
            median(ratios.0).unwrap_or(f64::NAN)
        );
    }
}

/// Runs `cmd` to its end, its output captured, and checks it succeeded.
fn run(cmd: &mut Command) -> Sample {
    cmd.stdin(Stdio::null());
    measure(|| {
        let out = cmd.output().unwrap();
        smoke::check(out.status.success(), format_args!("{cmd:?} ran: {out:?}"));
    })
}

/// `name` in a directory of `PATH`, if it is there.
fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Idle processes on the host for a part of the bench.
struct Sleepers(Vec<Child>);

impl Sleepers {
    fn start(n: usize) -> Self {
        let all = (0..n)
            .map(|_| {
                Command::new("sleep")
                    .arg("3600")
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap()
            })
            .collect();
        Sleepers(all)
    }

    fn stop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
        }
        for c in &mut self.0 {
            let _ = c.wait();
        }
        self.0.clear();
    }
}

impl Drop for Sleepers {
    fn drop(&mut self) {
        self.stop();
    }
}
