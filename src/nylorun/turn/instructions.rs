//! What the model reads and which tools it is offered (v5 §3: "what the model reads and which
//! tools it is offered are yours to write").
//!
//! Owns: the instructions text (the manifest's own, then podhost's sandbox note, skills, the MCP
//! servers' own instructions, the deferred tools and the memory block — how the memory works,
//! never the index, which is pinned at the head of the session), the tool list of each model
//! call, the route from a tool name the model calls back to what runs it (its target), and the
//! check of a memory call's parameters before it is sent.
//!
//! Invariants:
//! * Everything here is a pure function of the TurnStart (and the mounted skills, themselves a
//!   function of the manifest), the MCP facts the turn runs with, and the transcript (which
//!   deferred tools a `tool_search` loaded): a replayed segment offers the same prompt, so its
//!   model calls hash the same.
//! * Sandbox tools, and the note on the sandbox, only when `agent.sandbox` is present; `memory`
//!   only with `memory` (only `view` when read-only); `schedule_wake` only with `agent.selfWake`.
//! * No two tools share a name: MCP and HTTP tools are named around podhost's own
//!   ([`crate::nylorun::turn::naming`]).
//! * `tool_search` only when some tool is deferred; a deferred tool is offered from the step
//!   after a search loaded it, and routed whenever it is called.
//!
//! Non-goals: naming and deferring MCP and HTTP tools (the catalog), running them.

use serde_json::{Value, json};

use crate::nylorun::artifacts::read_artifact_definition;
use crate::nylorun::artifacts::skills::MountedSkill;
use crate::nylorun::turn::tool_search::{self, TOOL_SEARCH};
use crate::nylorun::turn::toolgate::catalog::Catalog;
use crate::nylorun::turn::turn_start::{MemoryAccess, TurnMemory, TurnStart};
use crate::tools::{ToolDefinition, ToolName};

/// The name the model calls the memory tool by.
pub const MEMORY_TOOL: &str = "memory";
/// The name of the wake-up tool.
pub const SCHEDULE_WAKE_TOOL: &str = "schedule_wake";
/// Where the workspace is, as the model and core know it.
pub const WORKSPACE: &str = "/workspace";

/// What runs a tool call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// One of the six workspace tools, in the session's sandbox (`{kind: "sandbox"}`).
    Sandbox(ToolName),
    /// `read_artifact`, run by podhost itself (`{kind: "harness"}`).
    ReadArtifact,
    /// `memory`, run by core (`{kind: "runtime", operation: "memory"}`).
    Memory,
    /// `schedule_wake`, run by core (`{kind: "runtime", operation: "schedule_wake"}`).
    ScheduleWake,
    /// The catalog's tool at this index: an MCP or HTTP tool, through the Tool Gate.
    Remote(usize),
    /// `tool_search`, run by podhost (`{kind: "harness"}`).
    ToolSearch,
}

/// Deferred tools the instructions name, at most.
const DEFERRED_NAMES_SHOWN: usize = 100;

/// The model-facing side of a turn.
#[derive(Clone, Debug)]
pub struct Offer {
    pub instructions: String,
    /// `[{name, description, inputSchema}]`, as a `ModelCall` carries them: every tool but the
    /// deferred ones ([`Offer::tools_for`] adds those a search loaded).
    pub tools: Vec<Value>,
    /// The turn's MCP and HTTP tools.
    pub catalog: Catalog,
    sandbox: bool,
    memory: Option<MemoryAccess>,
    self_wake: bool,
}

