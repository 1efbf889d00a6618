//! What a command and the file tools can reach on disk: podhost's state and other sessions are
//! out of reach, their siblings are not, and links do not carry a secret into the workspace.

use podhost::exec::confine::Settings;
use podhost::tools::{ToolName, ToolOutcome, codes};
use pretty_assertions::assert_eq;
use serde_json::json;

use crate::{Host, SECRET, assert_still_works, bash, run};

#[tokio::test]
async fn bash_cannot_read_the_join_file_the_harness_root_or_the_database() {
    let host = Host::new();
    let tb = host.confined();
    let out = bash(
        &host,
        &tb,
        "cat ROOT/join; cat ROOT/harness/host-token; ls ROOT/harness; find ROOT/harness; \
         cat ROOT/data/podhost.db; ls ROOT/data; cat ROOT/harness/egress-ca.pem"
            .replace("ROOT", host.root.to_str().unwrap())
            .as_str(),
    )
    .await;
    assert_eq!(
        out,
        json!({
            "exitCode": 0,
            "stdout": "ROOT/harness\nCA BUNDLE\n",
            "stderr": "cat: ROOT/join: Permission denied\n\
                       cat: ROOT/harness/host-token: Permission denied\n\
                       ls: cannot open directory 'ROOT/harness': Permission denied\n\
                       find: ‘ROOT/harness’: Permission denied\n\
                       cat: ROOT/data/podhost.db: Permission denied\n\
                       ls: cannot open directory 'ROOT/data': Permission denied\n"
        })
    );
    assert_still_works(&tb).await;
}

#[tokio::test]
async fn bash_cannot_read_another_sessions_workspace_but_siblings_of_hidden_paths_stay() {
    let host = Host::new();
    let tb = host.confined();
    let out = bash(
        &host,
        &tb,
        "cat ../../b/workspace/notes.txt; ls ../../b/workspace; ls ..; \
         cat ROOT/sibling.txt; ls ROOT"
            .replace("ROOT", host.root.to_str().unwrap())
            .as_str(),
    )
    .await;
    // The root holds the data directory, hidden with its names: it cannot be listed (listing
    // it would list the data directory too), but what is in it can still be opened.
    assert_eq!(
        out,
        json!({
            "exitCode": 2,
            "stdout": "a sibling of the hidden paths\n",
            "stderr": "cat: ../../b/workspace/notes.txt: Permission denied\n\
                       ls: cannot open directory '../../b/workspace': Permission denied\n\
                       ls: cannot open directory '..': Permission denied\n\
                       ls: cannot open directory 'ROOT': Permission denied\n"
        })
    );
    assert_still_works(&tb).await;
}

#[tokio::test]
async fn the_system_is_read_only_and_tmp_is_private() {
    let host = Host::new();
    let tb = host.confined();
    let out = bash(
        &host,
        &tb,
        "touch /etc/podhost-confine-test; touch /tmp/podhost-confine-test; \
         f=$(mktemp); echo \"$f\" | sed 's/tmp\\..*/tmp.X/'; echo kept > \"$f\"; cat \"$f\"; \
         echo $TMPDIR; echo ok > out.txt; cat out.txt",
    )
    .await;
    assert_eq!(
        out,
        json!({
            "exitCode": 0,
            "stdout": "ROOT/data/tmp/a/tmp.X\nkept\nROOT/data/tmp/a\nok\n",
            "stderr": "touch: cannot touch '/etc/podhost-confine-test': Permission denied\n\
                       touch: cannot touch '/tmp/podhost-confine-test': Permission denied\n"
        })
    );
    assert_still_works(&tb).await;
}

