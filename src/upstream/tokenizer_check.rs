//! Does the local tokenizer agree with the upstream's? specd tokenizes prompts through the
//! upstream, but detokenizes the generated ids, matches stop strings and counts usage with
//! its local copy. A copy that differs (another revision, a different special-token list)
//! would change the text clients get, so before the local tokenizer is used, a probe text
//! — non-ASCII, digits, whitespace runs and the tokenizer's own special tokens — is
//! encoded by both and, on vLLM, the ids are decoded by both. On any difference specd does
//! not speculate (`specd_tokenizer_verified` stays 0) and says why in one log line.

use serde_json::json;

use super::detect::UpstreamKind;
use super::verify::Backend;
use super::Upstream;
use crate::tokens::ModelTokenizer;

/// The probe: ordinary text of several scripts, then up to four special tokens of the
/// tokenizer (as their text, which both sides must map to the same ids).
pub fn probe_text(tok: &ModelTokenizer) -> String {
    let mut text = String::from(
        "specd check: naïve café, Grüße — 数字 ✓ ½ 12345 6.02e23\n\tdef f(x):\n        return x  # done\n",
    );
    for (s, _) in tok.special_tokens().into_iter().take(4) {
        text.push_str(&s);
        text.push_str(" ok ");
    }
    text
}

/// Why the local tokenizer is not used.
#[derive(Debug, thiserror::Error)]
pub enum Mismatch {
    #[error("the upstream tokenizes the probe text differently (first difference at token {at}: upstream {upstream:?}, local {local:?})")]
    Encode {
        at: usize,
        upstream: Option<u32>,
        local: Option<u32>,
    },
    #[error("the upstream decodes the probe ids to different text (upstream {upstream:?}, local {local:?})")]
    Decode { upstream: String, local: String },
    #[error("the local tokenizer cannot encode the probe text: {0}")]
    Local(String),
    #[error("the upstream could not be asked: {0}")]
    Upstream(String),
}

/// Compare the local tokenizer with the upstream's on the probe text.
pub async fn check(
    tok: &ModelTokenizer,
    backend: &dyn Backend,
    upstream: &Upstream,
    kind: UpstreamKind,
    model: &str,
) -> Result<(), Mismatch> {
    let text = probe_text(tok);
    let local = tok
        .tokenizer
        .encode(text.as_str(), true)
        .map_err(|e| Mismatch::Local(e.to_string()))?
        .get_ids()
        .to_vec();
    let remote = backend
        .tokenize_prompt(model, &text)
        .await
        .map_err(|e| Mismatch::Upstream(e.to_string()))?
        .tokens;
    if let Some(at) = first_difference(&remote, &local) {
        return Err(Mismatch::Encode {
            at,
            upstream: remote.get(at).copied(),
            local: local.get(at).copied(),
        });
    }
    if kind == UpstreamKind::Vllm && !tok.clean_up_spaces {
        check_decode(tok, upstream, model, &remote).await?;
    }
    Ok(())
}

/// vLLM's `/detokenize` against the local decode of the same ids (special tokens kept).
async fn check_decode(
    tok: &ModelTokenizer,
    upstream: &Upstream,
    model: &str,
    ids: &[u32],
) -> Result<(), Mismatch> {
    let v = upstream
        .post_json_retry(
            "/detokenize",
            &json!({"model": model, "tokens": ids}),
            std::time::Duration::from_secs(30),
            None,
        )
        .await;
    // A server without a usable `/detokenize` still gets the encode check.
    let Some(remote) = v.as_ref().ok().and_then(|v| v.get("prompt")?.as_str()) else {
        tracing::debug!(answer = ?v, "no usable /detokenize: decode check skipped");
        return Ok(());
    };
    let local = tok
        .tokenizer
        .decode(ids, false)
        .map_err(|e| Mismatch::Local(e.to_string()))?;
    if remote != local {
        return Err(Mismatch::Decode {
            upstream: remote.to_string(),
            local,
        });
    }
    Ok(())
}

fn first_difference(a: &[u32], b: &[u32]) -> Option<usize> {
    let n = a.len().max(b.len());
    (0..n).find(|&i| a.get(i) != b.get(i))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_difference_covers_lengths() {
        assert_eq!(first_difference(&[1, 2, 3], &[1, 2, 3]), None);
        assert_eq!(first_difference(&[1, 2, 3], &[1, 9, 3]), Some(1));
        assert_eq!(first_difference(&[1, 2], &[1, 2, 3]), Some(2));
    }
}
