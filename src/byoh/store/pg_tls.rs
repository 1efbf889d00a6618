//! TLS to a PostgreSQL store: tokio-postgres's TLS traits over the one rustls configuration of
//! [`crate::floor::tls`], and what a connection string's TLS settings mean to podhost.
//!
//! Invariants:
//! * The server is verified against the one configuration's roots (the system's CA bundle
//!   plus `PODHOST_CA_FILE`, else `SSL_CERT_FILE`): its certificate chain, and that the
//!   certificate names the connection string's host (a DNS name or an IP address; `hostaddr`
//!   only says where to connect). Neither check can be turned off, so `sslmode=require` is
//!   what libpq calls `verify-full`, and libpq's `verify-ca` and `verify-full` are read as
//!   `require`.
//! * A failed handshake is an error that says why, never a plain connection: tokio-postgres
//!   goes on in plain text only under `sslmode=prefer` (the default) when the server declines
//!   TLS, and never after a certificate was refused.
//! * `tls-server-end-point` channel binding (RFC 5929) is offered, so SCRAM-SHA-256-PLUS binds
//!   the password exchange to the TLS session: the hash of the server's certificate, with the
//!   hash function of its signature algorithm (SHA-256 for MD5 and SHA-1). A signature without
//!   one hash function (Ed25519, RSASSA-PSS) offers none: SCRAM goes on without binding, unless
//!   `channel_binding=require` refuses that.
//! * ALPN offers `postgresql`, as libpq 17 does: a PostgreSQL 17 server asks for it on direct
//!   TLS (`sslnegotiation=direct`), older ones ignore it. It is the only difference from the
//!   shared configuration.
//!
//! Non-goals: client certificates, and libpq's certificate settings (`sslrootcert`, `sslcert`,
//! `sslkey`, …): a connection string that sets one is refused with an error naming
//! `PODHOST_CA_FILE`, since the trust is the one configuration's.

use std::borrow::Cow;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::ServerName;
use sha2::Digest;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};
use tokio_rustls::TlsConnector;

/// Makes the TLS side of the store's connections (the pool's, the migration's, the
/// cancellation listener's). Cheap to clone.
#[derive(Clone)]
pub(super) struct MakeRustls {
    connector: TlsConnector,
}

impl MakeRustls {
    /// A connector trusting what `shared` trusts, offering PostgreSQL's ALPN.
    pub(super) fn new(shared: &Arc<rustls::ClientConfig>) -> MakeRustls {
        let mut config = rustls::ClientConfig::clone(shared);
        config.alpn_protocols = vec![b"postgresql".to_vec()];
        MakeRustls {
            connector: TlsConnector::from(Arc::new(config)),
        }
    }
}

impl<S> MakeTlsConnect<S> for MakeRustls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type TlsConnect = RustlsConnect;
    type Error = Infallible;

    /// `host` is empty for a Unix socket, where no TLS is spoken: a name that cannot be
    /// checked is an error only once a handshake needs it.
    fn make_tls_connect(&mut self, host: &str) -> Result<RustlsConnect, Infallible> {
        Ok(RustlsConnect {
            connector: self.connector.clone(),
            host: host.to_owned(),
        })
    }
}

/// One connection's handshake, with the host its certificate must name.
pub(super) struct RustlsConnect {
    connector: TlsConnector,
    host: String,
}

impl<S> TlsConnect<S> for RustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type Error = PgTlsError;
    type Future = Pin<Box<dyn Future<Output = Result<RustlsStream<S>, PgTlsError>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let name = ServerName::try_from(self.host.clone())
                .map_err(|_| PgTlsError::Name(self.host.clone()))?;
            let tls = self
                .connector
                .connect(name, stream)
                .await
                .map_err(|e| handshake_error(&self.host, e))?;
            Ok(RustlsStream(tls))
        })
    }
}

