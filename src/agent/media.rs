//! Which files a model is shown, and how: the one rule for every front and every source of a
//! file (a turn's input, a tool's result, an OpenAI content part).
//!
//! A file reaches the model as a media part only when the model reads its kind (v5 §3
//! `model.inputs`: `image`, `pdf`, `office`, `audio`, `video`; text is never a media part, v5 §5)
//! and it is within the largest file a model may be shown (`limits.modelFileBytes`). A text file
//! within a cap is inlined by the front itself. Any other file becomes a note the model can act
//! on: that the file exists, its name, kind and size, why it is not shown, and how to read it
//! with the tools it has.
//!
//! Invariants: [`ModelFiles::decide`] is a pure function of the file's facts and the model's, so
//! a replayed prompt shows the same files the same way. A model whose inputs are unknown is
//! sent every media kind; the gate's or server's refusal ([`is_file_refusal`]) then drops the
//! part (the loop's retry), never failing every later call.
//!
//! Non-goals: fetching or storing bytes (the fronts do), the provider's format of a media part
//! (the Model Gate's, or the OpenAI content part's).

/// What kind of input a file is, as `ModelDescriptor.inputs` names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputKind {
    Text,
    Image,
    Pdf,
    Office,
    Audio,
    Video,
    /// A kind no model input names (an archive, a binary).
    Other,
}

impl InputKind {
    /// The kind of a media type (`image/png`, `application/pdf`, `text/csv`, …).
    pub fn of(media_type: &str) -> InputKind {
        let mt = media_type.trim().to_ascii_lowercase();
        let mt = mt.split(';').next().unwrap_or("").trim();
        let (top, sub) = mt.split_once('/').unwrap_or((mt, ""));
        match top {
            "image" => InputKind::Image,
            "audio" => InputKind::Audio,
            "video" => InputKind::Video,
            "text" => InputKind::Text,
            _ if sub == "pdf" => InputKind::Pdf,
            _ if [
                "json",
                "xml",
                "yaml",
                "x-yaml",
                "javascript",
                "x-sh",
                "csv",
                "toml",
                "x-ndjson",
                "sql",
            ]
            .contains(&sub)
                || sub.ends_with("+json")
                || sub.ends_with("+xml") =>
            {
                InputKind::Text
            }
            _ if sub.contains("msword")
                || sub.contains("officedocument")
                || sub.contains("ms-excel")
                || sub.contains("ms-powerpoint")
                || sub.contains("opendocument") =>
            {
                InputKind::Office
            }
            _ => InputKind::Other,
        }
    }

    /// The name `model.inputs` uses (`file` for [`InputKind::Other`]).
    pub fn as_str(self) -> &'static str {
        match self {
            InputKind::Text => "text",
            InputKind::Image => "image",
            InputKind::Pdf => "pdf",
            InputKind::Office => "office",
            InputKind::Audio => "audio",
            InputKind::Video => "video",
            InputKind::Other => "file",
        }
    }
}

/// The text files a front inlines itself, unless configured otherwise: 64 KiB.
pub const DEFAULT_INLINE_TEXT_BYTES: u64 = 64 * 1024;

/// What the model can be shown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelFiles {
    /// The kinds the model reads (`text`, `image`, `pdf`, …); `None` when unknown.
    pub inputs: Option<Vec<String>>,
    /// The largest file a model may be shown, in bytes; `None` when no limit is known.
    pub max_file_bytes: Option<u64>,
    /// The largest text file inlined into the prompt, in bytes.
    pub inline_text_bytes: u64,
}

impl Default for ModelFiles {
    fn default() -> Self {
        ModelFiles {
            inputs: None,
            max_file_bytes: None,
            inline_text_bytes: DEFAULT_INLINE_TEXT_BYTES,
        }
    }
}

/// What is known of one file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileFacts<'a> {
    /// Its name (or id) as the model should read it.
    pub name: &'a str,
    pub media_type: &'a str,
    /// Its size in bytes, when known.
    pub size: Option<u64>,
}

/// How a file reaches the model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shown {
    /// As a media part.
    Media,
    /// Its text, inlined by the front.
    InlineText,
    /// A note instead, this text.
    Note(String),
}

impl ModelFiles {
    /// Whether the model reads `kind` (unknown inputs: every kind but text, which is never a
    /// media part).
    pub fn reads(&self, kind: InputKind) -> bool {
        match (&self.inputs, kind) {
            (_, InputKind::Text) => false,
            (None, _) => true,
            (Some(inputs), k) => inputs.iter().any(|i| i == k.as_str()),
        }
    }

    /// How `file` reaches the model; `how_to_read` ends a note ("call read_artifact with
    /// artifactId \"a1\" to read it").
    pub fn decide(&self, file: &FileFacts<'_>, how_to_read: &str) -> Shown {
        let kind = InputKind::of(file.media_type);
        let past = |limit: u64| file.size.is_some_and(|s| s > limit);
        if kind == InputKind::Text {
            if past(self.inline_text_bytes) {
                return Shown::Note(note(
                    file,
                    &format!(
                        "It is too long to show here (more than {} bytes)",
                        self.inline_text_bytes
                    ),
                    how_to_read,
                ));
            }
            return Shown::InlineText;
        }
        if !self.reads(kind) {
            return Shown::Note(note(
                file,
                &format!("This model cannot read {} files", kind.as_str()),
                how_to_read,
            ));
        }
        if let Some(limit) = self.max_file_bytes
            && past(limit)
        {
            return Shown::Note(note(
                file,
                &format!("It is past the {limit} bytes a model may be shown"),
                how_to_read,
            ));
        }
        Shown::Media
    }
}

