//! Property tests (stable Rust, part of the normal suite) over what specd parses from
//! clients and upstreams: request bodies, upstream SSE streams, verify responses and
//! passed-through event streams. Nothing may panic; parsers must not depend on how bytes
//! were split into chunks. The same targets run under cargo-fuzz (`fuzz/`) for millions of
//! inputs; PROPTEST_CASES raises the count here.

use std::sync::Arc;

use futures_util::{FutureExt, StreamExt};
use proptest::prelude::*;
use serde_json::{json, Map, Value};
use specd::inflight::InFlight;
use specd::metrics::labels::StreamMode;
use specd::metrics::Metrics;
use specd::server::observe::{ObservedBody, Outcome};
use specd::speculation::request::{parse, Endpoint, Intake};
use specd::upstream::sse::SseParser;
use specd::upstream::vllm::parse_verify_response;

const FIELDS: &[&str] = &[
    "model",
    "prompt",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "logprobs",
    "top_logprobs",
    "stop",
    "stop_token_ids",
    "stream",
    "stream_options",
    "ignore_eos",
    "skip_special_tokens",
    "include_stop_str_in_output",
    "return_tokens_as_token_ids",
    "n",
    "best_of",
    "logit_bias",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "response_format",
    "tools",
    "echo",
    "prompt_logprobs",
    "min_tokens",
    "suffix",
    "speculation",
    "guided_json",
    "x-unknown",
];

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-3i64..70).prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        "[a-z0-9 .-]{0,12}".prop_map(Value::String),
        prop_oneof![
            Just("on"),
            Just("off"),
            Just("auto"),
            Just("ngram"),
            Just("oracle"),
            Just("yes"),
            Just("7"),
            Just("4.0")
        ]
        .prop_map(|s| Value::String(s.into())),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    scalar().prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(FIELDS), inner), 0..6).prop_map(|kv| {
                Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
            }),
        ]
    })
}

fn body() -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::vec((prop::sample::select(FIELDS), json_value()), 0..10)
        .prop_map(|kv| kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

fn header() -> impl Strategy<Value = Option<String>> {
    prop::option::of(prop_oneof![
        Just("on".to_string()),
        Just("off".to_string()),
        "[ -~]{0,6}"
    ])
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn request_parsing_never_panics(b in body(), chat in any::<bool>(), h in header()) {
        let endpoint = if chat { Endpoint::Chat } else { Endpoint::Completions };
        if let Ok(Intake::Speculate(g)) = parse(endpoint, b.clone(), h.as_deref()) {
            // What specd speculates on has a usable shape.
            prop_assert!(g.max_tokens.is_none_or(|n| n >= 1));
            prop_assert!(!g.body.contains_key("speculation"));
            prop_assert!(g.sampling.temperature.is_none_or(|t| t >= 0.0 && t.is_finite()));
        }
    }

    #[test]
    fn request_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256), chat in any::<bool>()) {
        if let Ok(Value::Object(m)) = serde_json::from_slice::<Value>(&bytes) {
            let endpoint = if chat { Endpoint::Chat } else { Endpoint::Completions };
            let _ = parse(endpoint, m, None);
        }
    }

    #[test]
    fn sse_parsing_is_chunking_invariant(
        data in prop::collection::vec(prop_oneof![Just(b'\n'), Just(b'\r'), Just(b':'), Just(b' '), any::<u8>(),
                                                  Just(b'd'), Just(b'a'), Just(b't')], 0..400),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
    ) {
        let mut whole = SseParser::new();
        let want = whole.feed(&data);
        let mut points: Vec<usize> = cuts.iter().map(|i| i.index(data.len() + 1)).collect();
        points.sort_unstable();
        let mut p = SseParser::new();
        let mut got = Vec::new();
        let mut at = 0;
        for c in points.into_iter().chain([data.len()]) {
            got.extend(p.feed(&data[at..c]));
            at = c;
        }
        prop_assert_eq!(want, got);
        prop_assert_eq!(whole.pending(), p.pending());
    }

    #[test]
    fn verify_responses_never_panic(v in json_value(), expected in 0usize..8, top in any::<bool>()) {
        let _ = parse_verify_response(&v, expected, top);
        let wrapped = json!({"choices": [{"index": 0, "logprobs": v}]});
        let _ = parse_verify_response(&wrapped, expected, top);
    }

    #[test]
    fn verify_responses_are_read_in_index_order(ids in prop::collection::vec(0u32..5000, 1..8), seed in any::<u64>()) {
        let mut choices: Vec<Value> = ids.iter().enumerate().map(|(i, t)| json!({
            "index": i, "logprobs": {"tokens": [format!("token_id:{t}")], "token_logprobs": [-0.5],
                                     "top_logprobs": [{format!("token_id:{t}"): -0.5}]}})).collect();
        fastrand::Rng::with_seed(seed).shuffle(&mut choices);
        let got = parse_verify_response(&json!({"choices": choices}), ids.len(), true)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(got.iter().map(|s| s.id).collect::<Vec<_>>(), ids);
    }

    #[test]
    fn passed_through_events_are_forwarded_whole(
        events in prop::collection::vec("[a-z{}\":,0-9]{0,20}", 0..8),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
        cut_off in any::<bool>(),
    ) {
        let mut text = String::new();
        for e in &events {
            text.push_str(&format!("data: {e}\n\n"));
        }
        if !cut_off {
            text.push_str("data: [DONE]\n\n");
        } else {
            text.push_str("data: {\"partial");
        }
        let bytes = text.into_bytes();
        let mut points: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
        points.sort_unstable();
        let mut chunks = Vec::new();
        let mut at = 0;
        for c in points.into_iter().chain([bytes.len()]) {
            chunks.push(Ok::<_, String>(bytes::Bytes::copy_from_slice(&bytes[at..c])));
            at = c;
        }
        if cut_off {
            chunks.push(Err("connection reset".to_string()));
        }
        let guard = Arc::new(InFlight::default()).enter(StreamMode::Passthrough);
        let outcome = Outcome::new(Arc::new(Metrics::new()), "completions", guard);
        let body = ObservedBody::new(futures_util::stream::iter(chunks), outcome, true);
        let out: Vec<_> = body.collect::<Vec<_>>().now_or_never().expect("ready stream");
        let out: Vec<u8> = out.into_iter().map(|c| c.expect("no error reaches the client")).flat_map(|b| b.to_vec()).collect();
        let out = String::from_utf8(out).expect("utf8");
        let text = String::from_utf8(bytes).expect("utf8");
        if cut_off {
            let whole_events = &text[..text.rfind("\n\n").map_or(0, |i| i + 2)];
            prop_assert!(out.starts_with(whole_events));
            prop_assert!(out[whole_events.len()..].starts_with("data: {\"error\""), "{}", out);
            prop_assert!(out.ends_with("data: [DONE]\n\n"));
        } else {
            prop_assert_eq!(out, text);
        }
    }
}
