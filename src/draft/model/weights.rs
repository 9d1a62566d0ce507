//! Checkpoint access: a single `model.safetensors` or shards listed by
//! `model.safetensors.index.json`, memory-mapped.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};

use crate::draft::DraftError;

pub struct Weights {
    st: MmapedSafetensors,
    /// Prefix in front of `layers.N...` names (`model.` for the usual layout).
    prefix: String,
}

fn err(msg: impl Into<String>) -> DraftError {
    DraftError::Model(msg.into())
}

/// The safetensors files that make up the checkpoint in `dir`.
pub fn checkpoint_files(dir: &Path) -> Result<Vec<PathBuf>, DraftError> {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let text = std::fs::read_to_string(&index)
            .map_err(|e| err(format!("cannot read {}: {e}", index.display())))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| err(format!("{}: {e}", index.display())))?;
        let map = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| err(format!("{}: no weight_map", index.display())))?;
        let files: BTreeSet<&str> = map.values().filter_map(|f| f.as_str()).collect();
        if files.is_empty() {
            return Err(err(format!("{}: empty weight_map", index.display())));
        }
        return Ok(files.into_iter().map(|f| dir.join(f)).collect());
    }
    let single = dir.join("model.safetensors");
    if single.exists() {
        return Ok(vec![single]);
    }
    let mut any: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| err(format!("cannot list {}: {e}", dir.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    any.sort();
    if any.is_empty() {
        return Err(err(format!(
            "no safetensors checkpoint in {}",
            dir.display()
        )));
    }
    Ok(any)
}

impl Weights {
    pub fn open(dir: &Path) -> Result<Self, DraftError> {
        let files = checkpoint_files(dir)?;
        for f in &files {
            if !f.exists() {
                return Err(err(format!("missing checkpoint shard {}", f.display())));
            }
        }
        // SAFETY: the files are mapped read-only; specd expects them not to be modified
        // while it runs, as every safetensors reader does.
        let st = unsafe { MmapedSafetensors::multi(&files) }
            .map_err(|e| err(format!("cannot map checkpoint: {e}")))?;
        let names: Vec<String> = st.tensors().into_iter().map(|(n, _)| n).collect();
        let prefix = [
            "model.",
            "model.language_model.",
            "language_model.model.",
            "",
        ]
        .into_iter()
        .find(|p| {
            names
                .iter()
                .any(|n| *n == format!("{p}embed_tokens.weight"))
        })
        .ok_or_else(|| err("checkpoint has no embed_tokens.weight"))?
        .to_string();
        Ok(Self { st, prefix })
    }

    /// Full name of a model tensor (`layers.0.self_attn.q_proj.weight`, `norm.weight`, ...).
    pub fn name(&self, short: &str) -> String {
        format!("{}{short}", self.prefix)
    }

    pub fn has(&self, name: &str) -> bool {
        self.st.get(name).is_ok()
    }

    /// Load `name`, converted to `dtype`, on `device`, checking its shape.
    pub fn get(
        &self,
        name: &str,
        shape: &[usize],
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor, DraftError> {
        let t = self
            .st
            .load(name, &Device::Cpu)
            .map_err(|e| err(format!("tensor {name}: {e}")))?;
        if t.dims() != shape {
            return Err(err(format!(
                "tensor {name} has shape {:?}, expected {shape:?}",
                t.dims()
            )));
        }
        t.to_dtype(dtype)
            .and_then(|t| t.to_device(device))
            .map_err(|e| err(format!("tensor {name}: {e}")))
    }

    /// The output projection: `lm_head.weight` or, when tied, the embedding.
    pub fn lm_head_name(&self) -> String {
        ["lm_head.weight", "language_model.lm_head.weight"]
            .into_iter()
            .find(|n| self.has(n))
            .map(str::to_string)
            .unwrap_or_else(|| self.name("embed_tokens.weight"))
    }
}
