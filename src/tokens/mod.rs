//! Token-level text handling: the model's tokenizer, incremental detokenization of the
//! generated ids (equal to the upstream's own text for the same ids), and stop strings.

pub mod byte_level;
pub mod locate;
pub mod tiktoken;

use std::path::{Path, PathBuf};

use serde_json::Value;
use tokenizers::Tokenizer;

use byte_level::{ByteStream, ByteTable};

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("no tokenizer.json (nor tiktoken.model) at {0}")]
    Missing(PathBuf),
    #[error("cannot load tokenizer {0}: {1}")]
    Load(PathBuf, String),
    #[error(transparent)]
    Tiktoken(#[from] tiktoken::TiktokenError),
}

/// The upstream model's tokenizer plus the ids that end generation, split the way vLLM
/// splits them: the tokenizer's EOS, and further `generation_config` EOS ids, which act as
/// stop token ids (so they are reported as `stop_reason`).
pub struct ModelTokenizer {
    pub tokenizer: Tokenizer,
    pub eos_id: Option<u32>,
    pub extra_eos_ids: Vec<u32>,
    pub vocab_size: usize,
    pub path: PathBuf,
    /// `clean_up_tokenization_spaces` of tokenizer_config.json: a whole-text decode on the
    /// server side (its `/detokenize`) then differs from the streamed text by design.
    pub clean_up_spaces: bool,
    /// The upstream decodes with a Python tokenizer class (the tiktoken format). vLLM's
    /// streamed text then puts a space between an added token it keeps and its neighbours
    /// (`spaces_between_special_tokens`), which specd does not reproduce: requests that
    /// keep special tokens pass through.
    pub spaced_specials: bool,
    /// The bytes of every token, for a ByteLevel tokenizer (detokenized by table).
    pub bytes: Option<ByteTable>,
}

impl ModelTokenizer {
    /// Load from a `tokenizer.json` file or a model directory holding one, else from the
    /// directory's tiktoken files (`tokenizer.json` absent, as Kimi-K2 ships); EOS ids come
    /// from `generation_config.json` / `config.json` / `tokenizer_config.json` beside it.
    pub fn load(path: &Path) -> Result<Self, TokenError> {
        let (mut file, dir) = if path.is_dir() {
            (path.join("tokenizer.json"), path.to_path_buf())
        } else {
            (
                path.to_path_buf(),
                path.parent().map(Path::to_path_buf).unwrap_or_default(),
            )
        };
        let tiktoken_file = file.file_name() == Some(tiktoken::RANKS_FILE.as_ref());
        let mut spaced_specials = false;
        let tokenizer = if file.is_file() && !tiktoken_file {
            Tokenizer::from_file(&file)
                .map_err(|e| TokenError::Load(file.clone(), e.to_string()))?
        } else if tiktoken::is_tiktoken_dir(&dir) {
            let (tok, settings) = tiktoken::load(&dir)?;
            file = dir.join(tiktoken::RANKS_FILE);
            spaced_specials = true;
            tracing::info!(
                path = %file.display(),
                pattern_from = %settings.pattern_from.as_deref().map_or("Kimi-K2's default".into(), |p| p.display().to_string()),
                reserved = settings.reserved,
                "tokenizer in the tiktoken format"
            );
            tok
        } else {
            return Err(TokenError::Missing(file));
        };
        let config = read_json(&dir.join("tokenizer_config.json"));
        let clean_up_spaces = config
            .as_ref()
            .and_then(|v| v.get("clean_up_tokenization_spaces")?.as_bool())
            .unwrap_or(false);
        let mut eos_id = config
            .and_then(|v| {
                let e = v.get("eos_token")?;
                e.as_str()
                    .map(str::to_string)
                    .or_else(|| e.get("content").and_then(Value::as_str).map(str::to_string))
            })
            .and_then(|t| tokenizer.token_to_id(&t));
        let mut gen_ids = Vec::new();
        collect_ids(
            read_json(&dir.join("generation_config.json"))
                .as_ref()
                .and_then(|v| v.get("eos_token_id")),
            &mut gen_ids,
        );
        if eos_id.is_none() {
            let mut cfg = Vec::new();
            collect_ids(
                read_json(&dir.join("config.json"))
                    .as_ref()
                    .and_then(|v| v.get("eos_token_id")),
                &mut cfg,
            );
            eos_id = cfg.first().copied().or_else(|| gen_ids.first().copied());
        }
        let extra_eos_ids = gen_ids.into_iter().filter(|&i| Some(i) != eos_id).collect();
        let vocab_size = tokenizer.get_vocab_size(true);
        Ok(ModelTokenizer {
            bytes: ByteTable::of(&tokenizer),
            tokenizer,
            eos_id,
            extra_eos_ids,
            vocab_size,
            path: file,
            clean_up_spaces,
            spaced_specials,
        })
    }

