//! Reading specd's `/metrics` (Prometheus text format) around each batch: the speculation
//! counters and the verify-time histogram, as differences between two scrapes.

pub use specd::upstream::prom_text::Scrape;

/// Speculation counters of specd (summed over drafters), or their change over a batch.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SpecCounters {
    /// Verify rounds with at least one draft token.
    pub drafts: f64,
    pub draft_tokens: f64,
    pub accepted_tokens: f64,
    /// Tokens produced by rounds: accepted drafts plus one per round.
    pub emitted_tokens: f64,
    /// All verify rounds (with or without drafts), from the chosen-K histogram.
    pub rounds: f64,
    pub verify_seconds: f64,
    pub verify_calls: f64,
    /// Rounds with drafts by accepted length 0..=16.
    pub accepted_length: Vec<f64>,
}

impl SpecCounters {
    pub fn from_scrape(s: &Scrape) -> SpecCounters {
        let cum = s.buckets("specd_spec_decode_accepted_length");
        let mut accepted_length = Vec::new();
        let mut prev = 0.0;
        for (le, v) in cum {
            if le.is_finite() {
                accepted_length.push(v - prev);
                prev = v;
            }
        }
        SpecCounters {
            drafts: s.sum("specd_spec_decode_num_drafts_total", &[]),
            draft_tokens: s.sum("specd_spec_decode_num_draft_tokens_total", &[]),
            accepted_tokens: s.sum("specd_spec_decode_num_accepted_tokens_total", &[]),
            emitted_tokens: s.sum("specd_spec_decode_num_emitted_tokens_total", &[]),
            rounds: s.sum("specd_spec_rounds_per_request_sum", &[]),
            verify_seconds: s.sum("specd_verify_duration_seconds_sum", &[]),
            verify_calls: s.sum("specd_verify_duration_seconds_count", &[]),
            accepted_length,
        }
    }

    /// `self - before`.
    pub fn since(&self, before: &SpecCounters) -> SpecCounters {
        let n = self.accepted_length.len().max(before.accepted_length.len());
        let at = |v: &[f64], i: usize| v.get(i).copied().unwrap_or(0.0);
        SpecCounters {
            drafts: self.drafts - before.drafts,
            draft_tokens: self.draft_tokens - before.draft_tokens,
            accepted_tokens: self.accepted_tokens - before.accepted_tokens,
            emitted_tokens: self.emitted_tokens - before.emitted_tokens,
            rounds: self.rounds - before.rounds,
            verify_seconds: self.verify_seconds - before.verify_seconds,
            verify_calls: self.verify_calls - before.verify_calls,
            accepted_length: (0..n)
                .map(|i| at(&self.accepted_length, i) - at(&before.accepted_length, i))
                .collect(),
        }
    }

    pub fn add(&mut self, o: &SpecCounters) {
        self.drafts += o.drafts;
        self.draft_tokens += o.draft_tokens;
        self.accepted_tokens += o.accepted_tokens;
        self.emitted_tokens += o.emitted_tokens;
        self.rounds += o.rounds;
        self.verify_seconds += o.verify_seconds;
        self.verify_calls += o.verify_calls;
        if self.accepted_length.len() < o.accepted_length.len() {
            self.accepted_length.resize(o.accepted_length.len(), 0.0);
        }
        for (a, b) in self.accepted_length.iter_mut().zip(&o.accepted_length) {
            *a += b;
        }
    }

    /// Tokens per verify round (accepted drafts + the target's own token), over all rounds.
    pub fn tokens_per_round(&self) -> Option<f64> {
        (self.rounds > 0.0).then(|| self.emitted_tokens / self.rounds)
    }

    pub fn acceptance(&self) -> Option<f64> {
        (self.draft_tokens > 0.0).then(|| self.accepted_tokens / self.draft_tokens)
    }

    pub fn verify_mean_s(&self) -> Option<f64> {
        (self.verify_calls > 0.0).then(|| self.verify_seconds / self.verify_calls)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP specd_spec_decode_num_drafts_total Verify rounds
# TYPE specd_spec_decode_num_drafts_total counter
specd_spec_decode_num_drafts_total{drafter="ngram"} 10
specd_spec_decode_num_drafts_total{drafter="suffix"} 5
specd_spec_decode_num_draft_tokens_total{drafter="ngram"} 40
specd_spec_decode_num_accepted_tokens_total{drafter="ngram"} 12
specd_spec_decode_num_emitted_tokens_total{drafter="ngram"} 30
specd_spec_rounds_per_request_sum{drafter="ngram"} 18
specd_spec_decode_accepted_length_bucket{drafter="ngram",le="0"} 4
specd_spec_decode_accepted_length_bucket{drafter="ngram",le="1"} 7
specd_spec_decode_accepted_length_bucket{drafter="ngram",le="2"} 10
specd_spec_decode_accepted_length_bucket{drafter="ngram",le="+Inf"} 10
specd_verify_duration_seconds_sum{kind="vllm"} 0.5
specd_verify_duration_seconds_count{kind="vllm"} 18
specd_requests_total{mode="speculate",route="completions",status="200"} 3 1700000000
weird{a="x\"y,z=1",b="2"} 7
"#;

    #[test]
    fn parses_counters_and_histograms() {
        let s = Scrape::parse(TEXT);
        assert_eq!(s.sum("specd_spec_decode_num_drafts_total", &[]), 15.0);
        assert_eq!(
            s.sum(
                "specd_spec_decode_num_drafts_total",
                &[("drafter", "ngram")]
            ),
            10.0
        );
        assert_eq!(s.sum("specd_requests_total", &[("status", "200")]), 3.0);
        assert_eq!(s.sum("weird", &[("a", "x\"y,z=1"), ("b", "2")]), 7.0);
        assert_eq!(
            s.labels_of("weird").map(|l| l[1].clone()),
            Some(("b".to_string(), "2".to_string()))
        );
        let c = SpecCounters::from_scrape(&s);
        assert_eq!(c.accepted_length, vec![4.0, 3.0, 3.0]);
        assert_eq!(c.tokens_per_round(), Some(30.0 / 18.0));
        assert_eq!(c.acceptance(), Some(12.0 / 40.0));
        let d = c.since(&SpecCounters::default());
        assert_eq!(d, c);
        let mut twice = c.clone();
        twice.add(&c);
        assert_eq!(twice.since(&c), c);
    }
}
