//! TEMPORARY SHIM of the `artifacts` branch's module: exports nothing.

use super::artifacts::Artifacts;

#[derive(Debug, Default)]
pub struct ExportReport {}

impl ExportReport {
    /// The claims of an export that stored nothing (shim: none).
    pub fn claims(&self) -> Vec<(&'static str, serde_json::Value)> {
        Vec::new()
    }
}

/// Writes `/workspace/outputs` as the session's `outputs` folder version (shim: nothing).
pub async fn export_outputs(
    _artifacts: &Artifacts,
    _outputs_dir: &std::path::Path,
    _turn_id: &str,
) -> ExportReport {
    ExportReport::default()
}
