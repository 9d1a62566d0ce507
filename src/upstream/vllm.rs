//! vLLM's side of the verify protocol: one `/v1/completions` call whose `prompt` is the
//! list of K+1 token-id prefixes, `max_tokens: 1`, token ids read back through
//! `return_tokens_as_token_ids`. Never `prompt_logprobs`/`echo`: they bypass the prefix cache.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{join_all, BoxFuture};
use futures_util::{FutureExt, StreamExt};
use http::HeaderValue;
use serde_json::{json, Map, Value};

use super::relay_chunk::{self, RelayChunk};
use super::sse::SseParser;
use super::verify::{
    position_seed, Backend, RelayRequest, Sample, SampleStream, Sampling, Tokenized, VerifyRequest,
};
use super::Upstream;
use crate::error::ApiError;
use crate::inline::{Inline, Outbox};

pub struct VllmBackend {
    pub up: Arc<Upstream>,
    /// The client's `Authorization`, sent on every call made for its request.
    pub auth: Option<HeaderValue>,
    /// The server answers `return_token_ids` (vLLM ≥ 0.10.2): sampled ids without
    /// computing logprobs, which costs vLLM's front-end ~0.4 ms per streamed token.
    pub token_ids: bool,
}

impl VllmBackend {
    pub fn new(up: Arc<Upstream>) -> Self {
        VllmBackend {
            up,
            auth: None,
            token_ids: false,
        }
    }

    /// For the server version `version` (as `/version` reports it).
    pub fn for_version(up: Arc<Upstream>, version: &str) -> Self {
        VllmBackend {
            token_ids: returns_token_ids(version),
            ..VllmBackend::new(up)
        }
    }

    fn body(&self, model: &str, sampling: &Sampling) -> Map<String, Value> {
        base_body(model, sampling, self.token_ids)
    }
}

/// Whether vLLM `version` accepts `return_token_ids` on completions (added in 0.10.2).
pub fn returns_token_ids(version: &str) -> bool {
    let mut parts = version
        .trim_start_matches('v')
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u64>().unwrap_or(0));
    let v = (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    );
    v >= (0, 10, 2)
}

/// `"token_id:123"` → 123.
pub fn parse_token_id(s: &str) -> Option<u32> {
    s.strip_prefix("token_id:")?.parse().ok()
}

fn base_body(model: &str, sampling: &Sampling, token_ids: bool) -> Map<String, Value> {
    let mut m = sampling.to_json();
    m.insert("model".into(), model.into());
    m.insert("max_tokens".into(), 1.into());
    if token_ids && sampling.logprobs.is_none() {
        m.insert("return_token_ids".into(), true.into());
    } else {
        // logprobs=0 still returns the sampled token: the way to read its id on servers
        // without `return_token_ids`, or when the client wants logprobs anyway.
        m.insert("logprobs".into(), sampling.logprobs.unwrap_or(0).into());
        m.insert("return_tokens_as_token_ids".into(), true.into());
    }
    m
}

/// The sampled ids of a choice from `token_ids` (no logprobs asked), or from `logprobs`.
pub(super) fn choice_samples(c: &Value, want_top: bool) -> Option<Vec<Sample>> {
    if let Some(lp) = c.get("logprobs").filter(|lp| !lp.is_null()) {
        let n = lp.get("tokens").and_then(Value::as_array)?.len();
        return (0..n).map(|i| sample_at(lp, i, want_top)).collect();
    }
    let ids = c.get("token_ids").and_then(Value::as_array)?;
    ids.iter()
        .map(|t| {
            Some(Sample {
                id: u32::try_from(t.as_u64()?).ok()?,
                logprob: None,
                top: Vec::new(),
            })
        })
        .collect()
}

