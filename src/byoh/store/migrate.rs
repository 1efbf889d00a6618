//! Schema versions of the store, applied by refinery on SQLite and PostgreSQL alike.
//!
//! Owns: the embedded migrations (`migrations/sqlite/V<n>__*.sql`, `migrations/postgres/…`,
//! the same version numbers on both engines), refinery's driver for our rusqlite connection, and
//! the refusal to open a store whose schema is newer than this binary knows.
//!
//! Invariants:
//! * A shipped migration is never edited (refinery refuses a store whose applied migration's
//!   checksum differs); a change is a new version, on both engines.
//! * Each migration runs in its own transaction with its history row: both or neither.
//! * A store written by a newer podhost is refused before anything is changed, with an error
//!   that says what to do.
//! * On PostgreSQL the whole check-and-migrate holds an advisory lock, so replicas starting at
//!   once migrate one after the other.
//!
//! Non-goals: the queries of the store (see `sqlite` and `postgres`).

use refinery::Migration;
use refinery_core::traits::sync::{Migrate, Query, Transaction};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

mod embedded {
    pub mod sqlite {
        refinery::embed_migrations!("src/byoh/store/migrations/sqlite");
    }
    pub mod postgres {
        refinery::embed_migrations!("src/byoh/store/migrations/postgres");
    }
}

/// The table refinery keeps its history in (set explicitly, so that a refinery upgrade that
/// changed its default could not lose track of the applied versions).
pub const HISTORY_TABLE: &str = "refinery_schema_history";

/// Why the schema could not be brought up to date.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error(
        "the store's schema is version {found}, newer than the newest this podhost knows \
         ({known}): a newer podhost wrote it; refusing to open it (run the newer podhost, or \
         point --store at another store)"
    )]
    TooNew { found: i32, known: i32 },
    #[error("the store's schema could not be migrated: {0}")]
    Migrate(#[from] refinery::Error),
    #[error("the store's schema could not be read: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("the store's schema could not be read: {0}")]
    Postgres(#[from] tokio_postgres::Error),
}

fn runner(migrations: refinery::Runner, target: Option<i32>) -> refinery::Runner {
    let mut r = migrations
        .set_abort_divergent(true)
        .set_abort_missing(true)
        .set_grouped(false);
    r.set_migration_table_name(HISTORY_TABLE);
    match target {
        Some(v) => r.set_target(refinery::Target::Version(v)),
        None => r,
    }
}

fn newest_known(r: &refinery::Runner) -> i32 {
    r.get_migrations()
        .iter()
        .map(|m| m.version())
        .max()
        .unwrap_or(0)
}

/// The newest schema version this binary knows (the same on both engines).
#[cfg(test)]
pub fn newest() -> i32 {
    newest_known(&embedded::sqlite::migrations::runner())
}

fn check_not_newer(last: Option<Migration>, known: i32) -> Result<(), SchemaError> {
    match last {
        Some(m) if m.version() > known => Err(SchemaError::TooNew {
            found: m.version(),
            known,
        }),
        _ => Ok(()),
    }
}

/// Brings a SQLite store to this binary's newest schema, or to `target` (tests write a store
/// "by the previous schema" with it).
pub fn sqlite(
    conn: rusqlite::Connection,
    target: Option<i32>,
) -> Result<rusqlite::Connection, SchemaError> {
    let r = runner(embedded::sqlite::migrations::runner(), target);
    let mut conn = SqliteConn(conn);
    conn.assert_migrations_table(HISTORY_TABLE)?;
    check_not_newer(r.get_last_applied_migration(&mut conn)?, newest_known(&r))?;
    r.run(&mut conn)?;
    Ok(conn.0)
}

/// Brings a PostgreSQL database to this binary's newest schema, or to `target`, holding a
/// session advisory lock meanwhile.
pub async fn postgres(
    client: &mut tokio_postgres::Client,
    target: Option<i32>,
) -> Result<(), SchemaError> {
    use refinery::AsyncMigrate;
    /// "podhost" and 1: the lock of the schema.
    const LOCK: i64 = 0x706f_6468_6f73_7401;
    client
        .execute("SELECT pg_advisory_lock($1)", &[&LOCK])
        .await?;
    let result = async {
        let r = runner(embedded::postgres::migrations::runner(), target);
        // The async trait has no assert_migrations_table(): run its CREATE TABLE IF NOT EXISTS.
        let create =
            <tokio_postgres::Client as AsyncMigrate>::assert_migrations_table_query(HISTORY_TABLE);
        client.batch_execute(&create).await?;
        check_not_newer(
            r.get_last_applied_migration_async(client).await?,
            newest_known(&r),
        )?;
        r.run_async(client).await?;
        Ok(())
    }
    .await;
    client
        .execute("SELECT pg_advisory_unlock($1)", &[&LOCK])
        .await?;
    result
}

/// Our rusqlite connection, as refinery migrates it (refinery's own rusqlite driver is tied to
/// an older rusqlite; this is the same driver on ours).
struct SqliteConn(rusqlite::Connection);

impl Transaction for SqliteConn {
    type Error = rusqlite::Error;

    fn execute<'a, T: Iterator<Item = &'a str>>(
        &mut self,
        queries: T,
    ) -> Result<usize, Self::Error> {
        let tx = self.0.transaction()?;
        let mut count = 0;
        for q in queries {
            tx.execute_batch(q)?;
            count += 1;
        }
        tx.commit()?;
        Ok(count)
    }
}

impl Query<Vec<Migration>> for SqliteConn {
    fn query(&mut self, query: &str) -> Result<Vec<Migration>, Self::Error> {
        let mut stmt = self.0.prepare(query)?;
        let rows = stmt.query_map([], |row| {
            let applied_on: String = row.get(2)?;
            let checksum: String = row.get(3)?;
            let bad = |i, e: Box<dyn std::error::Error + Send + Sync>| {
                rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, e)
            };
            Ok(Migration::applied(
                row.get(0)?,
                row.get(1)?,
                OffsetDateTime::parse(&applied_on, &Rfc3339).map_err(|e| bad(2, e.into()))?,
                checksum.parse::<u64>().map_err(|e| bad(3, e.into()))?,
            ))
        })?;
        rows.collect()
    }
}

impl Migrate for SqliteConn {}
