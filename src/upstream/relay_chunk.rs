//! One streamed `/v1/completions` chunk of a relay, read as what it says. Typed and
//! borrowing, a chunk parses in a fraction of the time a `Value` tree takes (building and
//! dropping the tree was the largest part of a relayed token's CPU). Whatever the typed
//! form does not take (odd types, duplicate keys, top logprobs) is read through `Value`
//! as before, so the outcome is the same for every input.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::Value;

use super::verify::Sample;
use super::vllm::{choice_samples, parse_token_id};

/// What one relay chunk says.
#[derive(Debug, PartialEq)]
pub enum RelayChunk {
    /// The upstream reported an error with this message.
    Error(String),
    /// The sampled tokens, in order.
    Samples(Vec<Sample>),
    /// No tokens (a usage-only or finish chunk).
    Empty,
    /// Text without token ids: the upstream does not speak the protocol.
    NoIds,
}

#[derive(Deserialize)]
struct Chunk<'a> {
    #[serde(default, borrow)]
    error: Option<ErrorBody<'a>>,
    #[serde(default, borrow)]
    choices: Option<Vec<Choice<'a>>>,
}

#[derive(Deserialize)]
struct ErrorBody<'a> {
    #[serde(default, borrow)]
    message: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(default)]
    token_ids: Option<Vec<u64>>,
    #[serde(default, borrow)]
    logprobs: Option<ChoiceLogprobs<'a>>,
}

#[derive(Deserialize)]
struct ChoiceLogprobs<'a> {
    #[serde(default, borrow)]
    tokens: Option<Vec<Cow<'a, str>>>,
    #[serde(default)]
    token_logprobs: Option<Vec<Option<f64>>>,
}

/// Read one chunk's `data`; `want_top` when the client asked for top logprobs.
pub fn read(data: &str, want_top: bool) -> Result<RelayChunk, serde_json::Error> {
    if !want_top {
        if let Ok(c) = serde_json::from_str::<Chunk<'_>>(data) {
            return Ok(c.said());
        }
    }
    let v: Value = serde_json::from_str(data)?;
    Ok(from_value(&v, want_top))
}

/// The general path, for any JSON.
fn from_value(v: &Value, want_top: bool) -> RelayChunk {
    if let Some(msg) = v.pointer("/error/message").and_then(Value::as_str) {
        return RelayChunk::Error(msg.to_string());
    }
    let Some(c) = v.pointer("/choices/0") else {
        return RelayChunk::Empty;
    };
    let has_text = c
        .get("text")
        .and_then(Value::as_str)
        .is_some_and(|t| !t.is_empty());
    match choice_samples(c, want_top) {
        Some(s) => RelayChunk::Samples(s),
        None if has_text => RelayChunk::NoIds,
        None => RelayChunk::Empty,
    }
}

impl Chunk<'_> {
    fn said(self) -> RelayChunk {
        if let Some(msg) = self.error.and_then(|e| e.message) {
            return RelayChunk::Error(msg.into_owned());
        }
        let Some(c) = self.choices.and_then(|c| c.into_iter().next()) else {
            return RelayChunk::Empty;
        };
        let has_text = c.text.as_ref().is_some_and(|t| !t.is_empty());
        match c.samples() {
            Some(s) => RelayChunk::Samples(s),
            None if has_text => RelayChunk::NoIds,
            None => RelayChunk::Empty,
        }
    }
}

impl Choice<'_> {
    /// As `choice_samples` reads them: from `logprobs` when present, else `token_ids`.
    fn samples(self) -> Option<Vec<Sample>> {
        if let Some(lp) = self.logprobs {
            let lps = lp.token_logprobs.unwrap_or_default();
            return lp
                .tokens?
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    Some(Sample {
                        id: parse_token_id(t)?,
                        logprob: lps.get(i).copied().flatten().map(|x| x as f32),
                        top: Vec::new(),
                    })
                })
                .collect();
        }
        self.token_ids?
            .into_iter()
            .map(|t| Some(Sample::id(u32::try_from(t).ok()?)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The typed reading agrees with the `Value` one on every kind of chunk.
    #[test]
    fn typed_and_value_readings_agree() {
        let chunks = [
            r#"{"id":"c","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" a","logprobs":{"text_offset":[0],"token_logprobs":[-0.25],"tokens":["token_id:17"],"top_logprobs":null},"finish_reason":null,"stop_reason":null}],"usage":null}"#,
            r#"{"choices":[{"index":0,"text":"ab","logprobs":null,"token_ids":[7,9]}]}"#,
            r#"{"choices":[{"text":"x","logprobs":{"tokens":["token_id:3","token_id:4"],"token_logprobs":[null,1]}}]}"#,
            r#"{"choices":[{"text":"x","logprobs":{"tokens":["bad"]}}]}"#,
            r#"{"choices":[{"text":"x","token_ids":[4294967296]}]}"#,
            r#"{"choices":[{"text":"","finish_reason":"length"}],"usage":{"prompt_tokens":3}}"#,
            r#"{"choices":[{"text":"x"}]}"#,
            r#"{"choices":[],"usage":{"completion_tokens":4}}"#,
            r#"{"choices":null}"#,
            r#"{"error":{"message":"boom","code":500}}"#,
            r#"{"choices":[{"text":"\u00e9\n","token_ids":[1]}]}"#,
            // Not for the typed form: read through `Value`.
            r#"{"error":{"message":7},"choices":[{"token_ids":[1]}]}"#,
            r#"{"choices":[{"text":"x","token_ids":[-1]}]}"#,
            r#"{"choices":[{"text":"x","token_ids":[2.0]}]}"#,
            r#"{"choices":{"0":{"text":"x","token_ids":[5]}}}"#,
            r#"{"error":"text","choices":[{"token_ids":[1]}]}"#,
            r#"{"choices":[{"token_ids":[1]}],"choices":[{"token_ids":[2]}]}"#,
            r#"{"choices":[{"text":5,"token_ids":[1]}]}"#,
        ];
        let mut typed = 0;
        for c in chunks {
            let v: Value = serde_json::from_str(c).expect("valid JSON");
            if let Ok(t) = serde_json::from_str::<Chunk<'_>>(c) {
                assert_eq!(t.said(), from_value(&v, false), "{c}");
                typed += 1;
            }
            for want_top in [false, true] {
                assert_eq!(
                    read(c, want_top).ok(),
                    Some(from_value(&v, want_top)),
                    "{c}"
                );
            }
        }
        // The last seven of those are for the `Value` path only.
        assert_eq!(typed, chunks.len() - 7, "chunks read typed");
        assert!(read("{not json", false).is_err());
    }
}
