//! Skills: the manifest's skill files, fetched with `definition.file` and mounted read-only at
//! `<root>/<name>@<hash>/` (`/skills/…` in a pod) before the turn's sandbox calls (v5 §3).
//!
//! Owns: reading `manifest.skills` (`[{name, description, files: {path: "sha256:<hex>"}}]`),
//! checking every name, path and digest before anything is fetched, the folder's hash, fetching
//! each file in chunks of at most `limits.chunkBytes` with its digest checked, and the mount.
//!
//! The folder's `<hash>` ([`skill_hash`]): the first 16 hex digits of the SHA-256 of the skill's
//! file list, one line `<path>\0<sha256:hex>\n` per file in byte order of the paths. It names
//! exactly one set of files: the same skill version gets the same folder in every run and pod,
//! and a changed file, a renamed one or one more makes a new folder. (v5 names
//! `skillFolderOf` without its rule.)
//!
//! Invariants:
//! * Every file touch runs confined by the pod's toolbox (`Toolbox::confined`), with the
//!   skills root writable, so a link planted under it cannot lead a write elsewhere.
//! * Nothing half-mounted: a skill is fetched into a staging directory under the root, every
//!   file checked against its digest, modes set (files 0444, directories 0555), and only then
//!   renamed into place in one step. On any error the staging directory is removed.
//! * Idempotent: a folder already in place whose files are exactly the manifest's (kinds, modes,
//!   digests; nothing more) is used as is, nothing fetched. It is hashed in full the first time
//!   this process sees it, and after that checked by its files' sizes, inodes and change times.
//!   A folder that fails the check is removed and mounted again.
//! * A path that is absolute, has an empty, `.` or `..` component, a NUL or a control
//!   character, or is both a file and a directory of another path, refuses the whole skill before
//!   any byte is fetched: nothing is ever written outside its folder.
//!
//! Non-goals: telling the model about the skills (the turn has [`MountedSkill`]); removing
//! folders of older skill versions.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt as _;

use crate::nylorun::artifacts::{ArtifactError, Artifacts};
use crate::tools::Toolbox;

/// Where skills are mounted in a pod, as the model sees them.
pub const SKILLS_DISPLAY_ROOT: &str = "/skills";
/// The most files one skill may have.
pub const MAX_SKILL_FILES: usize = 10_000;
/// The largest skill file podhost fetches.
pub const MAX_SKILL_FILE_BYTES: u64 = 256 << 20;
/// The longest relative path of a skill file, in bytes.
const MAX_PATH_BYTES: usize = 1024;

/// A skill in place, for the turn to name to the model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountedSkill {
    pub name: String,
    /// `/skills/<name>@<hash>/`.
    pub folder: String,
    pub description: String,
}