impl Offer {
    pub fn new(ts: &TurnStart, skills: &[MountedSkill], catalog: Catalog) -> Offer {
        let sandbox = ts.has_sandbox();
        let self_wake = ts.agent.as_ref().and_then(|a| a.self_wake).unwrap_or(false);
        let memory = ts.memory.as_ref().map(|m| m.access);

        let mut tools = Vec::new();
        if sandbox {
            for t in ToolName::ALL {
                tools.push(model_tool(t.definition_without_background()));
            }
        }
        tools.push(model_tool(read_artifact_definition()));
        if let Some(access) = memory {
            tools.push(memory_tool(access));
        }
        if self_wake {
            tools.push(schedule_wake_tool());
        }
        tools.extend(
            catalog
                .tools
                .iter()
                .filter(|t| !t.deferred)
                .map(|t| t.model_tool()),
        );
        if catalog.has_deferred() {
            tools.push(tool_search::definition());
        }
        Offer {
            instructions: instructions(ts, skills, &catalog),
            tools,
            catalog,
            sandbox,
            memory,
            self_wake,
        }
    }

    /// The tools of a model call over `entries`: every loaded tool, then the deferred tools a
    /// `tool_search` in the transcript loaded, in the catalog's order.
    pub fn tools_for(&self, entries: &[Value]) -> Vec<Value> {
        let mut tools = self.tools.clone();
        if self.catalog.has_deferred() {
            let loaded = tool_search::loaded(entries);
            tools.extend(
                self.catalog
                    .tools
                    .iter()
                    .filter(|t| t.deferred && loaded.contains(&t.name))
                    .map(|t| t.model_tool()),
            );
        }
        tools
    }

    /// The intent's `target` for a call routed to `route`.
    pub fn target(&self, route: Route) -> Value {
        match route {
            Route::Sandbox(_) => json!({"kind": "sandbox"}),
            Route::ReadArtifact | Route::ToolSearch => json!({"kind": "harness"}),
            Route::Memory => json!({"kind": "runtime", "operation": "memory"}),
            Route::ScheduleWake => json!({"kind": "runtime", "operation": "schedule_wake"}),
            Route::Remote(i) => self
                .catalog
                .tools
                .get(i)
                .map_or(Value::Null, |t| t.target()),
        }
    }

    /// What runs a call named `name`, and the memory command a `memory.<command>` or
    /// `memory/<command>` name carries. `None`: no such tool was offered.
    pub fn route(&self, name: &str) -> Option<(Route, Option<String>)> {
        if self.sandbox
            && let Ok(t) = name.parse::<ToolName>()
        {
            return Some((Route::Sandbox(t), None));
        }
        if name == read_artifact_definition().name {
            return Some((Route::ReadArtifact, None));
        }
        if self.memory.is_some() {
            if name == MEMORY_TOOL {
                return Some((Route::Memory, None));
            }
            if let Some(cmd) = name
                .strip_prefix("memory.")
                .or_else(|| name.strip_prefix("memory/"))
            {
                return Some((Route::Memory, Some(cmd.to_owned())));
            }
        }
        if self.self_wake && name == SCHEDULE_WAKE_TOOL {
            return Some((Route::ScheduleWake, None));
        }
        if name == TOOL_SEARCH && self.catalog.has_deferred() {
            return Some((Route::ToolSearch, None));
        }
        self.catalog.find(name).map(|i| (Route::Remote(i), None))
    }

    /// The names offered, for a message to a model that called another.
    pub fn names(&self) -> Vec<&str> {
        self.tools
            .iter()
            .filter_map(|t| t.get("name").and_then(Value::as_str))
            .collect()
    }

    /// Checks a memory call before it is sent (core checks again): a known command, allowed
    /// for the access; every parameter the command needs, of its type, and none it does not
    /// take; paths under `/memories` without `.` or `..`; texts within `max_text_bytes`. The
    /// error is for the model.
    pub fn check_memory(&self, args: &Value, max_text_bytes: u64) -> Result<(), String> {
        let command = args.get("command").and_then(Value::as_str).unwrap_or("");
        let allowed: &[&str] = match self.memory {
            Some(MemoryAccess::ReadWrite) => &MEMORY_COMMANDS,
            _ => &["view"],
        };
        if !allowed.contains(&command) {
            return Err(format!(
                "memory has no command {command:?} here; the commands are: {}.",
                allowed.join(", ")
            ));
        }
        check_memory_params(command, args, max_text_bytes)
    }
}

