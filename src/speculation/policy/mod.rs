//! When specd speculates and when it forwards a request unchanged (passthrough), in one
//! place: the request's own fields first, then the request's mode and the server's state.
//!
//! The rule for fields: specd speculates only what it reproduces exactly. A field whose
//! effect it cannot reproduce, and a value it does not fully understand, is forwarded, so
//! the client gets the upstream's own answer — its result or its error — never specd's
//! guess.

use std::sync::Arc;

use serde_json::{Map, Value};

pub mod exact;
pub mod fields;
pub mod sglang;

use super::controller::Controller;
use super::reasoning::Reasoning;
use super::request::{Endpoint, GenRequest, Intake};
use super::tools::{Choice, Tools};
use crate::config::{
    ReasoningParser, ReasoningParserArg, SpecMode, ToolCallParser, ToolCallParserArg,
};
use crate::metrics::labels::PassthroughReason as Reason;
use crate::protocol::lax;
use crate::tokens::ModelTokenizer;
use crate::upstream::verify::Backend;

/// What the server offers for speculation right now.
pub struct Conditions<'a> {
    /// `--speculation`, for requests that do not choose.
    pub default_mode: SpecMode,
    pub controller: &'a Controller,
    pub backend: Option<Arc<dyn Backend>>,
    pub tokenizer: Option<Arc<ModelTokenizer>>,
    /// `--reasoning-parser`: how the upstream splits chat answers.
    pub reasoning: Option<&'a ReasoningParserArg>,
    /// `--tool-call-parser`, when `--enable-auto-tool-choice` says the upstream uses it.
    pub tools: Option<&'a ToolCallParserArg>,
}

/// A request to speculate, with what it needs.
pub struct Plan {
    pub gen: GenRequest,
    pub mode: SpecMode,
    pub backend: Arc<dyn Backend>,
    pub tokenizer: Arc<ModelTokenizer>,
    /// The reasoning split of a chat answer, when the upstream runs a parser.
    pub reasoning: Option<Reasoning>,
    /// How the upstream's tool-call parser reads a chat answer, when it runs one.
    pub tools: Option<Tools>,
}

pub enum Route {
    Speculate(Box<Plan>),
    Passthrough {
        reason: Reason,
        body: Map<String, Value>,
    },
}

/// The passthrough decision for a valid request: its fields, then its mode, then whether
/// the server can speculate now.
pub fn route(intake: Intake, c: &Conditions<'_>) -> Route {
    let mut gen = match intake {
        Intake::Passthrough { reason, body } => return Route::Passthrough { reason, body },
        Intake::Speculate(gen) => *gen,
    };
    let pass = |reason, gen: GenRequest| Route::Passthrough {
        reason,
        body: gen.body,
    };
    let mode = gen.spec.mode.unwrap_or(c.default_mode);
    if mode == SpecMode::Off {
        return pass(Reason::Disabled, gen);
    }
    // Where speculation has not been paying, most `auto` requests skip specd's loop
    // (seeded sampled ones never: their output must not depend on the path).
    if mode == SpecMode::Auto
        && !gen.sampling.is_seeded_sampled()
        && gen.spec.switch_every.is_none()
        && !c.controller.watch_auto()
    {
        return pass(Reason::NotPaying, gen);
    }
    let Some(backend) = c.backend.clone() else {
        return pass(Reason::UpstreamNotReady, gen);
    };
    let Some(tokenizer) = c.tokenizer.clone() else {
        return pass(Reason::NoTokenizer, gen);
    };
    // The upstream may fill sampling defaults of its own, or apply what specd cannot.
    let chat = gen.endpoint == Endpoint::Chat;
    if let Err(reason) = backend.prepare(chat, &gen.body, &mut gen.sampling) {
        return pass(reason, gen);
    }
    if let Err(reason) = exact::check(&gen.sampling.per_step, &tokenizer) {
        return pass(reason, gen);
    }
    // Plain completions are never parsed, whatever the parsers. In front of SGLang its
    // own parsers (its `/server_info`) shape chat answers.
    let sglang = backend.sglang_parsers().filter(|_| chat);
    let (sg_reasoning, tools) = match sglang {
        Some(p) => match sglang::chat_parsers(p, &gen.body, &tokenizer) {
            Ok((r, t)) => (r, t),
            Err(reason) => return pass(reason, gen),
        },
        None => match tools_for(c, chat, &gen, &tokenizer) {
            Ok(t) => (None, t),
            Err(reason) => return pass(reason, gen),
        },
    };
    if tools.as_ref().is_some_and(Tools::keeps_special_tokens) {
        // vLLM's hermes and kimi_k2 parsers keep special tokens for tool calls
        // (`adjust_request`).
        gen.skip_special_tokens = false;
    }
    // Special tokens kept in the text, spaced the way a Python tokenizer class spaces them.
    let spaced = gen
        .body
        .get("spaces_between_special_tokens")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    if tokenizer.spaced_specials && !gen.skip_special_tokens && spaced {
        return pass(Reason::UnsupportedParam, gen);
    }
    let reasoning = match c.reasoning.filter(|_| chat && sglang.is_none()) {
        None => sg_reasoning,
        Some(arg) => match reasoning_for(arg, &tokenizer, &gen) {
            Some(r) => Some(r),
            None => return pass(Reason::Parser, gen),
        },
    };
    if reasoning
        .as_ref()
        .is_some_and(Reasoning::keeps_special_tokens)
    {
        // The grammar-engine parsers' `adjust_request`.
        gen.skip_special_tokens = false;
        if tokenizer.spaced_specials && spaced {
            return pass(Reason::UnsupportedParam, gen);
        }
    }
    Route::Speculate(Box::new(Plan {
        gen,
        mode,
        backend,
        tokenizer,
        reasoning,
        tools,
    }))
}

