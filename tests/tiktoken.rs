//! specd in front of a real vLLM serving a tokenizer in the tiktoken format
//! (`target-tiktoken`: the target's weights, `tiktoken.model` ranks and a remote-code
//! class, no tokenizer.json — the layout Kimi-K2 ships), started by its hub id from a
//! Hugging Face cache layout (scripts/vllm-cpu-upstream.sh with `SPECD_VLLM_HUB_ID`), so
//! specd finds the tokenizer through `HF_HUB_CACHE` without `--tokenizer`. Greedy answers
//! through specd, speculated, equal vLLM's own token for token.
//!
//! The server is started on demand and reused across runs; `SPECD_TEST_TIKTOKEN_UPSTREAM`
//! and `SPECD_TEST_TIKTOKEN_HUB_CACHE` point at one already running.

mod common;

use std::sync::OnceLock;

use common::*;
use serde_json::{json, Value};
use specd::tokens::ModelTokenizer;

const MODEL: &str = "specd-target-tiktoken";
const HUB_ID: &str = "specd/target-tiktoken";

/// (upstream URL, its Hugging Face cache directory).
fn tiktoken_upstream() -> (String, String) {
    static UP: OnceLock<(String, String)> = OnceLock::new();
    UP.get_or_init(|| {
        if let (Ok(u), Ok(c)) = (
            std::env::var("SPECD_TEST_TIKTOKEN_UPSTREAM"),
            std::env::var("SPECD_TEST_TIKTOKEN_HUB_CACHE"),
        ) {
            return (u, c);
        }
        let env = [
            ("SPECD_VLLM_MODEL", "target-tiktoken"),
            ("SPECD_VLLM_SERVED_NAME", MODEL),
            ("SPECD_VLLM_HUB_ID", HUB_ID),
            (
                "SPECD_VLLM_EXTRA_ARGS",
                "--dtype float32 --trust-remote-code",
            ),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()));
        let out = start(Engine::Vllm, &env, "tiktoken vLLM");
        (printed(&out, "UPSTREAM"), printed(&out, "HF_HUB_CACHE"))
    })
    .clone()
}

/// specd in front of the tiktoken upstream, sharing its hub cache, no `--tokenizer`.
async fn specd(extra: &[&str]) -> Specd {
    let (up, cache) = tiktoken_upstream();
    let specd = Specd::start_env(
        &up,
        extra,
        &[("HF_HUB_CACHE", &cache), ("SPECD_LOG", "info")],
    );
    specd.wait_ready(common::READY_TIMEOUT).await;
    specd
}

fn texts() -> Vec<String> {
    let mut out: Vec<String> = [
        "naïve café, Grüße — 数字 ✓ ½ 12345 6.02e23\n\tdef f(x):\n        return x  # done\n",
        "<|begin_of_text|>a<|im_start|>user\nhi<|im_end|>\n<|end_of_text|> tail",
        "import os\n\n\ndef main(argv=None):\n    \"\"\"Run.\"\"\"\n    return 0   \n\n",
        "🦀 emoji, \u{7f} control, CRLF\r\n  trailing   ",
    ]
    .map(String::from)
    .to_vec();
    out.push("for i in range(10):\n    print(i)\n".repeat(20));
    out
}

