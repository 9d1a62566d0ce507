//! Unit tests of the SGLang backend's request building and answer parsing. The answer
//! shapes are those of SGLang 0.5.23's `/generate` (tokenizer_manager.py, io_struct.py):
//! logprob items `[logprob, token_id, text|null]`, a null first input entry.

use super::wire::*;
use super::*;
use crate::upstream::verify::{MinTokens, PerStep};

fn backend(settings: SglangSettings, defaults: ModelDefaults) -> SglangBackend {
    let args = <crate::config::ServeArgs as clap::Args>::augment_args(clap::Command::new("t"))
        .try_get_matches_from(["t", "--upstream", "http://127.0.0.1:9"])
        .and_then(|m| <crate::config::ServeArgs as clap::FromArgMatches>::from_arg_matches(&m))
        .expect("args");
    let metrics = Arc::new(crate::metrics::Metrics::new());
    let up = Arc::new(Upstream::new(&args, metrics).expect("client"));
    SglangBackend::new(up, settings, defaults, 4096)
}

fn model_settings() -> SglangSettings {
    SglangSettings {
        model_sampling_defaults: true,
        ..SglangSettings::default()
    }
}

fn obj(v: Value) -> Map<String, Value> {
    v.as_object().cloned().unwrap_or_default()
}

#[test]
fn completions_get_openai_defaults_and_chat_the_models() {
    let d = ModelDefaults::from_generation_config(
        &json!({"temperature": 0.6, "top_p": 0.9, "top_k": 20, "eos_token_id": [1, 3]}),
    );
    assert_eq!(d.top_k, Some(20));
    let b = backend(model_settings(), d);
    let mut s = Sampling::default();
    b.prepare_sampling(false, &Map::new(), &mut s).expect("ok");
    assert_eq!(
        (s.temperature, s.top_p, s.top_k, s.min_p),
        (Some(1.0), Some(1.0), Some(-1), Some(0.0))
    );
    let mut s = Sampling {
        top_p: Some(0.5),
        ..Sampling::default()
    };
    b.prepare_sampling(true, &Map::new(), &mut s).expect("ok");
    assert_eq!(
        (s.temperature, s.top_p, s.top_k, s.min_p),
        (Some(0.6), Some(0.5), Some(20), Some(0.0))
    );
    // --sampling-defaults openai: the chat route ignores the model's values too.
    let b = backend(SglangSettings::default(), b.chat_defaults.clone());
    let mut s = Sampling::default();
    b.prepare_sampling(true, &Map::new(), &mut s).expect("ok");
    assert_eq!(s.temperature, Some(1.0));
}

#[test]
fn what_specd_cannot_reproduce_passes_through() {
    let d = ModelDefaults {
        repetition_penalty: Some(1.05),
        ..ModelDefaults::default()
    };
    let b = backend(model_settings(), d);
    let mut s = Sampling::default();
    assert_eq!(
        b.prepare_sampling(true, &Map::new(), &mut s),
        Err(PassthroughReason::Penalty)
    );
    // The client's own neutral value wins over the model's, and completions ignore it.
    let neutral = obj(json!({"repetition_penalty": 1.0}));
    assert!(b.prepare_sampling(true, &neutral, &mut s).is_ok());
    assert!(b.prepare_sampling(false, &Map::new(), &mut s).is_ok());
    // vLLM's per-step fields: SGLang penalizes output tokens only, and the rest are not
    // SGLang's to reproduce.
    for (per_step, reason) in [
        (
            PerStep {
                repetition_penalty: Some(1.3),
                ..PerStep::default()
            },
            PassthroughReason::Penalty,
        ),
        (
            PerStep {
                logit_bias: Some(vec![(5, 1.0)]),
                ..PerStep::default()
            },
            PassthroughReason::LogitBias,
        ),
        (
            PerStep {
                allowed_token_ids: Some(vec![5]),
                ..PerStep::default()
            },
            PassthroughReason::UnsupportedParam,
        ),
        (
            PerStep {
                bad_words: Some(vec!["x".into()]),
                ..PerStep::default()
            },
            PassthroughReason::UnsupportedParam,
        ),
    ] {
        let mut s = Sampling {
            per_step,
            ..Sampling::default()
        };
        assert_eq!(b.prepare_sampling(false, &Map::new(), &mut s), Err(reason));
    }
    let mut with_min = Sampling {
        min_tokens: Some(MinTokens {
            count: 3,
            stop_token_ids: Vec::new(),
        }),
        ..Sampling::default()
    };
    assert_eq!(
        b.prepare_sampling(false, &Map::new(), &mut with_min),
        Err(PassthroughReason::MinTokens)
    );
    for body in [
        json!({"regex": "a+"}),
        json!({"json_schema": "{}"}),
        json!({"lora_path": "x"}),
    ] {
        assert_eq!(
            b.prepare_sampling(false, &obj(body), &mut s),
            Err(PassthroughReason::UnsupportedParam)
        );
    }
    assert!(b
        .prepare_sampling(false, &obj(json!({"no_stop_trim": false})), &mut s)
        .is_ok());
    assert_eq!(
        b.prepare_sampling(false, &obj(json!({"model": "m:adapter"})), &mut s),
        Err(PassthroughReason::Lora)
    );
}

