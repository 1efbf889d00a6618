//! grep tool vs `rg`, glob tool vs `fd`, on one corpus, interleaved, several rounds; reports
//! medians and ratios.
//!
//! The corpus is built in a temp dir (or in `$PODHOST_BENCH_CORPUS`, kept for the next run):
//! a copy of the crate sources in `~/.cargo/registry/src`, a 200 MB generated text file, an
//! `app/` with an ignored `node_modules/` of 20,000 small files that would match every pattern,
//! and a `.git/` (which also makes fd, which has no `--no-require-git`, honour `.gitignore`).
//!
//! Fairness: the baselines get the flags that give the same files (hidden files searched, `.git`
//! skipped, ignore files honoured, no global excludes), write to a pipe, and are timed from spawn
//! to exit; our tools are timed around `Toolbox::run`. The first round is a warm-up that also
//! checks both sides found the same things: grep lines as `(path, line)` sets, grep files as
//! path sets, glob against fd's list sorted by mtime and cut at 500 (what our glob promises).
//! Differences are printed, not hidden.
//!
//! Each run is timed twice: wall clock, and CPU time (user + system, from `getrusage`: the
//! bench process itself for our in-process tools, its reaped children for the baselines). On a
//! shared machine wall clock mostly measures waiting for a core; CPU time does not.
//!
//! `cargo bench --bench tools search` (or `grep` / `glob` for one half). `PODHOST_BENCH_ROUNDS`
//! sets the measured rounds (default 7). A smoke run (`PODHOST_BENCH_SMOKE=1`) builds a small
//! corpus of the same shape instead (generated crates, a 1 MB text file, 20 ignored packages;
//! past 500 files where a case needs it), runs one round, and fails when the two sides differ.

use std::collections::BTreeSet;
use std::fs;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use nix::sys::resource::{UsageWho, getrusage};
use podhost::exec::{BaseEnv, CommandEnv, ExecConfig, Executor, ResourceLimits};
use podhost::floor::workspace::Workspace;
use podhost::tools::{CallContext, ToolName, ToolOutcome, Toolbox, glob, grep};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::smoke;

/// Size of the generated text file.
const BIG_FILE_BYTES: usize = 200 << 20;
/// Packages in the ignored `node_modules/`, 20 files each.
const NODE_PACKAGES: usize = 1000;
/// Bumped when the corpus layout changes, so a kept corpus is rebuilt.
const CORPUS_VERSION: &str = "search-corpus-v1";

