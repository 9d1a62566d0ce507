//! What the request handler hands the loop and what it gets back.

use std::sync::Arc;

use crate::config::SpecMode;
use crate::draft::{DraftSet, DrafterChoice, StreamId};
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::speculation::controller::Controller;
use crate::speculation::generation::Finish;
use crate::speculation::reasoning::{Reasoning, Split};
use crate::speculation::tools::{ToolPiece, Tools};
use crate::tokens::ModelTokenizer;
use crate::upstream::verify::{Backend, Sample, Sampling};

/// What the client writer receives.
#[derive(Debug)]
pub enum Event {
    Delta {
        text: String,
        tokens: Vec<Sample>,
        /// `text` as reasoning and content, with a reasoning parser.
        split: Option<Split>,
        /// What `text` adds to content and tool calls, with a tool-call parser.
        calls: Option<ToolPiece>,
    },
    /// The last text and tokens, sent together with the finish reason.
    Done {
        text: String,
        tokens: Vec<Sample>,
        split: Option<Split>,
        calls: Option<ToolPiece>,
        finish: Finish,
        stats: Stats,
    },
    Error(ApiError),
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Stats {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub rounds: u32,
    pub draft_tokens: u32,
    pub accepted_tokens: u32,
    pub relay_tokens: u32,
    pub switches: u32,
    pub drafter: DrafterChoice,
    pub mode: SpecMode,
}

impl Stats {
    pub(super) fn new(prompt_tokens: u32, drafter: DrafterChoice, mode: SpecMode) -> Self {
        Stats {
            prompt_tokens,
            completion_tokens: 0,
            rounds: 0,
            draft_tokens: 0,
            accepted_tokens: 0,
            relay_tokens: 0,
            switches: 0,
            drafter,
            mode,
        }
    }
}

pub struct SessionParams {
    pub stream: StreamId,
    pub model: String,
    pub prompt: Vec<u32>,
    pub sampling: Sampling,
    pub max_tokens: u32,
    pub max_model_len: u32,
    pub stop: Vec<String>,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    pub skip_special_tokens: bool,
    pub include_stop_str: bool,
    pub mode: SpecMode,
    pub k_max: usize,
    /// Force a relay↔speculate switch every N tokens (tests of the hybrid). Rounds are
    /// cut at the boundaries, so segments start at fixed positions whatever K is chosen.
    pub switch_every: Option<usize>,
    /// The upstream's reasoning parser (chat only): how streamed text is split.
    pub reasoning: Option<Reasoning>,
    /// The upstream's tool-call parser (chat only): how streamed text is parsed.
    pub tools: Option<Tools>,
}

pub struct SessionDeps {
    pub backend: Arc<dyn Backend>,
    pub drafters: DraftSet,
    pub tokenizer: Arc<ModelTokenizer>,
    pub metrics: Arc<Metrics>,
    pub controller: Arc<Controller>,
}
