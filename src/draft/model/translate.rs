//! Drafting with a model whose vocabulary is not the target's: the draft keeps each
//! stream's context in its own tokens, and its proposals reach the verify as target
//! tokens, both through the bytes the tokens stand for.
//!
//! Target context → draft context: the target tokens' bytes are appended incrementally;
//! only the draft tokens over a changed or newly appended tail are re-encoded, so the
//! draft's token context (and with it its KV cache) stays a stable prefix from round to
//! round. Chat prompts need no mapping of their own: the target's rendered prompt,
//! control tokens included, is text the draft tokenizer reads as its own control tokens
//! where it has the same ones.
//!
//! Draft proposal → target tokens: the drafted bytes are re-encoded together with the
//! context's last target token (BPE may merge across that boundary), and a trailing
//! token that more text could still extend is dropped. The verify decides every token,
//! so a translation that is off only costs acceptance, never exactness.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokenizers::{DecoderWrapper, Tokenizer};

use crate::draft::{DraftRequest, Proposal, StreamId};
use crate::metrics::labels::TranslationStep;
use crate::tokens::ModelTokenizer;

/// Draft tokens re-encoded before the first changed byte: merges and pre-tokens of the
/// tail may extend back over them.
const REENCODE_MARGIN: usize = 3;

/// The bytes each token id stands for.
pub struct TokenBytes {
    table: Vec<Vec<u8>>,
    /// Added (control) tokens: their boundaries never move.
    special: Vec<bool>,
}

impl TokenBytes {
    pub fn new(tok: &Tokenizer) -> Self {
        let n = tok.get_vocab_size(true);
        let byte_level = is_byte_level(tok.get_decoder());
        let unbyte: HashMap<char, u8> = byte_chars().into_iter().map(|(b, c)| (c, b)).collect();
        let added = tok.get_added_tokens_decoder();
        let mut table = vec![Vec::new(); n];
        let mut special = vec![false; n];
        for (id, slot) in table.iter_mut().enumerate() {
            let id32 = id as u32;
            if let Some(a) = added.get(&id32) {
                *slot = a.content.as_bytes().to_vec();
                special[id] = true;
                continue;
            }
            let Some(s) = tok.id_to_token(id32) else {
                continue;
            };
            *slot = if byte_level {
                s.chars()
                    .flat_map(|c| match unbyte.get(&c) {
                        Some(&b) => vec![b],
                        None => c.to_string().into_bytes(),
                    })
                    .collect()
            } else {
                piece_bytes(&s)
            };
        }
        TokenBytes { table, special }
    }

    pub fn bytes(&self, id: u32) -> &[u8] {
        self.table.get(id as usize).map_or(&[], Vec::as_slice)
    }

    pub fn is_special(&self, id: u32) -> bool {
        self.special.get(id as usize).copied().unwrap_or(false)
    }
}

fn is_byte_level(d: Option<&DecoderWrapper>) -> bool {
    match d {
        Some(DecoderWrapper::ByteLevel(_)) => true,
        Some(DecoderWrapper::Sequence(s)) => {
            s.get_decoders().iter().any(|d| is_byte_level(Some(d)))
        }
        _ => false,
    }
}

/// A SentencePiece-style piece: `▁` is a space, `<0xNN>` one byte.
fn piece_bytes(s: &str) -> Vec<u8> {
    if let Some(hex) = s.strip_prefix("<0x").and_then(|h| h.strip_suffix('>')) {
        if let Ok(b) = u8::from_str_radix(hex, 16) {
            return vec![b];
        }
    }
    s.replace('\u{2581}', " ").into_bytes()
}

/// GPT-2's byte-level alphabet (byte → printable character).
fn byte_chars() -> Vec<(u8, char)> {
    let printable = |b: u8| matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 256u32;
    (0..=255u8)
        .map(|b| {
            if printable(b) {
                (b, char::from(b))
            } else {
                let c = char::from_u32(next).unwrap_or('\u{FFFD}');
                next += 1;
                (b, c)
            }
        })
        .collect()
}

/// One stream's context in both vocabularies.
#[derive(Default)]
struct StreamText {
    target: Vec<u32>,
    /// Byte end of each target token in `bytes`.
    target_ends: Vec<usize>,
    bytes: Vec<u8>,
    draft: Vec<u32>,
    /// Byte end of each draft token in `bytes`.
    draft_ends: Vec<usize>,
}

/// What the way back needs from the way in.
pub struct Plan {
    /// Bytes of the context's last target token (empty for an empty context).
    last_bytes: Vec<u8>,
    last_token: Option<u32>,
    /// The context's bytes after the draft context's end (a character whose last bytes
    /// have not come yet): the drafted text must start with them.
    tail: Vec<u8>,
    max_k: usize,
}

