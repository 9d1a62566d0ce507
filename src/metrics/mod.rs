//! Prometheus metrics. Names follow `specd_<what>_<unit>`; the spec-decode counters mirror
//! vLLM's `spec_decode_*` names so dashboards read alike. Label values are bounded constants.

pub mod labels;

use labels::{PassthroughReason, RejectReason, StreamMode, TranslationStep};

use crate::draft::DrafterKind;
use prometheus::{
    exponential_buckets, Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Latency buckets from 1 ms to ~65 s.
fn latency_buckets() -> Vec<f64> {
    exponential_buckets(0.001, 2.0, 17).unwrap_or_default()
}

/// Small integer buckets for token counts per round and K.
fn count_buckets() -> Vec<f64> {
    (0..=16).map(f64::from).collect()
}

pub struct Metrics {
    pub registry: Registry,
    pub build_info: IntGaugeVec,
    pub upstream_info: IntGaugeVec,
    pub upstream_ready: IntGauge,
    pub requests: IntCounterVec,
    pub request_duration: HistogramVec,
    pub ttft: HistogramVec,
    pub tpot: HistogramVec,
    pub output_tokens: IntCounterVec,
    pub active_streams: IntGaugeVec,
    pub upstream_errors: IntCounterVec,
    pub passthrough: IntCounterVec,
    pub rejected: IntCounterVec,
    pub num_drafts: IntCounterVec,
    pub num_draft_tokens: IntCounterVec,
    pub num_accepted_tokens: IntCounterVec,
    pub accepted_per_pos: IntCounterVec,
    pub num_emitted_tokens: IntCounterVec,
    pub accepted_length: HistogramVec,
    pub rounds_per_request: HistogramVec,
    pub verify_duration: HistogramVec,
    pub draft_duration: HistogramVec,
    pub draft_translation: HistogramVec,
    pub proxy_overhead: HistogramVec,
    pub chosen_k: HistogramVec,
    pub decode_cost: prometheus::Gauge,
    pub verify_cost: GaugeVec,
    pub estimated_speedup: GaugeVec,
    pub mode_seconds: prometheus::CounterVec,
    pub mode_switches: IntCounterVec,
    pub draft_overlap: IntCounterVec,
    pub auto_speculated_share: prometheus::Gauge,
    pub realized_speedup: prometheus::Gauge,
    pub detokenize_errors: prometheus::IntCounter,
    pub tokenizer_verified: IntGauge,
    names: Vec<String>,
}

macro_rules! reg {
    ($r:expr, $names:expr, $m:expr) => {{
        let m = $m.expect("metric definition is valid");
        for d in prometheus::core::Collector::desc(&m) {
            $names.push(d.fq_name.clone());
        }
        $r.register(Box::new(m.clone()))
            .expect("metric names are unique");
        m
    }};
}

impl Metrics {
    pub fn new() -> Self {
        let r = Registry::new();
        let hist = |name: &str, help: &str, buckets: Vec<f64>, labels: &[&str]| {
            HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels)
        };
        let lat = latency_buckets;
        let mut names: Vec<String> = Vec::new();
        let names = &mut names;
        let m = Metrics {
            build_info: reg!(r, names, IntGaugeVec::new(Opts::new("specd_build_info", "specd build (value 1)"), &["version", "git_sha"])),
            upstream_info: reg!(r, names, IntGaugeVec::new(Opts::new("specd_upstream_info", "Detected upstream server (value 1)"), &["kind", "model", "version", "max_model_len"])),
            upstream_ready: reg!(r, names, IntGauge::new("specd_upstream_ready", "1 while the upstream answers its health check")),
            requests: reg!(r, names, IntCounterVec::new(Opts::new("specd_requests_total", "Finished client requests"), &["route", "mode", "status"])),
            request_duration: reg!(r, names, hist("specd_request_duration_seconds", "Client request duration", lat(), &["route", "mode"])),
            ttft: reg!(r, names, hist("specd_time_to_first_token_seconds", "Time to first streamed token", lat(), &["mode"])),
            tpot: reg!(r, names, hist("specd_time_per_output_token_seconds", "Mean time per output token after the first, per stream", lat(), &["mode"])),
            output_tokens: reg!(r, names, IntCounterVec::new(Opts::new("specd_output_tokens_total", "Tokens sent to clients"), &["mode"])),
            active_streams: reg!(r, names, IntGaugeVec::new(Opts::new("specd_active_streams", "In-flight client requests"), &["mode"])),
            upstream_errors: reg!(r, names, IntCounterVec::new(Opts::new("specd_upstream_errors_total", "Upstream failures"), &["kind"])),
            passthrough: reg!(r, names, IntCounterVec::new(Opts::new("specd_passthrough_total", "Generation requests forwarded unchanged, by reason"), &["reason"])),
            rejected: reg!(r, names, IntCounterVec::new(Opts::new("specd_rejected_requests_total", "Requests refused by specd itself"), &["reason"])),
            num_drafts: reg!(r, names, IntCounterVec::new(Opts::new("specd_spec_decode_num_drafts_total", "Verify rounds with at least one draft token"), &["drafter"])),
            num_draft_tokens: reg!(r, names, IntCounterVec::new(Opts::new("specd_spec_decode_num_draft_tokens_total", "Draft tokens verified"), &["drafter"])),
            num_accepted_tokens: reg!(r, names, IntCounterVec::new(Opts::new("specd_spec_decode_num_accepted_tokens_total", "Draft tokens accepted"), &["drafter"])),
            accepted_per_pos: reg!(r, names, IntCounterVec::new(Opts::new("specd_spec_decode_num_accepted_tokens_per_pos_total", "Draft tokens accepted by position in the draft"), &["drafter", "position"])),
            num_emitted_tokens: reg!(r, names, IntCounterVec::new(Opts::new("specd_spec_decode_num_emitted_tokens_total", "Tokens produced by verify rounds (accepted drafts plus one sampled token per round; rounds without drafts count their one token)"), &["drafter"])),
            accepted_length: reg!(r, names, hist("specd_spec_decode_accepted_length", "Accepted draft tokens per round", count_buckets(), &["drafter"])),
            rounds_per_request: reg!(r, names, hist("specd_spec_rounds_per_request", "Verify rounds per speculated request", exponential_buckets(1.0, 2.0, 14).unwrap_or_default(), &["drafter"])),
            verify_duration: reg!(r, names, hist("specd_verify_duration_seconds", "One verify call to the upstream", lat(), &["kind"])),
            draft_duration: reg!(r, names, hist("specd_draft_duration_seconds", "One draft proposal", exponential_buckets(0.00001, 2.0, 24).unwrap_or_default(), &["drafter"])),
            draft_translation: reg!(r, names, hist("specd_draft_translation_seconds", "Translation between the target's and a draft model's vocabularies, per proposal and step (only for a draft model with another vocabulary)", exponential_buckets(0.000001, 2.0, 24).unwrap_or_default(), &["step"])),
            proxy_overhead: reg!(r, names, hist("specd_proxy_overhead_seconds", "Time spent in specd itself, excluding upstream calls and drafting", exponential_buckets(0.00001, 2.0, 24).unwrap_or_default(), &["scope"])),
            chosen_k: reg!(r, names, hist("specd_controller_chosen_k", "Draft length chosen per round (0 = relay)", count_buckets(), &["drafter"])),
            decode_cost: reg!(r, names, prometheus::Gauge::new("specd_controller_decode_cost_seconds", "Estimated plain decode cost per token")),
            verify_cost: reg!(r, names, GaugeVec::new(Opts::new("specd_controller_verify_cost_seconds", "Estimated verify round cost by draft length"), &["k"])),
            estimated_speedup: reg!(r, names, GaugeVec::new(Opts::new("specd_controller_estimated_speedup", "Estimated speedup of speculation vs plain decoding"), &["drafter"])),
            mode_seconds: reg!(r, names, prometheus::CounterVec::new(Opts::new("specd_mode_seconds_total", "Stream time spent per mode"), &["mode"])),
            mode_switches: reg!(r, names, IntCounterVec::new(Opts::new("specd_mode_switches_total", "Switches between relay and speculation"), &["from", "to"])),
            draft_overlap: reg!(r, names, IntCounterVec::new(Opts::new("specd_draft_overlap_total", "Drafts prepared during a verify call, used or discarded"), &["outcome"])),
            auto_speculated_share: reg!(r, names, prometheus::Gauge::new("specd_controller_auto_speculated_share", "Share of tokens of recent watched auto requests that came from verify rounds (below 0.02, most auto requests pass through)")),
            realized_speedup: reg!(r, names, prometheus::Gauge::new("specd_controller_realized_speedup", "How much faster recent watched auto requests that speculated were than plain decoding of them would have been, by the decode cost measured from relays (below 1, most auto requests pass through)")),
            detokenize_errors: reg!(r, names, prometheus::IntCounter::new("specd_detokenize_errors_total", "Generated tokens the local tokenizer could not decode (their text is missing from the response)")),
            tokenizer_verified: reg!(r, names, IntGauge::new("specd_tokenizer_verified", "1 while the local tokenizer agrees with the upstream's on the probe text (otherwise specd does not speculate)")),
            registry: r,
            names: std::mem::take(names),
        };
        #[cfg(target_os = "linux")]
        {
            let pc = prometheus::process_collector::ProcessCollector::for_self();
            let _ = m.registry.register(Box::new(pc));
        }
        m.init_series();
        m.build_info
            .with_label_values(&[
                env!("CARGO_PKG_VERSION"),
                option_env!("SPECD_GIT_SHA").unwrap_or("unknown"),
            ])
            .set(1);
        m
    }

    /// Create the series of bounded label sets at zero, so dashboards and alerts see
    /// "0 errors" rather than "no data" before the first event.
    fn init_series(&self) {
        for k in ["connect", "timeout", "status", "protocol"] {
            self.upstream_errors.with_label_values(&[k]);
        }
        for r in RejectReason::ALL {
            self.rejected.with_label_values(&[r.as_str()]);
        }
        for r in PassthroughReason::ALL {
            self.passthrough.with_label_values(&[r.as_str()]);
        }
        for o in ["hit", "miss"] {
            self.draft_overlap.with_label_values(&[o]);
        }
        for (a, b) in [("relay", "speculate"), ("speculate", "relay")] {
            self.mode_switches.with_label_values(&[a, b]);
        }
        for m in StreamMode::ALL {
            let m = m.as_str();
            self.active_streams.with_label_values(&[m]);
            self.output_tokens.with_label_values(&[m]);
            self.mode_seconds.with_label_values(&[m]);
        }
        // Request-level series exist per mode a client request is served in.
        for m in [StreamMode::Passthrough, StreamMode::Speculate].map(StreamMode::as_str) {
            self.ttft.with_label_values(&[m]);
            self.tpot.with_label_values(&[m]);
            for route in ["completions", "chat_completions"] {
                self.requests.with_label_values(&[route, m, "200"]);
                self.request_duration.with_label_values(&[route, m]);
            }
        }
        for d in DrafterKind::ALL.into_iter().filter(|d| !d.is_test_only()) {
            let d = d.as_str();
            self.num_drafts.with_label_values(&[d]);
            self.num_draft_tokens.with_label_values(&[d]);
            self.num_accepted_tokens.with_label_values(&[d]);
            self.accepted_per_pos.with_label_values(&[d, "0"]);
            self.num_emitted_tokens.with_label_values(&[d]);
            self.accepted_length.with_label_values(&[d]);
            self.rounds_per_request.with_label_values(&[d]);
            self.draft_duration.with_label_values(&[d]);
            self.chosen_k.with_label_values(&[d]);
            self.estimated_speedup.with_label_values(&[d]);
        }
        for kind in ["vllm", "sglang"] {
            self.verify_duration.with_label_values(&[kind]);
        }
        for step in TranslationStep::ALL {
            self.draft_translation.with_label_values(&[step.as_str()]);
        }
        for scope in ["request", "round"] {
            self.proxy_overhead.with_label_values(&[scope]);
        }
        self.verify_cost.with_label_values(&["0"]);
        // Replaced by the real labels once the upstream is detected.
        self.upstream_info
            .with_label_values(&["unknown", "", "", ""])
            .set(0);
    }

    /// Prometheus text exposition of every registered metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let enc = TextEncoder::new();
        if enc.encode(&self.registry.gather(), &mut buf).is_err() {
            return String::new();
        }
        String::from_utf8(buf).unwrap_or_default()
    }

    /// Names of all registered metric families (for dashboard consistency checks).
    pub fn names(&self) -> &[String] {
        &self.names
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every metric the Grafana dashboard queries is registered here (the dashboard
    /// cannot drift from the code).
    #[test]
    fn dashboard_metrics_are_emitted() {
        let m = Metrics::new();
        let mut known: Vec<String> = m.names().to_vec();
        known.extend(m.registry.gather().iter().map(|f| f.name().to_string()));
        let used = include_str!("../../dashboards/metrics.txt");
        let missing: Vec<&str> = used
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .filter(|l| !known.iter().any(|k| k == l))
            .collect();
        assert!(
            missing.is_empty(),
            "dashboard uses metrics specd does not emit: {missing:?}"
        );
    }

    /// Every metric the dashboard reads has a series from the start (zero until
    /// something happens), so no panel shows "no data" on a fresh or `on`-only specd.
    #[test]
    fn dashboard_metrics_have_series_from_start() {
        let text = Metrics::new().render();
        let missing: Vec<&str> = include_str!("../../dashboards/metrics.txt")
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .filter(|name| {
                !text.lines().any(|l| {
                    l.strip_prefix(name)
                        .is_some_and(|rest| rest.starts_with(['{', ' ', '_']))
                })
            })
            .collect();
        assert!(missing.is_empty(), "no series at start: {missing:?}");
        assert!(text.contains("specd_controller_estimated_speedup{drafter=\"suffix\"} 0"));
    }

    #[test]
    fn exposition_has_help_and_bounded_series() {
        let m = Metrics::new();
        let text = m.render();
        assert!(text.contains("# HELP specd_upstream_errors_total"));
        assert!(text.contains("specd_upstream_errors_total{kind=\"connect\"} 0"));
        assert!(text.contains("specd_build_info{"));
    }
}
