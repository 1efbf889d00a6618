//! Raw system calls for namespaces, mounts, pidfds and descriptor passing: thin wrappers, each
//! an `unsafe` block with its `// SAFETY:` note, each error naming the step that failed.
//!
//! Owns: nothing but the calls. Used by the session holder (`session::holder`, which builds a
//! command's view of the file system in fresh namespaces), the view (`session::view`), the
//! level probe (`probe`) and podhost's side of a session (`session`).
//!
//! Invariants: every function is one or a few system calls on values the caller owns; none
//! takes a lock (they may run in a child forked from a single-threaded process, where that would
//! be safe anyway, or in podhost itself).
//!
//! Non-goals: portability beyond Linux; a general-purpose API.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString};
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// A system call that failed, with the step it was for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepError {
    pub step: String,
    pub errno: i32,
}

impl StepError {
    pub fn new(step: impl Into<String>, errno: i32) -> Self {
        StepError {
            step: step.into(),
            errno,
        }
    }

    /// The error of the last failed call.
    pub fn last(step: impl Into<String>) -> Self {
        StepError::new(step, errno())
    }
}

impl fmt::Display for StepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {}",
            self.step,
            io::Error::from_raw_os_error(self.errno)
        )
    }
}

impl std::error::Error for StepError {}

pub type Res<T> = Result<T, StepError>;

/// `errno` of the last failed call.
pub fn errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

fn check(step: &str, rc: libc::c_long) -> Res<libc::c_long> {
    if rc < 0 {
        Err(StepError::last(step))
    } else {
        Ok(rc)
    }
}

/// `path` as a C string; a path holding NUL cannot name a file.
pub fn cpath(path: &Path) -> Res<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        StepError::new(
            format!("{}: a path holding NUL", path.display()),
            libc::EINVAL,
        )
    })
}

// ---- mounts ---------------------------------------------------------------------------------

pub const OPEN_TREE_CLONE: u32 = 1;
pub const AT_RECURSIVE: u32 = 0x8000;
const MOVE_MOUNT_F_EMPTY_PATH: u32 = 0x4;
pub const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub const MOUNT_ATTR_NODEV: u64 = 0x4;
pub const MOUNT_ATTR_NOEXEC: u64 = 0x8;

