//! Shared test helpers: workspaces, toolboxes on the real podhost binary, fakes of the peers.
#![allow(dead_code)]

use std::path::Path;

use podhost::exec::{BaseEnv, CommandEnv, ExecConfig, Executor, ResourceLimits};
use podhost::floor::workspace::Workspace;
use podhost::tools::{CallContext, ToolName, ToolOutcome, Toolbox};
use tokio_util::sync::CancellationToken;

/// The podhost binary built for these tests: it runs `podhost tool` and hands every other
/// command to [`full_bin`] beside it.
pub fn podhost_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_podhost"))
}

/// The whole program built for these tests (`podhost-full`), beside [`podhost_bin`].
pub fn full_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_podhost-full"))
}

/// The binaries an installation has side by side, each under its installed name: `podhost`,
/// `podhost-full` and `podhost-exec`.
pub fn installed_bins() -> [(&'static Path, &'static str); 3] {
    [
        (podhost_bin(), "podhost"),
        (full_bin(), "podhost-full"),
        (supervisor_bin(), "podhost-exec"),
    ]
}

/// The dedicated supervisor built for these tests (`podhost-exec`), which podhost finds beside
/// itself.
pub fn supervisor_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_podhost-exec"))
}

/// An executor like the binary's, with the test build of `podhost-exec` as the supervisor.
pub fn executor(home: &Path) -> Executor {
    Executor::new(ExecConfig {
        supervisor: supervisor_bin().to_path_buf(),
        shell: podhost::exec::find_shell(None),
        env: CommandEnv::new(
            BaseEnv {
                home: home.to_path_buf(),
                ..BaseEnv::default()
            },
            None,
        ),
        limits: ResourceLimits::default(),
    })
}

/// A fresh workspace directory, known to the model as `/workspace`, and its toolbox.
pub struct TestWorkspace {
    pub dir: tempfile::TempDir,
    pub toolbox: Toolbox,
}

impl TestWorkspace {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("workspace");
        std::fs::create_dir(&root).expect("mkdir workspace");
        let ws = Workspace::new(&root, Some(Path::new("/workspace"))).expect("workspace");
        let toolbox = Toolbox::new(ws, executor(&root));
        TestWorkspace { dir, toolbox }
    }

    /// The workspace's host directory.
    pub fn root(&self) -> &Path {
        self.toolbox.workspace().root()
    }

    /// Runs a tool with a fresh cancellation token, failing the test after 30 s.
    pub async fn run(&self, tool: ToolName, input: serde_json::Value) -> ToolOutcome {
        self.run_with(tool, input, CallContext::new(CancellationToken::new()))
            .await
    }

    pub async fn run_with(
        &self,
        tool: ToolName,
        input: serde_json::Value,
        ctx: CallContext,
    ) -> ToolOutcome {
        tokio::time::timeout(
            std::time::Duration::from_secs(30),
            self.toolbox.call(tool, &input, &ctx),
        )
        .await
        .expect("tool call timed out")
        .expect("harness fault")
    }
}
