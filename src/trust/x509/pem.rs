//! Go's `encoding/pem` decoder, which containers/image reads certificates and keys with:
//! blocks found after any junk, headers allowed, malformed blocks skipped. It reads hostile
//! bytes: no indexing, every length checked, linear time.

/// One PEM block, as Go's `pem.Decode` returns it.
pub(crate) struct Block {
    pub kind: Vec<u8>,
    pub has_headers: bool,
    pub bytes: Vec<u8>,
}

const BEGIN: &[u8] = b"\n-----BEGIN ";
const END: &[u8] = b"\n-----END ";
const DASHES: &[u8] = b"-----";

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Go's `getLine`: up to the newline, without a CR before it nor trailing blanks; and the rest.
fn get_line(data: &[u8]) -> (&[u8], &[u8]) {
    let (mut line, rest) = match data.iter().position(|&b| b == b'\n') {
        Some(i) => {
            let (line, rest) = data.split_at_checked(i).unwrap_or((data, &[]));
            (
                line.strip_suffix(b"\r").unwrap_or(line),
                rest.get(1..).unwrap_or(&[]),
            )
        }
        None => (data, &[][..]),
    };
    while let [head @ .., b' ' | b'\t'] = line {
        line = head;
    }
    (line, rest)
}

/// Go's `pem.Decode`: the first well-formed block (skipping anything before it) and what
/// follows its END line. The END search is remembered, so hostile input stays linear.
pub(crate) fn pem_decode(data: &[u8]) -> Option<(Block, &[u8])> {
    let mut rest = data;
    // The first "\n-----END " at or after `rest`, as an offset from the end of `data`.
    let mut next_end: Option<usize> = None;
    loop {
        rest = match rest.strip_prefix(&BEGIN[1..]) {
            Some(after) => after,
            None => rest.get(find(rest, BEGIN)? + BEGIN.len()..)?,
        };
        let (type_line, after) = get_line(rest);
        rest = after;
        let Some(kind) = type_line.strip_suffix(DASHES) else {
            continue;
        };
        let mut has_headers = false;
        loop {
            if rest.is_empty() {
                return None;
            }
            let (line, next) = get_line(rest);
            if !line.contains(&b':') {
                break;
            }
            has_headers = true;
            rest = next;
        }
        let (end_index, trailer_index) = if !has_headers && rest.starts_with(&END[1..]) {
            (0, END.len() - 1)
        } else {
            if next_end.is_none_or(|from_end| from_end > rest.len()) {
                next_end = find(rest, END).map(|i| rest.len() - i);
            }
            let i = rest.len() - next_end?; // No END after here: none after any later BEGIN.
            (i, i + END.len())
        };
        let Some(trailer) = rest.get(trailer_index..) else {
            continue;
        };
        let Some((trailer, end_line)) = trailer.split_at_checked(kind.len() + DASHES.len()) else {
            continue;
        };
        if !trailer.starts_with(kind)
            || !trailer.ends_with(DASHES)
            || !get_line(end_line).0.is_empty()
        {
            continue;
        }
        let text: Vec<u8> = rest
            .get(..end_index)?
            .iter()
            .copied()
            .filter(|c| !matches!(c, b' ' | b'\t'))
            .collect();
        let Ok(bytes) = super::go_base64(&text) else {
            continue;
        };
        let (_, after) = get_line(rest.get(end_index + END.len() - 1..)?);
        let block = Block {
            kind: kind.to_vec(),
            has_headers,
            bytes,
        };
        return Some((block, after));
    }
}

/// Go's `bytes.TrimSpace` (Unicode white space at both ends).
pub(crate) fn trim_space(mut b: &[u8]) -> &[u8] {
    loop {
        let head = b.get(..4.min(b.len())).unwrap_or_default();
        let first = head
            .utf8_chunks()
            .next()
            .and_then(|c| c.valid().chars().next());
        match first {
            Some(c) if c.is_whitespace() => b = b.get(c.len_utf8()..).unwrap_or_default(),
            _ => break,
        }
    }
    loop {
        let start = b.len().saturating_sub(4);
        let tail = b.get(start..).unwrap_or_default();
        let last = tail.utf8_chunks().last().filter(|c| c.invalid().is_empty());
        match last.and_then(|c| c.valid().chars().next_back()) {
            Some(c) if c.is_whitespace() => b = b.get(..b.len() - c.len_utf8()).unwrap_or_default(),
            _ => break,
        }
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pem_blocks_decode_as_in_go() {
        let block =
            |text: &str| pem_decode(text.as_bytes()).map(|(b, rest)| (b.bytes, rest.to_vec()));
        assert_eq!(
            block("-----BEGIN X-----\nQUJD\n-----END X-----\nrest"),
            Some((b"ABC".to_vec(), b"rest".to_vec()))
        );
        assert_eq!(
            block("junk\n-----BEGIN X-----\nQU JD\n-----END X-----  \n"),
            Some((b"ABC".to_vec(), vec![]))
        );
        // Headers, a mismatched END type, bad base64: the block is skipped.
        assert!(block("-----BEGIN X-----\nA: b\nQUJD\n-----END X-----\n").is_some());
        assert!(block("-----BEGIN X-----\nQUJD\n-----END Y-----\n").is_none());
        assert!(block("-----BEGIN X-----\nQUJ\n-----END X-----\n").is_none());
        assert_eq!(
            block("-----BEGIN X-----\n-----END X-----\n-----BEGIN Y-----\n-----END Y-----\n")
                .map(|b| b.0),
            Some(vec![])
        );
        assert!(block("-----BEGIN X-----\nQUJD").is_none());
        assert_eq!(trim_space(" \u{a0}a b\u{3000}\n".as_bytes()), b"a b");
        assert_eq!(trim_space(b"\xff \xff"), b"\xff \xff");
    }

    #[test]
    fn hostile_pem_stays_linear() {
        let many = "-----BEGIN X-----\n".repeat(20_000);
        assert!(pem_decode(many.as_bytes()).is_none());
        let headers = format!("-----BEGIN X-----\n{}", "a: b\n".repeat(20_000));
        assert!(pem_decode(headers.as_bytes()).is_none());
    }
}
