//! `grep` and `glob` through the toolbox: output text of every mode, ignore policy, binaries,
//! text shaping, budgets and caps, symlink escapes, bad input, and a 200k-file tree.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::{Duration, SystemTime};

use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use podhost::floor::workspace::Workspace;
use podhost::tools::{ToolName, ToolOutcome, Toolbox, codes, glob, grep};

use crate::support::{TestWorkspace, executor};

/// Writes `content` at `rel` under `root`, creating directories.
fn put(root: &Path, rel: &str, content: impl AsRef<[u8]>) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, content).unwrap();
}

/// Sets a file's modification time to `secs` after the epoch.
fn touch(root: &Path, rel: &str, secs: u64) {
    fs::File::options()
        .write(true)
        .open(root.join(rel))
        .unwrap()
        .set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
        .unwrap();
}

async fn completed(ws: &TestWorkspace, tool: ToolName, input: Value) -> String {
    match ws.run(tool, input.clone()).await {
        ToolOutcome::Completed { output } => output.as_str().expect("string output").to_owned(),
        other => panic!("{tool} {input} did not complete: {other:?}"),
    }
}

async fn grep(ws: &TestWorkspace, input: Value) -> String {
    completed(ws, ToolName::Grep, input).await
}

async fn glob(ws: &TestWorkspace, input: Value) -> String {
    completed(ws, ToolName::Glob, input).await
}

/// The `(code, message)` of a failed call.
async fn failure(ws: &TestWorkspace, tool: ToolName, input: Value) -> (String, String) {
    match ws.run(tool, input.clone()).await {
        ToolOutcome::Failed { code, message, .. } => (code, message),
        other => panic!("{tool} {input} did not fail: {other:?}"),
    }
}

fn failed(code: &str, message: &str) -> (String, String) {
    (code.to_owned(), message.to_owned())
}

fn more_matches(lines: &str) -> String {
    format!("{lines}\n{}", grep::MORE_HINT)
}

/// A small project: sources, docs, a hidden file.
fn project() -> TestWorkspace {
    let ws = TestWorkspace::new();
    let r = ws.root();
    put(
        r,
        "src/main.rs",
        "fn main() {\n    let needle = 1;\n    println!(\"{needle}\");\n}\n",
    );
    put(r, "src/lib/util.rs", "pub fn Needle() {}\n");
    put(r, "docs/guide.md", "# Guide\nThe needle is here.\n");
    put(r, ".env.example", "NEEDLE=1\nneedle=2\n");
    ws
}

// ---- grep: output modes -------------------------------------------------------------------------

#[tokio::test]
async fn grep_content_mode_prints_path_line_text_sorted_by_path() {
    let ws = project();
    assert_eq!(
        grep(&ws, json!({"pattern": "needle"})).await,
        [
            ".env.example:2:needle=2",
            "docs/guide.md:2:The needle is here.",
            "src/main.rs:2:    let needle = 1;",
            "src/main.rs:3:    println!(\"{needle}\");",
        ]
        .join("\n")
    );
}

#[tokio::test]
async fn grep_files_with_matches_lists_each_file_once() {
    let ws = project();
    assert_eq!(
        grep(
            &ws,
            json!({"pattern": "needle", "output_mode": "files_with_matches"})
        )
        .await,
        ".env.example\ndocs/guide.md\nsrc/main.rs"
    );
}

#[tokio::test]
async fn grep_count_mode_counts_matching_lines_per_file() {
    let ws = project();
    assert_eq!(
        grep(
            &ws,
            json!({"pattern": "needle", "output_mode": "count", "ignore_case": true})
        )
        .await,
        ".env.example:2\ndocs/guide.md:1\nsrc/lib/util.rs:1\nsrc/main.rs:2\n6 matching lines in 4 files."
    );
}

#[tokio::test]
async fn grep_ignore_case_matches_every_case() {
    let ws = project();
    assert_eq!(
        grep(
            &ws,
            json!({"pattern": "NEEDLE\\b", "ignore_case": true, "path": "/workspace/src"})
        )
        .await,
        "src/lib/util.rs:1:pub fn Needle() {}\nsrc/main.rs:2:    let needle = 1;\nsrc/main.rs:3:    println!(\"{needle}\");"
    );
}

#[tokio::test]
async fn grep_context_separates_groups_within_and_between_files() {
    let ws = TestWorkspace::new();
    put(
        ws.root(),
        "src/a.txt",
        "one\nalpha two\nalpha three\nfour\nfive\nsix\nseven\neight\nalpha nine\nten\n",
    );
    put(ws.root(), "b.txt", "x\nalpha\n");
    assert_eq!(
        grep(&ws, json!({"pattern": "alpha", "context": 1})).await,
        [
            "b.txt-1-x",
            "b.txt:2:alpha",
            "--",
            "src/a.txt-1-one",
            "src/a.txt:2:alpha two",
            "src/a.txt:3:alpha three",
            "src/a.txt-4-four",
            "--",
            "src/a.txt-8-eight",
            "src/a.txt:9:alpha nine",
            "src/a.txt-10-ten",
        ]
        .join("\n")
    );
}

