//! Core's pod-host HTTP side (v5 §1, §9; v2 notes §1.1, §6.3): `POST …/host/join`,
//! `POST …/host/renew`, and the WebSocket upgrade of the Harness API.
//!
//! What it refuses, as core does: a non-`POST` on the host paths (405); a join body that is not
//! `{sandboxId, podUid, joinToken, volumeId?}` exactly (400), or over 8 KiB (400); a join whose
//! token, sandbox or pod is not the one expected, or whose `volumeId` differs from the first one
//! sent (401 with `WWW-Authenticate: Bearer`); a renewal without a current host token (401). A
//! join bumps the epoch: older host tokens stop working and open connections are closed. The
//! upgrade's refusal matrix: a closed Tenant 503, a wrong path 404, a missing or unknown bearer
//! 401 with `WWW-Authenticate: Bearer`, a missing `Nylorun-Harness-Api: 1` or `Upgrade` header
//! 426. The test scripts refusals of the next joins, renewals and upgrades on top.
//!
//! An accepted upgrade hands the socket to [`super::session`].

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_util::sync::CancellationToken;

use super::{CA_PEM, CoreState, Event, FakeCore};

const HARNESS_PATH: &str = "/nylorun/harness/v1";
const JOIN_PATH: &str = "/nylorun/harness/v1/host/join";
const RENEW_PATH: &str = "/nylorun/harness/v1/host/renew";

/// A refusal the test scripts for the next join or renew.
#[derive(Clone, Copy, Debug)]
pub enum Refusal {
    Unauthorized,
    Unavailable,
    Invalid,
}

impl FakeCore {
    /// A reset: the join file must now hold `token`.
    pub fn set_join_token(&self, token: &str) {
        *self.state.join_token.lock().unwrap() = token.to_owned();
    }

    pub fn refuse_joins(&self, refusals: &[Refusal]) {
        self.state.join_script.lock().unwrap().extend(refusals);
    }

    pub fn refuse_renewals(&self, refusals: &[Refusal]) {
        self.state.renew_script.lock().unwrap().extend(refusals);
    }

    /// The next upgrades get these statuses (401 with `WWW-Authenticate: Bearer`).
    pub fn refuse_upgrades(&self, statuses: &[u16]) {
        self.state.upgrade_script.lock().unwrap().extend(statuses);
    }

    /// While set, every upgrade is answered 503 (the Tenant is closed).
    pub fn set_tenant_closed(&self, closed: bool) {
        self.state.closed_tenant.store(closed, Ordering::SeqCst);
    }

    /// The next successful join carries this (`setup` and/or `seeded`).
    pub fn set_join_extras(&self, extras: Value) {
        *self.state.setup.lock().unwrap() = Some(extras);
    }
}

/// One HTTP request head.
struct Head {
    method: String,
    path: String,
    headers: HashMap<String, String>,
}

async fn read_head(stream: &mut TcpStream) -> Option<Head> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        if buf.len() > 64 * 1024 || stream.read(&mut byte).await.ok()? == 0 {
            return None;
        }
        buf.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&buf);
    let mut lines = text.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let method = first.next()?.to_owned();
    let path = first.next()?.to_owned();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Some(Head {
        method,
        path,
        headers,
    })
}

