//! The identities specd counts by, as typed enums. Each one's label string is made here
//! and nowhere else, and `ALL` lists every value so that series can start at zero.

/// How specd serves a stream: forwarded untouched, speculated, or relayed (specd owns
/// the stream while the upstream decodes plainly).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamMode {
    Passthrough,
    Speculate,
    Relay,
}

impl StreamMode {
    pub const ALL: [StreamMode; 3] = [
        StreamMode::Passthrough,
        StreamMode::Speculate,
        StreamMode::Relay,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            StreamMode::Passthrough => "passthrough",
            StreamMode::Speculate => "speculate",
            StreamMode::Relay => "relay",
        }
    }
}

/// Why a generation request was forwarded untouched instead of speculated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassthroughReason {
    /// Speculation off for this request (header, body or server default).
    Disabled,
    /// `auto`, while speculation has not been paying (most requests skip specd's loop).
    NotPaying,
    UpstreamNotReady,
    NoTokenizer,
    N,
    BestOf,
    LogitBias,
    Penalty,
    GuidedDecoding,
    /// Chat with `tools` while specd knows of no tool-call parser it reproduces
    /// (`--tool-call-parser` with `--enable-auto-tool-choice`).
    Tools,
    Echo,
    PromptLogprobs,
    MinTokens,
    Suffix,
    Multimodal,
    MultiplePrompts,
    /// A parameter specd does not reproduce exactly, or a value it does not understand
    /// (the upstream answers with its own result or error).
    UnsupportedParam,
    /// SGLang: a LoRA adapter in `model`.
    Lora,
    /// The upstream's reasoning or tool-call parser (vLLM's as specd's flags name it,
    /// SGLang's as its `/server_info` does) is one specd does not reproduce for this
    /// request, or specd's flags disagree with SGLang's.
    Parser,
    /// `tool_choice: "required"`: the server constrains the output to a call.
    ToolChoiceRequired,
    /// `tool_choice` naming a function: the server constrains the output to its call.
    ToolChoiceNamed,
    /// A tool with `strict: true`: the server constrains the call to its schema.
    StrictTools,
    /// `parallel_tool_calls: false`: the server limits the output to one call.
    SingleToolCall,
}

impl PassthroughReason {
    pub const ALL: [PassthroughReason; 23] = [
        PassthroughReason::Disabled,
        PassthroughReason::NotPaying,
        PassthroughReason::UpstreamNotReady,
        PassthroughReason::NoTokenizer,
        PassthroughReason::N,
        PassthroughReason::BestOf,
        PassthroughReason::LogitBias,
        PassthroughReason::Penalty,
        PassthroughReason::GuidedDecoding,
        PassthroughReason::Tools,
        PassthroughReason::Echo,
        PassthroughReason::PromptLogprobs,
        PassthroughReason::MinTokens,
        PassthroughReason::Suffix,
        PassthroughReason::Multimodal,
        PassthroughReason::MultiplePrompts,
        PassthroughReason::UnsupportedParam,
        PassthroughReason::Lora,
        PassthroughReason::Parser,
        PassthroughReason::ToolChoiceRequired,
        PassthroughReason::ToolChoiceNamed,
        PassthroughReason::StrictTools,
        PassthroughReason::SingleToolCall,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            PassthroughReason::Disabled => "disabled",
            PassthroughReason::NotPaying => "not_paying",
            PassthroughReason::UpstreamNotReady => "upstream_not_ready",
            PassthroughReason::NoTokenizer => "no_tokenizer",
            PassthroughReason::N => "n",
            PassthroughReason::BestOf => "best_of",
            PassthroughReason::LogitBias => "logit_bias",
            PassthroughReason::Penalty => "penalty",
            PassthroughReason::GuidedDecoding => "guided_decoding",
            PassthroughReason::Tools => "tools",
            PassthroughReason::Echo => "echo",
            PassthroughReason::PromptLogprobs => "prompt_logprobs",
            PassthroughReason::MinTokens => "min_tokens",
            PassthroughReason::Suffix => "suffix",
            PassthroughReason::Multimodal => "multimodal",
            PassthroughReason::MultiplePrompts => "multiple_prompts",
            PassthroughReason::UnsupportedParam => "unsupported_param",
            PassthroughReason::Lora => "lora",
            PassthroughReason::Parser => "parser",
            PassthroughReason::ToolChoiceRequired => "tool_choice_required",
            PassthroughReason::ToolChoiceNamed => "tool_choice_named",
            PassthroughReason::StrictTools => "strict_tools",
            PassthroughReason::SingleToolCall => "single_tool_call",
        }
    }
}

impl std::fmt::Display for PassthroughReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why specd answered a request itself with an error, before any upstream call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectReason {
    BadRequest,
    TooLarge,
    Overloaded,
    Unauthorized,
    Draining,
}

impl RejectReason {
    pub const ALL: [RejectReason; 5] = [
        RejectReason::BadRequest,
        RejectReason::TooLarge,
        RejectReason::Overloaded,
        RejectReason::Unauthorized,
        RejectReason::Draining,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::BadRequest => "bad_request",
            RejectReason::TooLarge => "too_large",
            RejectReason::Overloaded => "overloaded",
            RejectReason::Unauthorized => "unauthorized",
            RejectReason::Draining => "draining",
        }
    }
}

/// The two halves of a cross-vocabulary draft round (`specd_draft_translation_seconds`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TranslationStep {
    /// Target context → draft tokens (incremental).
    Context,
    /// Drafted tokens → target tokens for the verify.
    Proposal,
}

impl TranslationStep {
    pub const ALL: [TranslationStep; 2] = [TranslationStep::Context, TranslationStep::Proposal];
    pub fn as_str(self) -> &'static str {
        match self {
            TranslationStep::Context => "context",
            TranslationStep::Proposal => "proposal",
        }
    }
}