/// The note for a file the model is not shown.
pub fn note(file: &FileFacts<'_>, why: &str, how_to_read: &str) -> String {
    let size = file
        .size
        .map(|s| format!(", {s} bytes"))
        .unwrap_or_default();
    let how = if how_to_read.is_empty() {
        String::new()
    } else {
        format!(" {how_to_read}")
    };
    format!(
        "[Attached file {} ({}{size}). {why}, so it is not shown here.{how}]",
        file.name, file.media_type
    )
}

/// The note for a file dropped after the model refused it.
pub fn refused_note(file: &FileFacts<'_>, how_to_read: &str) -> String {
    note(file, "The model refused this file", how_to_read)
}

/// Whether a failed model call refused a file: the gate's `unsupported_input`, or an invalid
/// request whose message is about a file, an image or a media part.
pub fn is_file_refusal(code: &str, message: &str) -> bool {
    if code == crate::floor::codes::model::UNSUPPORTED_INPUT {
        return true;
    }
    if code != crate::floor::codes::model::INVALID_REQUEST {
        return false;
    }
    let m = message.to_ascii_lowercase();
    [
        "image",
        "file",
        "media",
        "attachment",
        "pdf",
        "audio",
        "video",
        "multimodal",
        "multi-modal",
        "vision",
        "modelfilebytes",
        "reference",
        "artifact",
        "content part",
    ]
    .iter()
    .any(|w| m.contains(w))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn facts(name: &str, media_type: &str, size: Option<u64>) -> FileFacts<'static> {
        FileFacts {
            name: Box::leak(name.to_owned().into_boxed_str()),
            media_type: Box::leak(media_type.to_owned().into_boxed_str()),
            size,
        }
    }

    #[test]
    fn kinds_come_from_media_types() {
        let kinds: Vec<&str> = [
            "image/png",
            "application/pdf",
            "text/csv; charset=utf-8",
            "application/ld+json",
            "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
            "audio/mpeg",
            "video/mp4",
            "application/zip",
        ]
        .iter()
        .map(|m| InputKind::of(m).as_str())
        .collect();
        assert_eq!(
            kinds,
            [
                "image", "pdf", "text", "text", "office", "audio", "video", "file"
            ]
        );
    }

    #[test]
    fn a_text_only_model_gets_notes_and_limits_hold() {
        let text_only = ModelFiles {
            inputs: Some(vec!["text".into()]),
            max_file_bytes: Some(1000),
            inline_text_bytes: 100,
        };
        let how = "Call read_artifact with artifactId \"a1\" to read it.";
        assert_eq!(
            text_only.decide(&facts("r.pdf", "application/pdf", Some(50)), how),
            Shown::Note(
                "[Attached file r.pdf (application/pdf, 50 bytes). This model cannot read pdf \
                 files, so it is not shown here. Call read_artifact with artifactId \"a1\" to \
                 read it.]"
                    .into()
            )
        );
        assert_eq!(
            text_only.decide(&facts("d.csv", "text/csv", Some(100)), how),
            Shown::InlineText
        );
        assert_eq!(
            text_only.decide(&facts("d.csv", "text/csv", Some(101)), ""),
            Shown::Note(
                "[Attached file d.csv (text/csv, 101 bytes). It is too long to show here (more \
                 than 100 bytes), so it is not shown here.]"
                    .into()
            )
        );
        let vision = ModelFiles {
            inputs: Some(vec!["text".into(), "image".into()]),
            ..text_only
        };
        assert_eq!(
            vision.decide(&facts("p.png", "image/png", Some(1000)), how),
            Shown::Media
        );
        assert_eq!(
            vision.decide(&facts("p.png", "image/png", Some(1001)), ""),
            Shown::Note(
                "[Attached file p.png (image/png, 1001 bytes). It is past the 1000 bytes a model \
                 may be shown, so it is not shown here.]"
                    .into()
            )
        );
        // Unknown inputs: tried as media (a refusal drops it later).
        assert_eq!(
            ModelFiles::default().decide(&facts("v.mp4", "video/mp4", None), ""),
            Shown::Media
        );
    }

    #[test]
    fn refusals_about_files_are_told_apart() {
        assert!(is_file_refusal("unsupported_input", "no"));
        assert!(is_file_refusal(
            "invalid_request",
            "The reference is past limits.modelFileBytes"
        ));
        assert!(is_file_refusal(
            "invalid_request",
            "Model does not support image input"
        ));
        assert!(!is_file_refusal(
            "invalid_request",
            "temperature must be < 2"
        ));
        assert!(!is_file_refusal("transient", "image server down"));
    }
}
