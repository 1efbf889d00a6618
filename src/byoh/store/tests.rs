//! The store's behaviour, one set of tests run against both engines: SQLite in a temporary
//! directory, and a real PostgreSQL (a throwaway cluster, see `tests/support/pg.rs`).

use std::time::Duration;

use pretty_assertions::assert_eq;

use super::*;
use crate::chat::message::ToolCall;

#[path = "../../../tests/support/pg.rs"]
mod pg;

/// podhost's one TLS client configuration, with the system's roots only (read once).
fn tls() -> Arc<rustls::ClientConfig> {
    static TLS: std::sync::OnceLock<Arc<rustls::ClientConfig>> = std::sync::OnceLock::new();
    TLS.get_or_init(|| {
        crate::floor::tls::client_config(&crate::floor::tls::TlsSettings::default()).unwrap()
    })
    .clone()
}

/// A store to test, and what keeps it alive.
struct Fixture {
    store: Store,
    spec: StoreSpec,
    _dir: tempfile::TempDir,
}

impl Fixture {
    fn sqlite() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("podhost.sqlite");
        Fixture {
            store: Store::Sqlite(sqlite::Sqlite::open(&path).unwrap()),
            spec: StoreSpec::Sqlite(path),
            _dir: dir,
        }
    }

    async fn postgres() -> Option<Fixture> {
        let pg = pg::TestPg::shared()?;
        let spec = StoreSpec::Postgres(Secret::new(pg.fresh_db()));
        Some(Fixture {
            store: Store::open(&spec, &tls()).await.unwrap(),
            spec,
            _dir: tempfile::tempdir().unwrap(),
        })
    }

    /// Another replica's handle on the same store (PostgreSQL), or the same handle (SQLite,
    /// which one process holds).
    async fn other(&self) -> Store {
        match &self.spec {
            StoreSpec::Sqlite(_) => self.store.clone(),
            StoreSpec::Postgres(_) => Store::open(&self.spec, &tls()).await.unwrap(),
        }
    }
}

/// Runs each named test body against both engines.
macro_rules! both_engines {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn sqlite() {
                tokio::time::timeout(super::T, super::$name(super::Fixture::sqlite()))
                    .await
                    .unwrap();
            }
            #[tokio::test]
            async fn postgres() {
                if let Some(f) = super::Fixture::postgres().await {
                    tokio::time::timeout(super::T, super::$name(f)).await.unwrap();
                }
            }
        }
    )*};
}

const T: Duration = Duration::from_secs(30);

both_engines!(
    starts_resumes_and_transitions,
    one_of_two_concurrent_starts_inserts,
    a_claim_fences_the_previous_owner,
    an_expired_lease_is_the_owners_until_another_claims_it,
    a_live_replica_keeps_its_expired_turns_until_its_liveness_ends,
    only_one_replica_claims_an_orphan,
    orphans_needing_a_key_fail_after_the_grace,
    cancel_fences_the_owner_and_is_announced,
    renewals_answer_what_is_still_held,
    uids_are_unique_across_replicas,
    the_uid_pool_is_a_free_list_then_lends_idle_uids,
    a_newer_schema_is_refused,
    a_store_of_the_previous_schema_is_upgraded,
    sweeping_keeps_a_tombstone,
    a_context_view_is_kept_fenced_and_swept,
    appends_racing_renewals_and_a_cancel_stay_whole,
    sessions_are_listed_a_page_at_a_time,
    tokens_are_summed_under_the_fence,
);

fn terms(owner: &str, ttl_ms: i64) -> LeaseTerms {
    LeaseTerms {
        owner: owner.into(),
        ttl_ms,
    }
}

/// The model a test row names (never called).
fn endpoint() -> ModelEndpoint {
    ModelEndpoint {
        base_url: url::Url::parse("http://m/v1").unwrap(),
        model: String::new(),
        generation_settings: serde_json::Map::new(),
    }
}

fn row(id: &str, session: &str) -> InvocationRow {
    let mut r = InvocationRow::new(id, session, endpoint());
    r.needs_key = true;
    r
}

fn ask(id: &str) -> ChatMessage {
    ChatMessage::assistant(
        String::new(),
        vec![ToolCall::new(id, "ask_user", "{}".into())],
    )
}

async fn start(store: &Store, id: &str, t: &LeaseTerms) -> Fence {
    match store
        .insert_start(
            row(id, &format!("s-{id}")),
            vec![ChatMessage::user("hi")],
            t,
        )
        .await
        .unwrap()
    {
        StartOutcome::Inserted(f) => f,
        other => panic!("{other:?}"),
    }
}

