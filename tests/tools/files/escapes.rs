//! Symlink, `..` and absolute-path escapes, for every file tool, and a symlinked root.

use super::*;
use podhost::floor::workspace::Workspace;
use pretty_assertions::assert_eq;

#[tokio::test]
async fn symlink_dotdot_and_absolute_escapes_are_refused_by_every_file_tool() {
    let ws = TestWorkspace::new();
    let outside = ws.dir.path().join("outside");
    fs::create_dir(&outside).unwrap();
    let secret = outside.join("secret.txt");
    fs::write(&secret, "top secret\n").unwrap();
    let outside = outside.canonicalize().unwrap();
    let secret = secret.canonicalize().unwrap();
    // An old access time: a read on this file system would move it (relatime).
    let long_ago = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    let set_atime = |p: &Path| {
        fs::File::options()
            .write(true)
            .open(p)
            .unwrap()
            .set_times(fs::FileTimes::new().set_accessed(long_ago))
            .unwrap();
    };
    set_atime(&secret);

    symlink(&secret, ws.root().join("final.txt")).unwrap();
    symlink(outside.join("nothing.txt"), ws.root().join("dangling.txt")).unwrap();
    symlink(&outside, ws.root().join("outdir")).unwrap();

    let escape = |display: &str, target: &Path| {
        failed(
            codes::PATH_DENIED,
            format!(
                "{display} resolves through a symlink to {}, outside the allowed directories \
                 (/workspace).",
                target.display()
            ),
        )
    };
    let outside_of = |display: &str| {
        failed(
            codes::PATH_DENIED,
            format!("{display} is outside the allowed directories (/workspace)."),
        )
    };
    let secret_display = secret.to_string_lossy().into_owned();
    let cases = [
        ("final.txt", escape("/workspace/final.txt", &secret)),
        (
            "dangling.txt",
            escape("/workspace/dangling.txt", &outside.join("nothing.txt")),
        ),
        (
            "outdir/secret.txt",
            escape("/workspace/outdir/secret.txt", &secret),
        ),
        (
            "outdir/new.txt",
            escape("/workspace/outdir/new.txt", &outside.join("new.txt")),
        ),
        ("../outside/secret.txt", outside_of("/outside/secret.txt")),
        (
            "/workspace/../outside/secret.txt",
            outside_of("/outside/secret.txt"),
        ),
        (secret_display.as_str(), outside_of(&secret_display)),
    ];
    for (path, refused) in &cases {
        let inputs = [
            (ToolName::Read, json!({"path": path})),
            (ToolName::Write, json!({"path": path, "content": "pwned\n"})),
            (
                ToolName::Edit,
                json!({"path": path, "old_string": "top secret", "new_string": "pwned"}),
            ),
        ];
        for (tool, input) in inputs {
            assert_eq!(&ws.run(tool, input).await, refused, "{tool} {path}");
        }
    }
    // Nothing outside was read, changed or created.
    let atime = fs::metadata(&secret).unwrap().accessed().unwrap();
    assert_eq!(fs::read_to_string(&secret).unwrap(), "top secret\n");
    assert_eq!(dir_names(&outside), vec!["secret.txt"]);
    // The check above means something only if reads move the access time here: prove it on a
    // twin file, and skip only on a file system that does not record reads (noatime).
    let twin = outside.join("twin.txt");
    fs::write(&twin, "twin\n").unwrap();
    set_atime(&twin);
    fs::read(&twin).unwrap();
    if fs::metadata(&twin).unwrap().accessed().unwrap() != long_ago {
        assert_eq!(atime, long_ago, "the outside file was read");
    } else {
        eprintln!("this file system does not record reads; the access-time check was skipped");
    }
}

#[tokio::test]
async fn a_workspace_whose_root_is_a_symlink_works() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real");
    fs::create_dir(&real).unwrap();
    let alias = dir.path().join("alias");
    symlink(&real, &alias).unwrap();
    let toolbox = Toolbox::new(
        Workspace::new(&alias, Some(Path::new("/workspace"))).unwrap(),
        executor(&alias),
    );
    let ws = TestWorkspace { dir, toolbox };
    assert_eq!(
        ws.run(
            ToolName::Write,
            json!({"path": "sub/a.txt", "content": "one\n"})
        )
        .await,
        completed(json!({"path": "sub/a.txt", "bytes": 4}))
    );
    assert_eq!(
        edit(
            &ws,
            json!({"path": "/workspace/sub/a.txt", "old_string": "one", "new_string": "two"})
        )
        .await,
        completed(json!({"path": "sub/a.txt", "replacements": 1, "snippet": "1\ttwo"}))
    );
    assert_eq!(
        read(&ws, json!({"path": "sub/a.txt"})).await,
        completed("1\ttwo")
    );
    assert_eq!(fs::read_to_string(real.join("sub/a.txt")).unwrap(), "two\n");
    // The host path of the alias, as a path the model might name, maps into the root too.
    let host = alias.join("sub/a.txt");
    assert_eq!(
        read(&ws, json!({"path": host.to_string_lossy()})).await,
        failed(
            codes::PATH_DENIED,
            format!(
                "{} is outside the allowed directories (/workspace).",
                host.display()
            )
        )
    );
}