/// Why a TLS connection to the store failed. What tokio-postgres prints after "error
/// performing TLS handshake: ".
#[derive(Debug, thiserror::Error)]
pub(super) enum PgTlsError {
    #[error("{0:?} is not a host name or IP address a certificate can be checked against")]
    Name(String),
    #[error(
        "the certificate of {host} is not trusted ({why}): podhost trusts the system's CA \
         bundle and the CA file of PODHOST_CA_FILE (--ca-file, or SSL_CERT_FILE); name the \
         server's CA there"
    )]
    Untrusted { host: String, why: String },
    #[error(
        "the certificate of {host} does not name it ({why}): connect by a name the \
         certificate holds"
    )]
    WrongName { host: String, why: String },
    #[error("the certificate of {host} was refused: {why}")]
    Refused { host: String, why: String },
    #[error("the TLS handshake with {host} failed: {why}")]
    Handshake { host: String, why: String },
}

/// The handshake's error as a person reads it: a refused certificate says which check failed
/// and what to change.
fn handshake_error(host: &str, e: io::Error) -> PgTlsError {
    use rustls::CertificateError as C;
    let host = host.to_owned();
    let why = e.to_string();
    match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
        Some(rustls::Error::InvalidCertificate(c)) => match c {
            C::UnknownIssuer => PgTlsError::Untrusted { host, why },
            C::NotValidForName | C::NotValidForNameContext { .. } => {
                PgTlsError::WrongName { host, why }
            }
            _ => PgTlsError::Refused { host, why },
        },
        _ => PgTlsError::Handshake { host, why },
    }
}

/// A TLS connection to the store.
pub(super) struct RustlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for RustlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        let (_, session) = self.0.get_ref();
        session
            .peer_certificates()
            .and_then(<[_]>::first)
            .and_then(|cert| end_point(cert.as_ref()))
            .map_or_else(ChannelBinding::none, ChannelBinding::tls_server_end_point)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// The `tls-server-end-point` binding of a certificate (DER): its hash with the hash function
/// of its signature algorithm, SHA-256 for MD5 and SHA-1 (RFC 5929, section 4.1); `None` for
/// an algorithm without one hash function, or a certificate that cannot be read.
fn end_point(cert: &[u8]) -> Option<Vec<u8>> {
    const SEQUENCE: u8 = 0x30;
    const OID: u8 = 0x06;
    // Certificate ::= SEQUENCE { tbsCertificate, signatureAlgorithm AlgorithmIdentifier, … }
    // AlgorithmIdentifier ::= SEQUENCE { algorithm OBJECT IDENTIFIER, parameters ANY OPTIONAL }
    let (cert_body, _) = element(cert, SEQUENCE)?;
    let (_tbs, after_tbs) = element(cert_body, SEQUENCE)?;
    let (algorithm, _) = element(after_tbs, SEQUENCE)?;
    let (oid, _) = element(algorithm, OID)?;
    const RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01]; // 1.2.840.113549.1.1
    const ECDSA: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04]; // 1.2.840.10045.4
    const ECDSA_SHA2: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03]; // 1.2.840.10045.4.3
    let (&last, prefix) = oid.split_last()?;
    let hash = match (prefix, last) {
        // {md5,sha1,sha256}WithRSAEncryption, ecdsa-with-SHA1, ecdsa-with-SHA256
        (RSA, 0x04 | 0x05 | 0x0b) | (ECDSA, 0x01) | (ECDSA_SHA2, 0x02) => {
            sha2::Sha256::digest(cert).to_vec()
        }
        (RSA, 0x0e) | (ECDSA_SHA2, 0x01) => sha2::Sha224::digest(cert).to_vec(),
        (RSA, 0x0c) | (ECDSA_SHA2, 0x03) => sha2::Sha384::digest(cert).to_vec(),
        (RSA, 0x0d) | (ECDSA_SHA2, 0x04) => sha2::Sha512::digest(cert).to_vec(),
        _ => return None,
    };
    Some(hash)
}