#[tokio::test]
async fn grep_multiline_matches_across_lines() {
    let ws = TestWorkspace::new();
    put(ws.root(), "a.rs", "struct A {\n    x: u8,\n}\nstruct B;\n");
    assert_eq!(
        grep(
            &ws,
            json!({"pattern": "struct A \\{.*?\\}", "multiline": true})
        )
        .await,
        "a.rs:1:struct A {\na.rs:2:    x: u8,\na.rs:3:}"
    );
    // Without multiline a line terminator in the pattern cannot match, and says so.
    let (code, message) = failure(&ws, ToolName::Grep, json!({"pattern": "A \\{\\n"})).await;
    assert_eq!(code, codes::INVALID_INPUT);
    assert!(message.starts_with("Invalid regex: "), "{message}");
    assert_eq!(
        grep(
            &ws,
            json!({"pattern": "A \\{\\n", "multiline": true, "output_mode": "count"})
        )
        .await,
        "a.rs:1\n1 matching line in 1 file."
    );
}

#[tokio::test]
async fn grep_glob_filters_by_name_or_by_path_from_the_search_root() {
    let ws = project();
    put(ws.root(), "src/lib/notes.md", "needle\n");
    let files = |glob: &str, path: &str| json!({"pattern": "(?i)needle", "glob": glob, "path": path, "output_mode": "files_with_matches"});
    assert_eq!(
        grep(&ws, files("*.rs", "/workspace")).await,
        "src/lib/util.rs\nsrc/main.rs"
    );
    assert_eq!(grep(&ws, files("lib/*.rs", "src")).await, "src/lib/util.rs");
    // `*` stays within one directory; `**` crosses.
    assert_eq!(grep(&ws, files("*/*.md", ".")).await, "docs/guide.md");
    assert_eq!(
        grep(&ws, files("**/*.md", ".")).await,
        "docs/guide.md\nsrc/lib/notes.md"
    );
    assert_eq!(
        grep(&ws, files("{*.md,.env*}", ".")).await,
        ".env.example\ndocs/guide.md\nsrc/lib/notes.md"
    );
}

#[tokio::test]
async fn grep_nothing_found_says_so() {
    let ws = project();
    assert_eq!(
        grep(&ws, json!({"pattern": "haystack"})).await,
        grep::NO_MATCHES
    );
    assert_eq!(
        grep(&ws, json!({"pattern": "needle", "glob": "*.py"})).await,
        "No matches."
    );
}

#[tokio::test]
async fn grep_a_file_path_searches_just_that_file_even_when_ignored() {
    let ws = project();
    put(ws.root(), ".gitignore", "*.log\n");
    put(ws.root(), "run.log", "needle in a log\n");
    assert_eq!(
        grep(&ws, json!({"pattern": "needle", "path": "src/main.rs"})).await,
        "src/main.rs:2:    let needle = 1;\nsrc/main.rs:3:    println!(\"{needle}\");"
    );
    assert_eq!(
        grep(
            &ws,
            json!({"pattern": "needle", "path": "/workspace/run.log"})
        )
        .await,
        "run.log:1:needle in a log"
    );
}

#[tokio::test]
async fn grep_paths_outside_the_workspace_root_are_shown_as_display_paths() {
    let dir = tempfile::tempdir().unwrap();
    let (root, skills) = (dir.path().join("ws"), dir.path().join("skills"));
    put(&root, "a.md", "needle\n");
    put(&skills, "s/SKILL.md", "a needle\n");
    let ws = Workspace::new(&root, Some(Path::new("/workspace")))
        .unwrap()
        .with_root(&skills, Some(Path::new("/skills")), false);
    let tb = Toolbox::new(ws, executor(&root));
    let cancel = CancellationToken::new();
    let input = |path: &str| serde_json::from_value(json!({"pattern": "needle", "path": path}));
    assert_eq!(
        grep::search(&tb, input("/skills").unwrap(), &cancel),
        ToolOutcome::completed("/skills/s/SKILL.md:1:a needle")
    );
    assert_eq!(
        grep::search(&tb, input("/workspace").unwrap(), &cancel),
        ToolOutcome::completed("a.md:1:needle")
    );
}

// ---- grep: what is searched ---------------------------------------------------------------------

