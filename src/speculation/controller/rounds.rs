//! What a round of K drafts yields and costs under the cost model, and the K that
//! yields most per second.

use super::costs::{Costs, DEFER_KEEP, MEMORY_BOUND_TOKENS, RATIO_MAX};

/// E(k) for acceptance estimates p (k ≤ p.len()).
pub fn expected_tokens(p: &[f64], k: usize) -> f64 {
    let mut cum = 1.0;
    let mut e = 1.0;
    for &x in p.iter().take(k) {
        cum *= x;
        e += cum;
    }
    e
}

/// The best round: its K, expected tokens net of the others' loss (in tokens of plain
/// decoding), and its time.
pub(super) struct Best {
    pub(super) k: usize,
    pub(super) tokens: f64,
    pub(super) time: f64,
    /// What its verify step costs each sequence decoding beside it: T_ver − T_dec (0
    /// while T_dec is unknown).
    pub(super) step_loss: f64,
}

/// The terms a round is costed under: the drafter's time per round, the sequences
/// decoding beside its verify step, and the streams verifying in it (who share their
/// loss).
#[derive(Debug, Clone, Copy)]
pub(super) struct Terms {
    pub(super) t_draft: f64,
    pub(super) others: usize,
    pub(super) spec: usize,
}

impl Terms {
    /// `spec` streams verifying together with no sequence decoding beside them.
    pub(super) fn together(t_draft: f64, spec: usize) -> Self {
        Terms {
            t_draft,
            others: 0,
            spec,
        }
    }
}

impl Best {
    /// Rate relative to plain decoding.
    pub(super) fn speedup(&self, dec: f64) -> f64 {
        self.tokens * dec / self.time
    }

    /// Seconds the round saves against decoding its tokens plainly (negative: it loses).
    pub(super) fn saving(&self, dec: f64) -> f64 {
        self.tokens * dec - self.time
    }

    /// This round, verified beside `load` sequences, beats plain decoding under the
    /// cheapest plausible decode cost (`RATIO_MAX`), or (`deferred`: the level already
    /// defers its first decode probe) comes within `DEFER_KEEP` of doing so.
    pub(super) fn wins_unmeasured(&self, load: usize, deferred: bool) -> bool {
        let need = if deferred {
            DEFER_KEEP * RATIO_MAX
        } else {
            RATIO_MAX
        };
        self.tokens > need && load.max(1) * (self.k + 1) <= MEMORY_BOUND_TOKENS
    }

    /// This round covers the rest of the generation and is expected to yield more than half
    /// of it: the generation's last round, short because the tokens left are few. Relaying
    /// them instead, to time plain decoding, costs a relay start and a step a token, about
    /// what this round and one more cost even at `RATIO_MAX` decode steps a verify.
    pub(super) fn ends(&self, remaining: usize) -> bool {
        remaining <= self.k + 1 && 2.0 * self.tokens > remaining as f64
    }
}

impl Costs {
    /// A round of the first `k` drafts: expected tokens net of the others' loss, and time.
    pub(super) fn round(&self, p: &[f64], k: usize, t: Terms) -> Option<Best> {
        let ver = self.ver.get(k).copied().flatten()?;
        let time = t.t_draft + ver;
        let (tokens, step_loss) = match self.dec {
            Some(dec) if dec > 0.0 => {
                let step_loss = (ver - dec).max(0.0);
                let loss = t.others as f64 * step_loss / t.spec.max(1) as f64;
                (expected_tokens(p, k) - loss / dec, step_loss)
            }
            _ => (expected_tokens(p, k), 0.0),
        };
        (time > 0.0).then_some(Best {
            k,
            tokens,
            time,
            step_loss,
        })
    }

    /// What the round `b` saves judged by `p` (the acceptance a stream alone switches
    /// into speculation by); `b`'s own saving where there is none.
    pub(super) fn saving_judged(&self, p: Option<&[f64]>, b: &Best, dec: f64, t: Terms) -> f64 {
        p.and_then(|q| self.round(q, b.k, t))
            .map_or(b.saving(dec), |l| l.saving(dec))
    }

    /// k in `lo..=p.len()` maximising net tokens per second. A verify pass slows the steps
    /// of the streams decoding beside it (by T_ver − T_dec each, shared among the streams
    /// verifying at once); that loss, in tokens of plain decoding, is charged to the round.
    pub(super) fn best(&self, p: &[f64], lo: usize, t: Terms) -> Option<Best> {
        (lo..=p.len())
            .filter_map(|k| self.round(p, k, t))
            .max_by(|a, b| (a.tokens / a.time).total_cmp(&(b.tokens / b.time)))
    }
}
