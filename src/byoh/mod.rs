//! The Oumi Bring-Your-Own-Harness endpoint (`podhost serve`), over the one agent loop with an
//! OpenAI-compatible model (the chat session of [`crate::chat`]).
//!
//! Layout, by responsibility:
//! * [`protocol`]: wire types and their validation.
//! * [`server`]: axum routes, authentication, limits, the error → status mapping; served by
//!   the floor's hardened listener ([`crate::floor::http`]) behind its guard against forged
//!   browser requests.
//! * [`engine`]: the state the routes and the turn tasks share (live turns, permits, locks).
//! * [`invocation`]: what each route means: idempotency, backpressure, cancellation.
//! * [`runner`]: turn tasks under leases, taking up turns whose replica stopped, the retention
//!   sweeper.
//! * [`sandbox`]: each session's sandbox (its uid from the store's pool), and whether the host
//!   can make sandboxes at all (503 for new work while it cannot).
//! * [`store`]: the durable store, SQLite (one replica) or PostgreSQL (several).
//! * [`viewer`]: the read-only session viewer at `/ui/` (sign-in cookie, server-drawn pages,
//!   live updates, cancel).
//!
//! Trust boundary: callers of the endpoint are authenticated by a bearer credential (or the
//! endpoint listens on loopback only and answers only requests addressed to a loopback name);
//! a request a browser page could forge (a foreign `Origin`, a body that is not JSON) is refused
//! either way. Model API keys stay in memory, are scrubbed from every message, and never reach
//! the store, a log, or a command's environment.

pub(crate) mod engine;
pub(crate) mod invocation;
pub(crate) mod protocol;
pub mod runner;
pub mod sandbox;
pub(crate) mod server;
pub(crate) mod store;
pub(crate) mod viewer;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use engine::{Engine, EngineConfig};
use store::{Store, StoreSpec};
use tracing::{info, warn};

use crate::chat::client::{ModelClient, RetryPolicy};
use crate::exec::ExecSettings;
use crate::exec::confine::{Confinement, Guard};
use crate::exec::template::{Level, Template};
use crate::floor::codes::exit;
use crate::floor::http::HttpLimits;
use crate::floor::http::listener::fit_open_files;
use crate::floor::secret::Secret;
use crate::floor::tls::{TlsSettings, client_config};
use crate::tools::ToolboxBuilder;

/// `podhost serve`'s configuration.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// The address to listen on (`host:port`); without a credential only a loopback address.
    pub listen: String,
    /// How errors name the listen address: `PODHOST_LISTEN` or `--listen`, as it was given.
    pub listen_setting: String,
    /// The data directory: one workspace per session, and the SQLite store unless `store` names
    /// PostgreSQL. Replicas of a PostgreSQL store share it (storage every replica mounts).
    pub data: PathBuf,
    /// `--store`: a PostgreSQL URL, or `None` for SQLite in the data directory.
    pub store: Option<Secret>,
    /// How errors name the store: `PODHOST_STORE` or `--store`, as it was given.
    pub store_setting: String,
    /// How long a replica's claim on a turn holds unless renewed.
    pub lease: Duration,
    /// The credential callers send as `Authorization: Bearer …`.
    pub token: Option<Secret>,
    /// A file holding the credential, read at start (and hidden from commands).
    pub token_file: Option<PathBuf>,
    /// Most turns running at once; past it, submit answers 409.
    pub max_running: usize,
    /// How long a finished session (and its workspace) is kept.
    pub retention: Duration,
    /// How long a turn interrupted by a restart waits for a retried submit with a fresh key.
    pub orphan_grace: Duration,
    /// Model calls one submission may make.
    pub max_steps: u32,
    /// Attempts per model call.
    pub model_attempts: u32,
    /// The HTTP listener's timeouts and caps.
    pub http: HttpLimits,
    /// Free bytes the data directory must keep; below it, new submissions are answered `503`.
    pub min_free_bytes: u64,
    /// Which CA certificates to trust besides the system's, for the model endpoints and a
    /// PostgreSQL store.
    pub tls: TlsSettings,
    /// The model's context window, compaction threshold and inputs, as configured.
    pub limits: crate::chat::session::ChatLimits,
    /// Start with an empty store even though session workspaces exist (see [`check_not_stranded`]).
    pub start_afresh: bool,
    /// Most background processes one invocation runs at once.
    pub max_background: usize,
    pub exec: ExecSettings,
    /// The directory every new session's workspace starts as a copy of.
    pub template: Option<PathBuf>,
    /// How errors name the template: `PODHOST_WORKSPACE_TEMPLATE` or `--workspace-template`.
    pub template_setting: String,
    /// How the template is copied, when forced; `None`: what start-up finds.
    pub template_level: Option<Level>,
}