/// Why the skills could not be mounted.
#[derive(Debug, thiserror::Error)]
pub enum SkillError {
    #[error("the manifest's skills are not a list of {{name, description, files}}: {0}")]
    Manifest(String),
    #[error("skill {skill:?} is refused: {message}")]
    Invalid { skill: String, message: String },
    #[error("skill {skill:?}: fetching {path} failed: {source}")]
    Fetch {
        skill: String,
        path: String,
        #[source]
        source: ArtifactError,
    },
    #[error("skill {skill:?}: the bytes of {path} do not match {expected} (got sha256:{actual})")]
    Digest {
        skill: String,
        path: String,
        expected: String,
        actual: String,
    },
    #[error("skill {skill:?}: {path} is larger than {limit} bytes")]
    TooLarge {
        skill: String,
        path: String,
        limit: u64,
    },
    #[error("skill {skill:?}: could not {action} {}: {source}", .path.display())]
    Io {
        skill: String,
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

#[derive(Debug, Deserialize)]
struct SkillSpec {
    name: String,
    #[serde(default)]
    description: String,
    files: BTreeMap<String, String>,
}

/// A skill whose name, paths and digests passed the checks.
#[derive(Debug)]
struct Checked {
    name: String,
    description: String,
    /// Path → `sha256:<hex>`, in byte order of the paths.
    files: BTreeMap<String, String>,
    /// Every directory the files need, parents first.
    dirs: BTreeSet<String>,
    folder: String,
}

/// Mounts `skills` (the manifest's `skills`; `null` or absent is none) under `root`, named for
/// the model under `/skills`. Every file touch runs confined by `toolbox` (`root` writable).
pub async fn mount_skills(
    artifacts: &Artifacts,
    toolbox: &Toolbox,
    skills: &Value,
    root: &Path,
) -> Result<Vec<MountedSkill>, SkillError> {
    mount_skills_at(artifacts, toolbox, skills, root, SKILLS_DISPLAY_ROOT).await
}

/// [`mount_skills`] with the root's path as the model sees it.
pub async fn mount_skills_at(
    artifacts: &Artifacts,
    toolbox: &Toolbox,
    skills: &Value,
    root: &Path,
    display_root: &str,
) -> Result<Vec<MountedSkill>, SkillError> {
    let specs: Vec<SkillSpec> = match skills {
        Value::Null => Vec::new(),
        v => Vec::<SkillSpec>::deserialize(v).map_err(|e| SkillError::Manifest(e.to_string()))?,
    };
    // Every skill is checked before anything is fetched.
    let checked = specs
        .into_iter()
        .map(check)
        .collect::<Result<Vec<_>, _>>()?;
    if !checked.is_empty() {
        // Made before the confined work: a confined thread can be granted only what exists.
        std::fs::create_dir_all(root).map_err(|source| SkillError::Io {
            skill: checked[0].name.clone(),
            action: "create",
            path: root.to_path_buf(),
            source,
        })?;
    }
    let mut mounted = Vec::with_capacity(checked.len());
    let files = SkillFiles { toolbox, root };
    for skill in checked {
        mount_one(artifacts, &files, &skill).await?;
        mounted.push(MountedSkill {
            folder: format!("{}/{}/", display_root.trim_end_matches('/'), skill.folder),
            name: skill.name,
            description: skill.description,
        });
    }
    Ok(mounted)
}

/// The folder hash of a skill's files (see the module docs).
pub fn skill_hash(files: &BTreeMap<String, String>) -> String {
    let mut h = Sha256::new();
    for (path, digest) in files {
        h.update(path.as_bytes());
        h.update(b"\0");
        h.update(digest.as_bytes());
        h.update(b"\n");
    }
    hex::encode(h.finalize())[..16].to_owned()
}

fn check(spec: SkillSpec) -> Result<Checked, SkillError> {
    let invalid = |message: String| SkillError::Invalid {
        skill: spec.name.clone(),
        message,
    };
    let name_ok = !spec.name.is_empty()
        && spec.name.len() <= 128
        && !spec.name.starts_with('.')
        && spec
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !name_ok {
        return Err(invalid(
            "a name must be 1 to 128 letters, digits, '-', '_' or '.', not starting with '.'"
                .to_owned(),
        ));
    }
    if spec.files.len() > MAX_SKILL_FILES {
        return Err(invalid(format!(
            "{} files is past the limit of {MAX_SKILL_FILES}",
            spec.files.len()
        )));
    }
    let mut dirs = BTreeSet::new();
    for (path, digest) in &spec.files {
        check_path(path).map_err(|why| invalid(format!("the path {path:?} {why}")))?;
        if !is_digest(digest) {
            return Err(invalid(format!(
                "the digest of {path:?} is not sha256:<64 lowercase hex digits>"
            )));
        }
        let mut at = 0;
        while let Some(i) = path[at..].find('/') {
            dirs.insert(path[..at + i].to_owned());
            at += i + 1;
        }
    }
    if let Some(both) = dirs.iter().find(|d| spec.files.contains_key(*d)) {
        return Err(invalid(format!(
            "{both:?} is both a file and a directory of other files"
        )));
    }
    let folder = format!("{}@{}", spec.name, skill_hash(&spec.files));
    Ok(Checked {
        name: spec.name,
        description: spec.description,
        files: spec.files,
        dirs,
        folder,
    })
}

fn check_path(path: &str) -> Result<(), &'static str> {
    if path.is_empty() {
        return Err("is empty");
    }
    if path.len() > MAX_PATH_BYTES {
        return Err("is too long");
    }
    if path.starts_with('/') {
        return Err("is absolute");
    }
    if path.chars().any(|c| c == '\0' || c.is_control()) {
        return Err("holds a NUL or control character");
    }
    for part in path.split('/') {
        match part {
            "" => return Err("has an empty component"),
            "." | ".." => return Err("has a '.' or '..' component"),
            p if p.len() > 255 => return Err("has a component longer than 255 bytes"),
            _ => {}
        }
    }
    Ok(())
}

fn is_digest(d: &str) -> bool {
    d.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == 64
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// What this process last saw of a folder it verified: each file's (size, inode, ctime).
type Seen = Vec<(u64, u64, i64, i64)>;

fn verified() -> &'static Mutex<HashMap<PathBuf, Seen>> {
    static V: std::sync::OnceLock<Mutex<HashMap<PathBuf, Seen>>> = std::sync::OnceLock::new();
    V.get_or_init(Mutex::default)
}

/// A `map_err` for an I/O failure of `action` on `path` while mounting `skill`.
fn io_error(
    skill: &Checked,
    action: &'static str,
    path: &Path,
) -> impl FnOnce(std::io::Error) -> SkillError + use<> {
    let skill = skill.name.clone();
    let path = path.to_path_buf();
    move |source| SkillError::Io {
        skill,
        action,
        path,
        source,
    }
}

/// The skills root, and the toolbox whose confinement every file touch under it runs in.
struct SkillFiles<'a> {
    toolbox: &'a Toolbox,
    root: &'a Path,
}

