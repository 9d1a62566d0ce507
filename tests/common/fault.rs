//! The fake upstream (`specd_sim::Upstream`) as the tests run it: immediate timing, the
//! cyclic tokens (so direct output at any temperature is known and repeats in cycles the
//! n-gram drafter learns), and the test model's directory as its root, so that specd
//! detects it as vLLM serving the test model.

use std::sync::Arc;

use specd_sim::{Options, Timing, Tokens, Upstream};

pub const MODEL: &str = "specd-target";

/// `n` tokens of direct output after `prompt`.
pub fn continuation(prompt: &[u32], n: usize) -> Vec<u32> {
    Tokens::Cyclic.continuation(prompt, n)
}

fn options(tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>) -> Options {
    Options {
        listen: "127.0.0.1:0".parse().expect("address"),
        tokenizer: super::models_dir().join("target"),
        model: MODEL.into(),
        max_model_len: 2048,
        tokens: Tokens::Cyclic,
        timing: Timing::Immediate,
        tls,
    }
}

/// Start on 127.0.0.1, port 0.
pub async fn start() -> Upstream {
    Upstream::start(options(None))
        .await
        .expect("fake upstream with the test model's tokenizer (scripts/make_models.py)")
}

/// Start serving HTTPS with the given server configuration.
pub async fn start_tls(cfg: Arc<tokio_rustls::rustls::ServerConfig>) -> Upstream {
    Upstream::start(options(Some(cfg)))
        .await
        .expect("fake upstream with the test model's tokenizer (scripts/make_models.py)")
}
