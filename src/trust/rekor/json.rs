//! JSON as containers/image's Go reads a Rekor bundle: a parser that keeps every key in order
//! (duplicates included, which [`super::fields`] judges) and every number's literal (which
//! [`super::jcs`] needs exact). serde_json would drop the duplicates and round some doubles
//! differently from Go.

use anyhow::{anyhow, bail, ensure, Result};

/// Deeper nesting is refused (Go allows 10000; no Rekor bundle nests more than 5).
const MAX_DEPTH: usize = 128;

/// A JSON value: objects as written, numbers as their literal (RFC 8785 needs the exact
/// double, and Go parses integers from the text).
pub(super) enum Value {
    Null,
    Bool(bool),
    Num(String),
    Str(String),
    Arr(Vec<Value>),
    Obj(Vec<(String, Value)>),
}

/// RFC 8259 JSON, read as Go's `encoding/json` reads it: invalid UTF-8 and lone surrogates in
/// strings become U+FFFD.
pub(super) fn parse(bytes: &[u8]) -> Result<Value> {
    let mut parser = Parser { rest: bytes };
    let value = parser.value(0)?;
    parser.skip_space();
    ensure!(parser.rest.is_empty(), "data after the JSON value");
    Ok(value)
}

struct Parser<'a> {
    rest: &'a [u8],
}

impl Parser<'_> {
    fn skip_space(&mut self) {
        while let [b' ' | b'\t' | b'\n' | b'\r', rest @ ..] = self.rest {
            self.rest = rest;
        }
    }

    fn eat(&mut self, byte: u8) -> bool {
        match self.rest.split_first() {
            Some((&b, rest)) if b == byte => {
                self.rest = rest;
                true
            }
            _ => false,
        }
    }

    fn value(&mut self, depth: usize) -> Result<Value> {
        ensure!(depth < MAX_DEPTH, "JSON nested too deeply");
        self.skip_space();
        let close = |p: &mut Self, end: u8| -> Result<bool> {
            p.skip_space();
            if p.eat(b',') {
                return Ok(false);
            }
            ensure!(
                p.eat(end),
                "invalid JSON: expected ',' or '{}'",
                end as char
            );
            Ok(true)
        };
        match self.rest.first() {
            Some(b'{') => {
                self.eat(b'{');
                let mut entries = Vec::new();
                self.skip_space();
                if !self.eat(b'}') {
                    loop {
                        self.skip_space();
                        let key = self.string()?;
                        self.skip_space();
                        ensure!(self.eat(b':'), "invalid JSON: expected ':'");
                        entries.push((key, self.value(depth + 1)?));
                        if close(self, b'}')? {
                            break;
                        }
                    }
                }
                Ok(Value::Obj(entries))
            }
            Some(b'[') => {
                self.eat(b'[');
                let mut items = Vec::new();
                self.skip_space();
                if !self.eat(b']') {
                    loop {
                        items.push(self.value(depth + 1)?);
                        if close(self, b']')? {
                            break;
                        }
                    }
                }
                Ok(Value::Arr(items))
            }
            Some(b'"') => Ok(Value::Str(self.string()?)),
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => {
                for (word, value) in [
                    ("true", Value::Bool(true)),
                    ("false", Value::Bool(false)),
                    ("null", Value::Null),
                ] {
                    if let Some(rest) = self.rest.strip_prefix(word.as_bytes()) {
                        self.rest = rest;
                        return Ok(value);
                    }
                }
                bail!("invalid JSON")
            }
        }
    }

    fn number(&mut self) -> Result<Value> {
        let start = self.rest;
        let digits = |p: &mut Self| {
            let n = p.rest.iter().take_while(|b| b.is_ascii_digit()).count();
            p.rest = p.rest.get(n..).unwrap_or_default();
            n
        };
        self.eat(b'-');
        if !self.eat(b'0') {
            ensure!(digits(self) > 0, "invalid JSON number");
        }
        if self.eat(b'.') {
            ensure!(digits(self) > 0, "invalid JSON number");
        }
        if self.eat(b'e') || self.eat(b'E') {
            let _ = self.eat(b'+') || self.eat(b'-');
            ensure!(digits(self) > 0, "invalid JSON number");
        }
        let literal = start
            .get(..start.len() - self.rest.len())
            .unwrap_or_default();
        Ok(Value::Num(String::from_utf8_lossy(literal).into_owned()))
    }

    fn string(&mut self) -> Result<String> {
        ensure!(self.eat(b'"'), "invalid JSON: expected a string");
        let mut raw = Vec::new();
        loop {
            let (&byte, rest) = self
                .rest
                .split_first()
                .ok_or_else(|| anyhow!("unterminated JSON string"))?;
            self.rest = rest;
            match byte {
                b'"' => break,
                b'\\' => {
                    let (&escape, rest) = self
                        .rest
                        .split_first()
                        .ok_or_else(|| anyhow!("unterminated JSON string"))?;
                    self.rest = rest;
                    let c = match escape {
                        b'"' | b'\\' | b'/' => char::from(escape),
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => self.unicode_escape()?,
                        _ => bail!("invalid JSON string escape"),
                    };
                    raw.extend(c.encode_utf8(&mut [0; 4]).as_bytes());
                }
                c if c < 0x20 => bail!("a control character in a JSON string"),
                c => raw.push(c),
            }
        }
        // Go's replacement: one U+FFFD per byte that is not UTF-8.
        let mut text = String::with_capacity(raw.len());
        for chunk in raw.utf8_chunks() {
            text.push_str(chunk.valid());
            text.extend(chunk.invalid().iter().map(|_| '\u{fffd}'));
        }
        Ok(text)
    }

    /// After `\u`: a character, a surrogate pair, or U+FFFD for a lone surrogate.
    fn unicode_escape(&mut self) -> Result<char> {
        let hex4 = |bytes: &[u8]| {
            let text = std::str::from_utf8(bytes.get(..4)?).ok()?;
            u16::from_str_radix(text, 16)
                .ok()
                .filter(|_| text.bytes().all(|b| b.is_ascii_hexdigit()))
        };
        let unit = hex4(self.rest).ok_or_else(|| anyhow!("invalid JSON \\u escape"))?;
        self.rest = self.rest.get(4..).unwrap_or_default();
        if (0xd800..0xdc00).contains(&unit) {
            let low = self
                .rest
                .strip_prefix(b"\\u")
                .and_then(hex4)
                .filter(|u| (0xdc00..0xe000).contains(u));
            if let Some(low) = low {
                self.rest = self.rest.get(6..).unwrap_or_default();
                let c = 0x10000 + ((u32::from(unit) - 0xd800) << 10) + (u32::from(low) - 0xdc00);
                return Ok(char::from_u32(c).unwrap_or('\u{fffd}'));
            }
        }
        Ok(char::from_u32(u32::from(unit)).unwrap_or('\u{fffd}'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_read_as_go_reads_it() {
        for bad in [
            "",
            "01",
            "1.",
            "-",
            "1e",
            "[1,]",
            "{\"a\"}",
            "{\"a\":1,}",
            "\"\\x\"",
            "\"\u{1}\"",
            "tru",
            "[1] 2",
            "\"abc",
        ] {
            assert!(parse(bad.as_bytes()).is_err(), "{bad}");
        }
        assert!(parse("[".repeat(MAX_DEPTH + 1).as_bytes()).is_err());
    }
}