pub struct Translator {
    target: Arc<ModelTokenizer>,
    target_bytes: TokenBytes,
    draft: ModelTokenizer,
    draft_bytes: TokenBytes,
    streams: Mutex<HashMap<StreamId, StreamText>>,
    timing: Option<prometheus::HistogramVec>,
}

impl Translator {
    pub fn new(
        target: Arc<ModelTokenizer>,
        draft: ModelTokenizer,
        timing: Option<prometheus::HistogramVec>,
    ) -> Self {
        Translator {
            target_bytes: TokenBytes::new(&target.tokenizer),
            draft_bytes: TokenBytes::new(&draft.tokenizer),
            target,
            draft,
            streams: Mutex::new(HashMap::new()),
            timing,
        }
    }

    /// The draft-vocabulary request for a target-vocabulary one, the stream's draft
    /// context brought up to date on the way.
    pub fn to_draft(&self, req: &DraftRequest) -> (DraftRequest, Plan) {
        let started = Instant::now();
        let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        let st = streams.entry(req.stream).or_default();
        self.sync(st, &req.context);
        let n = st.target.len();
        let last_start = n.checked_sub(2).map_or(0, |i| st.target_ends[i]);
        // The draft continues from its whole context. (Redrafting its last token, so that
        // a boundary the target's tokenizer drew inside one draft token is redrawn,
        // accepted fewer tokens on the project's pair.)
        let d = st.draft.len();
        let cut = st.draft_ends.last().copied().unwrap_or(0);
        let plan = Plan {
            last_bytes: st.bytes[last_start..].to_vec(),
            last_token: st.target.last().copied(),
            tail: st.bytes[cut..].to_vec(),
            max_k: req.max_k,
        };
        // Enough draft tokens for max_k target tokens and one more, which is dropped as
        // possibly partial: the ratio of the two tokenizations of this context.
        let ratio = (d.max(1) as f64 / n.max(1) as f64).clamp(0.25, 4.0);
        let want = ((req.max_k + 1) as f64 * ratio).ceil() as usize;
        let max_k = if req.max_k == 0 {
            0
        } else {
            want.clamp(1, 2 * req.max_k + 2)
        };
        let dreq = DraftRequest {
            stream: req.stream,
            prompt_len: d.min(req.prompt_len),
            context: Arc::new(st.draft.clone()),
            max_k,
        };
        drop(streams);
        self.observe(TranslationStep::Context, started);
        (dreq, plan)
    }

    /// Bring `st` to `context` (draft tokens cover its bytes up to an incomplete
    /// character at the end).
    fn sync(&self, st: &mut StreamText, context: &[u32]) {
        let p = st
            .target
            .iter()
            .zip(context)
            .take_while(|(a, b)| a == b)
            .count();
        let old_bytes_len = st.bytes.len();
        let keep = p.checked_sub(1).map_or(0, |i| st.target_ends[i]);
        let mut tail = Vec::new();
        let mut ends = Vec::with_capacity(context.len() - p);
        let mut end = keep;
        for &id in &context[p..] {
            let b = self.target_bytes.bytes(id);
            tail.extend_from_slice(b);
            end += b.len();
            ends.push(end);
        }
        // The first byte that differs from what the draft tokens were made of.
        let same = st.bytes[keep..]
            .iter()
            .zip(&tail)
            .take_while(|(a, b)| a == b)
            .count();
        let changed = keep + same;
        st.target.truncate(p);
        st.target.extend_from_slice(&context[p..]);
        st.target_ends.truncate(p);
        st.target_ends.extend(ends);
        st.bytes.truncate(keep);
        st.bytes.extend_from_slice(&tail);
        let unchanged = changed.min(old_bytes_len);
        let kept = st.draft_ends.partition_point(|&e| e <= unchanged);
        let kept = kept.saturating_sub(REENCODE_MARGIN);
        st.draft.truncate(kept);
        st.draft_ends.truncate(kept);
        // Byte-level tokens may split a character: re-encode from a character's start.
        while let Some(&e) = st.draft_ends.last() {
            if st.bytes.get(e).is_some_and(|b| b & 0xC0 == 0x80) {
                st.draft.pop();
                st.draft_ends.pop();
            } else {
                break;
            }
        }
        let from = st.draft_ends.last().copied().unwrap_or(0);
        let valid = valid_utf8_len(&st.bytes[from..]);
        let text = String::from_utf8_lossy(&st.bytes[from..from + valid]);
        if let Ok(enc) = self.draft.tokenizer.encode_fast(text.as_ref(), false) {
            let mut end = from;
            for &id in enc.get_ids() {
                // Clamped: a tokenizer that normalizes text spells other bytes than it read.
                end = (end + self.draft_bytes.bytes(id).len()).min(from + valid);
                st.draft.push(id);
                st.draft_ends.push(end);
            }
        }
    }

