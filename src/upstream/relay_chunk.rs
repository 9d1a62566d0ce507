//! One streamed `/v1/completions` chunk of a relay, read as what it says: one pass over the
//! JSON, nothing kept but the first choice's samples (building and dropping a `Value` tree
//! per chunk was the largest part of a relayed token's CPU).
//!
//! The reading is lenient the way a `Value` lookup is: a field of an unexpected type counts
//! as absent, a repeated key counts by its last value, `choices` may also be an object keyed
//! `"0"`. Only JSON that does not parse is an error.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::verify::Sample;
use super::vllm::parse_token_id;

/// What one relay chunk says.
#[derive(Debug, PartialEq)]
pub enum RelayChunk {
    /// The upstream reported an error with this message.
    Error(String),
    /// The sampled tokens, in order.
    Samples(Vec<Sample>),
    /// No tokens (a usage-only or finish chunk).
    Empty,
    /// Text without token ids: the upstream does not speak the protocol.
    NoIds,
}

/// Read one chunk's `data`; `want_top` when the client asked for top logprobs.
pub fn read(data: &str, want_top: bool) -> Result<RelayChunk, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(data);
    let chunk = ChunkSeed { want_top }.deserialize(&mut de)?;
    de.end()?;
    Ok(chunk.said())
}

/// Visit methods that take any other JSON value as the visitor's default (consumed whole).
macro_rules! other_json_is_default {
    ($de:lifetime; $($kind:ident)*) => { $(other_json_is_default!(@ $de $kind);)* };
    (@ $de:lifetime bool) => {
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> { Ok(Default::default()) }
    };
    (@ $de:lifetime i64) => {
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> { Ok(Default::default()) }
    };
    (@ $de:lifetime u64) => {
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> { Ok(Default::default()) }
    };
    (@ $de:lifetime f64) => {
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> { Ok(Default::default()) }
    };
    (@ $de:lifetime str) => {
        fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> { Ok(Default::default()) }
    };
    (@ $de:lifetime unit) => {
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> { Ok(Default::default()) }
    };
    (@ $de:lifetime seq) => {
        fn visit_seq<A: SeqAccess<$de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
            while a.next_element::<IgnoredAny>()?.is_some() {}
            Ok(Default::default())
        }
    };
    (@ $de:lifetime map) => {
        fn visit_map<A: MapAccess<$de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
            while a.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok(Default::default())
        }
    };
}

/// The chunk as far as it matters.
#[derive(Default)]
struct Chunk {
    /// `error.message`, when a string.
    error: Option<String>,
    /// The first choice (`choices[0]`, or `choices["0"]`).
    choice: Option<Choice>,
}

#[derive(Default)]
struct Choice {
    /// `text` is a non-empty string.
    has_text: bool,
    logprobs: Logprobs,
    /// `token_ids`, when an array of u32s.
    token_ids: Option<Vec<u32>>,
}

/// A choice's `logprobs`.
#[derive(Default)]
enum Logprobs {
    /// Absent or null: the ids come from `token_ids`.
    #[default]
    Absent,
    /// Present but not an object: no ids.
    Invalid,
    Object(LpObject),
}

#[derive(Default)]
struct LpObject {
    /// `tokens`, when an array: each entry's id, when a `"token_id:N"` string.
    tokens: Option<Vec<Option<u32>>>,
    /// `token_logprobs`, when an array: each entry, when a number.
    logprobs: Option<Vec<Option<f64>>>,
    /// `top_logprobs` (read only when asked), when an array: each entry, when an object.
    top: Option<Vec<Option<TopEntry>>>,
}

/// One `top_logprobs` entry; keyed as a JSON object reads (sorted, the last repeat wins).
type TopEntry = BTreeMap<String, Option<f64>>;

impl Chunk {
    fn said(self) -> RelayChunk {
        if let Some(msg) = self.error {
            return RelayChunk::Error(msg);
        }
        let Some(c) = self.choice else {
            return RelayChunk::Empty;
        };
        let has_text = c.has_text;
        match c.samples() {
            Some(s) => RelayChunk::Samples(s),
            None if has_text => RelayChunk::NoIds,
            None => RelayChunk::Empty,
        }
    }
}

impl Choice {
    /// From `logprobs` when present, else from `token_ids`.
    fn samples(self) -> Option<Vec<Sample>> {
        match self.logprobs {
            Logprobs::Absent => Some(self.token_ids?.into_iter().map(Sample::id).collect()),
            Logprobs::Invalid => None,
            Logprobs::Object(lp) => lp.samples(),
        }
    }
}

impl LpObject {
    fn samples(self) -> Option<Vec<Sample>> {
        let lps = self.logprobs.unwrap_or_default();
        let mut top = self.top.unwrap_or_default().into_iter();
        self.tokens?
            .into_iter()
            .enumerate()
            .map(|(i, id)| {
                let entry = top.next().flatten();
                Some(Sample {
                    id: id?,
                    logprob: lps.get(i).copied().flatten().map(|x| x as f32),
                    top: entry.map(top_of).unwrap_or_default(),
                })
            })
            .collect()
    }
}

