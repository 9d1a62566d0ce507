//! Detokenizing for tokenizers whose decoder is ByteLevel alone (the GPT-2 scheme: Llama 3,
//! Qwen): each token stands for fixed bytes, so the text of ids is their bytes joined, read
//! as lossy UTF-8. A table of those bytes replays the steps of the tokenizers crate's
//! `DecodeStream` with the same outputs, without its work per token (two decodes through
//! the tokenizer, each building token strings and mapping every character through a hash
//! map), which was most of a relayed token's detokenizing cost.

use tokenizers::{DecoderWrapper, Tokenizer};

/// The bytes of every id of a ByteLevel tokenizer.
pub struct ByteTable {
    bytes: Vec<u8>,
    /// Per id: its bytes' start in `bytes` (the next entry is the end).
    starts: Vec<u32>,
    /// Per id: whether the tokenizer knows it, and whether it is a special token.
    kinds: Vec<Kind>,
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Unknown,
    Plain,
    Special,
}

impl ByteTable {
    /// The table of `tok`, when its decoding is ByteLevel alone (else `None`: its decoder
    /// does more than join bytes, and only the tokenizer itself decodes it right).
    pub fn of(tok: &Tokenizer) -> Option<Self> {
        if !matches!(tok.get_decoder(), Some(DecoderWrapper::ByteLevel(_))) {
            return None;
        }
        let ids = tok.get_vocab(true).into_values().max().map_or(0, |m| m + 1);
        let char_bytes = char_to_byte();
        let added = tok.get_added_vocabulary();
        let mut t = ByteTable {
            bytes: Vec::new(),
            starts: Vec::with_capacity(ids as usize + 1),
            kinds: Vec::with_capacity(ids as usize),
        };
        for id in 0..ids {
            t.starts.push(u32::try_from(t.bytes.len()).ok()?);
            let Some(token) = tok.id_to_token(id) else {
                t.kinds.push(Kind::Unknown);
                continue;
            };
            t.kinds.push(if added.is_special_token(&token) {
                Kind::Special
            } else {
                Kind::Plain
            });
            // As the ByteLevel decoder reads a token: every character through the byte
            // map, or, if one is not in it, the token's own UTF-8.
            let start = t.bytes.len();
            for c in token.chars() {
                match char_bytes(c) {
                    Some(b) => t.bytes.push(b),
                    None => {
                        t.bytes.truncate(start);
                        t.bytes.extend_from_slice(token.as_bytes());
                        break;
                    }
                }
            }
        }
        t.starts.push(u32::try_from(t.bytes.len()).ok()?);
        Some(t)
    }

    /// Append the bytes of `ids` to `out` as `Tokenizer::decode` joins them (ids it does
    /// not know, and special tokens when `skip_special`, are left out).
    fn join(&self, ids: &[u32], skip_special: bool, out: &mut Vec<u8>) {
        for &id in ids {
            let i = id as usize;
            match self.kinds.get(i) {
                Some(Kind::Plain) => {}
                Some(Kind::Special) if !skip_special => {}
                _ => continue,
            }
            let (s, e) = (self.starts[i] as usize, self.starts[i + 1] as usize);
            out.extend_from_slice(&self.bytes[s..e]);
        }
    }
}

/// GPT-2's byte-to-character map, inverted: the character each byte is written as.
fn char_to_byte() -> impl Fn(char) -> Option<u8> {
    let mut map = [None; 324];
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut n = 0u32;
    for b in 0..=255u8 {
        let c = if printable(b) {
            u32::from(b)
        } else {
            n += 1;
            255 + n
        };
        map[c as usize] = Some(b);
    }
    move |c: char| map.get(c as usize).copied().flatten()
}

/// The error `DecodeStream` gives when a decode does not extend the previous one.
#[derive(Debug, thiserror::Error)]
#[error("decoded text does not extend the previous text")]
pub struct InvalidPrefix;

/// `DecodeStream` over a byte table: the same state and steps, decoding by table lookups.
pub struct ByteStream<'t> {
    table: &'t ByteTable,
    skip_special: bool,
    ids: Vec<u32>,
    prefix: String,
    prefix_index: usize,
    /// Reused for every decode.
    scratch: Vec<u8>,
}

impl<'t> ByteStream<'t> {
    pub fn new(table: &'t ByteTable, skip_special: bool) -> Self {
        ByteStream {
            table,
            skip_special,
            ids: Vec::new(),
            prefix: String::new(),
            prefix_index: 0,
            scratch: Vec::new(),
        }
    }

    /// The text of the ids held, as `Tokenizer::decode` gives it.
    fn decode(&mut self) -> String {
        self.scratch.clear();
        self.table
            .join(&self.ids, self.skip_special, &mut self.scratch);
        String::from_utf8_lossy(&self.scratch).into_owned()
    }

    /// The text `id` adds, if any: `tokenizers::step_decode_stream`, step by step.
    pub fn step(&mut self, id: u32) -> Result<Option<String>, InvalidPrefix> {
        if self.prefix.is_empty() && !self.ids.is_empty() {
            let prefix = self.decode();
            if !prefix.ends_with('\u{FFFD}') {
                self.prefix = prefix;
                self.prefix_index = self.ids.len();
            }
        }
        self.ids.push(id);
        let string = self.decode();
        if string.len() <= self.prefix.len() || string.ends_with('\u{FFFD}') {
            return Ok(None);
        }
        let Some(new_text) = string.strip_prefix(self.prefix.as_str()) else {
            return Err(InvalidPrefix);
        };
        let new_text = new_text.to_string();
        let new_prefix_index = self.ids.len() - self.prefix_index;
        self.ids.drain(..self.prefix_index);
        self.prefix = self.decode();
        self.prefix_index = new_prefix_index;
        Ok(Some(new_text))
    }
}

#[cfg(test)]
mod tests;
