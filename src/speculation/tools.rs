//! Tool calls read out of a chat answer as vLLM's `--enable-auto-tool-choice
//! --tool-call-parser NAME` reads them (vLLM 0.32: the parser itself, and
//! `vllm/parser/abstract_parser.py` with `entrypoints/openai/chat_completion/serving.py`
//! around it), so that a speculated answer reads exactly as a direct one.
//!
//! With a parser, vLLM shapes every chat answer through it:
//! - `tool_choice: "auto"` (what requests with `tools` default to): a whole answer's text
//!   is parsed once; found calls become `message.tool_calls` with fresh random ids, the
//!   text before the first call is `content` (null when blank) and `finish_reason` is
//!   `"tool_calls"`. A stream is parsed after every generated token on the text so far;
//!   each step sends the content or the call pieces (id, type and name; argument
//!   fragments) it adds, and a stream that sent any call and stopped ends with
//!   `"tool_calls"`.
//! - `tool_choice: "none"`, or no tools: the text is content; a streamed step that adds
//!   no text sends nothing (the last one an empty delta).
//!
//! In front of SGLang, its own `hermes` (`hermes_sglang.rs`) reads the answer instead.

pub mod engine;
#[cfg(test)]
mod golden;
pub mod hermes;
pub mod hermes_sglang;
pub mod kimi_k2;
pub mod llama3_json;
pub mod partial_json;
pub mod pyjson;
pub mod qwen3_coder;
pub mod schema;

use std::sync::Arc;

use serde_json::Value;

use crate::config::{ReasoningParser, ToolCallParser};
use crate::tokens::ModelTokenizer;
use crate::upstream::detect::UpstreamKind;

/// One parsed call of a whole answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The id the model wrote (kimi_k2's header); `None`: a fresh random one.
    pub id: Option<String>,
    pub name: String,
    /// `json.dumps` of the arguments the model wrote.
    pub arguments: String,
}

/// A whole answer as the parser reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extracted {
    pub content: Option<String>,
    pub calls: Vec<Call>,
}

impl Extracted {
    fn text(t: &str) -> Self {
        Extracted {
            content: Some(t.to_string()),
            calls: Vec::new(),
        }
    }
}

/// A piece of one streamed call: its start (id, type and name), argument text, or both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallDelta {
    pub index: u32,
    /// The id of a call's first piece where the model wrote it (else a random one).
    pub id: Option<String>,
    /// Set on the call's first piece, which also carries its id and type.
    pub name: Option<String>,
    pub arguments: Option<String>,
}

/// What streamed steps add: `content` is `None` where vLLM writes null beside calls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamDelta {
    pub content: Option<String>,
    pub calls: Vec<CallDelta>,
}

impl StreamDelta {
    /// Steps merged into one chunk: argument fragments that follow each other in one call
    /// join, as vLLM's diff of those steps together would.
    pub fn append(&mut self, other: StreamDelta) {
        if let Some(c) = other.content {
            self.content.get_or_insert_with(String::new).push_str(&c);
        }
        for d in other.calls {
            match self.calls.last_mut() {
                // A call's start stays its own piece, as in vLLM's deltas.
                Some(last) if last.index == d.index && last.name.is_none() && d.name.is_none() => {
                    let args = last.arguments.get_or_insert_with(String::new);
                    args.push_str(d.arguments.as_deref().unwrap_or(""));
                }
                _ => self.calls.push(d),
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.content.is_none() && self.calls.is_empty()
    }
}

/// What a generation's streamed steps added since the last take, and whether any step
/// so far sent a call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolPiece {
    pub delta: StreamDelta,
    pub called: bool,
}

/// The request's `tool_choice` as far as specd speculates it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// `auto` (or unset with tools): calls are parsed out.
    Auto,
    /// `none`, or a request without tools: the text is content.
    None,
}

/// The upstream's tool parser for one chat request.
#[derive(Debug, Clone)]
pub struct Tools {
    pub parser: ToolCallParser,
    pub choice: Choice,
    /// A grammar-engine parser (kimi_k2, qwen3_coder): its grammar and the request's
    /// tools.
    pub engine: Option<Arc<EngineTools>>,
    /// SGLang's parser: the names of the request's tools (calls to others are dropped).
    pub sglang: Option<Arc<Vec<String>>>,
}