/// A top-logprobs entry's (id, logprob) pairs, most likely first.
fn top_of(entry: TopEntry) -> Vec<(u32, f32)> {
    let mut top: Vec<(u32, f32)> = entry
        .into_iter()
        .filter_map(|(k, v)| Some((parse_token_id(&k)?, v? as f32)))
        .collect();
    top.sort_by(|a, b| b.1.total_cmp(&a.1));
    top
}

/// The fields read; any other key is skipped.
enum Field {
    Error,
    Message,
    Choices,
    Text,
    TokenIds,
    Logprobs,
    Tokens,
    TokenLogprobs,
    TopLogprobs,
    Zero,
    Other,
}

impl<'de> de::Deserialize<'de> for Field {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Field;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Field, E> {
                Ok(match s {
                    "error" => Field::Error,
                    "message" => Field::Message,
                    "choices" => Field::Choices,
                    "text" => Field::Text,
                    "token_ids" => Field::TokenIds,
                    "logprobs" => Field::Logprobs,
                    "tokens" => Field::Tokens,
                    "token_logprobs" => Field::TokenLogprobs,
                    "top_logprobs" => Field::TopLogprobs,
                    "0" => Field::Zero,
                    _ => Field::Other,
                })
            }
        }
        d.deserialize_identifier(V)
    }
}

struct ChunkSeed {
    want_top: bool,
}

