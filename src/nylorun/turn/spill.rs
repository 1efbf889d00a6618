//! Fitting a tool outcome into one `effect.outcome` value (v5 §4, §5b): [`super::shaping`] over the
//! run's artifact store.
//!
//! Owns: [`fit_outcome`], which the turn calls with every tool outcome before `effect.outcome`,
//! and the [`SpillStore`] that writes what does not fit as a file artifact of the session with
//! `artifact.write` — keyed by the effect id and the bytes' hash, `effectId` for provenance, so
//! a replayed call (same id, same bytes) writes nothing new: `begin` answers the key's version.
//!
//! Invariants: the value returned is at most `limits.recordEntryBytes` less the entry envelope
//! as JSON; a store that fails leaves the preview with `dropped` saying why (core's own message:
//! its `limit_exceeded` names the limit and its value); nothing here fails the turn.
//!
//! Non-goals: the decisions of what to store and how previews look ([`super::shaping`]).

use serde_json::Value;

use crate::nylorun::artifacts::{Artifacts, FileTarget};
use crate::nylorun::turn::shaping::{
    ShapeConfig, ShapeContext, SpillError, SpillRequest, SpillStore, shape_outcome,
};

/// Stores spilled results with `artifact.write`.
struct ArtifactStore<'a>(&'a Artifacts);

impl SpillStore for ArtifactStore<'_> {
    async fn store(&self, req: SpillRequest<'_>) -> Result<String, SpillError> {
        let target = FileTarget {
            key: req.key,
            name: Some(req.name),
            artifact_id: None,
            content_type: Some(req.content_type.to_owned()),
            effect_id: Some(req.effect_id.to_owned()),
        };
        match self.0.write_file(&target, req.bytes).await {
            Ok(w) => {
                tracing::info!(
                    run_id = %self.0.run_id(),
                    effect_id = %req.effect_id,
                    artifact_id = %w.artifact.artifact_id,
                    size = req.bytes.len(),
                    created = w.created,
                    "a tool result too large for the record was stored"
                );
                Ok(w.artifact.artifact_id)
            }
            Err(e) => {
                tracing::warn!(
                    run_id = %self.0.run_id(),
                    effect_id = %req.effect_id,
                    size = req.bytes.len(),
                    error = %e,
                    "a tool result too large for the record could not be stored"
                );
                Err(e.into())
            }
        }
    }
}

/// Fits one tool outcome value (`{kind: "completed", output}` / `{kind: "failed", code,
/// message}`, or any value) for `effect.outcome`; see [`super::shaping`] for what is stored.
pub async fn fit_outcome(
    artifacts: &Artifacts,
    effect_id: &str,
    tool_name: &str,
    value: Value,
) -> Value {
    let ctx = ShapeContext {
        effect_id,
        tool: tool_name,
        config: ShapeConfig::for_record_entry(artifacts.limits().record_entry_bytes),
    };
    shape_outcome(value, &ctx, &ArtifactStore(artifacts)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The turn runs in a `Send` future (`RunHandler`): spilling must be one.
    #[allow(dead_code)]
    fn fit_outcome_is_send(a: &Artifacts) {
        fn send<T: Send>(_: T) {}
        send(fit_outcome(a, "e", "t", Value::Null));
    }
}
