//! Which settings came from the command line and which from the environment, so that an error
//! names what the user wrote: `--health-port` when the flag was given, `NYLORUN_HARNESS_HEALTH_PORT`
//! when the variable was.
//!
//! Invariant: a setting is named by its flag only when clap took its value from the command
//! line; every other case (the environment, a default) names the variable.

use std::collections::HashMap;
use std::ffi::OsString;

use clap::parser::ValueSource;
use clap::{ArgMatches, Command};

/// For the settings given as flags: their environment variable → their flag.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Origins {
    flags: HashMap<String, String>,
}

impl Origins {
    /// The settings of `cmd` (a subcommand's definition) given on the command line in `matches`.
    pub fn from_matches(cmd: &Command, matches: &ArgMatches) -> Origins {
        let mut flags = HashMap::new();
        for arg in cmd.get_arguments() {
            let (Some(env), Some(long)) = (arg.get_env(), arg.get_long()) else {
                continue;
            };
            if matches.value_source(arg.get_id().as_str()) == Some(ValueSource::CommandLine) {
                flags.insert(env.to_string_lossy().into_owned(), format!("--{long}"));
            }
        }
        Origins { flags }
    }

    /// How to name the setting whose variable is `var`.
    pub fn name(&self, var: &str) -> String {
        self.flags
            .get(var)
            .cloned()
            .unwrap_or_else(|| var.to_owned())
    }
}

/// A clap error about a value that came from an environment variable, reworded to name the
/// variable rather than the flag nobody passed; other errors as clap words them.
pub fn reword(err: &clap::Error, cmd: &Command, args: &[OsString]) -> String {
    let text = err.render().to_string();
    let Some(clap::error::ContextValue::String(shown)) =
        err.get(clap::error::ContextKind::InvalidArg)
    else {
        return text;
    };
    // `shown` is like `--max-running <MAX_RUNNING>`; find the argument in every subcommand.
    let mut commands = vec![cmd];
    commands.extend(cmd.get_subcommands());
    for c in commands {
        for arg in c.get_arguments() {
            let (Some(env), Some(long)) = (arg.get_env(), arg.get_long()) else {
                continue;
            };
            let flag = format!("--{long}");
            let named = shown == &flag || shown.starts_with(&format!("{flag} "));
            let on_command_line = args.iter().any(|a| {
                let a = a.to_string_lossy();
                a == flag || a.starts_with(&format!("{flag}="))
            });
            if named && !on_command_line && std::env::var_os(env).is_some() {
                return text.replace(&format!("'{shown}'"), &env.to_string_lossy());
            }
        }
    }
    text
}
