//! Jupyter notebooks (`.ipynb`) as `read` shows them: the cells and their outputs as text,
//! instead of the JSON they are stored as.
//!
//! Owns: the rendering. A notebook is a header line, then each cell under a `[cell N: kind]`
//! line (code cells with their execution count), its source, then each output under an
//! `[output: …]` line: stream text, the `text/plain` (else markdown, JSON or HTML) of a result or
//! display, an error's name, value and traceback (terminal colour codes removed). Images and
//! other binary data are named with their size, never shown.
//!
//! Invariants: rendering never fails — a file that is not a notebook of format 4 (not JSON, no
//! `cells` list) is `None`, and `read` shows it as the text it is. The rendered text is paged
//! like any file, so offset and limit count its lines.
//!
//! Non-goals: editing cells (edit works on the stored JSON), nbformat 3 (`worksheets`).

use std::fmt::Write as _;
use std::sync::OnceLock;

use serde_json::Value;

/// The largest notebook rendered; a larger file is shown as its JSON text.
pub const MAX_NOTEBOOK_BYTES: u64 = 16 * 1024 * 1024;

/// Whether `path` names a notebook by its extension.
pub fn is_notebook(path: &str) -> bool {
    path.rsplit_once('.')
        .is_some_and(|(_, ext)| ext.eq_ignore_ascii_case("ipynb"))
}

/// The notebook as text, or `None` when `bytes` is not a notebook podhost can render.
pub fn render(bytes: &[u8]) -> Option<String> {
    let nb: Value = serde_json::from_slice(bytes).ok()?;
    let cells = nb.get("cells")?.as_array()?;
    let language = nb
        .pointer("/metadata/kernelspec/language")
        .or_else(|| nb.pointer("/metadata/language_info/name"))
        .and_then(Value::as_str);
    let mut out = String::new();
    let _ = write!(
        out,
        "Jupyter notebook{}, {} cell(s).",
        language.map(|l| format!(" ({l})")).unwrap_or_default(),
        cells.len()
    );
    for (n, cell) in cells.iter().enumerate() {
        let kind = cell
            .get("cell_type")
            .and_then(Value::as_str)
            .unwrap_or("unknown");
        let count = cell
            .get("execution_count")
            .and_then(Value::as_u64)
            .map(|c| format!(", execution {c}"))
            .unwrap_or_default();
        let _ = write!(out, "\n\n[cell {}: {kind}{count}]", n + 1);
        push_text(&mut out, &joined(cell.get("source")));
        for output in cell
            .get("outputs")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            render_output(&mut out, output);
        }
    }
    out.push('\n');
    Some(out)
}

fn render_output(out: &mut String, output: &Value) {
    let kind = output
        .get("output_type")
        .and_then(Value::as_str)
        .unwrap_or("unknown");
    match kind {
        "stream" => {
            let name = output
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("stdout");
            out.push_str(&format!("\n[output: {name}]"));
            push_text(out, &joined(output.get("text")));
        }
        "execute_result" | "display_data" => {
            let label = if kind == "execute_result" {
                "result"
            } else {
                "display"
            };
            let data = output.get("data").and_then(Value::as_object);
            let text = data.and_then(|d| {
                [
                    "text/plain",
                    "text/markdown",
                    "application/json",
                    "text/html",
                ]
                .iter()
                .find_map(|mime| d.get(*mime).map(|v| (*mime, v)))
            });
            match text {
                Some(("application/json", v)) if !v.is_string() && !v.is_array() => {
                    out.push_str(&format!("\n[output: {label}, application/json]"));
                    push_text(out, &v.to_string());
                }
                Some((mime, v)) => {
                    let shown = if mime == "text/plain" {
                        String::new()
                    } else {
                        format!(", {mime}")
                    };
                    out.push_str(&format!("\n[output: {label}{shown}]"));
                    push_text(out, &joined(Some(v)));
                }
                None => {}
            }
            // What cannot be shown as text is named, with its size.
            for (mime, v) in data.into_iter().flatten() {
                if mime.starts_with("text/") || mime == "application/json" {
                    continue;
                }
                let bytes = joined(Some(v)).len() * 3 / 4;
                out.push_str(&format!(
                    "\n[output: {label}, {mime}, about {bytes} bytes, not shown]"
                ));
            }
        }
        "error" => {
            let name = output
                .get("ename")
                .and_then(Value::as_str)
                .unwrap_or("Error");
            let value = output.get("evalue").and_then(Value::as_str).unwrap_or("");
            out.push_str(&format!("\n[output: error]\n{name}: {value}"));
            let trace: Vec<String> = output
                .get("traceback")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(strip_ansi)
                .collect();
            if !trace.is_empty() {
                push_text(out, &trace.join("\n"));
            }
        }
        other => out.push_str(&format!("\n[output: {other}]")),
    }
}

