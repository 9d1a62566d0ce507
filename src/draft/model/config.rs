//! Tolerant reading of a Hugging Face `config.json` for the Llama, Qwen2 and Qwen3 families.
//!
//! Fields moved between transformers releases (transformers 5 writes `rope_parameters`
//! instead of `rope_theta`/`rope_scaling`, `dtype` instead of `torch_dtype`, and
//! `sliding_window: null`), so the file is read as loose JSON and each field is looked up
//! where any release put it.

use serde_json::Value;

use crate::draft::DraftError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Llama,
    Qwen2,
    Qwen3,
}

#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    None,
    Linear {
        factor: f64,
    },
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
}

#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub family: Family,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    pub max_position_embeddings: usize,
    /// Per-head RMSNorm of queries and keys before the rotation (Qwen3).
    pub qk_norm: bool,
    /// The dtype the checkpoint was saved in, if the config says.
    pub dtype: Option<String>,
}

fn err(msg: impl Into<String>) -> DraftError {
    DraftError::Model(msg.into())
}

fn get_usize(v: &Value, key: &str) -> Option<usize> {
    v.get(key).and_then(Value::as_u64).map(|x| x as usize)
}

fn get_f64(v: &Value, key: &str) -> Option<f64> {
    v.get(key).and_then(Value::as_f64)
}

fn need_usize(v: &Value, key: &str) -> Result<usize, DraftError> {
    get_usize(v, key).ok_or_else(|| err(format!("config.json: missing or invalid `{key}`")))
}

