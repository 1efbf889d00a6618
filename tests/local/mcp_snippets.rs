//! The README's `podhost mcp` snippets, read as each client reads them: Claude Code's
//! `.mcp.json` (`${VAR}` expanded), Cursor's `.cursor/mcp.json` (`${env:VAR}` expanded) and
//! Codex's `config.toml` (`bearer_token_env_var` sent as the bearer token). Each snippet starts
//! podhost as it says (stdio) or reaches a `podhost mcp --listen` at its URL (streamable HTTP),
//! and a session lists the tools and calls `read`. A snippet whose keys, expansion or paths
//! drift fails, which the last test shows with drifted copies.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;

use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::harness::{T, podhost};
use crate::mcp::{TOKEN, serve_http_with};

/// The README's `podhost mcp` section.
fn mcp_section() -> String {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let start = readme.find("### `podhost mcp`").unwrap();
    let len = readme[start..].find("\n## ").unwrap();
    readme[start..start + len].to_owned()
}

/// A snippet: the clients its marker names, its fence's language, its text.
#[derive(Debug)]
struct Snippet {
    clients: Vec<String>,
    lang: String,
    text: String,
}

/// Every fenced block right under a `<!-- mcp-client: … -->` marker.
fn snippets(section: &str) -> Vec<Snippet> {
    let mut out = Vec::new();
    let mut lines = section.lines();
    while let Some(line) = lines.next() {
        let Some(marker) = line.strip_prefix("<!-- mcp-client:") else {
            continue;
        };
        let clients = marker.trim_end_matches("-->").split_whitespace();
        let fence = lines.next().unwrap();
        let lang = fence.strip_prefix("```").unwrap().to_owned();
        let text: Vec<&str> = lines.by_ref().take_while(|l| *l != "```").collect();
        out.push(Snippet {
            clients: clients.map(str::to_owned).collect(),
            lang,
            text: text.join("\n"),
        });
    }
    out
}

/// What a client does with its configuration.
#[derive(Debug, PartialEq)]
enum Launch {
    Stdio {
        command: String,
        args: Vec<String>,
    },
    Http {
        url: String,
        headers: Vec<(String, String)>,
    },
}

/// `${VAR}` and `${VAR:-default}` (Claude Code), or `${env:VAR}` (Cursor), from `env`; any
/// other `${…}` is left as it is, as the client leaves it.
fn expand(text: &str, cursor: bool, env: &BTreeMap<&str, &str>) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let Some(end) = rest[at..].find('}') else {
            break;
        };
        let inner = &rest[at + 2..at + end];
        let value = if cursor {
            inner.strip_prefix("env:").and_then(|v| env.get(v).copied())
        } else {
            let (name, default) = inner.split_once(":-").unwrap_or((inner, ""));
            let found = env.get(name).copied();
            found.or((inner.contains(":-")).then_some(default))
        };
        out.push_str(value.unwrap_or(&rest[at..=at + end]));
        rest = &rest[at + end + 1..];
    }
    out.push_str(rest);
    out
}

/// An `mcpServers.podhost` entry of `.mcp.json` (Claude Code) or `.cursor/mcp.json` (Cursor).
fn read_json(text: &str, cursor: bool, env: &BTreeMap<&str, &str>) -> Result<Launch, String> {
    let doc: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let Some(Value::Object(server)) = doc.pointer("/mcpServers/podhost") else {
        return Err(format!("no mcpServers.podhost in {doc}"));
    };
    let known = ["type", "command", "args", "env", "url", "headers"];
    if let Some(k) = server.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(format!("a key the client does not know: {k}"));
    }
    let string = |v: &Value| v.as_str().map(|s| expand(s, cursor, env));
    // Claude Code takes an entry without `type` for stdio; Cursor tells them by `url`.
    let kind = match server.get("type") {
        Some(t) => t.as_str().unwrap_or_default().to_owned(),
        None if cursor && server.contains_key("url") => "http".to_owned(),
        None => "stdio".to_owned(),
    };
    match kind.as_str() {
        "stdio" => Ok(Launch::Stdio {
            command: server.get("command").and_then(string).ok_or("no command")?,
            args: server
                .get("args")
                .and_then(Value::as_array)
                .map_or_else(Vec::new, |a| a.iter().filter_map(string).collect()),
        }),
        "http" => Ok(Launch::Http {
            url: server.get("url").and_then(string).ok_or("no url")?,
            headers: server
                .get("headers")
                .and_then(Value::as_object)
                .map_or_else(Vec::new, |h| {
                    h.iter()
                        .filter_map(|(k, v)| Some((k.clone(), string(v)?)))
                        .collect()
                }),
        }),
        other => Err(format!("a transport the snippet cannot mean: {other}")),
    }
}

