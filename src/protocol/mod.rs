//! The OpenAI-compatible wire types specd reads and writes: request bodies (with every
//! field specd does not read passed through untouched), the lax scalar reading vLLM's
//! request models use, and the response bodies of speculated requests.

pub mod lax;
pub mod request;
pub mod response;

/// The two generation routes specd speculates on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/completions`
    Completions,
    /// `/v1/chat/completions`
    Chat,
}
