//! `edit`: exact matches, v2 failure texts, line endings, encodings, concurrency.

use super::*;
use podhost::tools::edit::MAX_EDIT_BYTES;
use pretty_assertions::assert_eq;

#[tokio::test]
async fn edit_replaces_one_exact_unique_match() {
    let ws = TestWorkspace::new();
    let path = put(&ws, "a.rs", "fn main() {\n    let x = 1;\n}\n");
    assert_eq!(
        edit(
            &ws,
            json!({"path": "a.rs", "old_string": "let x = 1;", "new_string": "let x = 2;"})
        )
        .await,
        completed(json!({"path": "a.rs", "replacements": 1,
                         "snippet": "1\tfn main() {\n2\t    let x = 2;\n3\t}"}))
    );
    assert_eq!(
        fs::read_to_string(&path).unwrap(),
        "fn main() {\n    let x = 2;\n}\n"
    );
    assert_eq!(dir_names(ws.root()), vec!["a.rs"]);
}

#[tokio::test]
async fn edit_failures_use_the_v2_codes_and_texts() {
    let ws = TestWorkspace::new();
    let path = put(&ws, "a.txt", "x = 1\nx = 1\nx = 1\ny = 2\n");
    let cases = [
        (
            json!({"path": "nope.txt", "old_string": "a", "new_string": "b"}),
            failed(codes::NOT_FOUND, "No file at /workspace/nope.txt"),
        ),
        (
            json!({"path": "a.txt", "old_string": "y", "new_string": "y"}),
            failed(codes::EDIT_NOOP, "old_string and new_string are identical"),
        ),
        (
            json!({"path": "a.txt", "old_string": "z = 3", "new_string": "z = 4"}),
            failed(
                codes::EDIT_NO_MATCH,
                "old_string was not found in /workspace/a.txt. Read the file and copy the text \
                 exactly.",
            ),
        ),
        (
            json!({"path": "a.txt", "old_string": "x = 1", "new_string": "x = 9"}),
            failed(
                codes::EDIT_NOT_UNIQUE,
                "old_string appears 3 times in /workspace/a.txt. Add surrounding context to make \
                 it unique, or set replace_all.",
            ),
        ),
        (
            json!({"path": "dir", "old_string": "a", "new_string": "b"}),
            failed(
                codes::NOT_A_FILE,
                "/workspace/dir is a directory, not a file. List it with glob (path \
                 /workspace/dir) or with bash (ls -la /workspace/dir).",
            ),
        ),
    ];
    fs::create_dir(ws.root().join("dir")).unwrap();
    for (input, outcome) in cases {
        assert_eq!(edit(&ws, input.clone()).await, outcome, "{input}");
    }
    assert_eq!(
        fs::read_to_string(&path).unwrap(),
        "x = 1\nx = 1\nx = 1\ny = 2\n"
    );
    assert_eq!(
        edit(
            &ws,
            json!({"path": "a.txt", "old_string": "x = 1", "new_string": "x = 9", "replace_all": true})
        )
        .await,
        completed(json!({"path": "a.txt", "replacements": 3,
                         "snippet": "1\tx = 9\n2\tx = 9\n3\tx = 9\n4\ty = 2"}))
    );
    assert_eq!(
        fs::read_to_string(&path).unwrap(),
        "x = 9\nx = 9\nx = 9\ny = 2\n"
    );
}

