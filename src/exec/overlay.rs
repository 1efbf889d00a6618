//! A session's workspace as a copy-on-write view of a workspace template (the template's
//! `overlay` level): an overlay mount made by the session's holder in the session's mount
//! namespace alone, the template its read-only lower layer, the session's own directory its
//! upper layer, a work directory beside it on the same file system.
//!
//! ```text
//!  O (holder, outer): on a root host whose commands run as another user than the template's
//!    owner, a user namespace that maps the owner onto the command user (the id map of the
//!    template's idmapped tree)
//!  H (pid 1 of the session): a detached tree of the template (idmapped with O's namespace when
//!    there is one), the overlay over it, mounted detached, and bound where the workspace is
//! ```
//!
//! Invariants:
//! * The template is only read: the kernel writes to the upper layer alone, and a change to a
//!   template file copies it up first.
//! * Every layer is named by a descriptor (`/proc/self/fd/N`), never by the text of its path,
//!   so a path holding `:` or `,` cannot split a layer.
//! * Nothing of it lives outside the session's namespace: the overlay goes with it; what the
//!   session wrote stays in its upper layer (the host's workspace directory, or its disk's).
//!
//! Non-goals: ownership of template files whose owner is not the template directory's (they
//! show as the overflow user, read-only to the session), the kernel's overlay options beyond
//! the layers.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use super::protocol::CommandUser;
use super::sys::{self, Res, StepError};

const FSOPEN_CLOEXEC: libc::c_uint = 1;
const FSCONFIG_SET_FLAG: libc::c_uint = 0;
const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
const FSMOUNT_CLOEXEC: libc::c_uint = 1;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
const AT_EMPTY_PATH: libc::c_uint = 0x1000;

/// The kernel's `struct mount_attr`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

fn check(step: &str, rc: libc::c_long) -> Res<libc::c_long> {
    if rc < 0 {
        Err(StepError::last(step))
    } else {
        Ok(rc)
    }
}

/// `fd` as a path the kernel resolves to what it names.
fn fd_path(fd: &OwnedFd) -> CString {
    // A decimal number holds no NUL.
    CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap_or_default()
}

/// Opens the directory `path` as a handle only (`O_PATH`).
pub fn open_dir(step: &str, path: &CStr) -> Res<OwnedFd> {
    // SAFETY: a live C string; the call returns a new descriptor or -1.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    // SAFETY: a descriptor the kernel just gave us, owned by nothing else.
    check(step, fd.into()).map(|fd| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// A detached tree of `lower`, its owners seen through `idmap` (a user namespace's descriptor)
/// when given.
pub fn lower_tree(lower: &CStr, idmap: Option<&OwnedFd>) -> Res<OwnedFd> {
    let tree = sys::open_tree("capture the workspace template", lower, true)?;
    let Some(ns) = idmap else {
        return Ok(tree);
    };
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: ns.as_raw_fd() as u64,
    };
    // SAFETY: a descriptor we own, a live empty string and a `mount_attr` of the size passed;
    // the kernel only reads them.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            AT_EMPTY_PATH | sys::AT_RECURSIVE,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    check("map the workspace template's owner", rc)?;
    Ok(tree)
}

/// An overlay of `lower` (read-only) under `upper`, with `work` (empty, on `upper`'s file
/// system) for the kernel, mounted detached, `nosuid` and `nodev`. `userxattr`: in a user
/// namespace, where the kernel keeps its marks in `user.` attributes.
pub fn mount(lower: &OwnedFd, upper: &OwnedFd, work: &OwnedFd, userxattr: bool) -> Res<OwnedFd> {
    let layers = [
        (c"lowerdir", fd_path(lower)),
        (c"upperdir", fd_path(upper)),
        (c"workdir", fd_path(work)),
    ];
    let attrs = sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV;
    overlay("mount the workspace's overlay", &layers, userxattr, attrs)
}

/// Mounts over `upper`, for the calling thread alone, the read-only merged view of an idle
/// session: `upper` (its overlay's former upper layer, whose marks of deleted files and opaque
/// directories the kernel honours in a lower layer too) over `template`. The thread first
/// takes a file-system context and mount namespace of its own, its mounts private, so nothing
/// of it reaches the host; the view goes with the thread. Root only, or podhost in a user
/// namespace of its own (`sys::enter_own_user_namespace`); paths holding `:`, `,`
/// or `\\` are refused (the kernel's layer list separates with them).
pub fn merged_view_on_thread(upper: &Path, template: &Path) -> Res<()> {
    let step = "show the session's merged workspace";
    let text = |p: &Path| {
        p.to_str()
            .filter(|t| !t.contains([':', ',', '\\']))
            .map(str::to_owned)
            .ok_or_else(|| {
                StepError::new(
                    format!("{step}: {} cannot be a layer", p.display()),
                    libc::EINVAL,
                )
            })
    };
    let lower = CString::new(format!("{}:{}", text(upper)?, text(template)?))
        .map_err(|_| StepError::new(format!("{step}: a path holds a NUL"), libc::EINVAL))?;
    let target = CString::new(upper.as_os_str().as_encoded_bytes())
        .map_err(|_| StepError::new(format!("{step}: a path holds a NUL"), libc::EINVAL))?;
    // SAFETY: plain system calls that change only the calling thread's file-system context and
    // mount namespace, and that namespace's propagation; null or live C strings.
    let rc = unsafe { libc::unshare(libc::CLONE_FS | libc::CLONE_NEWNS) };
    check(&format!("{step}: unshare"), rc.into())?;
    // SAFETY: as above.
    let rc = unsafe {
        libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        )
    };
    check(&format!("{step}: make the mounts private"), rc.into())?;
    let attrs = sys::MOUNT_ATTR_RDONLY
        | sys::MOUNT_ATTR_NOSUID
        | sys::MOUNT_ATTR_NODEV
        | sys::MOUNT_ATTR_NOEXEC;
    // In podhost's own user namespace, the sessions' overlays marked opaque directories with
    // `user.` attributes (the `trusted.` ones are the host's root's): read them alike.
    let userxattr = crate::exec::sys::in_own_user_namespace();
    let view = overlay(step, &[(c"lowerdir", lower)], userxattr, attrs)?;
    sys::move_mount(step, &view, &target)
}