/// The parameters of each memory command: `(name, kind, required)`.
fn memory_params(command: &str) -> &'static [(&'static str, Param, bool)] {
    use Param::*;
    match command {
        "view" => &[("path", Path, true), ("view_range", Range, false)],
        "create" => &[("path", FilePath, true), ("file_text", Text, true)],
        "str_replace" => &[
            ("path", FilePath, true),
            ("old_str", Text, true),
            ("new_str", Text, false),
        ],
        "insert" => &[
            ("path", FilePath, true),
            ("insert_line", Line, true),
            ("insert_text", Text, true),
        ],
        "delete" => &[("path", FilePath, true)],
        "rename" => &[("old_path", FilePath, true), ("new_path", FilePath, true)],
        _ => &[],
    }
}

/// What a memory parameter holds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Param {
    /// A path under `/memories` (the root itself allowed).
    Path,
    /// A path of a file under `/memories` (not the root).
    FilePath,
    Text,
    /// A line number, 0 or more.
    Line,
    /// `[first, last]`, 1-based, `last` -1 for the end.
    Range,
}

/// The longest memory path podhost sends.
const MEMORY_PATH_BYTES: usize = 1024;

fn check_memory_params(command: &str, args: &Value, max_text_bytes: u64) -> Result<(), String> {
    let params = memory_params(command);
    let Some(obj) = args.as_object() else {
        return Err(format!(
            "memory {command} needs its parameters as a JSON object."
        ));
    };
    if let Some(extra) = obj
        .keys()
        .find(|k| *k != "command" && !params.iter().any(|(name, _, _)| name == k))
    {
        let takes: Vec<&str> = params.iter().map(|(n, _, _)| *n).collect();
        return Err(format!(
            "memory {command} does not take {extra}; it takes: {}.",
            takes.join(", ")
        ));
    }
    for &(name, kind, required) in params {
        let Some(v) = obj.get(name) else {
            if required {
                return Err(format!("memory {command} needs {name}."));
            }
            continue;
        };
        match kind {
            Param::Path | Param::FilePath => {
                let Some(path) = v.as_str() else {
                    return Err(format!("memory {command}: {name} must be a string."));
                };
                check_memory_path(command, name, path, kind == Param::FilePath)?;
            }
            Param::Text => {
                let Some(text) = v.as_str() else {
                    return Err(format!("memory {command}: {name} must be a string."));
                };
                if text.len() as u64 > max_text_bytes {
                    return Err(format!(
                        "memory {command}: {name} is {} bytes, past the {max_text_bytes} bytes a \
                         memory call may carry; keep memories small, or split this one.",
                        text.len()
                    ));
                }
                if name == "old_str" && text.is_empty() {
                    return Err(format!("memory {command}: old_str must not be empty."));
                }
            }
            Param::Line => {
                if v.as_u64().is_none() {
                    return Err(format!(
                        "memory {command}: {name} must be a whole number, 0 or more."
                    ));
                }
            }
            Param::Range => {
                let ok = v.as_array().is_some_and(|r| {
                    r.len() == 2
                        && r[0].as_i64().is_some_and(|a| a >= 1)
                        && r[1]
                            .as_i64()
                            .is_some_and(|b| b == -1 || r[0].as_i64().is_some_and(|a| b >= a))
                });
                if !ok {
                    return Err(format!(
                        "memory {command}: {name} must be [first, last] with 1 <= first <= last \
                         (last -1 for the end)."
                    ));
                }
            }
        }
    }
    Ok(())
}