#[test]
fn every_sampling_field_is_pinned() {
    let s = Sampling {
        temperature: Some(0.7),
        seed: Some(-3i64 as u64),
        ..Sampling::default()
    };
    let m = sampling_params(&s, 1);
    for k in [
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "min_new_tokens",
        "max_new_tokens",
        "n",
    ] {
        assert!(m.contains_key(k), "{k}");
    }
    assert_eq!(m["sampling_seed"], json!(-3));
    assert_eq!(m["top_k"], json!(-1));
    assert!(!sampling_params(&Sampling::default(), 1).contains_key("sampling_seed"));
}

#[test]
fn output_samples_with_and_without_logprobs() {
    let item = json!({"text": "x", "output_ids": [17], "meta_info": {
        "prompt_tokens": 20, "cached_tokens": 16,
        "output_token_logprobs": [[-0.25, 17, null]],
        "output_top_logprobs": [[[-0.25, 17, null], [-1.5, 4, null]]]}});
    assert_eq!(output_sample(&item, None).expect("s"), Sample::id(17));
    let s = output_sample(&item, Some(1)).expect("s");
    assert_eq!(
        (s.id, s.logprob, s.top),
        (17, Some(-0.25), vec![(17, -0.25)])
    );
    assert!(output_sample(&json!({"output_ids": []}), None).is_err());
    assert!(output_sample(&json!({"error": {"message": "boom"}}), None).is_err());
}

#[test]
fn cumulative_and_incremental_relay_chunks() {
    let c1 = r#"{"text": null, "output_ids": [5, 6], "meta_info": {}}"#;
    let c2 = r#"{"text": "ab", "output_ids": [5, 6, 7], "meta_info": {}}"#;
    let ids = |v: Vec<Sample>| v.into_iter().map(|s| s.id).collect::<Vec<_>>();
    assert_eq!(
        ids(relay_chunk(c1, 0, false, None).expect("c1")),
        vec![5, 6]
    );
    assert_eq!(ids(relay_chunk(c2, 2, false, None).expect("c2")), vec![7]);
    let d2 = r#"{"output_ids": [7], "meta_info": {"output_token_logprobs": [[-0.5, 7, null]], "output_top_logprobs": [null]}}"#;
    let s = relay_chunk(d2, 2, true, Some(0)).expect("d2");
    assert_eq!((s[0].id, s[0].logprob), (7, Some(-0.5)));
    let e = relay_chunk(
        r#"{"error": {"message": "bad", "code": 400}}"#,
        0,
        false,
        None,
    );
    assert!(matches!(e, Err(ApiError::Upstream { status: 400, .. })));
}

#[test]
fn top_entries_skip_nulls_and_keep_order() {
    let t = parse_top(&json!([[-0.1, 3, "a"], [null, 9, null], [-2.0, 8, null]]));
    assert_eq!(t, vec![(3, -0.1), (8, -2.0)]);
    assert!(parse_top(&Value::Null).is_empty());
}

#[test]
fn out_of_vocabulary_prompts_are_screened() {
    let b = backend(SglangSettings::default(), ModelDefaults::default());
    for ok in [
        json!({"prompt": "text"}),
        json!({"prompt": [0, 4095]}),
        json!({"prompt": [[1], [2]]}),
    ] {
        assert!(b.screen(&obj(ok)).is_ok());
    }
    for bad in [
        json!({"prompt": [0, 4096]}),
        json!({"prompt": [[1], [2, 99999]]}),
        json!({"prompt": [-1]}),
        json!({"input_ids": [7, 5000]}),
    ] {
        assert!(matches!(b.screen(&obj(bad)), Err(ApiError::BadRequest(_))));
    }
}
