//! TLS to a PostgreSQL store, against a real cluster that takes TLS connections only (its
//! certificate from a private CA made here; plain TCP rejected by `pg_hba.conf`): `require`,
//! `prefer` and `verify-full` connect with the CA in `PODHOST_CA_FILE` and every connection of
//! the store is TLS (the server's `pg_stat_ssl` says so); an untrusted certificate, one for
//! another name, and `sslmode=disable` stop the start with an error that says why and never
//! holds the password.

use std::sync::OnceLock;
use std::time::Instant;

use pretty_assertions::assert_eq;
use reqwest::StatusCode;
use serde_json::json;

use crate::harness::{Options, Serve, T, start, status_obj};
use crate::openai_fake::{FakeModel, Reply};
use crate::pg::{self, APP_PASSWORD, TestPg};
use crate::store_config::refused;
use crate::tls_front::PrivateCa;

/// A TLS cluster and the CA of its certificate (for `127.0.0.1` and `localhost`).
struct TlsCluster {
    ca: PrivateCa,
    pg: TestPg,
}

/// The TLS cluster of this test process, started on first use; `None` (after saying so)
/// without PostgreSQL outside CI.
fn cluster() -> Option<&'static TlsCluster> {
    static CLUSTER: OnceLock<Option<TlsCluster>> = OnceLock::new();
    if !pg::installed() {
        pg::say_skipped();
        return None;
    }
    CLUSTER
        .get_or_init(|| {
            let ca = PrivateCa::new();
            let pg = TestPg::start_tls(&ca.cert_pem, &ca.key_pem)?;
            Some(TlsCluster { ca, pg })
        })
        .as_ref()
}

/// The database's name in its URL.
fn db_name(url: &str) -> &str {
    url.rsplit('/').next().unwrap()
}

/// `app`'s connections to database `db`: how many use TLS, how many there are, and how many
/// are the cancellation listener's.
async fn connections(pg: &TestPg, db: &str) -> (i64, i64, i64) {
    let (client, conn) = tokio_postgres::connect(&pg.admin_url("postgres"), tokio_postgres::NoTls)
        .await
        .unwrap();
    let driver = tokio::spawn(conn);
    let row = client
        .query_one(
            "SELECT count(*) FILTER (WHERE s.ssl), count(*), \
             count(*) FILTER (WHERE a.query = 'LISTEN podhost_cancel') \
             FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE a.usename = 'app' AND a.datname = $1",
            &[&db],
        )
        .await
        .unwrap();
    drop(client);
    let _ = driver.await;
    (row.get(0), row.get(1), row.get(2))
}

