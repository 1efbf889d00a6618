//! The egress CA bundle: the file every command's trust variables point at.
//!
//! Owns: writing `<harness root>/egress-ca-bundle.pem` — the system roots (when the image has
//! them) followed by the egress proxy's CA — atomically (temp file + rename, mode 0644), and only
//! when its content changes, so a command reading it never sees half a file.
//!
//! The variables themselves ([`CA_BUNDLE_VARS`], the proxy variables) are set by
//! [`super::env::Egress`]; this module only makes the file they name.
//!
//! Non-goals: checking the certificate (core signs it; a bad one fails the command's TLS, which
//! reports it).

use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

pub use super::env::CA_BUNDLE_VARS;

/// The bundle's file name under the harness root.
pub const BUNDLE_FILE: &str = "egress-ca-bundle.pem";

/// Where Debian-family images keep the system roots.
pub const SYSTEM_ROOTS: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Why the bundle could not be written.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("could not read the system roots {path}: {source}")]
    Roots {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("could not write the CA bundle {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The bundle's text: the system roots (if `roots` exists), a newline, then the CA.
pub fn bundle_text(roots: Option<&Path>, ca_pem: &str) -> Result<String, BundleError> {
    let mut text = String::new();
    if let Some(path) = roots {
        match std::fs::read_to_string(path) {
            Ok(s) => {
                text.push_str(s.trim_end());
                text.push('\n');
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(BundleError::Roots {
                    path: path.to_path_buf(),
                    source,
                });
            }
        }
    }
    text.push_str(ca_pem.trim_end());
    text.push('\n');
    Ok(text)
}

/// Writes the bundle into `dir` unless it already holds exactly this text. Returns its path and
/// whether it was (re)written.
pub fn write_bundle(
    dir: &Path,
    roots: Option<&Path>,
    ca_pem: &str,
) -> Result<(PathBuf, bool), BundleError> {
    let path = dir.join(BUNDLE_FILE);
    let text = bundle_text(roots, ca_pem)?;
    if std::fs::read(&path).is_ok_and(|old| old == text.as_bytes()) {
        return Ok((path, false));
    }
    let werr = |source| BundleError::Write {
        path: path.clone(),
        source,
    };
    let tmp = dir.join(format!(".{BUNDLE_FILE}.{}.tmp", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.set_permissions(std::fs::Permissions::from_mode(0o644))?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(werr(e));
    }
    Ok((path, true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn roots_then_ca_written_once_with_mode_0644() {
        let d = tempfile::tempdir().unwrap();
        let roots = d.path().join("roots.pem");
        std::fs::write(&roots, "ROOTS\n\n").unwrap();
        let (path, written) = write_bundle(d.path(), Some(&roots), "CA-1\n").unwrap();
        assert!(written);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "ROOTS\nCA-1\n");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
        assert_eq!(
            write_bundle(d.path(), Some(&roots), "CA-1").unwrap(),
            (path.clone(), false)
        );
        assert_eq!(
            write_bundle(d.path(), Some(&roots), "CA-2").unwrap(),
            (path.clone(), true)
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "ROOTS\nCA-2\n");
        // No temp file is left behind.
        let names: Vec<_> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }

    #[test]
    fn missing_system_roots_leave_the_ca_alone() {
        let d = tempfile::tempdir().unwrap();
        let (path, _) = write_bundle(d.path(), Some(&d.path().join("none")), "CA").unwrap();
        assert_eq!(std::fs::read_to_string(path).unwrap(), "CA\n");
    }
}
