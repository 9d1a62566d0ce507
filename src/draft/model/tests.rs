//! Self-consistency of the drafter on tiny random checkpoints written here: batching,
//! chunked prefill and rollback must not change what the model computes. (Agreement with
//! the reference implementation is checked in tests/draft_model.rs.)

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use futures_util::future::join_all;

use super::*;

fn tensor(rng: &mut fastrand::Rng, shape: &[usize], std: f32) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|_| (rng.f32() * 2.0 - 1.0) * std * 1.7)
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

/// Write a random checkpoint of the given family to a fresh directory.
pub(crate) fn write_tiny(name: &str, family: Family) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("specd-tiny-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (h, nh, nkv, hd, inter, layers, vocab) = match family {
        Family::Qwen3 => (32, 4, 2, 16, 48, 2, 101),
        _ => (32, 4, 2, 8, 48, 2, 101),
    };
    let mut rng = fastrand::Rng::with_seed(11);
    let mut t = HashMap::new();
    let mut put = |n: String, shape: &[usize], std: f32, rng: &mut fastrand::Rng| {
        t.insert(n, tensor(rng, shape, std));
    };
    put(
        "model.embed_tokens.weight".into(),
        &[vocab, h],
        1.0,
        &mut rng,
    );
    put("model.norm.weight".into(), &[h], 1.0, &mut rng);
    if family == Family::Llama {
        put("lm_head.weight".into(), &[vocab, h], 0.5, &mut rng);
    }
    for l in 0..layers {
        let p = format!("model.layers.{l}");
        put(format!("{p}.input_layernorm.weight"), &[h], 1.0, &mut rng);
        put(
            format!("{p}.post_attention_layernorm.weight"),
            &[h],
            1.0,
            &mut rng,
        );
        for (n, o) in [("q", nh), ("k", nkv), ("v", nkv)] {
            put(
                format!("{p}.self_attn.{n}_proj.weight"),
                &[o * hd, h],
                0.4,
                &mut rng,
            );
            if family == Family::Qwen2 {
                put(
                    format!("{p}.self_attn.{n}_proj.bias"),
                    &[o * hd],
                    0.4,
                    &mut rng,
                );
            }
        }
        put(
            format!("{p}.self_attn.o_proj.weight"),
            &[h, nh * hd],
            0.3,
            &mut rng,
        );
        if family == Family::Qwen3 {
            put(format!("{p}.self_attn.q_norm.weight"), &[hd], 1.0, &mut rng);
            put(format!("{p}.self_attn.k_norm.weight"), &[hd], 1.0, &mut rng);
        }
        put(
            format!("{p}.mlp.gate_proj.weight"),
            &[inter, h],
            0.3,
            &mut rng,
        );
        put(
            format!("{p}.mlp.up_proj.weight"),
            &[inter, h],
            0.3,
            &mut rng,
        );
        put(
            format!("{p}.mlp.down_proj.weight"),
            &[h, inter],
            0.3,
            &mut rng,
        );
    }
    candle_core::safetensors::save(&t, dir.join("model.safetensors")).unwrap();
    let model_type = match family {
        Family::Llama => "llama",
        Family::Qwen2 => "qwen2",
        Family::Qwen3 => "qwen3",
    };
    let cfg = serde_json::json!({
        "model_type": model_type, "hidden_size": h, "intermediate_size": inter,
        "num_hidden_layers": layers, "num_attention_heads": nh, "num_key_value_heads": nkv,
        "head_dim": hd, "vocab_size": vocab, "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "max_position_embeddings": 256, "sliding_window": null,
        "tie_word_embeddings": family != Family::Llama,
    });
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    dir
}

fn load(dir: &Path, step_tokens: Option<usize>) -> ModelDrafter {
    ModelDrafter::load_with(
        dir,
        DraftDevice::Cpu,
        None,
        DrafterOptions {
            max_streams: Some(4),
            max_step_tokens: step_tokens,
            ..DrafterOptions::default()
        },
    )
    .unwrap()
}

fn contexts() -> Vec<Vec<u32>> {
    let mut rng = fastrand::Rng::with_seed(3);
    [3usize, 9, 17, 1]
        .iter()
        .map(|&n| (0..n).map(|_| rng.u32(..101)).collect())
        .collect()
}

fn req(stream: u64, context: &[u32], max_k: usize) -> DraftRequest {
    DraftRequest {
        stream,
        context: context.to_vec().into(),
        prompt_len: context.len(),
        max_k,
    }
}

