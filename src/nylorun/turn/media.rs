//! Which files a model is shown, and how (v5 §3 `model.inputs`, §5, §5b): the one rule.
//!
//! Owns: [`MediaPolicy`], built from the turn's model descriptor, and its verdict on each media
//! part — a user message's attachment, a tool result's file (an MCP image stored as an
//! artifact), any `{type: "media", mediaType, reference}` the prompt carries. A part the model
//! reads goes to the Model Gate as is; any other becomes a text note naming the artifact, so
//! the model can still read it with `read_artifact`.
//!
//! Invariants:
//! * Every media part of every prompt passes through [`MediaPolicy::part`]: there is no second
//!   rule elsewhere (the transcript's projection and the tool results both call it).
//! * A text file is never sent as media (the gate refuses it: `unsupported_input`); a kind the
//!   descriptor does not list is never sent either. Without a descriptor the gate decides.
//! * Pure: the same descriptor and part give the same prompt part, so a replayed segment hashes
//!   the same.
//!
//! Non-goals: fetching or storing bytes (the gate fetches references; the Tool Gate's results
//! code stores tool parts), size checks (the gate refuses a file past `limits.modelFileBytes`).

use serde_json::{Value, json};

use crate::nylorun::turn::turn_start::ModelDescriptor;

/// How media parts reach the model.
#[derive(Clone, Debug, Default)]
pub struct MediaPolicy {
    /// What the model reads (`image`, `pdf`, …); `None`: no descriptor, let the gate decide.
    pub inputs: Option<Vec<String>>,
}

impl MediaPolicy {
    pub fn from_model(model: Option<&ModelDescriptor>) -> Self {
        MediaPolicy {
            inputs: model.map(|m| m.inputs.clone()),
        }
    }

    /// Whether a file of `media_type` goes to the model as a file.
    pub fn shows(&self, media_type: &str) -> bool {
        match (&self.inputs, media_category(media_type)) {
            (_, "text") => false,
            (None, _) => true,
            (Some(inputs), c) => inputs.iter().any(|i| i == c),
        }
    }

    /// A content part as the model gets it: media it can read as is; a text file, or a kind
    /// it does not read, as a note naming the artifact (the gate refuses both as media).
    pub fn part(&self, part: &Value) -> Value {
        if part.get("type").and_then(Value::as_str) != Some("media") {
            return part.clone();
        }
        let media_type = part.get("mediaType").and_then(Value::as_str).unwrap_or("");
        if self.shows(media_type) {
            return part.clone();
        }
        let category = media_category(media_type);
        let reference = part.get("reference").cloned().unwrap_or(Value::Null);
        let artifact = reference
            .get("artifactId")
            .and_then(Value::as_str)
            .unwrap_or("?");
        let name = reference
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or(artifact);
        let version = reference
            .get("version")
            .map(|v| format!(" version {v}"))
            .unwrap_or_default();
        let why = if category == "text" {
            "Its text is not shown here".to_owned()
        } else {
            format!("This model cannot read {category} files")
        };
        json!({
            "type": "text",
            "text": format!(
                "[Attached file {name} ({media_type}): artifact {artifact}{version}. {why}; call \
                 read_artifact with artifactId \"{artifact}\" to read it.]"
            ),
        })
    }

    /// A tool result's `files` (`[{mediaType, reference}]`) as prompt parts, each through
    /// [`MediaPolicy::part`].
    pub fn file_parts(&self, files: Option<&Value>) -> Vec<Value> {
        files
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|f| f.get("mediaType").is_some() && f.get("reference").is_some())
            .map(|f| {
                self.part(&json!({
                    "type": "media",
                    "mediaType": f["mediaType"],
                    "reference": f["reference"],
                }))
            })
            .collect()
    }
}

/// The kind of input a media type is, as `ModelDescriptor.inputs` names them.
pub fn media_category(media_type: &str) -> &'static str {
    let mt = media_type.to_ascii_lowercase();
    let (top, sub) = mt.split_once('/').unwrap_or((mt.as_str(), ""));
    match top {
        "image" => "image",
        "audio" => "audio",
        "video" => "video",
        "text" => "text",
        _ if sub == "pdf" => "pdf",
        _ if [
            "json",
            "xml",
            "yaml",
            "x-yaml",
            "javascript",
            "x-sh",
            "csv",
            "toml",
        ]
        .contains(&sub)
            || sub.ends_with("+json")
            || sub.ends_with("+xml") =>
        {
            "text"
        }
        _ if sub.contains("msword")
            || sub.contains("officedocument")
            || sub.contains("ms-excel")
            || sub.contains("ms-powerpoint")
            || sub.contains("opendocument") =>
        {
            "office"
        }
        _ => "file",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn the_descriptor_decides_and_text_never_goes_as_media() {
        let text_only = MediaPolicy {
            inputs: Some(vec!["text".into()]),
        };
        let images = MediaPolicy {
            inputs: Some(vec!["text".into(), "image".into()]),
        };
        let unknown = MediaPolicy::default();
        for (mt, t, i, u) in [
            ("image/png", false, true, true),
            ("text/csv", false, false, false),
            ("application/json", false, false, false),
            ("application/pdf", false, false, true),
            ("audio/wav", false, false, true),
        ] {
            assert_eq!(
                (text_only.shows(mt), images.shows(mt), unknown.shows(mt)),
                (t, i, u),
                "{mt}"
            );
        }
        let files = json!([{"mediaType": "image/png",
                            "reference": {"artifactId": "a1", "version": 1, "name": "x.png"}}]);
        assert_eq!(
            images.file_parts(Some(&files)),
            vec![json!({"type": "media", "mediaType": "image/png",
                        "reference": {"artifactId": "a1", "version": 1, "name": "x.png"}})]
        );
        assert_eq!(
            text_only.file_parts(Some(&files)),
            vec![
                json!({"type": "text", "text": "[Attached file x.png (image/png): artifact a1 \
                version 1. This model cannot read image files; call read_artifact with artifactId \
                \"a1\" to read it.]"})
            ]
        );
        assert_eq!(images.file_parts(None), Vec::<Value>::new());
    }
}
