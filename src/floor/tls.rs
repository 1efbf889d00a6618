//! The one TLS client configuration of podhost's outgoing connections: join and renew, the
//! Harness API WebSocket, the gates, the OpenAI-compatible model client and a PostgreSQL store
//! all trust the same roots through one [`rustls::ClientConfig`].
//!
//! The roots are the system's (the first CA bundle found at the usual places: Debian's
//! `/etc/ssl/certs/ca-certificates.crt`, Fedora's `/etc/pki/tls/certs/ca-bundle.crt`, …) plus
//! an operator's CA file (`PODHOST_CA_FILE`, else `SSL_CERT_FILE`) and the directories of
//! `SSL_CERT_DIR`, so a core or a model endpoint behind a private CA is trusted without losing
//! the public ones. The system's bundle is found by its path, not through `SSL_CERT_FILE` or
//! `SSL_CERT_DIR`, which here add to it rather than replace it.
//!
//! Invariants:
//! * The crypto provider is `ring`, named here: nothing depends on a process-wide default
//!   provider being installed.
//! * A CA file that cannot be read or holds no certificate is an error naming the file and the
//!   setting, found at start-up. No root at all (no system bundle, no CA file) is only warned
//!   about: plain-HTTP peers still work.
//! * ALPN is left empty: every HTTP peer is spoken to over HTTP/1.1 (the WebSocket upgrade
//!   needs it). The PostgreSQL store's connections offer `postgresql` instead, on a copy of
//!   this configuration (`byoh::store::pg_tls`).
//!
//! Non-goals: the CA bundle a join gives for the commands' egress proxy (`exec::egress`): it
//! is for the commands, never for podhost's own connections. Client certificates.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// Where the systems podhost runs on keep their CA bundle, in the order Go's `crypto/x509`
/// looks; the first that exists is used.
const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/pki/tls/cacert.pem",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// Which roots to trust besides the system's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// A PEM file of CA certificates to trust as well, and the setting that named it (for
    /// errors): `PODHOST_CA_FILE`, `--ca-file` or `SSL_CERT_FILE`.
    pub ca_file: Option<(PathBuf, String)>,
    /// Directories of CA certificates to trust as well (`SSL_CERT_DIR`): every file in them
    /// that holds PEM certificates, as OpenSSL and `rustls-native-certs` read them.
    pub ca_dirs: Vec<PathBuf>,
}

/// Why the TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{setting} {path}: could not read the CA file: {message}")]
    CaFile {
        setting: String,
        path: PathBuf,
        message: String,
    },
    #[error("{setting} {path}: holds no PEM certificate")]
    NoCertificate { setting: String, path: PathBuf },
    #[error("the TLS configuration is invalid: {0}")]
    Rustls(String),
}

/// The shared client configuration: the system's roots plus the operator's CA file, with the
/// `ring` provider.
pub fn client_config(settings: &TlsSettings) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    if let Some(bundle) = SYSTEM_BUNDLES.iter().map(Path::new).find(|p| p.is_file()) {
        // A system bundle may hold a certificate rustls cannot parse; the rest still count.
        let certs = CertificateDer::pem_file_iter(bundle)
            .map(|it| it.filter_map(Result::ok).collect::<Vec<_>>())
            .unwrap_or_default();
        let (added, ignored) = roots.add_parsable_certificates(certs);
        tracing::debug!(bundle = %bundle.display(), added, ignored, "system CA bundle");
    }
    for dir in &settings.ca_dirs {
        let (added, ignored) = roots.add_parsable_certificates(certificates_in(dir));
        tracing::debug!(dir = %dir.display(), added, ignored, "SSL_CERT_DIR");
    }
    if let Some((path, setting)) = &settings.ca_file {
        let file_err = |message: String| TlsError::CaFile {
            setting: setting.clone(),
            path: path.clone(),
            message,
        };
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(|e| file_err(pem_error(e)))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| file_err(pem_error(e)))?;
        if certs.is_empty() {
            return Err(TlsError::NoCertificate {
                setting: setting.clone(),
                path: path.clone(),
            });
        }
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| file_err(format!("a certificate is not a valid CA: {e}")))?;
        }
    }
    if roots.is_empty() {
        // Plain-HTTP peers (a model server on the pod network) still work; every TLS one
        // would fail with an unknown issuer, so say why now.
        tracing::warn!(
            "no CA certificate to trust: no system bundle (such as {}) and no CA file \
             (PODHOST_CA_FILE, SSL_CERT_FILE or SSL_CERT_DIR); TLS connections (HTTPS, a PostgreSQL store's) \
             will fail",
            SYSTEM_BUNDLES[0]
        );
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Rustls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// The PEM certificates of every file in `dir` (links followed, each file once); a directory
/// that cannot be read is warned about, as a file holding no certificate is skipped (an
/// OpenSSL directory may hold CRLs and other files).
fn certificates_in(dir: &Path) -> Vec<CertificateDer<'static>> {
    use std::os::unix::fs::MetadataExt;
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "SSL_CERT_DIR: cannot read");
            return Vec::new();
        }
    };
    let mut seen = std::collections::HashSet::new();
    let mut certs = Vec::new();
    for path in entries.flatten().map(|e| e.path()) {
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if meta.is_file()
            && seen.insert((meta.dev(), meta.ino()))
            && let Ok(found) = CertificateDer::pem_file_iter(&path)
        {
            certs.extend(found.filter_map(Result::ok));
        }
    }
    certs
}

/// A PEM reading error as a person reads it: an I/O error as the system says it.
fn pem_error(e: rustls::pki_types::pem::Error) -> String {
    match e {
        rustls::pki_types::pem::Error::Io(io) => io.to_string(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn a_missing_or_empty_ca_file_is_named_with_its_setting() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.pem");
        let err = client_config(&TlsSettings {
            ca_file: Some((missing.clone(), "PODHOST_CA_FILE".into())),
            ..TlsSettings::default()
        })
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "PODHOST_CA_FILE {}: could not read the CA file: No such file or directory (os error 2)",
                missing.display()
            )
        );
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let err = client_config(&TlsSettings {
            ca_file: Some((empty.clone(), "--ca-file".into())),
            ..TlsSettings::default()
        })
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("--ca-file {}: holds no PEM certificate", empty.display())
        );
    }
}