fn close(a: &[f32], b: &[f32]) -> bool {
    let num: f32 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    let den: f32 = b.iter().map(|y| y * y).sum();
    a.len() == b.len() && (num / den.max(1e-30)).sqrt() < 1e-5
}

async fn check_family(family: Family) {
    let dir = write_tiny(&format!("{family:?}"), family);
    let ctxs = contexts();
    // Reference: each context alone, on a fresh drafter, one stream each.
    let solo = load(&dir, None);
    let mut want = Vec::new();
    for (i, c) in ctxs.iter().enumerate() {
        let p = solo.propose(req(i as u64, c, 6)).await.unwrap();
        assert_eq!(p.tokens.len(), 6);
        assert!(p.confidence.iter().all(|&c| c > 0.0 && c <= 1.0));
        let l = solo.logits(100 + i as u64, c.clone()).await.unwrap();
        want.push((p.tokens, l));
    }
    // All at once (mixed prefill/decode batches), with prefill split into small chunks.
    let batched = load(&dir, Some(5));
    let got = join_all(
        ctxs.iter()
            .enumerate()
            .map(|(i, c)| batched.propose(req(i as u64, c, 6))),
    )
    .await;
    for (g, w) in got.into_iter().zip(&want) {
        assert_eq!(
            g.unwrap().tokens,
            w.0,
            "{family:?}: batched proposal differs"
        );
    }
    let st = batched.stats();
    assert!(
        st.step_rows > st.steps,
        "{family:?}: steps were not batched: {st:?}"
    );
    // Rollback: one stream walks through all contexts; each must match the fresh result.
    for (i, c) in ctxs
        .iter()
        .enumerate()
        .chain(std::iter::once((0, &ctxs[0])))
    {
        let long: Vec<u32> = c
            .iter()
            .chain(&want[(i + 1) % ctxs.len()].0)
            .copied()
            .collect();
        batched.propose(req(9, &long, 3)).await.unwrap();
        let p = batched.propose(req(9, c, 6)).await.unwrap();
        assert_eq!(
            p.tokens, want[i].0,
            "{family:?}: proposal after rollback differs"
        );
        let l = batched.logits(9, c.clone()).await.unwrap();
        assert!(
            close(&l, &want[i].1),
            "{family:?}: logits after rollback differ"
        );
    }
    assert!(batched.stats().rolled_back_tokens > 0);
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test]
async fn llama_batching_and_rollback_are_exact() {
    check_family(Family::Llama).await;
}

#[tokio::test]
async fn qwen2_batching_and_rollback_are_exact() {
    check_family(Family::Qwen2).await;
}

#[tokio::test]
async fn qwen3_batching_and_rollback_are_exact() {
    check_family(Family::Qwen3).await;
}

#[tokio::test]
async fn edge_requests() {
    let dir = write_tiny("edge", Family::Llama);
    let d = ModelDrafter::load_with(
        &dir,
        DraftDevice::Cpu,
        None,
        DrafterOptions {
            max_streams: Some(1),
            max_len: Some(16),
            ..DrafterOptions::default()
        },
    )
    .unwrap();
    assert!(d.propose(req(1, &[], 4)).await.unwrap().tokens.is_empty());
    assert!(d
        .propose(req(1, &[1, 2], 0))
        .await
        .unwrap()
        .tokens
        .is_empty());
    // 14 context tokens leave room for 2 drafts in 16 positions.
    let ctx: Vec<u32> = (0..14).collect();
    assert_eq!(d.propose(req(1, &ctx, 8)).await.unwrap().tokens.len(), 2);
    let full: Vec<u32> = (0..16).collect();
    assert!(d.propose(req(1, &full, 8)).await.unwrap().tokens.is_empty());
    assert_eq!(d.stats().too_long, 1);
    // One slot, two streams: the second evicts the first, both still work.
    let a = d.propose(req(1, &[5, 6, 7], 3)).await.unwrap();
    let b = d.propose(req(2, &[8, 9], 3)).await.unwrap();
    let a2 = d.propose(req(1, &[5, 6, 7], 3)).await.unwrap();
    assert_eq!(a.tokens, a2.tokens);
    assert_eq!(b.tokens.len(), 3);
    d.finish(1);
    d.finish(2);
    // A dropped request is abandoned, and the drafter keeps serving.
    drop(d.propose(req(3, &ctx, 2)));
    assert_eq!(d.propose(req(4, &[1], 2)).await.unwrap().tokens.len(), 2);
    assert!(ModelDrafter::load(&dir, "tpu", None).is_err());
    std::fs::remove_dir_all(&dir).ok();
}