/// Appends `text` on a line of its own (without a trailing newline of its own).
fn push_text(out: &mut String, text: &str) {
    let text = text.strip_suffix('\n').unwrap_or(text);
    if !text.is_empty() {
        out.push('\n');
        out.push_str(text);
    }
}

/// A notebook string field: one string, or a list of strings to join.
fn joined(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts.iter().filter_map(Value::as_str).collect(),
        _ => String::new(),
    }
}

/// `s` without terminal escape sequences (tracebacks are coloured).
fn strip_ansi(s: &str) -> String {
    static ANSI: OnceLock<Option<regex::Regex>> = OnceLock::new();
    match ANSI
        .get_or_init(|| regex::Regex::new(r"\x1b\[[0-9;?]*[ -/]*[@-~]").ok())
        .as_ref()
    {
        Some(re) => re.replace_all(s, "").into_owned(),
        None => s.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    #[test]
    fn cells_and_outputs_render_as_text() {
        let nb = json!({
            "nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"language": "python", "name": "python3"}},
            "cells": [
                {"cell_type": "markdown", "source": ["# Title\n", "Some *text*."]},
                {"cell_type": "code", "execution_count": 3, "source": "x = 1\nprint(x)\nx",
                 "outputs": [
                    {"output_type": "stream", "name": "stdout", "text": ["1\n"]},
                    {"output_type": "execute_result", "execution_count": 3,
                     "data": {"text/plain": ["1"], "text/html": "<b>1</b>"}},
                    {"output_type": "display_data",
                     "data": {"image/png": "iVBORw0KGgoAAAANSUhEUgAA", "text/plain": "<Figure>"}},
                    {"output_type": "error", "ename": "ValueError", "evalue": "bad",
                     "traceback": ["\u{1b}[0;31mValueError\u{1b}[0m: bad"]}
                 ]},
                {"cell_type": "code", "execution_count": null, "source": [], "outputs": []}
            ]
        });
        assert_eq!(
            render(nb.to_string().as_bytes()).unwrap(),
            "Jupyter notebook (python), 3 cell(s).\n\
             \n\
             [cell 1: markdown]\n\
             # Title\n\
             Some *text*.\n\
             \n\
             [cell 2: code, execution 3]\n\
             x = 1\n\
             print(x)\n\
             x\n\
             [output: stdout]\n\
             1\n\
             [output: result]\n\
             1\n\
             [output: display]\n\
             <Figure>\n\
             [output: display, image/png, about 18 bytes, not shown]\n\
             [output: error]\n\
             ValueError: bad\n\
             ValueError: bad\n\
             \n\
             [cell 3: code]\n"
        );
    }

    #[test]
    fn what_is_not_a_notebook_is_none() {
        for bytes in [&b"not json"[..], b"{\"worksheets\": []}", b"[1, 2]"] {
            assert_eq!(render(bytes), None, "{bytes:?}");
        }
        assert!(is_notebook("a/b.ipynb") && is_notebook("B.IPYNB"));
        assert!(!is_notebook("ipynb") && !is_notebook("a.py"));
    }
}
