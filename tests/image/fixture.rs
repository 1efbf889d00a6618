//! The image under test: built once per test process, offline, from a Debian base bootstrapped
//! on this machine, then run the way a pod runs it.
//!
//! The base is `debootstrap --variant=minbase` made to look like `debian:bookworm-slim` (the same
//! dpkg path excludes), imported as `localhost/debian-base:bookworm`; the build then installs
//! the Containerfile's packages with apt from the same mirror (`--network=host`), exactly the
//! path a user's build takes. Measured on this kind of machine, that is about 20 s faster cold
//! than a bootstrap that includes the packages and a build without network: apt fetches and
//! unpacks in one go, debootstrap package by package. The base is kept in the store under
//! `target/tmp/image-tests/`, keyed by suite and mirror, so a later run on the same machine
//! skips the bootstrap (CI, from a clean clone, always builds cold); the times and sizes of
//! each build are written to `target/tmp/image-tests/measurements.txt`.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio::sync::OnceCell;

use crate::podman::{Podman, find_program, unique_name};

/// The image the tests build and run.
pub const IMAGE: &str = "localhost/podhost:test";
/// The locally bootstrapped base it is built on.
pub const BASE: &str = "localhost/debian-base:bookworm";
/// The `source` and `created` labels the test build gives the image.
pub const SOURCE: &str = "https://example.invalid/podhost.git";
pub const CREATED: &str = "2026-01-02T03:04:05Z";
const SUITE: &str = "bookworm";

/// The paths a pod mounts writable (spec v5 §9); everything else is read-only.
pub const WRITABLE: [&str; 4] = ["/workspace", "/harness", "/tmp", "/skills"];

const MINUTE: Duration = Duration::from_secs(60);
/// A bootstrap downloads and installs ~90 packages on a shared machine.
const BOOTSTRAP_WITHIN: Duration = Duration::from_secs(15 * 60);
/// One `podman run`/`exec`/`kill` call.
pub const CALL_WITHIN: Duration = Duration::from_secs(60);

/// The dpkg configuration of the slim Debian images: what later installs leave out.
const SLIM_DPKG_CFG: &str = "path-exclude /usr/share/doc/*\n\
                             path-include /usr/share/doc/*/copyright\n\
                             path-exclude /usr/share/man/*\n\
                             path-exclude /usr/share/groff/*\n\
                             path-exclude /usr/share/info/*\n\
                             path-exclude /usr/share/lintian/*\n\
                             path-exclude /usr/share/linda/*\n\
                             path-exclude /usr/share/locale/*\n";

/// What the slim images leave out of what debootstrap installed, plus apt's download cache and
/// lists, which debootstrap leaves behind.
const EXCLUDES: [&str; 6] = [
    "./usr/share/doc/*",
    "./usr/share/man/*",
    "./usr/share/info/*",
    "./usr/share/locale/*",
    "./var/cache/apt/archives/*.deb",
    "./var/lib/apt/lists/*",
];

/// The built image and the podman store it lives in.
#[derive(Debug)]
pub struct Image {
    pub podman: Podman,
}

static BUILT: OnceCell<Result<Option<Image>, String>> = OnceCell::const_new();

/// The image, built on first use. `None` when the image tests are skipped on purpose
/// (`PODHOST_SKIP_IMAGE_TESTS=1`); a missing tool or a failed build fails every test with the
/// same message.
pub async fn image() -> Option<&'static Image> {
    let built = BUILT
        .get_or_init(|| async {
            if std::env::var_os("PODHOST_SKIP_IMAGE_TESTS").is_some_and(|v| v == "1") {
                return Ok(None);
            }
            // In a task of its own so that a failed step (a panic) is kept as the answer for
            // every test instead of being retried by each.
            tokio::spawn(build()).await.map(Some).map_err(|e| {
                let panic = e.into_panic();
                panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "the image build panicked".to_owned())
            })
        })
        .await;
    match built {
        Ok(Some(image)) => Some(image),
        Ok(None) => {
            eprintln!("image tests skipped: PODHOST_SKIP_IMAGE_TESTS=1");
            None
        }
        Err(message) => panic!("the pod image could not be built: {message}"),
    }
}

/// The state directory: the store, the configuration, the build logs and the measurements.
pub fn state_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("image-tests")
}

pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Fails with a message that says what to install, or how to skip on purpose.
fn check_prerequisites() {
    let missing: Vec<&str> = ["podman", "runc", "debootstrap", "tar", "objcopy", "readelf"]
        .into_iter()
        .filter(|p| find_program(p).is_none())
        .collect();
    let root = nix::unistd::geteuid().is_root();
    if missing.is_empty() && root {
        return;
    }
    let mut why = Vec::new();
    if !missing.is_empty() {
        why.push(format!("missing {}", missing.join(", ")));
    }
    if !root {
        why.push("not running as root (debootstrap needs it)".to_owned());
    }
    panic!(
        "the image tests need podman, runc, debootstrap and binutils, run as root: {}. Install \
         them as .ci/run does (apt-get install podman buildah debootstrap runc uidmap slirp4netns \
         binutils), or \
         set PODHOST_SKIP_IMAGE_TESTS=1 to skip the image tests on purpose.",
        why.join("; ")
    );
}

async fn build() -> Image {
    check_prerequisites();
    let dir = state_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let podman = Podman::new(&dir);
    // A run killed half-way leaves its containers behind.
    podman
        .ok(["rm", "--all", "--force", "--time", "0"], MINUTE)
        .await;

    let base = ensure_base(&podman, &dir).await;

    // The binaries: PODHOST_IMAGE_BIN and the `podhost-full` and `podhost-exec` beside it, else
    // the test build's.
    let binaries: Vec<(PathBuf, &str)> = match std::env::var_os("PODHOST_IMAGE_BIN") {
        Some(bin) => {
            let bin = PathBuf::from(bin);
            ["podhost", "podhost-full", "podhost-exec"]
                .into_iter()
                .map(|name| {
                    let from = bin.with_file_name(name);
                    assert!(
                        from.is_file(),
                        "PODHOST_IMAGE_BIN={}: no {name} beside it",
                        bin.display()
                    );
                    (from, name)
                })
                .collect()
        }
        None => crate::support::installed_bins()
            .into_iter()
            .map(|(from, name)| (from.to_path_buf(), name))
            .collect(),
    };
    let binary = &binaries[0].0;
    let context = build_context(&dir, &binaries);
    let shipped = context.path().join("target/release");
    let started = Instant::now();
    podman
        .ok(
            [
                "build",
                "--pull=never",
                // install-packages fetches from the Debian mirror, as a user's build does.
                "--network=host",
                "--build-arg",
                &format!("BASE={BASE}"),
                "--build-arg",
                &format!("VERSION={}", env!("CARGO_PKG_VERSION")),
                "--build-arg",
                &format!("REVISION={}", env!("BUILD_GIT_REVISION")),
                "--build-arg",
                &format!("SOURCE={SOURCE}"),
                "--build-arg",
                &format!("CREATED={CREATED}"),
                "--tag",
                IMAGE,
                context.path().to_str().unwrap(),
            ],
            10 * MINUTE,
        )
        .await;
    let build_time = started.elapsed();
    // Earlier builds of the tag, now untagged.
    podman.ok(["image", "prune", "--force"], MINUTE).await;

    let size = |image: &'static str| {
        let podman = &podman;
        async move {
            podman
                .ok(["image", "inspect", "--format", "{{.Size}}", image], MINUTE)
                .await
                .trim()
                .parse::<u64>()
                .unwrap()
        }
    };
    let mb = |bytes: u64| bytes as f64 / 1e6;
    let base_line = match base {
        Some((bootstrap, import)) => format!(
            "base {BASE} bootstrapped cold in {:.1} s (debootstrap {:.1} s, import {:.1} s); \
             cold total with the image build (apt installing the packages) {:.1} s",
            (bootstrap + import).as_secs_f64(),
            bootstrap.as_secs_f64(),
            import.as_secs_f64(),
            (bootstrap + import + build_time).as_secs_f64()
        ),
        None => format!(
            "base {BASE} reused from an earlier run (remove {} to measure it cold)",
            dir.display()
        ),
    };
    let report = format!(
        "image tests: image {IMAGE} built in {:.1} s; {base_line}\n\
         image tests: image size {:.0} MB (base {:.0} MB; as shipped, stripped by \
         image/strip-symbols: podhost {:.1} MB, podhost-full {:.0} MB, podhost-exec {:.1} MB; \
         from {})\n",
        build_time.as_secs_f64(),
        mb(size(IMAGE).await),
        mb(size(BASE).await),
        mb(std::fs::metadata(shipped.join("podhost")).unwrap().len()),
        mb(std::fs::metadata(shipped.join("podhost-full"))
            .unwrap()
            .len()),
        mb(std::fs::metadata(shipped.join("podhost-exec"))
            .unwrap()
            .len()),
        binary.display(),
    );
    eprint!("{report}");
    std::fs::write(dir.join("measurements.txt"), report).unwrap();
    Image { podman }
}