#[tokio::test]
async fn edit_keeps_the_mode_and_refuses_binaries_and_fifos() {
    let ws = TestWorkspace::new();
    let script = put(&ws, "run.sh", "#!/bin/sh\necho 1\n");
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    edit(
        &ws,
        json!({"path": "run.sh", "old_string": "echo 1", "new_string": "echo 2"}),
    )
    .await;
    assert_eq!(
        (fs::read_to_string(&script).unwrap(), mode_of(&script)),
        ("#!/bin/sh\necho 2\n".to_owned(), 0o755)
    );

    let bin = put(&ws, "blob", b"ab\0cd");
    assert_eq!(
        edit(
            &ws,
            json!({"path": "blob", "old_string": "ab", "new_string": "xy"})
        )
        .await,
        failed(
            codes::BINARY_FILE,
            "/workspace/blob looks binary (it has NUL bytes near the start); edit changes text \
             files only. Inspect it with bash: `file /workspace/blob` or `xxd /workspace/blob | \
             head`."
        )
    );
    assert_eq!(fs::read(bin).unwrap(), b"ab\0cd");
    nix::unistd::mkfifo(
        &ws.root().join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    assert_eq!(
        edit(
            &ws,
            json!({"path": "fifo", "old_string": "a", "new_string": "b"})
        )
        .await,
        failed(
            codes::NOT_A_FILE,
            "/workspace/fifo is a FIFO, not a regular file; the file tools only open regular \
             files."
        )
    );
}

#[tokio::test]
async fn edit_refuses_a_file_over_the_size_limit_before_reading_it() {
    let ws = TestWorkspace::new();
    let path = ws.root().join("huge.log");
    // Sparse: cheap to make, and reading it would take 16 MiB.
    fs::File::create(&path)
        .unwrap()
        .set_len(MAX_EDIT_BYTES + 1)
        .unwrap();
    assert_eq!(
        edit(
            &ws,
            json!({"path": "huge.log", "old_string": "a", "new_string": "b"})
        )
        .await,
        failed(
            codes::TOO_LARGE,
            "/workspace/huge.log is 16777217 bytes; edit works on files of at most 16 MiB \
             (16777216 bytes). Change it with bash instead (e.g. sed or a script)."
        )
    );
    assert_eq!(fs::metadata(&path).unwrap().len(), MAX_EDIT_BYTES + 1);
}

#[tokio::test]
async fn edit_matches_lf_strings_in_crlf_files_and_keeps_their_endings() {
    assert_eq!(
        edit_bytes(
            b"one\r\ntwo\r\nthree\r\n",
            "one\ntwo\n",
            "1\n2\n2.5\n",
            false
        )
        .await,
        (replaced(1), b"1\r\n2\r\n2.5\r\nthree\r\n".to_vec())
    );
    // Within one CRLF line, new lines take that line's ending.
    assert_eq!(
        edit_bytes(b"a\r\nbc\r\n", "b", "x\ny", false).await,
        (replaced(1), b"a\r\nx\r\nyc\r\n".to_vec())
    );
}

#[tokio::test]
async fn edit_replace_all_in_a_mixed_crlf_lf_file_keeps_each_lines_ending() {
    assert_eq!(
        edit_bytes(b"a=1\r\nb=1\nc=1\r\nd=1\nend", "=1\n", "=2\n# two\n", true).await,
        (
            replaced(4),
            b"a=2\r\n# two\r\nb=2\n# two\nc=2\r\n# two\r\nd=2\n# two\nend".to_vec()
        )
    );
    // A multi-line match over mixed endings: the k-th new newline takes the k-th old ending.
    assert_eq!(
        edit_bytes(b"x\r\ny\nz\r\n", "x\ny\nz\n", "X\nY\nZ\n", false).await,
        (replaced(1), b"X\r\nY\nZ\r\n".to_vec())
    );
}

#[tokio::test]
async fn edit_keeps_legacy_encodings_byte_for_byte() {
    // Latin-1: the edited text and every other byte, in Latin-1.
    assert_eq!(
        edit_bytes(
            b"caf\xe9 = 1\nna\xefve = 2\n\xbd\n",
            "naïve = 2",
            "naïve = deux, déjà",
            false
        )
        .await,
        (
            replaced(1),
            b"caf\xe9 = 1\nna\xefve = deux, d\xe9j\xe0\n\xbd\n".to_vec()
        )
    );
    // CP1252, CRLF, ASCII-only edit; bytes 0x80-0x9f and the undefined 0x81 survive.
    assert_eq!(
        edit_bytes(
            b"\x93q\x94 \x80 5\r\n\x81\x8d\x8f\x90\x9d\r\n",
            "5\n",
            "6 \u{20ac}\n7\n",
            false
        )
        .await,
        (
            replaced(1),
            b"\x93q\x94 \x80 6 \x80\r\n7\r\n\x81\x8d\x8f\x90\x9d\r\n".to_vec()
        )
    );
    // An ASCII line of a Latin-1 file takes new text in Latin-1, not UTF-8.
    assert_eq!(
        edit_bytes(b"caf\xe9\nplain\n", "plain", "pl\u{e2}in", false).await,
        (replaced(1), b"caf\xe9\npl\xe2in\n".to_vec())
    );
}

#[tokio::test]
async fn edit_refuses_text_a_legacy_file_cannot_hold() {
    let before = b"caf\xe9 = 1\n".to_vec();
    assert_eq!(
        edit_bytes(&before, "1", "\u{4e2d}", false).await,
        (
            failed(
                codes::ENCODING,
                "new_string has '\u{4e2d}' (U+4E2D), which /workspace/f.txt cannot hold there: \
                 that text is stored in windows-1252. The file was left unchanged. Use characters \
                 windows-1252 has, or convert the file to UTF-8 first (e.g. with iconv in bash)."
            ),
            before
        )
    );
}

#[tokio::test]
async fn edit_of_a_utf8_line_in_a_latin1_file_stays_utf8() {
    // The UTF-8 line reads as UTF-8, so it is edited as UTF-8; the Latin-1 line stays Latin-1.
    assert_eq!(
        edit_bytes(b"caf\xe9\nna\xc3\xafve\n", "naïve", "naïve²", false).await,
        (replaced(1), b"caf\xe9\nna\xc3\xafve\xc2\xb2\n".to_vec())
    );
    assert_eq!(
        edit_bytes(b"caf\xe9\nna\xc3\xafve\n", "café", "cafés", false).await,
        (replaced(1), b"caf\xe9s\nna\xc3\xafve\n".to_vec())
    );
    // Joining the two lines would make the UTF-8 part read differently: refused.
    let before = b"caf\xe9\nna\xc3\xafve\n".to_vec();
    assert_eq!(
        edit_bytes(&before, "é\nn", "é n", false).await,
        (
            failed(
                codes::ENCODING,
                "After this edit /workspace/f.txt would not read back as the edited text: the \
                 file mixes UTF-8 lines with windows-1252 lines, and the edit puts both on one \
                 line. The file was left unchanged. Edit those lines separately, or convert the \
                 file to one encoding first (e.g. with iconv in bash)."
            ),
            before
        )
    );
}

#[tokio::test]
async fn edit_keeps_boms_and_utf16() {
    assert_eq!(
        edit_bytes(b"\xEF\xBB\xBFa\r\nb\r\n", "a\nb", "x\ny\nz", false).await,
        (replaced(1), b"\xEF\xBB\xBFx\r\ny\r\nz\r\n".to_vec())
    );
    assert_eq!(
        edit_bytes(
            &utf16("le", "héllo\r\nwörld\r\n"),
            "wörld",
            "mönde\nzwei 😀",
            false
        )
        .await,
        (replaced(1), utf16("le", "héllo\r\nmönde\r\nzwei 😀\r\n"))
    );
    assert_eq!(
        edit_bytes(&utf16("be", "ä\nb\n"), "b", "ß", false).await,
        (replaced(1), utf16("be", "ä\nß\n"))
    );
    // A UTF-16 file with an unpaired surrogate cannot be written back unchanged.
    let mut broken = utf16("le", "ab");
    broken.extend_from_slice(&0xD800u16.to_le_bytes());
    assert_eq!(
        edit_bytes(&broken, "a", "c", false).await,
        (
            failed(
                codes::ENCODING,
                "/workspace/f.txt starts with a UTF-16 LE byte-order mark but is not valid UTF-16 \
                 LE, so edit could not write it back unchanged. Inspect it with bash (`xxd \
                 /workspace/f.txt | head`)."
            ),
            broken.clone()
        )
    );
}

#[tokio::test]
async fn sixteen_concurrent_edits_to_one_file_all_land() {
    let ws = TestWorkspace::new();
    let before: String = (0..16).map(|i| format!("marker-{i:02}\n")).collect();
    let path = put(&ws, "shared.txt", &before);
    let edits = (0..16).map(|i| {
        let ws = &ws;
        async move {
            edit(
                ws,
                json!({
                    "path": "shared.txt",
                    "old_string": format!("marker-{i:02}\n"),
                    "new_string": format!("done-{i:02} by edit {i}\n"),
                }),
            )
            .await
        }
    });
    let outcomes = tokio::time::timeout(
        Duration::from_secs(60),
        futures_util::future::join_all(edits),
    )
    .await
    .unwrap();
    // Each result shows its own change (the lines around it depend on which edits landed first).
    for (i, outcome) in outcomes.iter().enumerate() {
        let ToolOutcome::Completed { output } = outcome else {
            panic!("{outcome:?}")
        };
        assert_eq!(
            (&output["path"], &output["replacements"]),
            (&json!("shared.txt"), &json!(1))
        );
        let own = format!("{}\tdone-{i:02} by edit {i}", i + 1);
        assert!(
            output["snippet"].as_str().unwrap().contains(&own),
            "{output}"
        );
    }
    let after: String = (0..16)
        .map(|i| format!("done-{i:02} by edit {i}\n"))
        .collect();
    assert_eq!(fs::read_to_string(path).unwrap(), after);
    assert!(ws.toolbox.locks().is_empty());
}

#[tokio::test]
async fn edit_returns_the_changed_lines_in_context() {
    let ws = TestWorkspace::new();
    let text: String = (1..=40).map(|n| format!("line {n}\n")).collect();
    put(&ws, "long.txt", &text);
    // Three lines of context around the change, numbered as read numbers them.
    assert_eq!(
        edit(
            &ws,
            json!({"path": "long.txt", "old_string": "line 20\n", "new_string": "twenty\n20 bis\n"})
        )
        .await,
        completed(json!({"path": "long.txt", "replacements": 1, "snippet":
            "17\tline 17\n18\tline 18\n19\tline 19\n20\ttwenty\n21\t20 bis\n22\tline 21\n\
             23\tline 22\n24\tline 23"}))
    );
    // A deletion shows where the text was; the file's last line ends the snippet.
    assert_eq!(
        edit(
            &ws,
            json!({"path": "long.txt", "old_string": "line 40\n", "new_string": ""})
        )
        .await,
        completed(json!({"path": "long.txt", "replacements": 1, "snippet":
            "38\tline 37\n39\tline 38\n40\tline 39"}))
    );
}
