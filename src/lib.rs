//! specd: a sidecar proxy that adds speculative decoding in front of an unmodified vLLM
//! or SGLang server.

pub mod config;
pub mod draft;
pub mod error;
pub mod inflight;
pub mod inline;
pub mod metrics;
pub mod protocol;
pub mod serve;
pub mod server;
pub mod speculation;
pub mod tokens;
pub mod upstream;
