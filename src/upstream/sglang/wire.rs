//! SGLang's wire format: the `sampling_params` specd sends and the `/generate` answers
//! it reads (shapes of SGLang 0.5.23's tokenizer_manager.py and io_struct.py: logprob items
//! `[logprob, token_id, text|null]`, streamed chunks cumulative unless
//! `--incremental-streaming-output`).

use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::upstream::verify::{Sample, Sampling};

pub(super) fn protocol(msg: impl Into<String>) -> ApiError {
    ApiError::UpstreamProtocol(msg.into())
}

/// Every field that shapes the distribution, explicitly (neutral penalties: requests with
/// penalties never reach here). Stops are specd's job, so EOS does not end the call.
/// The client's seed goes as is: SGLang already derives the random stream of each sample
/// from the seed and the sample's absolute position, so positions never share one, and a
/// seeded answer is the one SGLang itself would give (it honours seeds only with
/// `--enable-deterministic-inference`).
pub(super) fn sampling_params(s: &Sampling, max_new_tokens: u32) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("max_new_tokens".into(), max_new_tokens.into());
    m.insert("min_new_tokens".into(), 0.into());
    m.insert("n".into(), 1.into());
    m.insert("temperature".into(), s.temperature.unwrap_or(1.0).into());
    m.insert("top_p".into(), s.top_p.unwrap_or(1.0).into());
    m.insert("top_k".into(), s.top_k.unwrap_or(-1).into());
    m.insert("min_p".into(), s.min_p.unwrap_or(0.0).into());
    m.insert("frequency_penalty".into(), 0.0.into());
    m.insert("presence_penalty".into(), 0.0.into());
    m.insert("repetition_penalty".into(), 1.0.into());
    m.insert("ignore_eos".into(), true.into());
    m.insert("skip_special_tokens".into(), false.into());
    if let Some(seed) = s.seed {
        // Parsed from a signed or unsigned JSON integer; SGLang keeps seeds as int64.
        m.insert("sampling_seed".into(), (seed as i64).into());
    }
    m
}

/// `[[logprob, id, text|null], …]` → (id, logprob) pairs, in the server's order.
pub(super) fn parse_top(v: &Value) -> Vec<(u32, f32)> {
    v.as_array()
        .map(|a| a.iter().filter_map(parse_entry).collect())
        .unwrap_or_default()
}

pub(super) fn parse_entry(e: &Value) -> Option<(u32, f32)> {
    let lp = e.get(0)?.as_f64()? as f32;
    let id = u32::try_from(e.get(1)?.as_u64()?).ok()?;
    Some((id, lp))
}

pub(super) fn keep_top(mut top: Vec<(u32, f32)>, want: Option<u32>) -> Vec<(u32, f32)> {
    top.truncate(want.unwrap_or(0) as usize);
    top
}

/// The first generated token of a `/generate` answer, with its logprob data if asked.
pub(super) fn output_sample(item: &Value, want: Option<u32>) -> Result<Sample, ApiError> {
    if let Some(msg) = item.pointer("/error/message").and_then(Value::as_str) {
        return Err(ApiError::Upstream {
            status: 500,
            message: msg.to_string(),
        });
    }
    output_sample_at(item, 0, want)
        .ok_or_else(|| protocol("generate answer without an output token"))
}

pub(super) fn output_sample_at(item: &Value, i: usize, want: Option<u32>) -> Option<Sample> {
    let id = u32::try_from(item.get("output_ids")?.get(i)?.as_u64()?).ok()?;
    let (logprob, top) = match want {
        None => (None, Vec::new()),
        Some(_) => {
            let meta = item.get("meta_info")?;
            let lp = meta
                .get("output_token_logprobs")
                .and_then(|l| l.get(i))
                .and_then(parse_entry)
                .map(|(_, lp)| lp);
            let top = meta
                .get("output_top_logprobs")
                .and_then(|t| t.get(i))
                .map(parse_top)
                .unwrap_or_default();
            (lp, keep_top(top, want))
        }
    };
    Some(Sample { id, logprob, top })
}

/// The tokens a streamed `/generate` chunk adds after the `seen` already read. Without
/// `--incremental-streaming-output` each chunk repeats every id (and logprob) so far.
pub(super) fn relay_chunk(
    data: &str,
    seen: usize,
    incremental: bool,
    want: Option<u32>,
) -> Result<Vec<Sample>, ApiError> {
    let v: Value =
        serde_json::from_str(data).map_err(|e| protocol(format!("bad relay chunk: {e}")))?;
    if let Some(msg) = v.pointer("/error/message").and_then(Value::as_str) {
        let status = v
            .pointer("/error/code")
            .and_then(Value::as_u64)
            .and_then(|c| u16::try_from(c).ok())
            .unwrap_or(500);
        return Err(ApiError::Upstream {
            status,
            message: msg.to_string(),
        });
    }
    let n = v
        .get("output_ids")
        .and_then(Value::as_array)
        .ok_or_else(|| protocol("relay chunk without output_ids"))?
        .len();
    let start = if incremental { 0 } else { seen.min(n) };
    (start..n)
        .map(|i| {
            output_sample_at(&v, i, want).ok_or_else(|| protocol("relay chunk with a bad token"))
        })
        .collect()
}