/// A memory path: `/memories` or below it, without `.`, `..` or empty segments.
fn check_memory_path(command: &str, name: &str, path: &str, file: bool) -> Result<(), String> {
    let bad = |why: &str| Err(format!("memory {command}: {name} {path:?} {why}."));
    if path.len() > MEMORY_PATH_BYTES {
        return Err(format!(
            "memory {command}: {name} is {} bytes, past the {MEMORY_PATH_BYTES} a memory path may \
             have.",
            path.len()
        ));
    }
    if path.contains('\0') || path.contains('\\') {
        return bad("holds a character a memory path cannot");
    }
    let Some(rest) = path.strip_prefix(MEMORY_ROOT) else {
        return bad("is not under /memories");
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() {
        return if file {
            bad("is the memory directory itself; name a file under it")
        } else {
            Ok(())
        };
    }
    let Some(rest) = rest.strip_prefix('/') else {
        return bad("is not under /memories");
    };
    if rest
        .split('/')
        .any(|seg| seg.is_empty() || seg == "." || seg == "..")
    {
        return bad("has an empty, . or .. segment");
    }
    Ok(())
}

/// Where memories live, as the model and core name them.
const MEMORY_ROOT: &str = "/memories";

const MEMORY_COMMANDS: [&str; 6] = [
    "view",
    "create",
    "str_replace",
    "insert",
    "delete",
    "rename",
];

fn model_tool(def: &ToolDefinition) -> Value {
    json!({"name": def.name, "description": def.description, "inputSchema": def.input_schema})
}

/// The instructions: the manifest's own, then podhost's notes.
fn instructions(ts: &TurnStart, skills: &[MountedSkill], catalog: &Catalog) -> String {
    let mut parts: Vec<String> = Vec::new();
    if let Some(own) = ts.manifest.instructions.as_deref().map(str::trim)
        && !own.is_empty()
    {
        parts.push(own.to_owned());
    }
    if ts.has_sandbox() {
        let workspace = ts
            .agent
            .as_ref()
            .and_then(|a| a.sandbox.as_ref())
            .and_then(|s| s.workspace.as_deref())
            .unwrap_or(WORKSPACE);
        parts.push(format!(
            "You have an isolated Linux sandbox with a persistent working directory at \
             {workspace}. Use bash to run commands, read, write and edit to work with files, and \
             grep and glob to search. Network egress is limited by policy; a failed download \
             usually means the host is not allowed.\n\
             Files you write under {WORKSPACE}/outputs reach the user too: when your turn ends, \
             they become the session's outputs folder."
        ));
        if !skills.is_empty() {
            let mut text = String::from(
                "Skills are mounted read-only in the sandbox. Each folder holds a skill's files; \
                 read its SKILL.md before you use it:",
            );
            for s in skills {
                text.push_str(&format!("\n- {} ({}): {}", s.name, s.folder, s.description));
            }
            parts.push(text);
        }
    }
    for (server, text) in &catalog.server_instructions {
        parts.push(format!(
            "Instructions from the MCP server {server}, whose tools you may call:\n{text}"
        ));
    }
    let deferred: Vec<&str> = catalog
        .tools
        .iter()
        .filter(|t| t.deferred)
        .map(|t| t.name.as_str())
        .collect();
    if !deferred.is_empty() {
        let mut names = deferred[..deferred.len().min(DEFERRED_NAMES_SHOWN)].join(", ");
        if deferred.len() > DEFERRED_NAMES_SHOWN {
            names.push_str(&format!(
                " and {} more",
                deferred.len() - DEFERRED_NAMES_SHOWN
            ));
        }
        parts.push(format!(
            "More tools are available but not loaded: {names}. Call {TOOL_SEARCH} to load the \
             ones you need; you can call them from your next step."
        ));
    }
    parts.push(
        "Tool results too large to show are stored as artifacts: the result then says \
         `truncated` and names its artifactId; read the rest with read_artifact."
            .to_owned(),
    );
    if let Some(memory) = &ts.memory {
        parts.push(memory_block(memory));
    }
    parts.join("\n\n")
}

/// The memory block: how the tool works, then the agent's own memory instructions. The index
/// is not here: it is pinned at the head of the session (`turn::context::MemoryPin`), so that a
/// memory written during a turn changes no instructions.
fn memory_block(m: &TurnMemory) -> String {
    let mut text = match m.access {
        MemoryAccess::ReadWrite => String::from(
            "You have a memory that lasts across sessions, as files under /memories. Use the \
             memory tool to view, create, edit, rename and delete them. Keep each memory a small \
             file whose first lines say what it holds. The list of your memories is given at the \
             start of the conversation.",
        ),
        MemoryAccess::ReadOnly => String::from(
            "You have a read-only memory, as files under /memories. Use the memory tool's view \
             command to read them. The list of your memories is given at the start of the \
             conversation.",
        ),
    };
    if let Some(own) = m.instructions.as_deref().map(str::trim)
        && !own.is_empty()
    {
        text.push_str("\n\n");
        text.push_str(own);
    }
    text
}

/// The memory tool (Anthropic's memory tool's commands); only `view` when read-only.
fn memory_tool(access: MemoryAccess) -> Value {
    let read_only = access == MemoryAccess::ReadOnly;
    let commands: Vec<&str> = if read_only {
        vec!["view"]
    } else {
        MEMORY_COMMANDS.to_vec()
    };
    let mut properties = json!({
        "command": {"type": "string", "enum": commands, "description": "What to do."},
        "path": {"type": "string", "description": "A file or directory under /memories."},
        "view_range": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2,
                       "description": "view: first and last line to show (1-based; -1 for the end)."},
    });
    if !read_only {
        let more = json!({
            "file_text": {"type": "string", "description": "create: the file's content."},
            "old_str": {"type": "string", "description": "str_replace: the exact text to replace (unique in the file)."},
            "new_str": {"type": "string", "description": "str_replace: the text to put in its place."},
            "insert_line": {"type": "integer", "minimum": 0, "description": "insert: the line after which to insert (0 for the top)."},
            "insert_text": {"type": "string", "description": "insert: the text to insert."},
            "old_path": {"type": "string", "description": "rename: the current path."},
            "new_path": {"type": "string", "description": "rename: the new path."},
        });
        if let (Some(p), Some(m)) = (properties.as_object_mut(), more.as_object()) {
            p.extend(m.clone());
        }
    }
    let description = if read_only {
        "Read your memory: view a directory listing or a file under /memories."
    } else {
        "Read and write your memory, files under /memories that last across sessions: view, \
         create, str_replace, insert, delete, rename."
    };
    json!({
        "name": MEMORY_TOOL,
        "description": description,
        "inputSchema": {
            "type": "object",
            "properties": properties,
            "required": ["command"],
            "additionalProperties": false,
        },
    })
}