/// A detached overlay mount of `layers` (each key and its value), with `attrs`.
fn overlay(step: &str, layers: &[(&CStr, CString)], userxattr: bool, attrs: u64) -> Res<OwnedFd> {
    let step = |what: &str| format!("{step}: {what}");
    // SAFETY: a live C string; the call returns a new descriptor or -1.
    let fs = unsafe { libc::syscall(libc::SYS_fsopen, c"overlay".as_ptr(), FSOPEN_CLOEXEC) };
    // SAFETY: a descriptor the kernel just gave us, owned by nothing else.
    let fs = check(&step("fsopen"), fs).map(|fd| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })?;
    let config = |cmd: libc::c_uint, key: Option<&CStr>, value: Option<&CStr>, what: &str| {
        let p = |c: Option<&CStr>| c.map_or(std::ptr::null(), CStr::as_ptr);
        // SAFETY: a descriptor we own and null or live C strings the kernel only reads.
        let rc =
            unsafe { libc::syscall(libc::SYS_fsconfig, fs.as_raw_fd(), cmd, p(key), p(value), 0) };
        check(&step(what), rc).map(drop)
    };
    for (key, value) in layers {
        let what = key.to_string_lossy();
        config(FSCONFIG_SET_STRING, Some(key), Some(value), &what)?;
    }
    if userxattr {
        config(FSCONFIG_SET_FLAG, Some(c"userxattr"), None, "userxattr")?;
    }
    config(FSCONFIG_CMD_CREATE, None, None, "create")?;
    let attrs = attrs as libc::c_uint;
    // SAFETY: a descriptor we own; the call returns a new descriptor or -1.
    let mnt = unsafe { libc::syscall(libc::SYS_fsmount, fs.as_raw_fd(), FSMOUNT_CLOEXEC, attrs) };
    // SAFETY: a descriptor the kernel just gave us, owned by nothing else.
    check(&step("fsmount"), mnt).map(|fd| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// A user namespace that maps `from` (the template's owner, uid and gid) onto `to`, for an
/// idmapped tree: made in a child that waits while its id maps are written and its namespace
/// opened, then ends. Only for a single-threaded root process in the host's PID namespace.
pub fn idmap(from: CommandUser, to: CommandUser) -> Res<OwnedFd> {
    let (wait_r, wait_w) = sys::pipe().map_err(|e| io_step("pipe", &e))?;
    let child = sys::fork_with("make the template's id map", libc::CLONE_NEWUSER)?;
    if child == 0 {
        drop(wait_w);
        let _ = sys::read_byte(wait_r.as_raw_fd());
        sys::exit_now(0);
    }
    drop(wait_r);
    let made = (|| {
        let write = |file: &str, text: String| {
            let path = format!("/proc/{child}/{file}");
            std::fs::write(&path, text).map_err(|e| io_step(&format!("write {path}"), &e))
        };
        write("uid_map", format!("{} {} 1\n", from.uid, to.uid))?;
        write("gid_map", format!("{} {} 1\n", from.gid, to.gid))?;
        let path = format!("/proc/{child}/ns/user");
        std::fs::File::open(&path)
            .map(OwnedFd::from)
            .map_err(|e| io_step(&format!("open {path}"), &e))
    })();
    drop(wait_w);
    let _ = sys::wait(child, 0);
    made
}

/// Removes an overlay's work directory `dir` and what the kernel left in it: its `work`
/// directory has mode 0, which a user other than root cannot list until it is opened up.
pub fn remove_work_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                let _ =
                    std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(0o700));
            }
        }
    }
    std::fs::remove_dir_all(dir)
}

fn io_step(step: &str, e: &std::io::Error) -> StepError {
    StepError::new(step, e.raw_os_error().unwrap_or(libc::EIO))
}
