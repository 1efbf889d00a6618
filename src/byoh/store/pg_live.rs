//! A replica's liveness on a PostgreSQL store: a connection of its own that holds the
//! replica's advisory lock for as long as the replica lives, and carries its lease renewals.
//!
//! Owns: the replica's row in `replicas` (its name and lock key), the liveness connection (made
//! again, and the lock taken again, when it drops), and the server-side keepalives that end it
//! when the replica's machine stops answering.
//!
//! Invariants:
//! * Other replicas take over a turn whose lease ran out only while its owner's lock is free
//!   (`podhost_alive`, the schema's): a live replica that missed its renewals — a busy machine,
//!   a CPU quota, a pause — keeps its turns, however late it renews. The server releases the
//!   lock the moment the connection ends: a killed replica's turns are taken over once their
//!   lease runs out, as before.
//! * Renewals run on this connection, never behind the writes' pool (whose connections a
//!   busy replica may all hold), so a renewal that succeeds also proves the lock is held.
//! * A replica whose machine freezes or is cut off loses the lock within about two leases: the
//!   server's keepalives and `tcp_user_timeout` on this connection are set from the lease.
//!
//! Non-goals: what a renewal decides (`postgres`), when renewals happen (`runner`). A store
//! behind a pooler that hands sessions out per transaction (PgBouncer's transaction mode) cannot
//! hold a session's lock: point podhost at the database itself.

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::Client;
use tracing::{info, warn};

use super::StoreError;
use super::pg_tls::MakeRustls;

/// The advisory lock class of replicas' liveness ("pod" and 3), as `podhost_alive` reads it.
pub(super) const LOCK_CLASS: i32 = 0x706f_6403;

/// One replica's liveness connection.
pub(super) struct Liveness {
    config: tokio_postgres::Config,
    tls: MakeRustls,
    owner: Arc<str>,
    key: i32,
    lease: Duration,
    client: tokio::sync::Mutex<Option<Arc<Client>>>,
}

impl std::fmt::Debug for Liveness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Liveness")
            .field("owner", &self.owner)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl Liveness {
    /// Registers replica `owner` (its lock key from the store's sequence, over `client`) and
    /// takes its lock on a connection of its own.
    pub async fn join(
        client: &deadpool_postgres::Object,
        config: tokio_postgres::Config,
        tls: MakeRustls,
        owner: Arc<str>,
        lease: Duration,
    ) -> Result<Liveness, StoreError> {
        let key: i32 = client
            .query_one(
                "INSERT INTO replicas (owner, lock_key, started_ms) \
                 VALUES ($1, nextval('replica_lock_key')::integer, podhost_now_ms()) \
                 ON CONFLICT (owner) DO UPDATE SET started_ms = excluded.started_ms \
                 RETURNING lock_key",
                &[&&*owner],
            )
            .await?
            .try_get(0)?;
        let live = Liveness {
            config,
            tls,
            owner,
            key,
            lease,
            client: tokio::sync::Mutex::new(None),
        };
        live.client().await?;
        info!(replica = %live.owner, lock = key, "holding this replica's liveness lock");
        Ok(live)
    }

    /// The liveness connection, made again (and the lock taken again) when it dropped.
    pub async fn client(&self) -> Result<Arc<Client>, StoreError> {
        let mut current = self.client.lock().await;
        if let Some(c) = current.as_ref().filter(|c| !c.is_closed()) {
            return Ok(c.clone());
        }
        if current.take().is_some() {
            warn!(replica = %self.owner, "the liveness connection dropped; making it again");
        }
        let client = Arc::new(self.connect().await?);
        *current = Some(client.clone());
        Ok(client)
    }

    async fn connect(&self) -> Result<Client, StoreError> {
        let (client, conn) = tokio::time::timeout(
            Duration::from_secs(10),
            self.config.connect(self.tls.clone()),
        )
        .await
        .map_err(|_| StoreError::Pool("the liveness connection: no answer in 10 s".into()))??;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                warn!(error = %super::postgres_error(&e), "the liveness connection ended");
            }
        });
        // The server drops the connection (and so the lock) once the replica's machine stops
        // answering: probes after a lease of silence, three of them a third of a lease apart,
        // and unacknowledged data after two leases.
        let secs = self.lease.as_secs().max(1);
        let settings = format!(
            "SET application_name = 'podhost liveness'; SET tcp_keepalives_idle = {secs}; \
             SET tcp_keepalives_interval = {}; SET tcp_keepalives_count = 3",
            (secs / 3).max(1)
        );
        client.batch_execute(&settings).await?;
        if let Err(e) = client
            .batch_execute(&format!("SET tcp_user_timeout = {}", secs * 2000))
            .await
        {
            // PostgreSQL before 12.
            warn!(error = %super::postgres_error(&e), "tcp_user_timeout is not settable");
        }
        let locked: bool = client
            .query_one(
                "SELECT pg_try_advisory_lock($1, $2)",
                &[&LOCK_CLASS, &self.key],
            )
            .await?
            .try_get(0)?;
        if !locked {
            return Err(StoreError::Pool(format!(
                "another session holds the liveness lock of replica {} (key {})",
                self.owner, self.key
            )));
        }
        Ok(client)
    }
}