/// The kernel's `struct mount_attr`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// mount(2).
pub fn mount(
    step: &str,
    src: Option<&CStr>,
    target: &CStr,
    fstype: Option<&CStr>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> Res<()> {
    let p = |c: Option<&CStr>| c.map_or(std::ptr::null(), CStr::as_ptr);
    // SAFETY: every pointer is null or a live NUL-terminated string; the kernel only reads them.
    let rc = unsafe {
        libc::mount(
            p(src),
            target.as_ptr(),
            p(fstype),
            flags,
            p(data).cast::<libc::c_void>(),
        )
    };
    check(step, rc.into()).map(drop)
}

/// open_tree(2) with `OPEN_TREE_CLONE` (and `AT_RECURSIVE`): a detached copy of the tree at
/// `path`, to attach elsewhere with [`move_mount`] — taken before anything covers the path.
pub fn open_tree(step: &str, path: &CStr, recursive: bool) -> Res<OwnedFd> {
    let flags = OPEN_TREE_CLONE | if recursive { AT_RECURSIVE } else { 0 } | libc::O_CLOEXEC as u32;
    // SAFETY: `path` is a live C string; the call returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, path.as_ptr(), flags) };
    // SAFETY: a descriptor the kernel just gave us, owned by nothing else.
    check(step, fd).map(|fd| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// move_mount(2) of a detached tree onto `target`.
pub fn move_mount(step: &str, tree: &OwnedFd, target: &CStr) -> Res<()> {
    // SAFETY: live strings and a descriptor we own; the kernel only reads them.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    check(step, rc).map(drop)
}

/// mount_setattr(2): adds `set` to the per-mount flags of the mount at `path` (and of every
/// mount beneath it when `recursive`). It never touches the superblock (unlike a remount
/// without `MS_BIND`, which would change the host's file system) and only adds flags, so a
/// flag locked in a user namespace is never dropped.
pub fn mount_setattr(step: &str, path: &CStr, recursive: bool, set: u64) -> Res<()> {
    let attr = MountAttr {
        attr_set: set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let flags = if recursive { AT_RECURSIVE } else { 0 };
    // SAFETY: a live string and a `mount_attr` of the size passed; the kernel only reads them.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            path.as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    check(step, rc).map(drop)
}

/// mkdir(2); an existing entry is fine.
pub fn mkdir(step: &str, path: &CStr, mode: libc::mode_t) -> Res<()> {
    // SAFETY: a live C string.
    let rc = unsafe { libc::mkdir(path.as_ptr(), mode) };
    if rc != 0 && errno() != libc::EEXIST {
        return Err(StepError::last(step));
    }
    Ok(())
}

/// Creates an empty file (a mount point for a file); an existing one is fine.
pub fn mkfile(step: &str, path: &CStr) -> Res<()> {
    // SAFETY: a live C string; the mode argument is required with O_CREAT.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
            0o444 as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(StepError::last(step));
    }
    // SAFETY: a descriptor we just opened.
    unsafe { libc::close(fd) };
    Ok(())
}

/// symlink(2).
pub fn symlink(step: &str, target: &CStr, link: &CStr) -> Res<()> {
    // SAFETY: live C strings.
    check(
        step,
        unsafe { libc::symlink(target.as_ptr(), link.as_ptr()) }.into(),
    )
    .map(drop)
}

/// A character device node, mode 0666 whatever the umask.
pub fn mknod_char(step: &str, path: &CStr, major: u32, minor: u32) -> Res<()> {
    // SAFETY: a live C string and plain integers.
    let rc = unsafe {
        libc::mknod(
            path.as_ptr(),
            libc::S_IFCHR | 0o666,
            libc::makedev(major, minor),
        )
    };
    check(step, rc.into())?;
    // SAFETY: a live C string.
    check(step, unsafe { libc::chmod(path.as_ptr(), 0o666) }.into()).map(drop)
}

/// chdir(2).
pub fn chdir(step: &str, path: &CStr) -> Res<()> {
    // SAFETY: a live C string.
    check(step, unsafe { libc::chdir(path.as_ptr()) }.into()).map(drop)
}

/// open_tree(2) of `path` beneath the directory (or detached mount) `dir`: a detached, recursive
/// copy of that tree.
pub fn open_tree_at(step: &str, dir: &OwnedFd, path: &CStr) -> Res<OwnedFd> {
    let flags = OPEN_TREE_CLONE | AT_RECURSIVE | libc::O_CLOEXEC as u32;
    // SAFETY: a descriptor we own and a live C string; the call returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, dir.as_raw_fd(), path.as_ptr(), flags) };
    // SAFETY: a descriptor the kernel just gave us, owned by nothing else.
    check(step, fd).map(|fd| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

const FSOPEN_CLOEXEC: libc::c_uint = 1;
const FSCONFIG_SET_FLAG: libc::c_uint = 0;
const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
const FSMOUNT_CLOEXEC: libc::c_uint = 1;

/// An ext4 file system on the block device `source`, mounted detached (fsopen, fsconfig,
/// fsmount: attached nowhere until a tree of it is moved somewhere) with `flags` set, `nosuid`
/// and `nodev`.
pub fn fsmount_ext4(source: &CStr, flags: &[&CStr]) -> Res<OwnedFd> {
    let step = |what: &str| format!("mount the session's disk: {what}");
    // SAFETY: a live C string; the call returns a new descriptor or -1.
    let fs = unsafe { libc::syscall(libc::SYS_fsopen, c"ext4".as_ptr(), FSOPEN_CLOEXEC) };
    // SAFETY: a descriptor the kernel just gave us, owned by nothing else.
    let fs = check(&step("fsopen"), fs).map(|fd| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })?;
    let config = |cmd: libc::c_uint, key: Option<&CStr>, value: Option<&CStr>, what: &str| {
        let p = |c: Option<&CStr>| c.map_or(std::ptr::null(), CStr::as_ptr);
        // SAFETY: a descriptor we own and null or live C strings the kernel only reads.
        let rc =
            unsafe { libc::syscall(libc::SYS_fsconfig, fs.as_raw_fd(), cmd, p(key), p(value), 0) };
        check(&step(what), rc).map(drop)
    };
    config(FSCONFIG_SET_STRING, Some(c"source"), Some(source), "source")?;
    for flag in flags {
        config(FSCONFIG_SET_FLAG, Some(flag), None, &flag.to_string_lossy())?;
    }
    config(FSCONFIG_CMD_CREATE, None, None, "create")?;
    let attrs = (MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV) as libc::c_uint;
    // SAFETY: a descriptor we own; the call returns a new descriptor or -1.
    let mnt = unsafe { libc::syscall(libc::SYS_fsmount, fs.as_raw_fd(), FSMOUNT_CLOEXEC, attrs) };
    // SAFETY: a descriptor the kernel just gave us, owned by nothing else.
    check(&step("fsmount"), mnt).map(|fd| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LO_FLAGS_AUTOCLEAR: u32 = 4;

/// The kernel's `struct loop_info64`.
#[repr(C)]
struct LoopInfo64 {
    device: u64,
    inode: u64,
    rdevice: u64,
    offset: u64,
    sizelimit: u64,
    number: u32,
    encrypt_type: u32,
    encrypt_key_size: u32,
    flags: u32,
    file_name: [u8; 64],
    crypt_name: [u8; 64],
    encrypt_key: [u8; 32],
    init: [u64; 2],
}

/// The kernel's `struct loop_config`.
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// A free loop device backed by `file`, detaching itself once nothing holds it
/// (`LO_FLAGS_AUTOCLEAR`): the device's descriptor and its path.
pub fn loop_attach(file: &OwnedFd) -> Res<(OwnedFd, CString)> {
    let step = |what: &str| format!("attach the session's disk to a loop device: {what}");
    let control = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")
        .map_err(|e| {
            StepError::new(
                step("/dev/loop-control"),
                e.raw_os_error().unwrap_or(libc::EIO),
            )
        })?;
    // Another process may take the device found between the two calls: try again.
    for _ in 0..16 {
        // SAFETY: a plain ioctl on a descriptor we own; it returns a device number or -1.
        let n = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE as _) };
        if n < 0 {
            return Err(StepError::last(step("LOOP_CTL_GET_FREE")));
        }
        let path = CString::new(format!("/dev/loop{n}"))
            .map_err(|_| StepError::new(step("path"), libc::EINVAL))?;
        let device = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(path.to_string_lossy().as_ref())
            .map_err(|e| {
                StepError::new(
                    step("open the device"),
                    e.raw_os_error().unwrap_or(libc::EIO),
                )
            })?;
        // SAFETY: `LoopConfig` is plain old data; all zeroes is a valid value.
        let mut config: LoopConfig = unsafe { std::mem::zeroed() };
        config.fd = file.as_raw_fd() as u32;
        config.info.flags = LO_FLAGS_AUTOCLEAR;
        // SAFETY: LOOP_CONFIGURE reads a live `loop_config` naming a descriptor we own.
        let rc = unsafe { libc::ioctl(device.as_raw_fd(), LOOP_CONFIGURE as _, &config) };
        if rc == 0 {
            return Ok((OwnedFd::from(device), path));
        }
        if errno() != libc::EBUSY {
            return Err(StepError::last(step("LOOP_CONFIGURE")));
        }
    }
    Err(StepError::new(
        step("every free device was taken"),
        libc::EBUSY,
    ))
}

/// Copies `src` to `dst` (of the same length, already sized) region by region, leaving holes
/// where `src` has them (SEEK_DATA, SEEK_HOLE, copy_file_range): a sparse file stays sparse.
pub fn copy_sparse(src: &std::fs::File, dst: &std::fs::File) -> io::Result<()> {
    let (s, d) = (src.as_raw_fd(), dst.as_raw_fd());
    let mut at: libc::off_t = 0;
    loop {
        // SAFETY: plain lseek calls on descriptors the caller owns.
        let data = unsafe { libc::lseek(s, at, libc::SEEK_DATA) };
        if data < 0 {
            let e = io::Error::last_os_error();
            // ENXIO: no data past `at`.
            return if e.raw_os_error() == Some(libc::ENXIO) {
                Ok(())
            } else {
                Err(e)
            };
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(s, data, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(io::Error::last_os_error());
        }
        let (mut from, mut to) = (data, data);
        while from < hole {
            let left = (hole - from) as usize;
            // SAFETY: both offsets are live locals the kernel updates; the descriptors are owned.
            let n = unsafe { libc::copy_file_range(s, &mut from, d, &mut to, left, 0) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            if n == 0 {
                break;
            }
        }
        at = hole;
    }
}

/// flock(2) `LOCK_EX | LOCK_NB`: `true` when taken, `false` when another open file holds it.
pub fn flock_exclusive_now(fd: &OwnedFd) -> io::Result<bool> {
    // SAFETY: a plain system call on a descriptor we own.
    if unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(e)
    }
}

/// Moves the calling thread into the mount namespace `ns`: first a file-system context of its
/// own (`unshare(CLONE_FS)`, which `setns` demands of a thread whose process has others), then
/// the namespace. Only this thread changes; its root and working directory become the
/// namespace's root.
pub fn enter_mount_namespace(ns: &OwnedFd) -> io::Result<()> {
    // SAFETY: plain system calls on integers and a descriptor we own; they change only the
    // calling thread's file-system context and namespace.
    unsafe {
        if libc::unshare(libc::CLONE_FS) != 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNS) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

// ---- network ---------------------------------------------------------------------------------

/// Sets the loopback interface up (a fresh network namespace has it down).
pub fn loopback_up() -> Res<()> {
    let step = "bring the loopback interface up";
    // SAFETY: a plain socket(2) call; the descriptor is owned at once.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(StepError::last(step));
    }
    // SAFETY: `fd` is a descriptor socket(2) just returned, owned by nobody else.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `ifreq` is plain old data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS fills the flags member of a live `ifreq` naming an interface.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } != 0 {
        return Err(StepError::last(step));
    }
    // SAFETY: the union's flags member is the one SIOCGIFFLAGS just set.
    unsafe {
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    }
    // SAFETY: SIOCSIFFLAGS reads a live `ifreq`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } != 0 {
        return Err(StepError::last(step));
    }
    Ok(())
}

/// The addresses of this host's interfaces (getifaddrs(3)); empty if they cannot be read.
pub fn interface_addresses() -> Vec<std::net::IpAddr> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs allocates a list and stores its head in `head`, freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not yet freed.
        let node = unsafe { &*cur };
        if !node.ifa_addr.is_null() {
            // SAFETY: a non-null `ifa_addr` points at a sockaddr whose family says its type.
            let family = i32::from(unsafe { (*node.ifa_addr).sa_family });
            if family == libc::AF_INET {
                // SAFETY: an AF_INET address is a `sockaddr_in`.
                let sin = unsafe { &*(node.ifa_addr as *const libc::sockaddr_in) };
                out.push(std::net::IpAddr::from(
                    u32::from_be(sin.sin_addr.s_addr).to_be_bytes(),
                ));
            } else if family == libc::AF_INET6 {
                // SAFETY: an AF_INET6 address is a `sockaddr_in6`.
                let sin6 = unsafe { &*(node.ifa_addr as *const libc::sockaddr_in6) };
                out.push(std::net::IpAddr::from(sin6.sin6_addr.s6_addr));
            }
        }
        cur = node.ifa_next;
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

// ---- processes and namespaces ---------------------------------------------------------------

/// fork(2) as a raw `clone` with namespace flags: 0 in the child, the child's pid in the parent.
/// Only for a single-threaded caller: no `atfork` handlers run.
pub fn fork_with(step: &str, flags: libc::c_int) -> Res<libc::pid_t> {
    // SAFETY: clone without CLONE_VM and with a null stack duplicates the process as fork does;
    // the caller is single-threaded, so the child's copy of the heap and locks is consistent.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (flags | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    check(step, rc).map(|pid| pid as libc::pid_t)
}

/// unshare(2).
pub fn unshare(step: &str, flags: libc::c_int) -> Res<()> {
    // SAFETY: a plain system call on integers.
    check(step, unsafe { libc::unshare(flags) }.into()).map(drop)
}

/// Asks for `signal` when the parent dies.
pub fn set_parent_death_signal(signal: libc::c_int) -> Res<()> {
    // SAFETY: a plain prctl on integers.
    let rc = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, signal as libc::c_ulong, 0, 0, 0) };
    check("PR_SET_PDEATHSIG", rc.into()).map(drop)
}

/// Sets `signal`'s disposition to ignored (`ignore`) or the default.
pub fn set_signal_ignored(signal: libc::c_int, ignore: bool) {
    let handler = if ignore { libc::SIG_IGN } else { libc::SIG_DFL };
    // SAFETY: installing SIG_IGN or SIG_DFL runs no code of ours.
    unsafe { libc::signal(signal, handler) };
}

/// Makes a user namespace for this process and maps `uid` and `gid` (its own) to themselves in
/// it, `setgroups` denied: what an unprivileged process may write (a session's holder, the
/// probe's child, a non-root `serve`).
pub fn enter_user_namespace(uid: u32, gid: u32) -> Res<()> {
    unshare("make a user namespace", libc::CLONE_NEWUSER)?;
    let write = |file: &str, text: String| {
        std::fs::write(format!("/proc/self/{file}"), text).map_err(|e| {
            StepError::new(
                format!("write /proc/self/{file}"),
                e.raw_os_error().unwrap_or(libc::EIO),
            )
        })
    };
    write("uid_map", format!("{uid} {uid} 1\n"))?;
    write("setgroups", "deny".to_owned())?;
    write("gid_map", format!("{gid} {gid} 1\n"))
}

/// Set once this process is in a user namespace of its own ([`enter_own_user_namespace`]).
static OWN_USER_NAMESPACE: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Moves this non-root, single-threaded, still dumpable process into a user namespace of its
/// own that maps its uid and gid to themselves (`podhost serve` with a workspace template, see
/// `main`). It then holds capabilities over the user namespaces its sessions' holders make
/// (children of this one, which its uid owns), and in its own: a thread of it may join a
/// session's mount namespace (`setns` asks `CAP_SYS_ADMIN` over the namespace's owner and
/// `CAP_SYS_CHROOT` in the caller's), so its file tools reach a session's overlay. Nothing of
/// the host changes for it: every id outside the map stays unmapped (files of other users are
/// read as before, never owned), and checks against the host's namespaces (its network, its
/// mounts) see the same unprivileged user. Where the kernel refuses the namespace, the process
/// stays where it was (and sessions get no overlay, as before).
pub fn enter_own_user_namespace() -> std::io::Result<()> {
    let (uid, gid) = (nix::unistd::geteuid(), nix::unistd::getegid());
    if uid.is_root() {
        return Err(std::io::Error::other("podhost is root: it needs none"));
    }
    enter_user_namespace(uid.as_raw(), gid.as_raw())
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    OWN_USER_NAMESPACE.store(true, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

/// Whether this process entered a user namespace of its own ([`enter_own_user_namespace`]).
pub fn in_own_user_namespace() -> bool {
    OWN_USER_NAMESPACE.load(std::sync::atomic::Ordering::Relaxed)
}

/// Closes every descriptor from `first` up.
pub fn close_from(first: RawFd) {
    // SAFETY: close_range only closes descriptors; the caller owns none of them any more.
    unsafe {
        libc::syscall(libc::SYS_close_range, first as u32, u32::MAX, 0u32);
    }
}

/// Closes every descriptor from `first` on but `keep`.
pub fn close_from_but(first: RawFd, keep: RawFd) {
    if keep < first {
        return close_from(first);
    }
    // SAFETY: close_range only closes descriptors; the caller owns none of them but `keep`.
    unsafe {
        if keep > first {
            libc::syscall(libc::SYS_close_range, first as u32, (keep - 1) as u32, 0u32);
        }
        libc::syscall(libc::SYS_close_range, (keep + 1) as u32, u32::MAX, 0u32);
    }
}

/// dup2(2).
pub fn dup2(step: &str, from: RawFd, to: RawFd) -> Res<()> {
    // SAFETY: a plain system call on descriptors; `to` is replaced by design.
    check(step, unsafe { libc::dup2(from, to) }.into()).map(drop)
}

/// waitpid(2), retrying on EINTR: (pid, raw status).
pub fn wait(pid: libc::pid_t, flags: libc::c_int) -> Res<(libc::pid_t, libc::c_int)> {
    loop {
        let mut status = 0;
        // SAFETY: `status` is writable.
        let rc = unsafe { libc::waitpid(pid, &mut status, flags) };
        if rc < 0 && errno() == libc::EINTR {
            continue;
        }
        return check("waitpid", rc.into()).map(|p| (p as libc::pid_t, status));
    }
}

/// SIGKILL to `pid`.
pub fn kill_now(pid: libc::pid_t) {
    // SAFETY: a plain system call on integers.
    unsafe { libc::kill(pid, libc::SIGKILL) };
}

/// The read-only segments (code and constants) of this program and of its libraries, as
/// page-aligned (start, length) ranges: a forked child faults their pages in again one by one
/// (a fork copies no page-table entry of a file mapping the parent never wrote), unless it maps
/// them at once ([`populate`]).
pub fn read_only_segments() -> Vec<(usize, usize)> {
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: `data` is the vector passed below, alive for the whole iteration, and `info`
        // describes one loaded object, valid during this call; its program headers are
        // `dlpi_phnum` entries at `dlpi_phdr`.
        unsafe {
            let out = &mut *data.cast::<Vec<(usize, usize)>>();
            let info = &*info;
            let page = page_size();
            for i in 0..usize::from(info.dlpi_phnum) {
                let ph = &*info.dlpi_phdr.add(i);
                if ph.p_type != libc::PT_LOAD || ph.p_flags & libc::PF_W != 0 || ph.p_memsz == 0 {
                    continue;
                }
                let start = (info.dlpi_addr as usize).wrapping_add(ph.p_vaddr as usize);
                let end = start.saturating_add(ph.p_memsz as usize);
                let start = start & !(page - 1);
                let end = end.saturating_add(page - 1) & !(page - 1);
                out.push((start, end - start));
            }
        }
        0
    }
    let mut out: Vec<(usize, usize)> = Vec::new();
    // SAFETY: `each` only reads what the loader hands it and pushes onto `out`, which outlives
    // the call.
    unsafe {
        libc::dl_iterate_phdr(Some(each), (&raw mut out).cast());
    }
    out
}

/// The page size.
fn page_size() -> usize {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    // SAFETY: sysconf reads a constant of the system.
    *PAGE.get_or_init(|| {
        usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096)
    })
}

/// Maps `ranges` of this process's file mappings into its page tables now
/// (`MADV_POPULATE_READ`, Linux 5.14): one system call per range instead of a page fault per
/// page at first use. Best effort: where the kernel refuses, the pages fault in as before.
pub fn populate(ranges: &[(usize, usize)]) {
    for &(start, len) in ranges {
        // SAFETY: madvise with MADV_POPULATE_READ only fills page tables for the range (or fails
        // on what is not mapped); it changes no memory.
        unsafe {
            libc::madvise(start as *mut libc::c_void, len, libc::MADV_POPULATE_READ);
        }
    }
}

/// Ends the process at once (no destructors, no atexit handlers: right for a forked child).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and runs nothing of the process's own.
    unsafe { libc::_exit(code) }
}

