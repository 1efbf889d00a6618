//! `bash {command, timeout?}`: runs a command line in the workspace through `exec`.

use serde::Deserialize;

use super::{CallContext, ToolError, ToolOutcome, Toolbox, codes};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BashInput {
    pub command: String,
    pub timeout: Option<u64>,
}

pub async fn run(
    _tb: &Toolbox,
    _input: BashInput,
    _ctx: &CallContext,
) -> Result<ToolOutcome, ToolError> {
    Ok(ToolOutcome::failed(codes::ERROR, "bash is not built yet"))
}
