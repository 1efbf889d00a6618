//! `tool_search`: how the model loads deferred MCP and HTTP tools (v5 §4: "`tool_search` over
//! deferred tools is yours").
//!
//! Owns: the tool's definition, the search itself (a `harness` call, journaled like any other,
//! run by podhost), and [`loaded`]: which deferred tools the transcript's searches loaded, so
//! the next model call offers them.
//!
//! Invariants:
//! * Pure: a search's answer depends only on the catalog and the query; which tools are loaded
//!   depends only on the transcript. The offered list stays a function of the session's facts
//!   and state, so replays hash the same.
//! * An answer is at most [`ANSWER_BYTES`] as JSON: tools whose definitions do not fit are
//!   named, not shown, and a narrower search shows them.
//!
//! Non-goals: loading a tool the model never searched for (a deferred tool can still be called
//! by its name: routing knows every tool of the catalog).

use std::collections::HashSet;
use std::sync::OnceLock;

use serde_json::{Value, json};

use crate::agent::model::ResultOutcome;
use crate::nylorun::turn::shaping::json_len;
use crate::nylorun::turn::toolgate::catalog::Catalog;
use crate::tools::ToolDefinition;

/// The tool's name.
pub const TOOL_SEARCH: &str = "tool_search";
/// Tools one search shows by default, and at most.
pub const DEFAULT_LIMIT: usize = 5;
pub const MAX_LIMIT: usize = 20;
/// The most bytes of tool definitions one answer carries.
pub const ANSWER_BYTES: usize = 24 * 1024;

const SOURCE: &str = include_str!("../../../tools/tool_search.json");

/// `{name, description, inputSchema}` of `tool_search` (tools/tool_search.json).
pub fn definition() -> Value {
    static PARSED: OnceLock<ToolDefinition> = OnceLock::new();
    let def = PARSED.get_or_init(|| {
        // The file is checked by a test below; a broken one still yields a named tool.
        serde_json::from_str(SOURCE).unwrap_or_else(|_| ToolDefinition {
            name: TOOL_SEARCH.to_owned(),
            description: String::new(),
            input_schema: json!({"type": "object"}),
            output_schema: None,
        })
    });
    json!({"name": def.name, "description": def.description, "inputSchema": def.input_schema})
}

/// Runs one search: the outcome value to record (`{kind: "completed", output: {tools, …}}`, or
/// a failure for bad input).
pub fn search(catalog: &Catalog, args: &Value) -> ResultOutcome {
    let failed =
        |message: String| ResultOutcome::failed(crate::floor::codes::tool::INVALID_INPUT, message);
    let Some(query) = args
        .get("query")
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|q| !q.is_empty())
    else {
        return failed("tool_search needs query, a non-empty string.".to_owned());
    };
    let limit = match args.get("limit") {
        None | Some(Value::Null) => DEFAULT_LIMIT,
        Some(v) => match v.as_u64() {
            Some(n) if (1..=MAX_LIMIT as u64).contains(&n) => n as usize,
            _ => {
                return failed(format!(
                    "tool_search's limit is a whole number from 1 to {MAX_LIMIT}."
                ));
            }
        },
    };
    let deferred: Vec<usize> = (0..catalog.tools.len())
        .filter(|i| catalog.tools[*i].deferred)
        .collect();
    let found = matches(catalog, &deferred, query);
    let mut tools = Vec::new();
    let mut unshown = Vec::new();
    let mut bytes = 0;
    for &i in &found {
        let def = catalog.tools[i].model_tool();
        let size = json_len(&def);
        if tools.len() < limit && bytes + size <= ANSWER_BYTES {
            bytes += size;
            tools.push(def);
        } else {
            unshown.push(catalog.tools[i].name.clone());
        }
    }
    let mut output = json!({"tools": tools});
    if tools.is_empty() {
        let names: Vec<&str> = deferred
            .iter()
            .map(|i| catalog.tools[*i].name.as_str())
            .collect();
        output["note"] = json!(format!(
            "No tool that is not loaded matches {query:?}. The tools not loaded are: {}.",
            if names.is_empty() {
                "none".to_owned()
            } else {
                names.join(", ")
            }
        ));
    } else if !unshown.is_empty() {
        output["more"] = json!(unshown);
        output["note"] = json!(
            "More tools matched than one answer shows; search again to load those in `more`."
        );
    }
    ResultOutcome::Completed {
        output,
        files: None,
    }
}

/// The deferred tools `query` finds: those `select:` names, else those whose name or
/// description holds its words, best first.
fn matches(catalog: &Catalog, deferred: &[usize], query: &str) -> Vec<usize> {
    if let Some(list) = query.strip_prefix("select:") {
        let wanted: Vec<&str> = list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        deferred
            .iter()
            .copied()
            .filter(|i| wanted.contains(&catalog.tools[*i].name.as_str()))
            .collect()
    } else {
        let words: Vec<String> = query
            .split(|c: char| !c.is_alphanumeric())
            // One letter matches nearly everything.
            .filter(|w| w.chars().count() > 1)
            .map(str::to_lowercase)
            .collect();
        let mut scored: Vec<(usize, usize)> = deferred
            .iter()
            .map(|&i| {
                let t = &catalog.tools[i];
                let name = t.name.to_lowercase();
                let text = t.description.to_lowercase();
                let score = words
                    .iter()
                    .map(|w| {
                        2 * usize::from(name.contains(w.as_str()))
                            + usize::from(text.contains(w.as_str()))
                    })
                    .sum();
                (i, score)
            })
            .filter(|(_, s)| *s > 0)
            .collect();
        // Best first; ties in catalog order.
        scored.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        scored.into_iter().map(|(i, _)| i).collect()
    }
}