/// Makes sure `BASE` exists; `Some((debootstrap, import))` times when it had to be built.
async fn ensure_base(podman: &Podman, dir: &Path) -> Option<(Duration, Duration)> {
    let mirror = std::env::var("PODHOST_IMAGE_TEST_MIRROR").unwrap_or_else(|_| {
        apt_mirror(Path::new("/etc/apt")).unwrap_or_else(|| {
            panic!(
                "no Debian mirror for {SUITE} in /etc/apt/sources.list(.d); set \
                 PODHOST_IMAGE_TEST_MIRROR"
            )
        })
    });
    let key = hex::encode(Sha256::digest(format!(
        "{SUITE}\n{mirror}\n{}\n{}",
        SLIM_DPKG_CFG,
        EXCLUDES.join(",")
    )));
    let keyed = format!("{BASE}-{}", &key[..12]);
    let exists = podman
        .output(["image", "exists", &keyed], MINUTE)
        .await
        .status
        .success();
    let times = if exists {
        None
    } else {
        let rootfs = tempfile::tempdir_in(dir).unwrap();
        let log = dir.join("debootstrap.log");
        let started = Instant::now();
        let log_file = std::fs::File::create(&log).unwrap();
        let mut cmd = tokio::process::Command::new(find_program("debootstrap").unwrap());
        cmd.arg("--variant=minbase")
            .arg(SUITE)
            .arg(rootfs.path())
            .arg(&mirror)
            // debootstrap runs chroot and friends from the sbin directories.
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .stdin(std::process::Stdio::null())
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file)
            .kill_on_drop(true);
        let out = crate::podman::run(cmd, BOOTSTRAP_WITHIN, "debootstrap").await;
        assert_success(&out, "debootstrap", &log);
        std::fs::write(
            rootfs.path().join("etc/dpkg/dpkg.cfg.d/slim"),
            SLIM_DPKG_CFG,
        )
        .unwrap();
        let bootstrap = started.elapsed();

        let started = Instant::now();
        let mut import = podman.command(["import", "-", &keyed]);
        let excludes: Vec<String> = EXCLUDES.iter().map(|e| format!("--exclude={e}")).collect();
        let mut tar = std::process::Command::new("tar")
            .arg("-C")
            .arg(rootfs.path())
            .args(&excludes)
            .args(["-c", "."])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        import.stdin(tar.stdout.take().unwrap());
        let out = crate::podman::run(import, 5 * MINUTE, "podman import").await;
        assert!(tar.wait().unwrap().success(), "tar of the base failed");
        assert!(
            out.status.success(),
            "podman import failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some((bootstrap, started.elapsed()))
    };
    podman.ok(["tag", &keyed, BASE], MINUTE).await;
    times
}

fn assert_success(out: &Output, what: &str, log: &Path) {
    if out.status.success() {
        return;
    }
    let log = std::fs::read_to_string(log).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(30).collect();
    panic!(
        "{what} failed ({}); the end of its log:\n{}",
        out.status,
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    );
}