/// Read (token id, logprob, top logprobs) of entry `i` of a completions `logprobs` object.
fn sample_at(lp: &Value, i: usize, want_top: bool) -> Option<Sample> {
    let id = parse_token_id(lp.get("tokens")?.get(i)?.as_str()?)?;
    let logprob = lp
        .get("token_logprobs")
        .and_then(|t| t.get(i))
        .and_then(Value::as_f64)
        .map(|x| x as f32);
    let mut top = Vec::new();
    if want_top {
        if let Some(obj) = lp
            .get("top_logprobs")
            .and_then(|t| t.get(i))
            .and_then(Value::as_object)
        {
            for (k, v) in obj {
                if let (Some(tid), Some(x)) = (parse_token_id(k), v.as_f64()) {
                    top.push((tid, x as f32));
                }
            }
            top.sort_by(|a, b| b.1.total_cmp(&a.1));
        }
    }
    Some(Sample { id, logprob, top })
}

/// The sampled token of every choice, ordered by `index`.
pub fn parse_verify_response(
    v: &Value,
    expected: usize,
    want_top: bool,
) -> Result<Vec<Sample>, ApiError> {
    let choices = v
        .get("choices")
        .and_then(Value::as_array)
        .ok_or_else(|| ApiError::UpstreamProtocol("verify response has no choices".into()))?;
    let mut out: Vec<Option<Sample>> = vec![None; expected];
    for c in choices {
        let idx = c.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
        let s = choice_samples(c, want_top)
            .and_then(|s| s.into_iter().next())
            .ok_or_else(|| ApiError::UpstreamProtocol("verify choice without a token id".into()))?;
        if idx < expected {
            out[idx] = Some(s);
        }
    }
    out.into_iter()
        .map(|s| {
            s.ok_or_else(|| ApiError::UpstreamProtocol("verify response misses a prompt".into()))
        })
        .collect()
}

impl VllmBackend {
    async fn verify_impl(&self, req: VerifyRequest<'_>) -> Result<Vec<Sample>, ApiError> {
        let k = req.drafts.len();
        let want_top = req.sampling.logprobs.unwrap_or(0) > 0;
        let prefixes: Vec<Vec<u32>> = (0..=k)
            .map(|j| {
                let mut p = Vec::with_capacity(req.context.len() + j);
                p.extend_from_slice(req.context);
                p.extend_from_slice(&req.drafts[..j]);
                p
            })
            .collect();
        let timeout = self.up.verify_timeout();
        let auth = self.auth.as_ref();
        let calls = self
            .verify_calls(&req, &prefixes)
            .into_iter()
            .map(|(at, body)| {
                let body = Value::Object(body);
                async move {
                    let v = self
                        .up
                        .post_json_retry("/v1/completions", &body, timeout, auth)
                        .await?;
                    Ok::<_, ApiError>((at.clone(), parse_verify_response(&v, at.len(), want_top)?))
                }
            });
        let mut out: Vec<Option<Sample>> = vec![None; k + 1];
        for r in join_all(calls).await {
            let (at, samples) = r?;
            for (j, s) in at.into_iter().zip(samples) {
                out[j] = Some(s);
            }
        }
        out.into_iter()
            .map(|s| s.ok_or_else(|| ApiError::UpstreamProtocol("verify misses a prefix".into())))
            .collect()
    }

    /// The upstream calls of one verify: which prefixes each samples after, and its body.
    /// Unseeded, one call takes every prefix, or two where only the first positions are
    /// still under `min_tokens`. Seeded, each position is a call with its own seed: vLLM
    /// gives every prompt of one request the same random stream (batched by the engine).
    fn verify_calls(
        &self,
        req: &VerifyRequest<'_>,
        prefixes: &[Vec<u32>],
    ) -> Vec<(Vec<usize>, Map<String, Value>)> {
        let min = req.sampling.min_tokens.as_ref();
        let masked = |j: usize| min.is_some_and(|m| m.left(req.generated + j) > 0);
        let groups: Vec<Vec<usize>> = match req.sampling.seed {
            Some(_) => (0..prefixes.len()).map(|j| vec![j]).collect(),
            None => {
                let (held, free): (Vec<usize>, Vec<usize>) =
                    (0..prefixes.len()).partition(|&j| masked(j));
                [held, free].into_iter().filter(|g| !g.is_empty()).collect()
            }
        };
        groups
            .into_iter()
            .map(|at| {
                let mut body = self.body(req.model, req.sampling);
                if let Some(m) = min {
                    m.write(req.generated + at[0], 1, &mut body);
                }
                if let Some(seed) = req.sampling.seed {
                    let pos = prefixes[at[0]].len();
                    body.insert("seed".into(), position_seed(seed, pos).into());
                }
                let prompts: Vec<&Vec<u32>> = at.iter().map(|&j| &prefixes[j]).collect();
                body.insert("prompt".into(), json!(prompts));
                (at, body)
            })
            .collect()
    }

