//! SGLang's side of the verify protocol, through its native `/generate`.
//!
//! - Fan-out (any sampling): one `/generate` call whose `input_ids` is the batch of K+1
//!   prefixes context, context+d1, …, each with `max_new_tokens: 1`; s_j is `output_ids[0]`
//!   of item j. The radix cache serves the shared context; item j computes about j+1
//!   tokens, (K+1)(K+2)/2 in all.
//! - Single sequence (greedy only): `input_ids` = context+d1..dK with `return_logprob`,
//!   `logprob_start_len = len(context) - 1`, `top_logprobs_num >= 1`. Entry j+1 of
//!   `meta_info.input_top_logprobs` is the argmax after context+d1..dj (entry 0 is null),
//!   and `output_ids[0]` is the bonus s_K. SGLang reuses its cache up to
//!   `logprob_start_len`, so the call computes K+1 tokens. These logprobs are raw (before
//!   temperature and top-p), which is why it serves greedy requests only.
//!
//! SGLang fills unset sampling fields itself (its defaults, `--preferred-sampling-params`),
//! so every field that shapes the distribution is sent explicitly, with the value SGLang's
//! own OpenAI route would use for the client's request (see [`SglangBackend::prepare`]).
//! An id outside the model's vocabulary crashes SGLang's scheduler: none is ever sent.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::{FutureExt, StreamExt};
use http::HeaderValue;
use serde_json::{json, Map, Value};

mod wire;

use wire::{keep_top, output_sample, parse_top, protocol, relay_chunk, sampling_params};

use super::detect::{SglangParsers, SglangSettings};
use super::sse::SseParser;
use super::verify::{
    Backend, RelayRequest, Sample, SampleStream, Sampling, Tokenized, VerifyRequest,
};
use super::vllm::async_stream_samples;
use super::Upstream;
use crate::error::ApiError;
use crate::metrics::labels::PassthroughReason;

/// Sampling values from the model's `generation_config.json`, which SGLang's chat route
/// uses for fields the request leaves unset (`--sampling-defaults model`, its default).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelDefaults {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
}

impl ModelDefaults {
    /// The fields SGLang reads (`ModelConfig.get_default_sampling_params`): only values
    /// present in the file count, as with transformers 5, which leaves the rest unset.
    pub fn from_generation_config(v: &Value) -> Self {
        let f = |k: &str| v.get(k).and_then(Value::as_f64);
        ModelDefaults {
            temperature: f("temperature"),
            top_p: f("top_p"),
            top_k: v.get("top_k").and_then(Value::as_i64),
            min_p: f("min_p"),
            repetition_penalty: f("repetition_penalty"),
        }
    }

    /// From `dir/generation_config.json`; empty when there is none.
    pub fn load(dir: &Path) -> Self {
        std::fs::read(dir.join("generation_config.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .map(|v| Self::from_generation_config(&v))
            .unwrap_or_default()
    }
}

/// How greedy requests are verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VerifyStrategy {
    /// Single sequence for greedy requests, fan-out for sampled ones.
    Auto,
    /// Always fan-out.
    FanOut,
}

/// Token work the upstream reported for verify calls, summed (`meta_info.prompt_tokens`
/// and `cached_tokens`): computed tokens = prompt − cached.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VerifyWork {
    pub calls: u64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
}

/// Request fields only SGLang knows that change what is generated or returned; specd
/// cannot reproduce them, so such requests pass through.
const SGLANG_ONLY_FIELDS: &[&str] = &[
    "regex",
    "ebnf",
    "json_schema",
    "structural_tag",
    "stop_regex",
    "custom_logit_processor",
    "custom_params",
    "lora_path",
    "no_stop_trim",
    "return_hidden_states",
    "return_routed_experts",
    "return_token_ids",
    "return_cached_tokens_details",
    "watermark",
    "input_ids",
];

#[derive(Default)]
struct WorkCounters {
    calls: AtomicU64,
    prompt_tokens: AtomicU64,
    cached_tokens: AtomicU64,
}

#[derive(Clone)]
pub struct SglangBackend {
    up: Arc<Upstream>,
    settings: SglangSettings,
    chat_defaults: ModelDefaults,
    /// Ids at or above this are never sent (they crash the server).
    vocab_limit: u32,
    strategy: VerifyStrategy,
    /// Shared with the per-request copies made by `with_auth`.
    work: Arc<WorkCounters>,
    /// The client's `Authorization`, sent on every call made for its request.
    auth: Option<HeaderValue>,
    /// The server's chat parsers, against specd's flags.
    parsers: SglangParsers,
}

