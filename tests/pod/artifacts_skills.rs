//! Skills fetched with `definition.file` and mounted read-only.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use podhost::nylorun::artifacts::skills::{MountedSkill, mount_skills};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::driven_runs::{Pod, within};
use crate::mode_of;

/// The folder hash as the module documents it, computed here independently.
fn folder_hash(files: &[(&str, &str)]) -> String {
    let mut sorted = files.to_vec();
    sorted.sort();
    let mut h = Sha256::new();
    for (path, digest) in sorted {
        h.update(format!("{path}\0{digest}\n"));
    }
    hex::encode(h.finalize())[..16].to_owned()
}

fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => Vec::new(),
    };
    names.sort();
    names
}

struct Skills {
    manifest: Value,
    skill_md: Vec<u8>,
    fill: Vec<u8>,
    util: Vec<u8>,
    notes: Vec<u8>,
    d_skill: String,
    d_fill: String,
    d_util: String,
    d_notes: String,
}

/// Two skills: `pdf` with nested files (one exactly two 100-byte chunks, one two and a half),
/// and `notes` with one file.
fn skills(pod: &Pod) -> Skills {
    let store = pod.core.artifacts();
    let skill_md = b"# PDF\nUse scripts/fill.py.\n".to_vec();
    let fill: Vec<u8> = (0..200u32).map(|i| b'a' + (i % 26) as u8).collect();
    let util: Vec<u8> = (0..250u32).map(|i| b'0' + (i % 10) as u8).collect();
    let notes = b"# Notes\n".to_vec();
    let d_skill = store.add_definition_file(&skill_md);
    let d_fill = store.add_definition_file(&fill);
    let d_util = store.add_definition_file(&util);
    let d_notes = store.add_definition_file(&notes);
    let manifest = json!({"skills": [
        {"name": "pdf", "description": "Fill PDF forms", "plugin": {"name": "docs"},
         "files": {"SKILL.md": d_skill, "scripts/fill.py": d_fill, "scripts/lib/util.py": d_util}},
        {"name": "notes", "description": "Take notes", "files": {"SKILL.md": d_notes}},
    ]});
    Skills {
        manifest,
        skill_md,
        fill,
        util,
        notes,
        d_skill,
        d_fill,
        d_util,
        d_notes,
    }
}

impl Skills {
    fn folders(&self) -> (String, String) {
        let pdf = folder_hash(&[
            ("SKILL.md", &self.d_skill),
            ("scripts/fill.py", &self.d_fill),
            ("scripts/lib/util.py", &self.d_util),
        ]);
        let notes = folder_hash(&[("SKILL.md", &self.d_notes)]);
        (format!("pdf@{pdf}"), format!("notes@{notes}"))
    }

    fn mounted(&self) -> Vec<MountedSkill> {
        let (pdf, notes) = self.folders();
        vec![
            MountedSkill {
                name: "pdf".into(),
                folder: format!("/skills/{pdf}/"),
                description: "Fill PDF forms".into(),
            },
            MountedSkill {
                name: "notes".into(),
                folder: format!("/skills/{notes}/"),
                description: "Take notes".into(),
            },
        ]
    }
}

#[tokio::test]
async fn skills_are_fetched_in_chunks_and_mounted_read_only() {
    let mut pod = Pod::start().await;
    let s = skills(&pod);
    let run = pod
        .run(
            "run-k",
            "ses_k",
            json!({"chunkBytes": 100}),
            s.manifest.clone(),
        )
        .await;
    let root = pod.dirs.dir.path().join("skills");
    let mounted = within(mount_skills(
        &run.artifacts(),
        &pod.toolbox(),
        &s.manifest["skills"],
        &root,
    ))
    .await
    .unwrap();
    assert_eq!(mounted, s.mounted());
    let (pdf, notes) = s.folders();
    assert_eq!(listing(&root), vec![notes.clone(), pdf.clone()]);
    let p = root.join(&pdf);
    for (rel, bytes) in [
        ("SKILL.md", &s.skill_md),
        ("scripts/fill.py", &s.fill),
        ("scripts/lib/util.py", &s.util),
    ] {
        assert_eq!(&std::fs::read(p.join(rel)).unwrap(), bytes, "{rel}");
        assert_eq!(mode_of(&p.join(rel)), 0o444, "{rel}");
    }
    assert_eq!(
        std::fs::read(root.join(&notes).join("SKILL.md")).unwrap(),
        s.notes
    );
    for dir in [
        p.clone(),
        p.join("scripts"),
        p.join("scripts/lib"),
        root.join(&notes),
    ] {
        assert_eq!(mode_of(&dir), 0o555, "{}", dir.display());
    }
    // Ranges of at most chunkBytes; a file of exactly two chunks ends on its digest, without
    // asking past its end.
    let store = pod.core.artifacts();
    assert_eq!(
        [
            store.definition_ranges_served(&s.d_skill),
            store.definition_ranges_served(&s.d_fill),
            store.definition_ranges_served(&s.d_util),
            store.definition_ranges_served(&s.d_notes),
        ],
        [1, 2, 3, 1]
    );
    let fill_ranges: Vec<Value> = pod
        .requests("definition.file")
        .into_iter()
        .filter(|p| p["sha256"] == s.d_fill.as_str())
        .collect();
    assert_eq!(
        fill_ranges,
        vec![
            json!({"runId": "run-k", "sha256": s.d_fill, "length": 100}),
            json!({"runId": "run-k", "sha256": s.d_fill, "offset": 100, "length": 100}),
        ]
    );
    run.finish();
}

