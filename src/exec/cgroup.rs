//! Limits that bind root too: a cgroup per session (a BYOH session, a pod's workspace) with a
//! process count, a memory limit and a CPU share, on cgroup v2 (a delegated subtree) or on the
//! v1 hierarchies (`pids`, `memory`, `cpu`).
//!
//! Owns: finding podhost's own group in each hierarchy, making podhost's groups beneath it
//! ([`Cgroups::set_up`], [`Cgroups::group`]), writing the limits, reading the OOM-kill counter,
//! and removing the groups again.
//!
//! Where the groups go: always *under podhost's own group* (read from `/proc/self/cgroup`),
//! never at a hierarchy's root, so whatever limits podhost's own supervisor set (a container
//! runtime, a test harness) keep applying: `<own>/podhost-<pid>/s-<n>`. On v2, controllers can
//! only be enabled for a group's children while the group holds no process, so podhost first
//! moves the processes of its own group into a leaf `<own>/podhost-<pid>-self`.
//!
//! Invariants:
//! * RLIMIT_NPROC does not bind uid 0; `pids.max` binds everyone, root included.
//! * A group is removed once its processes are gone; the kernel refuses that (`EBUSY`) for a
//!   moment after the last one exits, so removal retries off the command's path, and groups a
//!   previous podhost left are removed at the next start.
//!
//! Non-goals: I/O limits; killing through the cgroup (the supervisor and the session holder kill
//! what they started).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

/// The limits of one group; `None` leaves the kernel's default (none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupLimits {
    /// Most processes (and threads) at once.
    pub pids: Option<u64>,
    /// Most memory, in bytes (swap is not allowed on top where the kernel accounts it).
    pub memory_bytes: Option<u64>,
    /// CPU share relative to other groups, 1..=10000 (100 is the default share).
    pub cpu_weight: Option<u64>,
}

impl CgroupLimits {
    /// Whether a limit of `controller` is set.
    fn sets(&self, controller: &str) -> bool {
        match controller {
            "pids" => self.pids.is_some(),
            "memory" => self.memory_bytes.is_some(),
            "cpu" => self.cpu_weight.is_some(),
            _ => false,
        }
    }
}

/// The cgroup hierarchy podhost uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Version {
    V1,
    V2,
}

impl Version {
    pub fn as_str(self) -> &'static str {
        match self {
            Version::V1 => "v1",
            Version::V2 => "v2",
        }
    }
}

/// The controllers podhost limits with.
const CONTROLLERS: [&str; 3] = ["pids", "memory", "cpu"];

/// podhost's parent group in one hierarchy, and the controllers it carries.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Base {
    controllers: Vec<&'static str>,
    dir: PathBuf,
}

/// Where podhost makes its groups, and the limits each one gets.
#[derive(Debug)]
pub struct Cgroups {
    version: Version,
    bases: Vec<Base>,
    limits: CgroupLimits,
}

/// Numbers podhost's groups, process-wide (several policies share the parent groups).
static NEXT: AtomicU64 = AtomicU64::new(0);