// ---- pidfds -----------------------------------------------------------------------------------

/// pidfd_open(2).
pub fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: a plain system call on integers; it returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor the kernel just gave us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// pidfd_send_signal(2); whether the signal was sent.
pub fn pidfd_send_signal(fd: &OwnedFd, signal: libc::c_int) -> bool {
    // SAFETY: a valid pidfd, a signal number and a null siginfo ("as kill(2) would").
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    rc == 0
}

/// The pid, in this process's PID namespace, of the process a pidfd refers to (from
/// `/proc/self/fdinfo`); `None` once it has been reaped, or if it is not visible here.
pub fn pidfd_pid(fd: &OwnedFd) -> Option<i32> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).ok()?;
    let pid: i32 = info
        .lines()
        .find_map(|l| l.strip_prefix("Pid:"))?
        .trim()
        .parse()
        .ok()?;
    (pid > 0).then_some(pid)
}

/// Registers `fd` with the tokio reactor for `interest`.
pub fn async_fd(
    fd: OwnedFd,
    interest: tokio::io::Interest,
) -> io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: an OwnedFd's `as_raw_fd` always returns the one descriptor it owns, which stays
    // open (and the same file description) until the AsyncFd, which owns it, drops it.
    Ok(unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, interest) }?)
}

// ---- descriptor passing -----------------------------------------------------------------------

