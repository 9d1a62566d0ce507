//! Drafters for tests, enabled only with `--enable-test-drafters`: `oracle` proposes the
//! expected continuation given in the request, `adversarial` proposes a token that is
//! guaranteed wrong at every position.

use futures_util::future::{ready, BoxFuture};
use futures_util::FutureExt;

use super::{DraftError, DraftRequest, Drafter, DrafterKind, Proposal};

pub struct ScriptedDrafter {
    /// Expected generated tokens (the continuation after the prompt).
    pub truth: Vec<u32>,
    pub adversarial: bool,
    pub vocab_size: u32,
}

impl Drafter for ScriptedDrafter {
    fn kind(&self) -> DrafterKind {
        if self.adversarial {
            DrafterKind::Adversarial
        } else {
            DrafterKind::Oracle
        }
    }
    fn propose(&self, req: DraftRequest) -> BoxFuture<'_, Result<Proposal, DraftError>> {
        let done = req.context.len().saturating_sub(req.prompt_len);
        let end = (done + req.max_k).min(self.truth.len());
        let tokens: Vec<u32> = self
            .truth
            .get(done..end)
            .unwrap_or_default()
            .iter()
            .map(|&t| {
                if self.adversarial {
                    (t + 1) % self.vocab_size.max(2)
                } else {
                    t
                }
            })
            .collect();
        let confidence = vec![if self.adversarial { 0.0 } else { 1.0 }; tokens.len()];
        ready(Ok(Proposal { tokens, confidence })).boxed()
    }
}