/// What a grammar-engine tool parser needs of the model and the request.
#[derive(Debug)]
pub struct EngineTools {
    pub grammar: EngineGrammar,
    /// The request's tools; `None` when it has none.
    pub declared: Option<schema::Declared>,
    /// Composed beside a reasoning parser that is not of the engine (qwen3_coder with
    /// `deepseek_r1`): vLLM's serving then treats `tool_choice: "none"`, and answers
    /// without calls, as it does with the classic parsers (the text as it is), and
    /// keeps special tokens for every chat request.
    pub delegated: bool,
}

/// A grammar-engine config bound to the model.
#[derive(Debug, Clone)]
pub enum EngineGrammar {
    KimiK2(Arc<kimi_k2::Grammar>),
    Qwen3Coder(Arc<qwen3_coder::Grammar>),
}

/// A grammar-engine parser over one answer.
#[derive(Debug, Clone)]
pub enum EngineParser {
    KimiK2(kimi_k2::Parser),
    Qwen3Coder(qwen3_coder::Parser),
}

impl EngineParser {
    fn new(e: &EngineTools, suppress: bool) -> Self {
        match &e.grammar {
            EngineGrammar::KimiK2(g) => EngineParser::KimiK2(kimi_k2::Parser::new(g, suppress)),
            EngineGrammar::Qwen3Coder(g) => {
                EngineParser::Qwen3Coder(qwen3_coder::Parser::new(g, e.declared.as_ref(), suppress))
            }
        }
    }

    fn step(&mut self, text: &str, ids: &[u32]) -> Option<StreamDelta> {
        match self {
            EngineParser::KimiK2(p) => p.step(text, ids),
            EngineParser::Qwen3Coder(p) => p.step(text, ids),
        }
    }

    fn finish(&mut self) -> Option<StreamDelta> {
        match self {
            EngineParser::KimiK2(p) => p.finish(),
            EngineParser::Qwen3Coder(p) => p.finish(),
        }
    }

    fn whole(self, text: &str, e: &EngineTools) -> (Option<String>, Vec<Call>) {
        match self {
            EngineParser::KimiK2(p) => p.whole(text, e.declared.as_ref()),
            EngineParser::Qwen3Coder(p) => p.whole(text),
        }
    }
}

impl Tools {
    /// A classic (text-only) parser.
    pub fn new(parser: ToolCallParser, choice: Choice) -> Self {
        Tools {
            parser,
            choice,
            engine: None,
            sglang: None,
        }
    }

    /// SGLang's `hermes` for a request whose tools are named `names`.
    pub fn sglang_hermes(choice: Choice, names: Vec<String>) -> Self {
        Tools {
            parser: ToolCallParser::Hermes,
            choice,
            engine: None,
            sglang: Some(Arc::new(names)),
        }
    }

    /// Whose parser this is.
    pub fn dialect(&self) -> UpstreamKind {
        match self.sglang {
            Some(_) => UpstreamKind::Sglang,
            None => UpstreamKind::Vllm,
        }
    }

    /// SGLang parses calls only with tools and a choice other than `none`.
    fn sglang_active(&self) -> Option<&[String]> {
        let names = self.sglang.as_deref()?;
        (self.choice == Choice::Auto && !names.is_empty()).then_some(names.as_slice())
    }

    /// `kimi_k2` for a request of `body` to a model of `tok`; `reasoning`: the kimi_k2
    /// reasoning parser runs too. `None` where specd does not reproduce the parse (a
    /// thinking switch or tools of a shape it does not read).
    pub fn kimi_k2(
        choice: Choice,
        tok: &Arc<ModelTokenizer>,
        body: &serde_json::Map<String, Value>,
        reasoning: bool,
    ) -> Option<Self> {
        let kwargs = body.get("chat_template_kwargs");
        let thinking = crate::speculation::reasoning::thinking(ReasoningParser::KimiK2, kwargs)?;
        let declared = match body.get("tools").filter(|t| !t.is_null()) {
            None => None,
            Some(t) => Some(schema::Declared::of(t)?),
        };
        let one = tok.clone();
        let grammar = kimi_k2::Grammar::new(
            thinking,
            !reasoning,
            |t| tok.token_id(t),
            &tok.special_tokens(),
            Arc::new(move |id| one.token_text(id)),
        );
        Some(Tools {
            parser: ToolCallParser::KimiK2,
            choice,
            engine: Some(Arc::new(EngineTools {
                grammar: EngineGrammar::KimiK2(Arc::new(grammar)),
                declared,
                delegated: false,
            })),
            sglang: None,
        })
    }

