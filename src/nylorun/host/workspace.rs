//! Serving core's `workspace.*` requests (v5 §10, shapes from v2 notes §1.4) on the pod's own
//! workspace.
//!
//! Owns: the method→tool rule (bash→exec; read, grep, glob→read; write, edit→write), the wire
//! shapes of byte reads and directory listings, and the pod's workspace record.
//!
//! Invariants:
//! * Every file touch goes through the pod's [`Toolbox`]: tool calls through
//!   [`Toolbox::call`], byte reads, listings and `workspace.remove` through its confined file
//!   operations (`tools::files`). Nothing outside the workspace roots is read.
//! * Commands on the workspace run one at a time (v2 notes §7.3), also the setup's: the
//!   toolbox holds that lock; byte reads and listings do not wait for it.
//! * Params are strict: an unknown field is `invalid` with the parse error, and a tool on the
//!   wrong method is `invalid` "\<method> does not run \<tool>".
//! * A tool that ran and failed is an outcome (`{kind: "failed", …}`), not an error answer; an
//!   error answer (`internal`) means podhost itself failed.
//!
//! Non-goals: one pod is one workspace (v2 notes §6.5): every session's key maps onto it, and
//! sweeps stop nothing (the pod's lifetime is core's to manage).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use base64::Engine as _;
use futures_util::future::BoxFuture;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::nylorun::link::channel::RemoteError;
use crate::nylorun::link::protocol::{
    ErrorCode, RemoveParams, ReportParams, SweepParams, WorkspaceBytesCall, WorkspaceCall,
    WorkspaceListCall, WorkspaceRecord, WorkspaceSession, methods,
};
use crate::tools::files::{FileRead, Listing};
use crate::tools::{CallContext, ToolError, ToolName, Toolbox};

/// The record file under the harness root.
pub const RECORD_FILE: &str = "workspace-record.json";

/// The pod's workspace, as the requests of every connection see it.
#[derive(Clone)]
pub struct WorkspaceServer {
    inner: Arc<Inner>,
}

struct Inner {
    toolbox: Toolbox,
    sandbox_id: String,
    harness_id: String,
    record_path: PathBuf,
    record: Mutex<Option<WorkspaceRecord>>,
}

/// The Tenant of the connection a request came on, known once `hello` is answered.
pub type TenantCell = Arc<OnceLock<String>>;

impl WorkspaceServer {
    pub fn new(toolbox: Toolbox, sandbox_id: &str, harness_id: &str, harness_root: &Path) -> Self {
        let record_path = harness_root.join(RECORD_FILE);
        let record = std::fs::read(&record_path)
            .ok()
            .and_then(|b| serde_json::from_slice::<WorkspaceRecord>(&b).ok());
        WorkspaceServer {
            inner: Arc::new(Inner {
                toolbox,
                sandbox_id: sandbox_id.to_owned(),
                harness_id: harness_id.to_owned(),
                record_path,
                record: Mutex::new(record),
            }),
        }
    }

    pub fn toolbox(&self) -> &Toolbox {
        &self.inner.toolbox
    }

