//! The local front's flags (`podhost tool`, `podhost run`, `podhost mcp`), into a
//! [`ToolConfig`], a [`RunConfig`] and an [`McpConfig`].
//!
//! `podhost run` follows the conventions of model clients: `OPENAI_BASE_URL` and
//! `OPENAI_API_KEY` are used when no flag (or `PODHOST_*` variable) says otherwise, and the run
//! says which was used. A base URL must name its scheme: `localhost:11434/v1` is a usage error
//! (exit 2), never a request retried against a host named `localhost:11434`.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::builder::BoolishValueParser;
use clap::{Args, ValueEnum};
use serde_json::{Map, Value, json};
use url::Url;

use super::exec::{BackgroundArgs, ExecArgs};
use super::http::HttpArgs;
use super::origins::Origins;
use super::serve::ModelLimitsArgs;
use super::tls::TlsArgs;
use crate::chat::session::DEFAULT_MAX_STEPS;
use crate::floor::secret::Secret;
use crate::local::run::{ModelChoice, Task};
use crate::local::{LocalEnv, McpConfig, RunConfig, ToolConfig};
use crate::tools::ToolName;

/// The base URL when neither a flag nor `OPENAI_BASE_URL` names one (the OpenAI clients' own).
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// How commands of local use get their environment, and where else they may write.
#[derive(Clone, Debug, Args)]
#[command(next_help_heading = "Commands")]
pub struct LocalEnvArgs {
    /// Pass this variable to commands although its name looks like a credential (repeat the
    /// flag, or separate names with `,` in the environment). Commands get the rest of your
    /// environment anyway.
    #[arg(
        long = "env",
        value_name = "NAME",
        env = "PODHOST_PASS_ENV",
        value_delimiter = ','
    )]
    pub pass_env: Vec<String>,
    /// Let commands and the file tools also write this directory (repeat the flag, or separate
    /// paths with `:` in the environment). The workspace and the temporary directory are always
    /// writable; the rest of the system, your home included, is read-only to them.
    #[arg(
        long = "allow-write",
        value_name = "DIR",
        env = "PODHOST_ALLOW_WRITE",
        value_delimiter = ':'
    )]
    pub allow_write: Vec<PathBuf>,
}

impl LocalEnvArgs {
    fn settings(&self) -> LocalEnv {
        LocalEnv {
            pass: self.pass_env.clone(),
            allow_write: self.allow_write.clone(),
        }
    }
}

/// How hard a reasoning model thinks (`reasoning_effort`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ReasoningEffort {
    None,
    Minimal,
    Low,
    Medium,
    High,
    Xhigh,
}

/// `podhost run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The task for the agent, or `-` to read it from stdin.
    pub task: Option<String>,
    /// The OpenAI-compatible base URL (requests go to `{base_url}/chat/completions`); default
    /// `OPENAI_BASE_URL`, else `https://api.openai.com/v1`.
    #[arg(long, env = "PODHOST_BASE_URL", help_heading = "Model")]
    pub base_url: Option<String>,
    /// The model name.
    #[arg(long, env = "PODHOST_MODEL", help_heading = "Model")]
    pub model: Option<String>,
    /// The environment variable that holds the API key; default `OPENAI_API_KEY` when it is set.
    #[arg(
        long,
        env = "PODHOST_API_KEY_ENV",
        value_name = "NAME",
        help_heading = "Model"
    )]
    pub api_key_env: Option<String>,
    /// The workspace directory.
    #[arg(long, env = "PODHOST_WORKSPACE", default_value = ".")]
    pub workspace: PathBuf,
    /// Model calls the task may make before it is stopped (exit 4).
    #[arg(long, env = "PODHOST_MAX_STEPS", default_value_t = DEFAULT_MAX_STEPS,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_steps: u32,
    #[command(flatten)]
    pub limits: ModelLimitsArgs,
    /// Instructions added to podhost's own (after the workspace's AGENTS.md).
    #[arg(long, env = "PODHOST_SYSTEM", value_name = "TEXT")]
    pub system: Option<String>,
    /// Sampling temperature, passed to the model.
    #[arg(long, env = "PODHOST_TEMPERATURE", value_parser = temperature, help_heading = "Model")]
    pub temperature: Option<f64>,
    /// Most tokens of each answer (`max_tokens`), passed to the model.
    #[arg(long, env = "PODHOST_MAX_TOKENS", help_heading = "Model",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_tokens: Option<u32>,
    /// How hard a reasoning model thinks (`reasoning_effort`), passed to the model.
    #[arg(
        long,
        env = "PODHOST_REASONING_EFFORT",
        value_enum,
        help_heading = "Model"
    )]
    pub reasoning_effort: Option<ReasoningEffort>,
    /// Print JSON Lines events on stdout (schemas/run-events.v1.json) instead of text.
    #[arg(long, env = "PODHOST_JSON", value_parser = BoolishValueParser::new())]
    pub json: bool,
    /// Also write the final answer to this file.
    #[arg(
        short = 'o',
        long = "output",
        value_name = "FILE",
        env = "PODHOST_OUTPUT"
    )]
    pub output: Option<PathBuf>,
    /// Ask for whole answers instead of streamed ones (server-sent events).
    #[arg(long, env = "PODHOST_NO_STREAM", value_parser = BoolishValueParser::new(), help_heading = "Model")]
    pub no_stream: bool,
    #[command(flatten)]
    pub env: LocalEnvArgs,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub exec: ExecArgs,
    #[command(flatten)]
    pub background: BackgroundArgs,
    /// Which settings were given as flags (filled in by `Cli::parse_args`).
    #[arg(skip)]
    pub origins: Origins,
}

