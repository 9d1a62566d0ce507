//! SGLang 0.5.23's `deepseek-r1` reasoning parser (`srt/parser/reasoning_parser.py`,
//! `DeepSeekR1Detector` on `BaseReasoningFormatDetector`, with `force_reasoning` and the
//! default `stream_reasoning`), reproduced on text: an answer is reasoning until the
//! first `</think>`, whatever the prompt; leading `<think>`s are dropped.

const START: &str = "<think>";
const END: &str = "</think>";

/// `detect_and_parse`: the reasoning and the normal text of a whole answer.
pub fn split_full(text: &str) -> (String, String) {
    let mut rest = text;
    while let Some(r) = rest.strip_prefix(START) {
        rest = r;
    }
    match rest.split_once(END) {
        Some((r, c)) => (r.to_string(), c.to_string()),
        None => (rest.to_string(), String::new()),
    }
}

/// `_ends_with_partial_token`: the longest end of `buffer` that is a proper prefix of
/// `token`.
fn partial_len(buffer: &str, token: &str) -> usize {
    let max = (token.len() - 1).min(buffer.len());
    (1..=max)
        .rev()
        .find(|&i| {
            buffer.is_char_boundary(buffer.len() - i)
                && token.starts_with(&buffer[buffer.len() - i..])
        })
        .unwrap_or(0)
}

/// The streaming state of one answer (`parse_streaming_increment`, then `finish`).
#[derive(Debug, Clone)]
pub struct Stream {
    buffer: String,
    stripped: bool,
    in_reasoning: bool,
}

impl Default for Stream {
    fn default() -> Self {
        Stream {
            buffer: String::new(),
            stripped: false,
            in_reasoning: true,
        }
    }
}

impl Stream {
    pub fn is_closed(&self) -> bool {
        !self.in_reasoning
    }

    /// One chunk's text: the reasoning and the normal text it releases.
    pub fn step(&mut self, new_text: &str) -> (String, String) {
        self.buffer.push_str(new_text);
        let current = self.buffer.clone();
        if [START, END]
            .iter()
            .any(|t| t.starts_with(current.as_str()) && *t != current)
        {
            return Default::default();
        }
        let mut current = current;
        if !self.stripped && current.contains(START) {
            current = current.replacen(START, "", 1);
            self.buffer = current.clone();
            self.stripped = true;
            self.in_reasoning = true;
        }
        if self.in_reasoning {
            if let Some(end) = current.find(END) {
                self.buffer.clear();
                self.in_reasoning = false;
                return (
                    current[..end].to_string(),
                    current[end + END.len()..].to_string(),
                );
            }
            let mut hold = partial_len(&current, END);
            if !self.stripped {
                hold = hold.max(partial_len(&current, START));
            }
            let keep = current.len() - hold;
            self.buffer = current[keep..].to_string();
            return (current[..keep].to_string(), String::new());
        }
        self.buffer.clear();
        (String::new(), current)
    }

    /// `finish`: what is still held when the stream ends.
    pub fn finish(&mut self) -> (String, String) {
        let buffer = std::mem::take(&mut self.buffer);
        if !self.in_reasoning {
            return (String::new(), buffer);
        }
        let buffer = buffer.strip_prefix(START).unwrap_or(&buffer).to_string();
        (buffer, String::new())
    }
}

/// The scheduler's `reasoning_tokens`: every output token up to and including the end
/// of the first `</think>` token sequence (all of them when it never comes).
pub fn reasoning_tokens(ids: &[u32], end_ids: &[u32]) -> u32 {
    if end_ids.is_empty() {
        return 0;
    }
    let at = ids
        .windows(end_ids.len())
        .position(|w| w == end_ids)
        .map(|p| p + end_ids.len());
    at.unwrap_or(ids.len()) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_and_streamed_split() {
        assert_eq!(
            split_full("<think><think>a</think>b"),
            ("a".into(), "b".into())
        );
        assert_eq!(split_full("a"), ("a".into(), String::new()));
        let mut s = Stream::default();
        let mut out = (String::new(), String::new());
        for piece in ["<", "think>", "x", "</", "think>", " y"] {
            let (r, c) = s.step(piece);
            out.0.push_str(&r);
            out.1.push_str(&c);
        }
        assert_eq!(out, ("x".into(), " y".into()));
        assert_eq!(reasoning_tokens(&[1, 2, 9, 3], &[9]), 3);
        assert_eq!(reasoning_tokens(&[1, 2], &[9]), 2);
    }
}