pub fn main() {
    let filter = std::env::args().nth(1).filter(|a| !a.starts_with('-'));
    let only = |kind: &str| match filter.as_deref() {
        Some("grep") => kind == "grep",
        Some("glob") => kind == "glob",
        _ => true,
    };
    let (Some(rg), Some(fd)) = (find_bin(&["rg"]), find_bin(&["fd", "fdfind"])) else {
        smoke::missing(
            "the search bench (grep vs rg, glob vs fd)",
            "it needs rg and fd (fdfind) on PATH",
            "apt-get install -y ripgrep fd-find",
        );
        return;
    };
    let rounds: usize = std::env::var("PODHOST_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(smoke::pick(7, 1));

    let (_guard, root) = corpus_dir();
    if smoke::on() {
        build_small_corpus(&root);
    } else {
        build_corpus(&root);
    }
    println!("corpus: {} ({})", root.display(), describe(&root));
    println!(
        "rg: {}; fd: {}; {} CPUs; {} measured rounds after a warm-up",
        version(&rg),
        version(&fd),
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        rounds
    );

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let toolbox = toolbox(&root);

    let cases: Vec<Case> = cases(&rg, &fd)
        .into_iter()
        .filter(|c| only(c.kind))
        .collect();
    let mut ours: Vec<Vec<Timing>> = vec![Vec::new(); cases.len()];
    let mut theirs: Vec<Vec<Timing>> = vec![Vec::new(); cases.len()];
    let mut notes: Vec<String> = vec![String::new(); cases.len()];

    for round in 0..=rounds {
        for (i, case) in cases.iter().enumerate() {
            // Alternate who goes first, so neither always gets the warmer cache.
            let (a, b) = if round % 2 == 0 {
                let a = run_ours(&rt, &toolbox, case);
                let b = run_baseline(&root, case);
                (a, b)
            } else {
                let b = run_baseline(&root, case);
                let a = run_ours(&rt, &toolbox, case);
                (a, b)
            };
            if round == 0 {
                notes[i] = check(&root, case, &a.1, &b.1);
                // On the full corpus a difference is printed, not hidden (a case that crosses
                // max_results is not comparable); the smoke corpus is made for both to agree.
                if smoke::on() {
                    smoke::check(
                        notes[i].starts_with("agree"),
                        format_args!("{}: {}", case.name, notes[i]),
                    );
                }
            } else {
                ours[i].push(a.0);
                theirs[i].push(b.0);
            }
        }
    }

    // Every round, before the medians sort them: each pair ran back to back.
    println!();
    println!("every round, ours/baseline (wall ratio, CPU ratio):");
    for (i, case) in cases.iter().enumerate() {
        let rounds: Vec<String> = ours[i]
            .iter()
            .zip(&theirs[i])
            .map(|(a, b)| {
                let r = |x: Duration, y: Duration| x.as_secs_f64() / y.as_secs_f64().max(1e-9);
                format!("{:.2}/{:.2}", r(a.wall, b.wall), r(a.cpu, b.cpu))
            })
            .collect();
        println!("  {:<42} {}", case.name, rounds.join(" "));
    }
    println!();
    println!(
        "{:<42} {:>8} {:>8} {:>6} | {:>8} {:>8} {:>6}  check",
        "case (medians, ms)", "wall us", "wall bs", "ratio", "cpu us", "cpu bs", "ratio"
    );
    // Worst wall and CPU ratios per kind.
    let mut worst = [("grep", 0.0f64, 0.0f64), ("glob", 0.0f64, 0.0f64)];
    for (i, case) in cases.iter().enumerate() {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let (ow, tw) = (
            median(&mut ours[i], |t| t.wall),
            median(&mut theirs[i], |t| t.wall),
        );
        let (oc, tc) = (
            median(&mut ours[i], |t| t.cpu),
            median(&mut theirs[i], |t| t.cpu),
        );
        let (wall, cpu) = (ms(ow) / ms(tw), ms(oc) / ms(tc));
        for w in worst.iter_mut().filter(|w| w.0 == case.kind) {
            w.1 = w.1.max(wall);
            w.2 = w.2.max(cpu);
        }
        println!(
            "{:<42} {:>8.1} {:>8.1} {:>5.2}x | {:>8.1} {:>8.1} {:>5.2}x  {}",
            case.name,
            ms(ow),
            ms(tw),
            wall,
            ms(oc),
            ms(tc),
            cpu,
            notes[i]
        );
    }
    println!();
    println!("load average at the end: {}", load_average());
    // A smoke run's small corpus and one round measure nothing the targets are about.
    for (kind, wall, cpu) in worst.into_iter().filter(|_| !smoke::on()) {
        if cases.iter().any(|c| c.kind == kind) {
            let (target, base) = if kind == "grep" {
                (1.0, "rg")
            } else {
                (1.0, "fd")
            };
            let verdict = |r: f64| if r <= target { "met" } else { "MISSED" };
            println!(
                "{kind} vs {base}, target ≤ {target}x: worst wall ratio {wall:.2}x ({}), worst CPU ratio {cpu:.2}x ({})",
                verdict(wall),
                verdict(cpu)
            );
        }
    }
}

/// One timed run.
#[derive(Clone, Copy, Debug)]
struct Timing {
    wall: Duration,
    /// User + system time.
    cpu: Duration,
}

/// User + system CPU time of this process (`self`) or of its reaped children.
fn cpu_time(who: UsageWho) -> Duration {
    getrusage(who).map_or(Duration::ZERO, |u| {
        let t = |tv: nix::sys::time::TimeVal| {
            Duration::from_secs(tv.tv_sec() as u64) + Duration::from_micros(tv.tv_usec() as u64)
        };
        t(u.user_time()) + t(u.system_time())
    })
}

fn load_average() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".to_owned())
}