impl Cgroups {
    /// Finds the hierarchies, makes podhost's parent groups, and removes those a previous
    /// podhost left. `Err` says why no group can be made (then limits fall back to rlimits).
    pub fn set_up(limits: CgroupLimits) -> Result<Cgroups, String> {
        let mountinfo = fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| format!("/proc/self/mountinfo: {e}"))?;
        let own = fs::read_to_string("/proc/self/cgroup")
            .map_err(|e| format!("/proc/self/cgroup: {e}"))?;
        let (version, found) = match find_v2(&mountinfo, &own) {
            Some(v2) => (Version::V2, vec![v2]),
            None => (Version::V1, find_v1(&mountinfo, &own)),
        };
        if found.is_empty() {
            return Err("no cgroup hierarchy with the pids, memory or cpu controller".to_owned());
        }
        let me = std::process::id();
        let mut bases = Vec::new();
        for base in found {
            remove_stale(&base.dir);
            if version == Version::V2 {
                delegate(&base)?;
            }
            let dir = base.dir.join(format!("podhost-{me}"));
            match fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    return Err(format!(
                        "cgroup {}: podhost cannot make groups in {} ({e})",
                        version.as_str(),
                        base.dir.display()
                    ));
                }
            }
            if version == Version::V2 {
                enable_controllers(&dir, &base.controllers)?;
            }
            if base.controllers.contains(&"pids") {
                cap_sessions_pids(&dir);
            }
            bases.push(Base {
                controllers: base.controllers,
                dir,
            });
        }
        Ok(Cgroups {
            version,
            bases,
            limits,
        })
    }

    pub fn version(&self) -> Version {
        self.version
    }

    /// The controllers podhost limits with here.
    pub fn controllers(&self) -> Vec<&'static str> {
        let mut all: Vec<&'static str> = self
            .bases
            .iter()
            .flat_map(|b| b.controllers.iter().copied())
            .collect();
        all.sort_unstable();
        all.dedup();
        all
    }

    pub fn limits(&self) -> CgroupLimits {
        self.limits
    }

    /// A new group with the limits, in every hierarchy.
    pub fn group(&self) -> io::Result<Group> {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let mut dirs = Vec::new();
        let mut group = Group {
            version: self.version,
            dirs: Vec::new(),
            memory_bytes: self.limits.memory_bytes,
        };
        for base in &self.bases {
            // A v1 hierarchy with no limit to set is left alone (joining the cpu hierarchy, say,
            // fails for a real-time task).
            if self.version == Version::V1 && !base.controllers.iter().any(|c| self.limits.sets(c))
            {
                continue;
            }
            let dir = base.dir.join(format!("s-{n}"));
            fs::create_dir(&dir).map_err(|e| with_path(e, &dir))?;
            dirs.push((base.controllers.clone(), dir));
            group.dirs = dirs.clone();
        }
        for (controllers, dir) in &dirs {
            write_limits(self.version, controllers, dir, &self.limits)?;
        }
        Ok(group)
    }
}

/// Caps the processes of every session together (podhost's group, `dir`, which holds them all)
/// at three quarters of the host's pid space: each session's own `pids.max` binds it alone, and
/// enough sessions at their limits would otherwise leave the host no pid to fork with. A host
/// whose group refuses the cap keeps going without it, said once.
fn cap_sessions_pids(dir: &Path) {
    let pid_max: u64 = fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(32_768);
    if let Err(e) = write(&dir.join("pids.max"), &(pid_max / 4 * 3).to_string()) {
        tracing::warn!(error = %e, "could not cap the sessions' processes together");
    }
}

/// One of podhost's groups: its directory in each hierarchy. Removed when dropped (once its
/// processes are gone).
#[derive(Debug)]
pub struct Group {
    version: Version,
    dirs: Vec<(Vec<&'static str>, PathBuf)>,
    memory_bytes: Option<u64>,
}

impl Group {
    /// The `cgroup.procs` file of each hierarchy: writing `0` there moves the writer in.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs
            .iter()
            .map(|(_, d)| d.join("cgroup.procs"))
            .collect()
    }

    /// How many times the kernel killed a process of this group for its memory limit.
    pub fn oom_kills(&self) -> u64 {
        let Some((_, dir)) = self.dirs.iter().find(|(c, _)| c.contains(&"memory")) else {
            return 0;
        };
        let file = match self.version {
            Version::V1 => "memory.oom_control",
            Version::V2 => "memory.events",
        };
        fs::read_to_string(dir.join(file))
            .ok()
            .and_then(|text| {
                text.lines()
                    .find_map(|l| l.strip_prefix("oom_kill "))
                    .and_then(|v| v.trim().parse().ok())
            })
            .unwrap_or(0)
    }

