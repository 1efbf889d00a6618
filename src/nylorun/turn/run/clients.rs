//! The gates' clients a pod's segments share: the sandbox's toolbox, the Model Gate and the
//! Tool Gate, built once for the runner.
//!
//! Invariant: one of each per pod; a segment holds them behind an `Arc` and never rebuilds them.

use std::path::PathBuf;
use std::sync::Arc;

use reqwest::Url;

use crate::floor::backoff::Backoff;
use crate::nylorun::turn::gates::{Gates, GatesError};
use crate::nylorun::turn::toolgate::client::{ToolGate, ToolGateError};
use crate::tools::Toolbox;

/// What every segment of the pod calls out through.
pub(super) struct Clients {
    /// The pod's toolbox: its commands run one at a time, with `workspace.exec`'s.
    pub(super) toolbox: Toolbox,
    pub(super) gates: Gates,
    /// The Tool Gate, at the same URL: MCP and HTTP tools.
    pub(super) toolgate: ToolGate,
    /// The host directory the sandbox path `/skills` maps onto.
    pub(super) skills_root: PathBuf,
}

/// Why the runner could not be built.
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error(transparent)]
    Gates(#[from] GatesError),
    #[error(transparent)]
    ToolGate(#[from] ToolGateError),
}

impl Clients {
    /// The clients of the gates at `gates_url` (see [`super::TurnRunner::new`]).
    pub(super) fn new(
        toolbox: Toolbox,
        gates_url: Url,
        skills_root: PathBuf,
        tls: &Arc<rustls::ClientConfig>,
        gate_pacing: Backoff,
    ) -> Result<Self, RunnerError> {
        Ok(Clients {
            toolbox,
            gates: Gates::new(gates_url.clone(), tls, gate_pacing)?,
            toolgate: ToolGate::new(gates_url, tls)?,
            skills_root,
        })
    }
}
