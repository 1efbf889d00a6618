//! TEMPORARY SHIM of the `artifacts` branch's module (the fixed interface of the turn brief), so
//! that the turn code compiles before that branch lands. Deleted when `main` brings the real one.

use std::sync::OnceLock;

use serde_json::Value;

use super::channel::Channel;
use super::protocol::TurnLimits;
use crate::tools::{ToolDefinition, ToolOutcome};

/// The artifact requests of one run.
pub struct Artifacts {
    pub channel: Channel,
    pub run_id: String,
    pub limits: TurnLimits,
}

impl Artifacts {
    pub fn new(channel: Channel, run_id: String, limits: TurnLimits) -> Self {
        Artifacts {
            channel,
            run_id,
            limits,
        }
    }
}

/// Runs a model's `read_artifact` call (shim: not available).
pub async fn read_for_model(_artifacts: &Artifacts, _args: &Value) -> ToolOutcome {
    ToolOutcome::failed(
        "tool.unavailable",
        "read_artifact is not available in this build",
    )
}

/// The model-facing definition of `read_artifact`.
pub fn read_artifact_definition() -> &'static ToolDefinition {
    static DEF: OnceLock<ToolDefinition> = OnceLock::new();
    DEF.get_or_init(|| ToolDefinition {
        name: "read_artifact".to_owned(),
        description: "Read an artifact of this session.".to_owned(),
        input_schema: serde_json::json!({
            "type": "object",
            "properties": {"artifactId": {"type": "string"}},
            "required": ["artifactId"],
            "additionalProperties": false
        }),
    })
}