/// The file tools' own Landlock layer, beneath the path check: a hidden directory inside the
/// workspace passes the path check (it is under the root) and is still out of reach.
#[tokio::test]
async fn file_tools_are_confined_even_where_the_path_check_allows() {
    let host = Host::new();
    let private = host.ws.join("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::write(private.join("key.txt"), SECRET).unwrap();
    let tb = host.toolbox(host.confinement(&Settings::default()).hide(&private));
    assert_eq!(
        run(&tb, ToolName::Read, json!({"path": "private/key.txt"})).await,
        ToolOutcome::failed(
            codes::ERROR,
            "Could not open /workspace/private/key.txt: Permission denied (os error 13)"
        )
    );
    let write = run(
        &tb,
        ToolName::Write,
        json!({"path": "private/new.txt", "content": "x"}),
    )
    .await;
    assert!(
        matches!(&write, ToolOutcome::Failed { message, .. } if message.contains("Permission denied")),
        "{write:?}"
    );
    assert!(!private.join("new.txt").exists());
    let grep = run(&tb, ToolName::Grep, json!({"pattern": SECRET})).await;
    assert!(
        !serde_json::to_string(&grep).unwrap().contains("key.txt"),
        "{grep:?}"
    );
    assert_still_works(&tb).await;
}

#[tokio::test]
async fn a_symlink_to_a_secret_is_refused_by_read_and_unreadable_in_bash() {
    let host = Host::new();
    let tb = host.confined();
    let out = bash(
        &host,
        &tb,
        &format!(
            "ln -s {0}/harness/host-token token; ln -s {0}/data/sessions/b/workspace other; \
             cat token; cat other/notes.txt",
            host.root.display()
        ),
    )
    .await;
    assert_eq!(
        out,
        json!({
            "exitCode": 1,
            "stdout": "",
            "stderr": "cat: token: Permission denied\ncat: other/notes.txt: Permission denied\n"
        })
    );
    let read = run(&tb, ToolName::Read, json!({"path": "token"})).await;
    assert_eq!(
        read,
        ToolOutcome::failed(
            codes::PATH_DENIED,
            format!(
                "/workspace/token resolves through a symlink to {}/harness/host-token, outside \
                 the allowed directories (/workspace).",
                host.root.display()
            )
        )
    );
    assert_still_works(&tb).await;
}

/// Landlock checks the path a file is opened by, so a hard link inside the workspace to a
/// secret would be readable. Making one needs `REFER` (ABI ≥ 2) on the secret's directory, which
/// nothing grants — and ABI 1 refuses every link across directories — so `ln` fails with EXDEV.
/// (`fs.protected_hardlinks` does not help: the secret belongs to the command's own user.)
#[tokio::test]
async fn a_hard_link_to_a_secret_cannot_be_made() {
    let host = Host::new();
    for abi in [None, Some(1)] {
        let tb = host.toolbox(host.confinement(&Settings {
            abi_max: abi,
            ..Settings::default()
        }));
        let out = bash(
            &host,
            &tb,
            &format!(
                "ln {0}/data/sessions/b/workspace/notes.txt notes; \
                 ln {0}/harness/host-token token; ln {0}/data/podhost.db db",
                host.root.display()
            ),
        )
        .await;
        assert_eq!(
            out,
            json!({
                "exitCode": 1,
                "stdout": "",
                "stderr": "ln: failed to create hard link 'notes' => \
                           'ROOT/data/sessions/b/workspace/notes.txt': Invalid cross-device link\n\
                           ln: failed to create hard link 'token' => \
                           'ROOT/harness/host-token': Invalid cross-device link\n\
                           ln: failed to create hard link 'db' => \
                           'ROOT/data/podhost.db': Invalid cross-device link\n"
            }),
            "ABI cap {abi:?}"
        );
        assert_eq!(
            run(&tb, ToolName::Read, json!({"path": "notes"})).await,
            ToolOutcome::failed(codes::NOT_FOUND, "No file at /workspace/notes")
        );
        assert_still_works(&tb).await;
    }
}

/// The limit of a path-based sandbox, stated as a test: a hard link that already exists in the
/// workspace (made outside the sandbox) names the secret by a workspace path, and both the path
/// check and Landlock allow it. podhost's own state never gets such a link: only a process
/// outside the sandbox could make one.
#[tokio::test]
async fn a_hard_link_made_outside_the_sandbox_is_reachable() {
    let host = Host::new();
    std::fs::hard_link(host.other_ws.join("notes.txt"), host.ws.join("notes")).unwrap();
    let tb = host.confined();
    assert_eq!(
        run(&tb, ToolName::Read, json!({"path": "notes"})).await,
        ToolOutcome::completed(format!("1\t{SECRET}"))
    );
}

/// `ln -s / root`, then search through it: the grep and glob tools refuse the escaping path and
/// do not follow the link in a walk; bash's grep follows it and meets Landlock (the host's root
/// holds the data directory, so it cannot even be listed).
#[tokio::test]
async fn a_symlink_to_the_root_leads_nowhere_secret() {
    let host = Host::new();
    let tb = host.confined();
    let out = bash(
        &host,
        &tb,
        &format!(
            "ln -s / root; grep -rl {SECRET} root{}/ 2>&1 | sort",
            host.root.display()
        ),
    )
    .await;
    assert_eq!(
        out,
        json!({
            "exitCode": 0,
            "stdout": "grep: rootROOT/: Permission denied\n",
            "stderr": ""
        })
    );
    let denied = |tool: &str| {
        ToolOutcome::failed(
            codes::PATH_DENIED,
            format!(
                "/workspace/root resolves through a symlink to /, outside the allowed \
                 directories (/workspace).{tool}"
            ),
        )
    };
    assert_eq!(
        run(
            &tb,
            ToolName::Grep,
            json!({"pattern": SECRET, "path": "root"})
        )
        .await,
        denied("")
    );
    assert_eq!(
        run(
            &tb,
            ToolName::Glob,
            json!({"pattern": "**", "path": "root"})
        )
        .await,
        denied("")
    );
    let everything = run(&tb, ToolName::Grep, json!({"pattern": SECRET})).await;
    assert!(
        !serde_json::to_string(&everything)
            .unwrap()
            .contains("notes"),
        "{everything:?}"
    );
    assert_still_works(&tb).await;
}

/// Without Landlock (a kernel without it), the hard link above succeeds and the read tool
/// reads the other session's secret: what Landlock is for, stated as a test.
#[tokio::test]
async fn without_landlock_a_hard_link_reaches_another_sessions_secret() {
    let host = Host::new();
    let tb = host.toolbox(host.confinement(&Settings {
        abi_max: Some(0),
        ..Settings::default()
    }));
    let out = bash(
        &host,
        &tb,
        &format!(
            "ln {}/data/sessions/b/workspace/notes.txt notes",
            host.root.display()
        ),
    )
    .await;
    assert_eq!(out, json!({"exitCode": 0, "stdout": "", "stderr": ""}));
    assert_eq!(
        run(&tb, ToolName::Read, json!({"path": "notes"})).await,
        ToolOutcome::completed(format!("1\t{SECRET}"))
    );
}

/// A pod hides only the contents of its state: the directories above stay listable (`ls /`
/// works), and so do the names in the harness root; no file in it can be opened.
#[tokio::test]
async fn in_a_pod_the_root_stays_listable_and_harness_files_stay_closed() {
    let host = Host::new();
    let tb = host.toolbox(
        podhost::exec::Confinement::default()
            .hide_contents(&host.harness)
            .hide_contents(&host.join)
            .allow_read(&host.harness.join("egress-ca.pem")),
    );
    let out = bash(
        &host,
        &tb,
        &format!(
            "ls {0}; ls {0}/harness; cat {0}/harness/host-token {0}/join; \
             cat {0}/harness/egress-ca.pem",
            host.root.display()
        ),
    )
    .await;
    assert_eq!(
        out,
        json!({
            "exitCode": 0,
            "stdout": "data\nharness\njoin\nsibling.txt\negress-ca.pem\nhost-token\nCA BUNDLE\n",
            "stderr": "cat: ROOT/harness/host-token: Permission denied\n\
                       cat: ROOT/join: Permission denied\n"
        })
    );
    assert_still_works(&tb).await;
}

/// The file tools run inside podhost: `/proc/self` is podhost itself. They cannot name it, and
/// a symlink to it in the workspace is refused.
#[tokio::test]
async fn file_tools_cannot_reach_podhosts_own_proc_files() {
    let host = Host::new();
    let tb = host.confined();
    std::os::unix::fs::symlink("/proc/self/environ", host.ws.join("env")).unwrap();
    assert_eq!(
        run(&tb, ToolName::Read, json!({"path": "/proc/self/environ"})).await,
        ToolOutcome::failed(
            codes::PATH_DENIED,
            "/proc/self/environ is outside the allowed directories (/workspace)."
        )
    );
    let via_link = run(&tb, ToolName::Read, json!({"path": "env"})).await;
    assert!(
        matches!(&via_link, ToolOutcome::Failed { code, .. } if code == codes::PATH_DENIED),
        "{via_link:?}"
    );
    assert_still_works(&tb).await;
}

/// With a command user, the file tools act as that user too: what `write` creates belongs to it
/// (so its commands can change it), and a file only root may read stays closed to `read`.
#[tokio::test]
// The lock only keeps other tests' nobody processes away; no task of this runtime takes it.
#[allow(clippy::await_holding_lock)]
async fn file_tools_act_as_the_command_user() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let _nobody = crate::nobody_lock();
    let host = Host::new();
    let _ = host.open_to_everyone();
    let private = host.ws.join("root-only.txt");
    std::fs::write(&private, SECRET).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o600)).unwrap();
    let tb = host.toolbox(host.confinement(&Settings {
        user: Some(podhost::exec::protocol::CommandUser {
            uid: crate::NOBODY,
            gid: crate::NOBODY,
        }),
        ..Settings::default()
    }));
    let written = run(
        &tb,
        ToolName::Write,
        json!({"path": "made.txt", "content": "by the tool\n"}),
    )
    .await;
    assert!(written.is_completed(), "{written:?}");
    let meta = std::fs::metadata(host.ws.join("made.txt")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (crate::NOBODY, crate::NOBODY));
    let out = bash(
        &host,
        &tb,
        "echo and the command >> made.txt && cat made.txt; cat root-only.txt",
    )
    .await;
    assert_eq!(
        out,
        json!({
            "exitCode": 1,
            "stdout": "by the tool\nand the command\n",
            "stderr": "cat: root-only.txt: Permission denied\n"
        })
    );
    assert_eq!(
        run(&tb, ToolName::Read, json!({"path": "root-only.txt"})).await,
        ToolOutcome::failed(
            codes::ERROR,
            "Could not open /workspace/root-only.txt: Permission denied (os error 13)"
        )
    );
}
