//! Tokenizers shipped in the tiktoken format, as Kimi-K2 ships its own: `tiktoken.model`
//! (one `base64(token bytes) rank` per line), a remote-code tokenizer class named in
//! tokenizer_config.json's `auto_map`, special tokens in its `added_tokens_decoder`, and no
//! tokenizer.json.
//!
//! The result is an ordinary `tokenizers::Tokenizer`, so detokenization and stop strings
//! work unchanged: a byte-level BPE whose vocabulary is the ranks and whose merges are
//! derived from them (each token's merge is the last step of tiktoken's own BPE on that
//! token's bytes, with only lower ranks allowed), a Split pre-tokenizer on the class's
//! regex, and `ignore_merges`, because tiktoken takes a piece found whole in the ranks
//! as one token before merging anything. Added tokens are the `added_tokens_decoder`
//! entries (special, i.e. skipped by `skip_special_tokens`, as transformers decides: the
//! named and listed special tokens); the `num_reserved_special_tokens` ids after the
//! highest rank that it does not name are `<|reserved_token_{id}|>`, as Kimi's class fills
//! them (plain text to the class). The pattern and the
//! reserved count are read from the class's source when it defines them as literals;
//! otherwise Kimi-K2's are used. The start-up check against the upstream catches a class
//! that tokenizes differently.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde_json::Value;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

mod pysource;

/// The file holding the ranks.
pub const RANKS_FILE: &str = "tiktoken.model";

/// Kimi-K2's pre-tokenizer pattern (`TikTokenTokenizer.pat_str` in its
/// tokenization_kimi.py): Han runs, words with their case runs and English contractions,
/// numbers of up to three digits, punctuation runs, line breaks and other whitespace.
pub const KIMI_PATTERN: &str = concat!(
    r"[\p{Han}]+",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"|\s*[\r\n]+",
    r"|\s+(?!\S)",
    r"|\s+",
);

/// Kimi-K2's `num_reserved_special_tokens`.
pub const KIMI_RESERVED: u32 = 256;

#[derive(Debug, thiserror::Error)]
pub enum TiktokenError {
    #[error("cannot read {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("{0}, line {1}: {2}")]
    Ranks(PathBuf, usize, String),
    #[error("{0}: {1}")]
    Config(PathBuf, String),
    #[error("cannot build the tokenizer: {0}")]
    Build(String),
}

/// Whether `dir` holds a tokenizer in the tiktoken format.
pub fn is_tiktoken_dir(dir: &Path) -> bool {
    dir.join(RANKS_FILE).is_file()
}

/// How the tokenizer was put together, for the start-up log.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub pattern: String,
    pub reserved: u32,
    /// The class source the pattern came from; `None`: Kimi-K2's defaults.
    pub pattern_from: Option<PathBuf>,
}

/// Build the tokenizer of the model directory `dir`.
pub fn load(dir: &Path) -> Result<(Tokenizer, Settings), TiktokenError> {
    let ranks_path = dir.join(RANKS_FILE);
    let text = std::fs::read_to_string(&ranks_path)
        .map_err(|e| TiktokenError::Read(ranks_path.clone(), e))?;
    let ranks =
        parse_ranks(&text).map_err(|(line, why)| TiktokenError::Ranks(ranks_path, line, why))?;
    let cfg_path = dir.join("tokenizer_config.json");
    let config: Value = match std::fs::read(&cfg_path) {
        Ok(b) => serde_json::from_slice(&b)
            .map_err(|e| TiktokenError::Config(cfg_path.clone(), e.to_string()))?,
        Err(_) => Value::Null,
    };
    let settings = class_settings(dir, &config);
    let tok = build(&ranks, &config, &settings)?;
    Ok((tok, settings))
}

/// Token bytes and their rank, in file order.
pub type Ranks = Vec<(Vec<u8>, u32)>;