/// `[mcp_servers.podhost]` of Codex's `config.toml`: `key = "value"` and `key = ["…", …]`.
fn read_toml(text: &str, env: &BTreeMap<&str, &str>) -> Result<Launch, String> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    if lines.next() != Some("[mcp_servers.podhost]") {
        return Err(format!("not the table [mcp_servers.podhost]: {text}"));
    }
    let mut keys = BTreeMap::new();
    for line in lines {
        let (key, value) = line
            .split_once(" = ")
            .ok_or(format!("not key = value: {line}"))?;
        // A TOML basic string or array of them reads as JSON here.
        let value: Value = serde_json::from_str(value).map_err(|e| format!("{line}: {e}"))?;
        keys.insert(key.trim().to_owned(), value);
    }
    let known = ["command", "args", "url", "bearer_token_env_var"];
    if let Some(k) = keys.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(format!("a key the client does not know: {k}"));
    }
    let string = |k: &str| keys.get(k).and_then(Value::as_str).map(str::to_owned);
    if let Some(url) = string("url") {
        let token = string("bearer_token_env_var").and_then(|v| env.get(v.as_str()).copied());
        let headers = token.map(|t| ("Authorization".to_owned(), format!("Bearer {t}")));
        return Ok(Launch::Http {
            url,
            headers: headers.into_iter().collect(),
        });
    }
    let args = keys.get("args").and_then(Value::as_array).cloned();
    Ok(Launch::Stdio {
        command: string("command").ok_or("no command or url")?,
        args: args
            .unwrap_or_default()
            .iter()
            .filter_map(|a| a.as_str().map(str::to_owned))
            .collect(),
    })
}

/// What `client` makes of `snippet`, with `env` its environment.
fn interpret(
    client: &str,
    snippet: &Snippet,
    env: &BTreeMap<&str, &str>,
) -> Result<Launch, String> {
    match (client, snippet.lang.as_str()) {
        ("claude-code", "json") => read_json(&snippet.text, false, env),
        ("cursor", "json") => read_json(&snippet.text, true, env),
        ("codex", "toml") => read_toml(&snippet.text, env),
        other => Err(format!("no such client and format: {other:?}")),
    }
}

/// The requests of a session: initialize, then the tools listed and `read` called.
fn session_requests() -> [Value; 4] {
    [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "snippet", "version": "0"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
               "params": {"name": "read", "arguments": {"path": "hello.txt"}}}),
    ]
}

/// The tools listed and `read`'s text, from the answers to requests 2 and 3.
fn session_outcome(list: &Value, read: &Value) -> Result<(Value, Value), String> {
    let names = list
        .pointer("/result/tools")
        .and_then(Value::as_array)
        .ok_or(format!("no tools listed: {list}"))?
        .iter()
        .map(|t| t["name"].clone())
        .collect();
    let text = read
        .pointer("/result/content/0/text")
        .cloned()
        .ok_or(format!("no text read: {read}"))?;
    Ok((Value::Array(names), text))
}

/// The session over stdio: podhost started as the snippet says (`podhost` being the built
/// binary and `/path/to/project` the workspace).
async fn over_stdio(command: &str, args: &[String], ws: &Path) -> Result<(Value, Value), String> {
    if command != "podhost" {
        return Err(format!("the command is {command:?}, not podhost"));
    }
    let args: Vec<String> = args
        .iter()
        .map(|a| a.replace("/path/to/project", &ws.display().to_string()))
        .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut child = podhost(&args).stdin(Stdio::piped()).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut answers = BTreeMap::new();
    for request in session_requests() {
        let sent = stdin.write_all(format!("{request}\n").as_bytes()).await;
        sent.map_err(|e| format!("podhost took no request: {e}"))?;
        let Some(id) = request.get("id").and_then(Value::as_u64) else {
            continue;
        };
        let line = tokio::time::timeout(T, lines.next_line())
            .await
            .unwrap()
            .unwrap();
        let line = line.ok_or("podhost ended before it answered")?;
        let answer: Value = serde_json::from_str(&line).map_err(|e| format!("{e}: {line}"))?;
        if answer["id"] != json!(id) {
            return Err(format!("answered {answer} to request {id}"));
        }
        answers.insert(id, answer);
    }
    session_outcome(&answers[&2], &answers[&3])
}

/// The session over HTTP against `served` (`host:port`), at the snippet's URL with its port
/// rewritten to the served one, with the snippet's headers.
async fn over_http(
    url: &str,
    headers: &[(String, String)],
    served: &str,
) -> Result<(Value, Value), String> {
    let (_, port) = served.rsplit_once(':').unwrap();
    let rest = url
        .strip_prefix("http://")
        .ok_or(format!("not an http URL: {url}"))?;
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
    let url = format!("http://{host}:{port}/{path}");
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    let mut session: Option<String> = None;
    let mut answers = BTreeMap::new();
    for request in session_requests() {
        let mut post = http
            .post(&url)
            .header("Accept", "application/json, text/event-stream")
            .header("Content-Type", "application/json")
            .body(request.to_string());
        for (name, value) in headers {
            post = post.header(name, value);
        }
        if let Some(id) = &session {
            post = post
                .header("mcp-session-id", id)
                .header("mcp-protocol-version", "2025-11-25");
        }
        let resp = tokio::time::timeout(T, post.send())
            .await
            .unwrap()
            .map_err(|e| e.to_string())?;
        if !resp.status().is_success() {
            return Err(format!("{} answered {}", url, resp.status()));
        }
        if let Some(id) = resp.headers().get("mcp-session-id") {
            session = Some(id.to_str().unwrap().to_owned());
        }
        let body = tokio::time::timeout(T, resp.text())
            .await
            .unwrap()
            .map_err(|e| e.to_string())?;
        let Some(id) = request.get("id") else {
            continue;
        };
        // The answer is JSON, or the `data:` of an event stream.
        let answer = std::iter::once(body.as_str())
            .chain(body.lines().filter_map(|l| l.strip_prefix("data:")))
            .find_map(|d| {
                serde_json::from_str::<Value>(d.trim())
                    .ok()
                    .filter(|v| v["id"] == *id)
            })
            .ok_or(format!("no answer to request {id}: {body}"))?;
        answers.insert(id.as_u64().unwrap(), answer);
    }
    session_outcome(&answers[&2], &answers[&3])
}