/// The content of the DER element of type `tag` at the start of `der`, and what follows it.
fn element(der: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&found, rest) = der.split_first()?;
    if found != tag {
        return None;
    }
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        // The long form: the low bits say how many length bytes follow (at most 4 here).
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let (bytes, rest) = rest.split_at(n);
        let len = bytes
            .iter()
            .fold(0usize, |len, &b| (len << 8) | usize::from(b));
        (len, rest)
    };
    (len <= rest.len()).then(|| rest.split_at(len))
}

/// A TLS setting of a connection string podhost cannot honour.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TlsRefusal {
    #[error(
        "asks for sslmode=allow (plain text unless the server insists on TLS), which podhost \
         does not offer: use sslmode=prefer (TLS when the server offers it; the default), \
         require (TLS, verified) or disable (plain text)"
    )]
    Allow,
    /// An `ssl…` key podhost does not read (the key, as written).
    #[error(
        "sets {0}, which podhost does not read: the server's certificate is checked against \
         the system's CA bundle and PODHOST_CA_FILE (--ca-file), and podhost sends no client \
         certificate"
    )]
    Unread(String),
}

/// The connection string as tokio-postgres is to read it, and whether it asked for libpq's
/// `verify-ca` or `verify-full` (which tokio-postgres refuses: the caller sets `require`, which
/// here verifies as much). An error says why podhost cannot honour a TLS setting.
pub(super) fn tls_settings(url: &str) -> Result<(Cow<'_, str>, bool), TlsRefusal> {
    let url_form = url.starts_with("postgres://") || url.starts_with("postgresql://");
    let params: Vec<(String, String)> = if url_form {
        url.split_once('?')
            .map(|(_, query)| query_params(query))
            .unwrap_or_default()
    } else {
        match key_values(url) {
            Some(kv) => kv,
            // tokio-postgres says what is wrong with it.
            None => return Ok((Cow::Borrowed(url), false)),
        }
    };
    let mut verify = false;
    for (key, value) in &params {
        match (key.as_str(), value.as_str()) {
            ("sslmode", "verify-ca" | "verify-full") => verify = true,
            ("sslmode", "allow") => {
                return Err(TlsRefusal::Allow);
            }
            ("sslmode", _) => verify = false,
            ("sslnegotiation", _) => {}
            (key, _) if key.starts_with("ssl") => {
                return Err(TlsRefusal::Unread(key.to_owned()));
            }
            _ => {}
        }
    }
    let is_verify = |k: &str, v: &str| k == "sslmode" && v.starts_with("verify-");
    if !params.iter().any(|(k, v)| is_verify(k, v)) {
        return Ok((Cow::Borrowed(url), false));
    }
    // Without the verify-* modes; a later sslmode still overrides an earlier one.
    let readable = if url_form {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let kept: Vec<&str> = query
            .split('&')
            .filter(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                !is_verify(k, v)
            })
            .collect();
        if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        }
    } else {
        params
            .iter()
            .filter(|(k, v)| !is_verify(k, v))
            .map(|(k, v)| format!("{k}='{}'", v.replace('\\', "\\\\").replace('\'', "\\'")))
            .collect::<Vec<_>>()
            .join(" ")
    };
    Ok((Cow::Owned(readable), verify))
}

