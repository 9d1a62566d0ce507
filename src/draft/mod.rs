//! Draft sources behind one trait. A drafter proposes up to K tokens for a stream's
//! context; the round loop verifies them against the upstream.

pub mod model;
pub mod ngram;
pub mod suffix;
pub mod testing;

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::future::BoxFuture;

pub type StreamId = u64;

/// The drafters specd has. Its `as_str` is the name used in flags, request bodies,
/// `usage.speculation.drafter` and metric labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, clap::ValueEnum)]
pub enum DrafterKind {
    /// Prompt lookup: the longest suffix match of the context inside the context.
    Ngram,
    /// Suffix trees over this request and recent outputs of all requests.
    Suffix,
    /// A small draft model (`--draft-model`).
    Model,
    /// Test drafter: proposes the expected continuation given in the request.
    Oracle,
    /// Test drafter: proposes a wrong token at every position.
    Adversarial,
}

impl DrafterKind {
    pub const ALL: [DrafterKind; 5] = [
        DrafterKind::Ngram,
        DrafterKind::Suffix,
        DrafterKind::Model,
        DrafterKind::Oracle,
        DrafterKind::Adversarial,
    ];
    pub const COUNT: usize = Self::ALL.len();

    pub fn as_str(self) -> &'static str {
        match self {
            DrafterKind::Ngram => "ngram",
            DrafterKind::Suffix => "suffix",
            DrafterKind::Model => "model",
            DrafterKind::Oracle => "oracle",
            DrafterKind::Adversarial => "adversarial",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// Dense index, for per-drafter tables.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The drafters that take the expected tokens from the request (`--enable-test-drafters`).
    pub fn is_test_only(self) -> bool {
        matches!(self, DrafterKind::Oracle | DrafterKind::Adversarial)
    }
}

impl std::fmt::Display for DrafterKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for DrafterKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// What a request drafts with: one drafter, or `auto` — every drafter the server has
/// (test drafters aside), the proposal expected to yield the most tokens per second
/// verified each round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrafterChoice {
    One(DrafterKind),
    Auto,
}

impl DrafterChoice {
    pub fn as_str(self) -> &'static str {
        match self {
            DrafterChoice::One(k) => k.as_str(),
            DrafterChoice::Auto => "auto",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        if s == "auto" {
            return Some(DrafterChoice::Auto);
        }
        DrafterKind::parse(s).map(DrafterChoice::One)
    }
}

impl std::str::FromStr for DrafterChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        DrafterChoice::parse(s.trim()).ok_or_else(|| {
            let names: Vec<_> = DrafterKind::ALL.iter().map(|k| k.as_str()).collect();
            format!("unknown drafter `{s}`; one of: auto, {}", names.join(", "))
        })
    }
}

impl std::fmt::Display for DrafterChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for DrafterChoice {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// The drafters of one request, in a fixed order; more than one when it chose `auto`.
#[derive(Clone)]
pub struct DraftSet {
    choice: DrafterChoice,
    drafters: Vec<Arc<dyn Drafter>>,
}

impl DraftSet {
    pub fn one(d: Arc<dyn Drafter>) -> Self {
        DraftSet {
            choice: DrafterChoice::One(d.kind()),
            drafters: vec![d],
        }
    }

    /// Several drafters, the proposal chosen per round (`auto`); `drafters` not empty.
    pub fn choose_among(mut drafters: Vec<Arc<dyn Drafter>>) -> Self {
        drafters.sort_by_key(|d| d.kind());
        DraftSet {
            choice: DrafterChoice::Auto,
            drafters,
        }
    }

    pub fn choice(&self) -> DrafterChoice {
        self.choice
    }

    /// Every drafter of the set (never empty).
    pub fn all(&self) -> &[Arc<dyn Drafter>] {
        &self.drafters
    }

    pub fn first(&self) -> &Arc<dyn Drafter> {
        &self.drafters[0]
    }

    pub fn get(&self, kind: DrafterKind) -> Option<&Arc<dyn Drafter>> {
        self.drafters.iter().find(|d| d.kind() == kind)
    }

    /// New tokens were accepted: every drafter of the set follows the context.
    pub fn observe(&self, stream: StreamId, context: &[u32], prompt_len: usize) {
        for d in &self.drafters {
            d.observe(stream, context, prompt_len);
        }
    }