/// One comparison: our tool's input and the baseline's command line.
struct Case {
    name: String,
    kind: &'static str,
    tool: ToolName,
    input: Value,
    baseline: Vec<String>,
    /// What the outputs list, for the check.
    what: What,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum What {
    /// `path:line:text` lines.
    Lines,
    /// One path per line.
    Files,
    /// `path:N`, ours the first `max_results` by path and then the total.
    Count,
    /// Paths, ours newest first and capped.
    Glob,
}

fn cases(rg: &Path, fd: &Path) -> Vec<Case> {
    let rg_flags = [
        "--no-heading",
        "--with-filename",
        "--color=never",
        "--no-messages",
        "--hidden",
        "--no-require-git",
        "--no-ignore-global",
        "--no-ignore-parent",
        "--glob=!.git",
    ];
    let grep_case = |label: &str, pattern: &str, ignore_case: bool, files: bool| {
        let mut baseline = vec![rg.display().to_string()];
        baseline.extend(rg_flags.iter().map(|s| s.to_string()));
        baseline.push(if files { "-l" } else { "-n" }.to_owned());
        if ignore_case {
            baseline.push("-i".to_owned());
        }
        baseline.extend(["-e".to_owned(), pattern.to_owned(), ".".to_owned()]);
        let mode = if files {
            "files_with_matches"
        } else {
            "content"
        };
        Case {
            name: format!("grep {mode} {label}"),
            kind: "grep",
            tool: ToolName::Grep,
            input: json!({
                "pattern": pattern, "ignore_case": ignore_case, "output_mode": mode,
                "max_results": grep::MAX_RESULTS_LIMIT,
            }),
            baseline,
            what: if files { What::Files } else { What::Lines },
        }
    };
    let glob_case = |label: &str, pattern: &str| {
        let mut baseline = vec![fd.display().to_string()];
        baseline.extend(
            [
                "--hidden",
                "--no-global-ignore-file",
                "--type=f",
                "--exclude=.git",
                "--color=never",
                "--glob",
            ]
            .map(String::from),
        );
        if pattern.contains('/') {
            // fd matches a full path against the absolute path; our pattern is relative to the
            // search root, and each starts with `**/`, so both pick the same files.
            baseline.push("--full-path".to_owned());
        }
        baseline.push(pattern.to_owned());
        Case {
            name: format!("glob {label} {pattern}"),
            kind: "glob",
            tool: ToolName::Glob,
            input: json!({"pattern": pattern}),
            baseline,
            what: What::Glob,
        }
    };
    let count_case = |label: &str, pattern: &str| {
        let mut baseline = vec![rg.display().to_string()];
        baseline.extend(rg_flags.iter().map(|s| s.to_string()));
        baseline.extend(["--count", "-e", pattern, "."].map(String::from));
        Case {
            name: format!("grep count {label}"),
            kind: "grep",
            tool: ToolName::Grep,
            input: json!({
                "pattern": pattern, "output_mode": "count",
                "max_results": grep::MAX_RESULTS_LIMIT,
            }),
            baseline,
            what: What::Count,
        }
    };
    let mut v = Vec::new();
    v.push(count_case("literal, >1000 files", "use "));
    for files in [false, true] {
        v.push(grep_case("literal", "fn from_str", false, files));
        v.push(grep_case(
            "no-literal regex",
            "[A-Z]{4}[0-9]{4}",
            false,
            files,
        ));
        v.push(grep_case("ignore-case", "thread_local", true, files));
    }
    v.push(grep_case("literal, 500 files", "PhantomData", false, true));
    v.push(glob_case("basename", "*.toml"));
    v.push(glob_case("basename", "*.json"));
    v.push(glob_case("basename >500", "*.rs"));
    v.push(glob_case("path", "**/src/*/mod.rs"));
    v.push(glob_case("path >500", "**/tests/*.rs"));
    v
}

fn run_ours(rt: &tokio::runtime::Runtime, tb: &Toolbox, case: &Case) -> (Timing, String) {
    let ctx = CallContext::new(CancellationToken::new());
    let cpu = cpu_time(UsageWho::RUSAGE_SELF);
    let start = Instant::now();
    let outcome = rt
        .block_on(tb.call(case.tool, &case.input, &ctx))
        .expect("harness fault");
    let took = Timing {
        wall: start.elapsed(),
        cpu: cpu_time(UsageWho::RUSAGE_SELF).saturating_sub(cpu),
    };
    match outcome {
        ToolOutcome::Completed { output } => (took, output.as_str().unwrap_or("").to_owned()),
        other => panic!("{}: {other:?}", case.name),
    }
}

fn run_baseline(root: &Path, case: &Case) -> (Timing, String) {
    let cpu = cpu_time(UsageWho::RUSAGE_CHILDREN);
    let start = Instant::now();
    let mut child = Command::new(&case.baseline[0])
        .args(&case.baseline[1..])
        .current_dir(root)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn baseline");
    let mut out = Vec::new();
    child
        .stdout
        .take()
        .expect("stdout")
        .read_to_end(&mut out)
        .expect("read baseline output");
    child.wait().expect("wait baseline");
    let took = Timing {
        wall: start.elapsed(),
        cpu: cpu_time(UsageWho::RUSAGE_CHILDREN).saturating_sub(cpu),
    };
    (took, String::from_utf8_lossy(&out).into_owned())
}

/// Compares what both sides found; returns a short verdict.
fn check(root: &Path, case: &Case, ours: &str, theirs: &str) -> String {
    let strip = |s: &str| s.strip_prefix("./").unwrap_or(s).to_owned();
    match case.what {
        What::Lines | What::Files => {
            if ours.ends_with(grep::MORE_HINT) {
                return "ours TRUNCATED at max_results: not comparable".to_owned();
            }
            let key = |l: &str| -> String {
                if case.what == What::Files {
                    return strip(l);
                }
                // `path:line:` — the text may differ (ours clips at 2000 chars, lossy UTF-8).
                let mut parts = l.splitn(3, ':');
                let path = parts.next().unwrap_or("");
                let line = parts.next().unwrap_or("");
                format!("{}:{line}", strip(path))
            };
            let a: BTreeSet<String> = ours
                .lines()
                .filter(|l| *l != grep::NO_MATCHES)
                .map(key)
                .collect();
            let b: BTreeSet<String> = theirs.lines().map(key).collect();
            agree(&a, &b, "results")
        }
        What::Count => {
            let mut theirs: Vec<(String, u64)> = theirs
                .lines()
                .filter_map(|l| {
                    let (path, n) = l.rsplit_once(':')?;
                    Some((strip(path), n.parse().ok()?))
                })
                .collect();
            // Ours are in path order (component by component), which is not byte order.
            theirs.sort_by(|a, b| Path::new(&a.0).cmp(Path::new(&b.0)));
            let (files, lines) = (theirs.len(), theirs.iter().map(|(_, n)| n).sum::<u64>());
            let listed = files.min(grep::MAX_RESULTS_LIMIT as usize);
            let ok_total = if files == 0 {
                ours == grep::NO_MATCHES
            } else {
                ours.lines().last().is_some_and(|l| {
                    l.contains(&format!("{lines} matching "))
                        && l.contains(&format!(" in {files} file"))
                })
            };
            let got: Vec<String> = ours.lines().take(listed).map(str::to_owned).collect();
            let want: Vec<String> = theirs[..listed]
                .iter()
                .map(|(p, n)| format!("{p}:{n}"))
                .collect();
            if got == want && ok_total {
                format!("agree: {lines} lines in {files} files, the first {listed} listed alike")
            } else {
                let a: BTreeSet<String> = got.into_iter().collect();
                let b: BTreeSet<String> = want.into_iter().collect();
                format!(
                    "DIFFER (total said: {ok_total}) — {}",
                    agree(&a, &b, "counts")
                )
            }
        }
        What::Glob => {
            let mut all: Vec<(SystemTime, String)> = theirs
                .lines()
                .map(|l| {
                    let p = strip(l);
                    let t = fs::symlink_metadata(root.join(&p))
                        .and_then(|m| m.modified())
                        .unwrap_or(SystemTime::UNIX_EPOCH);
                    (t, p)
                })
                .collect();
            let total = all.len();
            all.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
            all.truncate(glob::MAX_FILES);
            let want: Vec<String> = all.into_iter().map(|(_, p)| p).collect();
            let got: Vec<String> = ours
                .lines()
                .filter(|l| *l != glob::NO_FILES && !l.starts_with("… "))
                .map(|l| l.strip_prefix("/workspace/").unwrap_or(l).to_owned())
                .collect();
            let hint = ours.lines().last().is_some_and(|l| l.starts_with("… "));
            let said = total <= glob::MAX_FILES || ours.ends_with(&glob::more_hint(total));
            if got == want && hint == (total > glob::MAX_FILES) && said {
                if total > glob::MAX_FILES {
                    format!(
                        "agree: fd lists {total}; ours the newest {} + how many in all",
                        glob::MAX_FILES
                    )
                } else {
                    format!("agree: {total} files, same order as fd sorted by mtime")
                }
            } else {
                let a: BTreeSet<String> = got.into_iter().collect();
                let b: BTreeSet<String> = want.into_iter().collect();
                format!("DIFFER (order or hint) — {}", agree(&a, &b, "files"))
            }
        }
    }
}

fn agree(a: &BTreeSet<String>, b: &BTreeSet<String>, what: &str) -> String {
    if a == b {
        return format!("agree: {} {what}", a.len());
    }
    let only_ours: Vec<&String> = a.difference(b).take(3).collect();
    let only_theirs: Vec<&String> = b.difference(a).take(3).collect();
    format!(
        "DIFFER: ours {} vs baseline {} {what}; only ours e.g. {only_ours:?}; only baseline e.g. {only_theirs:?}",
        a.len(),
        b.len()
    )
}

fn median(v: &mut [Timing], key: impl Fn(&Timing) -> Duration) -> Duration {
    v.sort_by_key(&key);
    v.get(v.len() / 2).map_or(Duration::ZERO, key)
}

fn toolbox(root: &Path) -> Toolbox {
    let ws = Workspace::new(root, Some(Path::new("/workspace"))).expect("workspace");
    let executor = Executor::new(ExecConfig {
        // grep and glob start no process; the supervisor is never used.
        supervisor: PathBuf::from("/bin/false"),
        shell: podhost::exec::find_shell(None),
        env: CommandEnv::new(BaseEnv::default(), None),
        limits: ResourceLimits::default(),
    });
    Toolbox::new(ws, executor)
}

fn find_bin(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    names.iter().find_map(|n| {
        std::env::split_paths(&path)
            .map(|d| d.join(n))
            .find(|p| p.is_file())
    })
}

fn version(bin: &Path) -> String {
    Command::new(bin)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}

/// The corpus directory, and the temp dir to drop at the end (none for a kept corpus; a smoke
/// run's is never kept).
fn corpus_dir() -> (Option<tempfile::TempDir>, PathBuf) {
    match std::env::var_os("PODHOST_BENCH_CORPUS").filter(|_| !smoke::on()) {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            fs::create_dir_all(&dir).expect("create corpus dir");
            let dir = dir.canonicalize().expect("corpus dir");
            (None, dir)
        }
        None => {
            let t = tempfile::tempdir().expect("tempdir");
            let dir = t.path().canonicalize().expect("tempdir path");
            (Some(t), dir)
        }
    }
}

