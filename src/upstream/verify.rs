//! What a verifier is: one upstream call that samples the target's token after each of
//! the K+1 prefixes context, context+d1, …, context+d1..dK; plus tokenizing and relaying.
//! vLLM and SGLang implement [`Backend`].

use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::metrics::labels::PassthroughReason;

/// The client's sampling parameters, passed to the upstream as given (unset stays unset,
/// so the upstream applies the same defaults it would for a direct request).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sampling {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub seed: Option<u64>,
    /// Number of top logprobs wanted per token; `None` when the client asked for none.
    pub logprobs: Option<u32>,
    /// vLLM only: SGLang's backend forwards requests that set them.
    pub per_step: PerStep,
    /// vLLM only, like `per_step`; depends on the position, so each call gets its own.
    pub min_tokens: Option<MinTokens>,
}

impl Sampling {
    /// Greedy when the temperature is explicitly 0 (or top_k is 1).
    pub fn is_greedy(&self) -> bool {
        self.temperature == Some(0.0) || self.top_k == Some(1)
    }

    /// Seeded and sampled: specd seeds each position, so such output depends on where
    /// plain continuations start; these requests never relay and are never passed
    /// through by `auto`.
    pub fn is_seeded_sampled(&self) -> bool {
        self.seed.is_some() && !self.is_greedy()
    }

    /// The sampling fields as upstream JSON (OpenAI/vLLM names).
    pub fn to_json(&self) -> Map<String, Value> {
        let mut m = Map::new();
        if let Some(t) = self.temperature {
            m.insert("temperature".into(), t.into());
        }
        if let Some(p) = self.top_p {
            m.insert("top_p".into(), p.into());
        }
        if let Some(k) = self.top_k {
            m.insert("top_k".into(), k.into());
        }
        if let Some(p) = self.min_p {
            m.insert("min_p".into(), p.into());
        }
        self.per_step.write(&mut m);
        m
    }
}

/// The sampling fields vLLM applies at each step from that step's prompt alone (read by
/// `speculation::policy::exact`, which says why each is reproduced exactly).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PerStep {
    /// Token id → bias, in the client's order.
    pub logit_bias: Option<Vec<(u32, f64)>>,
    pub allowed_token_ids: Option<Vec<u32>>,
    pub repetition_penalty: Option<f64>,
    /// Only words of one token each (the policy checks them with the tokenizer).
    pub bad_words: Option<Vec<String>>,
}

impl PerStep {
    /// Set to a value that changes the output (SGLang does not reproduce these: its
    /// backend forwards the request): the reason it would pass through under.
    pub fn active_reason(&self) -> Option<PassthroughReason> {
        if self.logit_bias.as_ref().is_some_and(|b| !b.is_empty()) {
            return Some(PassthroughReason::LogitBias);
        }
        if self.repetition_penalty.is_some_and(|p| p != 1.0) {
            return Some(PassthroughReason::Penalty);
        }
        let listed = self.allowed_token_ids.is_some() || self.bad_words.is_some();
        listed.then_some(PassthroughReason::UnsupportedParam)
    }

    /// The largest token id the fields name.
    pub fn max_token_id(&self) -> Option<u32> {
        let biased = self.logit_bias.iter().flatten().map(|(id, _)| *id);
        biased
            .chain(self.allowed_token_ids.iter().flatten().copied())
            .max()
    }

    /// The fields in upstream JSON (vLLM's names; unset stays unset).
    pub fn write(&self, m: &mut Map<String, Value>) {
        if let Some(bias) = &self.logit_bias {
            let obj: Map<String, Value> = bias
                .iter()
                .map(|(id, b)| (id.to_string(), Value::from(*b)))
                .collect();
            m.insert("logit_bias".into(), obj.into());
        }
        if let Some(ids) = &self.allowed_token_ids {
            m.insert("allowed_token_ids".into(), ids.clone().into());
        }
        if let Some(p) = self.repetition_penalty {
            m.insert("repetition_penalty".into(), p.into());
        }
        if let Some(words) = &self.bad_words {
            m.insert("bad_words".into(), words.clone().into());
        }
    }
}

/// `min_tokens` as vLLM applies it: EOS and every stop token id are masked while fewer
/// than `count` tokens have been generated (vllm/v1/sample/logits_processor/builtin.py
/// `MinTokensLogitsProcessor`, over `SamplingParams.all_stop_token_ids`: the EOS, the
/// model's further EOS ids and `stop_token_ids`, even with `ignore_eos`). A call whose
/// first token is output token `i` gets `count − i` of its own, with the stop token ids
/// so that they are masked too.
#[derive(Debug, Clone, PartialEq)]
pub struct MinTokens {
    pub count: u32,
    pub stop_token_ids: Vec<u32>,
}

impl MinTokens {
    /// Tokens still under the mask when `generated` tokens precede the call.
    pub fn left(&self, generated: usize) -> u32 {
        let generated = u32::try_from(generated).unwrap_or(u32::MAX);
        self.count.saturating_sub(generated)
    }