    /// The memory limit, in bytes.
    pub fn memory_limit(&self) -> Option<u64> {
        self.memory_bytes
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let dirs: Vec<PathBuf> = self.dirs.drain(..).map(|(_, d)| d).collect();
        if dirs.is_empty() {
            return;
        }
        // The kernel releases an emptied group a moment after its last process exits.
        let removing = std::thread::Builder::new()
            .name("podhost-cgroup-rm".to_owned())
            .spawn(move || {
                for _ in 0..100 {
                    if dirs.iter().all(|d| match fs::remove_dir(d) {
                        Ok(()) => true,
                        Err(e) => e.kind() == io::ErrorKind::NotFound,
                    }) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            });
        // Without a thread, the next podhost start removes it.
        drop(removing);
    }
}

fn with_path(e: io::Error, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

fn write(path: &Path, value: &str) -> io::Result<()> {
    fs::write(path, value).map_err(|e| with_path(e, path))
}

fn write_limits(
    version: Version,
    controllers: &[&'static str],
    dir: &Path,
    limits: &CgroupLimits,
) -> io::Result<()> {
    let has = |c: &str| controllers.contains(&c);
    if let (true, Some(n)) = (has("pids"), limits.pids) {
        write(&dir.join("pids.max"), &n.to_string())?;
    }
    if let (true, Some(bytes)) = (has("memory"), limits.memory_bytes) {
        match version {
            Version::V1 => {
                write(&dir.join("memory.limit_in_bytes"), &bytes.to_string())?;
                // Swap counted too, where the kernel accounts it (often it does not).
                let _ = write(&dir.join("memory.memsw.limit_in_bytes"), &bytes.to_string());
            }
            Version::V2 => {
                write(&dir.join("memory.max"), &bytes.to_string())?;
                let _ = write(&dir.join("memory.swap.max"), "0");
            }
        }
    }
    if let (true, Some(weight)) = (has("cpu"), limits.cpu_weight) {
        let weight = weight.clamp(1, 10_000);
        match version {
            // v1 shares: 1024 is the default, as weight 100 is.
            Version::V1 => write(
                &dir.join("cpu.shares"),
                &(weight * 1024 / 100).max(2).to_string(),
            )?,
            Version::V2 => write(&dir.join("cpu.weight"), &weight.to_string())?,
        }
    }
    Ok(())
}

/// Mount points of the mountinfo lines whose file system type is `fstype`, with their super
/// options.
fn mounts<'a>(mountinfo: &'a str, fstype: &str) -> Vec<(&'a str, &'a str)> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (pre, post) = line.split_once(" - ")?;
            let mut post = post.split_whitespace();
            (post.next()? == fstype).then_some(())?;
            let options = post.nth(1).unwrap_or("");
            Some((pre.split_whitespace().nth(4)?, options))
        })
        .collect()
}

/// podhost's own v2 group, when a cgroup2 mount offers `pids` and `memory`.
fn find_v2(mountinfo: &str, own: &str) -> Option<Base> {
    let rel = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    for (point, _) in mounts(mountinfo, "cgroup2") {
        let Ok(available) = fs::read_to_string(Path::new(point).join("cgroup.controllers")) else {
            continue;
        };
        let available: Vec<&str> = available.split_whitespace().collect();
        if !(available.contains(&"pids") && available.contains(&"memory")) {
            continue;
        }
        let dir = Path::new(point).join(rel.trim().trim_start_matches('/'));
        let own_available = fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
        let controllers: Vec<&'static str> = CONTROLLERS
            .into_iter()
            .filter(|c| own_available.split_whitespace().any(|a| a == *c))
            .collect();
        if controllers.is_empty() {
            continue;
        }
        return Some(Base { controllers, dir });
    }
    None
}