/// `(bytes, rank)` per line; blank lines are skipped. The error: line number and why.
pub fn parse_ranks(text: &str) -> Result<Ranks, (usize, String)> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let (tok, rank) = line
            .split_once(' ')
            .ok_or((n + 1, "expected `base64 rank`".to_string()))?;
        let bytes = b64.decode(tok).map_err(|e| (n + 1, e.to_string()))?;
        let rank = rank
            .trim()
            .parse::<u32>()
            .map_err(|e| (n + 1, format!("rank: {e}")))?;
        out.push((bytes, rank));
    }
    if out.is_empty() {
        return Err((0, "no ranks".into()));
    }
    // tiktoken refuses these too: one id per token and one token per id.
    let mut seen_bytes = std::collections::HashSet::new();
    let mut seen_ranks = std::collections::HashSet::new();
    for (n, (bytes, rank)) in out.iter().enumerate() {
        if !seen_bytes.insert(bytes.as_slice()) || !seen_ranks.insert(*rank) {
            return Err((n + 1, format!("token or rank {rank} given twice")));
        }
    }
    Ok(out)
}

/// Pattern and reserved count from the class `auto_map` names, else Kimi-K2's.
fn class_settings(dir: &Path, config: &Value) -> Settings {
    let source = config
        .pointer("/auto_map/AutoTokenizer")
        .and_then(|v| match v {
            Value::Array(a) => a.first().and_then(Value::as_str),
            other => other.as_str(),
        })
        // "module.Class", possibly "repo--module.Class" when the code lives elsewhere.
        .and_then(|s| s.rsplit("--").next()?.rsplit_once('.').map(|(m, _)| m))
        .map(|module| dir.join(format!("{}.py", module.replace('.', "/"))))
        .and_then(|p| Some((std::fs::read_to_string(&p).ok()?, p)));
    let mut s = Settings {
        pattern: KIMI_PATTERN.to_string(),
        reserved: KIMI_RESERVED,
        pattern_from: None,
    };
    if let Some((code, path)) = source {
        if let Some(p) = pysource::string_assignment(&code, "pat_str") {
            s.pattern = p;
            s.pattern_from = Some(path);
        }
        if let Some(n) = pysource::int_assignment(&code, "num_reserved_special_tokens") {
            s.reserved = n;
        }
    }
    s
}

/// GPT-2's byte-level alphabet: printable bytes stand for themselves, the others are
/// moved above U+00FF, so every token is a printable string.
pub fn byte_chars() -> [char; 256] {
    let mut table = ['\0'; 256];
    let printable = |b: u32| (0x21..0x7F).contains(&b) || (0xA1..0xAD).contains(&b) || b >= 0xAE;
    let mut extra = 0;
    for b in 0..256u32 {
        let c = if printable(b) {
            b
        } else {
            extra += 1;
            255 + extra
        };
        table[b as usize] = char::from_u32(c).unwrap_or('\u{FFFD}');
    }
    table
}

/// One special token of the vocabulary.
struct Special {
    id: u32,
    token: AddedToken,
}

/// The text of a token setting: `"<s>"` or `{"content": "<s>", ...}`.
fn token_text(v: &Value) -> Option<&str> {
    v.as_str()
        .or_else(|| v.get("content").and_then(Value::as_str))
}

/// The tokens a transformers tokenizer class treats as special (skipped when decoding with
/// `skip_special_tokens`): the named ones (`bos_token`, …) and the listed ones
/// (`additional_special_tokens`, or `extra_special_tokens` in transformers 5). `None` when
/// the config lists none: then `added_tokens_decoder`'s own `special` flags decide.
fn special_names(config: &Value) -> Option<std::collections::HashSet<&str>> {
    let list = ["additional_special_tokens", "extra_special_tokens"]
        .into_iter()
        .find_map(|k| config.get(k))?;
    let mut names: std::collections::HashSet<&str> = match list {
        Value::Array(a) => a.iter().filter_map(token_text).collect(),
        Value::Object(m) => m.values().filter_map(token_text).collect(),
        _ => Default::default(),
    };
    for k in [
        "bos_token",
        "eos_token",
        "unk_token",
        "pad_token",
        "sep_token",
        "cls_token",
        "mask_token",
    ] {
        names.extend(config.get(k).and_then(token_text));
    }
    Some(names)
}

