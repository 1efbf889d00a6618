//! The MCP and HTTP tools a turn offers (v5 §3 `mcp`, §4 targets): named, filtered and sorted
//! into loaded and deferred.
//!
//! Owns: [`Catalog::build`] from the session's MCP facts and the manifest's HTTP tools — every
//! enabled tool of the root agent's servers and every enabled HTTP tool, each with its model
//! name ([`crate::nylorun::turn::naming`]), its intent target, and whether it waits behind
//! `tool_search`; and the servers' own instructions.
//!
//! Invariants:
//! * A pure function of the facts and the manifest: the same session offers the same tools
//!   under the same names in every segment, replay and compaction.
//! * Names are made over every tool the facts list, enabled or not, so a turn whose manifest
//!   disables a tool renames no other.
//! * `enabled: false` is never offered (core refuses it as `tool.disabled`).
//! * Deferral: the manifest's `deferred` when it says; otherwise podhost defers every
//!   undecided tool once the tools it would load pass [`DEFER_PAST_TOOLS`] tools or
//!   [`DEFER_PAST_SCHEMA_BYTES`] of definitions — all or none, so no tool's fate depends on
//!   where it sorts.
//!
//! Non-goals: the servers of agents used as tools (facts with an `agentId`): their calls would
//! name another agent, which only core's own engine runs; they are left out and logged.

use serde_json::{Value, json};

use super::wire::{ServerRef, manifest_http_tools};
use crate::nylorun::link::protocol::McpFacts;
use crate::nylorun::turn::naming::{Wanted, model_names};
use crate::nylorun::turn::shaping::json_len;

/// More tools than this to load (when the manifest leaves deferral open) defers them.
pub const DEFER_PAST_TOOLS: usize = 32;
/// More definition bytes than this (name, description and schema as JSON) defers them.
pub const DEFER_PAST_SCHEMA_BYTES: usize = 48 * 1024;
/// A server's instructions past this are cut (with a note saying so).
pub const SERVER_INSTRUCTIONS_BYTES: usize = 16 * 1024;

/// What runs a remote tool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RemoteKind {
    /// An MCP server's tool, by its raw name.
    Mcp { server: ServerRef, tool: String },
    /// An HTTP tool of the manifest, by its declared name.
    Http { tool: String },
}

/// One MCP or HTTP tool offered to the model.
#[derive(Clone, Debug, PartialEq)]
pub struct RemoteTool {
    /// The name the model calls it by.
    pub name: String,
    pub kind: RemoteKind,
    pub description: String,
    pub input_schema: Value,
    /// Offered behind `tool_search` until a search loads it.
    pub deferred: bool,
}

impl RemoteTool {
    /// `{name, description, inputSchema}`, as a `ModelCall` carries tools.
    pub fn model_tool(&self) -> Value {
        json!({"name": self.name, "description": self.description, "inputSchema": self.input_schema})
    }

    /// The intent's `target` (v5 §4): `{kind: "mcp", server, tool}` (the server's name in the
    /// manifest, the tool's raw name) or `{kind: "http", tool}`.
    pub fn target(&self) -> Value {
        match &self.kind {
            RemoteKind::Mcp { server, tool } => {
                json!({"kind": "mcp", "server": server.server_name, "tool": tool})
            }
            RemoteKind::Http { tool } => json!({"kind": "http", "tool": tool}),
        }
    }

    /// `server/tool` or `http/tool`, for messages and logs.
    pub fn label(&self) -> String {
        match &self.kind {
            RemoteKind::Mcp { server, tool } => format!("{}/{tool}", server.server_name),
            RemoteKind::Http { tool } => format!("http/{tool}"),
        }
    }
}

/// The remote tools of a turn.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Catalog {
    /// Loaded and deferred, in the facts' order (servers, then their tools), then HTTP tools.
    pub tools: Vec<RemoteTool>,
    /// `(server, instructions)` of the root's servers that gave some, cut to
    /// [`SERVER_INSTRUCTIONS_BYTES`].
    pub server_instructions: Vec<(String, String)>,
    /// Servers left out, for the log: `(agentId, server)`.
    pub skipped_servers: Vec<(String, String)>,
}

/// A tool declared by the facts or the manifest, before it is named and offered.
struct Candidate {
    wanted: Wanted,
    kind: RemoteKind,
    description: String,
    input_schema: Value,
    enabled: bool,
    deferred: Option<bool>,
}

