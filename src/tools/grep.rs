//! `grep`: (being built).

use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::{ToolOutcome, Toolbox, codes};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrepInput {
    pub pattern: String,
    pub path: Option<String>,
    pub glob: Option<String>,
    #[serde(default)]
    pub ignore_case: bool,
    pub max_results: Option<u64>,
    pub output_mode: Option<String>,
    pub context: Option<u64>,
    #[serde(default)]
    pub multiline: bool,
    #[serde(default)]
    pub include_ignored: bool,
}

pub fn run(_tb: &Toolbox, _input: GrepInput, _cancel: &CancellationToken) -> ToolOutcome {
    ToolOutcome::failed(codes::ERROR, "grep is not built yet")
}
