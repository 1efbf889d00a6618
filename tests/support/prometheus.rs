//! Reads a `/metrics` answer with the Prometheus client's own parsers (PyPI `prometheus_client`,
//! which `.ci/run` installs): OpenMetrics text (it ends with `# EOF`) with the strict
//! OpenMetrics parser, the classic text format with the classic parser.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};

/// Parses with the parser named in argv[1]; prints the samples, `name{k=v,…}` → value, and the
/// families' types, name → type, as JSON.
const PARSE: &str = r#"
import json, sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics
from prometheus_client.parser import text_string_to_metric_families as classic
text = sys.stdin.read()
families = list({"openmetrics": openmetrics, "classic": classic}[sys.argv[1]](text))
samples, types = {}, {}
for family in families:
    types[family.name] = family.type
    for s in family.samples:
        labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
        samples[f"{s.name}{{{labels}}}"] = s.value
print(json.dumps({"samples": samples, "types": types}))
"#;

/// Samples, `name{k=v,…}` → value.
pub type Samples = BTreeMap<String, f64>;

/// What a parser read: the samples and each family's type (`counter`, `gauge`, `histogram`,
/// `info`, …), by the family's name as the parser names it.
#[derive(Debug, serde::Deserialize)]
pub struct Parsed {
    pub samples: Samples,
    pub types: BTreeMap<String, String>,
}

/// `text` read by the parser for its format: `openmetrics` or `classic`.
pub fn parse_as(parser: &str, text: &str) -> Parsed {
    let mut child = Command::new("python3")
        .args(["-c", PARSE, parser])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs (the metrics tests need it and PyPI prometheus_client)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the Prometheus {parser} parser refused the metrics (is prometheus_client installed? \
         `python3 -m pip install prometheus_client`):\n{}\n--- the text:\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Every sample of `text`, as the parser for its format reads it: `name{k=v,…}` → value.
pub fn parse(text: &str) -> Samples {
    let parser = if text.ends_with("# EOF\n") {
        "openmetrics"
    } else {
        "classic"
    };
    parse_as(parser, text).samples
}

/// The samples whose name is `name`, keyed by their labels (`k=v,…`).
pub fn family(samples: &Samples, name: &str) -> Samples {
    samples
        .iter()
        .filter_map(|(k, v)| {
            let (n, labels) = k.split_once('{')?;
            (n == name).then(|| (labels.trim_end_matches('}').to_owned(), *v))
        })
        .collect()
}

/// The samples of [`family`] that are not 0: what was recorded, without the label sets podhost
/// sets up at 0 before their first event.
pub fn counted(samples: &Samples, name: &str) -> Samples {
    family(samples, name)
        .into_iter()
        .filter(|(_, v)| *v != 0.0)
        .collect()
}

/// One sample's value; 0 when absent.
pub fn value(samples: &Samples, name: &str, labels: &str) -> f64 {
    samples
        .get(&format!("{name}{{{labels}}}"))
        .copied()
        .unwrap_or(0.0)
}