/// Waits (polling the store, as a replica would) until the lease of `id` ran out.
async fn until_expired(store: &Store, id: &str) {
    while !store.get(id).await.unwrap().unwrap().is_orphan() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn starts_resumes_and_transitions(f: Fixture) {
    let store = &f.store;
    let a = terms("a", 60_000);
    let msgs = vec![ChatMessage::user("hi")];
    let StartOutcome::Inserted(fence) = store
        .insert_start(row("i", "s"), msgs.clone(), &a)
        .await
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(fence, a.fence(1));
    assert!(matches!(
        store.insert_start(row("i", "s"), msgs.clone(), &a).await.unwrap(),
        StartOutcome::Exists(r) if r.epoch == 1 && r.owner.as_deref() == Some("a")
    ));
    assert!(matches!(
        store.insert_start(row("j", "s"), msgs.clone(), &a).await.unwrap(),
        StartOutcome::SessionTaken(other) if other == "i"
    ));
    store.append("i", vec![ask("q")], &fence).await.unwrap();
    assert_eq!(
        store.status("i").await.unwrap().unwrap().status,
        Status::Queued
    );
    assert_eq!(store.status("nope").await.unwrap(), None);
    let (changed, after) = store
        .transition(
            "i",
            OPEN,
            Status::InputRequired,
            None,
            vec!["q".into()],
            Some(&fence),
        )
        .await
        .unwrap();
    assert!(changed);
    // Waiting for input, the turn holds no lease.
    assert_eq!(after.unwrap().lease_left_ms, None);
    let resume = |ids: &[&str]| {
        let store = store.clone();
        let ids: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
        let b = terms("b", 60_000);
        async move {
            let msgs = ids
                .iter()
                .map(|i| ChatMessage::tool(i.clone(), "x"))
                .collect();
            store
                .apply_resume("i", ids, msgs, endpoint(), false, &b)
                .await
                .unwrap()
        }
    };
    assert!(matches!(resume(&["z"]).await, ResumeOutcome::Mismatch(m)
        if m == "the resume answers tool call(s) [\"z\"], which are not pending; the pending calls are [\"q\"]"));
    let ResumeOutcome::Applied(applied, fence2) = resume(&["q"]).await else {
        panic!()
    };
    // The resume was claimed by the replica that took it.
    assert_eq!(fence2, terms("b", 0).fence(2));
    assert_eq!(
        (
            applied.output_start,
            applied.status,
            applied.owner.as_deref()
        ),
        (3, Status::Queued, Some("b"))
    );
    assert!(matches!(resume(&["q"]).await, ResumeOutcome::Duplicate(_)));
    // The first claim's writes no longer land.
    assert!(matches!(
        store.append("i", vec![ask("late")], &fence).await,
        Err(StoreError::Fenced(id)) if id == "i"
    ));
    let spec = f.spec.clone();
    drop(f.store);
    let store = Store::open(&spec, &tls()).await.unwrap();
    let got = store.get("i").await.unwrap().unwrap();
    assert_eq!(
        (got.status, got.needs_key, got.last_resume),
        (Status::Queued, false, vec!["q".to_string()])
    );
    assert_eq!(store.messages("i", 0).await.unwrap().len(), 3);
    assert_eq!(
        store.messages("i", 1).await.unwrap(),
        vec![ask("q"), ChatMessage::tool("q", "x")]
    );
}

async fn one_of_two_concurrent_starts_inserts(f: Fixture) {
    let other = f.other().await;
    for n in 0..20 {
        let id = format!("i{n}");
        let (a, b) = (terms("a", 60_000), terms("b", 60_000));
        let (x, y) = tokio::join!(
            f.store
                .insert_start(row(&id, &id), vec![ChatMessage::user("a")], &a),
            other.insert_start(row(&id, &id), vec![ChatMessage::user("a")], &b),
        );
        let inserted = [x.unwrap(), y.unwrap()]
            .iter()
            .filter(|o| matches!(o, StartOutcome::Inserted(_)))
            .count();
        assert_eq!(inserted, 1, "{id}");
        assert_eq!(f.store.messages(&id, 0).await.unwrap().len(), 1);
    }
}

async fn a_claim_fences_the_previous_owner(f: Fixture) {
    let store = &f.store;
    let a = terms("a", 150);
    let fence = start(store, "i", &a).await;
    until_expired(store, "i").await;
    let other = f.other().await;
    let (row, taken) = other
        .claim("i", 1, &terms("b", 60_000))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (row.owner.as_deref(), row.epoch, taken.epoch),
        (Some("b"), 2, 2)
    );
    // Every write of the old claim is refused; the new claim's land.
    assert!(matches!(
        store
            .append("i", vec![ChatMessage::user("x")], &fence)
            .await,
        Err(StoreError::Fenced(_))
    ));
    assert!(matches!(
        store
            .transition("i", OPEN, Status::Completed, None, vec![], Some(&fence))
            .await,
        Err(StoreError::Fenced(_))
    ));
    assert_eq!(
        store.renew(&a, vec![("i".into(), 1)]).await.unwrap(),
        Vec::<String>::new()
    );
    other
        .append(
            "i",
            vec![ChatMessage::assistant("done".into(), vec![])],
            &taken,
        )
        .await
        .unwrap();
    let (changed, _) = other
        .transition("i", OPEN, Status::Completed, None, vec![], Some(&taken))
        .await
        .unwrap();
    assert!(changed);
    assert_eq!(store.messages("i", 0).await.unwrap().len(), 2);
    // A claim at a stale epoch finds nothing.
    assert!(
        other
            .claim("i", 1, &terms("c", 1000))
            .await
            .unwrap()
            .is_none()
    );
}

/// A lease that ran out is still its owner's: its writes and renewals land until another
/// replica claims the turn (which it may, its owner not being alive), and from then on nothing
/// of the owner's does.
async fn an_expired_lease_is_the_owners_until_another_claims_it(f: Fixture) {
    let store = &f.store;
    let a = terms("a", 150);
    let fence = start(store, "i", &a).await;
    assert_eq!(store.orphans("b").await.unwrap(), vec![]);
    until_expired(store, "i").await;
    store
        .append("i", vec![ChatMessage::user("late")], &fence)
        .await
        .unwrap();
    assert_eq!(
        store.renew(&a, vec![("i".into(), 1)]).await.unwrap(),
        vec!["i".to_owned()]
    );
    assert_eq!(store.orphans("b").await.unwrap(), vec![]);
    until_expired(store, "i").await;
    let orphans = store.orphans("b").await.unwrap();
    assert_eq!(orphans.len(), 1);
    assert_eq!(
        (
            orphans[0].invocation_id.as_str(),
            orphans[0].epoch,
            orphans[0].needs_key,
            orphans[0].ours
        ),
        ("i", 1, true, false)
    );
    assert!(orphans[0].expired_for_ms >= 0);
    assert!(store.orphans("a").await.unwrap()[0].ours);
    // Claimed by another: the owner writes nothing more.
    let (_, taken) = store
        .claim("i", 1, &terms("b", 60_000))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(taken.epoch, 2);
    assert!(matches!(
        store
            .append("i", vec![ChatMessage::user("x")], &fence)
            .await,
        Err(StoreError::Fenced(_))
    ));
    assert_eq!(
        store.renew(&a, vec![("i".into(), 1)]).await.unwrap(),
        Vec::<String>::new()
    );
    assert_eq!(store.messages("i", 0).await.unwrap().len(), 2);
}

