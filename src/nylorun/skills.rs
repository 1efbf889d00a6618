//! TEMPORARY SHIM of the `artifacts` branch's module: no skill can be mounted.

use super::artifacts::Artifacts;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountedSkill {
    pub name: String,
    pub folder: String,
    pub description: String,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SkillError(String);

/// Mounts the manifest's skills under `root` (shim: refuses any skill).
pub async fn mount_skills(
    _artifacts: &Artifacts,
    skills: &serde_json::Value,
    _root: &std::path::Path,
) -> Result<Vec<MountedSkill>, SkillError> {
    match skills.as_array() {
        Some(a) if !a.is_empty() => Err(SkillError(
            "skills are not supported in this build".to_owned(),
        )),
        _ => Ok(Vec::new()),
    }
}