    async fn tokenize(&self, body: Value) -> Result<Tokenized, ApiError> {
        let v = self
            .up
            .post_json_retry(
                "/tokenize",
                &body,
                Duration::from_secs(30),
                self.auth.as_ref(),
            )
            .await?;
        let tokens = v
            .get("tokens")
            .and_then(Value::as_array)
            .ok_or_else(|| ApiError::UpstreamProtocol("tokenize response has no tokens".into()))?
            .iter()
            .map(|t| t.as_u64().map(|x| x as u32))
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| {
                ApiError::UpstreamProtocol("tokenize returned a non-integer token".into())
            })?;
        let max_model_len = v
            .get("max_model_len")
            .and_then(Value::as_u64)
            .map(|x| x as u32);
        Ok(Tokenized {
            tokens,
            max_model_len,
        })
    }

    async fn relay_impl(&self, req: RelayRequest<'_>) -> Result<SampleStream, ApiError> {
        let mut body = self.body(req.model, req.sampling);
        let mut max_tokens = req.max_tokens;
        if let Some(m) = &req.sampling.min_tokens {
            if m.left(req.generated) > 0 {
                // Relay only the masked tokens: after them a stop token id would end
                // vLLM's continuation, and specd relays again from there.
                max_tokens = max_tokens.min(m.left(req.generated));
                m.write(req.generated, max_tokens, &mut body);
            }
        }
        body.insert("max_tokens".into(), max_tokens.into());
        body.insert("prompt".into(), json!(req.context));
        body.insert("stream".into(), true.into());
        body.insert("ignore_eos".into(), true.into());
        if let Some(seed) = req.sampling.seed {
            body.insert("seed".into(), position_seed(seed, req.context.len()).into());
        }
        let want_top = req.sampling.logprobs.unwrap_or(0) > 0;
        let resp = self
            .up
            .start_stream("/v1/completions", &Value::Object(body), self.auth.as_ref())
            .await?;
        let up = self.up.clone();
        let mut chunks = self.up.stream_chunks(resp);
        let stream = async_stream_samples(move |tx| async move {
            let mut parser = SseParser::new();
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
                    let err = match relay_chunk::read(data, want_top) {
                        Ok(RelayChunk::Samples(samples)) => {
                            for s in samples {
                                tx.send(Ok(s)).await;
                            }
                            continue;
                        }
                        // A usage-only or finish chunk carries no tokens.
                        Ok(RelayChunk::Empty) => continue,
                        Ok(RelayChunk::Error(message)) => ApiError::Upstream {
                            status: 500,
                            message,
                        },
                        Ok(RelayChunk::NoIds) => {
                            ApiError::UpstreamProtocol("relay chunk without token id".into())
                        }
                        Err(e) => {
                            up.count_error("protocol");
                            ApiError::UpstreamProtocol(format!("bad relay chunk: {e}"))
                        }
                    };
                    tx.send(Err(err)).await;
                    return;
                }
            }
        });
        Ok(stream)
    }
}

/// A stream fed by a producer future that runs inside the consumer's task (see
/// `crate::inline`: no task of its own and no wake-up per token). Dropping the stream drops
/// the producer, and with it the upstream body.
pub fn async_stream_samples<F, Fut>(producer: F) -> SampleStream
where
    F: FnOnce(Outbox<Result<Sample, ApiError>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    Inline::new(producer).boxed()
}

