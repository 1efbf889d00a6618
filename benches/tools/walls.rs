//! What a session's network namespace and its disk's file system cost (a pod or BYOH host): a
//! session's start and a steady-state command, for
//!
//! * an isolated session with neither wall, the level before them: the session's namespaces
//!   (mount, IPC, PID) and view (`PODHOST_SESSION_NETWORK=off`, no disk quota, as a pod has);
//! * that session with a network namespace of its own (`exec::net`: the holder brings its
//!   loopback up and listens on the exit, which podhost serves);
//! * with a disk file system (`exec::disk`: an ext4 image of the quota's size, copied from the
//!   empty one, checked with `e2fsck -p`, loop-mounted in the session's namespace);
//! * with both, as a root BYOH host runs sessions by default;
//! * and, for what the disk replaces on a BYOH host, the measured quota
//!   (`PODHOST_SESSION_DISK_FS=off`).
//!
//! A session's start is its toolbox's making (`ToolboxBuilder::build`: the uid, the cgroup) and
//! its first `true` (which starts the holder and builds the view, the walls with it), a fresh
//! workspace each time; a steady-state command is `true` in a session already started. Each
//! round starts [`STARTS`] sessions of each kind and runs [`ITERATIONS`] commands in each,
//! interleaved kind by kind so that all see the same machine load; medians per round and over
//! all rounds, with ratios against the session with neither wall.
//!
//! The disk is the default quota's size (`PODHOST_SESSION_DISK_MB`, 10 GiB). Its empty image
//! is made with mkfs.ext4 once, before the rounds, as a host does for its first session; each
//! start then pays what every new session pays. Each session's walls are checked before it is
//! measured: its network namespace is not podhost's, its workspace is on a device of its own.
//!
//! The disk needs root and e2fsprogs, the network namespace a kernel that gives one: what this
//! host lacks is skipped, and said so. `cargo bench --bench tools walls` runs this part alone; on
//! a machine shared with other work, run the bench binary under `chrt -f 10` (see `bash.rs`).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use podhost::exec::ExecSettings;
use podhost::exec::ResourceLimits;
use podhost::exec::cgroup::CgroupLimits;
use podhost::exec::confine::{Settings, UidRange};
use podhost::floor::workspace::Workspace;
use podhost::tools::{CallContext, ToolName, ToolOutcome, Toolbox, ToolboxBuilder};
use serde_json::{Value, json};

use crate::smoke;

/// Sessions of each kind started per round.
const STARTS: usize = 10;
/// Steady-state commands of each kind per round.
const ITERATIONS: usize = 200;
const ROUNDS: usize = 5;
/// A session's disk: `PODHOST_SESSION_DISK_MB`'s default.
const DISK_MIB: u64 = 10 << 10;

/// The walls a kind of session has.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Walls {
    network: bool,
    /// `Some(true)`: a disk file system; `Some(false)`: the measured quota; `None`: no quota.
    disk: Option<bool>,
}

const KINDS: [(&str, Walls); 5] = [
    (
        "isolated, neither wall",
        Walls {
            network: false,
            disk: None,
        },
    ),
    (
        "+ network namespace",
        Walls {
            network: true,
            disk: None,
        },
    ),
    (
        "+ disk file system",
        Walls {
            network: false,
            disk: Some(true),
        },
    ),
    (
        "+ both",
        Walls {
            network: true,
            disk: Some(true),
        },
    ),
    (
        "disk quota measured (disk FS off)",
        Walls {
            network: false,
            disk: Some(false),
        },
    ),
];

/// One kind of session: its builder and its long-lived session.
struct Kind {
    label: &'static str,
    walls: Walls,
    builder: ToolboxBuilder,
    steady: Toolbox,
    starts: Vec<Duration>,
    commands: Vec<Duration>,
}