#[tokio::test]
async fn grep_honours_gitignore_and_dot_ignore_without_a_git_directory() {
    let ws = project();
    let r = ws.root();
    put(r, ".gitignore", "build/\n*.log\n!keep.log\n");
    put(r, "src/.ignore", "generated.rs\n");
    put(r, "build/out.txt", "needle\n");
    put(r, "src/deep/build/x.txt", "needle\n");
    put(r, "app.log", "needle\n");
    put(r, "keep.log", "needle\n");
    put(r, "src/generated.rs", "needle\n");
    let files = json!({"pattern": "needle", "output_mode": "files_with_matches"});
    assert_eq!(
        grep(&ws, files.clone()).await,
        ".env.example\ndocs/guide.md\nkeep.log\nsrc/main.rs"
    );
    // Searching a subdirectory still applies the ignore files above it (up to the root).
    assert_eq!(
        grep(
            &ws,
            json!({"pattern": "needle", "path": "src", "output_mode": "files_with_matches"})
        )
        .await,
        "src/main.rs"
    );
    let mut all = files;
    all["include_ignored"] = json!(true);
    assert_eq!(
        grep(&ws, all).await,
        ".env.example\napp.log\nbuild/out.txt\ndocs/guide.md\nkeep.log\nsrc/deep/build/x.txt\nsrc/generated.rs\nsrc/main.rs"
    );
}

#[tokio::test]
async fn grep_searches_a_named_ignored_directory_with_its_own_rules() {
    let ws = TestWorkspace::new();
    put(ws.root(), ".gitignore", "vendor/\n");
    put(ws.root(), "vendor/lib/a.c", "needle\n");
    put(ws.root(), "vendor/lib/.gitignore", "*.o\n");
    put(ws.root(), "vendor/lib/a.o", "needle\n");
    assert_eq!(grep(&ws, json!({"pattern": "needle"})).await, "No matches.");
    assert_eq!(
        grep(&ws, json!({"pattern": "needle", "path": "vendor"})).await,
        "vendor/lib/a.c:1:needle"
    );
}

#[tokio::test]
async fn grep_honours_git_info_exclude_and_never_searches_dot_git() {
    let ws = project();
    let r = ws.root();
    put(r, ".git/info/exclude", "secret.txt\n");
    put(r, ".git/config", "needle = true\n");
    put(r, ".git/objects/ab/cdef", "needle\n");
    put(r, "sub/.git", "gitdir: ../.git/worktrees/sub\nneedle\n");
    put(r, "secret.txt", "needle\n");
    let files = json!({"pattern": "needle", "output_mode": "files_with_matches"});
    assert_eq!(
        grep(&ws, files.clone()).await,
        ".env.example\ndocs/guide.md\nsrc/main.rs"
    );
    let mut all = files;
    all["include_ignored"] = json!(true);
    assert_eq!(
        grep(&ws, all).await,
        ".env.example\ndocs/guide.md\nsecret.txt\nsrc/main.rs"
    );
}

#[tokio::test]
async fn grep_skips_binary_files_even_after_early_matches() {
    let ws = TestWorkspace::new();
    put(ws.root(), "text.txt", "needle\n");
    put(ws.root(), "blob.bin", b"needle\0\x01\x02needle\n");
    // A match in the first buffer, the NUL far past it: the file is still binary.
    let mut late = b"needle\n".to_vec();
    late.extend(std::iter::repeat_n(b'x', 300_000));
    late.extend(b"\0\n");
    put(ws.root(), "late.dat", late);
    assert_eq!(
        grep(&ws, json!({"pattern": "needle"})).await,
        "text.txt:1:needle"
    );
    assert_eq!(
        grep(&ws, json!({"pattern": "needle", "path": "blob.bin"})).await,
        "No matches."
    );
}

#[tokio::test]
async fn grep_decodes_utf16_files_with_a_byte_order_mark() {
    let ws = TestWorkspace::new();
    let mut bytes = vec![0xFF, 0xFE];
    for u in "first\nthe needle\n".encode_utf16() {
        bytes.extend(u.to_le_bytes());
    }
    put(ws.root(), "wide.txt", bytes);
    assert_eq!(
        grep(&ws, json!({"pattern": "needle"})).await,
        "wide.txt:2:the needle"
    );
}

#[tokio::test]
async fn grep_clips_long_lines_and_makes_invalid_utf8_valid() {
    let ws = TestWorkspace::new();
    let long = format!("needle {}\n", "y".repeat(5000));
    put(ws.root(), "long.txt", &long);
    put(ws.root(), "latin1.txt", b"caf\xe9 needle \xff\r\n");
    let clipped = format!("needle {}…", "y".repeat(2000 - 7));
    assert_eq!(
        grep(&ws, json!({"pattern": "needle"})).await,
        format!("latin1.txt:1:caf\u{FFFD} needle \u{FFFD}\nlong.txt:1:{clipped}")
    );
}