async fn vllm_ids(up: &str, text: &str) -> Vec<u32> {
    let (s, v) = post(up, "/tokenize", &json!({"model": MODEL, "prompt": text})).await;
    assert_eq!(s, 200, "{v}");
    v["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .filter_map(Value::as_u64)
        .map(|t| t as u32)
        .collect()
}

#[tokio::test]
async fn the_tiktoken_folder_tokenizes_like_vllm_and_like_tokenizer_json() {
    let (up, _) = tiktoken_upstream();
    let models = models_dir();
    let tiktoken = ModelTokenizer::load(&models.join("target-tiktoken")).expect("tiktoken folder");
    assert!(
        tiktoken.path.ends_with("tiktoken.model"),
        "{:?}",
        tiktoken.path
    );
    let json_variant = ModelTokenizer::load(&models.join("target")).expect("tokenizer.json");
    // `--tokenizer` may name the ranks file itself.
    let by_file = ModelTokenizer::load(&tiktoken.path).expect("tiktoken.model");
    assert_eq!(by_file.path, tiktoken.path);
    assert_eq!(by_file.vocab_size, tiktoken.vocab_size);
    assert_eq!(
        tiktoken.vocab_size,
        4096 + 256,
        "the target's ids and 256 reserved ones"
    );
    assert_eq!(tiktoken.eos_id, json_variant.eos_id);
    assert_eq!(tiktoken.extra_eos_ids, json_variant.extra_eos_ids);
    for text in texts() {
        let served = vllm_ids(&up, &text).await;
        let local = tiktoken
            .tokenizer
            .encode(text.as_str(), true)
            .expect("encode");
        let other = json_variant
            .tokenizer
            .encode(text.as_str(), true)
            .expect("encode");
        assert_eq!(
            served,
            local.get_ids(),
            "vLLM vs the tiktoken loader: {text:?}"
        );
        assert_eq!(served, other.get_ids(), "vLLM vs tokenizer.json: {text:?}");
        let decoded = tiktoken
            .tokenizer
            .decode(local.get_ids(), false)
            .expect("decode");
        // Text prompts start with BOS (add_bos_token), as they do for the target.
        assert_eq!(decoded, format!("<|begin_of_text|>{text}"), "round trip");
        let (s, v) = post(
            &up,
            "/detokenize",
            &json!({"model": MODEL, "tokens": served}),
        )
        .await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(
            v["prompt"].as_str(),
            Some(decoded.as_str()),
            "vLLM's /detokenize"
        );
    }
}

#[tokio::test]
async fn a_hub_id_start_verifies_the_tiktoken_tokenizer_without_flags() {
    let s = specd(&["--speculation", "on"]).await;
    assert_eq!(s.metric("specd_tokenizer_verified").await, Some(1.0));
    let log = s.log_text();
    assert!(log.contains("tokenizer in the tiktoken format"), "{log}");
    assert!(
        log.contains("models--specd--target-tiktoken/snapshots/"),
        "the tokenizer comes from the hub cache: {log}"
    );
}

#[tokio::test]
async fn a_tokenizer_that_splits_differently_is_refused_in_one_line() {
    // The same ranks without the class: Kimi-K2's pattern, which splits digits in threes
    // where the served class keeps them whole. The upstream's start makes the model's
    // files on a fresh machine, so it comes first.
    tiktoken_upstream();
    let dir = std::env::temp_dir().join(format!("specd-tiktoken-mismatch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let src = models_dir().join("target-tiktoken");
    std::fs::copy(src.join("tiktoken.model"), dir.join("tiktoken.model")).expect("copy");
    let mut cfg: Value =
        serde_json::from_slice(&std::fs::read(src.join("tokenizer_config.json")).expect("read"))
            .expect("json");
    cfg.as_object_mut().map(|o| o.remove("auto_map"));
    std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).expect("write");
    let tok = dir.to_string_lossy().to_string();
    let s = specd(&["--speculation", "on", "--tokenizer", &tok]).await;
    assert_eq!(s.metric("specd_tokenizer_verified").await, Some(0.0));
    let log = s.log_text();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("no usable tokenizer"))
        .collect();
    assert_eq!(lines.len(), 1, "{log}");
    assert!(
        lines[0].contains("tokenizes the probe text differently"),
        "{}",
        lines[0]
    );
    let _ = std::fs::remove_dir_all(dir);
}

fn prompts() -> Vec<String> {
    vec![
        "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add(".into(),
        "import os\nimport sys\nimport os\nimport sys\nimport os\nimport".into(),
        "café café café — 数字 数字 数字 ✓ ✓".into(),
        "for i in range(10):\n    print(i)\n".repeat(6),
    ]
}

/// Token ids, text and `usage` of an answer, streamed or not.
async fn ask(base: &str, chat: bool, stream: bool, prompt: &str) -> (Vec<u32>, String, Value) {
    let mut body = if chat {
        json!({"model": MODEL, "messages": [{"role": "user", "content": prompt}],
               "logprobs": true, "top_logprobs": 0})
    } else {
        json!({"model": MODEL, "prompt": prompt, "logprobs": 0})
    };
    body["max_tokens"] = json!(40);
    body["temperature"] = json!(0);
    body["return_tokens_as_token_ids"] = json!(true);
    let path = if chat {
        "/v1/chat/completions"
    } else {
        "/v1/completions"
    };
    if stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        let (s, ev, done) = post_stream(base, path, &body).await;
        assert!(s == 200 && done, "{s} {ev:?}");
        let usage = ev
            .last()
            .and_then(|e| e.get("usage"))
            .cloned()
            .unwrap_or(Value::Null);
        (
            ev.iter().flat_map(token_ids).collect(),
            stream_text(&ev),
            usage,
        )
    } else {
        let (s, v) = post(base, path, &body).await;
        assert_eq!(s, 200, "{v}");
        let c = &v["choices"][0];
        let text = c
            .get("text")
            .or_else(|| c.pointer("/message/content"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        (token_ids(&v), text, v["usage"].clone())
    }
}

#[tokio::test]
async fn speculated_answers_equal_direct_vllm_token_for_token() {
    let (up, _) = tiktoken_upstream();
    let s = specd(&[
        "--speculation",
        "on",
        "--drafter",
        "suffix",
        "--max-draft-tokens",
        "4",
    ])
    .await;
    assert_eq!(s.metric("specd_tokenizer_verified").await, Some(1.0));
    let mut checked = 0;
    for (i, p) in prompts().iter().enumerate() {
        for (chat, stream) in [(false, false), (false, true), (true, false), (true, true)] {
            let what = format!("prompt {i}, chat {chat}, stream {stream}");
            let (ids, text, _) = ask(&up, chat, stream, p).await;
            let (via_ids, via_text, usage) = ask(&s.url, chat, stream, p).await;
            assert!(!ids.is_empty(), "{what}: direct answer has ids");
            assert_eq!(via_ids, ids, "{what}: token ids");
            assert_eq!(via_text, text, "{what}: text");
            let rounds = usage.pointer("/speculation/rounds").and_then(Value::as_u64);
            assert!(
                rounds.is_some_and(|r| r > 0),
                "{what}: not speculated: {usage}"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 16);
    let m = s.metrics().await;
    let drafted = metric_sum(&m, "specd_spec_decode_num_draft_tokens_total");
    let accepted = metric_sum(&m, "specd_spec_decode_num_accepted_tokens_total");
    assert!(drafted > 0.0, "the suffix drafter proposed nothing");
    eprintln!("suffix on target-tiktoken: {accepted} of {drafted} draft tokens accepted");
}

/// Every text file under `dir` (recursively), sorted.
fn text_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = rd.filter_map(Result::ok).map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            text_files(&p, out);
        } else if p.extension().is_some_and(|e| {
            ["rs", "py", "md", "sh", "toml", "json"].contains(&e.to_str().unwrap_or(""))
        }) {
            out.push(p);
        }
    }
}

#[test]
fn the_loader_matches_tokenizer_json_on_this_repositorys_files() {
    let models = models_dir();
    let tiktoken = ModelTokenizer::load(&models.join("target-tiktoken")).expect("tiktoken folder");
    let json_variant = ModelTokenizer::load(&models.join("target")).expect("tokenizer.json");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for d in ["src", "scripts", "docs", "tests", "crates", "dashboards"] {
        text_files(&root.join(d), &mut files);
    }
    assert!(files.len() > 50, "{} files", files.len());
    let mut tokens = 0;
    for f in &files {
        // Reserved tokens exist in the tiktoken folder only.
        let Some(text) = std::fs::read_to_string(f)
            .ok()
            .filter(|t| !t.contains("<|reserved_token_"))
        else {
            continue;
        };
        let a = tiktoken
            .tokenizer
            .encode(text.as_str(), false)
            .expect("encode");
        let b = json_variant
            .tokenizer
            .encode(text.as_str(), false)
            .expect("encode");
        if let Some(i) =
            (0..a.len().max(b.len())).find(|&i| a.get_ids().get(i) != b.get_ids().get(i))
        {
            let at = a.get_offsets().get(i).map_or(0, |o| o.0);
            let context: String = text[at..].chars().take(40).collect();
            panic!("{}: token {i} differs, at {context:?}", f.display());
        }
        assert_eq!(
            tiktoken
                .tokenizer
                .decode(a.get_ids(), false)
                .expect("decode"),
            text
        );
        tokens += a.get_ids().len();
    }
    eprintln!("{} files, {tokens} tokens: the same ids", files.len());
}

#[tokio::test]
async fn kept_special_tokens_pass_through_unless_unspaced() {
    let (up, _) = tiktoken_upstream();
    let s = specd(&["--speculation", "on", "--drafter", "suffix"]).await;
    // A prompt ending in a special token: vLLM's Python-class detokenizer puts a space
    // after it when special tokens are kept and spaced (its default).
    let prompt = "import os\nimport os\nimport os<|im_start|>";
    for (spaced, speculated) in [(None, false), (Some(true), false), (Some(false), true)] {
        let mut body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 12,
                              "temperature": 0, "skip_special_tokens": false});
        if let Some(sp) = spaced {
            body["spaces_between_special_tokens"] = json!(sp);
        }
        let (sd, direct) = post(&up, "/v1/completions", &body).await;
        let (sv, via) = post(&s.url, "/v1/completions", &body).await;
        assert_eq!((sd, sv), (200, 200), "{direct} {via}");
        let text = |v: &Value| {
            v.pointer("/choices/0/text")
                .and_then(Value::as_str)
                .map(String::from)
        };
        assert_eq!(text(&via), text(&direct), "spaces {spaced:?}");
        if spaced != Some(false) {
            assert!(
                text(&direct).is_some_and(|t| t.starts_with(' ')),
                "{direct}"
            );
        }
        let rounds = via
            .pointer("/usage/speculation/rounds")
            .and_then(Value::as_u64);
        assert_eq!(
            rounds.is_some_and(|r| r > 0),
            speculated,
            "spaces {spaced:?}: {via}"
        );
    }
    let m = s.metrics().await;
    assert!(metric_sum(&m, "specd_passthrough_total{reason=\"unsupported_param\"}") >= 2.0);
}
