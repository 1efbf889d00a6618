//! The environment of commands in local use: the user's own, `HOME` included, minus every
//! variable that looks like a credential (unless passed with `--env`), never the model's key;
//! `HOME` readable but writable only where allowed; real developer tools work.

use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::harness::{KEY, output, podhost, run_cmd};
use crate::openai_fake::{FakeModel, Reply};

/// Whether this kernel confines commands (Landlock); the fallback is checked otherwise.
fn confined() -> bool {
    podhost::exec::Confinement::default().level().is_confined()
}

/// `podhost tool bash` with `command` in `workspace`; its output object.
async fn bash(
    workspace: &std::path::Path,
    command: &str,
    setup: impl FnOnce(&mut tokio::process::Command),
) -> Value {
    let input = json!({"command": command}).to_string();
    let mut cmd = podhost(&["tool", "bash", "--input", &input, "--workspace"]);
    cmd.arg(workspace);
    setup(&mut cmd);
    let out = output(cmd).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let outcome: Value = serde_json::from_str(&out.stdout).unwrap();
    outcome["output"].clone()
}

#[tokio::test]
async fn commands_inherit_the_environment_but_no_credential() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let home = dir.path().join("home");
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&ws).unwrap();
    let out = bash(&ws, "env | sort", |cmd| {
        cmd.env("HOME", &home)
            .env("MY_SETTING", "kept")
            .env("LANG", "C.UTF-8")
            .env("OPENAI_API_KEY", "sk-never-1")
            .env("GH_TOKEN", "gh-passed-2")
            .env("aws_secret_access_key", "aws-never-3")
            .env("DATABASE_URL", "postgres://u:pw-never-4@h/db")
            .env("NPM_CONFIG__AUTH", "npm-never-5")
            .args(["--env", "GH_TOKEN"]);
    })
    .await;
    let env: Vec<(String, String)> = out["stdout"]
        .as_str()
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let get = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    assert_eq!(
        [get("HOME"), get("MY_SETTING"), get("GH_TOKEN"), get("PATH")],
        [
            Some(home.to_str().unwrap()),
            Some("kept"),
            Some("gh-passed-2"),
            Some(std::env::var("PATH").unwrap().as_str())
        ]
    );
    let text = out["stdout"].as_str().unwrap();
    for secret in ["sk-never-1", "aws-never-3", "pw-never-4", "npm-never-5"] {
        assert!(
            !text.contains(secret),
            "{secret} reached the command:\n{text}"
        );
    }
}

#[tokio::test]
async fn the_models_key_never_reaches_a_command_of_a_run() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some(KEY)).await;
    fake.push([
        Reply::call(
            "c1",
            "bash",
            json!({"command": "env; cat /proc/$PPID/environ | tr '\\0' '\\n'"}),
        ),
        Reply::text("ok"),
    ]);
    let mut cmd = run_cmd(&fake, dir.path(), &["--json", "go"]);
    cmd.env("OPENAI_API_KEY", "sk-openai-9");
    let out = output(cmd).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let finished = out
        .events()
        .into_iter()
        .find(|e| e["type"] == "tool_call.finished")
        .unwrap();
    let stdout = finished["output"]["stdout"].as_str().unwrap().to_owned();
    assert!(stdout.contains("PATH="), "{stdout}");
    assert!(
        !stdout.contains(KEY) && !stdout.contains("sk-openai-9"),
        "{stdout}"
    );
    assert!(!out.stdout.contains(KEY));
    let started = &out.events()[0];
    assert_eq!(started["withheld_env"], json!(["OPENAI_API_KEY"]));
}

#[tokio::test]
async fn home_is_readable_and_writable_only_where_allowed() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let home = dir.path().join("home");
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(home.join(".gitconfig"), "[user]\n\tname = From Home\n").unwrap();
    // Commands may write the system's temporary directory, and this checkout (hence HOME here)
    // may be under it: a private one keeps HOME outside everything writable.
    let tmp = dir.path().join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let with_home = |cmd: &mut tokio::process::Command| {
        cmd.env("HOME", &home).env("PODHOST_TMP_DIR", &tmp);
    };
    let read = bash(&ws, "git config --global user.name", with_home).await;
    assert_eq!(read["stdout"], "From Home\n");
    let write = bash(&ws, "git config --global core.editor vi", with_home).await;
    // Never into the project, as a HOME = workspace would.
    assert!(!ws.join(".gitconfig").exists());
    if confined() {
        assert_eq!(write["exitCode"], 255, "{write}");
        assert!(
            std::fs::read_to_string(home.join(".gitconfig")).unwrap()
                == "[user]\n\tname = From Home\n"
        );
    } else {
        println!(
            "no Landlock on this kernel: HOME is writable; checked only that the workspace got no .gitconfig"
        );
        assert_eq!(write["exitCode"], 0);
    }
    let allowed = bash(
        &ws,
        "git config --global core.editor vi && git config --global core.editor",
        |cmd| {
            cmd.env("HOME", &home)
                .env("PODHOST_TMP_DIR", &tmp)
                .arg("--allow-write")
                .arg(&home);
        },
    )
    .await;
    assert_eq!(
        (&allowed["exitCode"], &allowed["stdout"]),
        (&json!(0), &json!("vi\n"))
    );
}

