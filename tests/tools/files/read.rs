//! `read`: paging, the line format, encodings, and what is not a text file.

use super::*;
use podhost::tools::read::MAX_OUTPUT_BYTES;
use pretty_assertions::assert_eq;

#[tokio::test]
async fn read_pages_with_right_aligned_numbers_and_a_hint() {
    let ws = TestWorkspace::new();
    let file: String = (1..=12).map(|n| format!("line {n}\n")).collect();
    put(&ws, "a.txt", &file);

    assert_eq!(
        read(&ws, json!({"path": "a.txt", "offset": 8, "limit": 3})).await,
        completed(
            " 8\tline 8\n 9\tline 9\n10\tline 10\n… 2 more line(s); read again with offset 11."
        )
    );
    assert_eq!(
        read(&ws, json!({"path": "/workspace/a.txt", "offset": 11})).await,
        completed("11\tline 11\n12\tline 12")
    );
    assert_eq!(
        read(&ws, json!({"path": "a.txt", "limit": 1})).await,
        completed("1\tline 1\n… 11 more line(s); read again with offset 2.")
    );
    let all: Vec<String> = (1..=12).map(|n| format!("{n:>2}\tline {n}")).collect();
    assert_eq!(
        read(&ws, json!({"path": "a.txt"})).await,
        completed(all.join("\n"))
    );
}

#[tokio::test]
async fn read_the_default_limit_is_2000_lines() {
    let ws = TestWorkspace::new();
    let file: String = (1..=2001).map(|n| format!("{n}\n")).collect();
    put(&ws, "a.txt", &file);
    let mut expected: Vec<String> = (1..=2000).map(|n| format!("{n:>4}\t{n}")).collect();
    expected.push("… 1 more line(s); read again with offset 2001.".into());
    assert_eq!(
        read(&ws, json!({"path": "a.txt"})).await,
        completed(expected.join("\n"))
    );
}

#[tokio::test]
async fn read_without_a_final_newline_and_with_empty_lines() {
    let ws = TestWorkspace::new();
    put(&ws, "a.txt", "one\n\nthree");
    put(&ws, "nl.txt", "\n");
    assert_eq!(
        read(&ws, json!({"path": "a.txt"})).await,
        completed("1\tone\n2\t\n3\tthree")
    );
    assert_eq!(read(&ws, json!({"path": "nl.txt"})).await, completed("1\t"));
}

#[tokio::test]
async fn read_an_empty_file_and_an_offset_past_the_end() {
    let ws = TestWorkspace::new();
    put(&ws, "empty.txt", "");
    put(&ws, "bom-only.txt", b"\xEF\xBB\xBF");
    put(&ws, "three.txt", "a\nb\nc\n");
    put(&ws, "one.txt", "a");
    assert_eq!(
        read(&ws, json!({"path": "empty.txt"})).await,
        completed("/workspace/empty.txt is empty.")
    );
    assert_eq!(
        read(&ws, json!({"path": "bom-only.txt"})).await,
        completed("/workspace/bom-only.txt is empty.")
    );
    assert_eq!(
        read(&ws, json!({"path": "three.txt", "offset": 4})).await,
        completed("/workspace/three.txt has 3 lines; offset 4 is past its end.")
    );
    assert_eq!(
        read(&ws, json!({"path": "one.txt", "offset": 9})).await,
        completed("/workspace/one.txt has 1 line; offset 9 is past its end.")
    );
}

#[tokio::test]
async fn read_clips_lines_longer_than_2000_characters() {
    let ws = TestWorkspace::new();
    let wide = "é".repeat(2001);
    // Lines far longer than what is kept of them (8 KiB): one of 3-byte characters cut inside a
    // character, one of 1 MiB, and a line that starts like UTF-8 but has a Latin-1 byte past the
    // kept part: the whole line decides its decoding (windows-1252, as edit will see it).
    let cjk = format!("a{}", "中".repeat(5000));
    let huge = "z".repeat(1 << 20);
    let mut latin1 = b"\xc3\xa9".to_vec();
    latin1.extend_from_slice("b".repeat(9000).as_bytes());
    latin1.extend_from_slice(b"\xe9\n");
    let mut file = format!(
        "{}\r\n{wide}\n{}\r\n{cjk}\n{huge}\r\n",
        "x".repeat(2500),
        "y".repeat(2000)
    )
    .into_bytes();
    file.extend_from_slice(&latin1);
    file.extend_from_slice(b"short");
    put(&ws, "long.txt", file);
    assert_eq!(
        read(&ws, json!({"path": "long.txt"})).await,
        completed(format!(
            "1\t{}…\n2\t{}…\n3\t{}\n4\ta{}…\n5\t{}…\n6\t{}…\n7\tshort",
            "x".repeat(2000),
            "é".repeat(2000),
            "y".repeat(2000),
            "中".repeat(1999),
            "z".repeat(2000),
            "Ã©".to_owned() + &"b".repeat(1998),
        ))
    );
}

