//! Upstream detection: vLLM or SGLang, the served model, its context length and path.

use std::fmt;
use std::time::Duration;

use reqwest::Client;
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamKind {
    Vllm,
    Sglang,
}

impl UpstreamKind {
    pub fn as_str(self) -> &'static str {
        match self {
            UpstreamKind::Vllm => "vllm",
            UpstreamKind::Sglang => "sglang",
        }
    }
}

impl fmt::Display for UpstreamKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamInfo {
    pub kind: UpstreamKind,
    /// Served model name (what clients put in `model`).
    pub model: String,
    pub version: String,
    pub max_model_len: u32,
    /// Model directory on the upstream's disk (shared with specd in a sidecar pod).
    pub root: Option<String>,
    /// Server settings that change how specd talks to SGLang (None for vLLM).
    pub sglang: Option<SglangSettings>,
}

/// The SGLang server settings specd's requests depend on (from `/server_info`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SglangSettings {
    /// `--incremental-streaming-output`: streamed `/generate` chunks carry only new ids
    /// (otherwise every chunk repeats all ids so far).
    pub incremental_streaming: bool,
    /// `--sampling-defaults model` (the default): the chat route fills unset sampling
    /// fields from the model's `generation_config.json`.
    pub model_sampling_defaults: bool,
    /// `--reasoning-parser`: the server splits reasoning out of chat answers.
    pub reasoning_parser: Option<String>,
    /// `--tool-call-parser`: the server reads tool calls out of chat answers.
    pub tool_call_parser: Option<String>,
}

impl SglangSettings {
    fn from_server_info(si: &Value) -> Self {
        let name = |k: &str| {
            si.get(k)
                .and_then(Value::as_str)
                .filter(|v| !v.is_empty())
                .map(str::to_string)
        };
        SglangSettings {
            incremental_streaming: si
                .get("incremental_streaming_output")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            // Absent in versions that predate the flag, which had the model behaviour.
            model_sampling_defaults: si
                .get("sampling_defaults")
                .and_then(Value::as_str)
                .is_none_or(|v| v == "model"),
            reasoning_parser: name("reasoning_parser"),
            tool_call_parser: name("tool_call_parser"),
        }
    }
}

/// The chat parsers an SGLang server runs (its `/server_info`), and whether specd's own
/// `--reasoning-parser`/`--tool-call-parser` name others (then chat passes through).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SglangParsers {
    pub reasoning: Option<String>,
    pub tools: Option<String>,
    pub disagree: bool,
}

