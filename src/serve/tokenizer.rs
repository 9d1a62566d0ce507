//! Which tokenizer specd speculates with. The candidate is `--tokenizer`, else the model
//! the upstream reports (its directory, or a hub id resolved through the Hugging Face
//! cache). It is used only once it agrees with the upstream's own tokenizer
//! (`upstream::tokenizer_check`), checked at start and on every re-detection; until then,
//! or after a mismatch, generation requests pass through (`reason="no_tokenizer"`).
//! `/readyz` waits for the first decision, so a ready specd speculates from its first
//! request.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::server::Shared;
use crate::tokens::{locate, ModelTokenizer};
use crate::upstream::tokenizer_check::{check, Mismatch};
use crate::upstream::UpstreamInfo;

/// The tokenizer to check: the configured one, the one in use when it comes from the same
/// place, else a fresh load from the upstream's model.
fn candidate(st: &Shared, info: &UpstreamInfo) -> Result<Arc<ModelTokenizer>, String> {
    if let Some(t) = &st.configured_tokenizer {
        return Ok(t.clone());
    }
    let root = info
        .root
        .as_deref()
        .ok_or("the upstream reports no model path; pass --tokenizer")?;
    let dir: PathBuf = locate::model_dir(root).ok_or_else(|| {
        format!(
            "the upstream's model `{root}` is neither a directory here nor in the Hugging Face cache ({}); share it with specd or pass --tokenizer",
            locate::hf_hub_cache().map(|p| p.display().to_string()).unwrap_or_default()
        )
    })?;
    if let Some(t) = st
        .tokenizer()
        .filter(|t| t.path.parent() == Some(dir.as_path()))
    {
        return Ok(t);
    }
    ModelTokenizer::load(&dir)
        .map(Arc::new)
        .map_err(|e| e.to_string())
}

/// Check the candidate against the upstream and install it, or none.
pub(super) async fn verify(st: Shared, info: UpstreamInfo) {
    let Some(backend) = st.backend() else { return };
    let cand = match candidate(&st, &info) {
        Ok(c) => c,
        Err(why) => return install(&st, None, &why),
    };
    // A busy upstream may not answer at once; the first decision waits a little for it.
    for attempt in 1..=CHECK_ATTEMPTS {
        let checked = check(
            &cand,
            backend.as_ref(),
            &st.upstream,
            info.kind,
            &info.model,
        );
        match checked.await {
            Ok(()) => return install(&st, Some(cand), ""),
            Err(Mismatch::Upstream(e)) if attempt < CHECK_ATTEMPTS => {
                tracing::debug!(error = %e, attempt, "tokenizer check: upstream did not answer");
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            // Keep a decision already made; a first one is "no" until the next detection.
            Err(Mismatch::Upstream(e)) if st.tokenizer_decided.load(Ordering::Relaxed) => {
                return tracing::debug!(error = %e, "tokenizer check postponed");
            }
            Err(e) => return install(&st, None, &e.to_string()),
        }
    }
}

const CHECK_ATTEMPTS: u32 = 10;

fn install(st: &Shared, tok: Option<Arc<ModelTokenizer>>, why: &str) {
    let ok = tok.is_some();
    // The tokenizer in use is the verified state; no second flag to keep in step.
    let was = st.tokenizer().is_some();
    let first = !st.tokenizer_decided.swap(true, Ordering::Relaxed);
    if let Some(t) = &tok {
        if first || !was {
            tracing::info!(path = %t.path.display(), eos = ?t.eos_id, extra_eos = ?t.extra_eos_ids, "tokenizer agrees with the upstream's: speculation on");
        }
    } else if first || was {
        tracing::warn!(reason = why, "no usable tokenizer: speculation is off");
    }
    st.metrics.tokenizer_verified.set(i64::from(ok));
    if let Ok(mut g) = st.tokenizer.write() {
        *g = tok;
    }
}