#[tokio::test]
async fn git_cargo_and_npm_work_in_a_local_run() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let ws = dir.path().join("project");
    std::fs::create_dir_all(&ws).unwrap();
    let fake = FakeModel::start("fake-model", Some(KEY)).await;
    let commands = [
        "git init -q && git -c user.email=t@example.com -c user.name=T commit -q --allow-empty -m first && git log --format=%s",
        "cargo new -q --vcs none hello && cd hello && cargo run -q --offline",
        "npm init -y >/dev/null && npm pkg get name",
    ];
    fake.push(
        commands
            .iter()
            .enumerate()
            .map(|(i, c)| {
                Reply::call(
                    &format!("c{i}"),
                    "bash",
                    json!({"command": c, "timeout": 300}),
                )
            })
            .chain([Reply::text("done")]),
    );
    let mut cmd = run_cmd(&fake, &ws, &["--json", "go"]);
    // The test's own cargo points its builds elsewhere; a user's shell would not.
    cmd.env_remove("CARGO_TARGET_DIR");
    let out = output(cmd).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let results: Vec<(Value, Value)> = out
        .events()
        .into_iter()
        .filter(|e| e["type"] == "tool_call.finished")
        .map(|e| {
            (
                e["output"]["exitCode"].clone(),
                e["output"]["stdout"].clone(),
            )
        })
        .collect();
    assert_eq!(
        results,
        [
            (json!(0), json!("first\n")),
            (json!(0), json!("Hello, world!\n")),
            (json!(0), json!("\"project\"\n")),
        ],
        "{}",
        out.stdout
    );
}

/// Whether local use gets a read-only system here (a mount namespace: podhost is root, or
/// unprivileged user namespaces are allowed); says so when it does not.
fn read_only_system() -> bool {
    let ns = podhost::exec::probe::probe_host(crate::support::supervisor_bin()).namespaces;
    if !ns.any() {
        println!("no namespaces here: local use has no read-only system (Landlock alone)");
    }
    ns.any()
}

/// Outside the workspace, its temporary directory and each --allow-write directory, a local
/// command cannot change even the metadata of a file its own user owns: `chmod`, `chown`,
/// `touch` and writes fail with EROFS (HOME stays readable); inside them everything works. With
/// `PODHOST_READ_ONLY_SYSTEM=off`, Landlock alone keeps writes out, not metadata changes.
#[tokio::test]
async fn the_system_is_read_only_outside_the_writable_places() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (home, ws, tmp, allowed) = (
        dir.path().join("home"),
        dir.path().join("ws"),
        dir.path().join("tmp"),
        dir.path().join("allowed"),
    );
    for d in [&home, &ws, &tmp, &allowed] {
        std::fs::create_dir_all(d).unwrap();
    }
    let owned = home.join("mine.txt");
    std::fs::write(&owned, "mine\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&owned, std::fs::Permissions::from_mode(0o644)).unwrap();
    let uid = nix::unistd::geteuid().as_raw();
    let command = format!(
        "cat {f}; for op in 'chmod 600' 'chown {uid}' 'touch'; do $op {f} 2>&1 | sed 's/.*: //'; done; \
         echo w > in-ws && echo w > \"$TMPDIR/t\" && echo w > {a}/x && echo writable; \
         python3 -c 'import pty; pty.openpty(); print(\"pty ok\")'; echo > /dev/null && echo devices ok",
        f = owned.display(),
        a = allowed.display(),
    );
    let setup = |off: bool| {
        let (home, tmp, allowed) = (home.clone(), tmp.clone(), allowed.clone());
        move |cmd: &mut tokio::process::Command| {
            cmd.env("HOME", &home)
                .env("PODHOST_TMP_DIR", &tmp)
                .arg("--allow-write")
                .arg(&allowed);
            if off {
                cmd.env("PODHOST_READ_ONLY_SYSTEM", "off");
            }
        }
    };
    let out = bash(&ws, &command, setup(false)).await;
    let tail = "writable\npty ok\ndevices ok\n";
    if read_only_system() {
        assert_eq!(
            out,
            json!({
                "exitCode": 0,
                "stdout": format!(
                    "mine\nRead-only file system\nRead-only file system\nRead-only file system\n{tail}"
                ),
                "stderr": ""
            })
        );
        let mode = std::fs::metadata(&owned).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o644, "the file's mode changed");
    }
    // Without it: Landlock refuses the write (`touch` opens for writing), not the mode change.
    let out = bash(&ws, &command, setup(true)).await;
    assert_eq!(out["exitCode"], json!(0), "{out}");
    if confined() {
        let mode = std::fs::metadata(&owned).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "Landlock alone stops no chmod: {out}");
    }
    assert!(out["stdout"].as_str().unwrap().ends_with(tail), "{out}");
}
