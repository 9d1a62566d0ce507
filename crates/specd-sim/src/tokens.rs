//! What the fake model says: the next token is a deterministic function of the context,
//! whatever the sampling parameters say, so a caller knows the direct output in advance.

/// The rule the fake model follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tokens {
    /// A hash of the last three tokens and the length, in `4..vocab`: no drafter but
    /// the oracle predicts it, so benchmarks set acceptance exactly with corrupted drafts.
    Hashed { vocab: u32 },
    /// Depends on the last token only, in `4..101`: it repeats in cycles the n-gram
    /// drafter learns, so tests exercise relay and speculation alike.
    Cyclic,
    /// Quotes the context, as an agent's answer quotes the tool output it was shown:
    /// with probability `keep_permille`/1000 per token (a hash of the context decides)
    /// the token that followed the most recent longest earlier match of the context's
    /// last tokens; otherwise a jump to the token at a hashed earlier position, from
    /// which the quoting goes on. What a suffix or n-gram drafter can predict is set by
    /// `keep_permille`, not by an oracle.
    Quoting { vocab: u32, keep_permille: u32 },
}

/// Longest suffix a [`Tokens::Quoting`] match compares.
const QUOTE_MATCH: usize = 16;

pub(crate) fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Tokens {
    /// The token after `ctx`. Never an EOS or special id (0..=3).
    pub fn next(self, ctx: &[u32]) -> u32 {
        let n = ctx.len();
        let at = |back: usize| if n >= back { ctx[n - back] } else { 0 };
        let h = hash([at(3), at(2), at(1)], n);
        match self {
            Tokens::Hashed { vocab } => hashed(h, vocab),
            Tokens::Cyclic => 4 + (at(1).wrapping_mul(17).wrapping_add(5)) % 97,
            Tokens::Quoting {
                vocab,
                keep_permille,
            } => {
                let copied = (h % 1000 < u64::from(keep_permille))
                    .then(|| longest_match(ctx).map(|j| ctx[j]))
                    .flatten();
                let jumped = || (n > 0).then(|| ctx[((h >> 10) % n as u64) as usize]);
                match copied.filter(|&t| t >= 4).or_else(jumped) {
                    Some(t) if t >= 4 => t,
                    _ => hashed(h, vocab),
                }
            }
        }
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

/// A hash of the last three tokens (oldest first; missing entries are 0) and the length.
fn hash(last3: [u32; 3], len: usize) -> u64 {
    let mut h = (len as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    for t in last3 {
        h = mix(h ^ u64::from(t).wrapping_add(0x632B_E59B_D9B4_E019));
    }
    h
}

fn hashed(h: u64, vocab: u32) -> u32 {
    4 + (h % u64::from(vocab.max(5) - 4)) as u32
}

/// Where the most recent of the longest earlier matches of `ctx`'s last tokens (up to
/// [`QUOTE_MATCH`]) is followed: the index of the token after it.
fn longest_match(ctx: &[u32]) -> Option<usize> {
    let n = ctx.len();
    let last = *ctx.last()?;
    let mut best: Option<(usize, usize)> = None;
    for i in (0..n - 1).rev() {
        if ctx[i] != last {
            continue;
        }
        let mut l = 1;
        while l < QUOTE_MATCH && l <= i && ctx[i - l] == ctx[n - 1 - l] {
            l += 1;
        }
        if best.is_none_or(|(b, _)| l > b) {
            best = Some((l, i + 1));
            if l == QUOTE_MATCH {
                break;
            }
        }
    }
    best.map(|(_, j)| j)
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
    fn quoting_tokens_copy_the_context() {
        let prompt: Vec<u32> = (0..400).map(|i| 4 + (i * 7919) % 4000).collect();
        let always = Tokens::Quoting {
            vocab: 4096,
            keep_permille: 1000,
        };
        // The prompt's tokens are all different, so a copy continues where the last
        // token stood: after a jump, the text that followed it.
        let c = always.continuation(&prompt, 200);
        assert!(c.iter().all(|t| prompt.contains(t)));
        let runs = c.windows(2).filter(|w| {
            let at = prompt.iter().position(|t| *t == w[0]);
            at.is_some_and(|a| prompt.get(a + 1) == Some(&w[1]))
        });
        assert!(runs.count() >= 150, "copies run on");
        let half = Tokens::Quoting {
            vocab: 4096,
            keep_permille: 500,
        };
        assert_eq!(
            half.continuation(&prompt, 50),
            half.continuation(&prompt, 50)
        );
        assert_ne!(half.continuation(&prompt, 50)[..], c[..50]);
        // Special ids are never copied.
        let specials = Tokens::Quoting {
            vocab: 4096,
            keep_permille: 1000,
        }
        .continuation(&[0, 1, 2, 3, 0, 1, 2, 3], 40);
        assert!(specials.iter().all(|&t| t >= 4));
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
