//! Incremental Server-Sent-Events parser for upstream streams: feed bytes as they arrive,
//! get the `data:` payloads of complete events.

#[derive(Default)]
pub struct SseParser {
    buf: Vec<u8>,
}

impl SseParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Add bytes; return the data payloads of every event completed by them.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<String> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        // Events are read in place and the buffer is cut once: no copy per event.
        let mut start = 0;
        while let Some((end, sep)) = find_event_end(&self.buf[start..]) {
            if let Some(d) = event_data(&self.buf[start..start + end]) {
                out.push(d);
            }
            start += end + sep;
        }
        self.buf.drain(..start);
        out
    }

    /// Bytes of an incomplete event still held.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }
}

/// The data of one event (its `data:` lines joined by newlines), if it has any.
fn event_data(event: &[u8]) -> Option<String> {
    let mut data: Option<String> = None;
    for line in event.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(rest) = line.strip_prefix(b"data:") {
            let rest = rest.strip_prefix(b" ").unwrap_or(rest);
            // Valid UTF-8 (the usual case) is checked by the fast validator.
            let text = match std::str::from_utf8(rest) {
                Ok(t) => std::borrow::Cow::Borrowed(t),
                Err(_) => String::from_utf8_lossy(rest),
            };
            match &mut data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(&text);
                }
                None => data = Some(text.into_owned()),
            }
        }
    }
    data
}

/// Position of the blank line ending the first event, and the separator's length.
fn find_event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    while i + 1 < buf.len() {
        if buf[i] == b'\n' {
            if buf[i + 1] == b'\n' {
                return Some((i, 2));
            }
            if buf[i + 1] == b'\r' && i + 2 < buf.len() && buf[i + 2] == b'\n' {
                return Some((i, 3));
            }
        }
        i += 1;
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