/// The enabled candidates under their model names, each once, deferred as they ask (past
/// [`DEFER_PAST_TOOLS`] tools or [`DEFER_PAST_SCHEMA_BYTES`], those that do not say are too).
fn offered(candidates: Vec<Candidate>) -> Vec<RemoteTool> {
    let wanted: Vec<Wanted> = candidates.iter().map(|c| c.wanted.clone()).collect();
    let names = model_names(&wanted);
    let mut tools: Vec<(RemoteTool, Option<bool>)> = candidates
        .into_iter()
        .zip(names)
        .filter(|(c, _)| c.enabled)
        .map(|(c, name)| {
            (
                RemoteTool {
                    name,
                    kind: c.kind,
                    description: c.description,
                    input_schema: c.input_schema,
                    deferred: c.deferred == Some(true),
                },
                c.deferred,
            )
        })
        .collect();
    // Two facts entries for one tool (a server listing a name twice) offer it once.
    let mut seen = std::collections::HashSet::new();
    tools.retain(|(t, _)| seen.insert(t.name.clone()));
    let loading: Vec<&RemoteTool> = tools
        .iter()
        .filter(|(_, d)| *d != Some(true))
        .map(|(t, _)| t)
        .collect();
    let bytes: usize = loading.iter().map(|t| json_len(&t.model_tool())).sum();
    let defer_open = loading.len() > DEFER_PAST_TOOLS || bytes > DEFER_PAST_SCHEMA_BYTES;
    tools
        .into_iter()
        .map(|(mut t, d)| {
            if d.is_none() {
                t.deferred = defer_open;
            }
            t
        })
        .collect()
}

impl Catalog {
    pub fn build(facts: Option<&McpFacts>, manifest_tools: Option<&Value>) -> Catalog {
        let mut catalog = Catalog::default();
        let candidates = catalog.candidates(facts, manifest_tools);
        catalog.tools = offered(candidates);
        catalog
    }

    /// Every tool the facts and the manifest declare, in order; notes the servers' instructions
    /// and the servers left out.
    fn candidates(
        &mut self,
        facts: Option<&McpFacts>,
        manifest_tools: Option<&Value>,
    ) -> Vec<Candidate> {
        let mut candidates = Vec::new();
        for server in facts.map(|f| f.servers.as_slice()).unwrap_or_default() {
            if let Some(agent) = &server.agent_id {
                self.skipped_servers
                    .push((agent.clone(), server.name.clone()));
                continue;
            }
            if let Some(text) = server.instructions.as_deref().map(str::trim)
                && !text.is_empty()
            {
                self.server_instructions
                    .push((server.name.clone(), cut_instructions(text)));
            }
            for tool in &server.tools {
                candidates.push(Candidate {
                    wanted: Wanted::mcp(&server.name, &tool.name),
                    kind: RemoteKind::Mcp {
                        server: ServerRef {
                            agent_id: None,
                            server_name: server.name.clone(),
                        },
                        tool: tool.name.clone(),
                    },
                    description: tool.description.clone().unwrap_or_else(|| {
                        format!("The tool {} of the MCP server {}.", tool.name, server.name)
                    }),
                    input_schema: tool.input_schema.clone(),
                    enabled: tool.enabled,
                    deferred: tool.deferred,
                });
            }
        }
        for http in manifest_http_tools(manifest_tools) {
            candidates.push(Candidate {
                wanted: Wanted::http(&http.name),
                description: if http.description.is_empty() {
                    format!("The HTTP tool {}.", http.name)
                } else {
                    http.description
                },
                kind: RemoteKind::Http { tool: http.name },
                input_schema: http.input_schema,
                enabled: http.enabled,
                deferred: http.deferred,
            });
        }
        candidates
    }

    /// The tool the model calls `name`.
    pub fn find(&self, name: &str) -> Option<usize> {
        self.tools.iter().position(|t| t.name == name)
    }

    pub fn has_deferred(&self) -> bool {
        self.tools.iter().any(|t| t.deferred)
    }
}

