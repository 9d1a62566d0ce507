//! Sampling fields the verify fan-out reproduces exactly on vLLM, read into typed values
//! and forwarded on every verify and relay call. Each is speculated only where vLLM
//! (0.32) applies it from what a verify call also holds — the step's own prompt — and
//! never from the output so far, which a verify call sees as prompt:
//!
//! - `logit_bias`, `allowed_token_ids`: the same logits change at every step, whatever
//!   came before (vllm/v1/sample/logits_processor/builtin.py `LogitBiasLogitsProcessor`,
//!   `AllowedTokenIdsLogitsProcessor`).
//! - `repetition_penalty`: applied to every token of prompt ∪ output
//!   (vllm/model_executor/layers/utils.py `apply_penalties`: `prompt_mask | output_mask`
//!   in the repetition op). A verify prefix is the original prompt followed by the output
//!   so far, so the union is the same set.
//!
//! - `bad_words` whose words are one token each: vLLM bans a word's last token where the
//!   output so far ends with the word's other tokens (vllm/v1/sample/ops/bad_words.py,
//!   `past_tokens_ids` = output ids), so a one-token word is banned at every step, and a
//!   longer one depends on the output, which a verify call holds as prompt: such requests
//!   pass through.
//! - `min_tokens`: masks EOS and the stop token ids while the output is shorter; each
//!   verify and relay call gets what is left of it at its position (`MinTokens`).
//!
//! A value specd does not fully understand (wrong type, out of range) is not read: the
//! request passes through under the field's reason, and the client gets vLLM's own answer.

use serde_json::{Map, Value};

use crate::metrics::labels::PassthroughReason as Reason;
use crate::tokens::ModelTokenizer;
use crate::upstream::verify::{MinTokens, PerStep};

/// Read the per-step fields, or the reason to forward a value specd does not understand.
pub fn read(body: &Map<String, Value>) -> Result<PerStep, Reason> {
    let field = |k: &str| body.get(k).filter(|v| !v.is_null());
    let logit_bias = field("logit_bias")
        .map(|v| logit_bias(v).ok_or(Reason::LogitBias))
        .transpose()?;
    let allowed_token_ids = field("allowed_token_ids")
        .map(|v| token_list(v).ok_or(Reason::UnsupportedParam))
        .transpose()?;
    let repetition_penalty = field("repetition_penalty")
        .map(|v| penalty(v).ok_or(Reason::Penalty))
        .transpose()?;
    let bad_words = field("bad_words")
        .map(|v| words(v).ok_or(Reason::UnsupportedParam))
        .transpose()?
        .filter(|w| !w.is_empty());
    Ok(PerStep {
        logit_bias,
        allowed_token_ids,
        repetition_penalty,
        bad_words,
    })
}

/// What needs the model's tokenizer: bad words of several tokens depend on the output so
/// far; a token id outside the vocabulary is vLLM's to refuse (its status and message,
/// streamed or not).
pub fn check(p: &PerStep, tok: &ModelTokenizer) -> Result<(), Reason> {
    let words = p.bad_words.as_deref();
    if words.is_some_and(|w| !one_token_words(tok, w)) {
        return Err(Reason::UnsupportedParam);
    }
    match p.max_token_id() {
        Some(id) if id as usize >= tok.vocab_size => {
            Err(p.active_reason().unwrap_or(Reason::UnsupportedParam))
        }
        _ => Ok(()),
    }
}

/// Whether vLLM makes every bad word one token: it encodes the word without leading
/// whitespace, and with one space before it, keeping the spaced form only where it has as
/// many tokens (`SamplingParams.update_from_tokenizer`, `add_special_tokens=False`). A
/// tokenizer vLLM runs as a Python class (the tiktoken format) is not specd's to mirror.
pub fn one_token_words(tok: &ModelTokenizer, words: &[String]) -> bool {
    !tok.spaced_specials
        && words.iter().all(|w| {
            tok.tokenizer
                .encode(w.as_str(), false)
                .is_ok_and(|e| e.get_ids().len() == 1)
        })
}

/// A list of non-empty strings that start with no character Python's `str.lstrip` or
/// Rust's `trim_start` would strip (vLLM strips it; the two disagree on a few).
fn words(v: &Value) -> Option<Vec<String>> {
    let strippable = |c: char| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c);
    v.as_array()?
        .iter()
        .map(|w| {
            let w = w.as_str()?;
            let first = w.chars().next()?;
            (!strippable(first)).then(|| w.to_string())
        })
        .collect()
}

/// `min_tokens` (`None` when 0), or the reason to forward it: a value specd does not read
/// itself, one above an explicit `max_tokens` (vLLM refuses it; without `max_tokens` the
/// limit is the upstream's), or stop strings. With stop strings vLLM matches only those
/// that end after the first `min_tokens` tokens' text (vllm/v1/engine/detokenizer.py
/// `update`), which specd's stop matcher does not reproduce.
pub fn min_tokens(
    body: &Map<String, Value>,
    max_tokens: Option<u32>,
    stop: &[String],
    stop_token_ids: &[u32],
) -> Result<Option<MinTokens>, Reason> {
    let Some(v) = body.get("min_tokens").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let count = v.as_u64().and_then(|n| u32::try_from(n).ok());
    let count = count.ok_or(Reason::MinTokens)?;
    if count == 0 {
        return Ok(None);
    }
    if max_tokens.is_none_or(|m| count > m) || !stop.is_empty() {
        return Err(Reason::MinTokens);
    }
    Ok(Some(MinTokens {
        count,
        stop_token_ids: stop_token_ids.to_vec(),
    }))
}