fn build_corpus(root: &Path) {
    let marker = root.join(".corpus-version");
    if fs::read_to_string(&marker).is_ok_and(|v| v == CORPUS_VERSION) {
        return;
    }
    let started = Instant::now();
    for entry in fs::read_dir(root).expect("read corpus dir").flatten() {
        let p = entry.path();
        if p.is_dir() {
            fs::remove_dir_all(&p).expect("clear corpus");
        } else {
            fs::remove_file(&p).expect("clear corpus");
        }
    }
    // A repository marker, with objects that would match every pattern if `.git` were searched.
    let git = root.join(".git");
    fs::create_dir_all(git.join("objects/ab")).expect("mkdir .git");
    fs::write(git.join("HEAD"), "ref: refs/heads/main\n").expect("write HEAD");
    fs::write(
        git.join("objects/ab/cdef"),
        "fn from_str ABCD1234 thread_local PhantomData\n",
    )
    .expect("write object");

    let registry = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .map(|h| h.join("registry/src"))
        .expect("a cargo home");
    let crates = root.join("crates");
    for index in fs::read_dir(&registry)
        .expect("read ~/.cargo/registry/src")
        .flatten()
    {
        copy_tree(&index.path(), &crates);
    }

    write_text_file(&root.join("big.txt"), BIG_FILE_BYTES);
    write_packages(&root.join("app"), NODE_PACKAGES);
    fs::write(marker, CORPUS_VERSION).expect("write marker");
    println!("built the corpus in {:.1?}", started.elapsed());
}

