//! One streamed request and its timings: time to first token, time per output token after
//! it, end-to-end latency, token counts from `usage`, and specd's `usage.speculation`.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Map, Value};

use specd::upstream::sse::SseParser;

/// specd's per-request speculation report (`usage.speculation`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SpecUsage {
    pub rounds: u64,
    pub draft_tokens: u64,
    pub accepted_tokens: u64,
    pub relay_tokens: u64,
}

impl SpecUsage {
    fn from_json(v: &Value) -> Option<SpecUsage> {
        let n = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
        v.is_object().then(|| SpecUsage {
            rounds: n("rounds"),
            draft_tokens: n("draft_tokens"),
            accepted_tokens: n("accepted_tokens"),
            relay_tokens: n("relay_tokens"),
        })
    }
}

#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Outcome {
    pub ok: bool,
    pub status: u16,
    pub error: Option<String>,
    /// Seconds from the start of the bench to sending the request.
    pub sent_at: f64,
    pub ttft_s: Option<f64>,
    pub tpot_s: Option<f64>,
    pub e2e_s: f64,
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: u64,
    /// Streamed chunks that carried text.
    pub chunks: u64,
    pub speculation: Option<SpecUsage>,
}

fn chunk_text(v: &Value) -> Option<&str> {
    let c = v.pointer("/choices/0")?;
    c.get("text")
        .and_then(Value::as_str)
        .or_else(|| c.pointer("/delta/content").and_then(Value::as_str))
}

/// Send `body` (with `stream: true` added) to `url` and time the answer.
pub async fn run(
    client: &reqwest::Client,
    url: &str,
    api_key: Option<&str>,
    mut body: Map<String, Value>,
    epoch: Instant,
    timeout: Duration,
) -> Outcome {
    body.insert("stream".into(), true.into());
    body.insert(
        "stream_options".into(),
        serde_json::json!({"include_usage": true}),
    );
    let start = Instant::now();
    let mut out = Outcome {
        sent_at: start.duration_since(epoch).as_secs_f64(),
        ..Outcome::default()
    };
    let mut req = client.post(url).json(&Value::Object(body)).timeout(timeout);
    if let Some(k) = api_key {
        req = req.bearer_auth(k);
    }
    let resp = match req.send().await {
        Ok(r) => r,
        Err(e) => {
            out.error = Some(format!("request failed: {e}"));
            out.e2e_s = start.elapsed().as_secs_f64();
            return out;
        }
    };
    out.status = resp.status().as_u16();
    if !resp.status().is_success() {
        let text = resp.text().await.unwrap_or_default();
        out.error = Some(format!(
            "HTTP {}: {}",
            out.status,
            text.chars().take(300).collect::<String>()
        ));
        out.e2e_s = start.elapsed().as_secs_f64();
        return out;
    }
    let mut sse = SseParser::new();
    let mut stream = resp.bytes_stream();
    let mut first: Option<Instant> = None;
    let mut last: Option<Instant> = None;
    let mut done = false;
    'read: while let Some(item) = stream.next().await {
        let bytes = match item {
            Ok(b) => b,
            Err(e) => {
                out.error = Some(format!("stream broke: {e}"));
                break;
            }
        };
        let now = Instant::now();
        for data in sse.feed(&bytes) {
            if data.trim() == "[DONE]" {
                done = true;
                break 'read;
            }
            let Ok(v) = serde_json::from_str::<Value>(&data) else {
                continue;
            };
            if let Some(e) = v.get("error") {
                out.error = Some(format!("error event: {e}"));
                continue;
            }
            if chunk_text(&v).is_some_and(|t| !t.is_empty()) {
                first.get_or_insert(now);
                last = Some(now);
                out.chunks += 1;
            }
            if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
                out.prompt_tokens = u.get("prompt_tokens").and_then(Value::as_u64);
                if let Some(n) = u.get("completion_tokens").and_then(Value::as_u64) {
                    out.completion_tokens = n;
                }
                out.speculation = u.get("speculation").and_then(SpecUsage::from_json);
            }
        }
    }
    let end = Instant::now();
    out.e2e_s = end.duration_since(start).as_secs_f64();
    if out.completion_tokens == 0 {
        // No usage chunk: fall back to counting text chunks.
        out.completion_tokens = out.chunks;
    }
    if let (Some(f), Some(l)) = (first, last) {
        out.ttft_s = Some(f.duration_since(start).as_secs_f64());
        if out.completion_tokens > 1 {
            out.tpot_s =
                Some(l.duration_since(f).as_secs_f64() / (out.completion_tokens - 1) as f64);
        }
    }
    if !done && out.error.is_none() {
        out.error = Some("stream ended without [DONE]".into());
    }
    out.ok = out.error.is_none();
    out
}