impl SkillFiles<'_> {
    /// Runs `f` confined to the toolbox's rules with the skills root writable.
    async fn confined<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
    ) -> std::io::Result<T> {
        self.toolbox
            .confined("skills", &[self.root], f)
            .await
            .map_err(std::io::Error::other)?
    }
}

async fn mount_one(
    artifacts: &Artifacts,
    files: &SkillFiles<'_>,
    skill: &Checked,
) -> Result<(), SkillError> {
    let target = files.root.join(&skill.folder);
    let io = |action: &'static str, path: &Path| io_error(skill, action, path);
    match in_place(files, skill, &target).await {
        Place::Verified => {
            tracing::debug!(skill = %skill.name, folder = %skill.folder, "skill already mounted");
            return Ok(());
        }
        Place::Missing => {}
        Place::Wrong(why) => {
            tracing::warn!(skill = %skill.name, folder = %skill.folder, %why, "a mounted skill does not match its manifest; mounting it again");
            let t = target.clone();
            files
                .confined(move || remove_tree(&t))
                .await
                .map_err(io("remove", &target))?;
        }
    }
    let stage = files.root.join(format!(
        ".staging-{}-{}",
        skill.folder,
        uuid::Uuid::new_v4()
    ));
    let remove_stage = || {
        let st = stage.clone();
        files.confined(move || remove_tree(&st))
    };
    if let Err(e) = fetch_into(artifacts, files, skill, &stage).await {
        let _ = remove_stage().await;
        return Err(e);
    }
    let (from, to) = (stage.clone(), target.clone());
    match files.confined(move || std::fs::rename(&from, &to)).await {
        Ok(()) => {
            tracing::info!(skill = %skill.name, folder = %skill.folder, files = skill.files.len(), "skill mounted");
            Ok(())
        }
        Err(e) => {
            // Another run mounted it first: keep theirs if it is right.
            let _ = remove_stage().await;
            match in_place(files, skill, &target).await {
                Place::Verified => Ok(()),
                _ => Err(io("rename into", &target)(e)),
            }
        }
    }
}

/// Fetches every file into `stage`, checks it, and sets the read-only modes.
async fn fetch_into(
    artifacts: &Artifacts,
    files: &SkillFiles<'_>,
    skill: &Checked,
    stage: &Path,
) -> Result<(), SkillError> {
    let io = |action: &'static str, path: &Path| io_error(skill, action, path);
    let (st, dirs) = (stage.to_path_buf(), skill.dirs.clone());
    files
        .confined(move || {
            std::fs::create_dir(&st)?;
            dirs.iter()
                .try_for_each(|dir| std::fs::create_dir(st.join(dir)))
        })
        .await
        .map_err(io("create", stage))?;
    for (path, digest) in &skill.files {
        fetch_file(artifacts, files, skill, stage, path, digest).await?;
    }
    // Deepest first, the staging root last: a directory is read-only once its files are in.
    let (st, dirs) = (stage.to_path_buf(), skill.dirs.clone());
    files
        .confined(move || {
            let read_only = std::fs::Permissions::from_mode(0o555);
            for dir in dirs.iter().rev() {
                std::fs::set_permissions(st.join(dir), read_only.clone())?;
            }
            std::fs::set_permissions(&st, read_only)
        })
        .await
        .map_err(io("set the mode of", stage))
}