#[tokio::test]
async fn grep_says_which_files_it_could_not_search() {
    let ws = TestWorkspace::new();
    put(ws.root(), "a.txt", "needle\n");
    // One line longer than the searcher may buffer.
    let mut huge = b"needle ".to_vec();
    huge.resize(grep::HEAP_LIMIT + 4096, b'x');
    put(ws.root(), "huge.txt", huge);
    let note = "(1 file could not be searched; huge.txt: a line (in multiline mode, the file) is longer than 64 MiB)";
    assert_eq!(
        grep(&ws, json!({"pattern": "needle"})).await,
        format!("a.txt:1:needle\n{note}")
    );
    assert_eq!(
        grep(&ws, json!({"pattern": "needle", "path": "huge.txt"})).await,
        format!("No matches.\n{note}")
    );
}

#[tokio::test]
async fn fifos_are_never_opened() {
    let ws = TestWorkspace::new();
    put(ws.root(), "a.txt", "needle\n");
    nix::unistd::mkfifo(&ws.root().join("pipe"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    // A walk skips it (opening it would block until a writer came).
    assert_eq!(
        grep(&ws, json!({"pattern": "needle"})).await,
        "a.txt:1:needle"
    );
    assert_eq!(glob(&ws, json!({"pattern": "*"})).await, "a.txt");
    assert_eq!(
        failure(&ws, ToolName::Grep, json!({"pattern": "x", "path": "pipe"})).await,
        failed(
            codes::NOT_A_FILE,
            "/workspace/pipe is a FIFO, not a file or directory."
        )
    );
}

#[tokio::test]
async fn grep_hidden_files_are_searched() {
    let ws = TestWorkspace::new();
    put(ws.root(), ".config/tool.toml", "needle\n");
    assert_eq!(
        grep(&ws, json!({"pattern": "needle"})).await,
        ".config/tool.toml:1:needle"
    );
}

// ---- grep: the budget ---------------------------------------------------------------------------

/// `n` files `d/fNNN.txt`, each with two matching lines.
fn many_matches(n: usize) -> TestWorkspace {
    let ws = TestWorkspace::new();
    for i in 0..n {
        put(
            ws.root(),
            &format!("d{}/f{i:03}.txt", i % 10),
            "needle one\nnothing\nneedle two\n",
        );
    }
    ws
}

#[tokio::test]
async fn grep_stops_at_max_results_and_says_more_were_omitted() {
    let ws = many_matches(400);
    let out = grep(&ws, json!({"pattern": "needle", "max_results": 5})).await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 6, "{out}");
    assert_eq!(lines[5], "… more matches omitted; narrow the search.");
    for l in &lines[..5] {
        assert!(
            l.starts_with('d') && (l.ends_with(":1:needle one") || l.ends_with(":3:needle two")),
            "{l}"
        );
    }
    // Sorted by path, then line.
    let mut sorted = lines[..5].to_vec();
    sorted.sort_by_key(|l| {
        let (path, rest) = l.split_once(':').unwrap();
        (path.to_owned(), rest.to_owned())
    });
    assert_eq!(sorted, lines[..5]);

    let out = grep(
        &ws,
        json!({"pattern": "needle", "max_results": 7, "output_mode": "files_with_matches"}),
    )
    .await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 8, "{out}");
    assert_eq!(lines[7], grep::MORE_HINT);
}

#[tokio::test]
async fn grep_count_mode_counts_every_file_and_lists_the_first_max_results() {
    let ws = many_matches(400);
    let out = grep(
        &ws,
        json!({"pattern": "needle", "max_results": 7, "output_mode": "count"}),
    )
    .await;
    // The first seven files by path, each with its whole count, then the total of all 400.
    let mut paths: Vec<String> = (0..400)
        .map(|i| format!("d{}/f{i:03}.txt", i % 10))
        .collect();
    paths.sort();
    let mut want: Vec<String> = paths[..7].iter().map(|p| format!("{p}:2")).collect();
    want.push(
        "… 393 more files not listed; 800 matching lines in 400 files in all. Narrow the search \
         to list them."
            .to_owned(),
    );
    assert_eq!(out, want.join("\n"));
    // Exactly max_results files: all listed, and the total.
    let ws = many_matches(3);
    let out = grep(
        &ws,
        json!({"pattern": "needle one", "max_results": 3, "output_mode": "count"}),
    )
    .await;
    assert_eq!(
        out,
        "d0/f000.txt:1\nd1/f001.txt:1\nd2/f002.txt:1\n3 matching lines in 3 files."
    );
}

#[tokio::test]
async fn grep_exactly_max_results_has_no_hint() {
    let ws = many_matches(3);
    let out = grep(&ws, json!({"pattern": "needle", "max_results": 6})).await;
    assert_eq!(
        out,
        [
            "d0/f000.txt:1:needle one",
            "d0/f000.txt:3:needle two",
            "d1/f001.txt:1:needle one",
            "d1/f001.txt:3:needle two",
            "d2/f002.txt:1:needle one",
            "d2/f002.txt:3:needle two",
        ]
        .join("\n")
    );
    let out = grep(&ws, json!({"pattern": "needle", "max_results": 5})).await;
    assert_eq!(out.lines().count(), 6);
    assert!(out.ends_with(grep::MORE_HINT));
    // The default budget is 200 lines.
    let ws = many_matches(150);
    let out = grep(&ws, json!({"pattern": "needle"})).await;
    assert_eq!(out.lines().count(), 201);
    assert_eq!(
        more_matches(&out.lines().take(200).collect::<Vec<_>>().join("\n")),
        out
    );
}