fn specials(config: &Value, first_reserved: u32, reserved: u32) -> Vec<Special> {
    let mut out: Vec<Special> = Vec::new();
    let names = special_names(config);
    if let Some(m) = config
        .get("added_tokens_decoder")
        .and_then(Value::as_object)
    {
        for (id, t) in m {
            let (Ok(id), Some(content)) = (id.parse::<u32>(), token_text(t)) else {
                continue;
            };
            let flag = |k: &str, d: bool| t.get(k).and_then(Value::as_bool).unwrap_or(d);
            let special = names
                .as_ref()
                .map_or(flag("special", true), |n| n.contains(content));
            let token = AddedToken::from(content, special)
                .single_word(flag("single_word", false))
                .lstrip(flag("lstrip", false))
                .rstrip(flag("rstrip", false))
                .normalized(flag("normalized", false));
            out.push(Special { id, token });
        }
    }
    let named: std::collections::HashSet<u32> = out.iter().map(|s| s.id).collect();
    for id in first_reserved..first_reserved.saturating_add(reserved) {
        if !named.contains(&id) {
            // Only tiktoken knows these as special: the class decodes them as plain text.
            let token =
                AddedToken::from(format!("<|reserved_token_{id}|>"), false).normalized(false);
            out.push(Special { id, token });
        }
    }
    out.sort_by_key(|s| s.id);
    out
}

