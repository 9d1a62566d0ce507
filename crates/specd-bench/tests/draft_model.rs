//! The draft model's forward against Hugging Face transformers, on the CPU: tiny random
//! Llama (llama3 rope scaling, sharded checkpoint), Qwen2 (qkv bias, tied embeddings) and
//! Qwen3 (qk-norm, explicit head_dim) models, plus the project's own models (random and
//! trained pairs) when they exist. Logits and greedy continuations are compared in a mixed
//! batch and on one stream that rolls its cache back between cases. And the trained pair
//! is checked to be what it is for: a draft whose guesses the target often shares.
//!
//! The reference comes from scripts/draft_model_reference.py, run with the Python of
//! `SPECD_REFERENCE_PYTHON` or ~/.cache/specd/vllm-venv. Without such a Python the test
//! is skipped with a message, unless `SPECD_REQUIRE_REFERENCE=1` makes that a failure.

use std::path::{Path, PathBuf};
use std::process::Command;

use specd::draft::model::forward::greedy;
use specd::draft::model::ModelDrafter;
use specd_bench::draft_model::{check_reference, load_reference, Tolerance};

use specd::config::cache_dir as cache;

fn python() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SPECD_REFERENCE_PYTHON") {
        return Some(PathBuf::from(p));
    }
    let p = cache().join("vllm-venv/bin/python");
    p.exists().then_some(p)
}

fn models_dir() -> PathBuf {
    std::env::var_os("SPECD_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache().join("models"))
}

fn run_script(py: &Path, args: &[&str]) {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/draft_model_reference.py");
    let out = Command::new(py)
        .arg(&script)
        .args(args)
        .output()
        .expect("run the reference script");
    assert!(
        out.status.success(),
        "reference script failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn check(dir: &Path, reference: &Path) {
    let cases = load_reference(reference).unwrap();
    let d = ModelDrafter::load(dir, "cpu", None).unwrap();
    let r = check_reference(&d, &cases, Tolerance::for_dtype(candle_core::DType::F32), 1).await;
    println!(
        "{}: {} logit checks, max rel err {:.2e}, greedy {}/{} matched, {} near ties",
        dir.display(),
        r.logit_checks,
        r.max_rel_logits,
        r.greedy_tokens_matched,
        r.greedy_tokens_compared,
        r.near_ties
    );
    assert!(r.passed(), "{}: {:#?}", dir.display(), r.failures);
    // Enough of the continuations must really have been compared.
    assert!(r.greedy_tokens_matched * 2 >= r.greedy_tokens_compared.max(1));
    assert!(r.greedy_tokens_compared >= cases.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_matches_transformers() {
    let Some(py) = python() else {
        assert!(
            std::env::var_os("SPECD_REQUIRE_REFERENCE").is_none(),
            "no Python with transformers for the reference (set SPECD_REFERENCE_PYTHON)"
        );
        eprintln!("skipping: no Python with transformers (~/.cache/specd/vllm-venv)");
        return;
    };
    let work = Path::new(env!("CARGO_TARGET_TMPDIR")).join("draft-reference");
    std::fs::create_dir_all(&work).unwrap();
    let mut args = vec![
        "tiny".to_string(),
        "--out".into(),
        work.to_str().unwrap().into(),
    ];
    let mut models = vec![];
    for name in ["llama", "qwen2", "qwen3"] {
        models.push((
            work.join(name),
            work.join(format!("{name}.ref.safetensors")),
        ));
    }
    for name in ["draft", "target", "draft-trained", "target-trained"] {
        let dir = models_dir().join(name);
        if !dir.join("config.json").exists() {
            eprintln!("no project model {}: skipped", dir.display());
            continue;
        }
        args.push("--extra".into());
        args.push(format!("project-{name}={}", dir.display()));
        models.push((dir, work.join(format!("project-{name}.ref.safetensors"))));
    }
    // One Python process for all references: importing torch is slow.
    run_script(&py, &args.iter().map(String::as_str).collect::<Vec<_>>());
    for (dir, reference) in &models {
        check(dir, reference).await;
    }
}

/// On Python code neither model trained on (this repository's scripts), the trained target
/// predicts the next token better than the trained draft, and the draft's greedy guess is
/// the target's often enough for speculation to have something to accept (a random pair
/// agrees on ~1 token in 4096). `SPECD_REQUIRE_TRAINED=1` makes missing models a failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trained_pair_agrees_on_unseen_code() {
    let (draft_dir, target_dir) = (
        models_dir().join("draft-trained"),
        models_dir().join("target-trained"),
    );
    if !draft_dir.join("config.json").exists() || !target_dir.join("config.json").exists() {
        assert!(
            std::env::var_os("SPECD_REQUIRE_TRAINED").is_none(),
            "no trained pair in {} (scripts/train_models.py)",
            models_dir().display()
        );
        eprintln!("skipping: no trained pair (scripts/train_models.py)");
        return;
    }
    let tok = tokenizers::Tokenizer::from_file(target_dir.join("tokenizer.json")).unwrap();
    let draft = ModelDrafter::load(&draft_dir, "cpu", None).unwrap();
    let target = ModelDrafter::load(&target_dir, "cpu", None).unwrap();
    let (mut agree, mut draft_right, mut target_right, mut n) = (0, 0, 0, 0);
    let files = [
        "make_models.py",
        "dashboard_metrics.py",
        "draft_model_reference.py",
    ];
    for (stream, file) in files.iter().enumerate() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../scripts")
            .join(file);
        let text = std::fs::read_to_string(path).unwrap();
        let ids = tok.encode(text.as_str(), false).unwrap().get_ids().to_vec();
        let ids = &ids[..ids.len().min(300)];
        // One stream per file and model: each call extends its cache by one token.
        for end in 16..ids.len() {
            let d = draft
                .logits(stream as u64, ids[..end].to_vec())
                .await
                .unwrap();
            let t = target
                .logits(stream as u64, ids[..end].to_vec())
                .await
                .unwrap();
            let (d, t) = (greedy(&d).token, greedy(&t).token);
            agree += usize::from(d == t);
            draft_right += usize::from(d == ids[end]);
            target_right += usize::from(t == ids[end]);
            n += 1;
        }
    }
    let rate = |x: usize| x as f64 / n as f64;
    println!(
        "{n} positions: draft/target greedy agreement {:.3}, next-token accuracy draft {:.3}, target {:.3}",
        rate(agree),
        rate(draft_right),
        rate(target_right)
    );
    assert!(rate(agree) > 0.25, "agreement {:.3}", rate(agree));
    assert!(
        target_right > draft_right,
        "the target must be the stronger model"
    );
}
