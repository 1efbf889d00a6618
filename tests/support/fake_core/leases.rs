//! Core's work queue (v5 §2, §7, §8; v2 notes §1.3, §1.6, §1.7): the grants the test queues,
//! the `lease` requests waiting for them, renewals, releases, and which connection holds which
//! run.
//!
//! What it refuses, as core does: a `lease` with any param (`invalid`); a run request
//! (`lease.renew`, `lease.release`, an output method) whose params are not exactly the
//! method's, with an empty `runId`, or a release whose `reason` is not `shutdown`,
//! `ownership.lost` or `connection.lost` (`invalid`); any run request, artifact or journal
//! request naming a run this connection does not hold (`run_not_held`). A renewal answered
//! `{ok: false}`, a release and a taken output end the run's hold; so does the connection's
//! end, which also drops its waiting leases and ends its runs' open uploads. Outputs of a run
//! the journal knows (a turn) are checked and stored by [`crate::fake_journal`].

use std::collections::VecDeque;

use serde::Deserialize;
use serde_json::{Value, json};

use super::{Answer, CoreState, Event, FakeCore, invalid};

/// The run requests answered here: they name a run the connection must hold.
pub(super) const RUN_METHODS: [&str; 7] = [
    "lease.renew",
    "lease.release",
    "turn.completed",
    "turn.failed",
    "turn.waiting",
    "turn.paused",
    "checkpoint",
];

impl FakeCore {
    /// Queues a grant for the next `lease`; returns the `RunGrant` sent.
    pub fn grant(&self, run_id: &str, token: &str) -> Value {
        let run = json!({
            "runId": run_id,
            "sessionId": format!("ses_{run_id}"),
            "turnId": format!("turn_{run_id}"),
            "epoch": 1,
            "token": token,
            "tokenExpiresAt": "2030-01-01T00:00:00.000Z",
        });
        self.grant_value(
            json!({"run": run.clone(), "input": {"type": "turn.start", "engine": "agent"}}),
        );
        run
    }

    /// Queues a raw lease answer.
    pub fn grant_value(&self, answer: Value) {
        self.state.grants.lock().unwrap().push_back(answer);
        self.state.serve_waiting();
    }

    /// The next renewal of `run_id` answers `reply`.
    pub fn renew_reply(&self, run_id: &str, reply: Value) {
        self.state
            .renew_replies
            .lock()
            .unwrap()
            .entry(run_id.to_owned())
            .or_default()
            .push_back(reply);
    }

    /// What podhost sent about `run_id` on `conn`, in order, renewals left out:
    /// `(method, params)`.
    pub fn run_frames(&self, conn: u64, run_id: &str) -> Vec<(String, Value)> {
        self.frames_from_pod(conn)
            .into_iter()
            .filter(|f| f["t"] == "req" && f["p"]["runId"] == run_id && f["m"] != "lease.renew")
            .map(|f| (f["m"].as_str().unwrap().to_owned(), f["p"].clone()))
            .collect()
    }

    /// The methods of [`run_frames`](Self::run_frames), in order.
    pub fn run_methods(&self, conn: u64, run_id: &str) -> Vec<String> {
        self.run_frames(conn, run_id)
            .into_iter()
            .map(|(m, _)| m)
            .collect()
    }

    /// Waits for the run's end (an output or a release) and for core's answer to it:
    /// `(the end's frame, core's answer)`.
    pub async fn wait_run_end(&self, run_id: &str) -> (Value, Value) {
        const ENDS: [&str; 6] = [
            "turn.completed",
            "turn.failed",
            "turn.waiting",
            "turn.paused",
            "checkpoint",
            "lease.release",
        ];
        let (_, (conn, frame)) = self
            .wait_from(0, &format!("the end of {run_id}"), |e| match e {
                Event::FromPod { conn, frame }
                    if frame["t"] == "req"
                        && frame["p"]["runId"] == run_id
                        && ENDS.contains(&frame["m"].as_str().unwrap_or("")) =>
                {
                    Some((*conn, frame.clone()))
                }
                _ => None,
            })
            .await;
        let id = frame["id"].clone();
        let (_, answer) = self
            .wait_from(0, "core's answer to the end", |e| match e {
                Event::ToPod { conn: c, frame: f }
                    if *c == conn && f["t"] == "res" && f["id"] == id =>
                {
                    Some(f.clone())
                }
                _ => None,
            })
            .await;
        (frame, answer)
    }

    /// Runs held on any connection.
    pub fn held(&self) -> Vec<String> {
        let mut v: Vec<_> = self.state.held.lock().unwrap().keys().cloned().collect();
        v.sort();
        v
    }
}

impl CoreState {
    /// Whether connection `conn` holds `run`.
    pub(super) fn holds(&self, conn: u64, run: &str) -> bool {
        self.held.lock().unwrap().get(run) == Some(&conn)
    }

    /// `lease {}`: waits for a grant (`None`: no answer yet).
    pub(super) fn lease(&self, conn: u64, rid: u64, p: Value) -> Answer {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Lease {}
        if let Err(e) = serde_json::from_value::<Lease>(p) {
            return Some(Err(invalid("lease", e)));
        }
        self.waiting.lock().unwrap().push_back((conn, rid));
        self.serve_waiting();
        None
    }