    /// A tokenizer with no EOS ids or configuration beside it (tests, tools).
    pub fn from_tokenizer(tokenizer: Tokenizer) -> Self {
        ModelTokenizer {
            vocab_size: tokenizer.get_vocab_size(true),
            bytes: ByteTable::of(&tokenizer),
            tokenizer,
            eos_id: None,
            extra_eos_ids: Vec::new(),
            path: PathBuf::new(),
            clean_up_spaces: false,
            spaced_specials: false,
        }
    }

    /// The text of `ids` with special tokens kept (Python's `tokenizer.decode(ids)`).
    pub fn decode(&self, ids: &[u32]) -> String {
        self.tokenizer.decode(ids, false).unwrap_or_default()
    }

    /// The special tokens of the vocabulary (the added tokens marked special, as
    /// transformers' `all_special_tokens` lists them), text and id.
    pub fn special_tokens(&self) -> Vec<(String, u32)> {
        let mut out: Vec<(String, u32)> = self
            .tokenizer
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, t)| (t.content, id))
            .collect();
        out.sort_by_key(|&(_, id)| id);
        out
    }

    /// The id of a token of the vocabulary (added tokens included).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.tokenizer.token_to_id(token)
    }

    /// Text of a single token, as vLLM shows it in logprobs.
    pub fn token_text(&self, id: u32) -> String {
        self.decode(&[id])
    }
}

fn read_json(p: &Path) -> Option<Value> {
    serde_json::from_slice(&std::fs::read(p).ok()?).ok()
}

fn collect_ids(v: Option<&Value>, out: &mut Vec<u32>) {
    match v {
        Some(Value::Number(n)) => {
            if let Some(x) = n.as_u64() {
                if !out.contains(&(x as u32)) {
                    out.push(x as u32);
                }
            }
        }
        Some(Value::Array(a)) => a.iter().for_each(|x| collect_ids(Some(x), out)),
        _ => {}
    }
}

/// Incremental detokenizer over the tokenizers crate's `DecodeStream` (or its replay over
/// a byte table, see `byte_level`), primed with a prompt suffix the way vLLM primes its
/// own, so the text of every generated token (leading spaces, multi-byte characters held
/// back until complete) matches the upstream's.
pub struct Detokenizer<'t> {
    stream: Stream<'t>,
    /// Tokens the tokenizer failed to decode (their text is missing from the output).
    errors: u64,
}

enum Stream<'t> {
    Tokenizer(
        tokenizers::DecodeStream<
            't,
            tokenizers::ModelWrapper,
            tokenizers::NormalizerWrapper,
            tokenizers::PreTokenizerWrapper,
            tokenizers::PostProcessorWrapper,
            tokenizers::DecoderWrapper,
        >,
    ),
    Bytes(ByteStream<'t>),
}

impl<'t> Detokenizer<'t> {
    /// For the model's tokenizer: by its byte table when it has one.
    pub fn for_model(model: &'t ModelTokenizer, skip_special: bool, prompt: &[u32]) -> Self {
        let stream = match &model.bytes {
            Some(t) => Stream::Bytes(ByteStream::new(t, skip_special)),
            None => Stream::Tokenizer(model.tokenizer.decode_stream(skip_special)),
        };
        Self::primed(stream, &model.tokenizer, prompt)
    }

    pub fn new(tok: &'t Tokenizer, skip_special: bool, prompt: &[u32]) -> Self {
        Self::primed(
            Stream::Tokenizer(tok.decode_stream(skip_special)),
            tok,
            prompt,
        )
    }

    fn primed(stream: Stream<'t>, tok: &Tokenizer, prompt: &[u32]) -> Self {
        let mut suffix = prompt;
        if prompt.len() > 4 {
            for i in 4..(prompt.len() + 1).min(24) {
                let cand = &prompt[prompt.len() - i..];
                if tok
                    .decode(cand, false)
                    .is_ok_and(|t| !t.contains('\u{FFFD}'))
                {
                    suffix = cand;
                    break;
                }
            }
        }
        let mut d = Detokenizer { stream, errors: 0 };
        for &id in suffix {
            let _ = d.next(id);
        }
        d
    }

