//! What operators meet around `podhost serve`: the version and revision, completions and man
//! pages, configuration errors that name what was given, and the log settings.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use pretty_assertions::assert_eq;
use serde_json::Value;

use crate::harness::KillOnDrop;
use crate::support::podhost_bin;

/// Runs podhost with `args` and only `env` (plus PATH); answers (exit code, stdout, stderr).
fn run(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(podhost_bin())
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("PODHOST_DATA", dir.path().join("data"))
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn the_version_names_the_revision_it_was_built_from() {
    let want = format!(
        "podhost {} ({})\n",
        env!("CARGO_PKG_VERSION"),
        env!("BUILD_GIT_REVISION")
    );
    assert_eq!(run(&["--version"], &[]), (Some(0), want, String::new()));
    let rev = env!("BUILD_GIT_REVISION");
    assert!(
        rev == "unknown" || (rev.len() == 40 && rev.chars().all(|c| c.is_ascii_hexdigit())),
        "{rev}"
    );
}

#[test]
fn completions_and_man_pages_come_from_the_command_line_definitions() {
    let (code, script, err) = run(&["completions", "bash"], &[]);
    assert_eq!((code, err.as_str()), (Some(0), ""));
    assert!(script.contains("_podhost()"), "{script}");
    assert!(script.contains("--max-running"), "{script}");
    let (code, _, err) = run(&["completions", "tcsh"], &[]);
    assert_eq!(code, Some(2));
    assert!(
        err.starts_with("error: invalid value 'tcsh' for '<SHELL>'"),
        "{err}"
    );

    let dir = tempfile::tempdir().unwrap();
    let man = dir.path().join("man1");
    let (code, listed, err) = run(&["man", "--dir", man.to_str().unwrap()], &[]);
    assert_eq!((code, err.as_str()), (Some(0), ""));
    assert_eq!(listed.lines().count(), 9, "{listed}");
    let page = std::fs::read_to_string(man.join("podhost-serve.1")).unwrap();
    assert!(page.starts_with(".ie \\n(.g .ds Aq \\(aq"), "{page}");
    assert!(page.contains("PODHOST_MAX_RUNNING"), "{page}");
}

/// Help reads like rg's: wrapped at 100 columns, each subcommand's line short (detail in its long
/// help), `run`'s flags under headings, and the local fronts' help without the settings only a
/// host serving others uses (which they still accept).
#[test]
fn help_is_wrapped_grouped_and_shows_each_front_its_own_settings() {
    for args in [
        &["--help"][..],
        &["run", "--help"],
        &["run", "-h"],
        &["serve", "--help"],
        &["pod", "--help"],
        &["mcp", "--help"],
        &["tool", "--help"],
    ] {
        let (code, help, _) = run(args, &[("COLUMNS", "300")]);
        assert_eq!(code, Some(0), "{args:?}");
        let long: Vec<_> = help.lines().filter(|l| l.chars().count() > 100).collect();
        assert!(long.is_empty(), "{args:?}: {long:#?}");
    }
    let (_, top, _) = run(&["--help"], &[]);
    let run_line = top
        .lines()
        .find(|l| l.trim_start().starts_with("run "))
        .unwrap();
    assert_eq!(
        run_line.trim(),
        "run          Run one agent task in a local workspace against an OpenAI-compatible model"
    );
    let (_, run_help, _) = run(&["run", "-h"], &[]);
    for heading in ["Model:", "Commands:", "Confinement:", "TLS:"] {
        assert!(
            run_help.lines().any(|l| l == heading),
            "{heading}: {run_help}"
        );
    }
    let host_only = [
        "--limit-memory-mb",
        "--cpu-weight",
        "--namespaces",
        "--session-network",
        "--session-allow-networks",
        "--uid-pool",
    ];
    for front in ["run", "tool", "mcp"] {
        let (_, help, _) = run(&[front, "--help"], &[]);
        for flag in host_only {
            assert!(!help.contains(flag), "{front} shows {flag}");
        }
        assert!(help.contains("--limit-open-files"), "{front}: {help}");
    }
    let (_, serve_help, _) = run(&["serve", "--help"], &[]);
    for flag in host_only {
        assert!(serve_help.contains(flag), "serve hides {flag}");
    }
    assert!(!serve_help.contains("--read-only-system"), "{serve_help}");
    // Hidden is not refused: a local front accepts (and ignores) a host's setting.
    let (code, _, err) = run(
        &[
            "tool",
            "read",
            "--input",
            r#"{"path":"none"}"#,
            "--cpu-weight",
            "5",
        ],
        &[],
    );
    assert!(!err.contains("unexpected argument"), "{code:?} {err}");
}

/// Completion scripts offer what `--help` shows: the six tools' names (bash and zsh), and no
/// hidden flag (the test-only ones, an environment variable's alias).
#[test]
fn completions_offer_the_tools_and_hide_what_help_hides() {
    for shell in ["bash", "zsh", "fish"] {
        let (code, script, err) = run(&["completions", shell], &[]);
        assert_eq!((code, err.as_str()), (Some(0), ""), "{shell}");
        for hidden in [
            "landlock-abi-max",
            "isolate",
            "ssl-cert-file",
            "nylorun-harness-root",
        ] {
            assert!(!script.contains(hidden), "{shell} offers --{hidden}");
        }
        // clap's fish script completes flags only, not a positional's values.
        if shell != "fish" {
            for tool in ["read", "write", "edit", "grep", "glob"] {
                assert!(script.contains(tool), "{shell} lacks {tool}");
            }
        }
    }
    let (_, bash, _) = run(&["completions", "bash"], &[]);
    let tool_opts = bash
        .lines()
        .skip_while(|l| !l.contains("podhost__subcmd__tool)"))
        .find(|l| l.trim_start().starts_with("opts="))
        .unwrap();
    assert!(
        tool_opts.contains("bash read write edit grep glob"),
        "{tool_opts}"
    );
    assert!(!tool_opts.contains("--uid-pool"), "{tool_opts}");
}

/// `podhost man` without `--dir` prints podhost.1 to stdout, as `rg --generate man` does, and
/// writes nothing where it runs; `--help` lists it.
#[test]
fn man_without_a_directory_prints_the_page_and_writes_no_file() {
    let cwd = tempfile::tempdir().unwrap();
    let out = Command::new(podhost_bin())
        .arg("man")
        .current_dir(cwd.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let page = String::from_utf8(out.stdout).unwrap();
    assert!(page.starts_with(".ie \\n(.g .ds Aq \\(aq"), "{page}");
    assert!(page.contains(".TH podhost 1"), "{page}");
    let left: Vec<_> = std::fs::read_dir(cwd.path()).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
    let (code, help, _) = run(&["--help"], &[]);
    assert_eq!(code, Some(0));
    assert!(
        help.lines().any(|l| l.trim_start().starts_with("man ")),
        "{help}"
    );
}

#[test]
fn a_bad_setting_is_named_as_it_was_given_and_is_all_that_is_printed() {
    // From the environment: the variable.
    let (code, out, err) = run(&["serve"], &[("PODHOST_MAX_RUNNING", "0")]);
    assert_eq!(
        (code, out.as_str(), err.lines().next().unwrap_or_default()),
        (
            Some(2),
            "",
            "error: invalid value '0' for PODHOST_MAX_RUNNING: 0 is not in 1..=100000"
        )
    );
    // As a flag: the flag.
    let (code, _, err) = run(&["serve", "--max-running", "0"], &[]);
    assert_eq!(
        (code, err.lines().next().unwrap_or_default()),
        (
            Some(2),
            "error: invalid value '0' for '--max-running <MAX_RUNNING>': 0 is not in 1..=100000"
        )
    );
    // podhost's own checks, before any log line.
    let (code, _, err) = run(&["serve"], &[("PODHOST_LISTEN", "nowhere")]);
    assert_eq!(
        (code, err.as_str()),
        (
            Some(2),
            "podhost serve: invalid serve configuration:\n  PODHOST_LISTEN: \"nowhere\" is not \
             host:port (such as 127.0.0.1:8080 or [::]:8080)\n"
        )
    );
    let (code, _, err) = run(&["serve", "--listen", "nowhere"], &[]);
    assert_eq!(
        (code, err.as_str()),
        (
            Some(2),
            "podhost serve: invalid serve configuration:\n  --listen: \"nowhere\" is not \
             host:port (such as 127.0.0.1:8080 or [::]:8080)\n"
        )
    );
    let (code, _, err) = run(
        &["pod", "--ca-file", "/nonexistent/ca.pem"],
        &[("NYLORUN_SANDBOX_ID", "sbx")],
    );
    assert_eq!(
        (code, err.as_str()),
        (
            Some(2),
            "podhost pod: invalid pod configuration:\n  NYLORUN_POD_UID: is not set\n  \
             NYLORUN_SANDBOX_JOIN_FILE: is not set\n  NYLORUN_HARNESS_URL: is not set\n  \
             NYLORUN_GATES_URL: is not set\n"
        )
    );
}

/// Starts `podhost serve` on a free loopback port with `env`; answers the child and its stderr
/// lines up to the one that says where it listens.
fn serve_until_listening(env: &[(&str, &str)]) -> (KillOnDrop, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(podhost_bin())
        .arg("serve")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("PODHOST_LISTEN", "127.0.0.1:0")
        .env("PODHOST_DATA", dir.path().join("data"))
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let child = KillOnDrop(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = Vec::new();
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let done = line.contains("podhost serve listening on");
            lines.push(line);
            if done {
                break;
            }
        }
        let _ = tx.send(lines);
    });
    let lines = rx.recv_timeout(Duration::from_secs(20)).unwrap();
    // The directory must outlive the server; it is small.
    std::mem::forget(dir);
    (child, lines)
}

