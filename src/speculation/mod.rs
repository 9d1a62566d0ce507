//! Speculation: request intake, the per-stream round loop, acceptance, the controller and
//! the OpenAI-shaped output.

pub mod accept;
pub mod controller;
pub mod generation;
pub mod output;
pub mod request;
pub mod session;