    /// The fields of a call of at most `max_tokens` tokens after `generated` ones (vLLM
    /// refuses `min_tokens` above `max_tokens`); nothing once the mask has ended.
    pub fn write(&self, generated: usize, max_tokens: u32, m: &mut Map<String, Value>) {
        let left = self.left(generated).min(max_tokens);
        if left > 0 {
            m.insert("min_tokens".into(), left.into());
            m.insert("stop_token_ids".into(), self.stop_token_ids.clone().into());
        }
    }
}

/// Seed for the token sampled at absolute position `pos`. Each position gets its own
/// random stream, so results are reproducible and independent of how tokens were grouped
/// into rounds (SplitMix64 finaliser over seed and position; kept below 2^63 for servers
/// that parse seeds as signed integers).
pub fn position_seed(seed: u64, pos: usize) -> u64 {
    let mut z = seed ^ (pos as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) >> 1
}

/// One token the target sampled, with its logprob data when asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub id: u32,
    pub logprob: Option<f32>,
    pub top: Vec<(u32, f32)>,
}

impl Sample {
    pub fn id(id: u32) -> Self {
        Sample {
            id,
            logprob: None,
            top: Vec::new(),
        }
    }
}

pub struct VerifyRequest<'a> {
    /// Model name to put in upstream requests.
    pub model: &'a str,
    pub context: &'a [u32],
    /// Output tokens at the end of `context` (for `min_tokens`).
    pub generated: usize,
    pub drafts: &'a [u32],
    pub sampling: &'a Sampling,
}

pub struct RelayRequest<'a> {
    pub model: &'a str,
    pub context: &'a [u32],
    /// Output tokens at the end of `context` (for `min_tokens`).
    pub generated: usize,
    pub sampling: &'a Sampling,
    pub max_tokens: u32,
}

#[derive(Debug, Clone)]
pub struct Tokenized {
    pub tokens: Vec<u32>,
    pub max_model_len: Option<u32>,
}

pub type SampleStream = BoxStream<'static, Result<Sample, ApiError>>;

/// The upstream calls the round loop needs.
pub trait Backend: Send + Sync {
    /// Samples s_0..s_K: the target's token after each prefix (K+1 entries).
    fn verify<'a>(&'a self, req: VerifyRequest<'a>)
        -> BoxFuture<'a, Result<Vec<Sample>, ApiError>>;
    /// Prompt text to token ids exactly as the upstream tokenizes a text prompt.
    fn tokenize_prompt<'a>(
        &'a self,
        model: &'a str,
        prompt: &'a str,
    ) -> BoxFuture<'a, Result<Tokenized, ApiError>>;
    /// Chat messages (with the client's template options) to prompt ids, through the
    /// upstream's own chat template and `add_generation_prompt`.
    fn tokenize_chat<'a>(
        &'a self,
        model: &'a str,
        request: &'a Map<String, Value>,
    ) -> BoxFuture<'a, Result<Tokenized, ApiError>>;
    /// A plain streaming continuation of `context` (relay mode): the upstream decodes,
    /// specd watches the tokens. Dropping the stream aborts the upstream request.
    fn relay<'a>(&'a self, req: RelayRequest<'a>) -> BoxFuture<'a, Result<SampleStream, ApiError>>;
    /// Fit a request to this upstream before speculating on it: fill the sampling fields
    /// the upstream would fill itself for the same direct request on this route (`chat`:
    /// the chat route), or return the passthrough reason when the upstream would apply
    /// something specd cannot reproduce. By default everything stays as the client gave it.
    fn prepare(
        &self,
        _chat: bool,
        _body: &Map<String, Value>,
        _sampling: &mut Sampling,
    ) -> Result<(), PassthroughReason> {
        Ok(())
    }
    /// Refuse a generation request that must not reach the upstream even unchanged (for
    /// passthrough); by default every request may.
    fn screen(&self, _body: &Map<String, Value>) -> Result<(), ApiError> {
        Ok(())
    }
    fn kind(&self) -> &'static str;
    /// SGLang: the chat parsers the server runs, which shape chat answers in place of
    /// specd's `--reasoning-parser`/`--tool-call-parser`.
    fn sglang_parsers(&self) -> Option<&crate::upstream::detect::SglangParsers> {
        None
    }
    /// This backend sending the client's `Authorization` header on its upstream calls, as
    /// the upstream would have received it directly. `None`: not supported, use `self`.
    fn with_auth(&self, _auth: &http::HeaderValue) -> Option<std::sync::Arc<dyn Backend>> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_seeds_differ_and_repeat() {
        let a = position_seed(42, 10);
        assert_eq!(a, position_seed(42, 10));
        assert_ne!(a, position_seed(42, 11));
        assert_ne!(a, position_seed(43, 10));
        assert!(a < (1 << 63));
    }

    #[test]
    fn greedy_detection() {
        let mut s = Sampling::default();
        assert!(!s.is_greedy());
        s.temperature = Some(0.0);
        assert!(s.is_greedy());
    }
}
