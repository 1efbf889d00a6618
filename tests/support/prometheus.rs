//! Reads a `/metrics` answer with the Prometheus client's own parsers (PyPI `prometheus_client`,
//! which `.ci/run` installs): the strict OpenMetrics one and the classic text-format one must
//! both accept it and read the same samples.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};

/// Parses with both parsers; prints the samples as JSON, `name{k=v,…}` → value.
const PARSE: &str = r#"
import json, sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics
from prometheus_client.parser import text_string_to_metric_families as classic
text = sys.stdin.read()
def samples(families):
    out = {}
    for family in families:
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out
strict = samples(openmetrics(text))
plain = samples(classic(text))
if strict != plain:
    sys.exit("the parsers disagree:\n" + json.dumps({"openmetrics": strict, "classic": plain}, indent=1))
print(json.dumps(strict))
"#;

/// Every sample of `text`, as the parsers read it: `name{k=v,…}` → value.
pub fn parse(text: &str) -> BTreeMap<String, f64> {
    let mut child = Command::new("python3")
        .args(["-c", PARSE])
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
        "the Prometheus parsers refused the metrics (is prometheus_client installed? \
         `python3 -m pip install prometheus_client`):\n{}\n--- the text:\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The samples whose name is `name`, keyed by their labels (`k=v,…`).
pub fn family(samples: &BTreeMap<String, f64>, name: &str) -> BTreeMap<String, f64> {
    samples
        .iter()
        .filter_map(|(k, v)| {
            let (n, labels) = k.split_once('{')?;
            (n == name).then(|| (labels.trim_end_matches('}').to_owned(), *v))
        })
        .collect()
}

/// One sample's value; 0 when absent (a counter never incremented has no series).
pub fn value(samples: &BTreeMap<String, f64>, name: &str, labels: &str) -> f64 {
    samples
        .get(&format!("{name}{{{labels}}}"))
        .copied()
        .unwrap_or(0.0)
}