/// podhost's own v1 group in each hierarchy that carries one of [`CONTROLLERS`].
fn find_v1(mountinfo: &str, own: &str) -> Vec<Base> {
    let mut bases: Vec<Base> = Vec::new();
    for (point, options) in mounts(mountinfo, "cgroup") {
        let controllers: Vec<&'static str> = CONTROLLERS
            .into_iter()
            .filter(|c| options.split(',').any(|o| o == *c))
            .collect();
        let Some(first) = controllers.first() else {
            continue;
        };
        // `N:ctl1,ctl2:/path` — the line of the hierarchy that carries these controllers.
        let rel = own.lines().find_map(|l| {
            let mut it = l.splitn(3, ':');
            let _id = it.next()?;
            let ctls = it.next()?;
            let path = it.next()?;
            ctls.split(',').any(|c| c == *first).then_some(path)
        });
        let Some(rel) = rel else {
            continue;
        };
        let dir = Path::new(point).join(rel.trim().trim_start_matches('/'));
        if !bases.iter().any(|b| b.dir == dir) {
            bases.push(Base { controllers, dir });
        }
    }
    bases
}

/// Removes the groups of podhost processes that no longer run (`podhost-<pid>` whose pid is
/// gone), with whatever empty groups they hold.
fn remove_stale(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("podhost-"))
            .map(|rest| rest.trim_end_matches("-self"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        if let Ok(children) = fs::read_dir(entry.path()) {
            for child in children.flatten() {
                if child.file_type().is_ok_and(|t| t.is_dir()) {
                    let _ = fs::remove_dir(child.path());
                }
            }
        }
        let _ = fs::remove_dir(entry.path());
    }
}

/// v2: moves every process of podhost's own group into a leaf, so that controllers can be
/// enabled for the group's children (the "no internal processes" rule), and enables them.
fn delegate(base: &Base) -> Result<(), String> {
    let leaf = base
        .dir
        .join(format!("podhost-{}-self", std::process::id()));
    let fail = |what: &str, e: io::Error| {
        format!(
            "cgroup v2: podhost cannot {what} in {} ({e}); give it a delegated subtree",
            base.dir.display()
        )
    };
    let procs = fs::read_to_string(base.dir.join("cgroup.procs"))
        .map_err(|e| fail("read the processes of its group", e))?;
    if !procs.trim().is_empty() {
        match fs::create_dir(&leaf) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(fail("make a group", e)),
        }
        for pid in procs.lines().filter(|l| !l.trim().is_empty()) {
            // A process that exited meanwhile is gone anyway.
            match fs::write(leaf.join("cgroup.procs"), pid.trim()) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(e) => return Err(fail("move its processes to a leaf group", e)),
            }
        }
    }
    enable_controllers(&base.dir, &base.controllers)
}

/// v2: lets `dir`'s children use `controllers`.
fn enable_controllers(dir: &Path, controllers: &[&'static str]) -> Result<(), String> {
    let line = controllers
        .iter()
        .map(|c| format!("+{c}"))
        .collect::<Vec<_>>()
        .join(" ");
    fs::write(dir.join("cgroup.subtree_control"), line).map_err(|e| {
        format!(
            "cgroup v2: podhost cannot enable {} for the groups in {} ({e})",
            controllers.join(", "),
            dir.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    const MOUNTINFO: &str = "\
25 1 0:23 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
26 25 0:24 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
30 25 0:28 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
31 25 0:29 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
32 25 0:30 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
33 25 0:31 / /sys/fs/cgroup/freezer rw - cgroup cgroup rw,freezer
";
    const OWN: &str = "\
8:pids:/
4:memory:/process_api/abc
1:cpu,cpuacct:/
0::/
";

    #[test]
    fn v1_groups_sit_under_podhosts_own_group_of_each_hierarchy() {
        assert_eq!(
            find_v1(MOUNTINFO, OWN),
            vec![
                Base {
                    controllers: vec!["pids"],
                    dir: PathBuf::from("/sys/fs/cgroup/pids")
                },
                Base {
                    controllers: vec!["memory"],
                    dir: PathBuf::from("/sys/fs/cgroup/memory/process_api/abc")
                },
                Base {
                    controllers: vec!["cpu"],
                    dir: PathBuf::from("/sys/fs/cgroup/cpu,cpuacct")
                },
            ]
        );
    }
}
