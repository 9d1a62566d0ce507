//! Per-cell results (one workload × mode × concurrency, over all repetitions) and their
//! summary: throughput, latency percentiles, acceptance from `usage` and from `/metrics`,
//! break-even accepted length and speedup against the baseline mode.

use super::client::{Outcome, SpecUsage};
use super::prom::SpecCounters;

/// Raw results of one cell, accumulated batch by batch.
#[derive(Debug, Clone, Default)]
pub struct Cell {
    pub workload: String,
    pub mode: String,
    pub concurrency: usize,
    pub outcomes: Vec<Outcome>,
    /// Wall time of each batch and the tokens it produced.
    pub batch_wall_s: Vec<f64>,
    pub batch_tokens: Vec<u64>,
    /// Change of specd's counters over this cell's batches (None when not scraped).
    pub counters: Option<SpecCounters>,
}

/// Percentile (nearest rank on sorted data), `q` in 0..=100.
pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

pub fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.retain(|x| x.is_finite());
    v.sort_by(f64::total_cmp);
    v
}

#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Pcts {
    pub p50: Option<f64>,
    pub p95: Option<f64>,
    pub p99: Option<f64>,
    pub mean: Option<f64>,
}

impl Pcts {
    pub fn of(v: Vec<f64>) -> Pcts {
        let s = sorted(v);
        let mean = (!s.is_empty()).then(|| s.iter().sum::<f64>() / s.len() as f64);
        Pcts {
            p50: percentile(&s, 50.0),
            p95: percentile(&s, 95.0),
            p99: percentile(&s, 99.0),
            mean,
        }
    }
}

#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Summary {
    pub workload: String,
    pub mode: String,
    pub concurrency: usize,
    pub requests: usize,
    pub errors: usize,
    pub first_error: Option<String>,
    pub output_tokens: u64,
    /// Mean over requests of completion tokens / end-to-end time.
    pub stream_tok_s: Option<f64>,
    /// All tokens / all batch wall time.
    pub aggregate_tok_s: Option<f64>,
    pub ttft_s: Pcts,
    pub tpot_s: Pcts,
    pub e2e_s: Pcts,
    /// Sums of `usage.speculation` over the cell's requests.
    pub usage: Option<SpecUsage>,
    /// Tokens per verify round and draft acceptance, from `usage.speculation`.
    pub tokens_per_round: Option<f64>,
    pub acceptance: Option<f64>,
    /// The same two from specd's `/metrics` counters.
    pub metrics_tokens_per_round: Option<f64>,
    pub metrics_acceptance: Option<f64>,
    /// Share of output tokens that came from relayed (plain) decoding.
    pub relay_share: Option<f64>,
    /// Share of output tokens of requests specd passed through untouched (`auto` where
    /// speculation was not paying: no `usage.speculation`), when some were speculated.
    pub passed_share: Option<f64>,
    /// Mean verify round time (from `specd_verify_duration_seconds`).
    pub verify_mean_s: Option<f64>,
    /// Plain decode time per token: median TPOT of the reference mode at this concurrency.
    pub decode_step_s: Option<f64>,
    /// Tokens a round must yield to match plain decoding: verify time / decode step.
    pub break_even_tokens_per_round: Option<f64>,
    /// Aggregate tokens/s relative to the baseline mode at the same workload and concurrency.
    pub speedup: Option<f64>,
    pub stream_speedup: Option<f64>,
    pub counters: Option<SpecCounters>,
}

fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0 && a.is_finite()).then(|| a / b)
}

impl Cell {
    pub fn summarise(&self) -> Summary {
        let ok: Vec<&Outcome> = self.outcomes.iter().filter(|o| o.ok).collect();
        let output_tokens: u64 = ok.iter().map(|o| o.completion_tokens).sum();
        let stream_rates: Vec<f64> = ok
            .iter()
            .filter(|o| o.e2e_s > 0.0)
            .map(|o| o.completion_tokens as f64 / o.e2e_s)
            .collect();
        let wall: f64 = self.batch_wall_s.iter().sum();
        let batch_tokens: u64 = self.batch_tokens.iter().sum();
        let usage = ok.iter().filter_map(|o| o.speculation.as_ref()).fold(
            None,
            |acc: Option<SpecUsage>, u| {
                let mut a = acc.unwrap_or_default();
                a.rounds += u.rounds;
                a.draft_tokens += u.draft_tokens;
                a.accepted_tokens += u.accepted_tokens;
                a.relay_tokens += u.relay_tokens;
                Some(a)
            },
        );
        let passed: u64 = ok
            .iter()
            .filter(|o| o.speculation.is_none())
            .map(|o| o.completion_tokens)
            .sum();
        let passed = usage
            .as_ref()
            .and_then(|_| ratio(passed as f64, output_tokens as f64));
        let (tpr, acc, relay) = match &usage {
            Some(u) => (
                ratio((u.rounds + u.accepted_tokens) as f64, u.rounds as f64),
                ratio(u.accepted_tokens as f64, u.draft_tokens as f64),
                ratio(u.relay_tokens as f64, output_tokens as f64),
            ),
            None => (None, None, None),
        };
        let c = self.counters.as_ref();
        Summary {
            workload: self.workload.clone(),
            mode: self.mode.clone(),
            concurrency: self.concurrency,
            requests: self.outcomes.len(),
            errors: self.outcomes.len() - ok.len(),
            first_error: self.outcomes.iter().find_map(|o| o.error.clone()),
            output_tokens,
            stream_tok_s: Pcts::of(stream_rates).mean,
            aggregate_tok_s: ratio(batch_tokens as f64, wall),
            ttft_s: Pcts::of(ok.iter().filter_map(|o| o.ttft_s).collect()),
            tpot_s: Pcts::of(ok.iter().filter_map(|o| o.tpot_s).collect()),
            e2e_s: Pcts::of(ok.iter().map(|o| o.e2e_s).collect()),
            usage,
            tokens_per_round: tpr,
            acceptance: acc,
            metrics_tokens_per_round: c.and_then(SpecCounters::tokens_per_round),
            metrics_acceptance: c.and_then(SpecCounters::acceptance),
            relay_share: relay,
            passed_share: passed,
            verify_mean_s: c.and_then(SpecCounters::verify_mean_s),
            counters: self.counters.clone(),
            ..Summary::default()
        }
    }
}