impl ModelConfig {
    pub fn from_file(path: &std::path::Path) -> Result<Self, DraftError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| err(format!("cannot read {}: {e}", path.display())))?;
        Self::from_json(&text)
    }

    pub fn from_json(text: &str) -> Result<Self, DraftError> {
        let root: Value =
            serde_json::from_str(text).map_err(|e| err(format!("config.json: {e}")))?;
        // Multimodal wrappers keep the language model under `text_config`.
        let v = match root.get("text_config") {
            Some(t) if t.is_object() && t.get("hidden_size").is_some() => t,
            _ => &root,
        };
        let model_type = v
            .get("model_type")
            .or_else(|| root.get("model_type"))
            .and_then(Value::as_str)
            .unwrap_or("");
        let arch = root
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(Value::as_str)
            .unwrap_or("");
        let family = match (model_type, arch) {
            (m, _) if m.starts_with("qwen3") => Family::Qwen3,
            (m, _) if m.starts_with("qwen2") => Family::Qwen2,
            ("llama" | "mistral", _) => Family::Llama,
            (_, a) if a.starts_with("Qwen3") => Family::Qwen3,
            (_, a) if a.starts_with("Qwen2") => Family::Qwen2,
            (_, a) if a.starts_with("Llama") || a.starts_with("Mistral") => Family::Llama,
            _ => {
                return Err(err(format!(
                    "unsupported draft model type `{model_type}` ({arch}): \
                     expected a Llama, Qwen2 or Qwen3 causal LM"
                )))
            }
        };
        if family == Family::Qwen3 && model_type.contains("moe") {
            return Err(err("Qwen3 MoE models are not supported as draft models"));
        }
        let act = v
            .get("hidden_act")
            .or_else(|| v.get("hidden_activation"))
            .and_then(Value::as_str)
            .unwrap_or("silu");
        if act != "silu" && act != "swish" {
            return Err(err(format!("unsupported activation `{act}`")));
        }

        let hidden_size = need_usize(v, "hidden_size")?;
        let num_heads = need_usize(v, "num_attention_heads")?;
        if num_heads == 0 || hidden_size == 0 {
            return Err(err("config.json: zero hidden size or head count"));
        }
        let num_kv_heads = get_usize(v, "num_key_value_heads").unwrap_or(num_heads);
        if num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
            return Err(err(format!(
                "config.json: {num_heads} attention heads are not a multiple of \
                 {num_kv_heads} key/value heads"
            )));
        }
        let head_dim = get_usize(v, "head_dim").unwrap_or(hidden_size / num_heads);
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(err(format!("config.json: invalid head_dim {head_dim}")));
        }

        // transformers 5: `rope_parameters` holds theta and the scaling; older releases
        // have `rope_theta` and `rope_scaling` at the top level.
        let rope_params = v.get("rope_parameters").filter(|p| p.is_object());
        let rope_theta = rope_params
            .and_then(|p| get_f64(p, "rope_theta"))
            .or_else(|| get_f64(v, "rope_theta"))
            .unwrap_or(10_000.0);
        let scaling = match v.get("rope_scaling").filter(|s| s.is_object()) {
            Some(s) => Some(s),
            None => rope_params,
        };
        let rope_scaling = parse_rope_scaling(scaling)?;

        let uses_sliding = v
            .get("use_sliding_window")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        if uses_sliding && v.get("sliding_window").is_some_and(|w| !w.is_null()) {
            tracing::warn!(
                "draft model config enables a sliding window; specd attends to the whole \
                 context, which differs only beyond the window"
            );
        }

        Ok(Self {
            family,
            vocab_size: need_usize(v, "vocab_size")?,
            hidden_size,
            intermediate_size: need_usize(v, "intermediate_size")?,
            num_layers: need_usize(v, "num_hidden_layers")?,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: get_f64(v, "rms_norm_eps").unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            max_position_embeddings: get_usize(v, "max_position_embeddings").unwrap_or(4096),
            qk_norm: family == Family::Qwen3,
            dtype: v
                .get("dtype")
                .or_else(|| v.get("torch_dtype"))
                .or_else(|| root.get("dtype"))
                .or_else(|| root.get("torch_dtype"))
                .and_then(Value::as_str)
                .map(str::to_string),
        })
    }

    /// Rotary inverse frequencies, one per pair of dimensions, with any scaling applied.
    pub fn inv_freq(&self) -> Vec<f32> {
        let d = self.head_dim;
        let base: Vec<f64> = (0..d / 2)
            .map(|i| 1.0 / self.rope_theta.powf((2 * i) as f64 / d as f64))
            .collect();
        match self.rope_scaling {
            RopeScaling::None => base.iter().map(|&f| f as f32).collect(),
            RopeScaling::Linear { factor } => base.iter().map(|&f| (f / factor) as f32).collect(),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: old_len,
            } => {
                let low_wavelen = old_len / low_freq_factor;
                let high_wavelen = old_len / high_freq_factor;
                base.iter()
                    .map(|&f| {
                        let wavelen = 2.0 * std::f64::consts::PI / f;
                        let out = if wavelen < high_wavelen {
                            f
                        } else if wavelen > low_wavelen {
                            f / factor
                        } else {
                            let smooth = (old_len / wavelen - low_freq_factor)
                                / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * f / factor + smooth * f
                        };
                        out as f32
                    })
                    .collect()
            }
        }
    }

    /// Cosine and sine tables, `positions` rows of `head_dim / 2` values (row-major).
    pub fn rope_tables(&self, positions: usize) -> (Vec<f32>, Vec<f32>) {
        let inv = self.inv_freq();
        let half = inv.len();
        let mut cos = Vec::with_capacity(positions * half);
        let mut sin = Vec::with_capacity(positions * half);
        for p in 0..positions {
            for &f in &inv {
                // f32 product, as the reference implementation computes it.
                let a = p as f32 * f;
                cos.push(a.cos());
                sin.push(a.sin());
            }
        }
        (cos, sin)
    }
}

