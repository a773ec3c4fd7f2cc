//! RFC 8785 (JCS), the canonical JSON a Rekor SET signs, as gowebpki/jcs (containers/image's
//! canonicalizer) writes it: keys sorted by UTF-16 code units, duplicates refused, numbers as
//! ECMAScript prints the double their literal denotes, strings minimally escaped.

use std::fmt::Write;

use anyhow::{anyhow, ensure, Result};

use super::json::Value;

/// `value`'s canonical form.
pub(super) fn canonical(value: &Value) -> Result<String> {
    let mut out = String::new();
    write_canonical(value, &mut out)?;
    Ok(out)
}

fn write_canonical(value: &Value, out: &mut String) -> Result<()> {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Num(literal) => write_number(literal.parse()?, out)?,
        Value::Str(s) => write_string(s, out),
        Value::Arr(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out)?;
            }
            out.push(']');
        }
        Value::Obj(entries) => {
            let mut sorted: Vec<&(String, Value)> = entries.iter().collect();
            sorted.sort_by(|(a, _), (b, _)| a.encode_utf16().cmp(b.encode_utf16()));
            out.push('{');
            for (i, (key, value)) in sorted.iter().enumerate() {
                if i > 0 {
                    ensure!(
                        sorted.get(i - 1).is_none_or(|(k, _)| k != key),
                        "duplicate key {key:?}"
                    );
                    out.push(',');
                }
                write_string(key, out);
                out.push(':');
                write_canonical(value, out)?;
            }
            out.push('}');
        }
    }
    Ok(())
}

fn write_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c < ' ' => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// ECMAScript's `Number.prototype.toString`, from Rust's shortest round-trip digits.
fn write_number(n: f64, out: &mut String) -> Result<()> {
    ensure!(n.is_finite(), "a JSON number out of range");
    if n == 0.0 {
        out.push('0');
        return Ok(());
    }
    if n < 0.0 {
        out.push('-');
    }
    let scientific = format!("{:e}", n.abs());
    let (mantissa, exponent) = scientific
        .split_once('e')
        .ok_or_else(|| anyhow!("formatting {n}"))?;
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let point = exponent.parse::<i32>()? + 1; // digits[..point] is the integer part
    let count = digits.len() as i32;
    if count <= point && point <= 21 {
        out.push_str(&digits);
        out.extend(std::iter::repeat_n('0', (point - count) as usize));
    } else if 0 < point && point <= 21 {
        let (integer, fraction) = digits
            .split_at_checked(point as usize)
            .unwrap_or((&digits, ""));
        let _ = write!(out, "{integer}.{fraction}");
    } else if -6 < point && point <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-point) as usize));
        out.push_str(&digits);
    } else {
        let (first, rest) = digits.split_at_checked(1).unwrap_or((&digits, ""));
        let dot = if rest.is_empty() { "" } else { "." };
        let _ = write!(out, "{first}{dot}{rest}e{:+}", point - 1);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::json::parse;
    use super::*;

    fn jcs(text: &str) -> Result<String> {
        canonical(&parse(text.as_bytes())?)
    }

    #[test]
    fn canonical_json_is_rfc_8785() {
        // RFC 8785's own examples (§3.2.2, §3.2.3, appendix B).
        assert_eq!(
            jcs(r#"{"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
                "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/", "literals": [null, true, false]}"#)
            .unwrap(),
            r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#
        );
        assert_eq!(jcs(r#"{"\u20ac":1,"\r":2,"\ud83d\ude00":3,"\u0080":4,"1":5,"\u00f6":6,"\ufb33":7,"\u05d1":8}"#).unwrap(),
            "{\"\\r\":2,\"1\":5,\"\u{80}\":4,\"ö\":6,\"\u{5d1}\":8,\"€\":1,\"😀\":3,\"\u{fb33}\":7}");
        for (number, text) in [
            ("1e21", "1e+21"),
            ("1e20", "100000000000000000000"),
            ("-0", "0"),
            ("1e-7", "1e-7"),
            ("0.000001", "0.000001"),
            ("12345678901234567890", "12345678901234567000"),
            ("-1.5", "-1.5"),
            ("9007199254740993", "9007199254740992"),
        ] {
            assert_eq!(jcs(number).unwrap(), text, "{number}");
        }
        assert!(jcs(r#"{"a":1,"b":2,"a":3}"#).is_err());
        // Go's string decoding: lone surrogates and bytes that are not UTF-8 become U+FFFD.
        assert_eq!(
            jcs(r#"["\ud800x", "\ud83d\ude00"]"#).unwrap(),
            "[\"\u{fffd}x\",\"😀\"]"
        );
        assert_eq!(
            canonical(&parse(b"\"a\xffb\xe2\x82\"").unwrap()).unwrap(),
            "\"a\u{fffd}b\u{fffd}\u{fffd}\""
        );
        assert!(jcs("1e400").is_err());
    }
}