    /// Starts serving `method`, or `None` when it is not a workspace request.
    pub fn request(
        &self,
        method: &str,
        params: Value,
        cancel: CancellationToken,
        tenant: TenantCell,
    ) -> Option<BoxFuture<'static, Result<Value, RemoteError>>> {
        let this = self.clone();
        let method = method.to_owned();
        let fut: BoxFuture<'static, Result<Value, RemoteError>> = match method.as_str() {
            methods::WORKSPACE_READ => {
                Box::pin(async move { this.read(params, cancel, &tenant).await })
            }
            methods::WORKSPACE_WRITE | methods::WORKSPACE_EXEC => {
                Box::pin(async move { this.tool_call(&method, params, cancel, &tenant).await })
            }
            methods::WORKSPACE_REPORT => Box::pin(async move { this.report(params) }),
            methods::WORKSPACE_SWEEP => Box::pin(async move { this.sweep(params, &tenant) }),
            methods::WORKSPACE_REMOVE => {
                Box::pin(async move { this.remove(params, cancel, &tenant).await })
            }
            _ => return None,
        };
        Some(fut)
    }

    async fn read(
        &self,
        params: Value,
        cancel: CancellationToken,
        tenant: &TenantCell,
    ) -> Result<Value, RemoteError> {
        let m = methods::WORKSPACE_READ;
        let has = |k: &str| params.get(k).is_some();
        if has("bytes") {
            let call: WorkspaceBytesCall = parse(m, params)?;
            self.touch(&call.session, call.spec.as_ref(), tenant);
            let req = call.bytes;
            let read = self
                .inner
                .toolbox
                .read_bytes(&req.path, req.max_bytes)
                .await;
            read_answer(&req.path, read.map_err(internal)?)
        } else if has("list") {
            let call: WorkspaceListCall = parse(m, params)?;
            self.touch(&call.session, call.spec.as_ref(), tenant);
            let req = call.list;
            let listing = self
                .inner
                .toolbox
                .list_files(&req.dir, req.max_entries, &cancel)
                .await;
            list_answer(&req.dir, listing.map_err(internal)?)
        } else {
            self.tool_call(m, params, cancel, tenant).await
        }
    }

    async fn tool_call(
        &self,
        method: &str,
        params: Value,
        cancel: CancellationToken,
        tenant: &TenantCell,
    ) -> Result<Value, RemoteError> {
        let call: WorkspaceCall = parse(method, params)?;
        let allowed = match method {
            methods::WORKSPACE_EXEC => call.tool == ToolName::Bash,
            methods::WORKSPACE_WRITE => matches!(call.tool, ToolName::Write | ToolName::Edit),
            _ => matches!(call.tool, ToolName::Read | ToolName::Grep | ToolName::Glob),
        };
        if !allowed {
            return Err(RemoteError::invalid(format!(
                "{method} does not run {}",
                call.tool
            )));
        }
        self.touch(&call.session, call.spec.as_ref(), tenant);
        let ctx = CallContext::new(cancel);
        let outcome = self.inner.toolbox.call(call.tool, &call.input, &ctx).await;
        to_value(&outcome.map_err(internal)?)
    }

    /// `workspace.report`: what this harness's sandbox is. The v2 notes did not capture the
    /// fields core reads, so this answers only what is true of a pod: its backend, the sandbox,
    /// where commands run, and which harness serves it.
    fn report(&self, params: Value) -> Result<Value, RemoteError> {
        let _: ReportParams = parse(methods::WORKSPACE_REPORT, null_as_empty(params))?;
        Ok(json!({
            "backend": "pod",
            "sandboxId": self.inner.sandbox_id,
            "workspace": self.inner.toolbox.workspace().display_root().to_string_lossy(),
            "harness": {"id": self.inner.harness_id, "version": env!("CARGO_PKG_VERSION")},
        }))
    }

    /// `workspace.sweep`: a pod stops nothing itself; it lists its one workspace once a request
    /// has used it (before that there is no session to name).
    fn sweep(&self, params: Value, tenant: &TenantCell) -> Result<Value, RemoteError> {
        let _: SweepParams = parse(methods::WORKSPACE_SWEEP, null_as_empty(params))?;
        let _ = tenant;
        let record = self
            .inner
            .record
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        Ok(json!({"workspaces": record.into_iter().collect::<Vec<_>>()}))
    }

    /// `workspace.remove`: deletes the workspace's files when a key, sandbox id or `all` names
    /// this pod's workspace. Keys must start `nylorun-<tenantId>-`.
    async fn remove(
        &self,
        params: Value,
        cancel: CancellationToken,
        tenant: &TenantCell,
    ) -> Result<Value, RemoteError> {
        let m = methods::WORKSPACE_REMOVE;
        let p: RemoveParams = parse(m, null_as_empty(params))?;
        let tenant_id = tenant.get().ok_or_else(|| {
            RemoteError::new(ErrorCode::Unavailable, "hello has not been answered yet")
        })?;
        let prefix = format!("nylorun-{tenant_id}-");
        let keys = p.keys.unwrap_or_default();
        if let Some(bad) = keys.iter().find(|k| !k.starts_with(&prefix)) {
            return Err(RemoteError::invalid(format!(
                "Invalid {m} request: key {bad:?} does not start with {prefix:?}"
            )));
        }
        let ours = self.key(tenant_id);
        let named = p.all == Some(true)
            || keys.contains(&ours)
            || p.sandbox_ids
                .unwrap_or_default()
                .iter()
                .any(|s| *s == self.inner.sandbox_id);
        if !named {
            return Ok(json!({}));
        }
        match self.inner.toolbox.empty_workspace(&cancel).await {
            Ok(Some(Ok(()))) => {}
            Ok(Some(Err(e))) => {
                return Err(RemoteError::new(
                    ErrorCode::Internal,
                    format!("could not delete the workspace's files: {e}"),
                ));
            }
            Ok(None) => {
                return Err(RemoteError::new(
                    ErrorCode::Unavailable,
                    "the request was cancelled while a command ran",
                ));
            }
            Err(e) => return Err(internal(e)),
        }
        *self
            .inner
            .record
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
        let _ = std::fs::remove_file(&self.inner.record_path);
        tracing::info!(key = %ours, "workspace removed");
        Ok(json!({}))
    }

    /// The pod's workspace key: a sandbox resource's (`nylorun-<tenantId>-sbx-<16 hex of
    /// sha256(sandboxId)>`, v2 notes §6.5).
    fn key(&self, tenant_id: &str) -> String {
        let digest = hex::encode(Sha256::digest(self.inner.sandbox_id.as_bytes()));
        format!("nylorun-{tenant_id}-sbx-{}", &digest[..16])
    }

    /// Records that a session used the workspace (created on first use, then `updatedAt`).
    fn touch(&self, session: &WorkspaceSession, spec: Option<&Value>, tenant: &TenantCell) {
        let Some(tenant_id) = tenant.get() else {
            return;
        };
        let now = super::iso_now();
        let key = self.key(tenant_id);
        let mut guard = self
            .inner
            .record
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let record = match guard.take() {
            Some(mut r) if r.key == key => {
                // Only in memory: a restart keeps `createdAt`, which is what tells a new disk.
                r.updated_at = now;
                *guard = Some(r);
                return;
            }
            _ => WorkspaceRecord {
                key,
                session_id: session.owner_id.clone(),
                sandbox_id: Some(self.inner.sandbox_id.clone()),
                backend: "pod".to_owned(),
                // The pod does not know its own image; the session's spec names it when it has one.
                image: spec
                    .and_then(|s| s.get("image"))
                    .and_then(Value::as_str)
                    .unwrap_or("unknown")
                    .to_owned(),
                state: "running".to_owned(),
                created_at: now.clone(),
                updated_at: now,
            },
        };
        if let Ok(bytes) = serde_json::to_vec(&record) {
            let _ = std::fs::write(&self.inner.record_path, bytes);
        }
        *guard = Some(record);
    }
}