/// On a store replicas share, a replica that joined holds a liveness lock: while it is held, its
/// turns whose lease ran out are its own — no other replica lists, claims or fails them, and its
/// late renewals land — and once the lock's connection ends (as when the replica dies), they
/// are orphans for any replica to take.
async fn a_live_replica_keeps_its_expired_turns_until_its_liveness_ends(f: Fixture) {
    let StoreSpec::Postgres(url) = &f.spec else {
        println!("SQLite: one process holds the store, so no other replica takes a turn over");
        return;
    };
    let a = terms("a", 150);
    f.store
        .join(a.owner.clone(), Duration::from_secs(3))
        .await
        .unwrap();
    let other = f.other().await;
    let fence = start(&f.store, "i", &a).await;
    until_expired(&f.store, "i").await;
    assert_eq!(other.orphans("b").await.unwrap(), vec![]);
    assert!(
        other
            .claim("i", 1, &terms("b", 60_000))
            .await
            .unwrap()
            .is_none()
    );
    assert!(!other.fail_orphan("i", 1, 0, "m".into(), "b").await.unwrap());
    let own = f.store.orphans("a").await.unwrap();
    assert_eq!((own.len(), own[0].ours), (1, true));
    assert_eq!(
        f.store.renew(&a, vec![("i".into(), 1)]).await.unwrap(),
        vec!["i".to_owned()]
    );
    until_expired(&f.store, "i").await;
    // The liveness connection ends: the server frees the lock.
    let (admin, conn) = tokio_postgres::connect(url.expose(), tokio_postgres::NoTls)
        .await
        .unwrap();
    let driver = tokio::spawn(conn);
    let ended = admin
        .query_one(
            "SELECT COUNT(pg_terminate_backend(l.pid)) FROM pg_locks l JOIN replicas r \
             ON l.objid = r.lock_key::oid WHERE l.locktype = 'advisory' AND l.classid = $1 \
             AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
             AND r.owner = 'a'",
            &[&(pg_live::LOCK_CLASS as u32)],
        )
        .await
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(ended, 1);
    while other.orphans("b").await.unwrap().is_empty() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, taken) = other
        .claim("i", 1, &terms("b", 60_000))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(taken.epoch, 2);
    assert!(matches!(
        f.store
            .append("i", vec![ChatMessage::user("x")], &fence)
            .await,
        Err(StoreError::Fenced(_))
    ));
    drop(admin);
    let _ = driver.await;
}

async fn only_one_replica_claims_an_orphan(f: Fixture) {
    let other = f.other().await;
    for n in 0..10 {
        let id = format!("i{n}");
        start(&f.store, &id, &terms("a", 50)).await;
        until_expired(&f.store, &id).await;
        let (b, c) = (terms("b", 60_000), terms("c", 60_000));
        let (x, y) = tokio::join!(f.store.claim(&id, 1, &b), other.claim(&id, 1, &c));
        let claimed = [x.unwrap(), y.unwrap()]
            .iter()
            .filter(|c| c.is_some())
            .count();
        assert_eq!(claimed, 1, "{id}");
    }
}

async fn orphans_needing_a_key_fail_after_the_grace(f: Fixture) {
    let store = &f.store;
    start(store, "i", &terms("a", 50)).await;
    until_expired(store, "i").await;
    // Within the grace: not yet.
    assert!(
        !store
            .fail_orphan("i", 1, 60_000, "m".into(), "b")
            .await
            .unwrap()
    );
    // A stale epoch: not this one.
    assert!(!store.fail_orphan("i", 0, 0, "m".into(), "b").await.unwrap());
    assert!(
        store
            .fail_orphan("i", 1, 0, "gone".into(), "b")
            .await
            .unwrap()
    );
    let got = store.get("i").await.unwrap().unwrap();
    assert_eq!(
        (
            got.status,
            got.error.as_deref(),
            got.epoch,
            got.lease_left_ms
        ),
        (Status::Failed, Some("gone"), 2, None)
    );
    assert!(got.finished_ms.is_some());
    assert_eq!(store.orphans("b").await.unwrap(), vec![]);
}

async fn cancel_fences_the_owner_and_is_announced(f: Fixture) {
    let mut heard = f.store.cancellations();
    let other = f.other().await;
    let fence = start(&f.store, "i", &terms("a", 60_000)).await;
    let (changed, row) = other
        .transition(
            "i",
            &[Status::Queued, Status::Running, Status::InputRequired],
            Status::Cancelled,
            None,
            vec![],
            None,
        )
        .await
        .unwrap();
    assert!(changed);
    assert_eq!(row.unwrap().status, Status::Cancelled);
    assert!(matches!(
        f.store
            .append("i", vec![ChatMessage::user("x")], &fence)
            .await,
        Err(StoreError::Fenced(_))
    ));
    // The owner's end write finds the cancellation standing.
    let (changed, row) = f
        .store
        .transition(
            "i",
            &[Status::Running],
            Status::Completed,
            None,
            vec![],
            Some(&fence),
        )
        .await
        .unwrap();
    assert_eq!((changed, row.unwrap().status), (false, Status::Cancelled));
    assert_eq!(
        f.store
            .renew(&terms("a", 60_000), vec![("i".into(), 1)])
            .await
            .unwrap(),
        Vec::<String>::new()
    );
    match (&f.spec, heard.as_mut()) {
        (StoreSpec::Postgres(_), Some(rx)) => {
            assert_eq!(rx.recv().await.as_deref(), Some("i"));
        }
        (StoreSpec::Sqlite(_), None) => {}
        (spec, rx) => panic!("{spec}: announcements {}", rx.is_some()),
    }
}

