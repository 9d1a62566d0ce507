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

#[derive(Debug, Clone)]
pub struct DraftRequest {
    pub stream: StreamId,
    /// Full token context: prompt + accepted output so far.
    pub context: Vec<u32>,
    /// Index in `context` where generated output starts.
    pub prompt_len: usize,
    /// Propose at most this many tokens (may be fewer, even zero).
    pub max_k: usize,
}

#[derive(Debug, Clone, Default)]
pub struct Proposal {
    pub tokens: Vec<u32>,
    /// Per token, the drafter's estimate in [0,1] that it is accepted given the previous
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
    fn name(&self) -> &'static str;
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
}

/// The drafters a server offers, by name.
#[derive(Default, Clone)]
pub struct Drafters {
    map: HashMap<&'static str, Arc<dyn Drafter>>,
}

impl Drafters {
    pub fn insert(&mut self, d: Arc<dyn Drafter>) {
        self.map.insert(d.name(), d);
    }
    pub fn get(&self, name: &str) -> Option<Arc<dyn Drafter>> {
        self.map.get(name).cloned()
    }
    pub fn names(&self) -> Vec<&'static str> {
        let mut v: Vec<_> = self.map.keys().copied().collect();
        v.sort_unstable();
        v
    }
}

/// Label value for a drafter name (bounded set for metrics).
pub fn drafter_label(name: &str) -> &'static str {
    match name {
        "ngram" => "ngram",
        "suffix" => "suffix",
        "model" => "model",
        "oracle" => "oracle",
        "adversarial" => "adversarial",
        _ => "other",
    }
}