/// `client`'s session through `snippet`, with `PODHOST_TOKEN` holding the test's credential in
/// the client's environment and in podhost's.
async fn through(client: &str, snippet: &Snippet) -> Result<(Value, Value), String> {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("hello.txt"), "hello from the snippet\n").unwrap();
    let env = BTreeMap::from([("PODHOST_TOKEN", TOKEN)]);
    match interpret(client, snippet, &env)? {
        Launch::Stdio { command, args } => over_stdio(&command, &args, ws.path()).await,
        Launch::Http { url, headers } => {
            let server = serve_http_with(ws.path(), &[], Some(TOKEN), None, &[]).await;
            over_http(&url, &headers, server.addr()).await
        }
    }
}

fn served() -> (Value, Value) {
    (
        json!([
            "bash",
            "read",
            "write",
            "edit",
            "grep",
            "glob",
            "bash_output",
            "bash_kill"
        ]),
        json!("1\thello from the snippet"),
    )
}

#[tokio::test]
async fn every_readme_snippet_serves_its_client_on_both_transports() {
    let snippets = snippets(&mcp_section());
    let mut covered = Vec::new();
    for snippet in &snippets {
        for client in &snippet.clients {
            let env = BTreeMap::from([("PODHOST_TOKEN", TOKEN)]);
            let transport = match interpret(client, snippet, &env) {
                Ok(Launch::Stdio { .. }) => "stdio",
                Ok(Launch::Http { .. }) => "http",
                Err(e) => panic!("{client} cannot read {snippet:?}: {e}"),
            };
            let outcome = through(client, snippet).await;
            assert_eq!(
                outcome,
                Ok(served()),
                "{client} over {transport}: {snippet:?}"
            );
            covered.push(format!("{client} {transport}"));
        }
    }
    covered.sort();
    assert_eq!(
        covered,
        [
            "claude-code http",
            "claude-code stdio",
            "codex http",
            "codex stdio",
            "cursor http",
            "cursor stdio"
        ]
    );
}

/// Copies of the README's snippets drifted as people get them wrong: each must fail.
#[tokio::test]
async fn a_drifted_snippet_fails() {
    let snippets = snippets(&mcp_section());
    let find = |client: &str, needle: &str| {
        snippets
            .iter()
            .find(|s| s.clients.iter().any(|c| c == client) && s.text.contains(needle))
            .unwrap()
    };
    let drifted = |s: &Snippet, from: &str, to: &str| Snippet {
        clients: s.clients.clone(),
        lang: s.lang.clone(),
        text: s.text.replace(from, to),
    };
    let unauthorized = "/mcp answered 401 Unauthorized";
    let cases = [
        // Cursor's expansion in Claude Code's file, and Claude Code's in Cursor's.
        (
            "claude-code",
            drifted(find("claude-code", "${PODHOST_TOKEN}"), "${", "${env:"),
            unauthorized,
        ),
        (
            "cursor",
            drifted(find("cursor", "${env:"), "${env:", "${"),
            unauthorized,
        ),
        // A header without the token, a key Codex does not read, a path podhost does not serve.
        (
            "claude-code",
            drifted(find("claude-code", "Bearer"), " ${PODHOST_TOKEN}", ""),
            unauthorized,
        ),
        (
            "codex",
            drifted(find("codex", "bearer_token_env_var"), "_env_var", ""),
            "a key the client does not know: bearer_token",
        ),
        (
            "codex",
            drifted(find("codex", "url ="), "/mcp\"", "/\""),
            "/ answered 404 Not Found",
        ),
        // HTTP without `type` in Claude Code's file; a workspace that is not the project.
        (
            "claude-code",
            drifted(find("claude-code", "\"type\""), "\"type\": \"http\",", ""),
            "no command",
        ),
        (
            "codex",
            drifted(
                find("codex", "command"),
                "/path/to/project",
                "/path/to/projects",
            ),
            "podhost ended before it answered",
        ),
    ];
    for (client, snippet, refused) in &cases {
        let outcome = through(client, snippet).await;
        let error = outcome.expect_err(&format!("{client} served through {snippet:?}"));
        assert!(error.ends_with(refused), "{client}, {snippet:?}: {error}");
    }
}