    /// `qwen3_coder` for a request of `body` to a model of `tok`; `reasoning`: the
    /// reasoning parser that runs too (`qwen3`, of the same engine, or `deepseek_r1`).
    /// `None` where specd does not reproduce the parse (tools of a shape it does not
    /// read).
    pub fn qwen3_coder(
        choice: Choice,
        tok: &Arc<ModelTokenizer>,
        body: &serde_json::Map<String, Value>,
        reasoning: Option<ReasoningParser>,
    ) -> Option<Self> {
        let declared = match body.get("tools").filter(|t| !t.is_null()) {
            None => None,
            Some(t) => Some(schema::Declared::of(t)?),
        };
        let one = tok.clone();
        let grammar = qwen3_coder::Grammar::new(
            reasoning.is_none(),
            |t| tok.token_id(t),
            &tok.special_tokens(),
            Arc::new(move |id| one.token_text(id)),
        );
        Some(Tools {
            parser: ToolCallParser::Qwen3Coder,
            choice,
            engine: Some(Arc::new(EngineTools {
                grammar: EngineGrammar::Qwen3Coder(Arc::new(grammar)),
                declared,
                delegated: reasoning.is_some_and(|r| r != ReasoningParser::Qwen3),
            })),
            sglang: None,
        })
    }

    /// `tool_choice: "none"` with tools: the engine ignores call markup's events.
    fn suppressed(&self, e: &EngineTools) -> bool {
        self.choice == Choice::None && e.declared.is_some()
    }

    /// Whether vLLM keeps special tokens in the text for this request (the parsers'
    /// `adjust_request`).
    pub fn keeps_special_tokens(&self) -> bool {
        let delegated = self.engine.as_ref().is_some_and(|e| e.delegated);
        delegated
            || self.choice == Choice::Auto
                && matches!(
                    self.parser,
                    ToolCallParser::Hermes | ToolCallParser::KimiK2 | ToolCallParser::Qwen3Coder
                )
    }

    /// Whether a whole answer without calls keeps its content as it was (the classic
    /// parsers), or as the parser read it (the engine drops call markup).
    pub fn reads_content(&self) -> bool {
        self.engine.as_ref().is_some_and(|e| !e.delegated) || self.sglang.is_some()
    }

    /// The engine parser that reads this request's answer: none where vLLM's serving
    /// hands the text on as it is (`tool_choice: "none"` beside a classic reasoning
    /// parser).
    fn engine(&self) -> Option<&EngineTools> {
        let e = self.engine.as_deref()?;
        (!(e.delegated && self.choice == Choice::None)).then_some(e)
    }

    /// A whole answer: content and calls (no calls with `tool_choice: none`).
    pub fn extract(&self, text: &str) -> Extracted {
        if self.sglang.is_some() {
            // SGLang: with no call markup (or no parsing), the text as it is.
            return self
                .sglang_active()
                .and_then(|names| hermes_sglang::extract(text, names))
                .unwrap_or_else(|| Extracted::text(text));
        }
        if let Some(e) = self.engine() {
            let p = EngineParser::new(e, self.suppressed(e));
            let (content, calls) = p.whole(text, e);
            let calls = match self.choice {
                Choice::None => Vec::new(),
                Choice::Auto => calls,
            };
            return blank_beside_calls(Extracted { content, calls });
        }
        if self.choice == Choice::None {
            return Extracted::text(text);
        }
        let e = match self.parser {
            ToolCallParser::Hermes => hermes::extract(text),
            ToolCallParser::Llama3Json => llama3_json::extract(text),
            // Not reached: the engine parsers always have their engine.
            ToolCallParser::KimiK2 | ToolCallParser::Qwen3Coder => Extracted::text(text),
        };
        blank_beside_calls(e)
    }
    pub fn stream(&self) -> ToolStream {
        let engine = self.engine().map(|e| {
            let suppress = self.suppressed(e);
            Box::new(EngineParser::new(e, suppress))
        });
        ToolStream {
            tools: self.clone(),
            text: String::new(),
            hermes: hermes::Stream::default(),
            llama3: llama3_json::stream::Stream::default(),
            engine,
            sglang: self
                .sglang_active()
                .map(|names| Box::new(hermes_sglang::Stream::new(names.to_vec()))),
            called: false,
        }
    }
}

