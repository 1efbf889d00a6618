//! What a pod or BYOH host isolates its sessions with ([`Isolation`], found at start-up), and
//! the view of the file system a session's holder builds for a workspace.
//!
//! Non-goals: building the view (`exec::session::view`), starting the holder (`Toolbox`).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{Confinement, SHM_BYTES, Settings, UidPool, canonical_lenient, push_unique};
use crate::exec::cgroup::Cgroups;
use crate::exec::net::Network;
use crate::exec::probe::Namespaces;
use crate::exec::protocol::View;
use crate::floor::workspace::Workspace;

/// The directory masks every view has: host socket directories (a read-only mount does not stop
/// `connect` on a socket file).
pub const RUN_DIRS: [&str; 2] = ["/run", "/var/run"];

/// How a front isolates its sessions (see the module doc), found at start-up.
#[derive(Debug)]
pub struct Isolation {
    /// The namespaces this host allows podhost to make, found by trying.
    pub namespaces: Namespaces,
    /// Why stronger levels were refused.
    pub refused: Vec<String>,
    /// Each session gets a network namespace of its own (see `exec::net`).
    pub network: bool,
    /// The networks a session's proxy reaches although they are not global.
    pub allow_networks: Arc<[Network]>,
    /// The helper binary that holds sessions (`podhost-exec`).
    pub helper: PathBuf,
    /// One uid per session (a root BYOH host).
    pub uid_pool: Option<UidPool>,
    /// Session cgroups, or why there are none.
    pub cgroups: Result<Cgroups, String>,
    /// A BYOH session's disk quota, in bytes.
    pub disk_quota: Option<u64>,
    /// The quota is held by a file system of the session's own (see `exec::disk`); else
    /// measured.
    pub disk_fs: bool,
    /// Commands stay root because the configuration asked.
    pub root_asked: bool,
    /// A workspace can be an overlay of a template in a session's view (see `exec::overlay`),
    /// or why not.
    pub overlay: Result<(), String>,
}

impl Isolation {
    /// Finds what this host allows: the namespace level (by trying, in the helper), the cgroups,
    /// the uid pool.
    pub(super) fn find(settings: &Settings) -> Isolation {
        let helper = settings
            .helper
            .clone()
            .or_else(|| crate::exec::find_supervisor().ok())
            .unwrap_or_default();
        let (namespaces, mut refused, mut network, overlay) = if settings.namespaces {
            let probe = crate::exec::probe::probe_host(&helper);
            (
                probe.namespaces,
                probe.refused,
                probe.network,
                probe.overlay,
            )
        } else {
            let off = "namespaces are turned off (PODHOST_NAMESPACES=off)";
            (
                Namespaces::None,
                vec![off.to_owned()],
                false,
                Err(off.to_owned()),
            )
        };
        // A disk of its own needs a view podhost can join (as root) and a host that mounts one.
        let disk_fs = settings.disk_quota.is_some()
            && namespaces == Namespaces::Root
            && match (
                settings.session_disk_fs,
                crate::exec::probe::probe_host(&helper).disk,
            ) {
                (true, Ok(())) => true,
                (true, Err(why)) => {
                    refused.push(format!("a file system per session: {why}"));
                    false
                }
                (false, _) => {
                    refused.push(
                        "a file system per session: turned off (PODHOST_SESSION_DISK_FS=off)"
                            .to_owned(),
                    );
                    false
                }
            };
        if network && !settings.session_network {
            network = false;
            refused
                .push("a network namespace: turned off (PODHOST_SESSION_NETWORK=off)".to_owned());
        }
        Isolation {
            namespaces,
            refused,
            network,
            allow_networks: settings.allow_networks.clone().into(),
            helper,
            uid_pool: settings.uid_pool.map(UidPool::new),
            cgroups: Cgroups::set_up(settings.cgroup),
            disk_quota: settings.disk_quota,
            disk_fs,
            root_asked: settings.root_asked,
            overlay,
        }
    }
}

impl Isolation {
    /// Local use: the namespaces this host allows for a read-only system (a mount namespace,
    /// inside a user namespace unless podhost is root); `None` where it allows none.
    pub(super) fn local_namespaces(settings: &Settings) -> Option<Namespaces> {
        // Known (assumed by `podhost tool`, or probed before): no helper to look for.
        let probe = match crate::exec::probe::namespaces_known() {
            Some(probe) => probe,
            None => {
                let helper = settings
                    .helper
                    .clone()
                    .or_else(|| crate::exec::find_supervisor().ok())?;
                crate::exec::probe::probe_namespaces(&helper)
            }
        };
        probe.namespaces.any().then_some(probe.namespaces)
    }
}