/// A build context like the one `podman build .` sees at the repository root after the README's
/// build steps: the Containerfile, `.dockerignore`, `image/` and the binaries at
/// `target/release/{podhost,podhost-full,podhost-exec}`, stripped by `image/strip-symbols`
/// as they are shipped (their symbols in `target/release/.debug`, which the image leaves out).
fn build_context(dir: &Path, binaries: &[(PathBuf, &str)]) -> tempfile::TempDir {
    let context = tempfile::tempdir_in(dir).unwrap();
    for file in ["Containerfile", ".dockerignore"] {
        std::fs::copy(repo().join(file), context.path().join(file)).unwrap();
    }
    std::fs::create_dir(context.path().join("image")).unwrap();
    for entry in std::fs::read_dir(repo().join("image")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(
            entry.path(),
            context.path().join("image").join(entry.file_name()),
        )
        .unwrap();
    }
    let release = context.path().join("target/release");
    std::fs::create_dir_all(&release).unwrap();
    for (from, name) in binaries {
        if std::fs::hard_link(from, release.join(name)).is_err() {
            std::fs::copy(from, release.join(name)).unwrap();
        }
    }
    let out = std::process::Command::new(repo().join("image/strip-symbols"))
        .arg(&release)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "image/strip-symbols failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (from, name) in binaries {
        let sections = elf_sections(&release.join(name));
        assert!(
            sections.iter().any(|s| s == ".gnu_debuglink")
                // `.debug_gdb_scripts` is loaded with the program (a few bytes naming gdb's
                // pretty-printers), not debug info.
                && !sections.iter().any(|s| {
                    (s.starts_with(".debug_") && s != ".debug_gdb_scripts") || s == ".symtab"
                }),
            "{name} is shipped with its symbols: {sections:?}"
        );
        let symbols = elf_sections(&release.join(".debug").join(format!("{name}.debug")));
        assert!(
            symbols.iter().any(|s| s == ".debug_line") && symbols.iter().any(|s| s == ".symtab"),
            "{name}'s symbols file lacks its line tables or symbol table: {symbols:?}"
        );
        // The build's own binary is left as it was (a hard link is replaced, not rewritten).
        assert!(
            elf_sections(from).iter().any(|s| s == ".debug_line"),
            "{} lost its debug info",
            from.display()
        );
    }
    context
}

/// The section names of an ELF file, as `readelf` (binutils, like `objcopy`) lists them.
fn elf_sections(path: &Path) -> Vec<String> {
    let out = std::process::Command::new("readelf")
        .args(["-S", "-W"])
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "readelf -S {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (_, rest) = l.split_once(']')?;
            rest.split_whitespace().next().map(str::to_owned)
        })
        .collect()
}

/// The first mirror apt uses for `SUITE` itself (not `-updates` or `-security`), from the
/// deb822 `.sources` files and the one-line `.list` files under `etc_apt`.
pub fn apt_mirror(etc_apt: &Path) -> Option<String> {
    let mut files = vec![etc_apt.join("sources.list")];
    if let Ok(dir) = std::fs::read_dir(etc_apt.join("sources.list.d")) {
        let mut more: Vec<PathBuf> = dir.filter_map(|e| e.ok().map(|e| e.path())).collect();
        more.sort();
        files.extend(more);
    }
    files.iter().find_map(|f| {
        let text = std::fs::read_to_string(f).ok()?;
        match f.extension().and_then(|e| e.to_str()) {
            Some("sources") => mirror_in_deb822(&text),
            _ => mirror_in_one_line(&text),
        }
    })
}

fn mirror_in_deb822(text: &str) -> Option<String> {
    text.split("\n\n").find_map(|stanza| {
        let field = |name: &str| {
            stanza.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim()
                    .eq_ignore_ascii_case(name)
                    .then(|| v.trim().to_owned())
            })
        };
        let is_deb = field("Types").is_some_and(|t| t.split_whitespace().any(|t| t == "deb"));
        let suites = field("Suites")?;
        (is_deb && suites.split_whitespace().any(|s| s == SUITE))
            .then(|| field("URIs"))
            .flatten()
            .and_then(|u| u.split_whitespace().next().map(str::to_owned))
    })
}

fn mirror_in_one_line(text: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let line = line.split('#').next()?.trim();
        let rest = line.strip_prefix("deb ")?.trim_start();
        // `deb [options] URI SUITE COMPONENTS…`
        let rest = match rest.strip_prefix('[') {
            Some(options) => options.split_once(']')?.1,
            None => rest,
        };
        let mut words = rest.split_whitespace();
        let uri = words.next()?;
        (words.next()? == SUITE).then(|| uri.to_owned())
    })
}

/// A container of the image, removed when dropped.
pub struct Container {
    pub name: String,
    image: &'static Image,
}