/// The most descriptors one message carries.
pub const MAX_FDS: usize = 4;

/// Sends `data` with `fds` (`SCM_RIGHTS`) on a Unix socket.
pub fn send_with_fds(sock: RawFd, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let mut control = [0u64; 8];
    // SAFETY: an all-zero msghdr is valid (no name, no buffers).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let bytes = std::mem::size_of_val(fds);
        // SAFETY: CMSG_SPACE only computes a size.
        let space = unsafe { libc::CMSG_SPACE(bytes as u32) } as usize;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: `control` (64 bytes, 8-aligned) holds one header and up to MAX_FDS
        // descriptors, so the first header and its data lie inside it.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(bytes as u32) as usize;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(c).cast::<RawFd>(),
                fds.len(),
            );
        }
    }
    loop {
        // SAFETY: `msg` points at live buffers for the whole call.
        let rc = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
        if rc >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Receives one message into `buf` and up to [`MAX_FDS`] descriptors (close-on-exec). `Ok((0,
/// []))` is the end of the stream.
pub fn recv_with_fds(sock: RawFd, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control = [0u64; 8];
    // SAFETY: an all-zero msghdr is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    let n = loop {
        // SAFETY: `msg` points at live, writable buffers of the sizes it states.
        let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel wrote into `control`, within the length it
    // reported; each SCM_RIGHTS payload is an array of descriptors now owned by this process.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                    / std::mem::size_of::<RawFd>();
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::other(
            "a message carried more descriptors than expected",
        ));
    }
    Ok((n, fds))
}

