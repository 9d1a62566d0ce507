//! Does the draft model speak the target's token ids? Only when its id→token table is
//! the target's, entry for entry; otherwise it drafts through text (`translate`).

use std::collections::HashMap;
use std::path::Path;

/// How the `model` drafter speaks to the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VocabMode {
    /// Same id→token table: draft ids are target ids.
    Same,
    /// Another vocabulary: contexts and proposals are translated through text.
    Translated,
}

/// Compare the draft model's tokenizer (tokenizer.json or the tiktoken format, in
/// `draft_dir`) with the target's.
pub fn check_tokenizer_compat(
    draft_dir: &Path,
    target: &tokenizers::Tokenizer,
) -> Result<(), String> {
    let draft = crate::tokens::ModelTokenizer::load(draft_dir).map_err(|e| {
        format!(
            "cannot read the draft model's tokenizer in {}: {e}",
            draft_dir.display()
        )
    })?;
    compare_vocab(&draft.tokenizer.get_vocab(true), &target.get_vocab(true))
}

/// Check that two token→id tables describe the same id→token mapping.
pub fn compare_vocab(
    draft: &HashMap<String, u32>,
    target: &HashMap<String, u32>,
) -> Result<(), String> {
    fn by_id(m: &HashMap<String, u32>) -> Vec<(u32, &str)> {
        let mut v: Vec<(u32, &str)> = m.iter().map(|(t, &i)| (i, t.as_str())).collect();
        v.sort_unstable();
        v
    }
    let (d, t) = (by_id(draft), by_id(target));
    let d_map: HashMap<u32, &str> = d.iter().copied().collect();
    let t_map: HashMap<u32, &str> = t.iter().copied().collect();
    let mut diffs = Vec::new();
    let mut count = 0usize;
    for &(id, tok) in &t {
        match d_map.get(&id) {
            Some(&dt) if dt == tok => {}
            other => {
                count += 1;
                if diffs.len() < 5 {
                    diffs.push(format!(
                        "id {id}: target {tok:?}, draft {:?}",
                        other.copied()
                    ));
                }
            }
        }
    }
    for &(id, tok) in &d {
        if !t_map.contains_key(&id) {
            count += 1;
            if diffs.len() < 5 {
                diffs.push(format!("id {id}: target none, draft {tok:?}"));
            }
        }
    }
    if count == 0 {
        return Ok(());
    }
    Err(format!(
        "the draft model's vocabulary differs from the target's ({} vs {} tokens, {count} \
         ids differ; first: {})",
        d.len(),
        t.len(),
        diffs.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(v: &[(&str, u32)]) -> HashMap<String, u32> {
        v.iter().map(|(t, i)| (t.to_string(), *i)).collect()
    }

    #[test]
    fn same_tables_pass_and_any_difference_fails() {
        let a = table(&[("a", 0), ("b", 1), ("<eos>", 2)]);
        assert!(compare_vocab(&a, &a.clone()).is_ok());
        let swapped = table(&[("a", 1), ("b", 0), ("<eos>", 2)]);
        let e = compare_vocab(&swapped, &a).unwrap_err();
        assert!(e.contains("2 ids differ"), "{e}");
        let extra = table(&[("a", 0), ("b", 1), ("<eos>", 2), ("<pad>", 3)]);
        let e = compare_vocab(&extra, &a).unwrap_err();
        assert!(e.contains("4 vs 3 tokens"), "{e}");
        assert!(compare_vocab(&a, &extra).is_err());
    }
}