fn null_as_empty(v: Value) -> Value {
    if v.is_null() { json!({}) } else { v }
}

/// Parses params strictly; the error names the method.
fn parse<T: DeserializeOwned>(method: &str, params: Value) -> Result<T, RemoteError> {
    serde_json::from_value(params)
        .map_err(|e| RemoteError::invalid(format!("Invalid {method} request: {e}")))
}

fn to_value<T: serde::Serialize>(v: &T) -> Result<Value, RemoteError> {
    serde_json::to_value(v).map_err(|e| RemoteError::new(ErrorCode::Internal, e.to_string()))
}

/// A byte read on the wire: `{kind: "read", path, base64}`, `{kind: "missing", path}`, or a
/// failed outcome.
fn read_answer(path: &str, read: FileRead) -> Result<Value, RemoteError> {
    match read {
        FileRead::Bytes(bytes) => Ok(json!({
            "kind": "read",
            "path": path,
            "base64": base64::engine::general_purpose::STANDARD.encode(&bytes),
        })),
        FileRead::Missing => Ok(json!({"kind": "missing", "path": path})),
        FileRead::Failed(outcome) => to_value(&outcome),
    }
}

/// A listing on the wire: `{kind: "listed", path, listing: {entries: [{path, size}],
/// truncated}}`, `{kind: "missing", path}`, or a failed outcome.
fn list_answer(dir: &str, listing: Listing) -> Result<Value, RemoteError> {
    match listing {
        Listing::Listed { entries, truncated } => {
            let entries: Vec<Value> = entries
                .into_iter()
                .map(|e| json!({"path": e.path, "size": e.size}))
                .collect();
            Ok(json!({
                "kind": "listed",
                "path": dir,
                "listing": {"entries": entries, "truncated": truncated},
            }))
        }
        Listing::Missing => Ok(json!({"kind": "missing", "path": dir})),
        Listing::Failed(outcome) => to_value(&outcome),
    }
}

fn internal(e: ToolError) -> RemoteError {
    RemoteError::new(ErrorCode::Internal, e.to_string())
}
