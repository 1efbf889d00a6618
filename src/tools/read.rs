//! `read`: (being built).

use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::{ToolOutcome, Toolbox, codes};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadInput {
    pub path: String,
    pub offset: Option<u64>,
    pub limit: Option<u64>,
}

pub fn run(_tb: &Toolbox, _input: ReadInput, _cancel: &CancellationToken) -> ToolOutcome {
    ToolOutcome::failed(codes::ERROR, "read is not built yet")
}