impl Image {
    /// The `podman run` flags that make a container look like the pod Nylorun starts: uid 1000,
    /// a read-only root with nothing writable but the four pod paths, each an empty tmpfs
    /// owned by uid 1000 (like an emptyDir: nothing of the image is copied up), no
    /// capabilities, no privilege gain, and the host's network so the container reaches fakes
    /// on 127.0.0.1.
    pub fn pod_flags() -> Vec<String> {
        let mut flags: Vec<String> = [
            "--pull=never",
            "--read-only",
            // podman's own writable /run, /var/tmp and /tmp would hide a path the pod lacks.
            "--read-only-tmpfs=false",
            "--user=1000",
            "--cap-drop=ALL",
            "--security-opt=no-new-privileges",
            "--network=host",
        ]
        .map(str::to_owned)
        .to_vec();
        for path in WRITABLE {
            flags.push(format!("--tmpfs={path}:rw,exec,nosuid,nodev,U,notmpcopyup"));
        }
        flags
    }

    /// Starts a container in the background: `podman run -d` with the pod flags, then
    /// `extra` flags, the image and its arguments (given to the entrypoint).
    pub async fn start(&'static self, extra: &[String], args: &[&str]) -> Container {
        let name = unique_name("podhost-test");
        let mut argv = vec![
            "run".to_owned(),
            "--detach".to_owned(),
            format!("--name={name}"),
        ];
        argv.extend(Self::pod_flags());
        argv.extend(extra.iter().cloned());
        argv.push(IMAGE.to_owned());
        argv.extend(args.iter().map(|a| a.to_string()));
        let container = Container { name, image: self };
        self.podman.ok(&argv, CALL_WITHIN).await;
        container
    }

    /// Starts a container in the background with `flags` alone (none of the pod flags): the
    /// image, then `args` for its entrypoint.
    pub async fn start_bare(&'static self, flags: &[String], args: &[String]) -> Container {
        let name = unique_name("podhost-test");
        let mut argv = vec![
            "run".to_owned(),
            "--detach".to_owned(),
            format!("--name={name}"),
        ];
        argv.extend(flags.iter().cloned());
        argv.push(IMAGE.to_owned());
        argv.extend(args.iter().cloned());
        let container = Container { name, image: self };
        self.podman.ok(&argv, CALL_WITHIN).await;
        container
    }

    /// Runs a container to its end (`podman run --rm`) with the pod flags, then `extra`, the
    /// image and its arguments.
    pub async fn run(&self, extra: &[String], args: &[&str]) -> Output {
        let mut argv = vec!["run".to_owned(), "--rm".to_owned()];
        argv.extend(Self::pod_flags());
        argv.extend(extra.iter().cloned());
        argv.push(IMAGE.to_owned());
        argv.extend(args.iter().map(|a| a.to_string()));
        self.podman.output(&argv, CALL_WITHIN).await
    }
}

impl Container {
    /// `podman exec` in the container (as its user, 1000, with its environment).
    pub async fn exec(&self, args: &[&str]) -> Output {
        let mut argv = vec!["exec", &self.name];
        argv.extend_from_slice(args);
        self.image.podman.output(&argv, CALL_WITHIN).await
    }

    /// The host's pid of the container's PID 1 (the tests run as root on the host, so they can
    /// look at the container's processes in the host's `/proc`).
    pub async fn host_pid(&self) -> i32 {
        let out = self
            .image
            .podman
            .ok(
                ["inspect", "--format", "{{.State.Pid}}", &self.name],
                CALL_WITHIN,
            )
            .await;
        out.trim().parse().unwrap()
    }

    /// Sends `signal` to the container's PID 1 from outside, as the runtime would.
    pub async fn kill(&self, signal: &str) {
        self.image
            .podman
            .ok(["kill", "--signal", signal, &self.name], CALL_WITHIN)
            .await;
    }

    /// Waits for the container to exit; its exit code.
    pub async fn wait(&self, within: Duration) -> i32 {
        let out = self.image.podman.ok(["wait", &self.name], within).await;
        out.trim().parse().unwrap()
    }