/// A turn's appends, one after the other as a turn makes them, while its replica renews the
/// lease and another replica cancels the turn part-way: each append lands whole, in order, or
/// is refused as fenced — and once one is refused, every later one is.
async fn appends_racing_renewals_and_a_cancel_stay_whole(f: Fixture) {
    const APPENDS: usize = 300;
    let t = terms("a", 60_000);
    let fence = start(&f.store, "i", &t).await;
    let other = f.other().await;
    let (landed_tx, mut landed_rx) = tokio::sync::mpsc::unbounded_channel();
    let appends = {
        let store = f.store.clone();
        tokio::spawn(async move {
            let mut outcomes = Vec::new();
            for n in 0..APPENDS {
                let messages = vec![
                    ChatMessage::user(format!("m{n}")),
                    ChatMessage::user(format!("m{n}'")),
                ];
                let outcome = store.append("i", messages, &fence).await;
                let _ = landed_tx.send(n);
                outcomes.push(outcome);
            }
            outcomes
        })
    };
    let renewals = {
        let (store, t) = (f.store.clone(), t.clone());
        tokio::spawn(async move {
            for _ in 0..APPENDS {
                store.renew(&t, vec![("i".into(), 1)]).await.unwrap();
            }
        })
    };
    // Cancel from the other replica once a third of the appends landed.
    while landed_rx.recv().await.unwrap() < APPENDS / 3 {}
    let (changed, _) = other
        .transition("i", OPEN, Status::Cancelled, None, vec![], None)
        .await
        .unwrap();
    assert!(changed);
    renewals.await.unwrap();
    let outcomes = appends.await.unwrap();
    let landed = outcomes.iter().take_while(|o| o.is_ok()).count();
    for o in &outcomes[landed..] {
        assert!(matches!(o, Err(StoreError::Fenced(_))), "{o:?}");
    }
    assert!(
        (APPENDS / 3..APPENDS).contains(&landed),
        "{landed} appends landed"
    );
    let mut expected = vec!["hi".to_owned()];
    for n in 0..landed {
        expected.extend([format!("m{n}"), format!("m{n}'")]);
    }
    let texts: Vec<String> = other
        .messages("i", 0)
        .await
        .unwrap()
        .iter()
        .map(|m| m.content.clone().unwrap_or_default())
        .collect();
    assert_eq!(texts, expected);
}

async fn renewals_answer_what_is_still_held(f: Fixture) {
    let store = &f.store;
    let a = terms("a", 60_000);
    let f1 = start(store, "i1", &a).await;
    let f2 = start(store, "i2", &a).await;
    start(store, "i3", &terms("b", 60_000)).await;
    let before = store
        .get("i1")
        .await
        .unwrap()
        .unwrap()
        .lease_left_ms
        .unwrap();
    let mut renewed = store
        .renew(
            &terms("a", 120_000),
            vec![
                ("i1".into(), f1.epoch),
                ("i2".into(), f2.epoch + 1),
                ("i3".into(), 1),
            ],
        )
        .await
        .unwrap();
    renewed.sort();
    assert_eq!(renewed, vec!["i1".to_string()]);
    let after = store
        .get("i1")
        .await
        .unwrap()
        .unwrap()
        .lease_left_ms
        .unwrap();
    assert!(after > before + 50_000, "{before} → {after}");
    // Released: it runs out now, and another replica may claim it.
    store.release("i1", &f1).await.unwrap();
    assert!(store.get("i1").await.unwrap().unwrap().is_orphan());
    assert!(
        store
            .claim("i1", 1, &terms("b", 1000))
            .await
            .unwrap()
            .is_some()
    );
}

/// A park that records which sessions lent their uid.
fn parks() -> (Park, Arc<std::sync::Mutex<Vec<String>>>) {
    let lent = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = lent.clone();
    let park: Park = Arc::new(move |s: &str| {
        seen.lock().unwrap().push(s.to_owned());
        Ok(())
    });
    (park, lent)
}

const POOL: UidRange = UidRange {
    first: 10_000,
    last: 10_004,
};

async fn uids_are_unique_across_replicas(f: Fixture) {
    let other = f.other().await;
    let (park, lent) = parks();
    f.store.adopt_uids(POOL, "a", vec![]).await.unwrap();
    let mut seen = std::collections::HashSet::new();
    for n in 0..4 {
        let s = format!("s{n}");
        let s2 = format!("{s}-other");
        let (x, y) = tokio::join!(
            f.store.take_uid(&s, "a", POOL, park.clone()),
            other.take_uid(&s2, "b", POOL, park.clone()),
        );
        for grant in [x.unwrap(), y.unwrap()] {
            match grant {
                Some(UidGrant::Fresh(uid)) => {
                    assert!(seen.insert(uid), "uid {uid} given twice");
                    assert!(POOL.contains(uid));
                }
                // The pool has five: the last two takes find it spent, all lenders idle.
                Some(UidGrant::Reclaimed { uid, from }) => {
                    assert!(seen.contains(&uid), "{uid} lent by {from}");
                }
                None => panic!("idle sessions hold every uid: one lends"),
                Some(held @ UidGrant::Held(_)) => panic!("{held:?}"),
            }
        }
    }
    assert_eq!(seen.len(), 5);
    assert_eq!(lent.lock().unwrap().len(), 3, "8 sessions on 5 uids");
    // The same session keeps its uid, on any replica: one of the last two, whichever did not
    // lend. (Neither has a turn open here, so on PostgreSQL the second's take may lend the uid
    // the first has just been given: its row, locked by that take, is checked again once the
    // take commits, and it is still idle. A session being given a uid has a turn running, so
    // a real take never lends it.)
    let keeper = ["s3", "s3-other"]
        .into_iter()
        .find(|s| !lent.lock().unwrap().iter().any(|l| l == s))
        .expect("the last two cannot both have lent");
    let s0 = f
        .store
        .take_uid(keeper, "a", POOL, park.clone())
        .await
        .unwrap();
    let again = other
        .take_uid(keeper, "b", POOL, park.clone())
        .await
        .unwrap();
    assert!(matches!(s0, Some(UidGrant::Held(_))), "{s0:?}");
    assert_eq!(again, s0);
}

