//! Joining and staying joined: the join body, the volume id, refusals and retries, renewals.

use pretty_assertions::assert_eq;
use serde_json::json;

use crate::fake_core::{CoreOptions, Event, FakeCore, Refusal};
use crate::{PodDirs, PodProcess, mode_of, pod_env, set_env};

fn joins(core: &FakeCore) -> Vec<(serde_json::Value, u16)> {
    core.events()
        .into_iter()
        .filter_map(|e| match e {
            Event::Join { body, status } => Some((body, status)),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn join_sends_the_body_and_keeps_one_volume_id() {
    let core = FakeCore::start(CoreOptions::default()).await;
    let dirs = PodDirs::new(&core);
    let env = pod_env(&core, &dirs);
    let mut pod = PodProcess::spawn(&env);
    core.wait_request(0, "hello").await;

    let volume_file = dirs.root.join("volume-id");
    let volume = std::fs::read_to_string(&volume_file)
        .unwrap()
        .trim()
        .to_owned();
    assert_eq!(mode_of(&volume_file), 0o600);
    assert_eq!(
        joins(&core),
        vec![(
            json!({
                "sandboxId": "sbx_test",
                "podUid": "pod-uid-1",
                "joinToken": "join-token-1",
                "volumeId": volume,
            }),
            200
        )]
    );
    pod.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(pod.wait_exit(crate::WAIT).await.success());

    // A restart on the same volume sends the same id and leaves the file as it was.
    let before = std::fs::metadata(&volume_file).unwrap().modified().unwrap();
    let mark = core.mark();
    let mut pod = PodProcess::spawn(&env);
    core.wait_request(mark, "hello").await;
    let all = joins(&core);
    assert_eq!(all.len(), 2);
    assert_eq!(all[1].0["volumeId"], volume.as_str());
    assert_eq!(
        std::fs::metadata(&volume_file).unwrap().modified().unwrap(),
        before
    );
    pod.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(pod.wait_exit(crate::WAIT).await.success());
}

#[tokio::test]
async fn a_refused_join_is_reported_and_the_next_attempt_reads_a_new_token() {
    let core = FakeCore::start(CoreOptions::default()).await;
    let dirs = PodDirs::new(&core);
    // The token was reset: the file still holds the old one.
    core.set_join_token("join-token-2");
    let pod = PodProcess::spawn(&pod_env(&core, &dirs));
    let line = pod
        .wait_log(&["the join was refused", "sbx_test", "HTTP 401"])
        .await;
    assert!(!line.contains("join-token"), "a token in the log: {line}");
    std::fs::write(&dirs.join_file, "join-token-2\n").unwrap();
    core.wait_request(0, "hello").await;
    let all = joins(&core);
    assert!(all.len() >= 2, "{all:?}");
    assert_eq!(all[0].0["joinToken"], "join-token-1");
    assert_eq!(all[0].1, 401);
    let last = all.last().unwrap();
    assert_eq!(
        (last.0["joinToken"].as_str(), last.1),
        (Some("join-token-2"), 200)
    );
    assert!(
        pod.logs().iter().all(|l| !l.contains("join-token")),
        "a token in the logs"
    );
}

#[tokio::test]
async fn an_unavailable_core_is_retried_with_backoff() {
    let core = FakeCore::start(CoreOptions::default()).await;
    core.refuse_joins(&[Refusal::Unavailable, Refusal::Unavailable]);
    let dirs = PodDirs::new(&core);
    let pod = PodProcess::spawn(&pod_env(&core, &dirs));
    core.wait_request(0, "hello").await;
    let statuses: Vec<u16> = joins(&core).into_iter().map(|(_, s)| s).collect();
    assert_eq!(statuses, vec![503, 503, 200]);
    pod.wait_log(&["join or renew failed; retrying", "HTTP 503", "Try again"])
        .await;
}

#[tokio::test]
async fn a_refused_renewal_joins_again() {
    let core = FakeCore::start(CoreOptions::default()).await;
    core.refuse_renewals(&[Refusal::Unauthorized]);
    let dirs = PodDirs::new(&core);
    let mut env = pod_env(&core, &dirs);
    set_env(&mut env, "PODHOST_POD_RENEW_INTERVAL_MS", "200");
    let pod = PodProcess::spawn(&env);
    // The first renewal is refused, so podhost joins again (a new epoch), and core closes the
    // old epoch's connection; podhost reconnects with the new host token.
    let joined = |e: &Event| matches!(e, Event::Join { status: 200, .. }).then_some(());
    let (first, ()) = core.wait_from(0, "the first join", joined).await;
    core.wait("a refused renewal", |e| {
        matches!(e, Event::Renew { status: 401, .. }).then_some(())
    })
    .await;
    core.wait_from(first + 1, "a second join", joined).await;
    let statuses: Vec<u16> = joins(&core).into_iter().map(|(_, s)| s).collect();
    assert_eq!(&statuses[..2], &[200, 200]);
    pod.wait_log(&["the renewal was refused; joining again"])
        .await;
    // Renewals then go on with the new token.
    core.wait("an accepted renewal", |e| match e {
        Event::Renew {
            status: 200,
            bearer,
        } => bearer.clone().filter(|b| b == "host-token-epoch-2"),
        _ => None,
    })
    .await;
}
