//! Three replicas of `podhost serve` on loopback, sharing one PostgreSQL store (a throwaway
//! cluster) and one workspace directory: any replica answers; one turn per invocation; cancel
//! through any replica; a dead or paused replica's turns taken over; a restarted one serves.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pretty_assertions::assert_eq;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{Options, Serve, T, start, status_obj, store_url};
use crate::openai_fake::{FakeModel, Reply};

/// `n` replicas on the data directory of `dir` and its PostgreSQL database; `None` (the test
/// then skips, saying so) without PostgreSQL outside CI.
fn replicas(dir: &std::path::Path, n: usize, opts: Options) -> Option<Vec<Arc<Serve>>> {
    let url = store_url(&dir.join("data"))?;
    let opts = opts.env("PODHOST_STORE", &url);
    Some(
        (0..n)
            .map(|_| Arc::new(Serve::start_with(dir, opts.clone())))
            .collect(),
    )
}

/// Whether any process's command line holds `marker`.
fn process_with(marker: &str) -> bool {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .any(|e| {
            std::fs::read(e.path().join("cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(marker))
                .unwrap_or(false)
        })
}

async fn until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "{what} within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Submits `body` to `s` until it is accepted, retrying a busy answer (409 without an
/// invocation id) as Oumi does.
async fn submit_accepted(s: &Serve, body: &Value) -> (StatusCode, Value) {
    // As Oumi does (protocol, "Errors"): a 409 without an invocation id (busy), a 429, any 5xx,
    // a timeout or a dropped connection is retried with the same invocation id. A starved
    // replica may answer so; what it must not do is lose or repeat the turn (checked below).
    let deadline = Instant::now() + T * 6;
    loop {
        let why = match s.try_submit(body.clone()).await {
            Ok((code, answer))
                if (code == StatusCode::CONFLICT && answer.get("invocation_id").is_none())
                    || code == StatusCode::TOO_MANY_REQUESTS
                    || code.is_server_error() =>
            {
                format!("{code}: {answer}")
            }
            Ok(answered) => return answered,
            Err(e) => e,
        };
        assert!(Instant::now() < deadline, "no answer for too long: {why}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn five_hundred_sessions_round_robin_across_three_replicas() {
    round_robin(Starve::None).await;
}

/// One replica of three starved — held to 0.05 of a core where a cgroup CPU quota can be set,
/// and stopped twice for longer than its lease — misses its renewals, yet none of its turns is
/// taken over or failed: it is alive (its liveness lock is held), so it keeps them.
#[tokio::test]
async fn five_hundred_sessions_with_one_replica_starved_lose_no_turn() {
    round_robin(Starve::Second).await;
}

#[derive(Clone, Copy, PartialEq)]
enum Starve {
    None,
    Second,
}

/// Puts `pid` under a CPU quota of 0.05 of a core (cgroup v1's CPU controller); `None` where
/// one cannot be set here.
fn starve(pid: u32) -> Option<std::path::PathBuf> {
    let dir = std::path::PathBuf::from(format!(
        "/sys/fs/cgroup/cpu/podhost-test-starved-{}",
        std::process::id()
    ));
    std::fs::create_dir(&dir).ok()?;
    let ok = std::fs::write(dir.join("cpu.cfs_period_us"), "100000").is_ok()
        && std::fs::write(dir.join("cpu.cfs_quota_us"), "5000").is_ok()
        && std::fs::write(dir.join("cgroup.procs"), pid.to_string()).is_ok();
    if !ok {
        let _ = std::fs::remove_dir(&dir);
        return None;
    }
    Some(dir)
}

async fn round_robin(how: Starve) {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some("k")).await;
    fake.respond_with(|body| {
        let task = body["messages"][1]["content"].as_str().unwrap_or_default();
        Reply::Text(format!("done: {task}"))
    });
    let Some(rs) = replicas(dir.path(), 3, Options::default()) else {
        return;
    };
    const N: usize = 500;
    let url = fake.base_url();
    let starved = rs[1].child.id();
    let quota = match how {
        Starve::None => None,
        Starve::Second => {
            let quota = starve(starved);
            if quota.is_none() {
                println!(
                    "no cgroup CPU quota can be set here: the second replica is only stopped \
                     past its lease, twice"
                );
            }
            quota
        }
    };
    // Twice, while turns run, the second replica stops for longer than its lease (3 s).
    let pauses = (how == Starve::Second).then(|| {
        tokio::spawn(async move {
            let pid = nix::unistd::Pid::from_raw(starved as i32);
            for _ in 0..2 {
                tokio::time::sleep(Duration::from_secs(2)).await;
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP);
                tokio::time::sleep(Duration::from_millis(4500)).await;
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
            }
        })
    });
    let mut tasks = Vec::new();
    for n in 0..N {
        let s = rs[n % 3].clone();
        let body = start(
            &format!("s{n}"),
            &format!("i{n}"),
            &format!("task {n}"),
            &url,
            Some("k"),
        );
        tasks.push(tokio::spawn(
            async move { submit_accepted(&s, &body).await },
        ));
    }
    for (n, t) in tasks.into_iter().enumerate() {
        let (code, body) = t.await.unwrap();
        assert_eq!(code, StatusCode::ACCEPTED, "i{n}: {body}");
    }
    // Statuses and outputs from a replica other than the one that took the submission.
    let deadline = Instant::now() + T * 18;
    for n in 0..N {
        let (id, s) = (format!("i{n}"), &rs[(n + 1) % 3]);
        s.wait_status(
            &id,
            "completed",
            deadline.saturating_duration_since(Instant::now()),
        )
        .await;
        let (code, out) = rs[(n + 2) % 3].collect(&id).await;
        assert_eq!(code, StatusCode::OK, "{out}");
        assert_eq!(
            out["messages"],
            json!([{"role": "assistant", "content": format!("done: task {n}")}])
        );
    }
    // Every invocation's turn ran once: one model call each.
    let mut tasks: Vec<String> = fake
        .requests()
        .iter()
        .map(|r| {
            r.body["messages"][1]["content"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    tasks.sort();
    tasks.dedup();
    assert_eq!((fake.requests().len(), tasks.len()), (N, N));
    if let Some(p) = pauses {
        p.await.unwrap();
    }
    for r in &rs {
        let logs = r.logs();
        assert!(
            !logs.contains("resuming a turn whose replica stopped")
                && !logs.contains("taking up a turn whose replica stopped")
                && !logs.contains("lease was lost"),
            "a turn was taken over: {}",
            r.log_tail()
        );
    }
    if let Some(q) = quota {
        drop(rs);
        let _ = std::fs::remove_dir(q);
    }
}

#[tokio::test]
async fn the_same_submit_to_two_replicas_at_once_starts_one_turn() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some("k")).await;
    // Long enough that the turns still run when the second replica has seen the owner alive
    // (a renewal of its lease, at most a third of a lease later).
    fake.respond_with(|_| Reply::Delay(Duration::from_secs(4), Box::new(Reply::text("once"))));
    let Some(rs) = replicas(dir.path(), 2, Options::default()) else {
        return;
    };
    let url = fake.base_url();
    let tasks: Vec<_> = (0..10)
        .map(|n| {
            let (a, b) = (rs[0].clone(), rs[1].clone());
            let body = start(&format!("s{n}"), &format!("i{n}"), "x", &url, Some("k"));
            tokio::spawn(async move {
                let (x, y) = tokio::join!(a.submit(body.clone()), b.submit(body));
                [x, y]
            })
        })
        .collect();
    for (n, t) in tasks.into_iter().enumerate() {
        // Both answer as the protocol says for a first and a repeated submission: 202 and the
        // current status.
        for (code, body) in t.await.unwrap() {
            assert_eq!(code, StatusCode::ACCEPTED, "{body}");
            assert!(
                ["queued", "running"].contains(&body["status"].as_str().unwrap()),
                "{body}"
            );
            assert_eq!(
                (&body["invocation_id"], &body["session_id"]),
                (&json!(format!("i{n}")), &json!(format!("s{n}")))
            );
        }
    }
    for n in 0..10 {
        rs[n % 2]
            .wait_status(&format!("i{n}"), "completed", T)
            .await;
    }
    assert_eq!(fake.requests().len(), 10);
}

#[tokio::test]
async fn cancel_through_a_replica_that_does_not_own_the_turn_kills_the_command() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", None).await;
    let marker = format!("podhost-replica-cancel-{}", std::process::id());
    fake.push([Reply::call(
        "b",
        "bash",
        json!({"command": format!("(sleep 300; echo {marker}) & sleep 301 # {marker}")}),
    )]);
    let Some(rs) = replicas(dir.path(), 2, Options::default()) else {
        return;
    };
    rs[0]
        .submit(start("s", "i", "x", &fake.base_url(), None))
        .await;
    until("the command starts", T, || process_with(&marker)).await;
    assert_eq!(
        rs[1].cancel("s", "i").await,
        (StatusCode::OK, status_obj("s", "i", "cancelled"))
    );
    until("the command dies", T, || !process_with(&marker)).await;
    assert_eq!(rs[0].status("i").await.1, status_obj("s", "i", "cancelled"));
    let logs = rs[0].logs();
    assert!(logs.contains("cancelled through another replica"), "{logs}");
    assert_eq!(fake.requests().len(), 1);
}

#[tokio::test]
async fn a_dead_replicas_turns_are_taken_over_or_failed_after_the_grace() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some("k1")).await;
    // Every turn's first call hangs until released; the taken-over turn's call on another
    // replica answers at once.
    fake.respond_with(|body| {
        let task = body["messages"][1]["content"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if task.ends_with("again") {
            Reply::Text(format!("finished {task}"))
        } else {
            Reply::Hang(Box::new(Reply::Text(format!("finished {task}"))))
        }
    });
    let Some(rs) = replicas(
        dir.path(),
        3,
        Options::default().env("PODHOST_ORPHAN_GRACE_SECS", "2"),
    ) else {
        return;
    };
    let url = fake.base_url();
    // On the replica that dies: "retried" (its submit is retried with a fresh key) and
    // "abandoned" (never retried). On the others: "b" and "c".
    let body =
        |id: &str, task: &str, key: &str| start(&format!("s-{id}"), id, task, &url, Some(key));
    rs[0].submit(body("retried", "retried", "k1")).await;
    rs[0].submit(body("abandoned", "abandoned", "k1")).await;
    rs[0].submit(body("cancelled", "cancelled", "k1")).await;
    rs[1].submit(body("b", "b", "k1")).await;
    rs[2].submit(body("c", "c", "k1")).await;
    fake.wait_requests(5, T).await;
    // kill -9 the first replica.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(rs[0].child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // The evaluator retries "retried" (its answer was lost) with a fresh key, to another
    // replica. The task text is the same; the fake model tells the re-run by its key.
    fake.accept_keys(&["k1", "k2"]);
    fake.respond_with(|body| {
        let task = body["messages"][1]["content"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        Reply::Text(format!("finished {task}"))
    });
    // A cancel of a turn whose owner is dead is terminal at once, through any replica.
    assert_eq!(
        rs[2].cancel("s-cancelled", "cancelled").await,
        (
            StatusCode::OK,
            status_obj("s-cancelled", "cancelled", "cancelled")
        )
    );
    let (code, answer) = rs[1].submit(body("retried", "retried", "k2")).await;
    assert_eq!(code, StatusCode::ACCEPTED, "{answer}");
    rs[2].wait_status("retried", "completed", T * 2).await;
    assert_eq!(
        rs[2].collect("retried").await.1["messages"],
        json!([{"role": "assistant", "content": "finished retried"}])
    );
    let failed = rs[1].wait_status("abandoned", "failed", T * 2).await;
    assert_eq!(
        failed["error"]["message"],
        "the podhost replica running this turn stopped (a restart, a crash, or a lost lease). The model API key is never stored, so the turn could not go on, and no retried submission brought a fresh key within 2 s."
    );
    // The others are untouched: released, they complete on their own replicas.
    fake.release();
    rs[1].wait_status("b", "completed", T).await;
    rs[2].wait_status("c", "completed", T).await;
    // Model calls: one per turn, and the taken-over turn's call once more (the documented
    // re-run: its answer was never committed).
    let reqs = fake.requests();
    let calls = |task: &str| {
        reqs.iter()
            .filter(|r| r.body["messages"][1]["content"] == task)
            .map(|r| r.authorization.clone().unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(calls("retried"), ["Bearer k1", "Bearer k2"]);
    assert_eq!(calls("abandoned"), ["Bearer k1"]);
    assert_eq!(calls("cancelled"), ["Bearer k1"]);
    assert_eq!(
        rs[1].status("cancelled").await.1,
        status_obj("s-cancelled", "cancelled", "cancelled")
    );
    assert_eq!(calls("b"), ["Bearer k1"]);
    assert_eq!(calls("c"), ["Bearer k1"]);
}

/// Ends the liveness connection of the replica whose process is `pid` (the server frees its
/// lock at once), as a replica cut off from the store, or whose machine froze, loses it.
async fn end_liveness(dir: &std::path::Path, pid: u32) {
    let url = store_url(&dir.join("data")).unwrap();
    let (admin, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let driver = tokio::spawn(conn);
    let ended: i64 = admin
        .query_one(
            "SELECT COUNT(pg_terminate_backend(l.pid)) FROM pg_locks l JOIN replicas r \
             ON l.objid = r.lock_key::oid WHERE l.locktype = 'advisory' AND l.database = \
             (SELECT oid FROM pg_database WHERE datname = current_database()) \
             AND l.classid = 1886348291 AND r.owner LIKE '%-' || $1 || '-%'",
            &[&pid.to_string()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(ended, 1, "the liveness connection of replica {pid}");
    drop(admin);
    let _ = driver.await;
}

/// A replica that does not run for longer than its lease (stopped, as a busy machine or a CPU
/// quota stops it) is still alive — its liveness lock is held — so no other replica takes its
/// turn: the turn goes on when it runs again, and its command ran once.
#[tokio::test]
async fn a_replica_paused_past_its_lease_keeps_its_turn() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some("k")).await;
    let marker = format!("podhost-replica-kept-{}", std::process::id());
    // Not the last command: bash waits for it (rather than becoming it), so its command line
    // keeps the marker.
    let command = format!("echo ran >> runs.txt; sleep 8; : {marker}");
    fake.push([
        Reply::call("b", "bash", json!({"command": command})),
        Reply::text("finished"),
    ]);
    let Some(rs) = replicas(
        dir.path(),
        2,
        Options::default().env("PODHOST_ORPHAN_GRACE_SECS", "1"),
    ) else {
        return;
    };
    rs[0]
        .submit(start("s", "i", "x", &fake.base_url(), Some("k")))
        .await;
    let deadline = Instant::now() + T;
    while !process_with(&marker) {
        assert!(
            Instant::now() < deadline,
            "no command: {}",
            rs[0].log_tail()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let paused = nix::unistd::Pid::from_raw(rs[0].child.id() as i32);
    nix::sys::signal::kill(paused, nix::sys::signal::Signal::SIGSTOP).unwrap();
    // Two leases (of 3 s) and the orphans' grace pass: the other replica neither takes the
    // turn nor fails it.
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert_eq!(rs[1].status("i").await.1, status_obj("s", "i", "running"));
    nix::sys::signal::kill(paused, nix::sys::signal::Signal::SIGCONT).unwrap();
    rs[1].wait_status("i", "completed", T).await;
    let (_, out) = rs[1].collect("i").await;
    assert_eq!(
        out["messages"][2],
        json!({"role": "assistant", "content": "finished"})
    );
    assert_eq!(fake.requests().len(), 2);
    assert_eq!(rs[1].read_file("s", "runs.txt").as_deref(), Some("ran\n"));
    let logs = rs[1].logs();
    assert!(
        !logs.contains("resuming a turn whose replica stopped") && !logs.contains("had no key"),
        "{logs}"
    );
}

/// A replica cut off from the store (its liveness connection ended) while it does not run:
/// past its lease another replica takes the turn up from its durable transcript; the cut-off
/// one, running again, writes nothing and kills its command.
#[tokio::test]
async fn a_replica_cut_off_past_its_lease_writes_nothing_and_kills_its_commands() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", None).await;
    let marker = format!("podhost-replica-paused-{}", std::process::id());
    fake.push([
        Reply::call(
            "b",
            "bash",
            json!({"command": format!("echo ran >> runs.txt; (sleep 300; echo {marker}) & sleep 301 # {marker}")}),
        ),
        Reply::text("recovered"),
    ]);
    let Some(rs) = replicas(dir.path(), 2, Options::default()) else {
        return;
    };
    rs[0]
        .submit(start("s", "i", "x", &fake.base_url(), None))
        .await;
    until("the command starts", T, || process_with(&marker)).await;
    let paused = nix::unistd::Pid::from_raw(rs[0].child.id() as i32);
    nix::sys::signal::kill(paused, nix::sys::signal::Signal::SIGSTOP).unwrap();
    end_liveness(dir.path(), rs[0].child.id()).await;
    // Past the lease, the other replica takes the turn up from its durable transcript: the
    // interrupted call is answered as such, never run again, and the model is asked on.
    rs[1].wait_status("i", "completed", T * 2).await;
    assert!(
        process_with(&marker),
        "the paused replica's command still runs while it is stopped"
    );
    nix::sys::signal::kill(paused, nix::sys::signal::Signal::SIGCONT).unwrap();
    until("the resumed replica kills its command", T, || {
        !process_with(&marker)
    })
    .await;
    // Said before the command is killed; the log reaches the test through a pipe and a reader,
    // which may not have caught up yet.
    let lost = |logs: &str| {
        logs.contains("lease was lost")
            || logs.contains("no lease renewal for a whole lease period")
    };
    until("the resumed replica says its lease was lost", T, || {
        lost(&rs[0].logs())
    })
    .await;
    // It wrote nothing: the transcript is the taking-over replica's, and it serves on.
    let (_, out) = rs[0].collect("i").await;
    assert_eq!(
        out["messages"],
        json!([
            {"role": "assistant", "tool_calls": [{"id": "b", "type": "function", "function":
                {"name": "bash", "arguments": json!({"command": format!("echo ran >> runs.txt; (sleep 300; echo {marker}) & sleep 301 # {marker}")}).to_string()}}]},
            {"role": "tool", "tool_call_id": "b", "content": podhost::chat::session::INTERRUPTED},
            {"role": "assistant", "content": "recovered"}
        ])
    );
    assert_eq!(rs[0].status("i").await.1, status_obj("s", "i", "completed"));
    assert_eq!(fake.requests().len(), 2);
    assert_eq!(rs[1].read_file("s", "runs.txt").as_deref(), Some("ran\n"));
}

/// A replica whose renewals fail for a whole lease (cut off from the store) stops its turn, as
/// another replica may take it; once it reaches the store again, its turn's lease still names it
/// (it is alive, so no other replica took it), and it takes the turn back with the key it kept:
/// the turn completes, its model called with the evaluator's key each time.
#[tokio::test]
async fn a_replica_cut_off_for_a_lease_takes_its_own_turn_back() {
    let dir = tempfile::tempdir().unwrap();
    let cut = dir.path().join("cut-off");
    let fake = FakeModel::start("fake-model", Some("k")).await;
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = calls.clone();
    // The first call outlasts the cut; the second answers at once.
    fake.respond_with(move |_| {
        if seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
            Reply::Delay(Duration::from_secs(30), Box::new(Reply::text("late")))
        } else {
            Reply::text("done")
        }
    });
    let failpoint = format!("serve.renew_fails=fail-while({})", cut.display());
    let Some(rs) = replicas(
        dir.path(),
        1,
        Options::default().env("PODHOST_FAILPOINTS", &failpoint),
    ) else {
        return;
    };
    rs[0]
        .submit(start("s", "i", "x", &fake.base_url(), Some("k")))
        .await;
    fake.wait_requests(1, T).await;
    std::fs::write(&cut, "").unwrap();
    let deadline = Instant::now() + T;
    while !rs[0]
        .logs()
        .contains("no lease renewal for a whole lease period")
    {
        assert!(Instant::now() < deadline, "{}", rs[0].log_tail());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    std::fs::remove_file(&cut).unwrap();
    assert_eq!(
        rs[0].wait_status("i", "completed", T).await,
        status_obj("s", "i", "completed")
    );
    assert!(
        rs[0]
            .logs()
            .contains("taking back a turn this replica stopped while cut off from the store"),
        "{}",
        rs[0].log_tail()
    );
    let keys: Vec<Option<String>> = fake
        .requests()
        .into_iter()
        .map(|r| r.authorization)
        .collect();
    assert_eq!(keys, vec![Some("Bearer k".to_owned()); 2]);
    let (_, out) = rs[0].collect("i").await;
    assert_eq!(
        out["messages"],
        json!([{"role": "assistant", "content": "done"}])
    );
}

#[tokio::test]
async fn a_restarted_replica_serves_again() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", None).await;
    fake.respond_with(|_| Reply::text("ok"));
    let Some(rs) = replicas(dir.path(), 2, Options::default()) else {
        return;
    };
    rs[0]
        .submit(start("s1", "i1", "x", &fake.base_url(), None))
        .await;
    rs[1].wait_status("i1", "completed", T).await;
    drop(rs);
    let Some(rs) = replicas(dir.path(), 1, Options::default()) else {
        return;
    };
    assert_eq!(
        rs[0].status("i1").await.1,
        status_obj("s1", "i1", "completed")
    );
    rs[0]
        .submit(start("s2", "i2", "x", &fake.base_url(), None))
        .await;
    rs[0].wait_status("i2", "completed", T).await;
    assert_eq!(fake.requests().len(), 2);
}

/// On a store replicas share, each session's uid from the pool is the store's to allocate: six
/// sessions submitted at once to two replicas (whose own pools would each pick the lowest free
/// uid at the same moment) run as six different uids of the pool, and each session's workspace
/// belongs to its uid.
#[tokio::test]
async fn sessions_on_different_replicas_never_share_a_uid() {
    use std::os::unix::fs::MetadataExt;
    if !nix::unistd::geteuid().is_root() {
        eprintln!("podhost is not root here: sessions share its uid (no uid pool to check)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some("k")).await;
    fake.respond_with(|body| {
        let ran = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["role"] == "tool");
        if ran {
            Reply::text("done")
        } else {
            Reply::call("c0", "bash", json!({"command": "id -u"}))
        }
    });
    let opts = Options::default().env("PODHOST_UID_POOL", "421000-421009");
    let Some(rs) = replicas(dir.path(), 2, opts) else {
        return;
    };
    let url = fake.base_url();
    let mut tasks = Vec::new();
    for n in 0..6 {
        let s = rs[n % 2].clone();
        let body = start(&format!("u{n}"), &format!("iu{n}"), "who", &url, Some("k"));
        tasks.push(tokio::spawn(async move {
            submit_accepted(&s, &body).await;
            s.wait_status(&format!("iu{n}"), "completed", T * 4).await;
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut uids = Vec::new();
    for n in 0..6 {
        let (_, out) = rs[0].collect(&format!("iu{n}")).await;
        let ran = out["messages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["role"] == "tool")
            .unwrap()["content"]
            .as_str()
            .unwrap()
            .to_owned();
        let ran: Value = serde_json::from_str(&ran).unwrap();
        let uid: u32 = ran["stdout"].as_str().unwrap().trim().parse().unwrap();
        assert!((421_000..=421_009).contains(&uid), "{uid}");
        let owner = std::fs::metadata(rs[0].workspace(&format!("u{n}")))
            .unwrap()
            .uid();
        assert_eq!(owner, uid, "session u{n}");
        uids.push(uid);
    }
    let mut distinct = uids.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 6, "{uids:?}");
    // Each is the uid the store holds for the session.
    let url = store_url(&dir.path().join("data")).unwrap();
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let driver = tokio::spawn(conn);
    for (n, uid) in uids.iter().enumerate() {
        let row = client
            .query_one(
                "SELECT uid FROM session_uids WHERE session_id = $1",
                &[&format!("u{n}")],
            )
            .await
            .unwrap();
        assert_eq!(row.get::<_, i64>(0), i64::from(*uid), "session u{n}");
    }
    drop(client);
    let _ = driver.await;
}