impl<'de> DeserializeSeed<'de> for ChunkSeed {
    type Value = Chunk;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Chunk, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ChunkSeed {
    type Value = Chunk;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a completions chunk")
    }
    other_json_is_default!('de; bool i64 u64 f64 str unit seq);
    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Chunk, A::Error> {
        let mut c = Chunk::default();
        while let Some(k) = a.next_key::<Field>()? {
            match k {
                Field::Error => c.error = a.next_value_seed(Message)?,
                Field::Choices => c.choice = a.next_value_seed(First(self.want_top))?,
                _ => drop(a.next_value::<IgnoredAny>()?),
            }
        }
        Ok(c)
    }
}

/// `error`: its `message`, when a string.
struct Message;

impl<'de> DeserializeSeed<'de> for Message {
    type Value = Option<String>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Message {
    type Value = Option<String>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an error object")
    }
    other_json_is_default!('de; bool i64 u64 f64 str unit seq);
    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
        let mut msg = None;
        while let Some(k) = a.next_key::<Field>()? {
            match k {
                Field::Message => msg = a.next_value_seed(Str)?,
                _ => drop(a.next_value::<IgnoredAny>()?),
            }
        }
        Ok(msg)
    }
}

/// A string, else `None`.
struct Str;

impl<'de> DeserializeSeed<'de> for Str {
    type Value = Option<String>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Str {
    type Value = Option<String>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }
    other_json_is_default!('de; bool i64 u64 f64 unit seq map);
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
        Ok(Some(s.to_string()))
    }
}

/// `choices`: its first entry (the `"0"` key of an object), read as a choice.
struct First(bool);

impl<'de> DeserializeSeed<'de> for First {
    type Value = Option<Choice>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for First {
    type Value = Option<Choice>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("choices")
    }
    other_json_is_default!('de; bool i64 u64 f64 str unit);
    fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
        let first = a.next_element_seed(ChoiceSeed(self.0))?;
        while a.next_element::<IgnoredAny>()?.is_some() {}
        Ok(first)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
        let mut first = None;
        while let Some(k) = a.next_key::<Field>()? {
            match k {
                Field::Zero => first = Some(a.next_value_seed(ChoiceSeed(self.0))?),
                _ => drop(a.next_value::<IgnoredAny>()?),
            }
        }
        Ok(first)
    }
}

/// One choice (anything but an object reads as a choice without fields).
struct ChoiceSeed(bool);

impl<'de> DeserializeSeed<'de> for ChoiceSeed {
    type Value = Choice;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Choice, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ChoiceSeed {
    type Value = Choice;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a choice")
    }
    other_json_is_default!('de; bool i64 u64 f64 str unit seq);
    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Choice, A::Error> {
        let mut c = Choice::default();
        while let Some(k) = a.next_key::<Field>()? {
            match k {
                Field::Text => c.has_text = a.next_value_seed(NonEmptyStr)?,
                Field::TokenIds => c.token_ids = a.next_value_seed(Ids)?,
                Field::Logprobs => c.logprobs = a.next_value_seed(LpSeed(self.0))?,
                _ => drop(a.next_value::<IgnoredAny>()?),
            }
        }
        Ok(c)
    }
}

/// True for a non-empty string.
struct NonEmptyStr;

impl<'de> DeserializeSeed<'de> for NonEmptyStr {
    type Value = bool;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for NonEmptyStr {
    type Value = bool;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("text")
    }
    other_json_is_default!('de; bool i64 u64 f64 unit seq map);
    fn visit_str<E: de::Error>(self, s: &str) -> Result<bool, E> {
        Ok(!s.is_empty())
    }
}

/// `token_ids`: every entry a u32, else `None`.
struct Ids;

impl<'de> DeserializeSeed<'de> for Ids {
    type Value = Option<Vec<u32>>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Ids {
    type Value = Option<Vec<u32>>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("token ids")
    }
    other_json_is_default!('de; bool i64 u64 f64 str unit map);
    fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
        let mut ids = Some(Vec::with_capacity(a.size_hint().unwrap_or(1)));
        while let Some(id) = a.next_element_seed(Id)? {
            match (&mut ids, id) {
                (Some(v), Some(id)) => v.push(id),
                _ => ids = None,
            }
        }
        Ok(ids)
    }
}

/// A u32, else `None`.
struct Id;

impl<'de> DeserializeSeed<'de> for Id {
    type Value = Option<u32>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Id {
    type Value = Option<u32>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a token id")
    }
    other_json_is_default!('de; bool f64 str unit seq map);
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(u32::try_from(v).ok())
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        Ok(u32::try_from(v).ok())
    }
}

/// A choice's `logprobs`; top logprobs are read when `.0`.
struct LpSeed(bool);

impl<'de> DeserializeSeed<'de> for LpSeed {
    type Value = Logprobs;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Logprobs, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for LpSeed {
    type Value = Logprobs;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("logprobs")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Logprobs, E> {
        Ok(Logprobs::Absent)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Logprobs, E> {
        Ok(Logprobs::Invalid)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Logprobs, E> {
        Ok(Logprobs::Invalid)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Logprobs, E> {
        Ok(Logprobs::Invalid)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Logprobs, E> {
        Ok(Logprobs::Invalid)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Logprobs, E> {
        Ok(Logprobs::Invalid)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Logprobs, A::Error> {
        while a.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Logprobs::Invalid)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Logprobs, A::Error> {
        let mut lp = LpObject::default();
        while let Some(k) = a.next_key::<Field>()? {
            match k {
                Field::Tokens => lp.tokens = a.next_value_seed(Each(TokenId))?,
                Field::TokenLogprobs => lp.logprobs = a.next_value_seed(Each(Number))?,
                Field::TopLogprobs if self.0 => lp.top = a.next_value_seed(Each(Top))?,
                _ => drop(a.next_value::<IgnoredAny>()?),
            }
        }
        Ok(Logprobs::Object(lp))
    }
}

/// An array read entry by entry with the seed `S`, else `None`.
struct Each<S>(S);

impl<'de, S: DeserializeSeed<'de> + Copy> DeserializeSeed<'de> for Each<S> {
    type Value = Option<Vec<S::Value>>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, S: DeserializeSeed<'de> + Copy> Visitor<'de> for Each<S> {
    type Value = Option<Vec<S::Value>>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array")
    }
    other_json_is_default!('de; bool i64 u64 f64 str unit map);
    fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::with_capacity(a.size_hint().unwrap_or(1));
        while let Some(x) = a.next_element_seed(self.0)? {
            out.push(x);
        }
        Ok(Some(out))
    }
}

/// A `"token_id:N"` string's id, else `None`.
#[derive(Clone, Copy)]
struct TokenId;

impl<'de> DeserializeSeed<'de> for TokenId {
    type Value = Option<u32>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for TokenId {
    type Value = Option<u32>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a token")
    }
    other_json_is_default!('de; bool i64 u64 f64 unit seq map);
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
        Ok(parse_token_id(s))
    }
}

/// A number, else `None`.
#[derive(Clone, Copy)]
struct Number;

impl<'de> DeserializeSeed<'de> for Number {
    type Value = Option<f64>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Number {
    type Value = Option<f64>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a number")
    }
    other_json_is_default!('de; bool str unit seq map);
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Some(v as f64))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        Ok(Some(v as f64))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        Ok(Some(v))
    }
}

/// One `top_logprobs` entry: an object of logprobs, else `None`.
#[derive(Clone, Copy)]
struct Top;

impl<'de> DeserializeSeed<'de> for Top {
    type Value = Option<TopEntry>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Top {
    type Value = Option<TopEntry>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("top logprobs")
    }
    other_json_is_default!('de; bool i64 u64 f64 str unit seq);
    fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
        let mut entry = TopEntry::new();
        while let Some(k) = a.next_key::<String>()? {
            let v = a.next_value_seed(Number)?;
            entry.insert(k, v);
        }
        Ok(Some(entry))
    }
}

#[cfg(test)]
mod tests;
