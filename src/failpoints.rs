//! Failpoints: named boundaries where a test makes podhost die (SIGKILL) or an operation fail,
//! to check what survives a crash or a full disk there.
//!
//! Owns: the list of every failpoint ([`POD`], [`SERVE`], [`POD_TOOL_GATE`], [`COMPACTION`],
//! [`STORE`], [`SANDBOX`], [`PROBE`], [`RUN`]), the `PODHOST_FAILPOINTS`
//! configuration, and the [`failpoint!`](crate::failpoint) and
//! [`failpoint_fails!`](crate::failpoint_fails) macros placed at each boundary.
//!
//! Invariants:
//! * Compiled in only with the `failpoints` feature, which only test builds turn on (a
//!   dev-dependency of the package on itself): in a release build both macros expand to
//!   nothing (`false`), and neither the variable nor a failpoint name is in the binary.
//! * Inert unless `PODHOST_FAILPOINTS` names a failpoint: `name=action;name2=action`, read once.
//!   Actions: `kill` (SIGKILL at the first pass: no unwinding, no destructors, no flush — as a
//!   power cut or the OOM killer), `kill(N)` (at the N-th pass), `fail` (every pass fails),
//!   `fail-while(PATH)` (passes fail while PATH exists: a disk that fills and empties), `panic`
//!   (a panic at the first pass, which unwinds as a bug's would).
//! * Every name passed to the macros is in one of the lists, so a suite can enumerate them.
//!
//! Non-goals: faults of peers (the fakes in `tests/support` script those).

/// The pod host's effect boundaries (v5 §4), in the order a turn passes them.
pub const POD: &[&str] = &[
    "pod.before_intent",
    "pod.after_execute",
    "pod.after_tool",
    "pod.after_outcome",
    "pod.mid_upload",
    "pod.mid_export",
    "pod.after_output_sent",
];

/// `podhost serve`'s step boundaries, in the order a turn passes them.
pub const SERVE: &[&str] = &[
    "serve.after_accept",
    "serve.after_model",
    "serve.after_assistant_stored",
    "serve.after_tool",
    "serve.after_tool_stored",
    "serve.before_end",
];

/// The two points of an MCP or HTTP call through the Tool Gate that the journal alone cannot
/// tell apart (v5 §4): after core answered the intent `execute`, before the call is sent; and
/// after the gate answered, before the outcome is recorded.
pub const POD_TOOL_GATE: &[&str] = &["pod.toolgate_after_intent", "pod.toolgate_after_answer"];

/// The boundaries of a compaction (v5 §6): after a summary call's answer is recorded, before
/// the history is replaced; and after it is replaced in memory, before it is reported (a pod's
/// transcript edit) or stored (`serve`'s compacted view).
pub const COMPACTION: &[&str] = &[
    "pod.compaction_after_summary",
    "pod.compaction_before_report",
    "serve.compaction_after_summary",
    "serve.compaction_before_report",
];

/// Faults of the BYOH store (operations fail, the process goes on): its disk is full; a
/// replica's renewals do not reach it (as when the replica is cut off from the database).
pub const STORE: &[&str] = &["serve.store_full", "serve.renew_fails"];

/// Faults of the host's sandboxes (the process goes on): a workspace's sandbox cannot be made
/// (as when the host refuses a cgroup), a session holder cannot make its namespaces, and a
/// one-shot `podhost tool` cannot make its command's (refused at once, or a step of the view
/// refused once they were made; its PID namespace refused, or that namespace's `/proc`).
pub const SANDBOX: &[&str] = &[
    "sandbox.refused",
    "sandbox.session_refused",
    "oneshot.view_refused",
    "oneshot.view_fails",
    "oneshot.pid_namespace_refused",
    "oneshot.proc_refused",
    "oneshot.ahead_refused",
    "oneshot.ahead_cwd_refused",
    "oneshot.join_fails",
];

/// The probe of the namespaces commands may get (`kill` there shows which calls probe): a
/// `podhost tool` call that runs no command must not.
pub const PROBE: &[&str] = &["probe.namespaces"];

/// Faults of `podhost run`'s own tasks: its progress task is scheduled late (it waits a moment
/// between reading a model call's byte count and reporting it), as a loaded machine may.
pub const RUN: &[&str] = &["run.progress_late"];

/// Marks a boundary where a test may kill the process. Expands to nothing without the
/// `failpoints` feature.
#[macro_export]
macro_rules! failpoint {
    ($name:literal) => {{
        #[cfg(feature = "failpoints")]
        $crate::failpoints::pass($name);
    }};
}

/// True when the failpoint says this operation fails now. Always `false` without the
/// `failpoints` feature.
#[macro_export]
macro_rules! failpoint_fails {
    ($name:literal) => {{
        #[cfg(feature = "failpoints")]
        let fails = $crate::failpoints::fails($name);
        #[cfg(not(feature = "failpoints"))]
        let fails = false;
        fails
    }};
}