#[tokio::test]
async fn grep_a_cancelled_call_reports_cancelled() {
    let ws = many_matches(50);
    let cancel = CancellationToken::new();
    cancel.cancel();
    let input = serde_json::from_value(json!({"pattern": "needle"})).unwrap();
    assert_eq!(
        grep::search(&ws.toolbox, input, &cancel),
        ToolOutcome::failed(codes::CANCELLED, "The search was cancelled.")
    );
    let input = serde_json::from_value(json!({"pattern": "x"})).unwrap();
    assert_eq!(
        glob::find(&ws.toolbox, input, &cancel),
        ToolOutcome::failed(codes::CANCELLED, "The file search was cancelled.")
    );
}

// ---- grep: bad input ----------------------------------------------------------------------------

#[tokio::test]
async fn grep_bad_input_is_a_clear_failure() {
    let ws = project();
    let cases = [
        (
            json!({"pattern": "a(b"}),
            failed(
                codes::INVALID_INPUT,
                "Invalid regex: regex parse error:\n    a(b\n     ^\nerror: unclosed group",
            ),
        ),
        (
            json!({"pattern": "x", "glob": "a{b"}),
            failed(
                codes::INVALID_INPUT,
                "Invalid glob pattern: error parsing glob 'a{b': unclosed alternate group; missing '}' (maybe escape '{' with '[{]'?)",
            ),
        ),
        (
            json!({"pattern": ""}),
            failed(codes::INVALID_INPUT, "pattern must not be empty."),
        ),
        (
            json!({"pattern": "x", "max_results": 0}),
            failed(
                codes::INVALID_INPUT,
                "max_results must be between 1 and 1000; got 0.",
            ),
        ),
        (
            json!({"pattern": "x", "max_results": 1001}),
            failed(
                codes::INVALID_INPUT,
                "max_results must be between 1 and 1000; got 1001.",
            ),
        ),
        (
            json!({"pattern": "x", "context": 21}),
            failed(
                codes::INVALID_INPUT,
                "context must be between 0 and 20; got 21.",
            ),
        ),
        (
            json!({"pattern": "x", "context": 2, "output_mode": "count"}),
            failed(
                codes::INVALID_INPUT,
                "context applies to output_mode \"content\" only.",
            ),
        ),
        (
            json!({"pattern": "x", "output_mode": "lines"}),
            failed(
                codes::INVALID_INPUT,
                "output_mode must be \"content\", \"files_with_matches\" or \"count\"; got \"lines\".",
            ),
        ),
        (
            json!({"pattern": "x", "path": "missing/dir"}),
            failed(
                codes::NOT_FOUND,
                "No file or directory at /workspace/missing/dir.",
            ),
        ),
        (
            json!({"pattern": "x", "path": ""}),
            failed(codes::INVALID_INPUT, "The path is empty."),
        ),
    ];
    for (input, want) in cases {
        assert_eq!(
            failure(&ws, ToolName::Grep, input.clone()).await,
            want,
            "{input}"
        );
    }
    let (code, message) = failure(&ws, ToolName::Grep, json!({"pattern": "x", "bogus": 1})).await;
    assert_eq!(code, codes::INVALID_INPUT);
    assert!(message.contains("unknown field `bogus`"), "{message}");
    let (code, message) =
        failure(&ws, ToolName::Grep, json!({"pattern": "x", "context": -1})).await;
    assert_eq!(code, codes::INVALID_INPUT, "{message}");
}