/// A swept session's uid serves again, lowest first, before any never handed out; once none
/// is left, the idle session that used its uid least recently lends it, parked first; a session
/// with a turn open never lends; with every uid busy, there is none.
async fn the_uid_pool_is_a_free_list_then_lends_idle_uids(f: Fixture) {
    let store = &f.store;
    let (park, lent) = parks();
    // A kept session whose workspace already belongs to 10_002 keeps it; 10_000 and 10_001
    // are free.
    store
        .adopt_uids(POOL, "a", vec![("old".into(), 10_002)])
        .await
        .unwrap();
    assert!(store.uid_range_known(POOL.first).await.unwrap());
    // Adopting again changes nothing.
    store
        .adopt_uids(POOL, "a", vec![("other".into(), 10_001)])
        .await
        .unwrap();
    let take = |s: &'static str| {
        let park = park.clone();
        async move { store.take_uid(s, "a", POOL, park).await.unwrap() }
    };
    assert_eq!(take("old").await, Some(UidGrant::Held(10_002)));
    assert_eq!(take("a").await, Some(UidGrant::Fresh(10_000)));
    assert_eq!(take("b").await, Some(UidGrant::Fresh(10_001)));
    assert_eq!(take("c").await, Some(UidGrant::Fresh(10_003)));
    store.release_uid("a").await.unwrap();
    store.release_uid("nobody").await.unwrap();
    assert_eq!(take("d").await, Some(UidGrant::Fresh(10_000)));
    assert_eq!(take("e").await, Some(UidGrant::Fresh(10_004)));
    assert!(lent.lock().unwrap().is_empty());
    // Spent. "b" has a turn running: it never lends. "old" used its uid least recently of the
    // idle ones (then "c", "d", "e").
    let t = terms("a", 60_000);
    store
        .insert_start(row("ib", "b"), vec![ChatMessage::user("hi")], &t)
        .await
        .unwrap();
    take("c").await;
    assert_eq!(
        take("f").await,
        Some(UidGrant::Reclaimed {
            uid: 10_002,
            from: "old".into()
        })
    );
    assert_eq!(*lent.lock().unwrap(), vec!["old".to_owned()]);
    // The lender, back, takes the next idle session's uid ("d": "c" was used since).
    assert_eq!(
        take("old").await,
        Some(UidGrant::Reclaimed {
            uid: 10_000,
            from: "d".into()
        })
    );
    for s in ["c", "e", "f", "old"] {
        store
            .insert_start(row(&format!("i{s}"), s), vec![ChatMessage::user("hi")], &t)
            .await
            .unwrap();
    }
    // Every uid serves a session with a turn open.
    assert_eq!(take("g").await, None);
    // A park that fails lends nothing: the take fails and the lender keeps its uid.
    let refuse: Park = Arc::new(|_: &str| Err("read-only".to_owned()));
    store
        .transition(
            "ic",
            &[Status::Queued, Status::Running],
            Status::Completed,
            None,
            vec![],
            None,
        )
        .await
        .unwrap();
    let refused = store.take_uid("g", "a", POOL, refuse).await.unwrap_err();
    assert_eq!(
        refused.to_string(),
        "could not park an idle session's workspace to lend its uid: read-only"
    );
    assert_eq!(take("c").await, Some(UidGrant::Held(10_003)));
}

async fn a_newer_schema_is_refused(f: Fixture) {
    let future = "INSERT INTO refinery_schema_history (version, name, applied_on, checksum) \
                  VALUES (99, 'from_the_future', '2030-01-01T00:00:00Z', '1')";
    let spec = f.spec.clone();
    match &spec {
        StoreSpec::Sqlite(path) => {
            drop(f.store);
            rusqlite::Connection::open(path)
                .unwrap()
                .execute_batch(future)
                .unwrap();
        }
        StoreSpec::Postgres(url) => pg::TestPg::execute(url.expose(), future).await,
    }
    let err = Store::open(&spec, &tls()).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "the store's schema is version 99, newer than the newest this podhost knows ({}): \
             a newer podhost wrote it; refusing to open it (run the newer podhost, or point \
             --store at another store)",
            migrate::newest()
        )
    );
}

/// A row as the first schema stored it.
const V1_ROW: &str = "INSERT INTO invocations (invocation_id, session_id, status, connection, \
    needs_key, output_start, created_ms, updated_ms) VALUES ('old', 'old-s', 'running', \
    '{\"base_url\":\"http://m/v1\",\"model\":\"x\"}', 1, 1, 5, 5); \
    INSERT INTO messages (invocation_id, seq, body) VALUES \
    ('old', 0, '{\"role\":\"user\",\"content\":\"hi\"}')";

