//! specd: a sidecar proxy that adds speculative decoding in front of an unmodified vLLM
//! or SGLang server.

pub mod bench;
pub mod config;
pub mod draft;
pub mod error;
pub mod metrics;
pub mod serve;
pub mod server;
pub mod sim;
pub mod spec;
pub mod tokens;
pub mod upstream;
