//! The upstream's own load, read from its Prometheus `/metrics`: how many requests it is
//! decoding, how many wait, and how full its KV cache is. The controller uses it to back
//! off speculation under load (a verify round costs more when the batch is full).
//!
//! | field      | SGLang                  | vLLM                                   |
//! |------------|-------------------------|----------------------------------------|
//! | `running`  | `sglang:num_running_reqs` | `vllm:num_requests_running`          |
//! | `waiting`  | `sglang:num_queue_reqs` | `vllm:num_requests_waiting`            |
//! | `kv_usage` | `sglang:token_usage`    | `vllm:kv_cache_usage_perc` (older: `vllm:gpu_cache_usage_perc`) |
//!
//! Counts are summed over label sets (data-parallel ranks, engines); the KV usage, a
//! fraction in [0, 1], is the largest over them.

use std::time::Instant;

use super::detect::UpstreamKind;

/// One reading of the upstream's load.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Load {
    /// Requests the upstream is decoding now.
    pub running: f64,
    /// Requests queued in the upstream, not yet scheduled.
    pub waiting: f64,
    /// KV cache in use, 0..=1 (`None` when the server does not export it).
    pub kv_usage: Option<f64>,
    /// When this reading was taken.
    pub at: Instant,
}

struct Names {
    running: &'static [&'static str],
    waiting: &'static [&'static str],
    kv_usage: &'static [&'static str],
}

fn names(kind: UpstreamKind) -> Names {
    match kind {
        UpstreamKind::Sglang => Names {
            running: &["sglang:num_running_reqs"],
            waiting: &["sglang:num_queue_reqs"],
            kv_usage: &["sglang:token_usage"],
        },
        UpstreamKind::Vllm => Names {
            running: &["vllm:num_requests_running"],
            waiting: &["vllm:num_requests_waiting"],
            kv_usage: &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
        },
    }
}

/// Read the load from a `/metrics` page; `None` when it holds none of the names.
pub fn parse(kind: UpstreamKind, text: &str) -> Option<Load> {
    let n = names(kind);
    let (mut running, mut waiting, mut kv): (Option<f64>, Option<f64>, Option<f64>) =
        (None, None, None);
    let finite = super::prom_text::samples(text).filter(|s| s.value.is_finite());
    for s in finite {
        let (name, v) = (s.name.as_str(), s.value);
        if n.running.contains(&name) {
            running = Some(running.unwrap_or(0.0) + v);
        } else if n.waiting.contains(&name) {
            waiting = Some(waiting.unwrap_or(0.0) + v);
        } else if n.kv_usage.contains(&name) {
            kv = Some(kv.map_or(v, |k: f64| k.max(v)));
        }
    }
    if running.is_none() && waiting.is_none() && kv.is_none() {
        return None;
    }
    Some(Load {
        running: running.unwrap_or(0.0),
        waiting: waiting.unwrap_or(0.0),
        kv_usage: kv,
        at: Instant::now(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_sglang_metrics() {
        let text = "# HELP sglang:num_running_reqs The number of running requests.\n\
# TYPE sglang:num_running_reqs gauge\n\
sglang:num_running_reqs{engine_type=\"unified\",model_name=\"m\",tp_rank=\"0\"} 3.0\n\
sglang:num_running_reqs{engine_type=\"unified\",model_name=\"m\",tp_rank=\"1\"} 2.0\n\
sglang:num_queue_reqs{model_name=\"m\"} 4.0\n\
sglang:token_usage{model_name=\"m\",tp_rank=\"0\"} 0.25\n\
sglang:token_usage{model_name=\"m\",tp_rank=\"1\"} 0.5\n\
sglang:num_running_reqs_offline_batch{model_name=\"m\"} 9.0\n";
        let l = parse(UpstreamKind::Sglang, text).expect("load");
        assert_eq!((l.running, l.waiting, l.kv_usage), (5.0, 4.0, Some(0.5)));
        assert!(parse(UpstreamKind::Vllm, text).is_none());
    }

    #[test]
    fn reads_vllm_metrics() {
        let text = "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 1.0\n\
vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 0.0\n\
vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.125\n\
vllm:num_requests_running_total 7\n";
        let l = parse(UpstreamKind::Vllm, text).expect("load");
        assert_eq!((l.running, l.waiting, l.kv_usage), (1.0, 0.0, Some(0.125)));
        let old = parse(UpstreamKind::Vllm, "vllm:gpu_cache_usage_perc 0.75\n").expect("old");
        assert_eq!(old.kv_usage, Some(0.75));
        assert_eq!(old.running, 0.0);
    }

    #[test]
    fn labels_with_spaces_and_braces_parse() {
        let text = "sglang:num_queue_reqs{model_name=\"a b}c\"} 6 1700000000\n";
        let l = parse(UpstreamKind::Sglang, text).expect("load");
        assert_eq!(l.waiting, 6.0);
        assert_eq!(l.kv_usage, None);
    }
}