/// A smoke run's corpus, of the full one's shape at a small scale: `crates/` generated (each
/// pattern planted; past 500 `*.rs` and `tests/*.rs` files, so the glob's cap is crossed), a
/// 1 MB text file, 20 ignored packages, a `.git/`.
fn build_small_corpus(root: &Path) {
    let git = root.join(".git");
    fs::create_dir_all(git.join("objects/ab")).expect("mkdir .git");
    fs::write(git.join("HEAD"), "ref: refs/heads/main\n").expect("write HEAD");
    fs::write(
        git.join("objects/ab/cdef"),
        "fn from_str ABCD1234 thread_local PhantomData\n",
    )
    .expect("write object");
    for c in 0..260 {
        let krate = root.join(format!("crates/c{c:03}"));
        fs::create_dir_all(krate.join("src/m")).expect("mkdir crate");
        fs::create_dir_all(krate.join("tests")).expect("mkdir crate");
        fs::write(
            krate.join("Cargo.toml"),
            format!("[package]\nname = \"c{c}\"\n"),
        )
        .expect("write crate");
        if c % 10 == 0 {
            fs::write(krate.join("data.json"), "{}\n").expect("write crate");
        }
        let lib = format!(
            "use std::marker::PhantomData;\npub struct S{c}<T>(PhantomData<T>);\n\
             impl std::str::FromStr for S{c}<u8> {{ fn from_str(_: &str) -> Self {{ Self(PhantomData) }} }}\n"
        );
        fs::write(krate.join("src/lib.rs"), lib).expect("write crate");
        let module = if c % 3 == 0 {
            format!("thread_local! {{ static K{c}: u8 = 0; }} // XKCD{c:04}\n")
        } else {
            "pub fn f() {}\n".to_owned()
        };
        fs::write(krate.join("src/m/mod.rs"), module).expect("write crate");
        for t in 0..2 {
            fs::write(krate.join(format!("tests/t{t}.rs")), "#[test]\nfn t() {}\n")
                .expect("write crate");
        }
    }
    write_text_file(&root.join("big.txt"), 1 << 20);
    write_packages(&root.join("app"), 20);
}

