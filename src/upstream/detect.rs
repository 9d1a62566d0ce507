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

/// Ask the upstream what it is. `/v1/models` is common to both servers; `owned_by`, then
/// SGLang's `/server_info` (or the older `/get_server_info`), tell them apart.
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
                server_info = Some(v);
                break;
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
    }
    Ok(UpstreamInfo {
        kind,
        model,
        version,
        max_model_len,
        root,
    })
}