/// The names a transcript's completed `tool_search` results loaded, in the order they first
/// appear.
pub fn loaded(entries: &[Value]) -> Vec<String> {
    let mut seen = HashSet::new();
    let mut names = Vec::new();
    for entry in entries {
        if entry.get("kind").and_then(Value::as_str) != Some("tool-results") {
            continue;
        }
        let results = entry.get("results").and_then(Value::as_array);
        for r in results.into_iter().flatten() {
            if r.get("toolName").and_then(Value::as_str) != Some(TOOL_SEARCH)
                || r.get("kind").and_then(Value::as_str) != Some("completed")
            {
                continue;
            }
            let tools = r
                .get("output")
                .and_then(|o| o.get("tools"))
                .and_then(Value::as_array);
            for t in tools.into_iter().flatten() {
                if let Some(n) = t.get("name").and_then(Value::as_str)
                    && seen.insert(n.to_owned())
                {
                    names.push(n.to_owned());
                }
            }
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A search's outcome as it is journaled.
    fn search(catalog: &Catalog, args: &Value) -> Value {
        serde_json::to_value(super::search(catalog, args)).unwrap()
    }
    use crate::nylorun::link::protocol::{McpFacts, McpServerFacts, McpToolFacts};
    use pretty_assertions::assert_eq;

    fn catalog() -> Catalog {
        let tool = |name: &str, description: &str, deferred: bool| McpToolFacts {
            name: name.into(),
            description: Some(description.into()),
            input_schema: json!({"type": "object"}),
            output_schema: None,
            annotations: None,
            enabled: true,
            deferred: Some(deferred),
        };
        Catalog::build(
            Some(&McpFacts {
                servers: vec![McpServerFacts {
                    agent_id: None,
                    name: "s".into(),
                    instructions: None,
                    tools: vec![
                        tool("echo", "Echoes a message back", true),
                        tool("sum", "Adds two numbers", true),
                        tool("image", "Returns a tiny image", true),
                        tool("loaded", "Echo, loaded already", false),
                    ],
                }],
            }),
            None,
        )
    }

    #[test]
    fn searches_find_deferred_tools_by_words_or_names() {
        let c = catalog();
        let out = search(&c, &json!({"query": "echo a message"}));
        assert_eq!(
            out,
            json!({"kind": "completed", "output": {"tools": [
                {"name": "s__echo", "description": "Echoes a message back", "inputSchema": {"type": "object"}},
            ]}})
        );
        let out = search(
            &c,
            &json!({"query": "select:s__image, s__loaded", "limit": 3}),
        );
        assert_eq!(out["output"]["tools"][0]["name"], "s__image");
        assert_eq!(out["output"]["tools"].as_array().unwrap().len(), 1);
        let out = search(&c, &json!({"query": "number", "limit": 1}));
        assert_eq!(out["output"]["tools"][0]["name"], "s__sum");
        let none = search(&c, &json!({"query": "weather"}));
        assert_eq!(
            none["output"]["note"],
            "No tool that is not loaded matches \"weather\". The tools not loaded are: s__echo, \
             s__sum, s__image."
        );
        let more = search(
            &c,
            &json!({"query": "select:s__echo,s__sum,s__image", "limit": 2}),
        );
        assert_eq!(more["output"]["more"], json!(["s__image"]));
        assert_eq!(
            search(&c, &json!({"query": " "}))["message"],
            "tool_search needs query, a non-empty string."
        );
        assert_eq!(
            search(&c, &json!({"query": "x", "limit": 99}))["message"],
            "tool_search's limit is a whole number from 1 to 20."
        );
    }

    #[test]
    fn an_answer_holds_at_most_its_bytes_and_names_the_rest() {
        let tool = |i: usize| McpToolFacts {
            name: format!("big{i}"),
            description: Some("A tool with a large schema".into()),
            input_schema: json!({"type": "object", "description": "s".repeat(10 * 1024)}),
            output_schema: None,
            annotations: None,
            enabled: true,
            deferred: Some(true),
        };
        let c = Catalog::build(
            Some(&McpFacts {
                servers: vec![McpServerFacts {
                    agent_id: None,
                    name: "s".into(),
                    instructions: None,
                    tools: (0..4).map(tool).collect(),
                }],
            }),
            None,
        );
        let out = search(&c, &json!({"query": "large schema"}));
        assert!(json_len(&out["output"]["tools"]) <= ANSWER_BYTES);
        assert_eq!(out["output"]["tools"].as_array().unwrap().len(), 2);
        assert_eq!(out["output"]["more"], json!(["s__big2", "s__big3"]));
    }

    #[test]
    fn the_definition_file_parses_and_names_the_tool() {
        let def: ToolDefinition = serde_json::from_str(SOURCE).unwrap();
        assert_eq!(def.name, TOOL_SEARCH);
        assert_eq!(
            def.input_schema["properties"]["limit"]["maximum"],
            MAX_LIMIT
        );
        assert_eq!(definition()["inputSchema"], def.input_schema);
    }

    #[test]
    fn the_transcript_says_what_was_loaded() {
        let c = catalog();
        let found = search(&c, &json!({"query": "select:s__sum,s__echo"}));
        let entries = vec![
            json!({"kind": "tool-results", "turnId": "t", "stepId": "s", "results": [
                {"callId": "1", "toolName": "tool_search", "kind": "completed",
                 "output": found["output"]},
                {"callId": "2", "toolName": "bash", "kind": "completed",
                 "output": {"tools": [{"name": "s__image"}]}},
            ]}),
        ];
        assert_eq!(loaded(&entries), ["s__echo", "s__sum"]);
    }
}