/// Fill in the fields that compare cells: decode step and break-even (against `reference`,
/// the mode whose streams decode plainly) and speedups (against `baseline`).
pub fn compare(summaries: &mut [Summary], baseline: &str, reference: &str) {
    let find = |s: &[Summary], w: &str, m: &str, c: usize| {
        s.iter()
            .find(|x| x.workload == w && x.mode == m && x.concurrency == c)
            .cloned()
    };
    let snapshot = summaries.to_vec();
    for s in summaries.iter_mut() {
        if let Some(r) = find(&snapshot, &s.workload, reference, s.concurrency) {
            s.decode_step_s = r.tpot_s.p50;
        }
        if let (Some(v), Some(d)) = (s.verify_mean_s, s.decode_step_s) {
            s.break_even_tokens_per_round = ratio(v, d);
        }
        if let Some(b) = find(&snapshot, &s.workload, baseline, s.concurrency) {
            s.speedup = s
                .aggregate_tok_s
                .zip(b.aggregate_tok_s)
                .and_then(|(a, b)| ratio(a, b));
            s.stream_speedup = s
                .stream_tok_s
                .zip(b.stream_tok_s)
                .and_then(|(a, b)| ratio(a, b));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(tokens: u64, e2e: f64, spec: Option<SpecUsage>) -> Outcome {
        Outcome {
            ok: true,
            status: 200,
            e2e_s: e2e,
            ttft_s: Some(0.1),
            tpot_s: Some(0.01),
            completion_tokens: tokens,
            speculation: spec,
            ..Outcome::default()
        }
    }

    #[test]
    fn percentiles_nearest_rank() {
        let v = sorted((1..=100).map(f64::from).collect());
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&v, 100.0), Some(100.0));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[3.0], 95.0), Some(3.0));
    }

    #[test]
    fn summary_and_comparison() {
        let spec = SpecUsage {
            rounds: 10,
            draft_tokens: 40,
            accepted_tokens: 20,
            relay_tokens: 0,
        };
        let on = Cell {
            workload: "w".into(),
            mode: "on".into(),
            concurrency: 1,
            outcomes: vec![
                outcome(30, 1.0, Some(spec.clone())),
                outcome(30, 1.0, Some(spec)),
            ],
            batch_wall_s: vec![2.0],
            batch_tokens: vec![60],
            counters: Some(SpecCounters {
                rounds: 20.0,
                emitted_tokens: 60.0,
                verify_seconds: 0.4,
                verify_calls: 20.0,
                ..SpecCounters::default()
            }),
        };
        let mut failed = outcome(0, 1.0, None);
        failed.ok = false;
        failed.error = Some("boom".into());
        let off = Cell {
            workload: "w".into(),
            mode: "off".into(),
            concurrency: 1,
            outcomes: vec![outcome(30, 2.0, None), failed],
            batch_wall_s: vec![3.0],
            batch_tokens: vec![30],
            counters: None,
        };
        let mut s = vec![on.summarise(), off.summarise()];
        assert_eq!(s[0].tokens_per_round, Some(3.0));
        assert_eq!(s[0].acceptance, Some(0.5));
        assert_eq!(s[0].metrics_tokens_per_round, Some(3.0));
        assert_eq!(s[1].errors, 1);
        assert_eq!(s[1].first_error.as_deref(), Some("boom"));
        compare(&mut s, "off", "off");
        assert_eq!(s[0].speedup, Some(30.0 / 10.0));
        assert_eq!(s[0].stream_speedup, Some(2.0));
        assert_eq!(s[0].decode_step_s, Some(0.01));
        let be = s[0].break_even_tokens_per_round.expect("break-even");
        assert!((be - 2.0).abs() < 1e-9, "{be}");
    }
}
