//! A BYOH session's disk on a root host: its workspace and temporary directory on a file
//! system of their own whose size the kernel holds — an ext4 image, as large as the session's
//! quota, loop-mounted inside the session's mount namespace only. A writer past the quota gets
//! `ENOSPC` at once, from the kernel.
//!
//! ```text
//!  <data>/disks/<session>.img   (sparse; made once, with mkfs.ext4)
//!    O (the holder's outer process): makes the image if it is missing, locks it, checks it
//!    H (the session's pid 1, in its mount namespace): a loop device on the locked image, the
//!      file system mounted detached (fsmount), its `ws/` and `tmp/` bound onto the session's
//!      workspace and temporary directory in the view (`ws/` the upper layer of the workspace's
//!      overlay of a template instead, with `ovl-work/` beside it, see `exec::overlay`)
//! ```
//!
//! The file tools, which run in podhost's own threads, join the session's mount namespace for
//! each call (`session::enter_mount_namespace`), so they and the commands see one tree.
//!
//! Invariants:
//! * One mount of an image at a time, held by the kernel: the image is `flock`ed on the open file
//!   the loop device is made from, and the loop device keeps that file (so the lock) until the
//!   last mount of it is gone — when the session's namespace ends, however podhost ends.
//! * Nothing of it lives outside the session's namespace: no mount on the host, a loop device
//!   that detaches itself (`LO_FLAGS_AUTOCLEAR`).
//! * An image left unclean (a crash while mounted) is checked (`e2fsck -p`) before it is mounted.
//!
//! Non-goals: resizing an image when the quota changes (an image keeps the size it was made
//! with), quotas on file systems podhost does not make.

use std::ffi::CString;
use std::fs::OpenOptions;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::protocol::SessionDisk;
use super::sys::{self, Res, StepError};

/// The directories of an image that are bound onto the session's: the workspace, its `TMPDIR`.
pub const DIRS: [&str; 2] = ["ws", "tmp"];

/// How long a holder waits for an earlier mount of its image (a namespace still ending) to go.
const LOCK_BOUND: Duration = Duration::from_secs(10);

/// Where the tools for making and checking an image are looked for (a holder has no `PATH`).
const SBIN: [&str; 4] = ["/usr/sbin", "/sbin", "/usr/bin", "/bin"];

/// `name` in the first of [`SBIN`] that holds it.
fn tool(name: &str) -> Option<PathBuf> {
    SBIN.iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// Whether this host can give sessions such disks: podhost is root and the tools are there
/// (the probe then tries it once, see `probe`).
pub fn tools_present() -> bool {
    tool("mkfs.ext4").is_some() && tool("e2fsck").is_some()
}

/// Makes an empty image of `bytes` at `image`: a sparse copy of the empty image of that size
/// kept beside it (made with mkfs.ext4 the first time, which takes a good part of a second for a
/// large one; a copy takes what the image's metadata takes), by way of a temporary name, so that
/// a half-made image is never found.
pub fn make_image(image: &Path, bytes: u64) -> Res<()> {
    let step = |what: &str| format!("make the session's disk {}: {what}", image.display());
    let template = image.with_file_name(format!(".empty-{bytes}.img"));
    if !template.exists() {
        make_empty(&template, bytes)?;
    }
    let tmp = image.with_extension(format!("making-{}", std::process::id()));
    let made = (|| {
        let src = std::fs::File::open(&template)
            .map_err(|e| io_step(step("open the empty image"), &e))?;
        let dst = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| io_step(step("create"), &e))?;
        dst.set_len(bytes).map_err(|e| io_step(step("size"), &e))?;
        sys::copy_sparse(&src, &dst).map_err(|e| io_step(step("copy the empty image"), &e))?;
        std::fs::rename(&tmp, image).map_err(|e| io_step(step("rename"), &e))
    })();
    if made.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    made
}

/// Makes an empty ext4 image of `bytes` at `image` with mkfs.ext4, by way of a temporary name.
fn make_empty(image: &Path, bytes: u64) -> Res<()> {
    let step = |what: &str| format!("make an empty disk {}: {what}", image.display());
    let mkfs =
        tool("mkfs.ext4").ok_or_else(|| StepError::new(step("no mkfs.ext4"), libc::ENOENT))?;
    let tmp = image.with_extension(format!("making-{}", std::process::id()));
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| io_step(step("create"), &e))?;
    let made = file
        .set_len(bytes)
        .map_err(|e| io_step(step("size"), &e))
        .and_then(|()| {
            // No journal (a session's disk is small and checked when left unclean), no reserved
            // blocks, an inode per 8 KiB (source trees are many small files), tables left for the
            // kernel to initialise lazily (nothing is written for them now).
            let out = Command::new(&mkfs)
                .args(["-q", "-F", "-O", "^has_journal", "-m", "0", "-i", "8192"])
                .args([
                    "-E",
                    "lazy_itable_init=1,nodiscard",
                    "-L",
                    "podhost-session",
                ])
                .arg(&tmp)
                .env_clear()
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .output()
                .map_err(|e| io_step(step("run mkfs.ext4"), &e))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(StepError::new(
                    step(&format!(
                        "mkfs.ext4 failed: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    )),
                    libc::EIO,
                ))
            }
        })
        .and_then(|()| std::fs::rename(&tmp, image).map_err(|e| io_step(step("rename"), &e)));
    if made.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    made
}

fn io_step(step: String, e: &std::io::Error) -> StepError {
    StepError::new(step, e.raw_os_error().unwrap_or(libc::EIO))
}

