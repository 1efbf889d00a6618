//! What an OpenAI-compatible server's model listing says of a model: its context window and the
//! inputs it reads, where the server reports them (`GET {base_url}/models`).
//!
//! Owns: one bounded request and the lenient reading of the fields servers use (vLLM's
//! `max_model_len`, OpenRouter's `context_length` and `architecture.input_modalities`, others'
//! `context_window`, `max_context_length`, `input_modalities`).
//!
//! Invariants: the listing is a hint, never a requirement. A key that authorizes only chat
//! completions gets a `4xx`; that, a `5xx`, a timeout, a body that is not a listing or a model
//! it does not name all mean "unknown", never an error. The key goes only into the
//! `Authorization` header and nothing of the answer is logged with it.
//!
//! Non-goals: choosing a model, caching across sessions, `podhost serve` (an evaluator's key
//! authorizes only its chat completions, so serve never asks).

use std::time::Duration;

use serde_json::Value;

use super::client::ModelClient;
use super::message::{ApiKey, ModelEndpoint};

/// One try, this long at most.
const LISTING_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest listing read.
const LISTING_BYTES: usize = 8 << 20;

/// What the listing says of the model; each field `None` when it says nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelFacts {
    pub context_window: Option<u64>,
    pub inputs: Option<Vec<String>>,
}

impl ModelClient {
    /// Asks the server's model listing about `conn.model`.
    pub async fn model_facts(&self, conn: &ModelEndpoint, key: Option<&ApiKey>) -> ModelFacts {
        let mut req = self
            .http
            .get(conn.url("models"))
            .timeout(LISTING_TIMEOUT)
            .header(reqwest::header::ACCEPT_ENCODING, "identity");
        if let Some(k) = key {
            req = req.bearer_auth(k.expose());
        }
        let body = match req.send().await {
            Ok(r) if r.status().is_success() => r.bytes().await.ok(),
            Ok(r) => {
                tracing::debug!(
                    status = r.status().as_u16(),
                    "the model listing is not available"
                );
                None
            }
            Err(e) => {
                tracing::debug!(error = %e.without_url(), "the model listing could not be reached");
                None
            }
        };
        body.filter(|b| b.len() <= LISTING_BYTES)
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .map(|v| facts_of(&v, &conn.model))
            .unwrap_or_default()
    }
}

/// The facts of `model` in a listing (`{data: [...]}` or a bare list).
pub fn facts_of(listing: &Value, model: &str) -> ModelFacts {
    let entries = listing
        .get("data")
        .or_else(|| listing.get("models"))
        .unwrap_or(listing)
        .as_array();
    let Some(entry) = entries
        .into_iter()
        .flatten()
        .find(|e| e.get("id").and_then(Value::as_str) == Some(model))
    else {
        return ModelFacts::default();
    };
    let number = |v: Option<&Value>| v.and_then(Value::as_u64).filter(|n| *n > 0);
    let context_window = [
        "max_model_len",
        "context_length",
        "context_window",
        "max_context_length",
    ]
    .iter()
    .find_map(|k| number(entry.get(k)))
    .or_else(|| {
        number(
            entry
                .get("top_provider")
                .and_then(|t| t.get("context_length")),
        )
    });
    let inputs = entry
        .get("architecture")
        .and_then(|a| a.get("input_modalities"))
        .or_else(|| entry.get("input_modalities"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(|k| if k == "file" { "pdf" } else { k })
                .map(str::to_owned)
                .collect()
        });
    ModelFacts {
        context_window,
        inputs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    #[test]
    fn listings_of_several_servers_read() {
        let vllm = json!({"object": "list", "data": [{"id": "m", "max_model_len": 4096}]});
        assert_eq!(
            facts_of(&vllm, "m"),
            ModelFacts {
                context_window: Some(4096),
                inputs: None
            }
        );
        let openrouter = json!({"data": [{"id": "x/y", "context_length": 200000,
            "architecture": {"input_modalities": ["text", "image", "file"]}}]});
        assert_eq!(
            facts_of(&openrouter, "x/y"),
            ModelFacts {
                context_window: Some(200000),
                inputs: Some(vec!["text".into(), "image".into(), "pdf".into()])
            }
        );
        assert_eq!(facts_of(&vllm, "other"), ModelFacts::default());
        assert_eq!(facts_of(&json!("nope"), "m"), ModelFacts::default());
    }
}
