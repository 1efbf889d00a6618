//! TEMPORARY SHIM of the `artifacts` branch's module: the value passes through unchanged.

use serde_json::Value;

use super::artifacts::Artifacts;

/// The value to record for a tool call's outcome (shim: as is).
pub async fn fit_outcome(
    _artifacts: &Artifacts,
    _effect_id: &str,
    _tool_name: &str,
    value: Value,
) -> Value {
    value
}