#[tokio::test]
async fn read_stops_at_the_answer_byte_cap_with_the_same_hint() {
    let ws = TestWorkspace::new();
    let line = "x".repeat(2000);
    let file: String = (1..=200).map(|_| format!("{line}\n")).collect();
    put(&ws, "wide.txt", &file);
    // Each line is counted as 4 digits (the widest number the default limit could show) + tab +
    // 2000 + newline = 2006 bytes: 130 lines fit in 256 KiB, the 131st does not.
    assert_eq!(MAX_OUTPUT_BYTES, 256 * 1024);
    let page = |from: u32, to: u32| -> Vec<String> {
        let width = to.to_string().len();
        (from..=to)
            .map(|n| format!("{n:>width$}\t{line}"))
            .collect()
    };
    let mut first = page(1, 130);
    first.push("… 70 more line(s); read again with offset 131.".into());
    let first = first.join("\n");
    assert!(first.len() <= MAX_OUTPUT_BYTES);
    assert_eq!(
        read(&ws, json!({"path": "wide.txt"})).await,
        completed(first)
    );
    assert_eq!(
        read(&ws, json!({"path": "wide.txt", "offset": 131})).await,
        completed(page(131, 200).join("\n"))
    );
}

// ---------------------------------------------------------------------------------------------
// Encodings and line endings.

