//! Incremental Server-Sent-Events parser for upstream streams: push bytes as they arrive,
//! take the `data:` payloads of complete events one by one, read in place.

use std::ops::Range;

#[derive(Default)]
pub struct SseParser {
    buf: Vec<u8>,
    /// Start of the first event not taken yet.
    start: usize,
    /// The data of an event of several `data:` lines (or of invalid UTF-8), joined here.
    joined: String,
}

/// Where an event's data is.
enum Data {
    /// One `data:` line: this range of the buffer (the usual case, no copy).
    Line(Range<usize>),
    /// Several lines, joined in `joined`.
    Joined,
}

impl SseParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Add bytes; the events they complete come out of `next_data`.
    pub fn push(&mut self, bytes: &[u8]) {
        // Taken events leave the buffer once per push, not once per event.
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The data of the next complete event that has some (its `data:` lines joined by
    /// newlines); `None` until more bytes complete an event.
    pub fn next_data(&mut self) -> Option<&str> {
        let data = loop {
            let (end, sep) = find_event_end(&self.buf[self.start..])?;
            let event = self.start..self.start + end;
            self.start += end + sep;
            if let Some(d) = event_data(&self.buf, event, &mut self.joined) {
                break d;
            }
        };
        match data {
            Data::Joined => Some(&self.joined),
            // Valid UTF-8 (the usual case) is checked by the fast validator.
            Data::Line(r) => match std::str::from_utf8(&self.buf[r.clone()]) {
                Ok(t) => Some(t),
                Err(_) => {
                    self.joined = String::from_utf8_lossy(&self.buf[r]).into_owned();
                    Some(&self.joined)
                }
            },
        }
    }

    /// Add bytes; return the data payloads of every event completed by them (a copy each:
    /// for callers that keep them).
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<String> {
        self.push(bytes);
        let mut out = Vec::new();
        while let Some(d) = self.next_data() {
            out.push(d.to_string());
        }
        out
    }

    /// Bytes of an incomplete event still held.
    pub fn pending(&self) -> usize {
        self.buf.len() - self.start
    }
}

/// Where the data of the event at `event` of `buf` is, if it has any; the data of several
/// `data:` lines is joined into `joined`.
fn event_data(buf: &[u8], event: Range<usize>, joined: &mut String) -> Option<Data> {
    let mut at = event.start;
    let bytes = &buf[event];
    // One line, the usual event: nothing to split.
    if memchr::memchr(b'\n', bytes).is_none() {
        let r = data_of(bytes)?;
        return Some(Data::Line(at + r.start..at + r.end));
    }
    let mut first: Option<Range<usize>> = None;
    let mut several = false;
    for line in bytes.split(|&b| b == b'\n') {
        let line_start = at;
        at += line.len() + 1;
        let Some(r) = data_of(line) else {
            continue;
        };
        let r = line_start + r.start..line_start + r.end;
        match &first {
            None => first = Some(r),
            Some(f) => {
                if !several {
                    joined.clear();
                    joined.push_str(&String::from_utf8_lossy(&buf[f.clone()]));
                    several = true;
                }
                joined.push('\n');
                joined.push_str(&String::from_utf8_lossy(&buf[r]));
            }
        }
    }
    match first {
        Some(_) if several => Some(Data::Joined),
        first => first.map(Data::Line),
    }
}

/// The data of a `data:` line (`\r` and one space after the colon left out), as a range of it.
fn data_of(line: &[u8]) -> Option<Range<usize>> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let rest = line.strip_prefix(b"data:")?;
    let skip = 5 + usize::from(rest.first() == Some(&b' '));
    Some(skip..line.len())
}

/// Position of the blank line ending the first event, and the separator's length.
fn find_event_end(buf: &[u8]) -> Option<(usize, usize)> {
    for i in memchr::memchr_iter(b'\n', buf) {
        match buf.get(i + 1..) {
            Some([b'\n', ..]) => return Some((i, 2)),
            Some([b'\r', b'\n', ..]) => return Some((i, 3)),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn splits_events_across_chunks() {
        let mut p = SseParser::new();
        assert!(p.feed(b"data: {\"a\"").is_empty());
        assert_eq!(
            p.feed(b":1}\n\ndata: [DONE]\n\n"),
            vec!["{\"a\":1}", "[DONE]"]
        );
        assert_eq!(p.pending(), 0);
    }

    #[test]
    fn crlf_and_comments() {
        let mut p = SseParser::new();
        let got = p.feed(b": ping\r\n\r\ndata: x\r\n\r\n");
        assert_eq!(got, vec!["x"]);
    }

    #[test]
    fn data_lines_are_joined_and_other_fields_skipped() {
        let mut p = SseParser::new();
        let got =
            p.feed(b"data: a\ndata:b\r\n\nevent: x\ndata: y\n\nid: 1\n\ndata: \xff z\n\ndata\n\n");
        assert_eq!(got, vec!["a\nb", "y", "\u{fffd} z"]);
        assert_eq!(p.pending(), 0);
    }

    proptest! {
        #[test]
        fn never_panics_and_is_chunking_invariant(data in proptest::collection::vec(any::<u8>(), 0..512), cut in 0usize..512) {
            let mut whole = SseParser::new();
            let a = whole.feed(&data);
            let mut parts = SseParser::new();
            let cut = cut.min(data.len());
            let mut b = parts.feed(&data[..cut]);
            b.extend(parts.feed(&data[cut..]));
            prop_assert_eq!(a, b);
        }
    }
}