#[test]
fn log_settings_that_cannot_be_used_are_warned_about() {
    let (_child, lines) =
        serve_until_listening(&[("RUST_LOG", "podhost=loud"), ("PODHOST_LOG_FORMAT", "yaml")]);
    let text = lines.join("\n");
    assert!(
        text.contains("RUST_LOG \"podhost=loud\" is not a valid log filter"),
        "{text}"
    );
    assert!(
        text.contains("PODHOST_LOG_FORMAT \"yaml\" is neither json nor text; writing text"),
        "{text}"
    );
    // The start-up log names the version and the revision.
    assert!(
        text.contains(&format!(
            "podhost {} ({})",
            env!("CARGO_PKG_VERSION"),
            env!("BUILD_GIT_REVISION")
        )),
        "{text}"
    );
}

#[test]
fn json_log_lines_carry_their_fields_at_the_top_level() {
    let (_child, lines) = serve_until_listening(&[("PODHOST_LOG_FORMAT", "json")]);
    let parsed: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let start = parsed
        .iter()
        .find(|v| v["revision"].is_string())
        .unwrap_or_else(|| panic!("no start-up line: {lines:?}"));
    assert_eq!(start["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(start["revision"], env!("BUILD_GIT_REVISION"));
    assert_eq!(start["level"], "INFO");
    assert!(start.get("fields").is_none(), "{start}");
    let listening = parsed.last().unwrap();
    assert!(
        listening["addr"]
            .as_str()
            .unwrap()
            .starts_with("127.0.0.1:")
    );
    assert_eq!(listening["max_running"], 32);
}

/// A command line is readable by every process on the machine (`/proc/<pid>/cmdline`), a
/// session's commands included where no PID namespace hides podhost: the credential, and a store
/// URL that holds a password, are refused as flags and taken from the environment.
#[test]
fn secrets_on_the_command_line_are_refused_and_taken_from_the_environment() {
    let (code, _, err) = run(&["serve", "--token", "s3cret-token"], &[]);
    assert_eq!(
        (code, err.as_str()),
        (
            Some(2),
            "podhost serve: invalid serve configuration:\n  --token: a credential on the command \
             line is readable by every process on this machine; give it in PODHOST_TOKEN or a \
             file (--token-file)\n"
        )
    );
    let (code, _, err) = run(
        &["serve", "--store", "postgres://app:hunter2@db.example/p"],
        &[],
    );
    assert_eq!(
        (code, err.as_str()),
        (
            Some(2),
            "podhost serve: invalid serve configuration:\n  --store: the URL holds a password, \
             and a command line is readable by every process on this machine; give the URL in \
             PODHOST_STORE\n"
        )
    );
    let (code, _, err) = run(&["mcp", "--token", "s3cret-token"], &[]);
    assert_eq!(
        (code, err.as_str()),
        (
            Some(2),
            "podhost mcp: --token: a credential on the command line is readable by every process \
             on this machine; give it in PODHOST_TOKEN or a file (--token-file)\n"
        )
    );
    // From the environment, the same values pass this check (the store then fails to connect,
    // naming the variable, without the password).
    let (code, _, err) = run(
        &["serve"],
        &[
            (
                "PODHOST_STORE",
                "postgres://app:hunter2@127.0.0.1:9/p?connect_timeout=1",
            ),
            ("PODHOST_TOKEN", "s3cret-token"),
        ],
    );
    assert_ne!(code, Some(0));
    assert!(!err.contains("command line"), "{err}");
    assert!(
        !err.contains("hunter2") && !err.contains("s3cret-token"),
        "{err}"
    );
}

/// A Kubernetes Secret's file, as its volume lays it out: the path is a link into the volume's
/// `..data`, the file is 0644 (the default mode) and the mount is read-only. serve starts,
/// warns that every user may read the credential and how to set the mode, and serves with it;
/// with the mode the warning asks for (0440, read through the pod's fsGroup) it does not warn.
#[test]
fn a_credential_from_a_kubernetes_secret_volume_is_served_with() {
    if !nix::unistd::geteuid().is_root() {
        println!("not root: no read-only bind mount to lay a Secret volume out (not exercised)");
        return;
    }
    let (warned, answers) = serve_from_a_secret_volume(0o644);
    assert!(warned, "no warning about the credential file's mode");
    assert_eq!(answers, ("200".to_owned(), "401".to_owned()));
    let (warned, answers) = serve_from_a_secret_volume(0o440);
    assert!(!warned, "a warning about the mode the warning recommends");
    assert_eq!(answers, ("200".to_owned(), "401".to_owned()));
}

/// Starts serve with its credential in a Secret-like volume whose file has `mode`; answers
/// whether it warned about the mode, and the health route's status with the right and a wrong
/// credential.
fn serve_from_a_secret_volume(mode: u32) -> (bool, (String, String)) {
    use std::io::BufRead;
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let volume = dir.path().join("secret");
    std::fs::create_dir_all(volume.join("..data")).unwrap();
    std::fs::write(volume.join("..data/token"), "k8s-secret-token\n").unwrap();
    std::fs::set_permissions(
        volume.join("..data/token"),
        std::fs::Permissions::from_mode(mode),
    )
    .unwrap();
    std::os::unix::fs::symlink("..data/token", volume.join("token")).unwrap();
    let script = format!(
        "mount --bind {v} {v} && mount -o remount,bind,ro {v} && exec \"$0\" serve",
        v = volume.display()
    );
    let mut child = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .arg(podhost_bin())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("PODHOST_DATA", dir.path().join("data"))
        .env("PODHOST_LISTEN", "127.0.0.1:0")
        .env("PODHOST_TOKEN_FILE", volume.join("token"))
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let mut warned = false;
    let addr = loop {
        let Some(Ok(line)) = lines.next() else {
            let _ = child.kill();
            panic!("serve stopped before it listened (warned: {warned})");
        };
        warned |= line.contains("the credential file is readable by every user")
            && line.contains("defaultMode, 0440 with the pod's fsGroup");
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest.split_whitespace().next().unwrap().to_owned();
        }
    };
    let health = |token: &str| {
        Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-H"])
            .arg(format!("Authorization: Bearer {token}"))
            .arg(format!("http://{addr}/healthz"))
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap()
    };
    let answers = (health("k8s-secret-token"), health("wrong"));
    let _ = child.kill();
    let _ = child.wait();
    (warned, answers)
}
