//! The trust settings of podhost's outgoing TLS connections, into a [`TlsSettings`].

use std::path::PathBuf;

use clap::Args;

use super::origins::Origins;
use crate::floor::tls::TlsSettings;

/// Which CA certificates podhost trusts besides the system's, for core, the gates, the model and
/// a PostgreSQL store.
#[derive(Clone, Debug, Args)]
#[command(next_help_heading = "TLS")]
pub struct TlsArgs {
    /// A PEM file of CA certificates to trust besides the system's, for every TLS connection
    /// podhost opens (core, the gates, the model endpoint, a PostgreSQL store). Default:
    /// SSL_CERT_FILE.
    #[arg(long, env = "PODHOST_CA_FILE")]
    pub ca_file: Option<PathBuf>,
    /// OpenSSL's variable for such a file; here it adds to the system's roots.
    #[arg(long = "ssl-cert-file", env = "SSL_CERT_FILE", hide = true)]
    pub ssl_cert_file: Option<PathBuf>,
    /// OpenSSL's variable for directories of CA certificates (`:`-separated); here they add to
    /// the system's roots.
    #[arg(
        long = "ssl-cert-dir",
        env = "SSL_CERT_DIR",
        hide = true,
        value_delimiter = ':'
    )]
    pub ssl_cert_dir: Vec<PathBuf>,
}

impl TlsArgs {
    /// The settings, each file named by the flag or variable it came from; pure.
    pub fn settings(&self, origins: &Origins) -> TlsSettings {
        let named = |path: &PathBuf, var: &str| (path.clone(), origins.name(var));
        let ca_file = match (&self.ca_file, &self.ssl_cert_file) {
            (Some(p), _) if !p.as_os_str().is_empty() => Some(named(p, "PODHOST_CA_FILE")),
            (_, Some(p)) if !p.as_os_str().is_empty() => Some(named(p, "SSL_CERT_FILE")),
            _ => None,
        };
        let ca_dirs = self
            .ssl_cert_dir
            .iter()
            .filter(|d| !d.as_os_str().is_empty())
            .cloned()
            .collect();
        TlsSettings { ca_file, ca_dirs }
    }
}