impl Confinement {
    /// The view of local use (see [`Settings::read_only_system`]): the whole system read-only,
    /// its devices (terminals included) and sockets as they are; the workspace's roots (the
    /// `--allow-write` directories among them), the temporary directories and `/dev/shm`
    /// writable; the hidden paths covered.
    pub(super) fn local_view(&self, ws: &Workspace) -> View {
        let mut view = View {
            host_dev: true,
            host_sockets: true,
            ..View::default()
        };
        for root in ws.roots() {
            let list = if root.writable {
                &mut view.writable
            } else {
                &mut view.readonly
            };
            push_unique(list, &root.host);
        }
        for p in &self.readable {
            push_unique(&mut view.readonly, p);
        }
        for h in &self.hidden {
            push_unique(&mut view.hidden, h);
        }
        let tmp: Vec<PathBuf> = match &self.tmp {
            Some(tmp) => vec![tmp.clone()],
            None => ["/tmp", "/var/tmp"]
                .iter()
                .map(|d| canonical_lenient(Path::new(d)))
                .collect(),
        };
        for d in tmp
            .iter()
            .map(PathBuf::as_path)
            .chain([Path::new("/dev/shm")])
        {
            push_unique(&mut view.writable, d);
        }
        view
    }

    /// The view of the file system a session holder builds for `ws` (see `session::view`): the
    /// workspace's roots and temporary directory bound back, the hidden paths and the host's
    /// socket directories covered (and, with a private temporary directory, the shared ones).
    pub(super) fn view(&self, ws: &Workspace) -> View {
        let mut view = View {
            shm_bytes: SHM_BYTES,
            ..View::default()
        };
        for root in ws.roots() {
            let list = if root.writable {
                &mut view.writable
            } else {
                &mut view.readonly
            };
            push_unique(list, &root.host);
        }
        for p in &self.readable {
            push_unique(&mut view.readonly, p);
        }
        for h in &self.hidden {
            push_unique(&mut view.hidden, h);
        }
        let mut masked: Vec<PathBuf> = RUN_DIRS.iter().map(PathBuf::from).collect();
        match &self.tmp {
            Some(tmp) => {
                push_unique(&mut view.writable, tmp);
                // Host sockets live there too, and sessions must not leave files for each other.
                masked.extend(["/tmp", "/var/tmp"].map(PathBuf::from));
            }
            None => {
                for d in ["/tmp", "/var/tmp"] {
                    push_unique(&mut view.writable, &canonical_lenient(Path::new(d)));
                }
            }
        }
        for m in &masked {
            push_unique(&mut view.hidden, m);
        }
        // The resolver's configuration often lives in /run (systemd-resolved): keep it readable.
        if let Ok(resolv) = fs::canonicalize("/etc/resolv.conf")
            && masked.iter().any(|m| resolv.starts_with(m))
        {
            push_unique(&mut view.readonly, &resolv);
        }
        view
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn a_byoh_view_masks_the_shared_tmp_and_a_pods_binds_it_back() {
        let t = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(t.path()).unwrap();
        let (data, ws, tmp) = (
            root.join("data"),
            root.join("data/ws"),
            root.join("data/tmp"),
        );
        for d in [&ws, &tmp] {
            fs::create_dir_all(d).unwrap();
        }
        let ca = root.join("ca.pem");
        let workspace = Workspace::new(&ws, None).unwrap();
        let policy = Confinement::default().hide(&data).allow_read(&ca);
        let p = |s: &str| PathBuf::from(s);
        // Where the resolver's configuration lives in /run, it is bound back read-only.
        let resolv: Vec<PathBuf> = fs::canonicalize("/etc/resolv.conf")
            .ok()
            .filter(|r| r.starts_with("/run") || r.starts_with("/var/run"))
            .into_iter()
            .collect();
        let byoh = policy.clone().private_tmp(&tmp).view(&workspace);
        let mut readonly = vec![ca.clone()];
        readonly.extend(resolv.iter().cloned());
        assert_eq!(
            byoh,
            View {
                writable: vec![ws.clone(), tmp.clone()],
                readonly: readonly.clone(),
                hidden: vec![
                    data.clone(),
                    p("/run"),
                    p("/var/run"),
                    p("/tmp"),
                    p("/var/tmp")
                ],
                shm_bytes: SHM_BYTES,
                ..View::default()
            }
        );
        let pod = policy.view(&workspace);
        assert_eq!(
            pod,
            View {
                writable: vec![
                    ws,
                    canonical_lenient(Path::new("/tmp")),
                    canonical_lenient(Path::new("/var/tmp"))
                ],
                readonly,
                hidden: vec![data, p("/run"), p("/var/run")],
                shm_bytes: SHM_BYTES,
                ..View::default()
            }
        );
    }
}
