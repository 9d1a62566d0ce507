//! `ngram`: prompt lookup. Find the longest suffix of the context (between `min` and
//! `max` tokens) that occurred earlier in the context, and propose what followed its
//! most recent earlier occurrence.

use futures_util::future::{ready, BoxFuture};
use futures_util::FutureExt;

use super::{DraftError, DraftRequest, Drafter, DrafterKind, Proposal};

pub struct NgramDrafter {
    pub min: usize,
    pub max: usize,
}

impl NgramDrafter {
    pub fn new(min: usize, max: usize) -> Self {
        let min = min.max(1);
        NgramDrafter {
            min,
            max: max.max(min),
        }
    }

    /// The proposal for a context; pure, so it is tested directly.
    pub fn lookup(&self, ctx: &[u32], max_k: usize) -> Proposal {
        if max_k == 0 || ctx.len() < self.min + 1 {
            return Proposal::default();
        }
        let top = self.max.min(ctx.len() - 1);
        for n in (self.min..=top).rev() {
            let pat = &ctx[ctx.len() - n..];
            // Most recent earlier occurrence whose continuation exists.
            let mut start = ctx.len() - n;
            while start > 0 {
                start -= 1;
                if &ctx[start..start + n] == pat {
                    let from = start + n;
                    let to = (from + max_k).min(ctx.len());
                    let tokens = ctx[from..to].to_vec();
                    // Longer matches are more likely to continue; confidence decays along the chain.
                    let base = n as f32 / (n as f32 + 1.0);
                    let confidence = (0..tokens.len())
                        .map(|i| base * 0.95f32.powi(i as i32))
                        .collect();
                    return Proposal { tokens, confidence };
                }
            }
        }
        Proposal::default()
    }
}

impl Drafter for NgramDrafter {
    fn kind(&self) -> DrafterKind {
        DrafterKind::Ngram
    }
    fn propose(&self, req: DraftRequest) -> BoxFuture<'_, Result<Proposal, DraftError>> {
        ready(Ok(self.lookup(&req.context, req.max_k))).boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposes_continuation_of_longest_match() {
        let d = NgramDrafter::new(2, 4);
        // "1 2 3 4 5 ... 1 2 3" → propose "4 5"
        let ctx = [1, 2, 3, 4, 5, 9, 1, 2, 3];
        let p = d.lookup(&ctx, 2);
        assert_eq!(p.tokens, vec![4, 5]);
        assert_eq!(p.confidence.len(), 2);
    }

    #[test]
    fn prefers_most_recent_occurrence_and_handles_edges() {
        let d = NgramDrafter::new(1, 3);
        let ctx = [7, 1, 7, 2, 7];
        assert_eq!(d.lookup(&ctx, 1).tokens, vec![2]);
        assert!(d.lookup(&[], 4).tokens.is_empty());
        assert!(d.lookup(&[1, 2, 3], 4).tokens.is_empty());
        assert!(d.lookup(&ctx, 0).tokens.is_empty());
    }
}