/// A URL's query parameters, as written (tokio-postgres percent-decodes them; the settings
/// looked at here need no escaping).
fn query_params(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

/// A libpq key=value string's settings, read as tokio-postgres reads them (whitespace around
/// `=`, single-quoted values, backslash escapes); `None` if it is not one.
fn key_values(s: &str) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    let mut it = s.chars().peekable();
    loop {
        while it.next_if(|c| c.is_whitespace()).is_some() {}
        let mut key = String::new();
        while let Some(c) = it.next_if(|c| !c.is_whitespace() && *c != '=') {
            key.push(c);
        }
        if key.is_empty() {
            return (it.peek().is_none()).then_some(out);
        }
        while it.next_if(|c| c.is_whitespace()).is_some() {}
        it.next_if_eq(&'=')?;
        while it.next_if(|c| c.is_whitespace()).is_some() {}
        let quoted = it.next_if_eq(&'\'').is_some();
        let mut value = String::new();
        loop {
            match it.next() {
                Some('\'') if quoted => break,
                Some(c) if !quoted && c.is_whitespace() => break,
                Some('\\') => value.push(it.next()?),
                Some(c) => value.push(c),
                None if quoted => return None,
                None => break,
            }
        }
        out.push((key, value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use rcgen::{CertificateParams, KeyPair, SignatureAlgorithm};

    fn self_signed(alg: &'static SignatureAlgorithm) -> Vec<u8> {
        let key = KeyPair::generate_for(alg).unwrap();
        let params = CertificateParams::new(vec!["db.example".to_owned()]).unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn the_end_point_hash_follows_the_signature_algorithm() {
        let p256 = self_signed(&rcgen::PKCS_ECDSA_P256_SHA256);
        assert_eq!(end_point(&p256), Some(sha2::Sha256::digest(&p256).to_vec()));
        let p384 = self_signed(&rcgen::PKCS_ECDSA_P384_SHA384);
        assert_eq!(end_point(&p384), Some(sha2::Sha384::digest(&p384).to_vec()));
        assert_eq!(end_point(&self_signed(&rcgen::PKCS_ED25519)), None);
        assert_eq!(end_point(b"not a certificate"), None);
        assert_eq!(end_point(&p256[..p256.len() / 2]), None);
    }

    /// A certificate's outline: an empty tbsCertificate, then the algorithm `oid`.
    fn outline(oid: &[u8]) -> Vec<u8> {
        let mut algorithm = vec![0x30, oid.len() as u8 + 2, 0x06, oid.len() as u8];
        algorithm.extend_from_slice(oid);
        let mut cert = vec![0x30, algorithm.len() as u8 + 2, 0x30, 0x00];
        cert.extend(algorithm);
        cert
    }

    #[test]
    fn rsa_and_sha1_signatures_hash_as_rfc_5929_says() {
        let rsa = |last: u8| outline(&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, last]);
        let len = |cert: Vec<u8>| end_point(&cert).map(|h| h.len());
        // md5, sha1 → SHA-256; sha256, sha384, sha512, sha224WithRSAEncryption.
        assert_eq!(len(rsa(0x04)), Some(32));
        assert_eq!(len(rsa(0x05)), Some(32));
        assert_eq!(len(rsa(0x0b)), Some(32));
        assert_eq!(len(rsa(0x0c)), Some(48));
        assert_eq!(len(rsa(0x0d)), Some(64));
        assert_eq!(len(rsa(0x0e)), Some(28));
        // RSASSA-PSS: the hash is in the parameters, not the algorithm.
        assert_eq!(len(rsa(0x0a)), None);
        // ecdsa-with-SHA1 → SHA-256; ecdsa-with-SHA512.
        assert_eq!(
            len(outline(&[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x01])),
            Some(32)
        );
        assert_eq!(
            len(outline(&[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x04])),
            Some(64)
        );
    }

    #[test]
    fn key_value_strings_are_read_as_tokio_postgres_reads_them() {
        assert_eq!(key_values("host=db password='it"), None);
        assert_eq!(
            key_values("host = db password='it\\'s x' user=a\\ b sslmode=verify-full"),
            Some(vec![
                ("host".into(), "db".into()),
                ("password".into(), "it's x".into()),
                ("user".into(), "a b".into()),
                ("sslmode".into(), "verify-full".into()),
            ])
        );
        assert_eq!(key_values("host"), None);
        assert_eq!(key_values("   "), Some(vec![]));
    }
}