/// Copies regular files and directories (not symlinks) from `from` into `to`.
fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).expect("mkdir");
    for entry in fs::read_dir(from).expect("read_dir").flatten() {
        let Ok(ft) = entry.file_type() else { continue };
        let dest = to.join(entry.file_name());
        if ft.is_dir() {
            copy_tree(&entry.path(), &dest);
        } else if ft.is_file() {
            fs::copy(entry.path(), dest).expect("copy");
        }
    }
}

/// `bytes` of lowercase words (200 MB: with 50 planted lines for each grep pattern) and one
/// `PhantomData` at the very end (so `files_with_matches` must read the whole file).
fn write_text_file(path: &Path, bytes: usize) {
    const WORDS: [&str; 32] = [
        "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
        "juliet", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra",
        "tango", "uniform", "victor", "whiskey", "xray", "yankee", "zulu", "search", "walk",
        "buffer", "line", "match", "regex",
    ];
    let mut out = BufWriter::with_capacity(1 << 20, fs::File::create(path).expect("big file"));
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let (mut written, mut line_no) = (0usize, 0usize);
    let mut line = String::with_capacity(160);
    while written < bytes {
        line.clear();
        match line_no % 60_000 {
            101 => line.push_str("impl FromStr for Thing { fn from_str(s: &str) -> Self }"),
            202 => line.push_str("serial number QWER7788 in the log"),
            303 => line.push_str("static KEY: Thread_Local<u8> = THREAD_LOCAL_INIT;"),
            _ => {
                for i in 0..(8 + next() % 8) {
                    if i > 0 {
                        line.push(' ');
                    }
                    line.push_str(WORDS[(next() % 32) as usize]);
                }
            }
        }
        line.push('\n');
        out.write_all(line.as_bytes()).expect("write big file");
        written += line.len();
        line_no += 1;
    }
    out.write_all(b"struct Marker<T>(PhantomData<T>);\n")
        .expect("write big file");
    out.flush().expect("flush big file");
}