fn temperature(s: &str) -> Result<f64, String> {
    let t: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if (0.0..=2.0).contains(&t) {
        Ok(t)
    } else {
        Err(format!("{t} is outside 0 to 2"))
    }
}

/// `podhost tool`.
#[derive(Debug, Args)]
pub struct ToolArgs {
    /// The tool.
    #[arg(value_name = "TOOL", value_parser = tool_name())]
    pub name: ToolName,
    /// The tool's input as a JSON object, or `-` to read it from stdin.
    #[arg(long)]
    pub input: String,
    /// The workspace directory (relative paths resolve under it).
    #[arg(long, env = "PODHOST_WORKSPACE", default_value = ".")]
    pub workspace: PathBuf,
    #[command(flatten)]
    pub env: LocalEnvArgs,
    #[command(flatten)]
    pub exec: ExecArgs,
}

/// `podhost mcp`.
#[derive(Debug, Args)]
pub struct McpArgs {
    /// The workspace directory the tools work in.
    #[arg(long, env = "PODHOST_WORKSPACE", default_value = ".")]
    pub workspace: PathBuf,
    /// Serve streamable HTTP on this address (`host:port`, path `/mcp`) instead of stdio.
    /// Without a credential only a loopback address is allowed.
    #[arg(long, env = "PODHOST_MCP_LISTEN", value_name = "ADDR")]
    pub listen: Option<String>,
    /// The credential HTTP clients send as `Authorization: Bearer …`, from the environment
    /// (PODHOST_TOKEN) or --token-file: on the command line, where every process can read it, it
    /// is refused.
    #[arg(long, env = "PODHOST_TOKEN", hide_env_values = true)]
    pub token: Option<Secret>,
    /// A file holding the credential (surrounding whitespace ignored).
    #[arg(long, env = "PODHOST_TOKEN_FILE", conflicts_with = "token")]
    pub token_file: Option<PathBuf>,
    /// Which settings were given as flags (set after parsing).
    #[arg(skip)]
    pub origins: Origins,
    // The HTTP listener's timeouts and caps (with --listen), as for `podhost serve`.
    #[command(flatten)]
    pub http: HttpArgs,
    #[command(flatten)]
    pub env: LocalEnvArgs,
    #[command(flatten)]
    pub exec: ExecArgs,
    #[command(flatten)]
    pub background: BackgroundArgs,
}

impl RunArgs {
    /// The plain configuration, with `OPENAI_*` read through `var`; an error is a usage error.
    pub fn config(&self, var: impl Fn(&str) -> Option<String>) -> Result<RunConfig, String> {
        let set = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let (base_url, base_url_from) = match (&self.base_url, set("OPENAI_BASE_URL")) {
            (Some(u), _) => (u.clone(), "--base-url"),
            (None, Some(u)) => (u, "OPENAI_BASE_URL"),
            (None, None) => (DEFAULT_BASE_URL.to_owned(), "default"),
        };
        let base_url = check_base_url(base_url.trim(), base_url_from)?;
        let model = self
            .model
            .clone()
            .filter(|m| !m.trim().is_empty())
            .ok_or("no model: pass --model NAME or set PODHOST_MODEL")?;
        let api_key_env = match &self.api_key_env {
            Some(name) if name.is_empty() => {
                return Err("--api-key-env: the variable name is empty".into());
            }
            Some(name) => Some(name.clone()),
            None => set("OPENAI_API_KEY").map(|_| "OPENAI_API_KEY".to_owned()),
        };
        let task = match self.task.as_deref() {
            Some("-") => Task::Stdin,
            Some(t) => Task::Text(t.to_owned()),
            None => {
                return Err("no task: give it as an argument, or `-` to read it from stdin".into());
            }
        };
        let mut generation = Map::new();
        if let Some(t) = self.temperature {
            generation.insert("temperature".into(), json!(t));
        }
        if let Some(n) = self.max_tokens {
            generation.insert("max_tokens".into(), json!(n));
        }
        if let Some(e) = self.reasoning_effort {
            let name = e
                .to_possible_value()
                .map(|v| v.get_name().to_owned())
                .unwrap_or_default();
            generation.insert("reasoning_effort".into(), Value::String(name));
        }
        Ok(RunConfig {
            model: ModelChoice {
                base_url,
                base_url_from,
                model,
                api_key_env,
                generation,
                stream: !self.no_stream,
            },
            task,
            workspace: self.workspace.clone(),
            max_steps: self.max_steps,
            limits: self.limits.limits(),
            system: self.system.clone(),
            json: self.json,
            output_file: self.output.clone(),
            env: self.env.settings(),
            tls: self.tls.settings(&self.origins),
            exec: self.exec.settings(),
            max_background: self.background.max(),
        })
    }
}

