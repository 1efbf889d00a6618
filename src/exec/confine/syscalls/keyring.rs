//! The session keyring a session holder (or, without one, a command's supervisor) joins before
//! it starts commands.
//!
//! The user keyring (`@u`) belongs to a uid and outlives every process: without a filter a
//! command could leave a key there for a later session of the same uid, or read one. The filter
//! refuses every keyring call; on top, a session holder (or the supervisor of a command that has
//! none) joins a new anonymous session keyring (`KEYCTL_JOIN_SESSION_KEYRING` with no name)
//! before it starts a command, so that a command's `@s` is never podhost's or another
//! session's; the keyring's rights are its possessors' alone, so another session of the same uid
//! cannot even see it in `/proc/keys`. Where the kernel has no keyrings, or a filter around
//! podhost refuses `keyctl`, there is nothing to join and nothing a command could reach. Any
//! other failure to join (the uid's key quota, `kernel.keys.maxkeys`, exhausted) fails the
//! session or the command with the reason, never running it with podhost's keyring.
//!
//! Invariants: joining is two system calls (safe in a child forked from a single-threaded
//! process); the probe changes nothing.

use std::io;
use std::sync::OnceLock;

pub(super) const KEYCTL_GET_KEYRING_ID: libc::c_long = 0;
const KEYCTL_JOIN_SESSION_KEYRING: libc::c_long = 1;
const KEYCTL_SETPERM: libc::c_long = 5;
const KEY_SPEC_THREAD_KEYRING: libc::c_long = -1;
const KEY_SPEC_SESSION_KEYRING: libc::c_long = -3;
/// Every right for the keyring's possessors, none for its user, group or others.
const KEY_POS_ALL: libc::c_long = 0x3f00_0000;

/// Whether an error of `keyctl` means this process cannot use keyrings at all: the kernel has
/// none (`ENOSYS`), or a filter around podhost refuses the call (`EPERM`, Docker's answer) —
/// and then every command, which inherits that filter, cannot either.
fn no_keyrings(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM))
}

/// Whether this process can use keyrings (see [`no_keyrings`]). Asked once, with a call that
/// changes nothing (the thread keyring's id, not created).
#[allow(unsafe_code)]
pub fn keyrings_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        // SAFETY: keyctl on integers only; with `create` 0 it makes no keyring.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_keyctl,
                KEYCTL_GET_KEYRING_ID,
                KEY_SPEC_THREAD_KEYRING,
                0 as libc::c_long,
            )
        };
        rc >= 0 || !no_keyrings(&io::Error::last_os_error())
    })
}

/// Joins a new anonymous session keyring, which every process this one starts inherits, and
/// leaves it to its possessors alone (not even its id is shown to other processes of the same
/// uid in `/proc/keys`): `Ok(true)`, or `Ok(false)` where there is none to join (see
/// [`no_keyrings`]). Two system calls: safe in a child forked from a single-threaded process.
#[allow(unsafe_code)]
pub fn join_session_keyring() -> io::Result<bool> {
    // SAFETY: keyctl with a null name pointer (an anonymous keyring); it reads no memory.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_keyctl,
            KEYCTL_JOIN_SESSION_KEYRING,
            std::ptr::null::<libc::c_char>(),
        )
    };
    if rc < 0 {
        let e = io::Error::last_os_error();
        return if no_keyrings(&e) { Ok(false) } else { Err(e) };
    }
    // SAFETY: keyctl on integers only.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_keyctl,
            KEYCTL_SETPERM,
            KEY_SPEC_SESSION_KEYRING,
            KEY_POS_ALL,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each join gives the thread a new session keyring (keyrings are per thread, so a thread of
    /// its own keeps the test process's as it was).
    #[test]
    #[allow(unsafe_code)]
    fn each_join_makes_a_new_session_keyring() {
        let ids = std::thread::spawn(|| {
            // SAFETY: keyctl on integers; with `create` 0 it makes no keyring.
            let session = || unsafe {
                libc::syscall(
                    libc::SYS_keyctl,
                    KEYCTL_GET_KEYRING_ID,
                    KEY_SPEC_SESSION_KEYRING,
                    0 as libc::c_long,
                )
            };
            let before = session();
            let first = (join_session_keyring().unwrap(), session());
            let second = (join_session_keyring().unwrap(), session());
            // As this thread sees it: possessed, so listed.
            let keys = std::fs::read_to_string("/proc/keys").unwrap_or_default();
            (before, first, second, keys)
        })
        .join()
        .unwrap();
        if !keyrings_available() {
            assert_eq!((ids.1.0, ids.2.0), (false, false));
            return;
        }
        let (before, (joined, first), (again, second), keys) = ids;
        assert!(joined && again);
        assert!(first > 0 && second > 0, "{first} {second}");
        assert!(
            before != first && first != second,
            "{before} {first} {second}"
        );
        // Every right for its possessors, none for its uid, group or others.
        let line = keys
            .lines()
            .find(|l| l.starts_with(&format!("{second:08x} ")))
            .unwrap_or_else(|| panic!("{second:08x} not in /proc/keys: {keys}"));
        assert!(
            line.contains(" perm 3f000000 ") && line.contains(" _ses"),
            "{line}"
        );
    }
}