#[tokio::test]
async fn read_decodes_legacy_boms_utf16_and_crlf() {
    let ws = TestWorkspace::new();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "latin1.txt",
            b"caf\xe9\nna\xefve \xbd\n".to_vec(),
            "1\tcafé\n2\tnaïve ½",
        ),
        (
            "cp1252.txt",
            b"\x93quoted\x94 \x80 \x85\r\n\x8a\x9e\r\n".to_vec(),
            "1\t“quoted” € …\n2\tŠž",
        ),
        (
            "utf8-bom.txt",
            b"\xEF\xBB\xBFh\xc3\xa9llo\r\nworld\r\n".to_vec(),
            "1\théllo\n2\tworld",
        ),
        (
            "utf16le.txt",
            utf16("le", "héllo\r\nwörld 😀\r\n"),
            "1\théllo\n2\twörld 😀",
        ),
        ("utf16be.txt", utf16("be", "ünï\ncode"), "1\tünï\n2\tcode"),
        (
            "crlf.txt",
            b"a\r\nb\r\n\r\nc".to_vec(),
            "1\ta\n2\tb\n3\t\n4\tc",
        ),
        // A UTF-8 file with one Latin-1 line: each line reads right.
        (
            "mixed.txt",
            b"na\xc3\xafve\ncaf\xe9\n".to_vec(),
            "1\tnaïve\n2\tcafé",
        ),
    ];
    for (name, bytes, expected) in cases {
        put(&ws, name, bytes);
        assert_eq!(
            read(&ws, json!({"path": name})).await,
            completed(expected),
            "{name}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// What is not a text file.

#[tokio::test]
async fn read_missing_directory_fifo_and_binary() {
    let ws = TestWorkspace::new();
    fs::create_dir(ws.root().join("dir")).unwrap();
    nix::unistd::mkfifo(
        &ws.root().join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let mut bin = b"\x7fELF\x02\x01".to_vec();
    bin.extend_from_slice(&[0; 16]);
    put(&ws, "a.out", &bin);

    assert_eq!(
        read(&ws, json!({"path": "nope.txt"})).await,
        failed(codes::NOT_FOUND, "No file at /workspace/nope.txt")
    );
    assert_eq!(
        read(&ws, json!({"path": "dir"})).await,
        failed(
            codes::NOT_A_FILE,
            "/workspace/dir is a directory, not a file. List it with glob (path /workspace/dir) \
             or with bash (ls -la /workspace/dir)."
        )
    );
    // Opening a FIFO for reading would block until a writer came; the call must return at once
    // (the helper fails the test after 30 s).
    assert_eq!(
        read(&ws, json!({"path": "fifo"})).await,
        failed(
            codes::NOT_A_FILE,
            "/workspace/fifo is a FIFO, not a regular file; the file tools only open regular \
             files."
        )
    );
    assert_eq!(
        read(&ws, json!({"path": "a.out"})).await,
        failed(
            codes::BINARY_FILE,
            "/workspace/a.out looks binary (it has NUL bytes near the start); read shows text \
             only. Inspect it with bash: `file /workspace/a.out` or `xxd /workspace/a.out | head`."
        )
    );
}

#[tokio::test]
async fn read_shows_a_late_nul_as_a_replacement_character() {
    let ws = TestWorkspace::new();
    let mut file = "a\n".repeat(5000).into_bytes();
    file.extend_from_slice(b"x\0y\n");
    put(&ws, "late-nul.txt", &file);
    assert_eq!(
        read(&ws, json!({"path": "late-nul.txt", "offset": 5001})).await,
        completed("5001\tx\u{FFFD}y")
    );
}

#[tokio::test]
async fn a_notebook_reads_as_its_cells_and_outputs_and_pages_like_text() {
    let ws = TestWorkspace::new();
    let nb = json!({
        "nbformat": 4, "nbformat_minor": 5,
        "metadata": {"language_info": {"name": "python"}},
        "cells": [
            {"cell_type": "markdown", "source": ["# Sales\n", "By month."]},
            {"cell_type": "code", "execution_count": 1, "source": ["import pandas as pd\n", "df.head()"],
             "outputs": [{"output_type": "execute_result", "execution_count": 1,
                          "data": {"text/plain": ["   month  total\n", "0  jan    10"]}}]}
        ]
    });
    put(&ws, "sales.ipynb", nb.to_string());
    assert_eq!(
        read(&ws, json!({"path": "sales.ipynb"})).await,
        completed(
            " 1\tJupyter notebook (python), 2 cell(s).\n 2\t\n 3\t[cell 1: markdown]\n 4\t# Sales\n \
             5\tBy month.\n 6\t\n 7\t[cell 2: code, execution 1]\n 8\timport pandas as pd\n \
             9\tdf.head()\n10\t[output: result]\n11\t   month  total\n12\t0  jan    10"
        )
    );
    assert_eq!(
        read(&ws, json!({"path": "sales.ipynb", "offset": 7, "limit": 2})).await,
        completed(
            "7\t[cell 2: code, execution 1]\n8\timport pandas as pd\n… 4 more line(s); read \
             again with offset 9."
        )
    );
    // Not a notebook after all: read as the text it is.
    put(&ws, "broken.ipynb", "{\"cells\": \n");
    assert_eq!(
        read(&ws, json!({"path": "broken.ipynb"})).await,
        completed("1\t{\"cells\": ")
    );
}

#[tokio::test]
async fn a_notebook_past_the_render_limit_reads_as_its_json() {
    use podhost::tools::read::notebook::MAX_NOTEBOOK_BYTES;
    let ws = TestWorkspace::new();
    let head = "{\"cells\": [], \"pad\": \"";
    let pad = "x".repeat(MAX_NOTEBOOK_BYTES as usize + 1 - head.len() - 3);
    let nb = format!("{head}{pad}\"}}\n");
    assert_eq!(nb.len() as u64, MAX_NOTEBOOK_BYTES + 1);
    put(&ws, "big.ipynb", &nb);
    let out = read(&ws, json!({"path": "big.ipynb"})).await;
    let ToolOutcome::Completed { output } = out else {
        panic!("{out:?}")
    };
    assert!(
        output
            .as_str()
            .unwrap()
            .starts_with("1\t{\"cells\": [], \"pad\": \"xxx"),
        "a notebook past the limit is not rendered"
    );
    // One byte less renders.
    let nb = format!("{head}{}\"}}\n", &pad[1..]);
    put(&ws, "big.ipynb", &nb);
    assert_eq!(
        read(&ws, json!({"path": "big.ipynb"})).await,
        completed("1\tJupyter notebook, 0 cell(s).")
    );
}