/// `schedule_wake`: `{in | at, note}` or `{cancel: true}` (v5 §4).
fn schedule_wake_tool() -> Value {
    json!({
        "name": SCHEDULE_WAKE_TOOL,
        "description": "Schedule this agent to wake up later with a note to itself: give `in` \
                        (a delay such as \"30m\", \"2h\" or \"1d\") or `at` (an ISO 8601 time), \
                        and `note`. `{\"cancel\": true}` cancels the wake-up scheduled before.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "in": {"type": "string", "description": "How long from now."},
                "at": {"type": "string", "description": "When, as an ISO 8601 time."},
                "note": {"type": "string", "description": "What to do on waking."},
                "cancel": {"type": "boolean", "description": "Cancel the scheduled wake-up."},
            },
            "additionalProperties": false,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn ts(extra: Value) -> TurnStart {
        let mut v = json!({
            "type": "turn.start", "engine": "agent",
            "manifest": {"instructions": "Be brief."},
            "checkpoint": {"sessionId": "s", "turnId": "t", "segment": 0, "input": "hi"},
        });
        if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        TurnStart::parse(&v).unwrap()
    }

    #[test]
    fn sandbox_tools_only_with_a_sandbox() {
        let bare = Offer::new(
            &ts(json!({"agent": {"id": "a", "kind": "virtual"}})),
            &[],
            Catalog::default(),
        );
        assert_eq!(bare.names(), ["read_artifact"]);
        assert_eq!(bare.route("bash"), None);
        assert!(!bare.instructions.contains("sandbox"));

        let sandboxed = Offer::new(
            &ts(
                json!({"agent": {"id": "a", "kind": "pod", "sandbox": {"workspace": "/workspace"},
                                 "selfWake": true},
                       "memory": {"access": "read_only", "index": "- /memories/a.md — a"}}),
            ),
            &[MountedSkill {
                name: "pdf".into(),
                folder: "/skills/pdf@abc/".into(),
                description: "Read PDFs".into(),
            }],
            Catalog::default(),
        );
        assert_eq!(
            sandboxed.names(),
            [
                "bash",
                "read",
                "write",
                "edit",
                "grep",
                "glob",
                "read_artifact",
                "memory",
                "schedule_wake"
            ]
        );
        assert_eq!(
            sandboxed.route("grep"),
            Some((Route::Sandbox(ToolName::Grep), None))
        );
        // Background processes are not a pod's: bash takes no run_in_background, and there is
        // no bash_output or bash_kill.
        let bash = &sandboxed.tools[0]["inputSchema"]["properties"];
        assert_eq!(
            bash.as_object().unwrap().keys().collect::<Vec<_>>(),
            ["command", "timeout"]
        );
        assert_eq!(sandboxed.route("bash_output"), None);
        assert_eq!(sandboxed.route("bash_kill"), None);
        assert_eq!(
            sandboxed.route("memory/view"),
            Some((Route::Memory, Some("view".into())))
        );
        assert_eq!(
            sandboxed.tools[7]["inputSchema"]["properties"]["command"]["enum"],
            json!(["view"])
        );
        assert_eq!(
            sandboxed.check_memory(&json!({"command": "create", "path": "/memories/x"}), 100),
            Err("memory has no command \"create\" here; the commands are: view.".into())
        );
        let text = &sandboxed.instructions;
        assert!(
            text.starts_with("Be brief.\n\nYou have an isolated Linux sandbox"),
            "{text}"
        );
        assert!(text.contains("Files you write under /workspace/outputs reach the user too"));
        assert!(text.contains("- pdf (/skills/pdf@abc/): Read PDFs"));
        assert!(
            text.ends_with("The list of your memories is given at the start of the conversation."),
            "{text}"
        );
        assert!(!text.contains("/memories/a.md"), "{text}");
    }

    #[test]
    fn memory_calls_are_checked_in_full_before_they_are_sent() {
        let offer = Offer::new(
            &ts(json!({"memory": {"access": "read_write", "index": "- /memories/a.md — a"}})),
            &[],
            Catalog::default(),
        );
        let check = |args: Value| offer.check_memory(&args, 20);
        assert_eq!(
            check(json!({"command": "view", "path": "/memories"})),
            Ok(())
        );
        assert_eq!(
            check(json!({"command": "view", "path": "/memories/a.md", "view_range": [2, -1]})),
            Ok(())
        );
        assert_eq!(
            check(json!({"command": "create", "path": "/memories/b.md", "file_text": "tea"})),
            Ok(())
        );
        assert_eq!(
            check(
                json!({"command": "rename", "old_path": "/memories/b.md", "new_path": "/memories/c/d.md"})
            ),
            Ok(())
        );
        let refusals = [
            (
                json!({"command": "create", "path": "/memories/b.md"}),
                "memory create needs file_text.",
            ),
            (
                json!({"command": "create", "path": "/etc/passwd", "file_text": "x"}),
                "memory create: path \"/etc/passwd\" is not under /memories.",
            ),
            (
                json!({"command": "create", "path": "/memoriesx/a", "file_text": "x"}),
                "memory create: path \"/memoriesx/a\" is not under /memories.",
            ),
            (
                json!({"command": "delete", "path": "/memories/../etc"}),
                "memory delete: path \"/memories/../etc\" has an empty, . or .. segment.",
            ),
            (
                json!({"command": "delete", "path": "/memories/"}),
                "memory delete: path \"/memories/\" is the memory directory itself; name a file \
                 under it.",
            ),
            (
                json!({"command": "create", "path": "/memories/b.md", "file_text": "x".repeat(21)}),
                "memory create: file_text is 21 bytes, past the 20 bytes a memory call may carry; \
                 keep memories small, or split this one.",
            ),
            (
                json!({"command": "insert", "path": "/memories/a.md", "insert_line": -1, "insert_text": "x"}),
                "memory insert: insert_line must be a whole number, 0 or more.",
            ),
            (
                json!({"command": "view", "path": "/memories/a.md", "view_range": [3, 2]}),
                "memory view: view_range must be [first, last] with 1 <= first <= last (last -1 \
                 for the end).",
            ),
            (
                json!({"command": "view", "path": "/memories", "file_text": "x"}),
                "memory view does not take file_text; it takes: path, view_range.",
            ),
            (
                json!({"command": "str_replace", "path": "/memories/a.md", "old_str": ""}),
                "memory str_replace: old_str must not be empty.",
            ),
            (
                json!({"command": "delete", "path": 3}),
                "memory delete: path must be a string.",
            ),
        ];
        for (args, message) in refusals {
            assert_eq!(check(args.clone()), Err(message.to_owned()), "{args}");
        }
    }

    #[test]
    fn remote_tools_are_offered_routed_and_loaded_by_search() {
        use crate::nylorun::link::protocol::{McpFacts, McpServerFacts, McpToolFacts};
        let tool = |name: &str, deferred: Option<bool>| McpToolFacts {
            name: name.into(),
            description: Some(format!("{name} things")),
            input_schema: json!({"type": "object"}),
            output_schema: None,
            annotations: None,
            enabled: true,
            deferred,
        };
        let facts = McpFacts {
            servers: vec![McpServerFacts {
                agent_id: None,
                name: "docs".into(),
                instructions: Some("Search before you read.".into()),
                tools: vec![tool("search", None), tool("read", Some(true))],
            }],
        };
        let catalog = Catalog::build(Some(&facts), None);
        let offer = Offer::new(
            &ts(json!({"agent": {"id": "a", "kind": "virtual"}})),
            &[],
            catalog,
        );
        assert_eq!(
            offer.names(),
            ["read_artifact", "docs__search", "tool_search"]
        );
        assert_eq!(offer.route("docs__search"), Some((Route::Remote(0), None)));
        // A deferred tool routes before it is loaded; tool_search is a harness call.
        assert_eq!(offer.route("docs__read"), Some((Route::Remote(1), None)));
        assert_eq!(
            offer.target(Route::Remote(1)),
            json!({"kind": "mcp", "server": "docs", "tool": "read"})
        );
        assert_eq!(offer.target(Route::ToolSearch), json!({"kind": "harness"}));
        assert!(offer.instructions.contains(
            "Instructions from the MCP server docs, whose tools you may call:\nSearch before you \
             read."
        ));
        assert!(
            offer
                .instructions
                .contains("More tools are available but not loaded: docs__read. Call tool_search")
        );
        // Once a search in the transcript found it, the next call offers it.
        let found = tool_search::search(&offer.catalog, &json!({"query": "select:docs__read"}));
        let found = serde_json::to_value(found).unwrap();
        let entries = vec![json!({"kind": "tool-results", "turnId": "t", "stepId": "s",
            "results": [{"callId": "1", "toolName": "tool_search", "kind": "completed",
                         "output": found["output"]}]})];
        let names: Vec<Value> = offer
            .tools_for(&entries)
            .iter()
            .map(|t| t["name"].clone())
            .collect();
        assert_eq!(
            names,
            [
                json!("read_artifact"),
                json!("docs__search"),
                json!("tool_search"),
                json!("docs__read")
            ]
        );
        assert_eq!(offer.tools_for(&[]), offer.tools);
    }
}