/// A server's instructions, cut on a character boundary past [`SERVER_INSTRUCTIONS_BYTES`].
fn cut_instructions(text: &str) -> String {
    if text.len() <= SERVER_INSTRUCTIONS_BYTES {
        return text.to_owned();
    }
    let mut end = SERVER_INSTRUCTIONS_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}\n(The server's instructions go on for {} more bytes, not shown.)",
        &text[..end],
        text.len() - end
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nylorun::link::protocol::{McpServerFacts, McpToolFacts};
    use pretty_assertions::assert_eq;

    fn tool(name: &str, enabled: bool, deferred: Option<bool>) -> McpToolFacts {
        McpToolFacts {
            name: name.into(),
            description: Some(format!("{name} it")),
            input_schema: json!({"type": "object"}),
            output_schema: None,
            annotations: None,
            enabled,
            deferred,
        }
    }

    fn server(name: &str, tools: Vec<McpToolFacts>) -> McpServerFacts {
        McpServerFacts {
            agent_id: None,
            name: name.into(),
            instructions: Some(format!("Use {name} well.")),
            tools,
        }
    }

    #[test]
    fn enabled_root_tools_are_offered_with_targets() {
        let mut sub = server("sub", vec![tool("x", true, None)]);
        sub.agent_id = Some("helper".into());
        let facts = McpFacts {
            servers: vec![
                server(
                    "docs",
                    vec![
                        tool("search", true, None),
                        tool("drop", false, None),
                        tool("later", true, Some(true)),
                    ],
                ),
                sub,
            ],
        };
        let http = json!([{"name": "weather", "description": "Weather.", "type": "http"}]);
        let c = Catalog::build(Some(&facts), Some(&http));
        let names: Vec<(&str, bool)> = c
            .tools
            .iter()
            .map(|t| (t.name.as_str(), t.deferred))
            .collect();
        assert_eq!(
            names,
            [
                ("docs__search", false),
                ("docs__later", true),
                ("weather", false)
            ]
        );
        assert_eq!(
            c.tools[0].target(),
            json!({"kind": "mcp", "server": "docs", "tool": "search"})
        );
        assert_eq!(
            c.tools[2].target(),
            json!({"kind": "http", "tool": "weather"})
        );
        assert_eq!(
            c.server_instructions,
            [("docs".to_owned(), "Use docs well.".to_owned())]
        );
        assert_eq!(c.skipped_servers, [("helper".to_owned(), "sub".to_owned())]);
        assert_eq!(c.find("docs__later"), Some(1));
        assert!(c.has_deferred());
    }

    #[test]
    fn many_undecided_tools_are_deferred_all_together() {
        let many: Vec<McpToolFacts> = (0..=DEFER_PAST_TOOLS)
            .map(|i| tool(&format!("t{i}"), true, None))
            .collect();
        let mut pinned = many.clone();
        pinned[0].deferred = Some(false);
        let c = Catalog::build(
            Some(&McpFacts {
                servers: vec![server("s", pinned)],
            }),
            None,
        );
        assert!(!c.tools[0].deferred);
        assert!(c.tools[1..].iter().all(|t| t.deferred));
        // One fewer: all loaded.
        let few = Catalog::build(
            Some(&McpFacts {
                servers: vec![server("s", many[..DEFER_PAST_TOOLS].to_vec())],
            }),
            None,
        );
        assert!(few.tools.iter().all(|t| !t.deferred));
        // Large schemas defer too.
        let mut big = tool("big", true, None);
        big.input_schema =
            json!({"type": "object", "description": "x".repeat(DEFER_PAST_SCHEMA_BYTES)});
        let c = Catalog::build(
            Some(&McpFacts {
                servers: vec![server("s", vec![big, tool("small", true, None)])],
            }),
            None,
        );
        assert!(c.tools.iter().all(|t| t.deferred));
    }

    #[test]
    fn a_disabled_tool_renames_nothing_else() {
        let both = |enabled: bool| {
            Catalog::build(
                Some(&McpFacts {
                    servers: vec![
                        server("a.b", vec![tool("x", enabled, None)]),
                        server("a_b", vec![tool("x", true, None)]),
                    ],
                }),
                None,
            )
        };
        let on = both(true);
        let off = both(false);
        assert_eq!(on.tools.len(), 2);
        assert_eq!(off.tools.len(), 1);
        assert_eq!(off.tools[0].name, on.tools[1].name);
        assert!(on.tools[1].name.starts_with("a_b__x_"));
    }

    #[test]
    fn long_instructions_are_cut_with_a_note() {
        let text = "é".repeat(SERVER_INSTRUCTIONS_BYTES);
        let cut = cut_instructions(&text);
        assert!(cut.starts_with(&"é".repeat(SERVER_INSTRUCTIONS_BYTES / 2)));
        assert!(cut.ends_with(&format!(
            "\n(The server's instructions go on for {} more bytes, not shown.)",
            SERVER_INSTRUCTIONS_BYTES
        )));
    }
}