impl SglangParsers {
    /// The server's parsers against specd's flags (`None`: not given). Names compare
    /// with `-` and `_` alike (SGLang's `deepseek-r1` is vLLM's `deepseek_r1`).
    pub fn new(s: &SglangSettings, reasoning_flag: Option<&str>, tools_flag: Option<&str>) -> Self {
        let norm = |n: &str| n.trim().replace('-', "_").to_ascii_lowercase();
        let agrees = |flag: Option<&str>, server: &Option<String>| match flag {
            None => true,
            Some(f) => server.as_deref().is_some_and(|v| norm(v) == norm(f)),
        };
        SglangParsers {
            reasoning: s.reasoning_parser.clone(),
            tools: s.tool_call_parser.clone(),
            disagree: !agrees(reasoning_flag, &s.reasoning_parser)
                || !agrees(tools_flag, &s.tool_call_parser),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DetectError {
    #[error("upstream did not answer {0}: {1}")]
    Unreachable(&'static str, String),
    #[error("upstream serves no model")]
    NoModel,
    #[error("upstream kind forced to {forced} but the server at this address is {found}")]
    KindMismatch {
        forced: UpstreamKind,
        found: UpstreamKind,
    },
}

async fn get_json(client: &Client, url: String) -> Option<Value> {
    let resp = client
        .get(url)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .ok()?;
    if !resp.status().is_success() {
        return None;
    }
    resp.json().await.ok()
}

/// SGLang's `/server_info` is its flattened server arguments plus a few runtime fields;
/// vLLM's development-mode `/server_info` has none of these.
fn looks_like_sglang(si: &Value) -> bool {
    ["max_total_num_tokens", "internal_states", "model_path"]
        .iter()
        .any(|k| si.get(k).is_some())
}

fn sglang_input_limit(si: &Value) -> Option<u32> {
    let n = si.get("max_req_input_len").and_then(Value::as_u64)?;
    u32::try_from(n).ok().filter(|&n| n > 0)
}

/// Ask the upstream what it is. `/v1/models` is common to both servers; `owned_by`
/// (`vllm` or `sglang`), then SGLang's `/server_info` (or the older `/get_server_info`),
/// tell them apart.
pub async fn detect(client: &Client, base: &str) -> Result<UpstreamInfo, DetectError> {
    let models = client
        .get(format!("{base}/v1/models"))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .map_err(|e| DetectError::Unreachable("/v1/models", e.to_string()))?
        .json::<Value>()
        .await
        .map_err(|e| DetectError::Unreachable("/v1/models", e.to_string()))?;
    let first = models
        .pointer("/data/0")
        .cloned()
        .ok_or(DetectError::NoModel)?;
    let model = first
        .get("id")
        .and_then(Value::as_str)
        .ok_or(DetectError::NoModel)?
        .to_string();
    let owned_by = first.get("owned_by").and_then(Value::as_str).unwrap_or("");
    let mut max_model_len = first
        .get("max_model_len")
        .and_then(Value::as_u64)
        .unwrap_or(0) as u32;
    let mut root = first
        .get("root")
        .and_then(Value::as_str)
        .map(str::to_string);

    let mut server_info = None;
    if owned_by != "vllm" {
        for p in ["/server_info", "/get_server_info"] {
            if let Some(v) = get_json(client, format!("{base}{p}")).await {
                if looks_like_sglang(&v) {
                    server_info = Some(v);
                    break;
                }
            }
        }
    }
    let kind = if owned_by == "sglang" || server_info.is_some() {
        UpstreamKind::Sglang
    } else {
        UpstreamKind::Vllm
    };

    let version = match kind {
        UpstreamKind::Vllm => get_json(client, format!("{base}/version"))
            .await
            .and_then(|v| v.get("version").and_then(Value::as_str).map(str::to_string)),
        UpstreamKind::Sglang => server_info
            .as_ref()
            .and_then(|v| v.get("version").and_then(Value::as_str).map(str::to_string)),
    }
    .unwrap_or_else(|| "unknown".to_string());

    if kind == UpstreamKind::Sglang {
        for p in ["/model_info", "/get_model_info"] {
            if let Some(v) = get_json(client, format!("{base}{p}")).await {
                if let Some(path) = v.get("model_path").and_then(Value::as_str) {
                    root = Some(path.to_string());
                }
                break;
            }
        }
        if max_model_len == 0 {
            if let Some(si) = &server_info {
                max_model_len = si
                    .get("context_length")
                    .or_else(|| si.get("max_model_len"))
                    .and_then(Value::as_u64)
                    .unwrap_or(0) as u32;
            }
        }
        // SGLang refuses any input of `max_req_input_len` tokens or more (context length
        // and KV pool, minus a reserve), and every verify or relay call sends the whole
        // context as input: that is the longest context specd can work with.
        if let Some(limit) = server_info.as_ref().and_then(sglang_input_limit) {
            max_model_len = match max_model_len {
                0 => limit,
                n => n.min(limit),
            };
        }
    }
    let sglang = (kind == UpstreamKind::Sglang).then(|| {
        server_info
            .as_ref()
            .map(SglangSettings::from_server_info)
            .unwrap_or_default()
    });
    Ok(UpstreamInfo {
        kind,
        model,
        version,
        max_model_len,
        root,
        sglang,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sglang_server_info_is_recognised() {
        assert!(looks_like_sglang(
            &json!({"version": "0.5.23", "max_total_num_tokens": 8192, "model_path": "/m"})
        ));
        assert!(!looks_like_sglang(&json!({"vllm_config": "..."})));
    }

    #[test]
    fn sglang_input_limit_bounds_the_context() {
        assert_eq!(
            sglang_input_limit(&json!({"max_req_input_len": 2042})),
            Some(2042)
        );
        assert_eq!(sglang_input_limit(&json!({"max_req_input_len": 0})), None);
        assert_eq!(sglang_input_limit(&json!({})), None);
    }

    #[test]
    fn sglang_settings_from_server_info() {
        let s = SglangSettings::from_server_info(&json!({
            "incremental_streaming_output": true, "sampling_defaults": "openai",
            "reasoning_parser": null, "tool_call_parser": "qwen"}));
        assert!(s.incremental_streaming && !s.model_sampling_defaults);
        assert_eq!(s.reasoning_parser, None);
        assert_eq!(s.tool_call_parser.as_deref(), Some("qwen"));
        let d = SglangSettings::from_server_info(&json!({}));
        assert!(!d.incremental_streaming && d.model_sampling_defaults);
        assert_eq!((d.reasoning_parser, d.tool_call_parser), (None, None));
    }

    #[test]
    fn specd_flags_must_agree_with_the_server() {
        let s = SglangSettings::from_server_info(&json!({
            "reasoning_parser": "deepseek-r1", "tool_call_parser": "hermes"}));
        assert!(!SglangParsers::new(&s, None, None).disagree);
        assert!(!SglangParsers::new(&s, Some("deepseek_r1"), Some("hermes")).disagree);
        assert!(SglangParsers::new(&s, Some("qwen3"), None).disagree);
        assert!(SglangParsers::new(&s, None, Some("llama3_json")).disagree);
        let none = SglangSettings::default();
        assert!(SglangParsers::new(&none, Some("deepseek_r1"), None).disagree);
    }
}
