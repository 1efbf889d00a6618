//! Choosing the store, and what `podhost serve` refuses at start: a URL that is not
//! PostgreSQL's (its password never printed), a lease outside its range, a second process on an
//! SQLite store, a store written by a newer podhost.

use pretty_assertions::assert_eq;

use crate::harness::{KillOnDrop, Options, spawn};

/// The error `podhost serve` stops with (its exit code, then its stderr); panics if it started.
pub fn refused(data: &std::path::Path, opts: &Options) -> String {
    match spawn(data, opts) {
        Ok((child, _, logs)) => {
            drop(KillOnDrop(child));
            panic!("it started: {}", logs.lock().unwrap())
        }
        Err(e) => e,
    }
}

/// A URL that is not PostgreSQL's is refused, without its password, before the data directory
/// is made.
#[test]
fn a_store_url_that_is_not_postgresql_is_refused_without_its_password() {
    let dir = tempfile::tempdir().unwrap();
    let err = refused(
        &dir.path().join("data"),
        &Options::default().env("PODHOST_STORE", "mysql://app:hunter2@db/p"),
    );
    assert!(err.starts_with("exit code Some(2)"), "{err}");
    assert!(
        err.contains(
            "podhost serve: PODHOST_STORE: \"mysql://app:***@db/p\" is not a PostgreSQL URL: \
             give postgres://user@host:5432/db, or leave it unset for SQLite in the data \
             directory"
        ),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "{err}");
    // Refused before anything was made.
    assert!(
        !dir.path().join("data").exists(),
        "the data directory was made before the store was checked"
    );
}

#[test]
fn a_lease_outside_its_range_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    for secs in ["1", "21"] {
        let err = refused(
            &dir.path().join("data"),
            &Options::default().env("PODHOST_LEASE_SECS", secs),
        );
        assert!(err.starts_with("exit code Some(2)"), "{err}");
        assert!(
            err.contains(&format!(
                "invalid value '{secs}' for PODHOST_LEASE_SECS: {secs} is not in 2..=20"
            )),
            "{err}"
        );
    }
}

#[test]
fn a_second_process_on_an_sqlite_store_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let opts = Options::default().env("PODHOST_STORE", "");
    let (first, _, _) = spawn(&data, &opts).unwrap();
    let _first = KillOnDrop(first);
    let err = refused(&data, &opts);
    assert!(
        err.contains(&format!(
            "could not open the store {}: another podhost serve is using it ({} is locked); an \
             SQLite store serves one process — stop the other one, or use PostgreSQL (--store \
             postgres://…) for several replicas",
            data.join("podhost.sqlite").display(),
            data.join("podhost.lock").display()
        )),
        "{err}"
    );
}

#[test]
fn a_store_written_by_a_newer_podhost_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let opts = Options::default().env("PODHOST_STORE", "");
    // A store this podhost wrote, then a newer one migrated.
    let (first, _, _) = spawn(&data, &opts).unwrap();
    drop(KillOnDrop(first));
    let conn = rusqlite::Connection::open(data.join("podhost.sqlite")).unwrap();
    let newest: i64 = conn
        .query_row(
            "SELECT MAX(version) FROM refinery_schema_history",
            [],
            |r| r.get(0),
        )
        .unwrap();
    conn.execute(
        "INSERT INTO refinery_schema_history (version, name, applied_on, checksum) \
         VALUES (?1, 'from_a_newer_podhost', '2030-01-01T00:00:00Z', '1')",
        [newest + 1],
    )
    .unwrap();
    drop(conn);
    let err = refused(&data, &opts);
    assert!(
        err.contains(&format!(
            "the store's schema is version {}, newer than the newest this podhost knows \
             ({newest}): a newer podhost wrote it; refusing to open it (run the newer podhost, \
             or point --store at another store)",
            newest + 1
        )),
        "{err}"
    );
    assert_eq!(err.lines().next(), Some("exit code Some(1)"));
}
