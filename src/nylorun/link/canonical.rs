//! Canonical JSON and the effect request hash, exactly as the JavaScript reference computes them
//! (`effectRequestHash`, v2 notes §3.3).
//!
//! Owns: [`canonical`] (keys sorted by UTF-16 code units, no whitespace, `JSON.stringify` number
//! formatting and string escaping) and [`request_hash`] (lowercase hex SHA-256 of its UTF-8).
//!
//! Invariant: same value, same bytes, same hash as core. `spec/request-hash-vectors.json` is the
//! oracle; the tests below check every vector.
//!
//! Non-goals: JavaScript's `undefined` does not exist in a `serde_json::Value`; callers drop it the
//! way the reference does, by serializing with `skip_serializing_if = "Option::is_none"`. NaN and
//! infinities cannot be held in a `Value` either (`JSON.stringify` would write `null`).

use std::fmt::Write as _;

use serde_json::{Number, Value};
use sha2::{Digest, Sha256};

/// The canonical text of `value`.
pub fn canonical(value: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, value);
    out
}

/// `lowercase_hex(SHA-256(UTF-8(canonical(value))))`: 64 characters.
pub fn request_hash(value: &Value) -> String {
    hex::encode(Sha256::digest(canonical(value).as_bytes()))
}

fn write_value(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => write_number(out, n),
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => {
            // JavaScript's default sort compares UTF-16 code units, so an astral character
            // (a surrogate pair, 0xD800…) sorts before U+E000…U+FFFF, unlike Rust's `str` order.
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_by(|a, b| a.encode_utf16().cmp(b.encode_utf16()));
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, key);
                out.push(':');
                if let Some(v) = map.get(key.as_str()) {
                    write_value(out, v);
                }
            }
            out.push('}');
        }
    }
}

/// `JSON.stringify` of a string: `"` and `\` escaped, the short escapes for backspace, form
/// feed, newline, carriage return and tab, other control characters as lowercase `\u00xx`, and
/// everything else (non-ASCII, `/`, U+2028/U+2029) as is.
fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0C}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn write_number(out: &mut String, n: &Number) {
    // Integers a double holds exactly print the same in both languages; anything larger went
    // through a double in JavaScript, so it does here too.
    const SAFE: u64 = 1 << 53;
    if let Some(u) = n.as_u64().filter(|u| *u <= SAFE) {
        let _ = write!(out, "{u}");
    } else if let Some(i) = n.as_i64().filter(|i| i.unsigned_abs() <= SAFE) {
        let _ = write!(out, "{i}");
    } else {
        match n.as_f64() {
            Some(f) => out.push_str(&js_number(f)),
            None => out.push_str("null"),
        }
    }
}

/// ECMAScript `Number::toString(x)` (radix 10): the shortest digits that round-trip, placed by
/// the spec's rules — plain notation for exponents −7 < e < 21, otherwise `d.ddde±x`.
pub fn js_number(x: f64) -> String {
    if x.is_nan() || x.is_infinite() {
        return "null".to_owned();
    }
    if x == 0.0 {
        // Both zeros are "0".
        return "0".to_owned();
    }
    let sign = if x < 0.0 { "-" } else { "" };
    // Rust's `{:e}` prints the shortest round-trip digits (as JavaScript requires), as
    // `d[.ddd]e<exp>`.
    let sci = format!("{:e}", x.abs());
    let Some((mantissa, exp)) = sci.split_once('e') else {
        return format!("{sign}{sci}");
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let Ok(e) = exp.parse::<i32>() else {
        return format!("{sign}{sci}");
    };
    let k = digits.len() as i32;
    // n: the position of the decimal point relative to the digits (value = 0.digits × 10^n).
    let n = e + 1;
    let body = if k <= n && n <= 21 {
        format!("{digits}{}", "0".repeat((n - k) as usize))
    } else if 0 < n && n <= 21 {
        let (int, frac) = digits.split_at(n as usize);
        format!("{int}.{frac}")
    } else if -6 < n && n <= 0 {
        format!("0.{}{digits}", "0".repeat((-n) as usize))
    } else {
        let exp_sign = if n - 1 < 0 { "-" } else { "+" };
        let exp_abs = (n - 1).abs();
        if k == 1 {
            format!("{digits}e{exp_sign}{exp_abs}")
        } else {
            let (first, rest) = digits.split_at(1);
            format!("{first}.{rest}e{exp_sign}{exp_abs}")
        }
    };
    format!("{sign}{body}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    /// A byte-for-byte copy of the project's `spec/request-hash-vectors.json`, kept in the crate
    /// so the build does not depend on a directory beside it.
    const VECTORS: &str = include_str!("testdata/request-hash-vectors.json");

    #[test]
    fn every_vector_matches_canonical_text_and_hash() {
        let doc: Value = serde_json::from_str(VECTORS).unwrap();
        let vectors = doc["vectors"].as_array().unwrap();
        assert!(vectors.len() >= 10, "the vector file lost its vectors");
        for v in vectors {
            let name = v["name"].as_str().unwrap();
            assert_eq!(
                canonical(&v["value"]),
                v["canonical"].as_str().unwrap(),
                "canonical text of vector {name:?}"
            );
            assert_eq!(
                request_hash(&v["value"]),
                v["sha256"].as_str().unwrap(),
                "hash of vector {name:?}"
            );
        }
    }

    #[test]
    fn javascript_number_formatting() {
        let cases: [(f64, &str); 18] = [
            (0.0, "0"),
            (-0.0, "0"),
            (1.0, "1"),
            (-7.0, "-7"),
            (1.5, "1.5"),
            (0.1, "0.1"),
            (0.1 + 0.2, "0.30000000000000004"),
            (1e21, "1e+21"),
            (1e20, "100000000000000000000"),
            (123456789012345680000.0, "123456789012345680000"),
            (1e-7, "1e-7"),
            (1.5e-7, "1.5e-7"),
            (0.000001, "0.000001"),
            (0.0000015, "0.0000015"),
            (5e-324, "5e-324"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (-1.5e300, "-1.5e+300"),
            (123.456, "123.456"),
        ];
        for (x, want) in cases {
            assert_eq!(js_number(x), want, "{x:e}");
        }
    }

    #[test]
    fn large_integers_go_through_a_double_like_javascript() {
        let v: Value = serde_json::from_str("[9007199254740993, -9007199254740993, 42]").unwrap();
        assert_eq!(canonical(&v), "[9007199254740992,-9007199254740992,42]");
    }
}