    /// Waits for a line of the container's output that contains `needle`; the line.
    pub async fn wait_log(&self, needle: &str, within: Duration) -> String {
        use tokio::io::AsyncBufReadExt;
        let mut follow = self.image.podman.command(["logs", "--follow", &self.name]);
        // podhost logs to stderr; one stream is enough.
        follow.stdout(std::process::Stdio::null());
        let mut child = follow.spawn().unwrap();
        let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let found = tokio::time::timeout(within, async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if line.contains(needle) {
                    return Some(line);
                }
            }
            None
        })
        .await;
        let _ = child.kill().await;
        match found {
            Ok(Some(line)) => line,
            Ok(None) => panic!(
                "the container ended without logging {needle:?}; its output:\n{}",
                self.logs().await
            ),
            Err(_) => panic!(
                "no log line with {needle:?} within {within:?}; the output:\n{}",
                self.logs().await
            ),
        }
    }

    /// How podhost's commands are isolated, as the confinement level it logged at start-up
    /// says: `(namespaces, PID namespace)` — `("off" | "none", false)` for Landlock alone,
    /// `("root" | "userns", true)` or `("userns-noproc", false)` for isolated sessions. In an
    /// isolated session hidden paths are empty mounts (`ENOENT`) and each command runs under
    /// the session's holder; with Landlock alone they are refused (`EACCES`) and commands run
    /// under their supervisor only.
    pub async fn namespaces(&self) -> (String, bool) {
        let logs = self.logs().await;
        let line = logs
            .lines()
            .find(|l| l.contains("commands and file tools are confined"))
            .unwrap_or_else(|| panic!("no confinement level in the logs:\n{logs}"));
        let namespaces = line
            .split(", namespaces ")
            .nth(1)
            .and_then(|rest| rest.split([' ', ',']).next())
            .unwrap_or("off")
            .to_owned();
        let pid = line.contains("with a PID namespace");
        println!("the pod's commands: namespaces {namespaces}, PID namespace {pid}");
        (namespaces, pid)
    }

    /// The network the pod's commands are on, as podhost logged its level at start: `host`,
    /// or `namespace` (a network namespace of the session's own, whose one way out is the proxy
    /// podhost serves on its 127.0.0.1:3128).
    pub async fn network(&self) -> String {
        let logs = self.logs().await;
        let line = logs
            .lines()
            .find(|l| l.contains("commands and file tools are confined"))
            .unwrap_or_else(|| panic!("no confinement level in the logs:\n{logs}"));
        // `network filter on|off` comes first; the network itself after the namespaces.
        let network = line
            .split(", network ")
            .skip(1)
            .find(|rest| !rest.starts_with("filter "))
            .and_then(|rest| rest.split([',', ' ']).next())
            .unwrap_or("host")
            .to_owned();
        println!("the pod's commands: network {network}");
        network
    }

    /// Whether commands run in isolated sessions (see [`Container::namespaces`]).
    pub async fn isolated(&self) -> bool {
        !matches!(self.namespaces().await.0.as_str(), "off" | "none")
    }

    /// The container's output so far (stdout and stderr).
    pub async fn logs(&self) -> String {
        let out = self
            .image
            .podman
            .output(["logs", &self.name], CALL_WITHIN)
            .await;
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }
}

/// The output of a `podman exec`, which must have succeeded.
pub fn stdout(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = self
            .image
            .podman
            .blocking(&["rm", "--force", "--time", "0", &self.name])
            .status();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn the_mirror_of_the_suite_itself() {
        let deb822 = "Types: deb\n# a comment\nURIs: http://deb.example/debian\nSuites: bookworm \
                      bookworm-updates\nComponents: main\n\nTypes: deb\nURIs: \
                      http://security.example/debian-security\nSuites: bookworm-security\n";
        assert_eq!(
            mirror_in_deb822(deb822).as_deref(),
            Some("http://deb.example/debian")
        );
        let security_only = "Types: deb\nURIs: http://s.example/\nSuites: bookworm-security\n";
        assert_eq!(mirror_in_deb822(security_only), None);
        let sources_only = "Types: deb-src\nURIs: http://src.example/\nSuites: bookworm\n";
        assert_eq!(mirror_in_deb822(sources_only), None);

        let one_line = "# deb http://old.example/debian bookworm main\n\
                        deb https://packages.example/apt cloud-sdk-bookworm main\n\
                        deb [arch=amd64 signed-by=/k.gpg] http://deb.example/debian bookworm main\n";
        assert_eq!(
            mirror_in_one_line(one_line).as_deref(),
            Some("http://deb.example/debian")
        );
    }
}