#[tokio::test]
async fn the_schemas_limits_are_the_codes_limits() {
    let ws = many_matches(1);
    let schema = &ToolName::Grep.definition().input_schema["properties"];
    let max = schema["max_results"]["maximum"].as_u64().unwrap();
    let min = schema["max_results"]["minimum"].as_u64().unwrap();
    let ctx = schema["context"]["maximum"].as_u64().unwrap();
    assert_eq!(
        (min, max, ctx),
        (1, grep::MAX_RESULTS_LIMIT, grep::MAX_CONTEXT)
    );
    assert!(
        schema["max_results"]["description"]
            .as_str()
            .unwrap()
            .contains(&grep::DEFAULT_MAX_RESULTS.to_string())
    );
    // Every property the schema names is accepted, at its limits.
    let all = json!({
        "pattern": "needle", "path": "/workspace", "glob": "*.txt", "ignore_case": true,
        "max_results": max, "output_mode": "content", "context": ctx, "multiline": true,
        "include_ignored": true,
    });
    let names: Vec<&String> = schema.as_object().unwrap().keys().collect();
    let given: Vec<&String> = all.as_object().unwrap().keys().collect();
    assert_eq!(names.len(), given.len());
    assert!(names.iter().all(|n| given.contains(n)));
    assert!(ws.run(ToolName::Grep, all).await.is_completed());
    for mode in schema["output_mode"]["enum"].as_array().unwrap() {
        let input = json!({"pattern": "needle", "output_mode": mode});
        assert!(ws.run(ToolName::Grep, input).await.is_completed(), "{mode}");
    }
    let glob_schema = &ToolName::Glob.definition().input_schema["properties"];
    let mut keys: Vec<&String> = glob_schema.as_object().unwrap().keys().collect();
    keys.sort();
    assert_eq!(keys, ["include_ignored", "path", "pattern"]);
    let input = json!({"pattern": "*.txt", "path": "/workspace", "include_ignored": true});
    assert!(ws.run(ToolName::Glob, input).await.is_completed());
}

// ---- symlinks and escapes (both tools) ----------------------------------------------------------

/// A workspace with links that leave it: to a file, to a directory, to `/`; and one link that
/// stays inside.
fn with_escaping_links() -> TestWorkspace {
    let ws = project();
    let outside = ws.dir.path().join("outside");
    put(&outside, "secret.txt", "needle from outside\n");
    symlink(
        outside.join("secret.txt"),
        ws.root().join("secret-link.txt"),
    )
    .unwrap();
    symlink(&outside, ws.root().join("outside-dir")).unwrap();
    symlink("/", ws.root().join("root")).unwrap();
    symlink("docs/guide.md", ws.root().join("inside-link.md")).unwrap();
    ws
}

#[tokio::test]
async fn symlinks_inside_the_workspace_are_not_followed() {
    let ws = with_escaping_links();
    assert_eq!(
        grep(
            &ws,
            json!({"pattern": "needle", "output_mode": "files_with_matches", "include_ignored": true})
        )
        .await,
        ".env.example\ndocs/guide.md\nsrc/main.rs"
    );
    // Nothing of the host's, through `root`.
    assert_eq!(
        grep(&ws, json!({"pattern": "^root:", "include_ignored": true})).await,
        "No matches."
    );
    for pattern in ["*", "**/*", "*secret*", "root/**", "outside-dir/*"] {
        let out = glob(&ws, json!({"pattern": pattern, "include_ignored": true})).await;
        assert!(
            !out.contains("secret") && !out.contains("root/") && !out.contains("link"),
            "{pattern}: {out}"
        );
    }
}

#[tokio::test]
async fn paths_that_escape_are_denied_for_both_tools() {
    let ws = with_escaping_links();
    let host = ws.dir.path().join("outside");
    let host = host.canonicalize().unwrap();
    let cases = [
        (
            "root",
            "/workspace/root resolves through a symlink to /, outside the allowed directories (/workspace).".to_owned(),
        ),
        (
            "root/etc",
            "/workspace/root/etc resolves through a symlink to /etc, outside the allowed directories (/workspace).".to_owned(),
        ),
        (
            "outside-dir",
            format!(
                "/workspace/outside-dir resolves through a symlink to {}, outside the allowed directories (/workspace).",
                host.display()
            ),
        ),
        (
            "secret-link.txt",
            format!(
                "/workspace/secret-link.txt resolves through a symlink to {}, outside the allowed directories (/workspace).",
                host.join("secret.txt").display()
            ),
        ),
        (
            "../outside",
            "/outside is outside the allowed directories (/workspace).".to_owned(),
        ),
        (
            "src/../../etc",
            "/etc is outside the allowed directories (/workspace).".to_owned(),
        ),
        (
            "/etc",
            "/etc is outside the allowed directories (/workspace).".to_owned(),
        ),
    ];
    for (path, message) in cases {
        for (tool, input) in [
            (ToolName::Grep, json!({"pattern": "needle", "path": path})),
            (ToolName::Glob, json!({"pattern": "*", "path": path})),
        ] {
            assert_eq!(
                failure(&ws, tool, input).await,
                failed(codes::PATH_DENIED, &message),
                "{tool} {path}"
            );
        }
    }
}

// ---- glob ---------------------------------------------------------------------------------------

