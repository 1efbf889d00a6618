//! Errors that cross module boundaries, and their one mapping to exit codes.
//!
//! Each domain keeps its own `thiserror` enum next to its code (`tools::ToolError`,
//! `exec::ExecError`, …); this module holds what the binary reports.

/// Process exit codes of the `podhost` binary.
pub mod exit {
    /// The job ran (a tool that ran and failed is still a run).
    pub const OK: i32 = 0;
    /// A fault of podhost itself.
    pub const FAILURE: i32 = 1;
    /// Bad input or configuration: nothing ran.
    pub const USAGE: i32 = 2;
}
