//! `write`: (being built).

use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::{ToolOutcome, Toolbox, codes};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriteInput {
    pub path: String,
    pub content: String,
}

pub fn run(_tb: &Toolbox, _input: WriteInput, _cancel: &CancellationToken) -> ToolOutcome {
    ToolOutcome::failed(codes::ERROR, "write is not built yet")
}