/// Why `podhost serve` could not start or keep its endpoint running: a bad setting (reported
/// with the usage exit code), an I/O failure on the data directory or the token file, the store,
/// or the model client.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{0}")]
    Config(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] store::StoreError),
    #[error(transparent)]
    Model(#[from] crate::chat::client::ModelError),
}

/// The credential from `PODHOST_TOKEN`/`--token` or the token file.
fn credential(args: &ServeConfig) -> Result<Option<String>, ServeError> {
    let token = match (&args.token, &args.token_file) {
        (Some(t), _) => Some(t.expose().trim().to_owned()),
        (None, Some(path)) => Some(
            std::fs::read_to_string(path)
                .map_err(|source| ServeError::Io {
                    what: format!("could not read the token file {}", path.display()),
                    source,
                })?
                .trim()
                .to_owned(),
        ),
        (None, None) => None,
    };
    if token.as_deref() == Some("") {
        return Err(ServeError::Config(
            "the credential is empty: set PODHOST_TOKEN or PODHOST_TOKEN_FILE to a non-empty \
             value"
                .into(),
        ));
    }
    Ok(token)
}

/// Refuses a data directory whose store is missing or empty while session workspaces exist:
/// starting empty would answer 404 for every earlier invocation, which fails a whole
/// evaluation. `start_afresh` starts anyway, loudly.
fn check_not_stranded(
    data: &Path,
    spec: &StoreSpec,
    stored: u64,
    start_afresh: bool,
) -> Result<(), ServeError> {
    if stored > 0 {
        return Ok(());
    }
    let sessions = std::fs::read_dir(data.join("sessions"))
        .map(|d| d.filter_map(Result::ok).count())
        .unwrap_or(0);
    if sessions == 0 {
        return Ok(());
    }
    let store = match spec {
        StoreSpec::Sqlite(path) => format!(
            "database {}",
            path.file_name().unwrap_or_default().to_string_lossy()
        ),
        StoreSpec::Postgres(_) => format!("PostgreSQL database {spec}"),
    };
    let what = format!(
        "the data directory {} holds {sessions} session workspace(s), but its {store} is \
         missing or empty: every earlier invocation would be unknown (404), which fails a whole \
         evaluation",
        data.display()
    );
    if start_afresh {
        warn!("{what}; starting afresh with an empty store (PODHOST_START_AFRESH)");
        return Ok(());
    }
    Err(ServeError::Config(format!(
        "{what}. Restore the database, or start with --start-afresh (PODHOST_START_AFRESH=true) \
         to begin with an empty store"
    )))
}

async fn resolve(listen: &str, setting: &str) -> Result<SocketAddr, ServeError> {
    let bad = |why: String| ServeError::Config(format!("{setting} {listen:?}: {why}"));
    let mut addrs = tokio::net::lookup_host(listen)
        .await
        .map_err(|e| bad(e.to_string()))?;
    addrs
        .next()
        .ok_or_else(|| bad("resolves to no address".into()))
}

/// The policy every session's commands start from: nothing of the data directory (the store,
/// other sessions' workspaces) or the credential file is reachable; a session's toolbox grants
/// its own workspace and tmp back. Their modes are checked at each use (see `state_guards`).
fn tools(args: &ServeConfig, supervisor: PathBuf) -> ToolboxBuilder {
    ToolboxBuilder::new(&args.exec, supervisor).confine(|c| {
        let mut c = c
            .hide(&args.data)
            .session_disks(&sandbox::disks_dir(&args.data));
        if let Some(file) = &args.token_file {
            // The path given, and the file it leads to (a Kubernetes Secret's is a link into
            // its volume's `..data`).
            c = c.hide(file);
            if let Ok(real) = std::fs::canonicalize(file)
                && &real != file
            {
                c = c.hide(&real);
            }
        }
        for g in state_guards(args) {
            c = c.guard(g);
        }
        c
    })
}

/// podhost's own state on a BYOH host and the modes it must keep: the data directory private
/// (0711 when sessions run as uids of their own, which must pass through it to their
/// workspaces; 0700 otherwise) with its files (the store) 0600, and the credential file 0600
/// when it is podhost's.
fn state_guards(args: &ServeConfig) -> Vec<Guard> {
    let mode = if args.exec.confine.uid_pool.is_some() {
        0o711
    } else {
        0o700
    };
    let data = std::fs::canonicalize(&args.data).unwrap_or_else(|_| args.data.clone());
    let mut guards = vec![Guard::private_dir(&data, mode)];
    if let Some(file) = &args.token_file
        && let Some(real) = guarded_credential(file)
    {
        guards.push(Guard::private_file(&real));
    }
    guards
}