#[tokio::test]
async fn glob_name_patterns_match_anywhere_and_path_patterns_from_the_root() {
    let ws = project();
    let r = ws.root();
    put(r, "src/lib/mod.rs", "");
    put(r, "tests/it.rs", "");
    for (i, f) in [
        "src/main.rs",
        "src/lib/util.rs",
        "src/lib/mod.rs",
        "tests/it.rs",
        "docs/guide.md",
    ]
    .iter()
    .enumerate()
    {
        touch(r, f, 1_000 + i as u64);
    }
    let names = |p: &str| json!({"pattern": p});
    assert_eq!(
        glob(&ws, names("*.rs")).await,
        "tests/it.rs\nsrc/lib/mod.rs\nsrc/lib/util.rs\nsrc/main.rs"
    );
    assert_eq!(glob(&ws, names("src/*.rs")).await, "src/main.rs");
    assert_eq!(
        glob(&ws, names("src/**/*.rs")).await,
        "src/lib/mod.rs\nsrc/lib/util.rs\nsrc/main.rs"
    );
    assert_eq!(
        glob(&ws, names("{tests,docs}/*.{rs,md}")).await,
        "docs/guide.md\ntests/it.rs"
    );
    assert_eq!(
        glob(&ws, json!({"pattern": "lib/*.rs", "path": "src"})).await,
        "src/lib/mod.rs\nsrc/lib/util.rs"
    );
    assert_eq!(glob(&ws, names("/workspace/src/*.rs")).await, "src/main.rs");
    assert_eq!(glob(&ws, names(".env*")).await, ".env.example");
    assert_eq!(glob(&ws, names("*.py")).await, glob::NO_FILES);
}

#[tokio::test]
async fn glob_lists_newest_first_with_ties_broken_by_path() {
    let ws = TestWorkspace::new();
    let r = ws.root();
    for (f, t) in [
        ("a/old.txt", 100),
        ("b/new.txt", 300),
        ("c/mid2.txt", 200),
        ("a/mid1.txt", 200),
        ("z.txt", 250),
    ] {
        put(r, f, "");
        touch(r, f, t);
    }
    assert_eq!(
        glob(&ws, json!({"pattern": "*.txt"})).await,
        "b/new.txt\nz.txt\na/mid1.txt\nc/mid2.txt\na/old.txt"
    );
}

#[tokio::test]
async fn glob_caps_at_500_newest_and_says_so() {
    let ws = TestWorkspace::new();
    let r = ws.root();
    for i in 0..501u64 {
        let f = format!("d{}/f{i:03}.txt", i % 7);
        put(r, &f, "");
        touch(r, &f, 10_000 + i);
    }
    let out = glob(&ws, json!({"pattern": "*.txt"})).await;
    let want: Vec<String> = (1..501u64)
        .rev()
        .map(|i| format!("d{}/f{i:03}.txt", i % 7))
        .collect();
    assert_eq!(
        out,
        format!(
            "{}\n… 1 more file omitted (501 matched in all); narrow the pattern.",
            want.join("\n")
        )
    );
    // Exactly 500: no hint.
    fs::remove_file(r.join("d0/f000.txt")).unwrap();
    assert_eq!(
        glob(&ws, json!({"pattern": "*.txt"})).await,
        want.join("\n")
    );
}

#[tokio::test]
async fn glob_honours_ignore_files_and_skips_dot_git() {
    let ws = TestWorkspace::new();
    let r = ws.root();
    put(r, ".gitignore", "node_modules/\n");
    put(r, "node_modules/x/index.js", "");
    put(r, "app.js", "");
    put(r, ".git/hooks/pre-commit.js", "");
    put(r, "web/.hidden.js", "");
    for (i, f) in ["node_modules/x/index.js", "app.js", "web/.hidden.js"]
        .iter()
        .enumerate()
    {
        touch(r, f, 100 + i as u64);
    }
    assert_eq!(
        glob(&ws, json!({"pattern": "*.js"})).await,
        "web/.hidden.js\napp.js"
    );
    assert_eq!(
        glob(&ws, json!({"pattern": "**/*.js", "include_ignored": true})).await,
        "web/.hidden.js\napp.js\nnode_modules/x/index.js"
    );
}

#[tokio::test]
async fn glob_bad_input_is_a_clear_failure() {
    let ws = project();
    let cases = [
        (
            json!({"pattern": "src/[a"}),
            failed(
                codes::INVALID_INPUT,
                "Invalid glob pattern: error parsing glob 'src/[a': unclosed character class; missing ']'",
            ),
        ),
        (
            json!({"pattern": "/etc/*"}),
            failed(
                codes::INVALID_INPUT,
                "The glob pattern \"/etc/*\" is absolute; patterns match paths relative to /workspace. Pass the directory as path and a relative pattern.",
            ),
        ),
        (
            json!({"pattern": ""}),
            failed(codes::INVALID_INPUT, "pattern must not be empty."),
        ),
        (
            json!({"pattern": "*", "path": "nope"}),
            failed(codes::NOT_FOUND, "No file or directory at /workspace/nope."),
        ),
        (
            json!({"pattern": "*", "path": "src/main.rs"}),
            failed(
                codes::INVALID_INPUT,
                "path must be a directory; /workspace/src/main.rs is a regular file.",
            ),
        ),
    ];
    for (input, want) in cases {
        assert_eq!(
            failure(&ws, ToolName::Glob, input.clone()).await,
            want,
            "{input}"
        );
    }
}

