//! `edit`: (being built).

use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::{ToolOutcome, Toolbox, codes};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EditInput {
    pub path: String,
    pub old_string: String,
    pub new_string: String,
    #[serde(default)]
    pub replace_all: bool,
}

pub fn run(_tb: &Toolbox, _input: EditInput, _cancel: &CancellationToken) -> ToolOutcome {
    ToolOutcome::failed(codes::ERROR, "edit is not built yet")
}