/// Fetches one file of the skill into `stage`, in chunks, checks its digest, and makes it
/// read-only.
async fn fetch_file(
    artifacts: &Artifacts,
    files: &SkillFiles<'_>,
    skill: &Checked,
    stage: &Path,
    path: &str,
    digest: &str,
) -> Result<(), SkillError> {
    let io = |action: &'static str, path: &Path| io_error(skill, action, path);
    let chunk = artifacts.chunk_bytes() as u64;
    let host = stage.join(path);
    let h = host.clone();
    // Opened confined; its bytes are then written to the open file, which needs no path.
    let file = files
        .confined(move || {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&h)
        })
        .await
        .map_err(io("create", &host))?;
    let mut file = tokio::fs::File::from_std(file);
    let expected = &digest["sha256:".len()..];
    let mut hasher = Sha256::new();
    let mut offset = 0u64;
    loop {
        let (bytes, eof) = artifacts
            .definition_chunk(digest, offset, chunk)
            .await
            .map_err(|source| SkillError::Fetch {
                skill: skill.name.clone(),
                path: path.to_owned(),
                source,
            })?;
        offset += bytes.len() as u64;
        if offset > MAX_SKILL_FILE_BYTES {
            return Err(SkillError::TooLarge {
                skill: skill.name.clone(),
                path: path.to_owned(),
                limit: MAX_SKILL_FILE_BYTES,
            });
        }
        hasher.update(&bytes);
        file.write_all(&bytes).await.map_err(io("write", &host))?;
        // The end: core says so, a short range, or (for an answer without `eof` whose file
        // is a whole number of chunks) the bytes so far are the file.
        let done = eof == Some(true)
            || (bytes.len() as u64) < chunk
            || (eof.is_none() && hex::encode(hasher.clone().finalize()) == expected);
        if done {
            break;
        }
    }
    let actual = hex::encode(hasher.finalize());
    if actual != expected {
        return Err(SkillError::Digest {
            skill: skill.name.clone(),
            path: path.to_owned(),
            expected: digest.to_owned(),
            actual,
        });
    }
    file.sync_all().await.map_err(io("write", &host))?;
    // fchmod: the open file, not its path.
    file.set_permissions(std::fs::Permissions::from_mode(0o444))
        .await
        .map_err(io("set the mode of", &host))?;
    Ok(())
}

enum Place {
    Missing,
    Verified,
    Wrong(String),
}

/// Whether `target` holds exactly the skill's files (off the async workers: it may hash them).
async fn in_place(files: &SkillFiles<'_>, skill: &Checked, target: &Path) -> Place {
    let (want, dirs, target) = (
        skill.files.clone(),
        skill.dirs.clone(),
        target.to_path_buf(),
    );
    files
        .confined(move || Ok(verify(&want, &dirs, &target)))
        .await
        .unwrap_or_else(|e| Place::Wrong(e.to_string()))
}