#[tokio::test]
async fn a_corrupted_range_is_refused_and_nothing_half_mounted_stays() {
    let mut pod = Pod::start().await;
    let s = skills(&pod);
    pod.core.artifacts().corrupt_definition_chunk(&s.d_util, 1);
    let run = pod
        .run(
            "run-x",
            "ses_x",
            json!({"chunkBytes": 100}),
            s.manifest.clone(),
        )
        .await;
    let root = pod.dirs.dir.path().join("skills");
    let e = within(mount_skills(
        &run.artifacts(),
        &pod.toolbox(),
        &s.manifest["skills"],
        &root,
    ))
    .await
    .unwrap_err();
    let mut got = s.util.clone();
    got[100] ^= 0xff;
    assert_eq!(
        e.to_string(),
        format!(
            "skill \"pdf\": the bytes of scripts/lib/util.py do not match {} (got sha256:{})",
            s.d_util,
            hex::encode(Sha256::digest(&got))
        )
    );
    // No folder, no staging directory.
    assert_eq!(listing(&root), Vec::<String>::new());
    // The next attempt gets good bytes and mounts both.
    let mounted = within(mount_skills(
        &run.artifacts(),
        &pod.toolbox(),
        &s.manifest["skills"],
        &root,
    ))
    .await
    .unwrap();
    assert_eq!(mounted, s.mounted());
    run.finish();
}

#[tokio::test]
async fn a_mounted_skill_is_not_fetched_again_and_a_tampered_one_is_mounted_anew() {
    let mut pod = Pod::start().await;
    let s = skills(&pod);
    pod.core.artifacts().set_definition_eof(true);
    let root = pod.dirs.dir.path().join("skills");
    let run1 = pod
        .run("run-1", "ses_1", json!({}), s.manifest.clone())
        .await;
    within(mount_skills(
        &run1.artifacts(),
        &pod.toolbox(),
        &s.manifest["skills"],
        &root,
    ))
    .await
    .unwrap();
    run1.finish();
    let fetched = pod.requests("definition.file").len();
    assert_eq!(fetched, 4);

    let run2 = pod
        .run("run-2", "ses_2", json!({}), s.manifest.clone())
        .await;
    let mounted = within(mount_skills(
        &run2.artifacts(),
        &pod.toolbox(),
        &s.manifest["skills"],
        &root,
    ))
    .await
    .unwrap();
    assert_eq!(mounted, s.mounted());
    assert_eq!(
        pod.requests("definition.file").len(),
        fetched,
        "fetched again"
    );

    // A file added to a mounted folder: it no longer is the skill, so it is mounted again.
    let (pdf, _) = s.folders();
    let folder = root.join(&pdf);
    std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(folder.join("extra.txt"), "x").unwrap();
    std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o555)).unwrap();
    within(mount_skills(
        &run2.artifacts(),
        &pod.toolbox(),
        &s.manifest["skills"],
        &root,
    ))
    .await
    .unwrap();
    assert_eq!(listing(&folder), vec!["SKILL.md", "scripts"]);
    assert_eq!(pod.requests("definition.file").len(), fetched + 3);
    run2.finish();
}

#[tokio::test]
async fn paths_that_escape_are_refused_before_anything_is_fetched() {
    let mut pod = Pod::start().await;
    let d = pod.core.artifacts().add_definition_file(b"evil");
    let root = pod.dirs.dir.path().join("skills");
    let cases = [
        (
            json!([{"name": "ok", "files": {"SKILL.md": d}}, {"name": "bad", "files": {"../../escape": d}}]),
            "skill \"bad\" is refused: the path \"../../escape\" has a '.' or '..' component",
        ),
        (
            json!([{"name": "abs", "files": {"/etc/passwd": d}}]),
            "skill \"abs\" is refused: the path \"/etc/passwd\" is absolute",
        ),
        (
            json!([{"name": "../up", "files": {"a": d}}]),
            "skill \"../up\" is refused: a name must be 1 to 128 letters, digits, '-', '_' or \
             '.', not starting with '.'",
        ),
        (
            json!({"not": "a list"}),
            "the manifest's skills are not a list of {name, description, files}: invalid type: \
             map, expected a sequence",
        ),
    ];
    let run = pod
        .run("run-e", "ses_e", json!({}), json!({"skills": cases[0].0}))
        .await;
    for (skills, message) in cases {
        let e = within(mount_skills(
            &run.artifacts(),
            &pod.toolbox(),
            &skills,
            &root,
        ))
        .await
        .unwrap_err();
        assert_eq!(e.to_string(), message);
    }
    assert_eq!(pod.requests("definition.file"), Vec::<Value>::new());
    assert_eq!(listing(&root), Vec::<String>::new());
    // A file the run's definition does not name is core's `invalid`; nothing stays behind.
    let other = pod
        .core
        .artifacts()
        .add_definition_file(b"not in the manifest");
    let e = within(mount_skills(
        &run.artifacts(),
        &pod.toolbox(),
        &json!([{"name": "stray", "files": {"SKILL.md": other}}]),
        &root,
    ))
    .await
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "skill \"stray\": fetching SKILL.md failed: core refused definition.file: {other} is \
             not a file of the run's definition"
        )
    );
    assert_eq!(listing(&root), Vec::<String>::new());
    // No skills at all is nothing to do.
    assert_eq!(
        within(mount_skills(
            &run.artifacts(),
            &pod.toolbox(),
            &Value::Null,
            &root
        ))
        .await
        .unwrap(),
        Vec::new()
    );
    run.finish();
}
