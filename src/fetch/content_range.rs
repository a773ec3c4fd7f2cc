//! The `Content-Range` of a registry's `206 Partial Content` answer to a resumed blob download
//! (RFC 9110 §14.4), read as containers/image reads it (`docker/body_reader.go`,
//! `parseContentRange` and its caller): exactly one value, `bytes FIRST-LAST/LENGTH` or
//! `bytes FIRST-LAST/*`, decimal numbers and nothing else; the answer must start at the byte asked
//! for and run to the end of the blob.
//!
//! RFC 9110 says a recipient of an invalid `Content-Range` must not combine the content with what
//! it already has: bytes from another offset would only be found out by the digest at the end,
//! after the whole rest was downloaded. Such an answer is refused at once, naming the header.

use anyhow::{bail, ensure, Context, Result};

/// A `Content-Range` value: the first and last byte sent, and the blob's length when it is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContentRange {
    pub first: u64,
    pub last: u64,
    pub length: Option<u64>,
}

/// The one `Content-Range` among `values` (every value the answer carried).
pub fn parse(values: &[impl AsRef<str>]) -> Result<ContentRange> {
    let value = match values {
        [] => bail!("no Content-Range header"),
        [one] => one.as_ref(),
        more => bail!("{} Content-Range headers", more.len()),
    };
    parse_value(value).with_context(|| format!("invalid Content-Range {:?}", shown(value)))
}

fn parse_value(value: &str) -> Result<ContentRange> {
    let rest = value
        .strip_prefix("bytes ")
        .context("it does not start with \"bytes \"")?;
    let (span, length) = rest.split_once('/').context("no '/'")?;
    let (first, last) = span.split_once('-').context("no '-'")?;
    let (first, last) = (decimal(first)?, decimal(last)?);
    let length = match length {
        "*" => None,
        n => Some(decimal(n)?),
    };
    ensure!(first <= last, "the first byte is after the last");
    if let Some(length) = length {
        ensure!(last < length, "the last byte is past the length");
    }
    Ok(ContentRange {
        first,
        last,
        length,
    })
}

/// A non-empty run of ASCII digits that fits in a `u64` (Go's parser takes an int64: a larger
/// number is no byte position there either).
fn decimal(text: &str) -> Result<u64> {
    ensure!(
        !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()),
        "{:?} is not a decimal number",
        shown(text)
    );
    text.parse()
        .map_err(|_| anyhow::anyhow!("{text} is too large"))
}

/// Checks that `range` answers a request for the bytes of a `size`-byte blob from `offset` on:
/// it starts there, ends at the blob's end, and (when told) the blob has that length.
pub fn check(range: ContentRange, offset: u64, size: u64) -> Result<()> {
    ensure!(
        range.first == offset,
        "asked for the bytes from {offset} on, the registry sent {}-{}",
        range.first,
        range.last
    );
    ensure!(
        range.last.checked_add(1) == Some(size) && range.length.is_none_or(|n| n == size),
        "asked for the bytes from {offset} to the end of a {size}-byte blob, the registry sent {}-{}/{}",
        range.first,
        range.last,
        range.length.map_or("*".to_string(), |n| n.to_string())
    );
    Ok(())
}

