//! Translation between the project's two test tokenizers (make_models.py's `tokenizer`
//! and `tokenizer-xtok`: other size, other merges).

use std::path::PathBuf;

use super::*;

fn models_dir() -> PathBuf {
    std::env::var_os("SPECD_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::config::cache_dir().join("models"))
}

/// The pair, or None (skipped) where make_models.py has not built them.
fn pair() -> Option<(Arc<ModelTokenizer>, Translator)> {
    let dir = models_dir();
    let (t, d) = (dir.join("tokenizer"), dir.join("tokenizer-xtok"));
    if !t.join("tokenizer.json").exists() || !d.join("tokenizer.json").exists() {
        assert!(
            std::env::var_os("SPECD_REQUIRE_TRAINED").is_none(),
            "no tokenizer-xtok in {} (scripts/make_models.py --trained)",
            dir.display()
        );
        eprintln!("skipping: no tokenizer-xtok (scripts/make_models.py --trained)");
        return None;
    }
    let target = Arc::new(ModelTokenizer::load(&t).expect("target tokenizer"));
    let draft = ModelTokenizer::load(&d).expect("draft tokenizer");
    Some((target.clone(), Translator::new(target, draft, None)))
}

const CODE: &str = "def parse_args(argv):\n    \"\"\"Parse the command line.\"\"\"\n    \
                    parser = argparse.ArgumentParser(prog='x')\n    parser.add_argument('-n', \
                    type=int, default=12345)\n    return parser.parse_args(argv)  # naïve ✓\n";

fn ids(tok: &ModelTokenizer, text: &str) -> Vec<u32> {
    tok.tokenizer
        .encode(text, false)
        .expect("encode")
        .get_ids()
        .to_vec()
}

fn req(context: &[u32], max_k: usize) -> DraftRequest {
    DraftRequest {
        stream: 1,
        context: context.to_vec().into(),
        prompt_len: 1,
        max_k,
    }
}

fn draft_text(tr: &Translator, ids: &[u32]) -> Vec<u8> {
    ids.iter()
        .flat_map(|&i| tr.draft_bytes.bytes(i).to_vec())
        .collect()
}

#[test]
fn the_vocabularies_differ_and_token_bytes_spell_the_text() {
    let Some((target, tr)) = pair() else { return };
    assert_ne!(
        target.vocab_size, tr.draft.vocab_size,
        "tokenizer-xtok has another size"
    );
    let t = ids(&target, CODE);
    let d = ids(&tr.draft, CODE);
    assert_ne!(t.len(), d.len(), "and other merges");
    let tb: Vec<u8> = t
        .iter()
        .flat_map(|&i| tr.target_bytes.bytes(i).to_vec())
        .collect();
    assert_eq!(tb, CODE.as_bytes());
    assert_eq!(draft_text(&tr, &d), CODE.as_bytes());
}

/// Growing the context token by token keeps the draft context a translation of the same
/// bytes, and each step re-encodes only a short tail (the KV cache keeps the rest).
#[test]
fn the_draft_context_follows_the_target_context_incrementally() {
    let Some((target, tr)) = pair() else { return };
    let t = ids(&target, CODE);
    let mut prev: Vec<u32> = Vec::new();
    let mut reencoded = 0usize;
    for n in 1..=t.len() {
        let (d, _) = tr.to_draft(&req(&t[..n], 4));
        let text: Vec<u8> = t[..n]
            .iter()
            .flat_map(|&i| tr.target_bytes.bytes(i).to_vec())
            .collect();
        let got = draft_text(&tr, &d.context);
        // Only an incomplete character at the end may be held back.
        assert!(
            text.starts_with(&got) && text.len() - got.len() < 4,
            "step {n}: {:?} vs {:?}",
            String::from_utf8_lossy(&text),
            String::from_utf8_lossy(&got)
        );
        let common = prev
            .iter()
            .zip(d.context.iter())
            .take_while(|(a, b)| a == b)
            .count();
        reencoded += d.context.len() - common;
        prev = d.context.to_vec();
    }
    // A full re-encode per step would be ~len²/2 tokens.
    assert!(
        reencoded < 6 * prev.len(),
        "{reencoded} re-encoded for {} tokens",
        prev.len()
    );
    // A rejected draft (a shorter context) rolls back, then grows again.
    let (d, _) = tr.to_draft(&req(&t[..t.len() / 2], 4));
    let half: Vec<u8> = t[..t.len() / 2]
        .iter()
        .flat_map(|&i| tr.target_bytes.bytes(i).to_vec())
        .collect();
    assert!(half.starts_with(&draft_text(&tr, &d.context)));
    let (d, _) = tr.to_draft(&req(&t, 4));
    assert_eq!(draft_text(&tr, &d.context), CODE.as_bytes());
}

/// A draft that drafts the true continuation yields the target's own tokens for it, the
/// last (possibly partial) one dropped and at most max_k.
#[test]
fn a_right_draft_translates_to_the_targets_tokens() {
    let Some((target, tr)) = pair() else { return };
    let t = ids(&target, CODE);
    let mut exact = 0;
    let mut total = 0;
    for cut in (4..t.len() - 12).step_by(3) {
        let (dreq, plan) = tr.to_draft(&req(&t[..cut], 6));
        assert!(dreq.max_k >= 1);
        let prefix: Vec<u8> = t[..cut]
            .iter()
            .flat_map(|&i| tr.target_bytes.bytes(i).to_vec())
            .collect();
        let rest = String::from_utf8_lossy(&CODE.as_bytes()[prefix.len()..]).into_owned();
        let drafted: Vec<u32> = ids(&tr.draft, &rest).into_iter().take(dreq.max_k).collect();
        let p = tr.to_target(
            plan,
            Proposal {
                confidence: vec![0.9; drafted.len()],
                tokens: drafted,
            },
        );
        assert!(p.tokens.len() <= 6);
        assert_eq!(p.tokens.len(), p.confidence.len());
        assert!(p.confidence.iter().all(|c| (0.0..=1.0).contains(c)));
        let want = &t[cut..cut + p.tokens.len()];
        total += 1;
        exact += usize::from(p.tokens == want && !p.tokens.is_empty());
    }
    assert!(
        exact * 10 >= total * 8,
        "{exact} of {total} proposals exact"
    );
}

/// Chat: the rendered prompt's control tokens are the draft's control tokens.
#[test]
fn chat_control_tokens_map_to_the_drafts_own() {
    let Some((target, tr)) = pair() else { return };
    let text = "<|begin_of_text|><|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n";
    let t = ids(&target, text);
    let (d, _) = tr.to_draft(&req(&t, 4));
    let start = tr
        .draft
        .token_id("<|im_start|>")
        .expect("draft has <|im_start|>");
    assert_eq!(
        d.context.first(),
        tr.draft.token_id("<|begin_of_text|>").as_ref()
    );
    assert_eq!(d.context.iter().filter(|&&i| i == start).count(), 2);
    // A drafted end of turn is a firm end: kept, as the target's own control token.
    let end = tr
        .draft
        .token_id("<|im_end|>")
        .expect("draft has <|im_end|>");
    let (_, plan) = tr.to_draft(&req(&t, 4));
    let mut drafted = ids(&tr.draft, "Hello");
    drafted.push(end);
    let p = tr.to_target(
        plan,
        Proposal {
            confidence: vec![1.0; drafted.len()],
            tokens: drafted,
        },
    );
    assert_eq!(p.tokens.last(), target.token_id("<|im_end|>").as_ref());
}

#[test]
fn incomplete_utf8_is_held_back() {
    assert_eq!(valid_utf8_len("ab✓".as_bytes()), 5);
    assert_eq!(valid_utf8_len(&"ab✓".as_bytes()[..4]), 2);
    assert_eq!(valid_utf8_len(b""), 0);
}
