//! The acceptance rule of the verify protocol. `samples[j]` is the token the target drew
//! after context+d1..dj. Walk j = 0, 1, …: accept d_{j+1} while it equals `samples[j]`;
//! the round then emits `samples[0..=n]` — the accepted drafts (equal to the samples at
//! their positions) plus the first differing sample, or the bonus token when all K match.
//! Every emitted token is the target's own sample, so the output distribution is exactly
//! the target's, for greedy and sampled decoding alike.

/// Number of accepted draft tokens.
pub fn accepted_len(drafts: &[u32], sampled: impl IntoIterator<Item = u32>) -> usize {
    drafts
        .iter()
        .zip(sampled)
        .take_while(|(d, s)| *d == s)
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acceptance_walk() {
        assert_eq!(accepted_len(&[1, 2, 3], [1, 2, 3, 4]), 3);
        assert_eq!(accepted_len(&[1, 2, 3], [1, 9, 3, 4]), 1);
        assert_eq!(accepted_len(&[1, 2, 3], [5, 2, 3, 4]), 0);
        assert_eq!(accepted_len(&[], [5]), 0);
    }
}