/// The base URL, parsed once here and checked: `http://` or `https://` and a host.
fn check_base_url(url: &str, from: &str) -> Result<Url, String> {
    let name = if from == "default" {
        "the base URL"
    } else {
        from
    };
    let parsed = Url::parse(url);
    match parsed {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host_str().is_some() => Ok(u),
        Ok(u) if url.contains("://") => Err(format!(
            "{name} {url:?}: the scheme {:?} is not http or https",
            u.scheme()
        )),
        _ if !url.contains("://") => Err(format!(
            "{name} {url:?} has no scheme; write it as http://{url} (or https://)"
        )),
        Ok(_) => Err(format!("{name} {url:?} has no host")),
        Err(e) => Err(format!("{name} {url:?} is not a URL: {e}")),
    }
}

/// The six tools' names, offered by completions and listed by `--help`.
fn tool_name() -> impl clap::builder::TypedValueParser<Value = ToolName> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(ToolName::ALL.map(ToolName::as_str))
        .try_map(|name| name.parse::<ToolName>())
}

/// Every environment variable the `tool` subcommand's flags fall back to: while one is set,
/// [`ToolArgs::plain`] leaves the command line to clap. A test keeps it the subcommand's own.
pub(super) const TOOL_ENV: &[&str] = &[
    "PODHOST_WORKSPACE",
    "PODHOST_PASS_ENV",
    "PODHOST_ALLOW_WRITE",
    "PODHOST_LIMIT_OPEN_FILES",
    "PODHOST_LIMIT_PROCESSES",
    "PODHOST_LIMIT_FILE_SIZE_MB",
    "PODHOST_LIMIT_CPU_SECONDS",
    "PODHOST_LIMIT_MEMORY_MB",
    "PODHOST_CPU_WEIGHT",
    "PODHOST_SHELL",
    "PODHOST_CONFINE",
    "PODHOST_REQUIRE_CONFINEMENT",
    "PODHOST_DENY_NETWORK",
    "PODHOST_CONFINE_DENY",
    "PODHOST_TMP_DIR",
    "PODHOST_COMMAND_USER",
    "PODHOST_NAMESPACES",
    "PODHOST_SESSION_NETWORK",
    "PODHOST_SESSION_ALLOW_NETWORKS",
    "PODHOST_READ_ONLY_SYSTEM",
    "PODHOST_UID_POOL",
    "PODHOST_LANDLOCK_ABI_MAX",
    "PODHOST_ISOLATE",
];

impl ToolArgs {
    /// `podhost tool NAME --input JSON`, optionally with `--workspace DIR` (either flag also as
    /// `--flag=value`), and no variable of [`TOOL_ENV`] set (`is_set` says): what clap makes of
    /// it, without building the command line, which costs a one-shot call about a fifth of a
    /// millisecond, more than anything else it does before its command starts. `None` for any
    /// other command line (another flag, a repeated one, a value that could be taken for a
    /// flag, text that is not UTF-8): clap parses those, and says what is wrong with them. A
    /// test holds the two to the same answers.
    pub(super) fn plain(args: &[OsString], is_set: impl Fn(&str) -> bool) -> Option<ToolArgs> {
        let [_, tool, name, rest @ ..] = args else {
            return None;
        };
        if tool != "tool" || TOOL_ENV.iter().any(|v| is_set(v)) {
            return None;
        }
        let name = *ToolName::ALL.iter().find(|n| name == n.as_str())?;
        let (mut input, mut workspace) = (None, None);
        let mut rest = rest.iter();
        while let Some(arg) = rest.next() {
            let arg = arg.to_str()?;
            let (flag, value) = match arg.split_once('=') {
                Some((flag, value)) if flag.starts_with("--") => (flag, value),
                _ => {
                    let value = rest.next()?.to_str()?;
                    // clap takes `-` as a value, anything else led by `-` as a flag.
                    if value.starts_with('-') && value != "-" {
                        return None;
                    }
                    (arg, value)
                }
            };
            let slot = match flag {
                "--input" => &mut input,
                "--workspace" => &mut workspace,
                _ => return None,
            };
            if slot.is_some() || value.is_empty() {
                return None;
            }
            *slot = Some(value.to_owned());
        }
        Some(ToolArgs {
            name,
            input: input?,
            workspace: PathBuf::from(workspace.as_deref().unwrap_or(".")),
            env: LocalEnvArgs {
                pass_env: Vec::new(),
                allow_write: Vec::new(),
            },
            exec: super::exec::ExecArgs::defaults(),
        })
    }

