//! Per-file locks, so that concurrent edits and writes to one file all land.
//!
//! Owns: a map from a file's resolved host path to a mutex. The key is the resolved path, so a
//! symlink and its target share one lock. Entries are dropped when their last holder lets go.
//!
//! Non-goals: locking against other processes (a command may still write the file; the edit then
//! works on what it reads under the lock).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

#[derive(Debug, Default)]
pub struct FileLocks {
    map: Mutex<HashMap<PathBuf, Arc<Mutex<()>>>>,
}

/// Holds one file's lock until dropped.
pub struct FileGuard<'a> {
    locks: &'a FileLocks,
    path: PathBuf,
    lock: Option<Arc<Mutex<()>>>,
}

impl FileLocks {
    /// Blocks until this thread holds the lock for `path` (a resolved host path).
    pub fn lock(&self, path: &Path) -> FileGuard<'_> {
        let lock = {
            let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
            map.entry(path.to_path_buf()).or_default().clone()
        };
        FileGuard {
            locks: self,
            path: path.to_path_buf(),
            lock: Some(lock),
        }
    }

    /// How many files have a lock entry (held or waited for).
    pub fn len(&self) -> usize {
        self.map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl FileGuard<'_> {
    /// Runs `f` while holding the lock.
    pub fn with<T>(&self, f: impl FnOnce() -> T) -> T {
        let _held: Option<MutexGuard<'_, ()>> = self
            .lock
            .as_ref()
            .map(|l| l.lock().unwrap_or_else(PoisonError::into_inner));
        f()
    }
}

impl Drop for FileGuard<'_> {
    fn drop(&mut self) {
        let mut map = self
            .locks
            .map
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.lock.take();
        if let Some(l) = map.get(&self.path) {
            // Only the map holds it: nobody waits, forget it.
            if Arc::strong_count(l) == 1 {
                map.remove(&self.path);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn holders_of_one_path_take_turns_and_entries_are_dropped() {
        let locks = Arc::new(FileLocks::default());
        let inside = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (locks, inside) = (locks.clone(), inside.clone());
                std::thread::spawn(move || {
                    let g = locks.lock(Path::new("/f"));
                    g.with(|| {
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0);
                        std::thread::sleep(std::time::Duration::from_millis(2));
                        inside.fetch_sub(1, Ordering::SeqCst);
                    });
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(locks.is_empty());
    }
}
