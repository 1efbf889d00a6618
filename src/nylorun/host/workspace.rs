//! Serving core's `workspace.*` requests (v5 §10, shapes from v2 notes §1.4) on the pod's own
//! workspace.
//!
//! Owns: the method→tool rule (bash→exec; read, grep, glob→read; write, edit→write), byte reads
//! and directory listings, the pod's workspace record, and the per-workspace lock that runs
//! commands one at a time.
//!
//! Invariants:
//! * Every path — a tool's, a byte read's, a listing's — goes through
//!   [`Workspace::resolve`]; files are opened with [`open_regular`]; a listing never follows a
//!   symlink. Nothing outside the workspace roots is read.
//! * Commands on the workspace run one at a time (v2 notes §7.3), also the setup's.
//! * Params are strict: an unknown field is `invalid` with the parse error, and a tool on the
//!   wrong method is `invalid` "\<method> does not run \<tool>".
//! * A tool that ran and failed is an outcome (`{kind: "failed", …}`), not an error answer; an
//!   error answer (`internal`) means podhost itself failed.
//!
//! Non-goals: one pod is one workspace (v2 notes §6.5): every session's key maps onto it, and
//! sweeps stop nothing (the pod's lifetime is core's to manage).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use base64::Engine as _;
use futures_util::future::BoxFuture;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::floor::workspace::{Access, OpenError, Workspace, open_regular};
use crate::nylorun::link::channel::RemoteError;
use crate::nylorun::link::protocol::{
    ErrorCode, RemoveParams, ReportParams, SweepParams, WorkspaceBytesCall, WorkspaceCall,
    WorkspaceListCall, WorkspaceRecord, WorkspaceSession, methods,
};
use crate::tools::{CallContext, ToolName, ToolOutcome, Toolbox, codes};

/// The record file under the harness root.
pub const RECORD_FILE: &str = "workspace-record.json";

/// The pod's workspace, as the requests of every connection see it.
#[derive(Clone)]
pub struct WorkspaceServer {
    inner: Arc<Inner>,
}

struct Inner {
    toolbox: Toolbox,
    /// Commands run one at a time.
    exec_lock: Arc<tokio::sync::Mutex<()>>,
    sandbox_id: String,
    harness_id: String,
    record_path: PathBuf,
    record: Mutex<Option<WorkspaceRecord>>,
}

/// The Tenant of the connection a request came on, known once `hello` is answered.
pub type TenantCell = Arc<OnceLock<String>>;