/// O's part: the image, made if missing, opened and locked (waiting a bounded time for an
/// earlier mount to end), and checked. The open file is what H makes its loop device from.
pub fn prepare(disk: &SessionDisk) -> Res<OwnedFd> {
    if !disk.image.exists() {
        make_image(&disk.image, disk.bytes)?;
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(&disk.image)
        .map_err(|e| io_step(format!("open {}", disk.image.display()), &e))?;
    let fd = OwnedFd::from(file);
    let deadline = Instant::now() + LOCK_BOUND;
    while !sys::flock_exclusive_now(&fd)
        .map_err(|e| io_step(format!("lock {}", disk.image.display()), &e))?
    {
        if Instant::now() >= deadline {
            return Err(StepError::new(
                format!(
                    "the session's disk {} is still mounted by an earlier session holder",
                    disk.image.display()
                ),
                libc::EBUSY,
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    check(&disk.image)?;
    Ok(fd)
}

/// `e2fsck -p`: quick on a clean image, a repair of what a crash left on another; anything it
/// cannot repair by itself stops the session.
fn check(image: &Path) -> Res<()> {
    let step = format!("check the session's disk {}", image.display());
    let fsck = tool("e2fsck").ok_or_else(|| StepError::new(step.clone(), libc::ENOENT))?;
    let out = Command::new(fsck)
        .arg("-p")
        .arg(image)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| io_step(step.clone(), &e))?;
    // 0: clean; 1: errors corrected.
    match out.status.code() {
        Some(0 | 1) => Ok(()),
        _ => Err(StepError::new(
            format!(
                "{step}: e2fsck could not repair it ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stdout).trim()
            ),
            libc::EIO,
        )),
    }
}

/// H's part, at the start of building the view (the host's `/dev` still in place): a loop device
/// on the locked image, its file system mounted detached, and a detached tree of each of
/// [`DIRS`] (made and given to the owner when needed), to bind where the view binds the
/// session's directories.
/// Returns the mounted file system too, for [`overlay_dirs`].
pub fn mount(disk: &SessionDisk, image: &OwnedFd) -> Res<(OwnedFd, Vec<(PathBuf, OwnedFd)>)> {
    let (device, path) = sys::loop_attach(image)?;
    let fs = sys::fsmount_ext4(&path, &[c"discard", c"noinit_itable"])?;
    // The mount holds the device now; with autoclear it goes when the mount does.
    drop(device);
    let root = PathBuf::from(format!("/proc/self/fd/{}", fs.as_raw_fd()));
    let mut trees = Vec::new();
    for (name, target) in DIRS.iter().zip(&disk.targets) {
        let dir = root.join(name);
        let step = |what: &str| format!("the session's disk: {what} {name}");
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_step(step("make"), &e)),
        }
        super::confine::users::give_to(&dir, disk.owner).map_err(|e| io_step(step("own"), &e))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| io_step(step("mode of"), &e))?;
        let c = CString::new(name.as_bytes())
            .map_err(|_| StepError::new(step("name"), libc::EINVAL))?;
        trees.push((
            target.clone(),
            sys::open_tree_at(&step("capture"), &fs, &c)?,
        ));
    }
    Ok((fs, trees))
}

/// The directory of an image that holds the kernel's work directory when the workspace is an
/// overlay (see `exec::overlay`): bound nowhere, so the session never sees it.
pub const OVERLAY_WORK: &str = "ovl-work";

/// The upper layer (the image's workspace, made by [`mount`]) and work directory (made here,
/// podhost's alone) of a workspace overlay on the mounted image `fs`, as handles.
pub fn overlay_dirs(fs: &OwnedFd) -> Res<(OwnedFd, OwnedFd)> {
    let root = PathBuf::from(format!("/proc/self/fd/{}", fs.as_raw_fd()));
    let work = root.join(OVERLAY_WORK);
    match std::fs::create_dir(&work) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(io_step(
                "the session's disk: make its overlay work directory".into(),
                &e,
            ));
        }
    }
    std::fs::set_permissions(&work, std::fs::Permissions::from_mode(0o700)).map_err(|e| {
        io_step(
            "the session's disk: mode of its overlay work directory".into(),
            &e,
        )
    })?;
    let open =
        |p: &Path, what: &str| sys::cpath(p).and_then(|c| crate::exec::overlay::open_dir(what, &c));
    Ok((
        open(&root.join(DIRS[0]), "open the disk's workspace")?,
        open(&work, "open the disk's overlay work directory")?,
    ))
}

/// The file a session's disk image lives in: `dir` (podhost's, hidden from sessions) joined
/// with the session's directory name.
pub fn image_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.img"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_is_sparse_and_never_found_half_made() {
        if !tools_present() {
            eprintln!("no mkfs.ext4 here: the session disk image is not exercised");
            return;
        }
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("s.img");
        make_image(&image, 64 << 20).unwrap();
        let meta = std::fs::metadata(&image).unwrap();
        assert_eq!(meta.len(), 64 << 20);
        assert!(
            meta.blocks() * 512 < 8 << 20,
            "{} bytes allocated",
            meta.blocks() * 512
        );
        let mut names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(
            names,
            vec![format!(".empty-{}.img", 64 << 20), "s.img".to_owned()]
        );
        // A second image is a copy of the first's empty one, as sparse.
        make_image(&dir.path().join("t.img"), 64 << 20).unwrap();
        let copy = std::fs::metadata(dir.path().join("t.img")).unwrap();
        assert_eq!(copy.len(), 64 << 20);
        assert_eq!(copy.blocks(), meta.blocks());
        assert!(make_image(&dir.path().join("none/x.img"), 1 << 20).is_err());
    }
}