/// The credential file to keep private (0600), when podhost can: the file the path leads to (a
/// Kubernetes Secret's path is a link into its volume), when it is podhost's and on a file
/// system that can be written. A file on a read-only mount (a Secret volume) cannot have its
/// mode changed by a command either, so it needs no guard; one that other users may read is
/// said once (a Secret volume's `defaultMode` sets it).
fn guarded_credential(file: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let real = std::fs::canonicalize(file).ok()?;
    let meta = std::fs::metadata(&real).ok()?;
    let read_only = nix::sys::statvfs::statvfs(&real)
        .is_ok_and(|v| v.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY));
    if read_only {
        // A Secret's files belong to root; podhost reads them through the pod's fsGroup, so
        // only what every user may read is too much.
        if meta.mode() & 0o007 != 0 {
            warn!(
                path = %file.display(),
                mode = format!("{:o}", meta.mode() & 0o777),
                "the credential file is readable by every user and on a read-only mount, where \
                 podhost cannot change its mode (a Kubernetes Secret: set its volume's \
                 defaultMode, 0440 with the pod's fsGroup)"
            );
        }
        return None;
    }
    (meta.uid() == nix::unistd::geteuid().as_raw()).then_some(real)
}

/// `podhost serve`: runs the endpoint until SIGINT or SIGTERM.
pub async fn serve(args: ServeConfig) -> Result<i32, ServeError> {
    match serve_inner(args).await {
        Err(ServeError::Config(msg)) => {
            eprintln!("podhost serve: {msg}");
            Ok(exit::USAGE)
        }
        other => other,
    }
}

/// The engine's settings from the server's.
fn engine_config(
    args: &ServeConfig,
    tools: ToolboxBuilder,
    template: Option<crate::exec::template::Template>,
) -> EngineConfig {
    EngineConfig {
        data_dir: args.data.clone(),
        max_running: args.max_running,
        retention: args.retention,
        orphan_grace: args.orphan_grace,
        cancel_wait: Duration::from_secs(5),
        lease: args.lease,
        max_steps: args.max_steps,
        limits: args.limits.clone(),
        tools,
        max_background: args.max_background,
        template,
    }
}

async fn serve_inner(args: ServeConfig) -> Result<i32, ServeError> {
    let token = credential(&args)?;
    let tls = client_config(&args.tls).map_err(|e| ServeError::Config(e.to_string()))?;
    let addr = resolve(&args.listen, &args.listen_setting).await?;
    if token.is_none() && !addr.ip().is_loopback() {
        return Err(ServeError::Config(format!(
            "refusing to listen on {addr} without a credential: set PODHOST_TOKEN or \
             PODHOST_TOKEN_FILE, or listen on a loopback address"
        )));
    }
    warn_small_uid_pool(&args);
    // Before anything is made: a store or template podhost cannot use leaves no data directory
    // behind.
    let spec = store_spec(&args)?;
    let tools = tools(&args, supervisor()?);
    let template_dir = check_template(&args, tools.confinement())?;
    std::fs::create_dir_all(&args.data).map_err(|source| ServeError::Io {
        what: format!(
            "could not create the data directory {}",
            args.data.display()
        ),
        source,
    })?;
    let template = template_dir
        .map(|(dir, chosen)| template_level(&args, dir, chosen, tools.confinement()))
        .transpose()?;
    let (store, spec, guards) = open_store(&args, spec, &tls).await?;
    let store_engine = store.engine();
    let client = ModelClient::new(
        RetryPolicy {
            attempts: args.model_attempts,
            ..RetryPolicy::default()
        },
        tls,
    )?;
    let engine = Engine::new(store, client, engine_config(&args, tools, template));
    engine.recover().await?;
    let (listener, local) = bind(addr).await?;
    if token.is_none() {
        warn!("no credential is configured: the endpoint is open to every caller on this machine");
    }
    let http = fit_open_files(args.http);
    info!(
        addr = %local,
        data = %args.data.display(),
        store = %spec,
        engine = store_engine,
        replica = %engine.replica(),
        max_running = args.max_running,
        "podhost serve listening on http://{local}"
    );
    let floor = (args.min_free_bytes > 0).then(|| server::FreeSpaceFloor {
        dir: args.data.clone(),
        bytes: args.min_free_bytes,
    });
    if let Some(Err(message)) = floor.as_ref().map(server::FreeSpaceFloor::check) {
        warn!(%message, "the data directory is low on space");
    }
    let app = server::router(engine.clone(), token, floor, guards, local);
    crate::floor::http::serve(listener, app, http, shutdown_signal()).await;
    info!("shutting down: stopping turns");
    engine.shutdown(Duration::from_secs(10)).await;
    Ok(exit::OK)
}