impl SglangBackend {
    pub fn new(
        up: Arc<Upstream>,
        settings: SglangSettings,
        chat_defaults: ModelDefaults,
        vocab_limit: u32,
    ) -> Self {
        SglangBackend {
            up,
            chat_defaults,
            vocab_limit,
            strategy: VerifyStrategy::Auto,
            work: Arc::default(),
            auth: None,
            parsers: SglangParsers::new(&settings, None, None),
            settings,
        }
    }

    /// Compare the server's chat parsers with specd's flags (names, where given).
    pub fn with_parser_flags(mut self, reasoning: Option<&str>, tools: Option<&str>) -> Self {
        self.parsers = SglangParsers::new(&self.settings, reasoning, tools);
        self
    }

    pub fn with_strategy(mut self, strategy: VerifyStrategy) -> Self {
        self.strategy = strategy;
        self
    }

    pub fn work(&self) -> VerifyWork {
        let w = &self.work;
        VerifyWork {
            calls: w.calls.load(Ordering::Relaxed),
            prompt_tokens: w.prompt_tokens.load(Ordering::Relaxed),
            cached_tokens: w.cached_tokens.load(Ordering::Relaxed),
        }
    }

    /// Fill the sampling fields SGLang's OpenAI route would fill for this request, or say
    /// why the request must pass through. Completions: OpenAI defaults (temperature 1,
    /// top_p 1, top_k −1, min_p 0). Chat: the model's generation_config first (when the
    /// server uses it), then those. A non-neutral repetition penalty from the model cannot
    /// be reproduced: SGLang applies it to output tokens only, and a verify prefix is all
    /// input.
    pub fn prepare_sampling(
        &self,
        chat: bool,
        body: &Map<String, Value>,
        s: &mut Sampling,
    ) -> Result<(), PassthroughReason> {
        if SGLANG_ONLY_FIELDS.iter().any(|k| {
            body.get(*k)
                .is_some_and(|v| !v.is_null() && v != &Value::Bool(false))
        }) {
            return Err(PassthroughReason::UnsupportedParam);
        }
        // SGLang's penalizers count output tokens only (a verify prefix is all input), and
        // the rest are vLLM's fields.
        if let Some(reason) = s.per_step.active_reason() {
            return Err(reason);
        }
        if s.min_tokens.is_some() {
            return Err(PassthroughReason::MinTokens);
        }
        // `base:adapter` selects a LoRA adapter on SGLang's OpenAI routes.
        if body
            .get("model")
            .and_then(Value::as_str)
            .is_some_and(|m| m.contains(':'))
        {
            return Err(PassthroughReason::Lora);
        }
        let none = ModelDefaults::default();
        let d = if chat && self.settings.model_sampling_defaults {
            &self.chat_defaults
        } else {
            &none
        };
        let user_penalty = body.get("repetition_penalty").is_some_and(|v| !v.is_null());
        if !user_penalty && d.repetition_penalty.is_some_and(|p| p != 1.0) {
            return Err(PassthroughReason::Penalty);
        }
        s.temperature = Some(s.temperature.or(d.temperature).unwrap_or(1.0));
        s.top_p = Some(s.top_p.or(d.top_p).unwrap_or(1.0));
        s.top_k = Some(s.top_k.or(d.top_k).unwrap_or(-1));
        s.min_p = Some(s.min_p.or(d.min_p).unwrap_or(0.0));
        Ok(())
    }

    fn is_greedy(s: &Sampling) -> bool {
        s.temperature.is_some_and(|t| t < 1e-6) || s.top_k == Some(1)
    }

    fn check_ids(&self, ids: &[u32]) -> Result<(), ApiError> {
        match ids.iter().find(|&&t| t >= self.vocab_limit) {
            Some(bad) => Err(ApiError::BadRequest(format!(
                "token id {bad} is out of vocabulary (size {})",
                self.vocab_limit
            ))),
            None => Ok(()),
        }
    }

    /// The first id outside the vocabulary in a token list or a list of token lists.
    fn bad_id(&self, v: &Value) -> Option<i64> {
        match v {
            Value::Number(n) => {
                let id = n.as_i64().unwrap_or(i64::MAX);
                (id < 0 || id >= i64::from(self.vocab_limit)).then_some(id)
            }
            Value::Array(a) => a.iter().find_map(|x| self.bad_id(x)),
            _ => None,
        }
    }

    fn count_work(&self, item: &Value) {
        let m = |k: &str| {
            item.pointer(&format!("/meta_info/{k}"))
                .and_then(Value::as_u64)
        };
        let w = &self.work;
        w.calls.fetch_add(1, Ordering::Relaxed);
        w.prompt_tokens
            .fetch_add(m("prompt_tokens").unwrap_or(0), Ordering::Relaxed);
        w.cached_tokens
            .fetch_add(m("cached_tokens").unwrap_or(0), Ordering::Relaxed);
    }