fn verify(files: &BTreeMap<String, String>, dirs: &BTreeSet<String>, target: &Path) -> Place {
    let meta = match std::fs::symlink_metadata(target) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Place::Missing,
        Err(e) => return Place::Wrong(e.to_string()),
    };
    if !meta.is_dir() || meta.mode() & 0o777 != 0o555 {
        return Place::Wrong("the folder is not a read-only directory".to_owned());
    }
    // Exactly the expected entries, of the expected kinds and modes.
    let mut seen = Vec::with_capacity(files.len());
    let mut found = 0usize;
    let mut stack = vec![(target.to_path_buf(), String::new())];
    while let Some((dir, prefix)) = stack.pop() {
        let rd = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) => return Place::Wrong(e.to_string()),
        };
        for entry in rd {
            let Ok(entry) = entry else {
                return Place::Wrong("a directory could not be listed".to_owned());
            };
            let name = entry.file_name();
            let Some(name) = name.to_str() else {
                return Place::Wrong("an entry with a name that is not UTF-8".to_owned());
            };
            let rel = if prefix.is_empty() {
                name.to_owned()
            } else {
                format!("{prefix}/{name}")
            };
            let Ok(m) = entry.metadata() else {
                return Place::Wrong(format!("{rel} could not be read"));
            };
            if m.is_dir() && dirs.contains(&rel) && m.mode() & 0o777 == 0o555 {
                stack.push((entry.path(), rel));
            } else if m.is_file() && files.contains_key(&rel) && m.mode() & 0o777 == 0o444 {
                found += 1;
            } else {
                return Place::Wrong(format!("{rel} is not one of the skill's files"));
            }
        }
    }
    if found != files.len() {
        return Place::Wrong(format!("{} of {} files are there", found, files.len()));
    }
    for path in files.keys() {
        match std::fs::symlink_metadata(target.join(path)) {
            Ok(m) => seen.push((m.len(), m.ino(), m.ctime(), m.ctime_nsec())),
            Err(e) => return Place::Wrong(e.to_string()),
        }
    }
    let cache = verified();
    let known = cache
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(target)
        .is_some_and(|s| *s == seen);
    if !known {
        for (path, digest) in files {
            match hash_file(&target.join(path)) {
                Ok(h) if h == digest["sha256:".len()..] => {}
                Ok(_) => return Place::Wrong(format!("{path} does not match its digest")),
                Err(e) => return Place::Wrong(format!("{path}: {e}")),
            }
        }
        cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(target.to_path_buf(), seen);
    }
    Place::Verified
}

fn hash_file(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let file = match crate::floor::workspace::open_regular(path) {
        Ok(f) => f,
        Err(crate::floor::workspace::OpenError::Io(e)) => return Err(e),
        Err(_) => return Err(std::io::Error::other("not a regular file")),
    };
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut r = file;
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}

/// Removes a tree whose directories may be read-only.
fn remove_tree(path: &Path) -> std::io::Result<()> {
    fn writable(p: &Path) -> std::io::Result<()> {
        let m = std::fs::symlink_metadata(p)?;
        if m.is_dir() {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755))?;
            for e in std::fs::read_dir(p)? {
                writable(&e?.path())?;
            }
        }
        Ok(())
    }
    match writable(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
        Ok(()) => {}
    }
    std::fs::remove_dir_all(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    fn spec(files: Value) -> SkillSpec {
        serde_json::from_value(json!({"name": "pdf", "description": "d", "files": files})).unwrap()
    }

    const D: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";

    #[test]
    fn the_folder_hash_names_the_file_list() {
        let a = BTreeMap::from([("SKILL.md".to_owned(), D.to_owned())]);
        let h = skill_hash(&a);
        assert_eq!(h.len(), 16);
        assert_eq!(h, skill_hash(&a.clone()));
        let b = BTreeMap::from([("skill.md".to_owned(), D.to_owned())]);
        assert_ne!(h, skill_hash(&b));
        let c = check(spec(json!({"SKILL.md": D, "scripts/run.py": D}))).unwrap();
        assert_eq!(c.dirs, BTreeSet::from(["scripts".to_owned()]));
        assert!(c.folder.starts_with("pdf@"));
    }

    #[test]
    fn escaping_paths_names_and_digests_are_refused() {
        for (path, why) in [
            ("../x", "has a '.' or '..' component"),
            ("/etc/passwd", "is absolute"),
            ("a//b", "has an empty component"),
            ("a/./b", "has a '.' or '..' component"),
            ("a\nb", "holds a NUL or control character"),
            ("", "is empty"),
        ] {
            let e = check(spec(json!({path: D}))).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("skill \"pdf\" is refused: the path {path:?} {why}")
            );
        }
        let e = check(spec(json!({"a": D, "a/b": D}))).unwrap_err();
        assert_eq!(
            e.to_string(),
            "skill \"pdf\" is refused: \"a\" is both a file and a directory of other files"
        );
        let e = check(spec(json!({"a": "sha256:ABC"}))).unwrap_err();
        assert!(e.to_string().contains("is not sha256:<64"), "{e}");
        let bad: SkillSpec = serde_json::from_value(json!({"name": "../up", "files": {}})).unwrap();
        assert!(check(bad).is_err());
    }
}
