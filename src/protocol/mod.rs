//! The OpenAI-compatible wire types specd reads and writes: request bodies (with every
//! field specd does not read passed through untouched), the lax scalar reading vLLM's
//! request models use, and the response bodies of speculated requests.

pub mod lax;
pub mod request;
pub mod response;