async fn a_store_of_the_previous_schema_is_upgraded(f: Fixture) {
    let previous = migrate::newest() - 1;
    // A store written by the previous schema, beside the fixture's.
    let store = match &f.spec {
        StoreSpec::Sqlite(path) => {
            let old = path.with_file_name("previous").join("podhost.sqlite");
            std::fs::create_dir_all(old.parent().unwrap()).unwrap();
            sqlite::Sqlite::open_at_version(&old, previous).unwrap();
            rusqlite::Connection::open(&old)
                .unwrap()
                .execute_batch(V1_ROW)
                .unwrap();
            Store::open(&StoreSpec::Sqlite(old), &tls()).await.unwrap()
        }
        StoreSpec::Postgres(_) => {
            let url = pg::TestPg::shared().unwrap().fresh_db();
            let (mut client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .unwrap();
            let driver = tokio::spawn(conn);
            migrate::postgres(&mut client, Some(previous))
                .await
                .unwrap();
            client
                .batch_execute(&V1_ROW.replace(", 1, 1, 5, 5)", ", TRUE, 1, 5, 5)"))
                .await
                .unwrap();
            drop(client);
            let _ = driver.await;
            Store::open(&StoreSpec::Postgres(Secret::new(url)), &tls())
                .await
                .unwrap()
        }
    };
    check_upgraded(store).await;
}

async fn check_upgraded(store: Store) {
    let got = store.get("old").await.unwrap().unwrap();
    assert_eq!(
        (
            got.status,
            got.owner,
            got.epoch,
            got.lease_left_ms,
            got.connection.model.as_str()
        ),
        (Status::Running, None, 0, None, "x")
    );
    // A turn the old schema left running is an orphan to take up.
    assert_eq!(
        store
            .orphans("a")
            .await
            .unwrap()
            .iter()
            .map(|o| o.invocation_id.as_str())
            .collect::<Vec<_>>(),
        vec!["old"]
    );
    assert_eq!(
        store.messages("old", 0).await.unwrap(),
        vec![ChatMessage::user("hi")]
    );
    let (_, fence) = store
        .claim("old", 0, &terms("a", 60_000))
        .await
        .unwrap()
        .unwrap();
    store
        .append(
            "old",
            vec![ChatMessage::assistant("ok".into(), vec![])],
            &fence,
        )
        .await
        .unwrap();
}

async fn sweeping_keeps_a_tombstone(f: Fixture) {
    let store = &f.store;
    let fence = start(store, "i", &terms("a", 60_000)).await;
    store
        .transition("i", OPEN, Status::Completed, None, vec![], Some(&fence))
        .await
        .unwrap();
    assert_eq!(store.sweep(0).await.unwrap(), Vec::<String>::new());
    assert_eq!(
        store.sweep(now_ms() + 60_000).await.unwrap(),
        vec!["s-i".to_string()]
    );
    let got = store.get("i").await.unwrap().unwrap();
    assert_eq!((got.status, got.swept), (Status::Completed, true));
    assert_eq!(store.messages("i", 0).await.unwrap(), vec![]);
}

async fn a_context_view_is_kept_fenced_and_swept(f: Fixture) {
    use crate::chat::context::ContextView;
    let store = &f.store;
    let a = terms("a", 150);
    let fence = start(store, "i", &a).await;
    assert_eq!(store.view("i").await.unwrap(), ContextView::default());
    let view = ContextView {
        summary: Some("what happened".into()),
        keep: vec![0],
        from: 2,
        ..ContextView::default()
    };
    store.set_view("i", &view, &fence).await.unwrap();
    // Another replica (or a later turn) reads it.
    assert_eq!(f.other().await.view("i").await.unwrap(), view);
    // An owner whose lease was taken writes no view.
    until_expired(store, "i").await;
    let (_, taken) = f
        .other()
        .await
        .claim("i", 1, &terms("b", 60_000))
        .await
        .unwrap()
        .unwrap();
    let stale = ContextView {
        summary: Some("stale".into()),
        ..ContextView::default()
    };
    assert!(matches!(
        store.set_view("i", &stale, &fence).await,
        Err(StoreError::Fenced(_))
    ));
    assert_eq!(store.view("i").await.unwrap(), view);
    store
        .transition("i", OPEN, Status::Completed, None, vec![], Some(&taken))
        .await
        .unwrap();
    store.sweep(now_ms() + 60_000).await.unwrap();
    assert_eq!(store.view("i").await.unwrap(), ContextView::default());
}

#[test]
fn store_urls_are_printed_without_their_password() {
    let dir = std::path::Path::new("/d");
    let spec = StoreSpec::parse(
        Some("postgres://app:s3cret@db:5432/podhost"),
        dir,
        "PODHOST_STORE",
    )
    .unwrap();
    assert_eq!(spec.to_string(), "postgres://app:***@db:5432/podhost");
    assert_eq!(format!("{spec:?}"), "postgres://app:***@db:5432/podhost");
    let spec = StoreSpec::parse(
        Some("host=db user=app password=s3cret dbname=p"),
        dir,
        "PODHOST_STORE",
    )
    .unwrap();
    assert_eq!(spec.to_string(), "host=db user=app password=*** dbname=p");
    let spec = StoreSpec::parse(
        Some("postgresql://db/p?user=app&password=s3cret"),
        dir,
        "PODHOST_STORE",
    )
    .unwrap();
    assert_eq!(spec.to_string(), "postgresql://db/p?user=app&password=***");
    assert_eq!(
        StoreSpec::parse(None, dir, "PODHOST_STORE").unwrap(),
        StoreSpec::Sqlite(dir.join("podhost.sqlite"))
    );
    assert_eq!(
        StoreSpec::parse(Some("mysql://app:s3cret@db/p"), dir, "PODHOST_STORE")
            .unwrap_err()
            .to_string(),
        "PODHOST_STORE: \"mysql://app:***@db/p\" is not a PostgreSQL URL: give \
         postgres://user@host:5432/db, or leave it unset for SQLite in the data directory"
    );
}

#[test]
fn sslmode_is_read_as_libpq_names_it_with_verify_modes_as_require() {
    use tokio_postgres::config::SslMode::{Disable, Prefer, Require};
    let mode = |url: &str| {
        postgres::config(url, "--store")
            .map(|c| c.get_ssl_mode())
            .map_err(|e| e.to_string())
    };
    for (url, want) in [
        ("postgres://app:s3cret@db/p", Prefer),
        ("postgres://app:s3cret@db/p?sslmode=disable", Disable),
        ("postgres://app:s3cret@db/p?sslmode=prefer", Prefer),
        ("postgres://app:s3cret@db/p?sslmode=require", Require),
        ("postgres://app:s3cret@db/p?sslmode=verify-ca", Require),
        (
            "postgres://db/p?application_name=x&sslmode=verify-full",
            Require,
        ),
        // The last one counts, as in libpq.
        (
            "postgres://db/p?sslmode=verify-full&sslmode=disable",
            Disable,
        ),
        (
            "postgres://db/p?sslmode=disable&sslmode=verify-full",
            Require,
        ),
        ("host=db dbname=p", Prefer),
        ("host=db sslmode = 'require'", Require),
        ("host=db sslmode=disable", Disable),
        (
            "host=db user=app password='s3 cr\\'et' sslmode=verify-full",
            Require,
        ),
    ] {
        assert_eq!(mode(url), Ok(want), "{url}");
    }
    // Reading a verify mode as require keeps every other setting.
    let c = postgres::config(
        "host=db user=app password='s3 cr\\'et' sslmode=verify-full dbname=p",
        "--store",
    )
    .unwrap();
    assert_eq!(
        (c.get_user(), c.get_password(), c.get_dbname()),
        (Some("app"), Some(&b"s3 cr'et"[..]), Some("p"))
    );
    let c = postgres::config(
        "postgres://app:s3cret@db:6432/p?sslmode=verify-full&application_name=x",
        "--store",
    )
    .unwrap();
    assert_eq!(
        (c.get_password(), c.get_ports(), c.get_application_name()),
        (Some(&b"s3cret"[..]), &[6432][..], Some("x"))
    );
    assert_eq!(
        mode("postgres://app:s3cret@db/p?sslmode=allow"),
        Err(
            "--store: \"postgres://app:***@db/p?sslmode=allow\" asks for sslmode=allow (plain \
             text unless the server insists on TLS), which podhost does not offer: use \
             sslmode=prefer (TLS when the server offers it; the default), require (TLS, \
             verified) or disable (plain text)"
                .to_owned()
        )
    );
    assert_eq!(
        mode("host=db password=s3cret sslrootcert=/etc/db-ca.pem"),
        Err(
            "--store: \"host=db password=*** sslrootcert=/etc/db-ca.pem\" sets sslrootcert, \
             which podhost does not read: the server's certificate is checked against the \
             system's CA bundle and PODHOST_CA_FILE (--ca-file), and podhost sends no client \
             certificate"
                .to_owned()
        )
    );
    assert_eq!(
        mode("postgres://app:s3cret@db/p?sslmode=on"),
        Err(
            "--store: \"postgres://app:***@db/p?sslmode=on\" is not a valid PostgreSQL \
             connection string: invalid connection string: invalid value for option `sslmode`"
                .to_owned()
        )
    );
}

#[tokio::test]
async fn an_sqlite_store_serves_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("podhost.sqlite");
    let first = sqlite::Sqlite::open(&path).unwrap();
    let err = sqlite::Sqlite::open(&path).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "could not open the store {}: another podhost serve is using it ({} is locked); \
             an SQLite store serves one process — stop the \
             other one, or use PostgreSQL (--store postgres://…) for several replicas",
            path.display(),
            dir.path().join("podhost.lock").display()
        )
    );
    drop(first);
    sqlite::Sqlite::open(&path).unwrap();
}