impl Backend for VllmBackend {
    fn with_auth(&self, auth: &HeaderValue) -> Option<Arc<dyn Backend>> {
        Some(Arc::new(VllmBackend {
            up: self.up.clone(),
            auth: Some(auth.clone()),
            token_ids: self.token_ids,
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
        self.tokenize(json!({"model": model, "prompt": prompt}))
            .boxed()
    }
    fn tokenize_chat<'a>(
        &'a self,
        model: &'a str,
        request: &'a Map<String, Value>,
    ) -> BoxFuture<'a, Result<Tokenized, ApiError>> {
        let mut body = Map::new();
        body.insert("model".into(), model.into());
        for key in [
            "messages",
            "chat_template",
            "chat_template_kwargs",
            "add_generation_prompt",
            "continue_final_message",
            "documents",
            // The template renders the tools (vLLM's /tokenize takes them too).
            "tools",
        ] {
            if let Some(v) = request.get(key) {
                body.insert(key.into(), v.clone());
            }
        }
        body.entry("add_generation_prompt").or_insert(true.into());
        body.insert(
            "add_special_tokens".into(),
            request
                .get("add_special_tokens")
                .cloned()
                .unwrap_or(false.into()),
        );
        self.tokenize(Value::Object(body)).boxed()
    }
    fn relay<'a>(&'a self, req: RelayRequest<'a>) -> BoxFuture<'a, Result<SampleStream, ApiError>> {
        self.relay_impl(req).boxed()
    }
    fn kind(&self) -> &'static str {
        "vllm"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_ids_from_vllm_0_10_2_on() {
        assert!(returns_token_ids("0.32.0"));
        assert!(returns_token_ids("v0.10.2rc1"));
        assert!(returns_token_ids("1.0.0"));
        assert!(!returns_token_ids("0.10.1.1"));
        assert!(!returns_token_ids("0.9.2"));
        assert!(!returns_token_ids("0.0.0-specd-sim"));
        assert!(!returns_token_ids("unknown"));
    }

    #[test]
    fn samples_from_token_ids_or_logprobs() {
        let ids = json!({"index": 0, "text": "ab", "logprobs": null, "token_ids": [7, 9]});
        let s = choice_samples(&ids, false).expect("ids");
        assert_eq!(s.iter().map(|x| x.id).collect::<Vec<_>>(), vec![7, 9]);
        assert!(s[0].logprob.is_none());
        let lp =
            json!({"index": 0, "logprobs": {"tokens": ["token_id:5"], "token_logprobs": [-0.1]}});
        assert_eq!(choice_samples(&lp, false).expect("lp")[0].id, 5);
        assert!(choice_samples(&json!({"index": 0, "text": "x"}), false).is_none());
        let mut body = base_body("m", &Sampling::default(), true);
        assert_eq!(body.remove("return_token_ids"), Some(json!(true)));
        assert!(!body.contains_key("logprobs"));
        let body = base_body("m", &Sampling::default(), false);
        assert_eq!(body.get("logprobs"), Some(&json!(0)));
    }

    #[test]
    fn parses_verify_choices_in_index_order() {
        let v = json!({"choices": [
            {"index": 1, "logprobs": {"tokens": ["token_id:7"], "token_logprobs": [-0.5], "top_logprobs": [{"token_id:7": -0.5, "token_id:3": -1.5}]}},
            {"index": 0, "logprobs": {"tokens": ["token_id:5"], "token_logprobs": [-0.1], "top_logprobs": null}}
        ]});
        let s = parse_verify_response(&v, 2, true).expect("parses");
        assert_eq!(s[0].id, 5);
        assert_eq!(s[1].id, 7);
        assert_eq!(s[1].top, vec![(7, -0.5), (3, -1.5)]);
        assert!(parse_verify_response(&v, 3, false).is_err());
        assert!(parse_verify_response(&json!({"x": 1}), 1, false).is_err());
    }

    /// A server that answers one request with SSE events written in the groups given, each
    /// group one write (one HTTP chunk), the next group once `go` fires.
    async fn sse_server(
        groups: Vec<Vec<u32>>,
        mut go: tokio::sync::mpsc::Receiver<()>,
    ) -> std::net::SocketAddr {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let mut req = Vec::new();
            let mut buf = [0u8; 4096];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                match sock.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => req.extend_from_slice(&buf[..n]),
                }
            }
            let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
            let _ = sock.write_all(head.as_bytes()).await;
            for (i, ids) in groups.iter().enumerate() {
                if i > 0 && go.recv().await.is_none() {
                    return;
                }
                let mut events = String::new();
                for id in ids {
                    let c = json!({"choices": [{"index": 0, "text": "x", "token_ids": [id]}]});
                    events.push_str(&format!("data: {c}\n\n"));
                }
                if i + 1 == groups.len() {
                    events.push_str("data: [DONE]\n\n");
                }
                let chunk = format!("{:x}\r\n{events}\r\n", events.len());
                let _ = sock.write_all(chunk.as_bytes()).await;
            }
            let _ = sock.write_all(b"0\r\n\r\n").await;
        });
        addr
    }

    /// A relay of 3 tokens from the server at `addr`, its idle bound 1 s.
    async fn relay_from(
        addr: std::net::SocketAddr,
    ) -> futures_util::stream::Peekable<SampleStream> {
        let url = format!("http://{addr}");
        let args = <crate::config::ServeArgs as clap::Args>::augment_args(clap::Command::new("t"))
            .try_get_matches_from(["t", "--upstream", url.as_str(), "--verify-timeout", "1"])
            .and_then(|m| <crate::config::ServeArgs as clap::FromArgMatches>::from_arg_matches(&m))
            .expect("args");
        let metrics = Arc::new(crate::metrics::Metrics::new());
        let up = Arc::new(Upstream::new(&args, metrics).expect("client"));
        let backend = VllmBackend::for_version(up, "0.32.0");
        let sampling = Sampling::default();
        backend
            .relay_impl(RelayRequest {
                model: "m",
                context: &[1, 2, 3],
                generated: 0,
                sampling: &sampling,
                max_tokens: 3,
            })
            .await
            .expect("stream")
            .peekable()
    }

    /// The relay's delivery-to-delivery timing rests on this: the tokens of one read are
    /// there at once when the next is peeked, a token not yet sent is not.
    #[tokio::test]
    async fn tokens_read_together_are_waiting_and_later_ones_are_not() {
        let (tx, go) = tokio::sync::mpsc::channel(1);
        let addr = sse_server(vec![vec![11, 12], vec![13]], go).await;
        let mut stream = relay_from(addr).await;
        let id = |s: Option<Result<Sample, ApiError>>| s.and_then(Result::ok).map(|s| s.id);
        let waiting = |s: &mut futures_util::stream::Peekable<SampleStream>| {
            std::pin::Pin::new(s)
                .peek()
                .now_or_never()
                .is_some_and(|n| n.is_some())
        };
        assert_eq!(id(stream.next().await), Some(11));
        assert!(
            waiting(&mut stream),
            "the second token of the read is waiting"
        );
        assert_eq!(id(stream.next().await), Some(12));
        assert!(!waiting(&mut stream), "the third token is not sent yet");
        tx.send(()).await.expect("server waits");
        assert_eq!(id(stream.next().await), Some(13));
        assert!(stream.next().await.is_none());
    }

    /// A peek polls the stream with a waker that wakes nothing; the wait for the next token
    /// must still end at the idle bound (`--verify-timeout`), not when the upstream sends.
    #[tokio::test]
    async fn a_peek_leaves_the_idle_bound_in_force() {
        let (_tx, go) = tokio::sync::mpsc::channel(1);
        let addr = sse_server(vec![vec![11], vec![13]], go).await;
        let mut stream = relay_from(addr).await;
        assert!(matches!(stream.next().await, Some(Ok(_))));
        let peeked = std::pin::Pin::new(&mut stream).peek().now_or_never();
        assert!(peeked.is_none(), "nothing more was sent");
        // The server never sends the second token (`go` never fires).
        let next = tokio::time::timeout(Duration::from_secs(120), stream.next()).await;
        assert!(
            matches!(next, Ok(Some(Err(ApiError::UpstreamTimeout(_))))),
            "the idle bound ends the wait"
        );
    }
}