#[cfg(feature = "failpoints")]
pub use armed::{fails, pass};

#[cfg(feature = "failpoints")]
mod armed {
    use std::collections::HashMap;
    use std::path::PathBuf;
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// What a configured failpoint does.
    #[derive(Debug)]
    enum Action {
        /// SIGKILL at this pass (1-based).
        Kill(u64),
        Fail,
        FailWhile(PathBuf),
        /// A panic at the first pass.
        Panic,
    }

    struct Point {
        action: Action,
        passes: AtomicU64,
    }

    fn config() -> &'static HashMap<String, Point> {
        static CONFIG: OnceLock<HashMap<String, Point>> = OnceLock::new();
        CONFIG.get_or_init(|| {
            let Ok(spec) = std::env::var("PODHOST_FAILPOINTS") else {
                return HashMap::new();
            };
            let mut out = HashMap::new();
            for entry in spec.split(';').map(str::trim).filter(|e| !e.is_empty()) {
                match parse(entry) {
                    Ok((name, action)) => {
                        tracing::warn!(failpoint = %name, ?action, "failpoint armed");
                        out.insert(
                            name,
                            Point {
                                action,
                                passes: AtomicU64::new(0),
                            },
                        );
                    }
                    Err(e) => tracing::error!(entry, error = %e, "PODHOST_FAILPOINTS: ignored"),
                }
            }
            out
        })
    }

    fn parse(entry: &str) -> Result<(String, Action), String> {
        let (name, action) = entry
            .split_once('=')
            .ok_or_else(|| "not NAME=ACTION".to_owned())?;
        let name = name.trim();
        let known = super::POD
            .iter()
            .chain(super::SERVE)
            .chain(super::POD_TOOL_GATE)
            .chain(super::COMPACTION)
            .chain(super::STORE)
            .chain(super::SANDBOX)
            .chain(super::PROBE)
            .chain(super::RUN)
            .any(|n| *n == name);
        if !known {
            return Err(format!("no failpoint is named {name:?}"));
        }
        let arg = |word: &str| {
            action
                .trim()
                .strip_prefix(word)?
                .strip_prefix('(')?
                .strip_suffix(')')
        };
        let action = match action.trim() {
            "kill" => Action::Kill(1),
            "fail" => Action::Fail,
            "panic" => Action::Panic,
            _ => {
                if let Some(n) = arg("kill") {
                    Action::Kill(n.parse().map_err(|_| format!("bad count {n:?}"))?)
                } else if let Some(path) = arg("fail-while") {
                    Action::FailWhile(PathBuf::from(path))
                } else {
                    return Err(format!("unknown action {action:?}"));
                }
            }
        };
        Ok((name.to_owned(), action))
    }

    /// A pass of failpoint `name`: dies here when it is armed to.
    pub fn pass(name: &str) {
        let Some(point) = config().get(name) else {
            return;
        };
        let n = point.passes.fetch_add(1, Ordering::SeqCst) + 1;
        if let Action::Panic = point.action {
            panic!("failpoint {name}: panic");
        }
        if let Action::Kill(at) = point.action
            && n >= at
        {
            tracing::warn!(failpoint = name, pass = n, "failpoint: SIGKILL");
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGKILL);
            // SIGKILL cannot be caught; if kill(2) itself failed, never go on.
            std::process::abort();
        }
    }

    /// Whether an operation at failpoint `name` fails now.
    pub fn fails(name: &str) -> bool {
        let Some(point) = config().get(name) else {
            return false;
        };
        point.passes.fetch_add(1, Ordering::SeqCst);
        match &point.action {
            Action::Fail => true,
            Action::FailWhile(path) => path.exists(),
            Action::Panic => panic!("failpoint {name}: panic"),
            Action::Kill(_) => false,
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn entries_parse_and_unknown_names_are_refused() {
            assert!(matches!(
                parse("pod.after_tool=kill"),
                Ok((n, Action::Kill(1))) if n == "pod.after_tool"
            ));
            assert!(matches!(
                parse("serve.after_model=kill(3)"),
                Ok((_, Action::Kill(3)))
            ));
            assert!(matches!(
                parse("serve.store_full=fail-while(/tmp/x)"),
                Ok((_, Action::FailWhile(p))) if p == std::path::Path::new("/tmp/x")
            ));
            assert_eq!(
                parse("pod.nope=kill").err(),
                Some("no failpoint is named \"pod.nope\"".to_owned())
            );
            assert_eq!(
                parse("pod.after_tool=explode").err(),
                Some("unknown action \"explode\"".to_owned())
            );
        }
    }
}