    /// The plain configuration; pure.
    pub fn config(&self) -> ToolConfig {
        ToolConfig {
            name: self.name,
            input: self.input.clone(),
            workspace: self.workspace.clone(),
            env: self.env.settings(),
            exec: self.exec.settings(),
        }
    }
}

impl McpArgs {
    /// The plain configuration; pure. A credential given as a flag is refused (see
    /// `secrets_on_the_command_line`).
    pub fn config(&self) -> Result<McpConfig, String> {
        let problems =
            super::serve::secrets_on_the_command_line(&self.origins, self.token.as_ref(), None);
        if let Some(problem) = problems.into_iter().next() {
            return Err(problem);
        }
        Ok(McpConfig {
            workspace: self.workspace.clone(),
            listen: self.listen.clone(),
            token: self.token.clone(),
            token_file: self.token_file.clone(),
            http: self.http.limits(),
            env: self.env.settings(),
            exec: self.exec.settings(),
            max_background: self.background.max(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Cli, Command};
    use clap::Parser;
    use pretty_assertions::assert_eq;

    fn run_args(args: &[&str]) -> RunArgs {
        let mut argv = vec!["podhost", "run"];
        argv.extend_from_slice(args);
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Run(r) => *r,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn openai_variables_fill_in_what_no_flag_says() {
        let env = |name: &str| match name {
            "OPENAI_BASE_URL" => Some("http://127.0.0.1:11434/v1".to_owned()),
            "OPENAI_API_KEY" => Some("sk-x".to_owned()),
            _ => None,
        };
        let c = run_args(&["--model", "m", "go"]).config(env).unwrap();
        assert_eq!(
            (
                c.model.base_url.as_str(),
                c.model.base_url_from,
                c.model.api_key_env.as_deref()
            ),
            (
                "http://127.0.0.1:11434/v1",
                "OPENAI_BASE_URL",
                Some("OPENAI_API_KEY")
            )
        );
        let c = run_args(&[
            "--model",
            "m",
            "--base-url",
            "https://x/v1",
            "--api-key-env",
            "K",
            "-",
        ])
        .config(env)
        .unwrap();
        assert_eq!(
            (
                c.model.base_url_from,
                c.model.api_key_env.as_deref(),
                c.task
            ),
            ("--base-url", Some("K"), Task::Stdin)
        );
        let c = run_args(&["--model", "m", "go"]).config(|_| None).unwrap();
        assert_eq!(
            (
                c.model.base_url.as_str(),
                c.model.base_url_from,
                c.model.api_key_env
            ),
            (DEFAULT_BASE_URL, "default", None)
        );
    }

    #[test]
    fn settings_pass_through_and_bad_ones_are_usage_errors() {
        let c = run_args(&[
            "--model",
            "m",
            "--temperature",
            "0.5",
            "--max-tokens",
            "100",
            "--reasoning-effort",
            "high",
            "go",
        ])
        .config(|_| None)
        .unwrap();
        assert_eq!(
            Value::Object(c.model.generation),
            json!({"temperature": 0.5, "max_tokens": 100, "reasoning_effort": "high"})
        );
        for (args, error) in [
            (
                &["--model", "m", "--base-url", "localhost:11434/v1", "go"][..],
                "--base-url \"localhost:11434/v1\" has no scheme; write it as \
                 http://localhost:11434/v1 (or https://)",
            ),
            (
                &["--model", "m", "--base-url", "ftp://h/v1", "go"],
                "--base-url \"ftp://h/v1\": the scheme \"ftp\" is not http or https",
            ),
            (&["go"], "no model: pass --model NAME or set PODHOST_MODEL"),
            (
                &["--model", "m"],
                "no task: give it as an argument, or `-` to read it from stdin",
            ),
        ] {
            assert_eq!(
                run_args(args).config(|_| None).unwrap_err(),
                error,
                "{args:?}"
            );
        }
        assert!(Cli::try_parse_from(["podhost", "run", "--temperature", "3", "x"]).is_err());
    }
}