/// A pipe, both ends close-on-exec: (read, write).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` is writable storage for two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: two descriptors the kernel just gave us.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Whether this process has one thread (field 20 of `/proc/self/stat`); `false` when it cannot
/// tell.
pub fn single_threaded() -> bool {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return false;
    };
    threads_in(&stat) == Some(1)
}

/// The thread count of a `/proc/<pid>/stat` line.
fn threads_in(stat: &str) -> Option<u32> {
    // The command name (field 2) may hold spaces and parentheses: count from its closing one.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_ascii_whitespace().nth(17)?.parse().ok()
}

/// A `SOCK_SEQPACKET` Unix socket pair, close-on-exec.
pub fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` is writable storage for two descriptors.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: two descriptors the kernel just gave us.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Writes all of `buf` to `fd` (a pipe or socket), giving up on an error.
pub fn write_all(fd: RawFd, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: `buf` is live for the call; the kernel only reads it.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}

/// Reads one byte from `fd` (a pipe), waiting for it; `None` at the end of the pipe.
pub fn read_byte(fd: RawFd) -> io::Result<Option<u8>> {
    let mut byte = 0u8;
    loop {
        // SAFETY: one writable byte, live for the call.
        let n = unsafe { libc::read(fd, (&raw mut byte).cast(), 1) };
        match n {
            1 => return Ok(Some(byte)),
            0 => return Ok(None),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
}

/// Detaches the mount at `path` (`umount2` with `MNT_DETACH`).
pub fn unmount_detached(path: &CStr) -> io::Result<()> {
    // SAFETY: a NUL-terminated path, live for the call.
    if unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The two words a process beside this one writes on a pipe (`nsinit`'s report, `ahead`'s
/// failure: two `i32`s in the machine's order), once read; `Err` with how many bytes came when
/// the pipe ended before all eight did.
pub fn read_two_words(fd: RawFd) -> io::Result<Result<[i32; 2], usize>> {
    let mut bytes = [0u8; 8];
    let n = read_exact_or_end(fd, &mut bytes)?;
    if n < bytes.len() {
        return Ok(Err(n));
    }
    let word = |i: usize| i32::from_ne_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
    Ok(Ok([word(0), word(4)]))
}

/// Reads from `fd` (a pipe) until `buf` is full or the pipe ends; how much was read.
pub fn read_exact_or_end(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: the rest of `buf` is writable and live for the call.
        let n = unsafe { libc::read(fd, buf[got..].as_mut_ptr().cast(), buf.len() - got) };
        match n {
            0 => break,
            n if n > 0 => got += n as usize,
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(got)
}

/// The events pending on `fd` now (`poll` with a zero timeout); 0 for none.
pub fn poll_now(fd: RawFd, events: libc::c_short) -> libc::c_short {
    poll_for(fd, events, std::time::Duration::ZERO)
}

/// Waits up to `timeout` for `events` on `fd`; the events pending then (0 for none).
pub fn poll_for(fd: RawFd, events: libc::c_short, timeout: std::time::Duration) -> libc::c_short {
    let mut pfd = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // Rounded up, so a wait never ends just before its deadline.
    let ms = libc::c_int::try_from(timeout.as_micros().div_ceil(1000)).unwrap_or(libc::c_int::MAX);
    // SAFETY: one live pollfd.
    let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
    if rc > 0 { pfd.revents } else { 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_thread_count_is_read_after_the_command_name() {
        // A command name may hold spaces and parentheses.
        let stat = "4242 (a) b (c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 7 0 99 0";
        assert_eq!(threads_in(stat), Some(7));
        assert_eq!(threads_in("4242 (cut"), None);
        // The test harness runs each test on a thread of its own.
        assert!(!single_threaded());
    }

    #[test]
    fn the_read_only_segments_hold_this_programs_code_and_map_at_once() {
        let segments = read_only_segments();
        let page = page_size();
        assert!(
            segments
                .iter()
                .all(|&(start, len)| start % page == 0 && len % page == 0 && len > 0),
            "{segments:x?}"
        );
        let here =
            the_read_only_segments_hold_this_programs_code_and_map_at_once as *const () as usize;
        assert!(
            segments
                .iter()
                .any(|&(start, len)| (start..start + len).contains(&here)),
            "{here:x} in none of {segments:x?}"
        );
        // Every page of the segment is in this process's page tables afterwards: its entry in
        // `/proc/self/pagemap` has the present bit (63), readable without privilege.
        populate(&segments);
        let (start, len) = *segments
            .iter()
            .find(|&&(start, len)| (start..start + len).contains(&here))
            .unwrap();
        let mut entries = vec![0u8; len / page * 8];
        let pagemap = std::fs::File::open("/proc/self/pagemap").unwrap();
        std::os::unix::fs::FileExt::read_exact_at(
            &pagemap,
            &mut entries,
            (start / page * 8) as u64,
        )
        .unwrap();
        let absent = entries
            .chunks_exact(8)
            .filter(|e| u64::from_ne_bytes((*e).try_into().unwrap()) >> 63 == 0)
            .count();
        assert_eq!(absent, 0, "of {} pages", len / page);
    }
}

/// The kernel's version-3 capability header and two 32-bit words per set (`capget`, `capset`).
#[repr(C)]
pub struct CapHeader {
    pub version: u32,
    pub pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CapData {
    pub effective: u32,
    pub permitted: u32,
    pub inheritable: u32,
}

pub const CAP_V3: u32 = 0x2008_0522;

/// The calling thread's effective capability set, one bit per capability number (as `CapEff`
/// in `/proc/self/status`, without reading it).
pub fn effective_capabilities() -> io::Result<u64> {
    let [low, high] = capget()?;
    Ok(u64::from(high.effective) << 32 | u64::from(low.effective))
}

/// The calling thread's capability sets.
#[allow(unsafe_code)]
pub fn capget() -> io::Result<[CapData; 2]> {
    let mut header = CapHeader {
        version: CAP_V3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget fills two `CapData` words for a version-3 header; both are live.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_capget,
            &mut header as *mut CapHeader,
            data.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(data)
}
