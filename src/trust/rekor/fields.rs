//! How containers/image's Go types take the bundle's JSON values: the strict object reading of
//! its `ParanoidUnmarshalJSONObject` (no unknown, duplicate or missing key), the lenient one of
//! Go's `encoding/json` for the Rekor API types (case-insensitive names, the last duplicate
//! wins, a nested object merges into what an earlier duplicate left), and Go's decoding of
//! `[]byte`, `int64`, `string` and `*string` fields.

use anyhow::{anyhow, bail, ensure, Result};

use super::json::Value;
use crate::trust::x509::go_base64;

/// `ParanoidUnmarshalJSONObjectExactFields`: an object with exactly these keys, once each.
pub(super) fn exact_fields<'v, const N: usize>(
    value: &'v Value,
    names: [&str; N],
) -> Result<[&'v Value; N]> {
    let Value::Obj(entries) = value else {
        bail!("not a JSON object")
    };
    let mut found: [Option<&Value>; N] = [None; N];
    for (key, value) in entries {
        let slot = names
            .iter()
            .position(|n| n == key)
            .and_then(|i| found.get_mut(i));
        let slot = slot.ok_or_else(|| anyhow!("unknown key {key:?}"))?;
        ensure!(slot.is_none(), "duplicate key {key:?}");
        *slot = Some(value);
    }
    let mut fields = Vec::with_capacity(N);
    for (name, value) in names.iter().zip(found) {
        fields.push(value.ok_or_else(|| anyhow!("key {name:?} missing"))?);
    }
    fields
        .try_into()
        .map_err(|_| anyhow!("internal error: field count"))
}

/// Whether Go's `encoding/json` fills field `name` (ASCII) from `key`: an exact or
/// case-insensitive match, with Unicode's simple folding of K and ſ.
pub(super) fn key_is(key: &str, name: &str) -> bool {
    let fold = |c: char| match c {
        '\u{212a}' => 'k',
        '\u{17f}' => 's',
        c => c.to_ascii_lowercase(),
    };
    key.chars().map(fold).eq(name.chars().map(fold))
}

fn mismatch(what: &str) -> anyhow::Error {
    anyhow!("a JSON value is not {what}")
}

/// A Go `[]byte` field: base64 text, an array of small integers, or null (none).
pub(super) fn bytes(value: &Value, into: &mut Option<Vec<u8>>) -> Result<()> {
    *into = match value {
        Value::Null => None,
        Value::Str(text) => Some(go_base64(text.as_bytes())?),
        Value::Arr(items) => Some(items.iter().map(byte).collect::<Result<_>>()?),
        _ => bail!(mismatch("bytes")),
    };
    Ok(())
}

fn byte(value: &Value) -> Result<u8> {
    match value {
        Value::Null => Ok(0),
        Value::Num(literal) => literal.parse().map_err(|_| mismatch("a byte")),
        _ => bail!(mismatch("a byte")),
    }
}

/// A Go `int64` field: an integer literal in range; null leaves it.
pub(super) fn int(value: &Value, into: &mut i64) -> Result<()> {
    match value {
        Value::Null => {}
        Value::Num(literal) => *into = literal.parse().map_err(|_| mismatch("an int64"))?,
        _ => bail!(mismatch("an integer")),
    }
    Ok(())
}

/// A Go `string` field; null leaves it.
pub(super) fn string(value: &Value, into: &mut String) -> Result<()> {
    match value {
        Value::Null => {}
        Value::Str(text) => text.clone_into(into),
        _ => bail!(mismatch("a string")),
    }
    Ok(())
}

/// A Go `*string` field; null clears it.
pub(super) fn opt_string(value: &Value, into: &mut Option<String>) -> Result<()> {
    *into = match value {
        Value::Null => None,
        Value::Str(text) => Some(text.clone()),
        _ => bail!(mismatch("a string")),
    };
    Ok(())
}

/// A Go pointer-to-struct field: null clears it, an object fills it (into what an earlier
/// duplicate left), `field` taking each key and value.
pub(super) fn object<T: Default>(
    value: &Value,
    into: &mut Option<T>,
    mut field: impl FnMut(&mut T, &str, &Value) -> Result<()>,
) -> Result<()> {
    match value {
        Value::Null => *into = None,
        Value::Obj(entries) => {
            let fields = into.get_or_insert_with(T::default);
            for (key, value) in entries {
                field(fields, key, value)?;
            }
        }
        _ => bail!(mismatch("an object")),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::json::parse;
    use super::*;

    #[test]
    fn go_field_decoding() {
        let value = |text: &str| parse(text.as_bytes()).unwrap();
        let mut b = None;
        bytes(&value(r#""QUJD""#), &mut b).unwrap();
        assert_eq!(b.as_deref(), Some(&b"ABC"[..]));
        bytes(&value("[65, 66, null]"), &mut b).unwrap();
        assert_eq!(b.as_deref(), Some(&b"AB\0"[..]));
        for bad in ["[256]", "[1.0]", "[-1]", r#""QUJ""#, "1", "{}"] {
            assert!(bytes(&value(bad), &mut b).is_err(), "{bad}");
        }
        let mut n = 7;
        int(&value("null"), &mut n).unwrap();
        assert_eq!(n, 7);
        for bad in ["1.5", "1e3", "9223372036854775808", "\"1\""] {
            assert!(int(&value(bad), &mut n).is_err(), "{bad}");
        }
        assert!(
            key_is("APIVERSION", "apiVersion")
                && key_is("\u{212a}ind", "kind")
                && !key_is("kinds", "kind")
        );
        let object = value(r#"{"b":1,"a":2}"#);
        let fields = exact_fields(&object, ["a", "b"]).unwrap();
        assert!(matches!(fields, [Value::Num(a), Value::Num(b)] if a == "2" && b == "1"));
        for bad in [
            r#"{"a":1}"#,
            r#"{"a":1,"b":2,"c":3}"#,
            r#"{"a":1,"b":2,"a":3}"#,
            "[]",
            "null",
        ] {
            assert!(exact_fields(&value(bad), ["a", "b"]).is_err(), "{bad}");
        }
    }
}