impl WorkspaceServer {
    pub fn new(
        toolbox: Toolbox,
        exec_lock: Arc<tokio::sync::Mutex<()>>,
        sandbox_id: &str,
        harness_id: &str,
        harness_root: &Path,
    ) -> Self {
        let record_path = harness_root.join(RECORD_FILE);
        let record = std::fs::read(&record_path)
            .ok()
            .and_then(|b| serde_json::from_slice::<WorkspaceRecord>(&b).ok());
        WorkspaceServer {
            inner: Arc::new(Inner {
                toolbox,
                exec_lock,
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
                Box::pin(async move { this.remove(params, &tenant).await })
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
            let ws = self.inner.toolbox.workspace().clone();
            let req = call.bytes;
            blocking(move || read_bytes(&ws, &req.path, req.max_bytes)).await
        } else if has("list") {
            let call: WorkspaceListCall = parse(m, params)?;
            self.touch(&call.session, call.spec.as_ref(), tenant);
            let ws = self.inner.toolbox.workspace().clone();
            let req = call.list;
            blocking(move || list_dir(&ws, &req.dir, req.max_entries, &cancel)).await
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
        let toolbox = &self.inner.toolbox;
        let outcome = if call.tool == ToolName::Bash {
            let _one_at_a_time = self.inner.exec_lock.lock().await;
            toolbox.run(call.tool, &call.input, &ctx).await
        } else {
            toolbox.run(call.tool, &call.input, &ctx).await
        };
        match outcome {
            Ok(o) => to_value(&o),
            Err(e) => Err(RemoteError::new(ErrorCode::Internal, e.to_string())),
        }
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
    async fn remove(&self, params: Value, tenant: &TenantCell) -> Result<Value, RemoteError> {
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
        let _no_commands = self.inner.exec_lock.lock().await;
        let root = self.inner.toolbox.workspace().root().to_path_buf();
        let removed = blocking(move || {
            empty_dir(&root).map(|()| Value::Null).map_err(|e| {
                RemoteError::new(
                    ErrorCode::Internal,
                    format!("could not delete the workspace's files: {e}"),
                )
            })
        })
        .await;
        removed?;
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

async fn blocking<F>(f: F) -> Result<Value, RemoteError>
where
    F: FnOnce() -> Result<Value, RemoteError> + Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| RemoteError::new(ErrorCode::Internal, format!("worker failed: {e}")))?
}

fn failed(code: &str, message: String) -> Result<Value, RemoteError> {
    to_value(&ToolOutcome::failed(code, message))
}

/// A byte read: `{kind: "read", path, base64}`, `{kind: "missing", path}`, or a failed outcome.
pub fn read_bytes(ws: &Workspace, path: &str, max_bytes: u64) -> Result<Value, RemoteError> {
    let resolved = match ws.resolve(path, Access::Read) {
        Ok(r) => r,
        Err(e) => return to_value(&ToolOutcome::from(e)),
    };
    let display = resolved.display.clone();
    let mut file = match open_regular(&resolved.host) {
        Ok(f) => f,
        Err(OpenError::NotFound) => return Ok(json!({"kind": "missing", "path": path})),
        Err(OpenError::NotAFile(what)) => {
            return failed(
                codes::NOT_A_FILE,
                format!("{display} is {what}, not a file."),
            );
        }
        Err(OpenError::Symlink) => {
            return failed(
                codes::PATH_DENIED,
                format!("{display} became a symbolic link while it was read."),
            );
        }
        Err(OpenError::Io(e)) => return failed(codes::ERROR, format!("{display}: {e}")),
    };
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    let too_large = |n: u64| {
        failed(
            codes::TOO_LARGE,
            format!("{display} is {n} bytes, past maxBytes {max_bytes}."),
        )
    };
    if size > max_bytes {
        return too_large(size);
    }
    // The file may grow while it is read: read at most one byte past the limit to see it.
    let mut bytes = Vec::with_capacity(size as usize);
    if let Err(e) = (&mut file)
        .take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)
    {
        return failed(codes::ERROR, format!("{display}: {e}"));
    }
    if bytes.len() as u64 > max_bytes {
        return too_large(bytes.len() as u64);
    }
    Ok(json!({
        "kind": "read",
        "path": path,
        "base64": base64::engine::general_purpose::STANDARD.encode(&bytes),
    }))
}

/// A listing: every regular file under `dir` (symlinks skipped, not followed), paths relative
/// to `dir` with `/`, in name order, at most `max_entries` and `truncated` when there were more.
pub fn list_dir(
    ws: &Workspace,
    dir: &str,
    max_entries: u64,
    cancel: &CancellationToken,
) -> Result<Value, RemoteError> {
    let resolved = match ws.resolve(dir, Access::Read) {
        Ok(r) => r,
        Err(e) => return to_value(&ToolOutcome::from(e)),
    };
    let missing = || Ok(json!({"kind": "missing", "path": dir}));
    match std::fs::symlink_metadata(&resolved.host) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return missing(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return missing(),
        Err(e) => return failed(codes::ERROR, format!("{}: {e}", resolved.display)),
    }
    let mut entries = Vec::new();
    let mut truncated = false;
    // Depth-first with each directory's names sorted (as JavaScript sorts them, by UTF-16 code
    // units), so the listing comes out in path order. An explicit stack: no recursion depth limit.
    let mut stack = vec![(
        String::new(),
        sorted_entries(&resolved.host),
        resolved.host.clone(),
    )];
    while let Some((rel, items, host)) = stack.last_mut() {
        if cancel.is_cancelled() {
            return failed(codes::CANCELLED, "The listing was cancelled.".to_owned());
        }
        let Some((name, ft, size)) = items.next() else {
            stack.pop();
            continue;
        };
        let path = if rel.is_empty() {
            name.clone()
        } else {
            format!("{rel}/{name}")
        };
        if ft.is_file() {
            if entries.len() as u64 >= max_entries {
                truncated = true;
                break;
            }
            entries.push(json!({"path": path, "size": size}));
        } else if ft.is_dir() {
            let sub = host.join(&name);
            let items = sorted_entries(&sub);
            stack.push((path, items, sub));
        }
        // Symlinks, FIFOs, sockets and devices are skipped.
    }
    Ok(json!({
        "kind": "listed",
        "path": dir,
        "listing": {"entries": entries, "truncated": truncated},
    }))
}

/// A directory's entries (name, type without following symlinks, size of regular files),
/// sorted. A directory that vanished or cannot be read lists as empty, like a racing delete.
fn sorted_entries(dir: &Path) -> std::vec::IntoIter<(String, std::fs::FileType, u64)> {
    let mut names: Vec<(String, std::fs::FileType, u64)> = match std::fs::read_dir(dir) {
        Ok(read) => read
            .filter_map(Result::ok)
            .filter_map(|e| {
                let ft = e.file_type().ok()?;
                let size = if ft.is_file() {
                    e.metadata().map(|m| m.len()).unwrap_or(0)
                } else {
                    0
                };
                Some((e.file_name().to_string_lossy().into_owned(), ft, size))
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    names.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
    names.into_iter()
}

/// Deletes everything inside `root` (not `root` itself: in a pod it is a mount). Symlinks are
/// removed, never followed.
fn empty_dir(root: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(root)? {
        let entry = entry?;
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(&path)?;
        } else {
            std::fs::remove_file(&path)?;
        }
    }
    Ok(())
}