/// podhost's own executable, which also serves as the commands' supervisor.
fn supervisor() -> Result<PathBuf, ServeError> {
    crate::exec::find_supervisor().map_err(|source| ServeError::Io {
        what: "could not find podhost's own executable".into(),
        source,
    })
}

/// The template directory, resolved, when one is set: a directory podhost can read, outside the
/// data directory (and not holding it); with its level when [`choose_level`] decides it. Pure
/// but for reading the file system.
fn check_template(
    args: &ServeConfig,
    confinement: &Confinement,
) -> Result<Option<(PathBuf, Option<Level>)>, ServeError> {
    let Some(dir) = &args.template else {
        return Ok(None);
    };
    let setting = &args.template_setting;
    let bad = |why: String| ServeError::Config(format!("{setting} {}: {why}", dir.display()));
    let real = std::fs::canonicalize(dir).map_err(|e| bad(e.to_string()))?;
    if !real.is_dir() {
        return Err(bad("is not a directory".into()));
    }
    std::fs::read_dir(&real).map_err(|e| bad(format!("cannot be read: {e}")))?;
    // The data directory may not exist yet: its nearest existing ancestor, resolved, with the
    // rest of it.
    let data = std::path::absolute(&args.data).map_err(|e| bad(e.to_string()))?;
    let mut base = data.as_path();
    let mut rest = Vec::new();
    let real_data = loop {
        if let Ok(r) = std::fs::canonicalize(base) {
            break rest.iter().rev().fold(r, |p: PathBuf, c| p.join(c));
        }
        match (base.parent(), base.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_owned());
                base = parent;
            }
            _ => break data.clone(),
        }
    };
    if real.starts_with(&real_data) || real_data.starts_with(&real) {
        return Err(bad(format!(
            "overlaps the data directory {}: give a template outside it",
            args.data.display()
        )));
    }
    Ok(Some((real, choose_level(args, confinement)?)))
}

/// The template's level where start-up decides it before the data directory exists: the one
/// forced, else [`Level::Overlay`] where sessions' views can mount one; `None`: found by
/// cloning into the data directory ([`template_level`]). A session's own file system is mounted
/// over its workspace in its view, where a copy made on the host is not seen: with one, only
/// an overlay (whose upper layer is on that file system) will do.
fn choose_level(
    args: &ServeConfig,
    confinement: &Confinement,
) -> Result<Option<Level>, ServeError> {
    let setting = &args.template_setting;
    let overlay = confinement.overlay();
    let disk_fs = crate::exec::confine::reported().disk_quota == "filesystem";
    let refuse = |why: String| ServeError::Config(format!("{setting}: {why}"));
    match (args.template_level, overlay) {
        (Some(Level::Overlay) | None, Ok(())) => Ok(Some(Level::Overlay)),
        (Some(Level::Overlay), Err(why)) => Err(refuse(format!(
            "the overlay level was asked for, but sessions' views cannot mount one here: {why}"
        ))),
        (level, overlay) if disk_fs => {
            let why = match (level, overlay) {
                (Some(l), _) => format!("the {} level", l.name()),
                (None, Err(why)) => format!("no overlay ({why})"),
                (None, Ok(())) => "no overlay".to_owned(),
            };
            Err(refuse(format!(
                "cannot be copied into a file system per session, which is mounted over the \
                 workspace, with {why}; set PODHOST_SESSION_DISK_FS=off (the quota is then \
                 measured) or PODHOST_SESSION_DISK_MB=0"
            )))
        }
        (level, _) => Ok(level),
    }
}