pub fn main() {
    let supervisor = PathBuf::from(env!("CARGO_BIN_EXE_podhost-exec"));
    let shell = podhost::exec::find_shell(None);
    let (rounds, starts, iterations) = (
        smoke::pick(ROUNDS, 1),
        smoke::pick(STARTS, 1),
        smoke::pick(ITERATIONS, 3),
    );
    let disk_bytes = smoke::pick(DISK_MIB, 64) << 20;
    let probe = podhost::exec::probe::probe_host(&supervisor);
    if !probe.namespaces.any() {
        smoke::skipped(
            "session walls",
            &format!(
                "no namespaces for sessions here: {}",
                probe.refused.join("; ")
            ),
        );
        return;
    }
    let mut kinds_wanted: Vec<(&str, Walls)> = KINDS.to_vec();
    if !probe.network {
        smoke::skipped(
            "session walls: the network namespace",
            &format!(
                "this host gives sessions none: {}",
                probe.refused.join("; ")
            ),
        );
        kinds_wanted.retain(|(_, w)| !w.network);
    }
    if let Err(why) = &probe.disk {
        smoke::skipped(
            "session walls: the disk file system",
            &format!("this host cannot make one (it needs root and e2fsprogs): {why}"),
        );
        kinds_wanted.retain(|(_, w)| w.disk != Some(true));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let data = tempfile::tempdir().unwrap();
    // The sessions' uids must pass through to their workspaces, as through a BYOH data directory.
    std::fs::set_permissions(data.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let disks = data.path().join("disks");
    let root = nix::unistd::geteuid().is_root();
    let ctx = CallContext::default();
    let call = |tb: &Toolbox, command: &str| -> (Duration, Value) {
        let input = json!({ "command": command });
        let start = Instant::now();
        let out = rt.block_on(tb.call(ToolName::Bash, &input, &ctx)).unwrap();
        let took = start.elapsed();
        let ToolOutcome::Completed { output } = out else {
            panic!("`{command}`: {out:?}");
        };
        smoke::check(
            output["exitCode"] == 0,
            format_args!("`{command}` failed: {output}"),
        );
        (took, output)
    };
    let mut made = 0usize;
    let mut fresh = |builder: &ToolboxBuilder| -> (Toolbox, PathBuf, PathBuf) {
        made += 1;
        let ws = data.path().join(format!("ws-{made}"));
        let tmp = data.path().join(format!("tmp-{made}"));
        std::fs::create_dir(&ws).unwrap();
        std::fs::create_dir(&tmp).unwrap();
        // Each session is handed a uid of its own, as the store hands them out.
        let uid = builder.uid_pool().map(|p| p.first + (made % 100) as u32);
        let tb = builder
            .build_as(Workspace::new(&ws, None).unwrap(), Some(&tmp), uid)
            .unwrap();
        (tb, ws, tmp)
    };
    let host_net = std::fs::read_link("/proc/self/ns/net").unwrap();
    // Each kind's walls are there (and only those): checked once per kind before measuring.
    let verify = |label: &str, walls: Walls, tb: &Toolbox| {
        let (_, out) = call(tb, "readlink /proc/self/ns/net; stat -c %d .");
        let stdout = out["stdout"].as_str().unwrap_or_default().to_owned();
        let mut lines = stdout.lines();
        let net = lines.next().unwrap_or_default();
        let dev: u64 = lines.next().and_then(|d| d.parse().ok()).unwrap_or(0);
        let host_dev = std::fs::metadata(tb.workspace().root()).unwrap().dev();
        smoke::check(
            walls.network == (Path::new(net) != host_net),
            format_args!(
                "{label}: its commands' network namespace is {net}, podhost's {}",
                host_net.display()
            ),
        );
        smoke::check(
            (walls.disk == Some(true)) == (dev != host_dev),
            format_args!(
                "{label}: its workspace is on device {dev}, the host directory's {host_dev}"
            ),
        );
    };
    let mut kinds: Vec<Kind> = kinds_wanted
        .iter()
        .enumerate()
        .map(|(i, &(label, walls))| {
            let first = 491_000 + 100 * i as u32;
            let settings = ExecSettings {
                shell: Some(shell.clone()),
                limits: ResourceLimits::default(),
                confine: Settings {
                    isolate: true,
                    namespaces: true,
                    session_network: walls.network,
                    helper: Some(supervisor.clone()),
                    uid_pool: root.then_some(UidRange {
                        first,
                        last: first + 99,
                    }),
                    cgroup: CgroupLimits {
                        pids: Some(4096),
                        memory_bytes: Some(1 << 30),
                        cpu_weight: None,
                    },
                    disk_quota: walls.disk.map(|_| disk_bytes),
                    session_disk_fs: walls.disk == Some(true),
                    ..Settings::default()
                },
            };
            let builder = ToolboxBuilder::new(&settings, supervisor.clone())
                .confine(|c| c.hide(&disks).session_disks(&disks));
            // The first session of a kind makes what later ones find made: the empty image.
            let (steady, _, _) = fresh(&builder);
            call(&steady, "true");
            verify(label, walls, &steady);
            Kind {
                label,
                walls,
                builder,
                steady,
                starts: Vec::new(),
                commands: Vec::new(),
            }
        })
        .collect();
    let level = kinds[0].steady.executor().confinement().level();
    println!(
        "session walls (namespaces: {}, cgroups: {}, command user: {}; disk {} MiB; {rounds} \
         rounds × {starts} starts and × {iterations} `true` per kind, interleaved)",
        level.namespaces,
        level.cgroups,
        level.uid_pool.as_deref().unwrap_or("podhost's own"),
        disk_bytes >> 20,
    );
    let n = kinds.len();
    for round in 1..=rounds {
        let mut round_starts: Vec<Vec<Duration>> = vec![Vec::new(); n];
        let mut round_commands: Vec<Vec<Duration>> = vec![Vec::new(); n];
        for s in 0..starts {
            // Each start in another order, so no kind always follows the same one.
            for k in (0..n).map(|k| (k + s + round) % n) {
                let kind = &kinds[k];
                let started = Instant::now();
                let (tb, ws, tmp) = fresh(&kind.builder);
                call(&tb, "true");
                round_starts[k].push(started.elapsed());
                if smoke::on() {
                    verify(kind.label, kind.walls, &tb);
                }
                // The session ends with its toolbox (the holder, its mounts and network); its
                // workspace, temporary directory and image go, freeing its uid.
                drop(tb);
                let name = ws.file_name().unwrap().to_string_lossy().into_owned();
                let _ = std::fs::remove_file(podhost::exec::disk::image_path(&disks, &name));
                let _ = std::fs::remove_dir_all(ws);
                let _ = std::fs::remove_dir_all(tmp);
            }
        }
        for _ in 0..iterations {
            for (k, kind) in kinds.iter().enumerate() {
                round_commands[k].push(call(&kind.steady, "true").0);
            }
        }
        let line: Vec<String> = (0..n)
            .map(|k| {
                format!(
                    "{} start {:.2} ms, true {:.3} ms",
                    short(kinds[k].walls),
                    ms(median(&round_starts[k])),
                    ms(median(&round_commands[k]))
                )
            })
            .collect();
        println!("{:>9}: {}", format!("round {round}"), line.join(" | "));
        for (k, kind) in kinds.iter_mut().enumerate() {
            kind.starts.append(&mut round_starts[k]);
            kind.commands.append(&mut round_commands[k]);
        }
    }
    let (base_start, base_command) = (ms(median(&kinds[0].starts)), ms(median(&kinds[0].commands)));
    println!(
        "{:>34}   {:>10} {:>8}   {:>10} {:>8}",
        "medians over all rounds", "start", "ratio", "true", "ratio"
    );
    for kind in &kinds {
        let (start, command) = (ms(median(&kind.starts)), ms(median(&kind.commands)));
        smoke::check_positive(kind.label, &[start, command]);
        smoke::check(
            kind.starts.len() == rounds * starts && kind.commands.len() == rounds * iterations,
            format_args!("{}: every start and command measured", kind.label),
        );
        println!(
            "{:>34}   {start:>7.2} ms {:>7.2}×   {command:>7.3} ms {:>7.2}×",
            kind.label,
            start / base_start,
            command / base_command
        );
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "load average at the end: {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
}

/// A kind's walls in a few letters, for the rounds' lines.
fn short(w: Walls) -> &'static str {
    match (w.network, w.disk) {
        (false, None) => "neither:",
        (true, None) => "+net:",
        (false, Some(true)) => "+disk:",
        (true, Some(true)) => "+both:",
        (_, Some(false)) => "measured:",
    }
}

fn median(v: &[Duration]) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