/// The serving layer: beside calls, blank content is null.
fn blank_beside_calls(mut e: Extracted) -> Extracted {
    let blank = |c: &str| hermes::strip(c).is_empty();
    if !e.calls.is_empty() && e.content.as_deref().is_some_and(blank) {
        e.content = None;
    }
    e
}

/// The streaming parse of one answer, fed the text released with each generated token.
#[derive(Debug, Clone)]
pub struct ToolStream {
    tools: Tools,
    /// The whole text so far (vLLM's `current_text`).
    text: String,
    hermes: hermes::Stream,
    llama3: llama3_json::stream::Stream,
    /// A grammar-engine parser's state.
    engine: Option<Box<EngineParser>>,
    /// SGLang's parser's state, where it parses calls.
    sglang: Option<Box<hermes_sglang::Stream>>,
    /// Some step sent a call (vLLM's `tools_streamed`).
    called: bool,
}

impl ToolStream {
    /// One step: the text released with one token and the token ids the parser is fed
    /// with it; `last` when generation ends with it.
    pub fn step(&mut self, released: &str, ids: &[u32], last: bool) -> Option<StreamDelta> {
        if let Some(p) = &mut self.sglang {
            let mut d = p.step(released);
            if last {
                // `_check_for_unstreamed_tool_args`.
                d.calls.extend(p.remaining());
            }
            self.called = p.called;
            return (!d.is_empty()).then_some(d);
        }
        if self.tools.sglang.is_some() {
            // SGLang parses no calls here: the text is content.
            return (!released.is_empty()).then(|| StreamDelta {
                content: Some(released.to_string()),
                calls: Vec::new(),
            });
        }
        if let Some(p) = &mut self.engine {
            let mut d = p.step(released, ids);
            if self.tools.choice == Choice::None {
                // vLLM runs the parse and drops the step's calls (not the flush's).
                if let Some(d) = &mut d {
                    d.calls.clear();
                }
            }
            if last {
                // `_flush_engine_parsers`: what the engine still holds.
                if let Some(f) = p.finish() {
                    d.get_or_insert_with(StreamDelta::default).append(f);
                }
            }
            self.called |= d.as_ref().is_some_and(|d| !d.calls.is_empty());
            return d;
        }
        if self.tools.choice == Choice::None {
            return (!released.is_empty()).then(|| StreamDelta {
                content: Some(released.to_string()),
                calls: Vec::new(),
            });
        }
        self.text.push_str(released);
        let mut d = match self.tools.parser {
            ToolCallParser::Hermes => self.hermes.step(&self.text)?,
            ToolCallParser::Llama3Json => self.llama3.step(&self.text, released)?,
            // Not reached: the engine parsers always have their engine. Plain text if it were.
            ToolCallParser::KimiK2 | ToolCallParser::Qwen3Coder => StreamDelta {
                content: (!released.is_empty()).then(|| released.to_string()),
                calls: Vec::new(),
            },
        };
        if last {
            // vLLM's `finalize_generation`: arguments parsed but not streamed.
            if let Some(c) = d.calls.last_mut() {
                let rest = match self.tools.parser {
                    ToolCallParser::Llama3Json => self.llama3.remaining_args(),
                    _ => self.hermes.remaining_args().to_string(),
                };
                c.arguments.get_or_insert_with(String::new).push_str(&rest);
            }
        }
        self.called |= !d.calls.is_empty();
        Some(d)
    }

    /// Whether any call was streamed: a stop then reads `"tool_calls"`.
    pub fn called(&self) -> bool {
        self.called
    }
}

/// A tool call id shaped like SGLang's (`call_` and 24 random hex digits).
pub fn sglang_call_id() -> String {
    let hex = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
    format!("call_{}", &hex[..24])
}

/// A tool call id shaped like vLLM's (`make_tool_call_id`: 16 random hex digits), which
/// are random, so a direct answer's differ too.
pub fn call_id() -> String {
    format!("chatcmpl-tool-{:016x}", fastrand::u64(..))
}

#[cfg(test)]
mod tests;
