//! The names the model calls MCP and HTTP tools by (v5 §3: "Name each tool within 64
//! characters, the ceiling every provider accepts").
//!
//! Owns: [`model_names`]. An MCP tool is `server__tool` and an HTTP tool its declared name, each
//! with every character outside `[A-Za-z0-9_-]` made `_`. A name that is too long, that another
//! tool's name would share, or that is one of podhost's own tools ([`RESERVED`]) gets a short
//! hash of the tool's identity instead of its tail: `prefix_1a2b3c4d`.
//!
//! Invariants:
//! * Every name matches `^[A-Za-z0-9_-]{1,64}$`, and no two are equal, nor equal to a reserved
//!   name.
//! * Pure and order-free: a tool's name depends only on the set of tools asked for, never on
//!   their order, the clock or the run. Both tools of a clash get a hash (neither wins by coming
//!   first), so the names are stable across segments, replays and compactions for as long as
//!   the session's facts are the same — and the facts are recorded once per session.
//!
//! Non-goals: which tools are offered (the catalog), routing a call back (the offer keeps the
//! name → tool map this returns in order).

use std::collections::{HashMap, HashSet};

use sha2::{Digest, Sha256};

/// The longest name every provider accepts.
pub const MAX_NAME_CHARS: usize = 64;
/// podhost's own tools: no MCP or HTTP tool is offered under these names.
pub const RESERVED: [&str; 10] = [
    "bash",
    "read",
    "write",
    "edit",
    "grep",
    "glob",
    "read_artifact",
    "tool_search",
    "memory",
    "schedule_wake",
];
/// Hex digits of the identity's hash in a hashed name.
const HASH_DIGITS: usize = 8;

/// One tool to name: its identity (what it is, stable across everything) and the name it would
/// like.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wanted {
    pub identity: String,
    pub base: String,
}

impl Wanted {
    /// An MCP tool: `server__tool`.
    pub fn mcp(server: &str, tool: &str) -> Wanted {
        Wanted {
            identity: format!("mcp\u{0}{server}\u{0}{tool}"),
            base: format!("{}__{}", clean(server), clean(tool)),
        }
    }

    /// An HTTP tool of the manifest: its declared name.
    pub fn http(tool: &str) -> Wanted {
        Wanted {
            identity: format!("http\u{0}{tool}"),
            base: clean(tool),
        }
    }
}

/// `s` with every character outside `[A-Za-z0-9_-]` made `_`; `tool` when empty.
fn clean(s: &str) -> String {
    let c: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if c.is_empty() { "tool".to_owned() } else { c }
}

/// `base` cut to leave room for `_<hash>`, then the first `digits` hex digits of the identity's
/// SHA-256.
fn hashed(w: &Wanted, digits: usize) -> String {
    let hex = hex::encode(Sha256::digest(w.identity.as_bytes()));
    let keep = MAX_NAME_CHARS - 1 - digits;
    // `clean` leaves ASCII only: bytes are characters.
    let prefix = &w.base[..w.base.len().min(keep)];
    format!("{prefix}_{}", &hex[..digits])
}

/// The model name of each tool, in the order asked. Two entries with the same identity get the
/// same name.
pub fn model_names(wanted: &[Wanted]) -> Vec<String> {
    // One entry per identity.
    let mut unique: Vec<&Wanted> = Vec::new();
    let mut seen = HashSet::new();
    for w in wanted {
        if seen.insert(w.identity.as_str()) {
            unique.push(w);
        }
    }
    let mut bases: HashMap<&str, usize> = HashMap::new();
    for w in &unique {
        *bases.entry(w.base.as_str()).or_default() += 1;
    }
    let mut names: HashMap<&str, String> = unique
        .iter()
        .map(|w| {
            let plain = w.base.len() <= MAX_NAME_CHARS
                && bases[w.base.as_str()] == 1
                && !RESERVED.contains(&w.base.as_str());
            let name = if plain {
                w.base.clone()
            } else {
                hashed(w, HASH_DIGITS)
            };
            (w.identity.as_str(), name)
        })
        .collect();
    // A hashed name may, against all odds, equal another name: those get longer hashes until
    // every name is its own. Both sides of a clash change, so order still does not matter.
    let mut digits = HASH_DIGITS;
    loop {
        let mut count: HashMap<&str, usize> = HashMap::new();
        for n in names.values() {
            *count.entry(n.as_str()).or_default() += 1;
        }
        let clashing: Vec<&str> = unique
            .iter()
            .map(|w| w.identity.as_str())
            .filter(|id| count[names[id].as_str()] > 1 || RESERVED.contains(&names[id].as_str()))
            .collect();
        if clashing.is_empty() || digits >= 32 {
            break;
        }
        digits += 4;
        for id in clashing {
            if let Some(w) = unique.iter().find(|w| w.identity == id) {
                names.insert(id, hashed(w, digits));
            }
        }
    }
    wanted
        .iter()
        .map(|w| names[w.identity.as_str()].clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn valid(n: &str) -> bool {
        !n.is_empty()
            && n.len() <= MAX_NAME_CHARS
            && n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    }

    #[test]
    fn plain_names_stay_plain() {
        let names = model_names(&[
            Wanted::mcp("everything", "get-tiny-image"),
            Wanted::mcp("py", "add"),
            Wanted::http("weather"),
        ]);
        assert_eq!(names, ["everything__get-tiny-image", "py__add", "weather"]);
    }

    #[test]
    fn clashes_long_names_and_reserved_names_get_hashes_on_both_sides() {
        let a = Wanted::mcp("a.b", "x");
        let b = Wanted::mcp("a_b", "x");
        let long = Wanted::mcp(&"s".repeat(40), &"t".repeat(40));
        let reserved = Wanted::http("bash");
        let odd = Wanted::mcp("ünï", "tool/name");
        let names = model_names(&[a.clone(), b.clone(), long.clone(), reserved, odd]);
        assert_eq!(
            (names[0].as_str(), names[1].as_str()),
            (&*hashed(&a, 8), &*hashed(&b, 8))
        );
        assert!(names[0].starts_with("a_b__x_") && names[0].len() == 6 + 1 + 8);
        assert_ne!(names[0], names[1]);
        assert_eq!(names[2].len(), 64);
        assert!(names[2].starts_with(&"s".repeat(40)), "{}", names[2]);
        assert!(names[3].starts_with("bash_") && names[3].len() == 13);
        assert_eq!(names[4], "_n___tool_name");
        for n in &names {
            assert!(valid(n), "{n}");
            assert!(!RESERVED.contains(&n.as_str()));
        }
        // A name exactly 64 characters long is kept as it is.
        let exact = Wanted::mcp(&"s".repeat(31), &"t".repeat(31));
        assert_eq!(
            model_names(std::slice::from_ref(&exact)),
            [exact.base.as_str()]
        );
        assert_eq!(exact.base.len(), 64);
    }

    #[test]
    fn names_do_not_depend_on_order() {
        let tools = vec![
            Wanted::mcp("a.b", "x"),
            Wanted::mcp("a_b", "x"),
            Wanted::mcp("srv", &"long".repeat(20)),
            Wanted::http("read"),
            Wanted::http("w"),
        ];
        let forward = model_names(&tools);
        let mut reversed = tools.clone();
        reversed.reverse();
        let mut back = model_names(&reversed);
        back.reverse();
        assert_eq!(forward, back);
        // Asking twice for one tool gives one name.
        let twice = model_names(&[tools[0].clone(), tools[0].clone()]);
        assert_eq!(twice[0], twice[1]);
        assert_eq!(twice[0], "a_b__x");
    }
}