/// The overlay level, when chosen, tried once with its upper layer in the data directory
/// (where a session's is, without a file system per session): a data directory on NFS, say,
/// cannot hold one. Where it cannot, a forced overlay stops `serve`; a found one falls back to
/// what cloning into the data directory finds (`None`).
fn overlay_in_data(
    args: &ServeConfig,
    confinement: &Confinement,
    chosen: Option<Level>,
) -> Result<Option<Level>, ServeError> {
    let disk_fs = crate::exec::confine::reported().disk_quota == "filesystem";
    let Some(iso) = confinement
        .isolation()
        .filter(|_| chosen == Some(Level::Overlay) && !disk_fs)
    else {
        return Ok(chosen);
    };
    match crate::exec::probe::probe_overlay_in(&iso.helper, &args.data) {
        Ok(()) => Ok(chosen),
        Err(why) if args.template_level == Some(Level::Overlay) => {
            Err(ServeError::Config(format!(
                "{}: the overlay level was asked for, but the data directory {} cannot hold a \
             session's upper layer: {why}",
                args.template_setting,
                args.data.display()
            )))
        }
        Err(why) => {
            warn!(
                data = %args.data.display(),
                error = %why,
                "the data directory cannot hold an overlay's upper layer: templates are copied"
            );
            Ok(None)
        }
    }
}

/// The template with its level: the one chosen before ([`choose_level`]) if the data
/// directory can hold it ([`overlay_in_data`]), else [`Level::Reflink`] when a file of it
/// clones into the data directory, else [`Level::Copy`]; logged.
fn template_level(
    args: &ServeConfig,
    dir: PathBuf,
    chosen: Option<Level>,
    confinement: &Confinement,
) -> Result<Template, ServeError> {
    let chosen = overlay_in_data(args, confinement, chosen)?;
    let level = chosen.unwrap_or_else(|| crate::exec::template::detect(&dir, &args.data));
    let no_overlay = confinement.overlay().err().unwrap_or_default();
    match level {
        Level::Overlay => info!(
            template = %dir.display(),
            level = level.name(),
            "new sessions' workspaces are copy-on-write overlays of the template"
        ),
        Level::Reflink => info!(
            template = %dir.display(),
            level = level.name(),
            no_overlay,
            "new sessions' workspaces start as clones of the template's files"
        ),
        Level::Copy => warn!(
            template = %dir.display(),
            level = level.name(),
            no_overlay,
            "sessions cannot mount an overlay here and the data directory cannot clone files \
             (reflink, on btrfs or xfs): each new session's workspace starts with a full copy \
             of the template"
        ),
    }
    Ok(Template { dir, level })
}

/// Warns when the uid pool cannot give every running turn its own uid.
fn warn_small_uid_pool(args: &ServeConfig) {
    if let Some(pool) = args.exec.confine.uid_pool
        && nix::unistd::geteuid().is_root()
        && pool.count() < args.max_running as u64
    {
        warn!(
            pool = %pool,
            max_running = args.max_running,
            "PODHOST_UID_POOL holds fewer uids than turns may run at once: a turn that finds \
             every uid serving a running turn fails, and submissions are refused until one is free"
        );
    }
}

/// Opens the store `args` name, checking the modes of podhost's state around it and that a
/// new store does not strand the invocations of an old one.
/// The store the settings name, parsed (not yet opened).
fn store_spec(args: &ServeConfig) -> Result<StoreSpec, ServeError> {
    StoreSpec::parse(
        args.store.as_ref().map(Secret::expose),
        &args.data,
        &args.store_setting,
    )
    .map_err(|e| ServeError::Config(e.to_string()))
}

async fn open_store(
    args: &ServeConfig,
    spec: StoreSpec,
    tls: &std::sync::Arc<rustls::ClientConfig>,
) -> Result<(Store, StoreSpec, Vec<Guard>), ServeError> {
    let guards = state_guards(args);
    // An SQLite store's files are made now on a first start: private at once, without a warning.
    let fresh = matches!(&spec, StoreSpec::Sqlite(db) if !db.exists());
    check_state(&guards, fresh)?;
    let store = Store::open(&spec, tls).await?;
    check_state(&guards, fresh)?;
    let stored = store.count().await?;
    check_not_stranded(&args.data, &spec, stored, args.start_afresh)?;
    Ok((store, spec, guards))
}

/// Listens on `addr`; the address it listens on (a port 0 made real).
async fn bind(addr: SocketAddr) -> Result<(tokio::net::TcpListener, SocketAddr), ServeError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Io {
            what: format!("could not listen on {addr}"),
            source,
        })?;
    let local = listener.local_addr().map_err(|source| ServeError::Io {
        what: "could not read the listening address".into(),
        source,
    })?;
    Ok((listener, local))
}

/// Puts back the modes of podhost's state (quietly when it was just created), or refuses to
/// start when it cannot.
fn check_state(guards: &[Guard], fresh: bool) -> Result<(), ServeError> {
    use crate::exec::confine::state;
    let checked = if fresh {
        state::check_quietly(guards)
    } else {
        state::check(guards)
    };
    checked
        .map(drop)
        .map_err(|e| ServeError::Config(format!("podhost's state is not safe: {e}")))
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}