    async fn verify_impl(&self, req: VerifyRequest<'_>) -> Result<Vec<Sample>, ApiError> {
        self.check_ids(req.context)?;
        // A draft the model cannot emit is never accepted: verify only the drafts before
        // it. The samples after that point are never read (the acceptance walk stops at
        // the invalid draft), so they are filled with the last real one.
        let k = req.drafts.len();
        let valid = req
            .drafts
            .iter()
            .position(|&d| d >= self.vocab_limit)
            .unwrap_or(k);
        let drafts = &req.drafts[..valid];
        let mut samples = if valid > 0
            && !req.context.is_empty()
            && self.strategy == VerifyStrategy::Auto
            && Self::is_greedy(req.sampling)
        {
            self.verify_single(req.context, drafts, req.sampling)
                .await?
        } else {
            self.verify_fan_out(req.context, drafts, req.sampling)
                .await?
        };
        if let Some(last) = samples.last().cloned() {
            samples.resize(k + 1, last);
        }
        Ok(samples)
    }

    async fn verify_fan_out(
        &self,
        context: &[u32],
        drafts: &[u32],
        sampling: &Sampling,
    ) -> Result<Vec<Sample>, ApiError> {
        let prefixes: Vec<Vec<u32>> = (0..=drafts.len())
            .map(|j| [context, &drafts[..j]].concat())
            .collect();
        let mut body = Map::new();
        body.insert("input_ids".into(), json!(prefixes));
        body.insert(
            "sampling_params".into(),
            sampling_params(sampling, 1).into(),
        );
        if let Some(n) = sampling.logprobs {
            body.insert("return_logprob".into(), true.into());
            body.insert("top_logprobs_num".into(), n.into());
        }
        let v = self
            .up
            .post_json_retry(
                "/generate",
                &Value::Object(body),
                self.up.verify_timeout(),
                self.auth.as_ref(),
            )
            .await?;
        let items = match v {
            Value::Array(a) => a,
            other => vec![other],
        };
        if items.len() != prefixes.len() {
            return Err(protocol(format!(
                "verify sent {} prompts, got {} answers",
                prefixes.len(),
                items.len()
            )));
        }
        items
            .iter()
            .map(|item| {
                self.count_work(item);
                output_sample(item, sampling.logprobs)
            })
            .collect()
    }

    async fn verify_single(
        &self,
        context: &[u32],
        drafts: &[u32],
        sampling: &Sampling,
    ) -> Result<Vec<Sample>, ApiError> {
        let k = drafts.len();
        let n_top = sampling.logprobs.unwrap_or(0).max(1);
        let input_ids = [context, drafts].concat();
        let body = json!({
            "input_ids": input_ids,
            "sampling_params": sampling_params(sampling, 1),
            "return_logprob": true,
            "logprob_start_len": context.len() - 1,
            "top_logprobs_num": n_top,
        });
        let v = self
            .up
            .post_json_retry(
                "/generate",
                &body,
                self.up.verify_timeout(),
                self.auth.as_ref(),
            )
            .await?;
        let item = match &v {
            Value::Array(a) if a.len() == 1 => &a[0],
            other => other,
        };
        self.count_work(item);
        let tops = item
            .pointer("/meta_info/input_top_logprobs")
            .and_then(Value::as_array)
            .filter(|t| t.len() == k + 1)
            .ok_or_else(|| protocol("verify answer lacks input_top_logprobs for every draft"))?;
        let mut out = Vec::with_capacity(k + 1);
        for top in &tops[1..] {
            let top = parse_top(top);
            let &(id, lp) = top
                .first()
                .ok_or_else(|| protocol("empty input_top_logprobs entry"))?;
            out.push(Sample {
                id,
                logprob: sampling.logprobs.map(|_| lp),
                top: keep_top(top, sampling.logprobs),
            });
        }
        out.push(output_sample(item, sampling.logprobs)?);
        Ok(out)
    }