/// `text` cut to a length that fits in one line of an error.
fn shown(text: &str) -> String {
    const MAX: usize = 80;
    match text.char_indices().nth(MAX) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn range(value: &str) -> Result<ContentRange> {
        parse(&[value])
    }

    /// containers/image's `TestParseContentRange` (docker/body_reader_test.go at df7e80d2): its
    /// valid and invalid values, with its verdicts.
    #[test]
    fn containers_image_parse_content_range_cases() {
        let valid = [
            ("bytes 0-0/1", 0, 0, Some(1)),
            ("bytes 010-020/030", 10, 20, Some(30)),
            ("bytes 1000-1010/*", 1000, 1010, None),
        ];
        for (value, first, last, length) in valid {
            assert_eq!(
                range(value).unwrap(),
                ContentRange {
                    first,
                    last,
                    length
                },
                "{value}"
            );
        }
        assert!(parse(&[] as &[&str]).is_err());
        let two = parse(&["bytes 1-2/3", "bytes 1-2/3"]).unwrap_err();
        assert_eq!(two.to_string(), "2 Content-Range headers");
        let invalid = [
            "",
            "notbytes 1-2/3",
            "bytes ",
            "bytes x-2/3",
            "bytes 1*2/3",
            "bytes 1",
            "bytes 1-",
            "bytes 1-x/3",
            "bytes 1-2",
            "bytes 1-2@3",
            "bytes 1-2/",
            "bytes 1-2/*a",
            "bytes 1-2/3a",
        ];
        for value in invalid {
            assert!(range(value).is_err(), "{value:?} accepted");
        }
        // Beyond Go's table, refused by its parser too: a sign, a space, a number past int64.
        for value in [
            "bytes +1-2/3",
            "bytes  1-2/3",
            "bytes 1-2/3 ",
            "bytes 99999999999999999999-1/2",
        ] {
            assert!(range(value).is_err(), "{value:?} accepted");
        }
        // Left by Go's parser to its caller's offset check, refused here already: a span that
        // runs backwards or past the length is no range.
        assert!(range("bytes 100-1/200").is_err());
        assert!(range("bytes 1-200/200").is_err());
    }

    /// containers/image's caller (`bodyReader.Read`): the answer starts at the byte asked for
    /// and runs to the end of the blob.
    #[test]
    fn a_range_must_start_where_asked_and_run_to_the_end() {
        let ok = ContentRange {
            first: 100,
            last: 199,
            length: Some(200),
        };
        check(ok, 100, 200).unwrap();
        check(ContentRange { length: None, ..ok }, 100, 200).unwrap();
        let early = check(ContentRange { first: 0, ..ok }, 100, 200).unwrap_err();
        assert_eq!(
            early.to_string(),
            "asked for the bytes from 100 on, the registry sent 0-199"
        );
        assert!(check(ContentRange { last: 150, ..ok }, 100, 200).is_err());
        assert!(check(ok, 100, 300).is_err(), "another blob's length");
        let max = ContentRange {
            first: 1,
            last: u64::MAX,
            length: None,
        };
        assert!(check(max, 1, u64::MAX).is_err());
    }

    #[test]
    fn errors_name_the_value_on_one_line() {
        let e = range("bytes 5-1/9").unwrap_err();
        assert_eq!(
            format!("{e:#}"),
            "invalid Content-Range \"bytes 5-1/9\": the first byte is after the last"
        );
        let long = format!("bytes {}", "7".repeat(500));
        assert!(format!("{:#}", range(&long).unwrap_err()).len() < 300);
    }

    proptest! {
        /// Any value: an error, or a range whose numbers are in order; never a panic.
        #[test]
        fn any_value_is_an_error_or_a_sane_range(value in any::<String>()) {
            if let Ok(r) = range(&value) {
                prop_assert!(r.first <= r.last);
                prop_assert!(r.length.is_none_or(|n| r.last < n));
                prop_assert!(value.starts_with("bytes "));
            }
        }

        /// Values shaped like the real thing, numbers of any size: parsed exactly, or refused
        /// when out of order; and checking them against any request never panics.
        #[test]
        fn well_formed_values_round_trip(
            first in any::<u64>(), last in any::<u64>(), length in proptest::option::of(any::<u64>()),
            offset in any::<u64>(), size in any::<u64>(),
        ) {
            let text = format!(
                "bytes {first}-{last}/{}",
                length.map_or("*".to_string(), |n| n.to_string())
            );
            match range(&text) {
                Ok(r) => {
                    prop_assert_eq!(r, ContentRange { first, last, length });
                    let fits = first == offset && last.checked_add(1) == Some(size)
                        && length.is_none_or(|n| n == size);
                    prop_assert_eq!(check(r, offset, size).is_ok(), fits);
                }
                Err(_) => prop_assert!(first > last || length.is_some_and(|n| last >= n)),
            }
        }
    }
}