/// The tool parsing of this request's answer (`None`: the upstream parses none), or why
/// it must pass through: tools without a parser specd knows the upstream to run
/// (vLLM's own answer, an error for `auto`, is the reference), or a parser specd does not
/// implement (it shapes every chat answer, with tools or not).
fn tools_for(
    c: &Conditions<'_>,
    chat: bool,
    gen: &GenRequest,
    tok: &Arc<ModelTokenizer>,
) -> Result<Option<Tools>, Reason> {
    if !chat {
        return Ok(None);
    }
    let choice = fields::tool_choice(&gen.body);
    match (c.tools, choice) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err(Reason::Tools),
        (Some(ToolCallParserArg::Unimplemented(_)), _) => Err(Reason::Parser),
        (Some(ToolCallParserArg::Known(ToolCallParser::KimiK2)), choice) => {
            kimi_k2_for(c, gen, tok, choice.unwrap_or(Choice::None)).map(Some)
        }
        (Some(ToolCallParserArg::Known(ToolCallParser::Qwen3Coder)), choice) => {
            qwen3_coder_for(c, gen, tok, choice.unwrap_or(Choice::None)).map(Some)
        }
        (Some(ToolCallParserArg::Known(parser)), choice) => {
            Ok(Some(Tools::new(*parser, choice.unwrap_or(Choice::None))))
        }
    }
}

/// kimi_k2 runs on vLLM's grammar engine, composed the engine way with no reasoning
/// parser or with its own; beside any other reasoning parser vLLM composes it another
/// way, which specd does not reproduce.
fn kimi_k2_for(
    c: &Conditions<'_>,
    gen: &GenRequest,
    tok: &Arc<ModelTokenizer>,
    choice: Choice,
) -> Result<Tools, Reason> {
    let reasoning = match c.reasoning {
        None => false,
        Some(ReasoningParserArg::Known(ReasoningParser::KimiK2)) => true,
        Some(_) => return Err(Reason::Parser),
    };
    Tools::kimi_k2(choice, tok, &gen.body, reasoning).ok_or(Reason::Parser)
}

/// qwen3_coder runs on vLLM's grammar engine too: alone or beside the `qwen3` reasoning
/// parser (the same engine class), composed the engine way, or beside `deepseek_r1`,
/// composed the classic way.
fn qwen3_coder_for(
    c: &Conditions<'_>,
    gen: &GenRequest,
    tok: &Arc<ModelTokenizer>,
    choice: Choice,
) -> Result<Tools, Reason> {
    let reasoning = match c.reasoning {
        None => None,
        Some(ReasoningParserArg::Known(
            p @ (ReasoningParser::Qwen3 | ReasoningParser::DeepseekR1),
        )) => Some(*p),
        Some(_) => return Err(Reason::Parser),
    };
    Tools::qwen3_coder(choice, tok, &gen.body, reasoning).ok_or(Reason::Parser)
}

/// The split specd reproduces for this chat request; `None`: it must pass through (a
/// parser specd does not implement, a model without the think tokens, or reasoning
/// hidden by the request, which vLLM then drops from stream metadata too).
fn reasoning_for(
    arg: &ReasoningParserArg,
    tokenizer: &Arc<ModelTokenizer>,
    gen: &GenRequest,
) -> Option<Reasoning> {
    let ReasoningParserArg::Known(parser) = arg else {
        return None;
    };
    let shown = gen
        .body
        .get("include_reasoning")
        .is_none_or(|v| v.is_null() || lax::boolean(v) == Some(true));
    if !shown {
        return None;
    }
    Reasoning::resolve(*parser, tokenizer, gen.body.get("chat_template_kwargs"))
}