    async fn tokenize(&self, body: Value) -> Result<Tokenized, ApiError> {
        let v = self
            .up
            .post_json_retry(
                "/v1/tokenize",
                &body,
                Duration::from_secs(30),
                self.auth.as_ref(),
            )
            .await?;
        let tokens = v
            .get("tokens")
            .and_then(Value::as_array)
            .ok_or_else(|| protocol("tokenize response has no tokens"))?
            .iter()
            .map(|t| t.as_u64().and_then(|x| u32::try_from(x).ok()))
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| protocol("tokenize returned a non-integer token"))?;
        // SGLang reports the tokenizer's model_max_length here, not the server's context
        // length: leave it to detection.
        Ok(Tokenized {
            tokens,
            max_model_len: None,
        })
    }

    async fn relay_impl(&self, req: RelayRequest<'_>) -> Result<SampleStream, ApiError> {
        self.check_ids(req.context)?;
        let mut body = Map::new();
        body.insert("input_ids".into(), json!(req.context));
        body.insert(
            "sampling_params".into(),
            sampling_params(req.sampling, req.max_tokens).into(),
        );
        body.insert("stream".into(), true.into());
        if let Some(n) = req.sampling.logprobs {
            body.insert("return_logprob".into(), true.into());
            body.insert("top_logprobs_num".into(), n.into());
        }
        let resp = self
            .up
            .start_stream("/generate", &Value::Object(body), self.auth.as_ref())
            .await?;
        let up = self.up.clone();
        let incremental = self.settings.incremental_streaming;
        let logprobs = req.sampling.logprobs;
        let mut chunks = self.up.stream_chunks(resp);
        Ok(async_stream_samples(move |tx| async move {
            let mut parser = SseParser::new();
            let mut seen = 0usize;
            while let Some(chunk) = chunks.next().await {
                let chunk = match chunk {
                    Ok(c) => c,
                    Err(e) => {
                        tx.send(Err(e)).await;
                        return;
                    }
                };
                parser.push(&chunk);
                while let Some(data) = parser.next_data() {
                    if data == "[DONE]" {
                        return;
                    }
                    let new = match relay_chunk(data, seen, incremental, logprobs) {
                        Ok(s) => s,
                        Err(e) => {
                            up.count_error("protocol");
                            tx.send(Err(e)).await;
                            return;
                        }
                    };
                    seen += new.len();
                    for s in new {
                        tx.send(Ok(s)).await;
                    }
                }
            }
        }))
    }
}

impl Backend for SglangBackend {
    fn with_auth(&self, auth: &HeaderValue) -> Option<Arc<dyn Backend>> {
        Some(Arc::new(SglangBackend {
            auth: Some(auth.clone()),
            ..self.clone()
        }))
    }
    fn verify<'a>(
        &'a self,
        req: VerifyRequest<'a>,
    ) -> BoxFuture<'a, Result<Vec<Sample>, ApiError>> {
        self.verify_impl(req).boxed()
    }
    fn tokenize_prompt<'a>(
        &'a self,
        model: &'a str,
        prompt: &'a str,
    ) -> BoxFuture<'a, Result<Tokenized, ApiError>> {
        // SGLang's completions route encodes text with the tokenizer's special tokens.
        self.tokenize(json!({"model": model, "prompt": prompt, "add_special_tokens": true}))
            .boxed()
    }
    fn tokenize_chat<'a>(
        &'a self,
        model: &'a str,
        request: &'a Map<String, Value>,
    ) -> BoxFuture<'a, Result<Tokenized, ApiError>> {
        // Without `add_generation_prompt`, SGLang renders the messages exactly as for a chat
        // completion (its own template, generation prompt unless continuing the last
        // assistant message), so only the fields that rendering reads are sent.
        let mut body = Map::new();
        body.insert("model".into(), model.into());
        for key in [
            "messages",
            "tools",
            "tool_choice",
            "parallel_tool_calls",
            "reasoning_effort",
            "continue_final_message",
            "chat_template_kwargs",
        ] {
            if let Some(v) = request.get(key).filter(|v| !v.is_null()) {
                body.insert(key.into(), v.clone());
            }
        }
        self.tokenize(Value::Object(body)).boxed()
    }
    fn relay<'a>(&'a self, req: RelayRequest<'a>) -> BoxFuture<'a, Result<SampleStream, ApiError>> {
        self.relay_impl(req).boxed()
    }
    fn prepare(
        &self,
        chat: bool,
        body: &Map<String, Value>,
        sampling: &mut Sampling,
    ) -> Result<(), PassthroughReason> {
        self.prepare_sampling(chat, body, sampling)
    }
    fn screen(&self, body: &Map<String, Value>) -> Result<(), ApiError> {
        // SGLang does not range-check prompt ids: one bad id takes its scheduler down.
        for key in ["prompt", "input_ids"] {
            if let Some(bad) = body.get(key).and_then(|v| self.bad_id(v)) {
                return Err(ApiError::BadRequest(format!(
                    "token id {bad} is out of vocabulary (size {})",
                    self.vocab_limit
                )));
            }
        }
        Ok(())
    }
    fn kind(&self) -> &'static str {
        "sglang"
    }
    fn sglang_parsers(&self) -> Option<&SglangParsers> {
        Some(&self.parsers)
    }
}

#[cfg(test)]
mod tests;