    pub fn finish(&self, stream: StreamId) {
        for d in &self.drafters {
            d.finish(stream);
        }
    }
}

#[derive(Debug, Clone)]
pub struct DraftRequest {
    pub stream: StreamId,
    /// Full token context: prompt + accepted output so far. Shared with the stream, which
    /// copies it only if it grows while a drafter still holds it (a shadow proposal per
    /// relayed token copies nothing).
    pub context: Arc<Vec<u32>>,
    /// Index in `context` where generated output starts.
    pub prompt_len: usize,
    /// Propose at most this many tokens (may be fewer, even zero).
    pub max_k: usize,
}

#[derive(Debug, Clone, Default)]
pub struct Proposal {
    pub tokens: Vec<u32>,
    /// Per token, the drafter's estimate in 0..=1 that it is accepted given the previous
    /// ones were.
    pub confidence: Vec<f32>,
}

#[derive(Debug, thiserror::Error)]
pub enum DraftError {
    #[error("draft model error: {0}")]
    Model(String),
    #[error("drafter is shut down")]
    Closed,
}

pub trait Drafter: Send + Sync {
    fn kind(&self) -> DrafterKind;
    /// Propose a chain of tokens. Batched drafters may hold the request briefly to run it
    /// together with other streams' requests.
    fn propose(&self, req: DraftRequest) -> BoxFuture<'_, Result<Proposal, DraftError>>;
    /// New tokens were accepted; `context` is the new full context.
    fn observe(&self, _stream: StreamId, _context: &[u32], _prompt_len: usize) {}
    /// The stream ended; free its state.
    fn finish(&self, _stream: StreamId) {}
    /// Slow drafters ask for the next round to be drafted while a verify call is in flight
    /// (assuming all drafts are accepted); the guess is kept when it turns out right.
    fn wants_overlap(&self) -> bool {
        false
    }
    /// The target's tokenizer is known (at start): a drafter whose tokens may not be the
    /// target's decides here how to speak to it.
    fn bind_target(
        &self,
        _target: &Arc<crate::tokens::ModelTokenizer>,
        _metrics: Option<&crate::metrics::Metrics>,
    ) -> Result<(), DraftError> {
        Ok(())
    }
}

/// The drafters a server offers.
#[derive(Default, Clone)]
pub struct Drafters {
    map: HashMap<DrafterKind, Arc<dyn Drafter>>,
    /// `--enable-test-drafters`: `oracle` and `adversarial`, made per request.
    test_drafters: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ChooseError {
    #[error("unknown drafter '{name}'; available: {available}")]
    Unknown { name: String, available: String },
    #[error("the test drafters need speculation.oracle_tokens")]
    NoOracleTokens,
}

impl Drafters {
    pub fn enable_test_drafters(&mut self) {
        self.test_drafters = true;
    }

    /// The drafters for one request: `name` (else `default`); `auto` is every drafter the
    /// server has; the test drafters are made from the request's expected tokens.
    pub fn for_request(
        &self,
        name: Option<&str>,
        default: DrafterChoice,
        oracle_tokens: Option<&[u32]>,
        vocab_size: usize,
    ) -> Result<DraftSet, ChooseError> {
        let unknown = |name: &str| ChooseError::Unknown {
            name: name.to_string(),
            available: self.names().join(", "),
        };
        let choice = match name {
            Some(n) => DrafterChoice::parse(n).ok_or_else(|| unknown(n))?,
            None => default,
        };
        let kind = match choice {
            DrafterChoice::One(kind) => kind,
            DrafterChoice::Auto => {
                if self.map.is_empty() {
                    return Err(unknown("auto"));
                }
                return Ok(DraftSet::choose_among(self.map.values().cloned().collect()));
            }
        };
        if kind.is_test_only() && self.test_drafters {
            let truth = oracle_tokens.ok_or(ChooseError::NoOracleTokens)?.to_vec();
            return Ok(DraftSet::one(Arc::new(testing::ScriptedDrafter {
                truth,
                adversarial: kind == DrafterKind::Adversarial,
                vocab_size: u32::try_from(vocab_size).unwrap_or(u32::MAX),
            })));
        }
        self.get(kind)
            .map(DraftSet::one)
            .ok_or_else(|| unknown(kind.as_str()))
    }

    pub fn insert(&mut self, d: Arc<dyn Drafter>) {
        self.map.insert(d.kind(), d);
    }
    pub fn get(&self, kind: DrafterKind) -> Option<Arc<dyn Drafter>> {
        self.map.get(&kind).cloned()
    }
    /// The names a request may choose (`auto` among them while any drafter exists).
    pub fn names(&self) -> Vec<&'static str> {
        let mut v: Vec<_> = self.map.keys().copied().collect();
        v.sort_unstable();
        let auto = (!v.is_empty()).then_some(DrafterChoice::Auto.as_str());
        v.into_iter().map(DrafterKind::as_str).chain(auto).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_drafts_with_every_drafter_the_server_has() {
        let mut d = Drafters::default();
        assert!(d
            .for_request(Some("auto"), DrafterChoice::Auto, None, 64)
            .is_err());
        d.insert(Arc::new(suffix::SuffixDrafter::new(Default::default())));
        d.insert(Arc::new(ngram::NgramDrafter::new(2, 8)));
        d.enable_test_drafters();
        let set = d
            .for_request(
                Some("auto"),
                DrafterChoice::One(DrafterKind::Ngram),
                None,
                64,
            )
            .expect("auto");
        let kinds: Vec<_> = set.all().iter().map(|x| x.kind()).collect();
        assert_eq!(kinds, [DrafterKind::Ngram, DrafterKind::Suffix]);
        assert_eq!(set.choice(), DrafterChoice::Auto);
        let one = d
            .for_request(None, DrafterChoice::One(DrafterKind::Suffix), None, 64)
            .expect("default");
        assert_eq!(one.all().len(), 1);
        assert_eq!(one.choice().as_str(), "suffix");
        assert_eq!(d.names(), ["ngram", "suffix", "auto"]);
        assert_eq!("auto".parse::<DrafterChoice>(), Ok(DrafterChoice::Auto));
        assert!("fast".parse::<DrafterChoice>().is_err());
    }
}
