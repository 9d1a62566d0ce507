//! Speculation: request intake and the passthrough policy, the per-stream round loop,
//! acceptance, the controller and the OpenAI-shaped output.

pub mod accept;
pub mod controller;
pub mod generation;
pub mod limits;
pub mod output;
pub mod policy;
pub mod reasoning;
pub mod request;
pub mod session;
pub mod tools;
