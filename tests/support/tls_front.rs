//! A private CA made in the test, and a TLS front that serves a fake peer (core, the gates, a
//! model server) over TLS with a certificate of that CA, for `127.0.0.1` and `localhost` (or
//! the names a test gives, for a server of its own such as PostgreSQL).
//!
//! The front ends TLS and copies bytes both ways to the fake's plain address, so the fake
//! itself is unchanged and equally strict behind it.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

/// A CA that exists only for this test, and a server certificate it signed.
pub struct PrivateCa {
    /// The CA certificate, PEM: what `PODHOST_CA_FILE` names.
    pub ca_pem: String,
    /// The server certificate and its key (PKCS#8), PEM: for a server that reads them from
    /// files.
    pub cert_pem: String,
    pub key_pem: String,
    cert: CertificateDer<'static>,
    key: Vec<u8>,
}

impl PrivateCa {
    /// A CA and its certificate for `127.0.0.1` and `localhost`.
    pub fn new() -> PrivateCa {
        PrivateCa::for_names(&["127.0.0.1", "localhost"])
    }

    /// A CA and its certificate for `names` (DNS names or IP addresses).
    pub fn for_names(names: &[&str]) -> PrivateCa {
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, "podhost test CA");
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
        let key = KeyPair::generate().unwrap();
        let server =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap()
                .signed_by(&key, &ca)
                .unwrap();
        PrivateCa {
            ca_pem: ca.pem(),
            cert_pem: server.pem(),
            key_pem: key.serialize_pem(),
            cert: server.der().clone(),
            key: key.serialize_der(),
        }
    }

    /// Writes the CA certificate to `dir/ca.pem`; answers its path.
    pub fn write_ca(&self, dir: &Path) -> PathBuf {
        let path = dir.join("ca.pem");
        std::fs::write(&path, &self.ca_pem).unwrap();
        path
    }

    /// Serves TLS on a free loopback port in front of the plain `upstream`; answers the port.
    pub async fn front(&self, upstream: SocketAddr) -> u16 {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![self.cert.clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key.clone())),
            )
            .unwrap();
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    // A client that does not trust the CA ends the handshake: nothing to copy.
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let Ok(mut plain) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                });
            }
        });
        port
    }
}

/// The port of a fake's `http://127.0.0.1:<port>` URL.
pub fn addr_of(url: &str) -> SocketAddr {
    url.trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .unwrap()
}