/// The schema this store had before versions were kept (written by `CREATE TABLE IF NOT
/// EXISTS` at every start): such a store adopts the version history and is upgraded.
#[tokio::test]
async fn a_store_from_before_schema_versions_is_adopted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("podhost.sqlite");
    let old = rusqlite::Connection::open(&path).unwrap();
    old.execute_batch(include_str!("migrations/sqlite/V1__sessions.sql"))
        .unwrap();
    old.execute_batch(V1_ROW).unwrap();
    drop(old);
    check_upgraded(Store::open(&StoreSpec::Sqlite(path), &tls()).await.unwrap()).await;
}

/// Every connection the writes may use waits on row locks held elsewhere (a long transaction
/// of another client): the routes' reads still answer at once, from connections of their own.
#[tokio::test]
async fn postgres_reads_answer_while_every_write_connection_waits() {
    let Some(f) = Fixture::postgres().await else {
        return;
    };
    let StoreSpec::Postgres(url) = &f.spec else {
        unreachable!()
    };
    // More turns than the writes' pool has connections, each about to append.
    let turns = postgres::POOL_SIZE + 4;
    let mut fences = Vec::new();
    for n in 0..turns {
        fences.push(start(&f.store, &format!("i{n}"), &terms("a", 60_000)).await);
    }
    let connect = || async {
        let (client, conn) = tokio_postgres::connect(url.expose(), tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        client
    };
    let (mut holder, watcher) = (connect().await, connect().await);
    let lock = holder.transaction().await.unwrap();
    lock.execute("SELECT 1 FROM invocations FOR UPDATE", &[])
        .await
        .unwrap();
    let writes: Vec<_> = fences
        .into_iter()
        .enumerate()
        .map(|(n, fence)| {
            let store = f.store.clone();
            tokio::spawn(async move {
                store
                    .append(&format!("i{n}"), vec![ChatMessage::user("more")], &fence)
                    .await
            })
        })
        .collect();
    // Wait until every connection of the writes' pool waits on a lock.
    let waiting = "SELECT COUNT(*) FROM pg_stat_activity \
                   WHERE datname = current_database() AND wait_event_type = 'Lock'";
    tokio::time::timeout(Duration::from_secs(10), async {
        while watcher
            .query_one(waiting, &[])
            .await
            .unwrap()
            .get::<_, i64>(0)
            < postgres::POOL_SIZE as i64
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the writes never all waited on the lock");
    let read = Duration::from_secs(2);
    let status = tokio::time::timeout(read, f.store.status("i0"))
        .await
        .expect("get_status waited behind the writes")
        .unwrap()
        .unwrap();
    assert_eq!(status.status, Status::Queued);
    let row = tokio::time::timeout(read, f.store.get("i1"))
        .await
        .expect("a row read waited behind the writes")
        .unwrap()
        .unwrap();
    assert_eq!(row.epoch, 1);
    let transcript = tokio::time::timeout(read, f.store.messages("i2", 0))
        .await
        .expect("a transcript read waited behind the writes")
        .unwrap();
    assert_eq!(transcript.len(), 1);
    assert!(writes.iter().all(|w| !w.is_finished()));
    lock.rollback().await.unwrap();
    for w in writes {
        w.await.unwrap().unwrap();
    }
    for n in 0..turns {
        let transcript = f.store.messages(&format!("i{n}"), 0).await.unwrap();
        assert_eq!(transcript.len(), 2, "i{n}");
    }
}

async fn sessions_are_listed_a_page_at_a_time(f: Fixture) {
    let t = terms("a", 60_000);
    let a = start(&f.store, "a", &t).await;
    start(&f.store, "b", &t).await;
    let c = start(&f.store, "c", &t).await;
    let call = ToolCall::new("x1", "bash", "{}".into());
    f.store
        .append(
            "a",
            vec![
                ChatMessage::assistant(String::new(), vec![call]),
                ChatMessage::tool("x1", "ok"),
            ],
            &a,
        )
        .await
        .unwrap();
    f.store
        .transition(
            "c",
            OPEN,
            Status::Failed,
            Some("boom".into()),
            vec![],
            Some(&c),
        )
        .await
        .unwrap();
    let list = |q: ListQuery| {
        let store = f.store.clone();
        async move { store.list_sessions(&q).await.unwrap() }
    };
    let ids = |rows: &[SessionSummary]| -> Vec<String> {
        rows.iter().map(|r| r.invocation_id.clone()).collect()
    };
    let all = list(ListQuery {
        limit: 10,
        ..ListQuery::default()
    })
    .await;
    let mut sorted = all.clone();
    sorted.sort_by(|x, y| (y.created_ms, &y.invocation_id).cmp(&(x.created_ms, &x.invocation_id)));
    assert_eq!(ids(&all), ids(&sorted));
    let mut got: Vec<String> = ids(&all);
    got.sort();
    assert_eq!(got, vec!["a", "b", "c"]);
    // Two pages, the second after the first's last row, make the whole list.
    let first = list(ListQuery {
        limit: 2,
        ..ListQuery::default()
    })
    .await;
    let last = first.last().unwrap();
    let second = list(ListQuery {
        limit: 2,
        before: Some((last.created_ms, last.invocation_id.clone())),
        ..ListQuery::default()
    })
    .await;
    assert_eq!([ids(&first), ids(&second)].concat(), ids(&all));
    let a_row = all.iter().find(|r| r.invocation_id == "a").unwrap();
    assert_eq!((a_row.steps, a_row.tool_calls, a_row.swept), (1, 1, false));
    // Each message keeps when it was stored, in order.
    let times: Vec<i64> = f
        .store
        .message_times("a")
        .await
        .unwrap()
        .into_iter()
        .map(Option::unwrap)
        .collect();
    assert_eq!(times.len(), 3);
    assert!(
        times.windows(2).all(|w| w[0] <= w[1]) && times[0] >= a_row.created_ms - 1000,
        "{times:?}"
    );
    let failed = list(ListQuery {
        status: Some(Status::Failed),
        limit: 10,
        ..ListQuery::default()
    })
    .await;
    assert_eq!(
        failed
            .iter()
            .map(|r| (r.invocation_id.as_str(), r.error.as_deref()))
            .collect::<Vec<_>>(),
        vec![("c", Some("boom"))]
    );
    let found = |text: &str| {
        list(ListQuery {
            search: Some(text.to_owned()),
            limit: 10,
            ..ListQuery::default()
        })
    };
    assert_eq!(ids(&found("s-b").await), vec!["b"]);
    assert_eq!(ids(&found("%").await), Vec::<String>::new());
}

async fn tokens_are_summed_under_the_fence(f: Fixture) {
    let t = terms("a", 60_000);
    let a = start(&f.store, "a", &t).await;
    start(&f.store, "b", &t).await;
    let tokens = |id: &'static str| {
        let store = f.store.clone();
        async move { store.get(id).await.unwrap().unwrap().tokens }
    };
    // No model call reported any yet: no count, not zero.
    assert_eq!(tokens("a").await, Tokens::default());
    let counts = |input, output| Tokens { input, output };
    f.store
        .add_tokens("a", counts(Some(10), Some(2)), &a)
        .await
        .unwrap();
    // A call that reports one count adds to that sum alone.
    f.store
        .add_tokens("a", counts(Some(5), None), &a)
        .await
        .unwrap();
    f.store
        .add_tokens("a", counts(None, None), &a)
        .await
        .unwrap();
    assert_eq!(tokens("a").await, counts(Some(15), Some(2)));
    let mut listed: Vec<(String, Tokens)> = f
        .store
        .list_sessions(&ListQuery {
            limit: 10,
            ..ListQuery::default()
        })
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.invocation_id, r.tokens))
        .collect();
    listed.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(
        listed,
        vec![
            ("a".to_owned(), counts(Some(15), Some(2))),
            ("b".to_owned(), Tokens::default())
        ]
    );
    // A replica whose claim was taken over adds nothing.
    let stale = Fence {
        owner: "b-replica".into(),
        epoch: a.epoch,
    };
    let err = f
        .store
        .add_tokens("a", counts(Some(1), Some(1)), &stale)
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Fenced(ref id) if id == "a"),
        "{err}"
    );
    assert_eq!(tokens("a").await, counts(Some(15), Some(2)));
}