/// `app/` with a few sources and an ignored `node_modules/` of `packages` whose every file
/// would match.
fn write_packages(app: &Path, packages: usize) {
    fs::create_dir_all(app.join("src")).expect("mkdir app");
    fs::write(app.join(".gitignore"), "node_modules/\n").expect("write .gitignore");
    fs::write(app.join("package.json"), "{\"name\": \"app\"}\n").expect("write package.json");
    for i in 0..50 {
        fs::write(
            app.join(format!("src/m{i}.js")),
            format!("export function m{i}() {{ return {i}; }}\n"),
        )
        .expect("write app source");
    }
    let body = "// fn from_str ABCD1234 thread_local PhantomData\nmodule.exports = {};\n";
    for p in 0..packages {
        let pkg = app.join(format!("node_modules/pkg{p:04}"));
        fs::create_dir_all(pkg.join("lib")).expect("mkdir package");
        fs::write(
            pkg.join("package.json"),
            format!("{{\"name\": \"pkg{p}\"}}\n"),
        )
        .expect("write package");
        fs::write(pkg.join("index.js"), body).expect("write package");
        for f in 0..18 {
            fs::write(pkg.join(format!("lib/f{f}.js")), body).expect("write package");
        }
    }
}

fn describe(root: &Path) -> String {
    let (mut files, mut bytes) = (0u64, 0u64);
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).into_iter().flatten().flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(e.path()),
                Ok(t) if t.is_file() => {
                    files += 1;
                    bytes += e.metadata().map_or(0, |m| m.len());
                }
                _ => {}
            }
        }
    }
    format!("{files} files, {} MB", bytes >> 20)
}
