//! `write`: parents, modes, atomic replacement, symlinks inside the workspace.

use super::*;
use pretty_assertions::assert_eq;

#[tokio::test]
async fn write_creates_parents_and_reports_utf8_bytes() {
    let ws = TestWorkspace::new();
    assert_eq!(
        ws.run(
            ToolName::Write,
            json!({"path": "a/b/c.txt", "content": "héllo\n"})
        )
        .await,
        completed(json!({"path": "a/b/c.txt", "bytes": 7}))
    );
    let path = ws.root().join("a/b/c.txt");
    assert_eq!(fs::read_to_string(&path).unwrap(), "héllo\n");
    assert_eq!(mode_of(&path), 0o644);
    assert_eq!(dir_names(&ws.root().join("a/b")), vec!["c.txt"]);
    // Written as given: no line-ending conversion, an empty content is an empty file.
    ws.run(
        ToolName::Write,
        json!({"path": "/workspace/crlf.txt", "content": "a\r\nb"}),
    )
    .await;
    assert_eq!(fs::read(ws.root().join("crlf.txt")).unwrap(), b"a\r\nb");
    assert_eq!(
        ws.run(ToolName::Write, json!({"path": "e.txt", "content": ""}))
            .await,
        completed(json!({"path": "e.txt", "bytes": 0}))
    );
    assert_eq!(fs::read(ws.root().join("e.txt")).unwrap(), b"");
}

#[tokio::test]
async fn write_keeps_the_mode_of_an_existing_file() {
    let ws = TestWorkspace::new();
    let path = put(&ws, "run.sh", "#!/bin/sh\n");
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    let secret = put(&ws, "key", "k");
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).unwrap();
    ws.run(
        ToolName::Write,
        json!({"path": "run.sh", "content": "#!/bin/sh\necho hi\n"}),
    )
    .await;
    ws.run(ToolName::Write, json!({"path": "key", "content": "k2"}))
        .await;
    assert_eq!(
        (fs::read_to_string(&path).unwrap(), mode_of(&path)),
        ("#!/bin/sh\necho hi\n".to_owned(), 0o755)
    );
    assert_eq!(mode_of(&secret), 0o600);
}

#[tokio::test]
async fn write_replaces_atomically() {
    let ws = TestWorkspace::new();
    let a = "a".repeat(1 << 20);
    let b = "b".repeat(1 << 20);
    let path = put(&ws, "big.txt", &a);
    let before = fs::metadata(&path).unwrap().ino();

    // A reader holding the old file keeps the whole old content: the file was replaced, not
    // truncated and rewritten in place.
    let mut old = fs::File::open(&path).unwrap();
    ws.run(ToolName::Write, json!({"path": "big.txt", "content": b}))
        .await;
    let mut seen = String::new();
    std::io::Read::read_to_string(&mut old, &mut seen).unwrap();
    assert!(seen == a, "the old handle saw a changed file");
    assert_ne!(fs::metadata(&path).unwrap().ino(), before);

    // Readers racing with writes see one whole version or the other, never a mix or a prefix.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (done, path, a, b) = (done.clone(), path.clone(), a.clone(), b.clone());
        std::thread::spawn(move || {
            let mut reads = 0u32;
            while !done.load(std::sync::atomic::Ordering::SeqCst) || reads == 0 {
                let content = fs::read_to_string(&path).unwrap();
                assert!(content == a || content == b, "a torn read");
                reads += 1;
            }
            reads
        })
    };
    for i in 0..20 {
        let content = if i % 2 == 0 { &a } else { &b };
        let outcome = ws
            .run(
                ToolName::Write,
                json!({"path": "big.txt", "content": content}),
            )
            .await;
        assert!(outcome.is_completed(), "{outcome:?}");
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(reader.join().unwrap() > 0);
    // No temporary file is left next to it.
    assert_eq!(dir_names(ws.root()), vec!["big.txt"]);
}

#[tokio::test]
async fn write_goes_through_a_symlink_inside_the_workspace() {
    let ws = TestWorkspace::new();
    put(&ws, "real/target.txt", "old\n");
    symlink("real/target.txt", ws.root().join("link.txt")).unwrap();
    symlink("real/later.txt", ws.root().join("dangling.txt")).unwrap();
    assert_eq!(
        ws.run(
            ToolName::Write,
            json!({"path": "link.txt", "content": "new\n"})
        )
        .await,
        completed(json!({"path": "link.txt", "bytes": 4}))
    );
    assert_eq!(
        fs::read_to_string(ws.root().join("real/target.txt")).unwrap(),
        "new\n"
    );
    assert_eq!(
        fs::read_link(ws.root().join("link.txt")).unwrap(),
        Path::new("real/target.txt")
    );
    // A dangling link that stays inside: its target is created.
    ws.run(
        ToolName::Write,
        json!({"path": "dangling.txt", "content": "made\n"}),
    )
    .await;
    assert_eq!(
        fs::read_to_string(ws.root().join("real/later.txt")).unwrap(),
        "made\n"
    );
    assert!(
        fs::symlink_metadata(ws.root().join("dangling.txt"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    // Edits go through too, and share the target's lock.
    assert_eq!(
        ws.run(
            ToolName::Edit,
            json!({"path": "link.txt", "old_string": "new", "new_string": "newer"})
        )
        .await,
        completed(json!({"path": "link.txt", "replacements": 1, "snippet": "1\tnewer"}))
    );
    assert_eq!(
        fs::read_to_string(ws.root().join("real/target.txt")).unwrap(),
        "newer\n"
    );
}

#[tokio::test]
async fn write_refuses_directories_and_reports_what_blocks_a_parent() {
    let ws = TestWorkspace::new();
    fs::create_dir(ws.root().join("dir")).unwrap();
    put(&ws, "file.txt", "x");
    nix::unistd::mkfifo(
        &ws.root().join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    assert_eq!(
        ws.run(ToolName::Write, json!({"path": "dir", "content": "x"}))
            .await,
        failed(
            codes::NOT_A_FILE,
            "/workspace/dir is a directory; write needs the path of a file."
        )
    );
    assert_eq!(
        ws.run(
            ToolName::Write,
            json!({"path": "/workspace", "content": "x"})
        )
        .await,
        failed(
            codes::NOT_A_FILE,
            "/workspace is a directory; write needs the path of a file."
        )
    );
    assert_eq!(
        ws.run(ToolName::Write, json!({"path": "fifo", "content": "x"}))
            .await,
        failed(
            codes::NOT_A_FILE,
            "/workspace/fifo is a FIFO, not a regular file; the file tools only open regular \
             files."
        )
    );
    assert_eq!(
        ws.run(
            ToolName::Write,
            json!({"path": "file.txt/sub/new.txt", "content": "x"})
        )
        .await,
        failed(
            codes::WRITE_FAILED,
            "Could not create the directory /workspace/file.txt/sub: Not a directory (os error \
             20)."
        )
    );
    assert_eq!(
        ws.run(
            ToolName::Write,
            json!({"path": "file.txt/new.txt", "content": "x"})
        )
        .await,
        failed(
            codes::WRITE_FAILED,
            "Could not create the directory /workspace/file.txt: File exists (os error 17); a \
             file of that name is in the way."
        )
    );
    assert_eq!(dir_names(ws.root()), vec!["dir", "fifo", "file.txt"]);
}
