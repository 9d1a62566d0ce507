//! What the fake model says: the next token is a deterministic function of the context,
//! whatever the sampling parameters say, so a caller knows the direct output in advance.

/// The rule the fake model follows. Both read the same state — the last three tokens and
/// the context length — through [`Tokens::next_after`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tokens {
    /// A hash of the last three tokens and the length, in `4..vocab`: no drafter but
    /// the oracle predicts it, so benchmarks set acceptance exactly with corrupted drafts.
    Hashed { vocab: u32 },
    /// Depends on the last token only, in `4..101`: it repeats in cycles the n-gram
    /// drafter learns, so tests exercise relay and speculation alike.
    Cyclic,
}

pub(crate) fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Tokens {
    /// The token after a context of length `len` ending in `last3` (oldest first; missing
    /// entries are 0). Never an EOS or special id (0..=3).
    pub fn next_after(self, last3: [u32; 3], len: usize) -> u32 {
        match self {
            Tokens::Hashed { vocab } => {
                let mut h = (len as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                for t in last3 {
                    h = mix(h ^ u64::from(t).wrapping_add(0x632B_E59B_D9B4_E019));
                }
                4 + (h % u64::from(vocab.max(5) - 4)) as u32
            }
            Tokens::Cyclic => 4 + (last3[2].wrapping_mul(17).wrapping_add(5)) % 97,
        }
    }

    /// The token after `ctx`.
    pub fn next(self, ctx: &[u32]) -> u32 {
        let n = ctx.len();
        let at = |back: usize| if n >= back { ctx[n - back] } else { 0 };
        self.next_after([at(3), at(2), at(1)], n)
    }

    /// The continuation of `prompt`, `n` tokens long.
    pub fn continuation(self, prompt: &[u32], n: usize) -> Vec<u32> {
        let mut ctx = prompt.to_vec();
        for _ in 0..n {
            ctx.push(self.next(&ctx));
        }
        ctx.split_off(prompt.len())
    }
}

/// The token [`Tokens::Hashed`] produces after `ctx`.
pub fn next_token(ctx: &[u32], vocab: u32) -> u32 {
    Tokens::Hashed { vocab }.next(ctx)
}

/// The [`Tokens::Hashed`] continuation of `prompt`, `n` tokens long (what `specd-sim
/// serve` answers).
pub fn continuation(prompt: &[u32], n: usize, vocab: u32) -> Vec<u32> {
    Tokens::Hashed { vocab }.continuation(prompt, n)
}

/// Copy of `truth` where position i is kept with probability `keep(i)` and otherwise
/// replaced by another token; deterministic in `seed`.
pub fn corrupt(truth: &[u32], keep: impl Fn(usize) -> f64, seed: u64, vocab: u32) -> Vec<u32> {
    let mut rng = fastrand::Rng::with_seed(seed);
    truth
        .iter()
        .enumerate()
        .map(|(i, &t)| {
            if rng.f64() < keep(i) {
                t
            } else {
                4 + (t - 4 + 1 + rng.u32(0..vocab.max(6) - 5)) % (vocab.max(6) - 4)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_deterministic_and_in_range() {
        let p = [5, 6, 7, 8];
        let a = continuation(&p, 50, 4096);
        assert_eq!(a, continuation(&p, 50, 4096));
        assert!(a.iter().all(|&t| (4..4096).contains(&t)));
        assert_ne!(a, continuation(&[5, 6, 7, 9], 50, 4096));
        let mut ctx = p.to_vec();
        ctx.extend(&a[..10]);
        assert_eq!(next_token(&ctx, 4096), a[10]);
    }

    #[test]
    fn cyclic_tokens_follow_the_last_one() {
        let c = Tokens::Cyclic.continuation(&[3000, 7], 200);
        assert_eq!(c[0], 4 + (7 * 17 + 5) % 97);
        assert!(c.iter().all(|&t| (4..101).contains(&t)));
        // Whatever came before, the same token is followed by the same token.
        let again = Tokens::Cyclic.continuation(&[c[10]], 20);
        assert_eq!(again, c[11..31]);
    }

    #[test]
    fn corruption_follows_the_keep_probability() {
        let truth = continuation(&[1, 2, 3], 20_000, 4096);
        let c = corrupt(&truth, |_| 0.7, 9, 4096);
        let kept = truth.iter().zip(&c).filter(|(a, b)| a == b).count();
        assert!((13_600..14_400).contains(&kept), "{kept}");
        assert!(c.iter().all(|&t| (4..4096).contains(&t)));
        assert_eq!(corrupt(&truth[..5], |_| 0.0, 1, 4096).len(), 5);
        assert!(corrupt(&truth[..50], |_| 0.0, 1, 4096)
            .iter()
            .zip(&truth)
            .all(|(a, b)| a != b));
    }
}