/// Waits until the store's connections to `db` include the cancellation listener's (it
/// connects after the pool); asserts every one of them uses TLS.
async fn all_over_tls(pg: &TestPg, db: &str, s: &Serve) {
    let deadline = Instant::now() + T;
    loop {
        let (tls, all, listener) = tokio::time::timeout(T, connections(pg, db)).await.unwrap();
        if listener == 1 {
            assert_eq!(tls, all, "connections over TLS, of all");
            assert!(all >= 2, "the pool's and the listener's: {all}");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no cancellation listener connected within {T:?} ({tls} of {all} over TLS)\n{}",
            s.log_tail()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Starts serve on `store` (trusting `ca_file`, if any) and answers why it refused to start;
/// asserts the password is nowhere in it.
fn refused_store(dir: &std::path::Path, store: &str, ca_file: Option<&std::path::Path>) -> String {
    let mut opts = Options::default().env("PODHOST_STORE", store);
    if let Some(ca) = ca_file {
        opts = opts.env("PODHOST_CA_FILE", ca.to_str().unwrap());
    }
    let err = refused(&dir.join("data"), &opts);
    assert!(!err.contains(APP_PASSWORD), "{err}");
    err
}

#[tokio::test]
async fn serve_runs_on_a_tls_only_postgresql_with_its_ca_and_sslmode_require() {
    let Some(c) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    let ca_file = c.ca.write_ca(dir.path());
    let url = c.pg.fresh_db();
    // SCRAM-SHA-256-PLUS: the password exchange bound to the TLS session, or no connection.
    let store = format!("{url}?sslmode=require&channel_binding=require");
    let fake = FakeModel::start("fake-model", Some("k")).await;
    fake.push([Reply::text("Hello from a store over TLS.")]);
    let s = Serve::start_with(
        dir.path(),
        Options::default()
            .env("PODHOST_STORE", &store)
            .env("PODHOST_CA_FILE", ca_file.to_str().unwrap()),
    );
    let (code, body) = s
        .submit(start("s", "i", "greet me", &fake.base_url(), Some("k")))
        .await;
    assert_eq!(code, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body, status_obj("s", "i", "queued"));
    s.wait_status("i", "completed", T).await;
    let (code, out) = s.collect("i").await;
    assert_eq!(code, StatusCode::OK, "{out}");
    assert_eq!(
        out["messages"],
        json!([{"role": "assistant", "content": "Hello from a store over TLS."}])
    );
    all_over_tls(&c.pg, db_name(&url), &s).await;
    assert!(!s.logs().contains(APP_PASSWORD), "{}", s.logs());
}

#[tokio::test]
async fn prefer_and_verify_full_use_tls_when_the_ca_is_trusted() {
    let Some(c) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    let ca_file = c.ca.write_ca(dir.path());
    // No sslmode is libpq's (and tokio-postgres's) prefer.
    for query in ["", "?sslmode=prefer", "?sslmode=verify-full"] {
        let url = c.pg.fresh_db();
        let run = tempfile::tempdir().unwrap();
        let s = Serve::start_with(
            run.path(),
            Options::default()
                .env("PODHOST_STORE", &format!("{url}{query}"))
                .env("PODHOST_CA_FILE", ca_file.to_str().unwrap()),
        );
        all_over_tls(&c.pg, db_name(&url), &s).await;
    }
}

#[tokio::test]
async fn an_untrusted_certificate_stops_the_start_without_the_password() {
    let Some(c) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    // Under require, and under prefer too: the server offers TLS, so its certificate must be
    // trusted; there is no going back to plain text.
    for query in ["?sslmode=require", ""] {
        let url = c.pg.fresh_db();
        let err = refused_store(dir.path(), &format!("{url}{query}"), None);
        let shown = format!("{url}{query}").replace(APP_PASSWORD, "***");
        assert!(
            err.contains(&format!(
                "could not open the store {shown}: error performing TLS handshake: the \
                 certificate of 127.0.0.1 is not trusted (invalid peer certificate: \
                 UnknownIssuer): podhost trusts the system's CA bundle and the CA file of \
                 PODHOST_CA_FILE (--ca-file, or SSL_CERT_FILE); name the server's CA there"
            )),
            "{err}"
        );
        assert_eq!(err.lines().next(), Some("exit code Some(1)"), "{err}");
    }
}

#[tokio::test]
async fn a_certificate_for_another_name_stops_the_start() {
    let ca = PrivateCa::for_names(&["db.example"]);
    let Some(pg) = TestPg::start_tls(&ca.cert_pem, &ca.key_pem) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ca_file = ca.write_ca(dir.path());
    let url = pg.fresh_db();
    let err = refused_store(
        dir.path(),
        &format!("{url}?sslmode=require"),
        Some(&ca_file),
    );
    let shown = url.replace(APP_PASSWORD, "***");
    assert!(
        err.contains(&format!(
            "could not open the store {shown}?sslmode=require: error performing TLS handshake: \
             the certificate of 127.0.0.1 does not name it (invalid peer certificate: \
             certificate not valid for name \"127.0.0.1\"; certificate is only valid for \
             DnsName(\"db.example\")): connect by a name the certificate holds"
        )),
        "{err}"
    );
}

#[tokio::test]
async fn sslmode_disable_is_plain_text_which_a_tls_only_server_refuses() {
    let Some(c) = cluster() else { return };
    let dir = tempfile::tempdir().unwrap();
    let ca_file = c.ca.write_ca(dir.path());
    let url = c.pg.fresh_db();
    let err = refused_store(
        dir.path(),
        &format!("{url}?sslmode=disable"),
        Some(&ca_file),
    );
    let shown = url.replace(APP_PASSWORD, "***");
    assert!(
        err.contains(&format!(
            "could not open the store {shown}?sslmode=disable: FATAL: pg_hba.conf rejects \
             connection for host \"127.0.0.1\", user \"app\", database \"{}\", no encryption",
            db_name(&url)
        )),
        "{err}"
    );
}
