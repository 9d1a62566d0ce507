//! specd's benchmarks, kept out of the product crate: workload replay against specd and
//! its upstream (`replay`), the controller's field scenarios against the latency-model
//! upstream (`scenarios`), the suffix drafter's speed (`suffix`) and the draft model's
//! checks and speed (`draft_model`), and drafting across vocabularies (`xvocab`).

pub mod draft_model;
pub mod replay;
pub mod scenarios;
pub mod suffix;
pub mod xvocab;