    fn next(&mut self, id: u32) -> Result<Option<String>, String> {
        match &mut self.stream {
            Stream::Tokenizer(s) => s.step(id).map_err(|e| e.to_string()),
            Stream::Bytes(s) => s.step(id).map_err(|e| e.to_string()),
        }
    }

    /// Text added by `id` (possibly empty while a character is incomplete).
    /// A token that fails to decode adds no text; it is logged and counted (`errors`).
    pub fn step(&mut self, id: u32) -> String {
        match self.next(id) {
            Ok(t) => t.unwrap_or_default(),
            Err(e) => {
                self.errors += 1;
                tracing::warn!(token = id, error = %e, "token could not be decoded; its text is missing");
                String::new()
            }
        }
    }

    /// Tokens that failed to decode so far.
    pub fn errors(&self) -> u64 {
        self.errors
    }
}

/// Stop-string matcher over streamed text. Text is released only once it can no longer
/// be the start of a stop string.
pub struct StopMatcher {
    stops: Vec<String>,
    include_stop: bool,
    pending: String,
    hold: usize,
}

pub enum StopOutcome {
    /// Text safe to send now.
    Continue(String),
    /// A stop string matched: final text to send and the matched string.
    Stopped(String, String),
}

impl StopMatcher {
    pub fn new(stops: Vec<String>, include_stop: bool) -> Self {
        let stops: Vec<String> = stops.into_iter().filter(|s| !s.is_empty()).collect();
        let hold = stops
            .iter()
            .map(|s| s.len())
            .max()
            .unwrap_or(1)
            .saturating_sub(1);
        StopMatcher {
            stops,
            include_stop,
            pending: String::new(),
            hold,
        }
    }

    pub fn push(&mut self, text: &str) -> StopOutcome {
        let mut out = String::new();
        match self.push_into(text, &mut out) {
            Some(s) => StopOutcome::Stopped(out, s),
            None => StopOutcome::Continue(out),
        }
    }

    /// `push`, appending the text safe to send to `out`: `Some` with the matched stop
    /// string when one matched (`out` then ends where the output ends).
    pub fn push_into(&mut self, text: &str, out: &mut String) -> Option<String> {
        if self.stops.is_empty() {
            // Nothing is ever held back: no copy through `pending`.
            out.push_str(text);
            return None;
        }
        self.pending.push_str(text);
        // Earliest match wins, as the upstream scans the text in order.
        let mut best: Option<(usize, &String)> = None;
        for s in &self.stops {
            if let Some(i) = self.pending.find(s.as_str()) {
                if best.is_none_or(|(b, _)| i < b) {
                    best = Some((i, s));
                }
            }
        }
        if let Some((i, s)) = best {
            let end = if self.include_stop { i + s.len() } else { i };
            out.push_str(&self.pending[..end]);
            let s = s.clone();
            self.pending.clear();
            return Some(s);
        }
        let mut cut = self.pending.len().saturating_sub(self.hold);
        while !self.pending.is_char_boundary(cut) {
            cut -= 1;
        }
        out.push_str(&self.pending[..cut]);
        self.pending.drain(..cut);
        None
    }

    /// Text still held back, released when generation ends for another reason.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_string_split_across_pushes() {
        let mut m = StopMatcher::new(vec!["END".into()], false);
        let mut sent = String::new();
        for piece in ["hello E", "N", "D tail"] {
            match m.push(piece) {
                StopOutcome::Continue(t) => sent.push_str(&t),
                StopOutcome::Stopped(t, s) => {
                    sent.push_str(&t);
                    assert_eq!(s, "END");
                    assert_eq!(sent, "hello ");
                    return;
                }
            }
        }
        panic!("stop string not found");
    }

    #[test]
    fn include_stop_and_flush() {
        let mut m = StopMatcher::new(vec!["xy".into(), "y".into()], true);
        match m.push("abxyz") {
            StopOutcome::Stopped(t, s) => {
                assert_eq!(t, "abxy");
                assert_eq!(s, "xy");
            }
            StopOutcome::Continue(_) => panic!("should stop"),
        }
        let mut m = StopMatcher::new(vec!["long-stop".into()], false);
        let StopOutcome::Continue(t) = m.push("ab\u{e9}c") else {
            panic!()
        };
        assert_eq!(t, "");
        assert_eq!(m.flush(), "ab\u{e9}c");
    }
}