/// `{"<token id>": bias}` with canonical decimal keys and finite numeric biases (vLLM
/// clamps them to ±100 itself; ids outside the vocabulary are checked in [`check`]).
fn logit_bias(v: &Value) -> Option<Vec<(u32, f64)>> {
    v.as_object()?
        .iter()
        .map(|(k, b)| {
            let canonical = !k.is_empty()
                && k.bytes().all(|c| c.is_ascii_digit())
                && (k == "0" || !k.starts_with('0'));
            let id = canonical.then(|| k.parse::<u32>().ok()).flatten()?;
            let b = b.as_f64().filter(|b| b.is_finite())?;
            Some((id, b))
        })
        .collect()
}

/// A non-empty list of JSON integer token ids (vLLM refuses an empty one).
fn token_list(v: &Value) -> Option<Vec<u32>> {
    let a = v.as_array().filter(|a| !a.is_empty())?;
    a.iter()
        .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
        .collect()
}

/// A finite number above 0 (vllm/sampling_params.py `_verify_args`).
fn penalty(v: &Value) -> Option<f64> {
    v.as_f64().filter(|p| p.is_finite() && *p > 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn reads_understood_values() {
        let b = obj(json!({"logit_bias": {"12": -100, "0": 2.5},
            "allowed_token_ids": [3, 4], "repetition_penalty": 1.3}));
        let p = read(&b).expect("understood");
        assert_eq!(p.logit_bias, Some(vec![(0, 2.5), (12, -100.0)]));
        assert_eq!(p.allowed_token_ids, Some(vec![3, 4]));
        assert_eq!(p.repetition_penalty, Some(1.3));
        let mut m = Map::new();
        p.write(&mut m);
        assert_eq!(m["logit_bias"], json!({"0": 2.5, "12": -100.0}));
        assert_eq!(p.active_reason(), Some(Reason::LogitBias));
        assert_eq!(
            read(&obj(json!({"logit_bias": null}))),
            Ok(PerStep::default())
        );
        assert_eq!(read(&obj(json!({"bad_words": []}))), Ok(PerStep::default()));
        let words = read(&obj(json!({"bad_words": ["x y"]}))).expect("read");
        assert_eq!(words.bad_words, Some(vec!["x y".to_string()]));
        let neutral = read(&obj(json!({"logit_bias": {}, "repetition_penalty": 1})));
        assert_eq!(neutral.expect("neutral").active_reason(), None);
    }

    #[test]
    fn min_tokens_needs_a_limit_and_no_stop_strings() {
        let b = obj(json!({"min_tokens": 5}));
        let m = min_tokens(&b, Some(8), &[], &[3]).expect("read");
        assert_eq!(m.as_ref().map(|m| m.count), Some(5));
        let m = m.expect("some");
        assert_eq!((m.left(0), m.left(4), m.left(5), m.left(9)), (5, 1, 0, 0));
        let mut body = Map::new();
        m.write(3, 1, &mut body);
        assert_eq!(body["min_tokens"], json!(1));
        assert_eq!(body["stop_token_ids"], json!([3]));
        let mut body = Map::new();
        m.write(5, 10, &mut body);
        assert!(body.is_empty());
        assert_eq!(
            min_tokens(&obj(json!({"min_tokens": 0})), None, &[], &[]),
            Ok(None)
        );
        let stop = ["x".to_string()];
        for (b, max, stop) in [
            (json!({"min_tokens": 5}), None, &[][..]),
            (json!({"min_tokens": 9}), Some(8), &[][..]),
            (json!({"min_tokens": 5}), Some(8), &stop[..]),
            (json!({"min_tokens": 2.0}), Some(8), &[][..]),
            (json!({"min_tokens": -1}), Some(8), &[][..]),
        ] {
            assert_eq!(min_tokens(&obj(b), max, stop, &[]), Err(Reason::MinTokens));
        }
    }

    #[test]
    fn values_not_understood_are_the_upstreams() {
        for (b, reason) in [
            (json!({"logit_bias": {"x": 1}}), Reason::LogitBias),
            (json!({"logit_bias": {"01": 1}}), Reason::LogitBias),
            (json!({"logit_bias": {"-1": 1}}), Reason::LogitBias),
            (json!({"logit_bias": {"1": "2"}}), Reason::LogitBias),
            (json!({"logit_bias": [1]}), Reason::LogitBias),
            (json!({"allowed_token_ids": []}), Reason::UnsupportedParam),
            (
                json!({"allowed_token_ids": [1.5]}),
                Reason::UnsupportedParam,
            ),
            (json!({"allowed_token_ids": [-1]}), Reason::UnsupportedParam),
            (json!({"repetition_penalty": 0}), Reason::Penalty),
            (json!({"repetition_penalty": "1.2"}), Reason::Penalty),
            (json!({"bad_words": [""]}), Reason::UnsupportedParam),
            (json!({"bad_words": [" x"]}), Reason::UnsupportedParam),
            (json!({"bad_words": "x"}), Reason::UnsupportedParam),
            (json!({"bad_words": [1]}), Reason::UnsupportedParam),
        ] {
            assert_eq!(read(&obj(b.clone())), Err(reason), "{b}");
        }
    }
}
