//! `glob`: (being built).

use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::{ToolOutcome, Toolbox, codes};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GlobInput {
    pub pattern: String,
    pub path: Option<String>,
    #[serde(default)]
    pub include_ignored: bool,
}

pub fn run(_tb: &Toolbox, _input: GlobInput, _cancel: &CancellationToken) -> ToolOutcome {
    ToolOutcome::failed(codes::ERROR, "glob is not built yet")
}
