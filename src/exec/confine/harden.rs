//! Hardening podhost's own process: non-dumpable, and secrets out of its environment (see the
//! parent module for why both, and why the supervisor stays dumpable).

use std::ffi::CString;

use super::SECRET_WORDS;

/// Whether this process is non-dumpable.
pub fn is_non_dumpable() -> bool {
    nix::sys::prctl::get_dumpable().is_ok_and(|d| !d)
}

/// What [`harden_process`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Hardened {
    pub non_dumpable: bool,
    /// Names of the secret variables removed from podhost's environment.
    pub scrubbed: Vec<String>,
}

/// Makes podhost non-dumpable and removes secret variables (`PODHOST_*` and `NYLORUN_*` names
/// holding TOKEN, KEY, SECRET, PASSWORD or CREDENTIAL, and `PODHOST_STORE`, a database URL that
/// may hold a password) from its environment, overwriting their values in place first.
///
/// Call it in `main` of every front but the supervisor, after the configuration has been read
/// and before any other thread exists (changing the environment is not thread-safe).
pub fn harden_process() -> Hardened {
    let non_dumpable = nix::sys::prctl::set_dumpable(false).is_ok();
    let names: Vec<String> = std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .filter(|k| is_secret_name(k))
        .collect();
    for name in &names {
        scrub_env(name);
    }
    Hardened {
        non_dumpable,
        scrubbed: names,
    }
}

/// Reads a secret from the environment and scrubs it (see [`harden_process`] for when this may
/// be called): for a variable a front names at run time, such as a model API key.
pub fn take_secret_env(name: &str) -> Option<String> {
    let value = std::env::var(name).ok();
    scrub_env(name);
    value
}

/// Variables that hold a secret although their names say nothing of it.
const SECRET_NAMES: [&str; 1] = ["PODHOST_STORE"];

fn is_secret_name(name: &str) -> bool {
    SECRET_NAMES.contains(&name)
        || ((name.starts_with("PODHOST_") || name.starts_with("NYLORUN_"))
            && SECRET_WORDS.iter().any(|w| name.contains(w)))
}

/// Overwrites the variable's value where it lies (in the initial block `/proc/<pid>/environ`
/// shows, for a variable podhost was started with) and removes it.
#[allow(unsafe_code)]
fn scrub_env(name: &str) {
    let Ok(c) = CString::new(name) else {
        return;
    };
    // SAFETY: single-threaded by the caller's contract, so no one else reads or writes the
    // environment meanwhile. getenv returns a pointer to the NUL-terminated value inside the
    // environment (the initial block on the stack, or a setenv allocation), which is writable;
    // its bytes are overwritten up to, not including, the NUL, so the string stays terminated.
    unsafe {
        let value = libc::getenv(c.as_ptr());
        if !value.is_null() {
            let len = libc::strlen(value);
            std::ptr::write_bytes(value, b'*', len);
        }
        std::env::remove_var(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_names() {
        for name in [
            "PODHOST_TOKEN",
            "PODHOST_MODEL_API_KEY",
            "PODHOST_STORE",
            "NYLORUN_HOST_TOKEN",
            "NYLORUN_JOIN_SECRET",
        ] {
            assert!(is_secret_name(name), "{name}");
        }
        for name in [
            "PODHOST_WORKSPACE",
            "PODHOST_STORE_PATH",
            "NYLORUN_SANDBOX_ID",
            "GITHUB_TOKEN",
            "PATH",
        ] {
            assert!(!is_secret_name(name), "{name}");
        }
    }
}