async fn respond(
    stream: &mut TcpStream,
    status: u16,
    extra: &[(&str, &str)],
    body: Option<&Value>,
) {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        426 => "Upgrade Required",
        503 => "Service Unavailable",
        _ => "Status",
    };
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let mut head = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-length: {}\r\nconnection: close\r\ncache-control: no-store\r\n",
        body.len()
    );
    if !body.is_empty() {
        head.push_str("content-type: application/json\r\n");
    }
    for (k, v) in extra {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(body.as_bytes()).await;
    let _ = stream.shutdown().await;
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct JoinBody {
    sandbox_id: String,
    pod_uid: String,
    join_token: String,
    volume_id: Option<String>,
}

fn refusal_body(r: Refusal) -> (u16, Value) {
    match r {
        Refusal::Unauthorized => (
            401,
            json!({"error": {"code": "unauthorized", "message": "The join was refused"}}),
        ),
        Refusal::Unavailable => (
            503,
            json!({"error": {"code": "unavailable", "message": "Try again"}}),
        ),
        Refusal::Invalid => (
            400,
            json!({"error": {"code": "invalid", "message": "Malformed request"}}),
        ),
    }
}

impl CoreState {
    /// Serves one connection to the listener: a host request, or an upgrade.
    pub(super) async fn http(self: Arc<Self>, mut stream: TcpStream, stop: CancellationToken) {
        let Some(head) = read_head(&mut stream).await else {
            return;
        };
        let is_host_path = head.path == JOIN_PATH || head.path == RENEW_PATH;
        if is_host_path && head.method != "POST" {
            return respond(&mut stream, 405, &[], None).await;
        }
        if head.path == JOIN_PATH {
            let len: usize = head
                .headers
                .get("content-length")
                .and_then(|l| l.parse().ok())
                .unwrap_or(0);
            if len > 8 * 1024 {
                let (s, b) = refusal_body(Refusal::Invalid);
                return respond(&mut stream, s, &[], Some(&b)).await;
            }
            let mut body = vec![0u8; len];
            if stream.read_exact(&mut body).await.is_err() {
                return;
            }
            let (status, answer) = self.join(&body);
            let body_json = serde_json::from_slice(&body)
                .unwrap_or_else(|_| json!({"raw": String::from_utf8_lossy(&body)}));
            self.record(Event::Join {
                body: body_json,
                status,
            });
            let extra: &[(&str, &str)] = if status == 401 {
                &[("www-authenticate", "Bearer")]
            } else {
                &[]
            };
            return respond(&mut stream, status, extra, Some(&answer)).await;
        }
        if head.path == RENEW_PATH {
            let bearer = head
                .headers
                .get("authorization")
                .and_then(|a| a.strip_prefix("Bearer "))
                .map(str::to_owned);
            let (status, answer) = self.renew(bearer.as_deref());
            self.record(Event::Renew { bearer, status });
            let extra: &[(&str, &str)] = if status == 401 {
                &[("www-authenticate", "Bearer")]
            } else {
                &[]
            };
            return respond(&mut stream, status, extra, Some(&answer)).await;
        }
        let is_upgrade = head
            .headers
            .get("upgrade")
            .is_some_and(|u| u.eq_ignore_ascii_case("websocket"));
        let scripted = self.upgrade_script.lock().unwrap().pop_front();
        let bearer_ok = head
            .headers
            .get("authorization")
            .and_then(|a| a.strip_prefix("Bearer "))
            .is_some_and(|t| self.host_tokens.lock().unwrap().contains(t));
        let status = if let Some(s) = scripted {
            s
        } else if self.closed_tenant.load(Ordering::SeqCst) {
            503
        } else if head.path != HARNESS_PATH {
            404
        } else if !bearer_ok {
            401
        } else if head.headers.get("nylorun-harness-api").map(String::as_str) != Some("1")
            || !is_upgrade
        {
            426
        } else {
            101
        };
        self.record(Event::Upgrade {
            path: head.path.clone(),
            status,
        });
        match status {
            101 => {}
            401 => return respond(&mut stream, 401, &[("www-authenticate", "Bearer")], None).await,
            426 => return respond(&mut stream, 426, &[("nylorun-harness-api", "1")], None).await,
            s => return respond(&mut stream, s, &[], None).await,
        }
        let key = head
            .headers
            .get("sec-websocket-key")
            .cloned()
            .unwrap_or_default();
        let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
        let resp = format!(
            "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-accept: {accept}\r\n\r\n"
        );
        if stream.write_all(resp.as_bytes()).await.is_err() {
            return;
        }
        let config = WebSocketConfig::default()
            .max_message_size(Some(64 << 20))
            .max_frame_size(Some(64 << 20));
        let ws = WebSocketStream::from_raw_socket(stream, Role::Server, Some(config)).await;
        self.connection(ws, stop).await;
    }

    fn join(&self, body: &[u8]) -> (u16, Value) {
        let parsed: JoinBody = match serde_json::from_slice(body) {
            Ok(b) => b,
            Err(e) => {
                return (
                    400,
                    json!({"error": {"code": "invalid", "message": e.to_string()}}),
                );
            }
        };
        if let Some(r) = self.join_script.lock().unwrap().pop_front() {
            return refusal_body(r);
        }
        let unauthorized = || refusal_body(Refusal::Unauthorized);
        if parsed.join_token != *self.join_token.lock().unwrap()
            || parsed.sandbox_id != self.opts.sandbox_id
            || parsed.pod_uid != self.opts.pod_uid
        {
            return unauthorized();
        }
        {
            let mut vol = self.volume_id.lock().unwrap();
            match (&*vol, &parsed.volume_id) {
                (Some(known), Some(sent)) if known != sent => return unauthorized(),
                (None, Some(sent)) => *vol = Some(sent.clone()),
                _ => {}
            }
        }
        let epoch = self.epoch.fetch_add(1, Ordering::SeqCst) + 1;
        let host = format!("host-token-epoch-{epoch}");
        {
            // A join bumps the epoch: older host tokens and connections end.
            let mut tokens = self.host_tokens.lock().unwrap();
            tokens.clear();
            tokens.insert(host.clone());
        }
        for c in self.conns.lock().unwrap().values() {
            c.close.cancel();
        }
        let mut answer = self.host_answer(&host, epoch);
        if let Some(Value::Object(extras)) = self.setup.lock().unwrap().take() {
            for (k, v) in extras {
                answer[k] = v;
            }
        }
        (200, answer)
    }

    fn host_answer(&self, host: &str, epoch: i64) -> Value {
        let n = self.egress_n.fetch_add(1, Ordering::SeqCst) + 1;
        json!({
            "hostToken": host,
            "egressToken": format!("egress-token-{n}"),
            "sandboxId": self.opts.sandbox_id,
            "epoch": epoch,
            "expiresAt": "2030-01-01T00:15:00.000Z",
            "caCertificate": CA_PEM,
        })
    }

    fn renew(&self, bearer: Option<&str>) -> (u16, Value) {
        let Some(token) = bearer.filter(|t| self.host_tokens.lock().unwrap().contains(*t)) else {
            return refusal_body(Refusal::Unauthorized);
        };
        if let Some(r) = self.renew_script.lock().unwrap().pop_front() {
            return refusal_body(r);
        }
        (
            200,
            self.host_answer(token, self.epoch.load(Ordering::SeqCst)),
        )
    }
}