// ---- a big tree ---------------------------------------------------------------------------------

/// A workspace on tmpfs when the machine has one: 200k files are created and removed several
/// times faster there than through a disk journal.
struct BigWorkspace {
    _dir: tempfile::TempDir,
    toolbox: Toolbox,
}

impl BigWorkspace {
    async fn run(&self, tool: ToolName, input: Value) -> String {
        let ctx = podhost::tools::CallContext::new(CancellationToken::new());
        let outcome = tokio::time::timeout(
            Duration::from_secs(60),
            self.toolbox.call(tool, &input, &ctx),
        )
        .await
        .expect("tool call timed out")
        .expect("harness fault");
        match outcome {
            ToolOutcome::Completed { output } => output.as_str().unwrap().to_owned(),
            other => panic!("{tool} {input} did not complete: {other:?}"),
        }
    }
}

/// 200,000 files: 1,990 directories × 100 files under an ignored `generated/`, and 10 × 100 under
/// `src/`. `needle` is in `src/dN/f07.txt` and in every 100th ignored directory's `f07.txt`; the
/// other ignored files are empty, which keeps creating them cheap.
fn big_tree() -> BigWorkspace {
    let shm = Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        tempfile::tempdir_in(shm).or_else(|_| tempfile::tempdir())
    } else {
        tempfile::tempdir()
    }
    .unwrap();
    let root = dir.path().join("workspace");
    put(&root, ".gitignore", "/generated/\n");
    let dirs: Vec<String> = (0..1990)
        .map(|d| format!("generated/g{d:04}"))
        .chain((0..10).map(|d| format!("src/d{d}")))
        .collect();
    std::thread::scope(|s| {
        for part in dirs.chunks(dirs.len().div_ceil(4)) {
            let root = &root;
            s.spawn(move || {
                for dir in part {
                    let d = root.join(dir);
                    fs::create_dir_all(&d).unwrap();
                    let kept = dir.starts_with("src/");
                    let needle = kept || dir.ends_with("00");
                    for f in 0..100 {
                        let body: &[u8] = match (f == 7 && needle, kept) {
                            (true, _) => b"a needle\n",
                            (false, true) => b"hay\n",
                            (false, false) => b"",
                        };
                        fs::write(d.join(format!("f{f:02}.txt")), body).unwrap();
                    }
                }
            });
        }
    });
    for d in 0..10 {
        touch(&root, &format!("src/d{d}/f07.txt"), 5_000 + d);
    }
    let ws = Workspace::new(&root, Some(Path::new("/workspace"))).unwrap();
    let toolbox = Toolbox::new(ws, executor(&root));
    BigWorkspace { _dir: dir, toolbox }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_200k_file_tree_with_a_large_ignored_directory() {
    let ws = big_tree();
    let kept: Vec<String> = (0..10).map(|d| format!("src/d{d}/f07.txt")).collect();

    assert_eq!(
        ws.run(
            ToolName::Grep,
            json!({"pattern": "needle", "max_results": 1000})
        )
        .await,
        kept.iter()
            .map(|p| format!("{p}:1:a needle"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(
        ws.run(
            ToolName::Grep,
            json!({"pattern": "needle", "path": "src", "output_mode": "files_with_matches"})
        )
        .await,
        kept.join("\n")
    );
    let newest_first: Vec<String> = kept.iter().rev().map(|p| p.to_string()).collect();
    assert_eq!(
        ws.run(ToolName::Glob, json!({"pattern": "f07.txt"})).await,
        newest_first.join("\n")
    );
    let out = ws.run(ToolName::Glob, json!({"pattern": "**/*.txt"})).await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 501);
    assert_eq!(
        lines[500],
        "… 500 more files omitted (1000 matched in all); narrow the pattern."
    );
    assert_eq!(lines[500], glob::more_hint(1000));
    assert!(lines[..500].iter().all(|l| l.starts_with("src/d")));

    // The ignored part is there, and searchable when asked for.
    let ignored: Vec<String> = (0..1990)
        .step_by(100)
        .map(|d| format!("generated/g{d:04}/f07.txt"))
        .collect();
    let mut all: Vec<String> = ignored.iter().chain(&kept).cloned().collect();
    all.sort();
    assert_eq!(
        ws.run(
            ToolName::Grep,
            json!({"pattern": "needle", "output_mode": "files_with_matches", "include_ignored": true})
        )
        .await,
        all.join("\n")
    );
    assert_eq!(
        ws.run(
            ToolName::Grep,
            json!({"pattern": "needle", "output_mode": "count", "path": "generated"})
        )
        .await,
        ignored
            .iter()
            .map(|p| format!("{p}:1"))
            .chain([format!(
                "{n} matching lines in {n} files.",
                n = ignored.len()
            )])
            .collect::<Vec<_>>()
            .join("\n")
    );
}