    /// The target tokens of a draft proposal.
    pub fn to_target(&self, plan: Plan, p: Proposal) -> Proposal {
        let started = Instant::now();
        let out = self.translate_back(&plan, &p);
        self.observe(TranslationStep::Proposal, started);
        out
    }

    fn translate_back(&self, plan: &Plan, p: &Proposal) -> Proposal {
        if p.tokens.is_empty() || plan.max_k == 0 {
            return Proposal::default();
        }
        // Drafted bytes, and the draft's joint confidence once each token is drafted.
        let mut drafted = Vec::new();
        let mut ends = Vec::with_capacity(p.tokens.len());
        let mut joint = Vec::with_capacity(p.tokens.len());
        let mut j = 1.0f32;
        for (&id, &c) in p.tokens.iter().zip(&p.confidence) {
            drafted.extend_from_slice(self.draft_bytes.bytes(id));
            ends.push(drafted.len());
            j *= c;
            joint.push(j);
        }
        if joint.is_empty() {
            return Proposal::default();
        }
        // The held-back bytes must be the context's own; what follows them is the proposal.
        let Some(new) = drafted.strip_prefix(plan.tail.as_slice()) else {
            return Proposal::default();
        };
        let base = plan.tail.len();
        let firm_end = p
            .tokens
            .last()
            .is_some_and(|&t| self.draft_bytes.is_special(t));
        let (ids, mut skip) = self.encode_after(plan, new);
        let mut tokens = Vec::new();
        let mut confidence = Vec::new();
        let mut end = base;
        let mut prev = match ends.iter().position(|&e| e >= base) {
            Some(i) if ends[i] == base => joint[i],
            Some(0) | None => 1.0,
            Some(i) => joint[i - 1],
        };
        for id in ids {
            let len = self.target_bytes.bytes(id).len();
            if skip > 0 {
                skip = skip.saturating_sub(len);
                continue;
            }
            end += len;
            // Each target token's confidence: the draft's, given the tokens before.
            let i = ends.partition_point(|&e| e < end).min(joint.len() - 1);
            let c = if prev > 0.0 { joint[i] / prev } else { 0.0 };
            prev = joint[i];
            tokens.push(id);
            confidence.push(c.clamp(0.0, 1.0));
        }
        // A last token that ends where the draft stopped may be the start of a longer one.
        if tokens.len() <= plan.max_k && end >= drafted.len() && !firm_end {
            tokens.pop();
            confidence.pop();
        }
        tokens.truncate(plan.max_k);
        confidence.truncate(plan.max_k);
        Proposal { tokens, confidence }
    }

    /// Target ids for the drafted bytes, and how many leading bytes of what they encode
    /// belong to the context: the last context token and the drafted text are encoded
    /// together, so that the tokens are those the target would make of the whole text.
    fn encode_after(&self, plan: &Plan, drafted: &[u8]) -> (Vec<u32>, usize) {
        let tok = &self.target.tokenizer;
        if let Some(last) = plan.last_token {
            if !self.target_bytes.is_special(last) && !plan.last_bytes.is_empty() {
                let mut w = plan.last_bytes.clone();
                w.extend_from_slice(drafted);
                let ids = encode_valid(tok, &w);
                if ids.first() == Some(&last) {
                    return (ids, plan.last_bytes.len());
                }
            }
        }
        // The last token would merge with the drafted text (the target never re-splits
        // its past): the drafted text alone is the best guess of what follows.
        (encode_valid(tok, drafted), 0)
    }

    /// The stream ended.
    pub fn finish(&self, stream: StreamId) {
        let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        streams.remove(&stream);
    }

    fn observe(&self, step: TranslationStep, since: Instant) {
        if let Some(h) = &self.timing {
            h.with_label_values(&[step.as_str()])
                .observe(since.elapsed().as_secs_f64());
        }
    }
}

/// Target ids of the longest valid UTF-8 prefix of `bytes`.
fn encode_valid(tok: &Tokenizer, bytes: &[u8]) -> Vec<u32> {
    let n = valid_utf8_len(bytes);
    let text = String::from_utf8_lossy(&bytes[..n]);
    tok.encode_fast(text.as_ref(), false)
        .map(|e| e.get_ids().to_vec())
        .unwrap_or_default()
}

/// Length of the longest prefix of `b` that is valid UTF-8 up to an incomplete
/// character at its end (invalid bytes inside stay, as replacement characters).
fn valid_utf8_len(b: &[u8]) -> usize {
    match std::str::from_utf8(b) {
        Ok(_) => b.len(),
        Err(e) if e.error_len().is_none() => e.valid_up_to(),
        Err(_) => b.len(),
    }
}

#[cfg(test)]
#[path = "translate_tests.rs"]
mod tests;