fn parse_rope_scaling(s: Option<&Value>) -> Result<RopeScaling, DraftError> {
    let Some(s) = s else {
        return Ok(RopeScaling::None);
    };
    let kind = s
        .get("rope_type")
        .or_else(|| s.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let factor = get_f64(s, "factor").unwrap_or(1.0);
    match kind {
        "default" => Ok(RopeScaling::None),
        "linear" => Ok(RopeScaling::Linear { factor }),
        "llama3" => Ok(RopeScaling::Llama3 {
            factor,
            low_freq_factor: get_f64(s, "low_freq_factor").unwrap_or(1.0),
            high_freq_factor: get_f64(s, "high_freq_factor").unwrap_or(4.0),
            original_max_position_embeddings: get_f64(s, "original_max_position_embeddings")
                .unwrap_or(8192.0),
        }),
        other => Err(err(format!(
            "unsupported rope scaling `{other}` (supported: default, linear, llama3)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_transformers5_qwen2() {
        let c = ModelConfig::from_json(
            r#"{"architectures":["Qwen2ForCausalLM"],"model_type":"qwen2","hidden_size":896,
            "intermediate_size":4864,"num_hidden_layers":24,"num_attention_heads":14,
            "num_key_value_heads":2,"vocab_size":151936,"rms_norm_eps":1e-6,
            "sliding_window":null,"use_sliding_window":false,"dtype":"bfloat16",
            "rope_parameters":{"rope_type":"default","rope_theta":1000000.0},
            "tie_word_embeddings":true,"max_position_embeddings":32768}"#,
        )
        .unwrap();
        assert_eq!(c.family, Family::Qwen2);
        assert_eq!(c.head_dim, 64);
        assert_eq!(c.rope_theta, 1_000_000.0);
        assert_eq!(c.rope_scaling, RopeScaling::None);
        assert_eq!(c.dtype.as_deref(), Some("bfloat16"));
        assert!(!c.qk_norm);
    }

    #[test]
    fn reads_llama3_scaling_old_and_new_layout() {
        let old = r#"{"model_type":"llama","hidden_size":128,"intermediate_size":128,
            "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,
            "vocab_size":100,"rope_theta":500000.0,"rope_scaling":{"rope_type":"llama3",
            "factor":32.0,"low_freq_factor":1.0,"high_freq_factor":4.0,
            "original_max_position_embeddings":8192}}"#;
        let new = r#"{"model_type":"llama","hidden_size":128,"intermediate_size":128,
            "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,
            "vocab_size":100,"rope_parameters":{"rope_type":"llama3","rope_theta":500000.0,
            "factor":32.0,"low_freq_factor":1.0,"high_freq_factor":4.0,
            "original_max_position_embeddings":8192}}"#;
        let a = ModelConfig::from_json(old).unwrap();
        let b = ModelConfig::from_json(new).unwrap();
        assert_eq!(a.rope_scaling, b.rope_scaling);
        assert_eq!(a.rope_theta, 500_000.0);
        assert_eq!(b.rope_theta, 500_000.0);
        // Highest frequency untouched, lowest divided by the factor.
        let (fa, base) = (a.inv_freq(), 1.0f64 / 500_000f64.powf(30.0 / 32.0));
        assert!((fa[0] - 1.0).abs() < 1e-7);
        assert!(((fa[15] as f64) - base / 32.0).abs() < 1e-12);
    }

    #[test]
    fn qwen3_has_qk_norm_and_explicit_head_dim() {
        let c = ModelConfig::from_json(
            r#"{"model_type":"qwen3","hidden_size":1024,"intermediate_size":3072,
            "num_hidden_layers":28,"num_attention_heads":16,"num_key_value_heads":8,
            "head_dim":128,"vocab_size":151936,"rope_theta":1000000}"#,
        )
        .unwrap();
        assert_eq!(c.family, Family::Qwen3);
        assert_eq!(c.head_dim, 128);
        assert!(c.qk_norm);
    }

    #[test]
    fn refuses_unknown_and_inconsistent() {
        let e = ModelConfig::from_json(r#"{"model_type":"gpt2","hidden_size":8}"#);
        assert!(e.is_err());
        let e = ModelConfig::from_json(
            r#"{"model_type":"llama","hidden_size":64,"intermediate_size":128,
            "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":3,
            "vocab_size":100}"#,
        );
        assert!(e.is_err());
        let e = ModelConfig::from_json(
            r#"{"model_type":"llama","hidden_size":64,"intermediate_size":128,
            "num_hidden_layers":2,"num_attention_heads":4,"vocab_size":100,
            "rope_scaling":{"rope_type":"yarn","factor":4.0}}"#,
        );
        assert!(e.is_err());
    }
}