fn build(
    ranks: &[(Vec<u8>, u32)],
    config: &Value,
    settings: &Settings,
) -> Result<Tokenizer, TiktokenError> {
    let chars = byte_chars();
    let as_str = |b: &[u8]| b.iter().map(|&x| chars[x as usize]).collect::<String>();
    let by_bytes: HashMap<&[u8], u32> = ranks.iter().map(|(b, r)| (b.as_slice(), *r)).collect();
    let mut vocab: HashMap<String, u32> = ranks.iter().map(|(b, r)| (as_str(b), *r)).collect();
    let mut order: Vec<&(Vec<u8>, u32)> = ranks.iter().collect();
    order.sort_by_key(|(_, r)| *r);
    let mut merges = Vec::new();
    for (bytes, rank) in order {
        if let Some((l, r)) = last_merge(bytes, *rank, &by_bytes) {
            merges.push((as_str(l), as_str(r)));
        }
    }
    let max_rank = ranks.iter().map(|(_, r)| *r).max().unwrap_or(0);
    let specials = specials(config, max_rank.saturating_add(1), settings.reserved);
    let rank_ids: std::collections::HashSet<u32> = ranks.iter().map(|(_, r)| *r).collect();
    for s in &specials {
        if rank_ids.contains(&s.id) {
            return Err(TiktokenError::Build(format!(
                "special token {:?} has id {}, which is a rank",
                s.token.content, s.id
            )));
        }
        // In the model's vocabulary too, so the added token keeps its own id.
        if let Some(other) = vocab.insert(s.token.content.clone(), s.id) {
            return Err(TiktokenError::Build(format!(
                "special token {:?} (id {}) is also token {other}",
                s.token.content, s.id
            )));
        }
    }
    let vocab: tokenizers::models::bpe::Vocab = vocab.into_iter().collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(true)
        .build()
        .map_err(|e| TiktokenError::Build(e.to_string()))?;
    let split = Split::new(
        SplitPattern::Regex(settings.pattern.clone()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(|e| TiktokenError::Build(format!("pattern {:?}: {e}", settings.pattern)))?;
    let mut tok = Tokenizer::new(bpe);
    tok.with_pre_tokenizer(Some(Sequence::new(vec![
        split.into(),
        ByteLevel::new(false, false, false).into(),
    ])));
    tok.with_decoder(Some(ByteLevel::new(false, false, false)));
    let (special, plain): (Vec<_>, Vec<_>) = specials.into_iter().partition(|s| s.token.special);
    tok.add_special_tokens(special.into_iter().map(|s| s.token))
        .map_err(|e| TiktokenError::Build(e.to_string()))?;
    tok.add_tokens(plain.into_iter().map(|s| s.token))
        .map_err(|e| TiktokenError::Build(e.to_string()))?;
    if let Some(post) = special_processor(&tok, config)? {
        tok.with_post_processor(Some(post));
    }
    Ok(tok)
}

/// BOS before / EOS after a text prompt, as tokenizer_config.json asks: `add_bos_token`,
/// `add_eos_token`, or transformers 5's `special_tokens_pattern` (`bos`, `eos`, `bos_eos`).
/// A class that ignores these settings shows up in the start-up check.
fn special_processor(
    tok: &Tokenizer,
    config: &Value,
) -> Result<Option<TemplateProcessing>, TiktokenError> {
    let flag = |k: &str| config.get(k).and_then(Value::as_bool).unwrap_or(false);
    let pattern = config
        .get("special_tokens_pattern")
        .and_then(Value::as_str)
        .unwrap_or("");
    let token = |which: &str, wanted: bool| {
        let name = config.get(which).and_then(token_text)?;
        let id = tok.token_to_id(name)?;
        wanted.then(|| (name.to_string(), id))
    };
    let bos = token(
        "bos_token",
        flag("add_bos_token") || matches!(pattern, "bos" | "bos_eos"),
    );
    let eos = token(
        "eos_token",
        flag("add_eos_token") || matches!(pattern, "eos" | "bos_eos"),
    );
    if bos.is_none() && eos.is_none() {
        return Ok(None);
    }
    let seq = |s: &str| {
        let pre = bos
            .as_ref()
            .map(|b| format!("{} ", b.0))
            .unwrap_or_default();
        let post = eos
            .as_ref()
            .map(|e| format!(" {}", e.0))
            .unwrap_or_default();
        format!("{pre}{s}{post}")
    };
    TemplateProcessing::builder()
        .try_single(seq("$A"))
        .and_then(|b| b.try_pair(format!("{} {}", seq("$A"), seq("$B"))))
        .map_err(|e| TiktokenError::Build(e.to_string()))?
        .special_tokens(bos.into_iter().chain(eos).collect::<Vec<_>>())
        .build()
        .map(Some)
        .map_err(|e| TiktokenError::Build(e.to_string()))
}

/// The two parts tiktoken's BPE joins last when it encodes `token`'s own bytes with only
/// ranks below `rank`; `None` for a single byte or a token BPE does not reach that way.
/// Like tiktoken's: the lowest-ranked adjacent pair merges first (the leftmost on a tie),
/// and only the two pairs next to a merge are looked up again.
fn last_merge<'a>(
    token: &'a [u8],
    rank: u32,
    ranks: &HashMap<&[u8], u32>,
) -> Option<(&'a [u8], &'a [u8])> {
    if token.len() < 2 {
        return None;
    }
    // Part boundaries: part i is token[bounds[i]..bounds[i + 1]].
    let mut bounds: Vec<usize> = (0..=token.len()).collect();
    let pair = |bounds: &[usize], i: usize| -> u32 {
        match ranks.get(&token[bounds[i]..bounds[i + 2]]) {
            Some(&r) if r < rank => r,
            _ => u32::MAX,
        }
    };
    let mut pairs: Vec<u32> = (0..token.len() - 1).map(|i| pair(&bounds, i)).collect();
    loop {
        let mut best = (u32::MAX, 0);
        for (i, &r) in pairs.iter().enumerate() {
            if r < best.0 {
                best = (r, i);
            }
        }
        let (r, i) = best;
        if r == u32::MAX {
            break;
        }
        bounds.remove(i + 1);
        pairs.remove(i);
        if i < pairs.len() {
            pairs[i] = pair(&bounds, i);
        }
        if i > 0 {
            pairs[i - 1] = pair(&bounds, i - 1);
        }
    }
    (bounds.len() == 3).then(|| (&token[..bounds[1]], &token[bounds[1]..]))
}

#[cfg(test)]
mod tests;
