//! The host's UNIX sockets, kept out of a session's reach by path: a read-only mount does not
//! stop a `connect`, so every socket bound on the host gets the view's `/dev/null` laid over it
//! (a `connect` there is refused), wherever it lies.
//!
//! Owns: reading the host's socket table (`/proc/net/unix`, opened before the session leaves
//! the host's network namespace, so that it keeps showing the host's sockets) and telling which
//! sockets are new since the last look ([`SocketWatch::scan`]). The holder covers what the first
//! look finds while it builds the view; each command's supervisor, forked from it, what its own
//! look finds before the command starts. The holder's list of covered sockets does not learn of
//! its supervisors' covers: a socket an earlier command's supervisor covered is a device in the
//! view now, not a socket, and skipped.
//!
//! Invariants: a socket is known by its socket inode, so one bound again at a covered path (its
//! server restarted) is covered again; the session's own writable places keep their sockets
//! (a command's server there must stay reachable by the session itself).
//!
//! Non-goals: sockets of other network namespaces (the table shows one namespace's), sockets
//! bound between two looks while a command runs.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::PathBuf;

/// The host's socket table and the sockets already covered.
#[derive(Debug)]
pub struct SocketWatch {
    table: Option<File>,
    covered: HashSet<u64>,
    /// The session's own writable places.
    own: Vec<PathBuf>,
}

/// The largest table read (a busy host's thousands of sockets fit well within it).
const MAX_TABLE: usize = 16 << 20;

impl SocketWatch {
    /// Opens this network namespace's socket table (when `watch`: local use leaves the host's
    /// sockets alone); without one (no `/proc`), there is nothing to watch.
    pub fn open(own: Vec<PathBuf>, watch: bool) -> SocketWatch {
        SocketWatch {
            table: watch
                .then(|| File::open("/proc/self/net/unix").ok())
                .flatten(),
            covered: HashSet::new(),
            own,
        }
    }

    /// The paths of sockets bound since the last look that are sockets in this view of the file
    /// system (a socket bound in another mount namespace may name a path that is something else
    /// here, or nothing), outside the session's own places.
    pub fn scan(&mut self) -> Vec<PathBuf> {
        let Some(table) = &self.table else {
            return Vec::new();
        };
        let mut text = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        // A seq file read from offset 0 shows the table as it is now.
        loop {
            match table.read_at(&mut buf, text.len() as u64) {
                Ok(0) | Err(_) => break,
                Ok(n) => text.extend_from_slice(&buf[..n]),
            }
            if text.len() > MAX_TABLE {
                break;
            }
        }
        let mut out = Vec::new();
        for (inode, path) in entries(&text) {
            if self.covered.contains(&inode) || self.own.iter().any(|o| path.starts_with(o)) {
                continue;
            }
            let is_socket =
                std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_socket());
            if is_socket {
                self.covered.insert(inode);
                out.push(path);
            }
        }
        out.sort();
        out.dedup();
        out
    }
}

/// The (socket inode, absolute path) entries of a `/proc/net/unix` table: the inode is the
/// seventh field, the path the eighth onwards (a path may hold spaces); abstract names (`@…`)
/// and unnamed sockets have no path.
fn entries(table: &[u8]) -> Vec<(u64, PathBuf)> {
    let mut out = Vec::new();
    for line in table.split(|b| *b == b'\n').skip(1) {
        let mut rest = line;
        let mut inode = None;
        for field in 0..7 {
            let trimmed = rest.trim_ascii_start();
            let end = trimmed
                .iter()
                .position(|b| *b == b' ')
                .unwrap_or(trimmed.len());
            if field == 6 {
                inode = std::str::from_utf8(&trimmed[..end])
                    .ok()
                    .and_then(|s| s.parse::<u64>().ok());
            }
            rest = &trimmed[end..];
        }
        let path = rest.trim_ascii();
        if let (Some(inode), Some(b'/')) = (inode, path.first()) {
            out.push((inode, PathBuf::from(OsStr::from_bytes(path))));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn entries_are_read_from_the_table_spaces_and_all() {
        let table = b"Num       RefCount Protocol Flags    Type St Inode Path\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 21017 /run/systemd/notify\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 21018 @/tmp/.X11-unix/X0\n\
            0000000000000000: 00000003 00000000 00000000 0001 03 21019\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 21020 /tmp/a b.sock\n";
        assert_eq!(
            entries(table),
            vec![
                (21017, PathBuf::from("/run/systemd/notify")),
                (21020, PathBuf::from("/tmp/a b.sock"))
            ]
        );
    }

    #[test]
    fn a_socket_is_found_once_and_again_when_bound_anew() {
        let dir = tempfile::tempdir().unwrap();
        let own = dir.path().join("own");
        std::fs::create_dir(&own).unwrap();
        let path = dir.path().join("s.sock");
        let mine = own.join("mine.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let _own = std::os::unix::net::UnixListener::bind(&mine).unwrap();
        let mut watch = SocketWatch::open(vec![own], true);
        let found = watch.scan();
        assert!(found.contains(&path), "{found:?}");
        assert!(
            !found.contains(&mine),
            "the session's own socket was covered"
        );
        assert!(!watch.scan().contains(&path), "found twice");
        drop(_listener);
        std::fs::remove_file(&path).unwrap();
        let _again = std::os::unix::net::UnixListener::bind(&path).unwrap();
        assert!(watch.scan().contains(&path), "bound anew, not found again");
    }
}