    /// A waiting lease the harness gave up on (`abort`): dropped, answered nothing.
    pub(super) fn lease_aborted(&self, conn: u64, rid: u64) {
        self.waiting
            .lock()
            .unwrap()
            .retain(|(c, l)| !(*c == conn && *l == rid));
    }

    /// Connection `conn` is gone: its waiting leases go, its runs end (`connection.lost` on
    /// core's side) and their open uploads with them.
    pub(super) fn connection_lost(&self, conn: u64) {
        self.waiting.lock().unwrap().retain(|(c, _)| *c != conn);
        let ended: Vec<String> = self
            .held
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, c)| **c == conn)
            .map(|(r, _)| r.clone())
            .collect();
        for run in ended {
            self.artifacts.on_run_end(&run);
        }
        self.held.lock().unwrap().retain(|_, c| *c != conn);
    }

    /// One of [`RUN_METHODS`], from connection `conn`.
    pub(super) fn run_request(
        &self,
        conn: u64,
        m: &str,
        p: Value,
    ) -> Result<Value, (String, String)> {
        let run_id = self.check_run_params(m, &p).map_err(|e| invalid(m, e))?;
        if !self.holds(conn, &run_id) {
            return Err((
                "run_not_held".to_owned(),
                format!("Run {run_id} is not held by this harness"),
            ));
        }
        match m {
            "lease.renew" => {
                let reply = self
                    .renew_replies
                    .lock()
                    .unwrap()
                    .get_mut(&run_id)
                    .and_then(VecDeque::pop_front)
                    .unwrap_or_else(|| json!({"ok": true}));
                if reply["ok"] == false {
                    self.held.lock().unwrap().remove(&run_id);
                    self.journal.run_over(&run_id);
                } else if let Some(token) = reply["token"].as_str() {
                    self.journal.renewed(&run_id, token);
                }
                Ok(reply)
            }
            "lease.release" => {
                self.held.lock().unwrap().remove(&run_id);
                self.journal.run_over(&run_id);
                self.artifacts.on_run_end(&run_id);
                Ok(json!({}))
            }
            _ if self.journal.run(&run_id).is_some() => {
                let settled = self.journal.output(&run_id, m, &p);
                if settled.is_ok() {
                    self.held.lock().unwrap().remove(&run_id);
                    self.artifacts.on_run_end(&run_id);
                }
                settled
            }
            _ => {
                self.held.lock().unwrap().remove(&run_id);
                self.artifacts.on_run_end(&run_id);
                Ok(json!({"cursor": 7}))
            }
        }
    }

    /// Strict params of the run requests; returns the run id.
    fn check_run_params(&self, m: &str, p: &Value) -> Result<String, String> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "camelCase")]
        struct Renew {
            run_id: String,
        }
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "camelCase")]
        struct Release {
            run_id: String,
            reason: String,
        }
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "camelCase")]
        struct Output {
            run_id: String,
            status: Option<String>,
            state: Option<Value>,
            output: Option<Value>,
            pending: Option<Value>,
            error: Option<Value>,
            effect_ids: Option<Vec<String>>,
            cancel_effect_ids: Option<Vec<String>>,
            transcript: Option<Vec<Value>>,
            thrown: Option<Value>,
        }
        let p = p.clone();
        let run_id = match m {
            "lease.renew" => {
                serde_json::from_value::<Renew>(p)
                    .map_err(|e| e.to_string())?
                    .run_id
            }
            "lease.release" => {
                let r: Release = serde_json::from_value(p).map_err(|e| e.to_string())?;
                if !["shutdown", "ownership.lost", "connection.lost"].contains(&r.reason.as_str()) {
                    return Err(format!("unknown reason {}", r.reason));
                }
                r.run_id
            }
            _ => {
                serde_json::from_value::<Output>(p)
                    .map_err(|e| e.to_string())?
                    .run_id
            }
        };
        if run_id.is_empty() {
            return Err("runId is empty".to_owned());
        }
        Ok(run_id)
    }

    /// Answers waiting leases from the grant queue.
    pub(super) fn serve_waiting(&self) {
        loop {
            let pair = {
                let mut grants = self.grants.lock().unwrap();
                let mut waiting = self.waiting.lock().unwrap();
                if grants.is_empty() || waiting.is_empty() {
                    return;
                }
                (waiting.pop_front().unwrap(), grants.pop_front().unwrap())
            };
            let ((conn, rid), grant) = pair;
            let c = self.conns.lock().unwrap().get(&conn).cloned();
            let Some(c) = c else {
                self.grants.lock().unwrap().push_front(grant);
                continue;
            };
            if let Some(run_id) = grant["run"]["runId"].as_str() {
                self.held.lock().unwrap().insert(run_id.to_owned(), conn);
            }
            self.artifacts.on_grant(&grant);
            let mut grant = grant;
            if self.opts.answer_extras {
                grant["offeredAt"] = json!(1_700_000_000_000u64);
                grant["run"]["priority"] = json!("normal");
            }
            self.send(
                &c,
                conn,
                json!({"t": "res", "id": rid, "ok": true, "r": grant}),
            );
        }
    }
}
