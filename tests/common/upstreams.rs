//! The real upstreams the tests run against, each started once per machine by its script
//! (scripts/vllm-cpu-upstream.sh, scripts/sglang-cpu-upstream.sh) and reused across test
//! processes, unless an environment variable names a running one.

use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};

/// URL of the real vLLM test upstream (`SPECD_TEST_UPSTREAM`, or started by the script).
pub fn upstream() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        if let Ok(u) = std::env::var("SPECD_TEST_UPSTREAM") {
            return u;
        }
        let root = env!("CARGO_MANIFEST_DIR");
        let out = Command::new("bash")
            .arg(format!("{root}/scripts/vllm-cpu-upstream.sh"))
            .arg("start")
            .stderr(Stdio::inherit())
            .output()
            .expect("run scripts/vllm-cpu-upstream.sh");
        assert!(out.status.success(), "the vLLM test upstream did not start");
        let stdout = String::from_utf8_lossy(&out.stdout);
        stdout
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("UPSTREAM="))
            .expect("script prints UPSTREAM=")
            .trim()
            .to_string()
    })
    .clone()
}

/// The test models' folder, as scripts/vllm-cpu-upstream.sh builds it: `SPECD_MODELS_DIR`,
/// else `SPECD_CACHE_DIR`/models, else ~/.cache/specd/models.
pub fn models_dir() -> std::path::PathBuf {
    if let Some(d) = std::env::var_os("SPECD_MODELS_DIR") {
        return d.into();
    }
    specd::config::cache_dir().join("models")
}

/// URL of the real SGLang test upstream (`SPECD_TEST_SGLANG_UPSTREAM`, or started by
/// scripts/sglang-cpu-upstream.sh, which reuses a running instance).
pub fn sglang_upstream() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        if let Ok(u) = std::env::var("SPECD_TEST_SGLANG_UPSTREAM") {
            return u;
        }
        let root = env!("CARGO_MANIFEST_DIR");
        let out = Command::new("bash")
            .arg(format!("{root}/scripts/sglang-cpu-upstream.sh"))
            .arg("start")
            .stderr(Stdio::inherit())
            .output()
            .expect("run scripts/sglang-cpu-upstream.sh");
        assert!(
            out.status.success(),
            "the SGLang test upstream did not start"
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        stdout
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("UPSTREAM="))
            .expect("script prints UPSTREAM=")
            .trim()
            .to_string()
    })
    .clone()
}

/// URL of a real vLLM serving the `agent` model (scripts/train_agent.py) in float32
/// with `--reasoning-parser PARSER`: `SPECD_TEST_REASONING_UPSTREAM` (a running server,
/// for `deepseek_r1`), else started by scripts/vllm-cpu-upstream.sh as its own named
/// server `specd-agent-PARSER` (reused across test processes, ~100 s to start).
pub fn reasoning_upstream(parser: &str) -> String {
    let given = std::env::var("SPECD_TEST_REASONING_UPSTREAM").ok();
    if let Some(u) = given.filter(|_| parser == "deepseek_r1") {
        return u;
    }
    named_upstream(
        "agent",
        &format!("specd-agent-{parser}"),
        &format!("--dtype float32 --reasoning-parser {parser}"),
    )
}

/// URL of a real vLLM serving the `agent-tools` model (scripts/train_tools.py) in
/// float32 with `--enable-auto-tool-choice --tool-call-parser PARSER` (and
/// `--reasoning-parser REASONING` when given): `SPECD_TEST_TOOLS_UPSTREAM` (or
/// `SPECD_TEST_TOOLS_REASONING_UPSTREAM` with a reasoning parser), else started by
/// scripts/vllm-cpu-upstream.sh as its own named server `specd-agent-tools-PARSER`
/// (`…-PARSER-REASONING`), reused across test processes.
pub fn tools_upstream(parser: &str, reasoning: Option<&str>) -> String {
    let var = match reasoning {
        None => "SPECD_TEST_TOOLS_UPSTREAM",
        Some(_) => "SPECD_TEST_TOOLS_REASONING_UPSTREAM",
    };
    if let Ok(u) = std::env::var(var) {
        return u;
    }
    let mut served = format!("specd-agent-tools-{parser}");
    let mut extra =
        format!("--dtype float32 --enable-auto-tool-choice --tool-call-parser {parser}");
    if let Some(r) = reasoning {
        served.push_str(&format!("-{r}"));
        extra.push_str(&format!(" --reasoning-parser {r}"));
    }
    named_upstream("agent-tools", &served, &extra)
}

/// URL of a real vLLM serving the `agent-tools-kimi` model (scripts/train_tools_kimi.py)
/// in float32 with `--enable-auto-tool-choice --tool-call-parser kimi_k2` (and
/// `--reasoning-parser kimi_k2` with `reasoning`): `SPECD_TEST_KIMI_TOOLS_UPSTREAM` (or
/// `SPECD_TEST_KIMI_TOOLS_REASONING_UPSTREAM`), else started by
/// scripts/vllm-cpu-upstream.sh as its own named server (`kimi_tools_served`).
pub fn kimi_tools_upstream(reasoning: bool) -> String {
    if let Ok(u) = std::env::var(kimi_tools_var(reasoning)) {
        return u;
    }
    let mut extra =
        "--dtype float32 --enable-auto-tool-choice --tool-call-parser kimi_k2".to_string();
    if reasoning {
        extra.push_str(" --reasoning-parser kimi_k2");
    }
    named_upstream(KIMI_TOOLS_MODEL, &kimi_tools_served(reasoning), &extra)
}

pub const KIMI_TOOLS_MODEL: &str = "agent-tools-kimi";

pub fn kimi_tools_served(reasoning: bool) -> String {
    let mut s = "specd-agent-tools-kimi-kimi_k2".to_string();
    if reasoning {
        s.push_str("-kimi_k2");
    }
    s
}

fn kimi_tools_var(reasoning: bool) -> &'static str {
    if reasoning {
        "SPECD_TEST_KIMI_TOOLS_REASONING_UPSTREAM"
    } else {
        "SPECD_TEST_KIMI_TOOLS_UPSTREAM"
    }
}

/// Stops a kimi_k2 tools server when dropped (one test uses each; its memory goes back
/// to the servers of the tests still running), unless the environment gave it.
pub struct StopKimiTools(pub bool);

impl Drop for StopKimiTools {
    fn drop(&mut self) {
        if std::env::var(kimi_tools_var(self.0)).is_ok() {
            return;
        }
        let root = env!("CARGO_MANIFEST_DIR");
        let _ = Command::new("bash")
            .arg(format!("{root}/scripts/vllm-cpu-upstream.sh"))
            .arg("stop")
            .env("SPECD_VLLM_MODEL", KIMI_TOOLS_MODEL)
            .env("SPECD_VLLM_SERVED_NAME", kimi_tools_served(self.0))
            .stderr(Stdio::inherit())
            .output();
    }
}

/// URL of a real vLLM serving the `agent-tools-qwen3coder` model
/// (scripts/train_tools_qwen3coder.py) in float32 with `--enable-auto-tool-choice
/// --tool-call-parser qwen3_coder` (and `--reasoning-parser REASONING` when given):
/// `SPECD_TEST_QWEN3_CODER_TOOLS_UPSTREAM` (`…_QWEN3_UPSTREAM`, `…_DEEPSEEK_R1_UPSTREAM`
/// with a reasoning parser), else started by scripts/vllm-cpu-upstream.sh as its own
/// named server (`qwen3_coder_tools_served`).
pub fn qwen3_coder_tools_upstream(reasoning: Option<&str>) -> String {
    if let Ok(u) = std::env::var(qwen3_coder_tools_var(reasoning)) {
        return u;
    }
    let mut extra =
        "--dtype float32 --enable-auto-tool-choice --tool-call-parser qwen3_coder".to_string();
    if let Some(r) = reasoning {
        extra.push_str(&format!(" --reasoning-parser {r}"));
    }
    named_upstream(
        QWEN3_CODER_TOOLS_MODEL,
        &qwen3_coder_tools_served(reasoning),
        &extra,
    )
}

pub const QWEN3_CODER_TOOLS_MODEL: &str = "agent-tools-qwen3coder";

pub fn qwen3_coder_tools_served(reasoning: Option<&str>) -> String {
    // Short: vLLM's IPC socket paths under the server's folder must fit in 107 bytes.
    let mut s = "specd-qwen3coder".to_string();
    if let Some(r) = reasoning {
        s.push_str(&format!("-{r}"));
    }
    s
}

fn qwen3_coder_tools_var(reasoning: Option<&str>) -> String {
    let mut v = "SPECD_TEST_QWEN3_CODER_TOOLS".to_string();
    if let Some(r) = reasoning {
        v.push_str(&format!("_{}", r.to_uppercase()));
    }
    v + "_UPSTREAM"
}

/// Stops a qwen3_coder tools server when dropped (one test uses each), unless the
/// environment gave it.
pub struct StopQwen3CoderTools(pub Option<&'static str>);

impl Drop for StopQwen3CoderTools {
    fn drop(&mut self) {
        if std::env::var(qwen3_coder_tools_var(self.0)).is_ok() {
            return;
        }
        let root = env!("CARGO_MANIFEST_DIR");
        let _ = Command::new("bash")
            .arg(format!("{root}/scripts/vllm-cpu-upstream.sh"))
            .arg("stop")
            .env("SPECD_VLLM_MODEL", QWEN3_CODER_TOOLS_MODEL)
            .env("SPECD_VLLM_SERVED_NAME", qwen3_coder_tools_served(self.0))
            .stderr(Stdio::inherit())
            .output();
    }
}

/// URL of a real vLLM serving the `agent-tools-llama3` model
/// (scripts/train_tools_llama3.py) in float32 with `--enable-auto-tool-choice
/// --tool-call-parser llama3_json`: `SPECD_TEST_LLAMA3_TOOLS_UPSTREAM`, else started by
/// scripts/vllm-cpu-upstream.sh as its own named server (`LLAMA3_TOOLS_SERVED`).
pub fn llama3_tools_upstream() -> String {
    if let Ok(u) = std::env::var(LLAMA3_TOOLS_VAR) {
        return u;
    }
    let extra = "--dtype float32 --enable-auto-tool-choice --tool-call-parser llama3_json";
    named_upstream(LLAMA3_TOOLS_MODEL, LLAMA3_TOOLS_SERVED, extra)
}

pub const LLAMA3_TOOLS_MODEL: &str = "agent-tools-llama3";
pub const LLAMA3_TOOLS_SERVED: &str = "specd-agent-tools-llama3-llama3_json";
const LLAMA3_TOOLS_VAR: &str = "SPECD_TEST_LLAMA3_TOOLS_UPSTREAM";

/// Stops the llama3_json tools server when dropped (one test uses it), unless the
/// environment gave it.
pub struct StopLlama3Tools;

impl Drop for StopLlama3Tools {
    fn drop(&mut self) {
        if std::env::var(LLAMA3_TOOLS_VAR).is_ok() {
            return;
        }
        let root = env!("CARGO_MANIFEST_DIR");
        let _ = Command::new("bash")
            .arg(format!("{root}/scripts/vllm-cpu-upstream.sh"))
            .arg("stop")
            .env("SPECD_VLLM_MODEL", LLAMA3_TOOLS_MODEL)
            .env("SPECD_VLLM_SERVED_NAME", LLAMA3_TOOLS_SERVED)
            .stderr(Stdio::inherit())
            .output();
    }
}

/// Stop the `agent` server of a reasoning parser that only one test uses, so that its
/// memory is free for the servers of the tests still running (a 24 GiB machine ran out
/// with eight vLLM servers of the test models and SGLang up at once). Not the shared
/// `deepseek_r1` one.
#[allow(dead_code)]
pub fn stop_reasoning_upstream(parser: &str) {
    if parser == "deepseek_r1" {
        return;
    }
    let root = env!("CARGO_MANIFEST_DIR");
    let _ = Command::new("bash")
        .arg(format!("{root}/scripts/vllm-cpu-upstream.sh"))
        .arg("stop")
        .env("SPECD_VLLM_MODEL", "agent")
        .env("SPECD_VLLM_SERVED_NAME", format!("specd-agent-{parser}"))
        .stderr(Stdio::inherit())
        .output();
}

/// A vLLM of its own serving `model` as `served` with `extra` arguments, started once
/// per process by scripts/vllm-cpu-upstream.sh (which reuses a running one).
fn named_upstream(model: &str, served: &str, extra: &str) -> String {
    static URLS: OnceLock<Mutex<std::collections::HashMap<String, String>>> = OnceLock::new();
    let urls = URLS.get_or_init(Default::default);
    let mut urls = urls.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(u) = urls.get(served) {
        return u.clone();
    }
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new("bash")
        .arg(format!("{root}/scripts/vllm-cpu-upstream.sh"))
        .arg("start")
        .env("SPECD_VLLM_MODEL", model)
        .env("SPECD_VLLM_SERVED_NAME", served)
        .env("SPECD_VLLM_EXTRA_ARGS", extra)
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/vllm-cpu-upstream.sh");
    assert!(
        out.status.success(),
        "the {served} vLLM upstream did not start"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let url = stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("UPSTREAM="))
        .expect("script prints UPSTREAM=")
        .trim()
        .to_string();
    urls.insert(served.to_string(), url.clone());
    url
}

/// URL of a real SGLang serving the `agent-tools` model in float32 with
/// `--tool-call-parser hermes` (and `--reasoning-parser deepseek-r1` with `reasoning`):
/// `SPECD_TEST_SGLANG_TOOLS_UPSTREAM` (`SPECD_TEST_SGLANG_TOOLS_REASONING_UPSTREAM`), else
/// started by scripts/sglang-cpu-upstream.sh as its own named server
/// (`sglang_tools_served`), reused across test processes.
#[allow(dead_code)]
pub fn sglang_tools_upstream(reasoning: bool) -> String {
    let var = match reasoning {
        false => "SPECD_TEST_SGLANG_TOOLS_UPSTREAM",
        true => "SPECD_TEST_SGLANG_TOOLS_REASONING_UPSTREAM",
    };
    if let Ok(u) = std::env::var(var) {
        return u;
    }
    let mut extra = "--dtype float32 --tool-call-parser hermes".to_string();
    if reasoning {
        extra.push_str(" --reasoning-parser deepseek-r1");
    }
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new("bash")
        .arg(format!("{root}/scripts/sglang-cpu-upstream.sh"))
        .arg("start")
        .env("SPECD_SGLANG_MODEL", "agent-tools")
        .env("SPECD_SGLANG_SERVED_NAME", sglang_tools_served(reasoning))
        .env("SPECD_SGLANG_EXTRA_ARGS", extra)
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/sglang-cpu-upstream.sh");
    assert!(
        out.status.success(),
        "the SGLang tools upstream did not start"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("UPSTREAM="))
        .expect("script prints UPSTREAM=")
        .trim()
        .to_string()
}

#[allow(dead_code)]
pub fn sglang_tools_served(reasoning: bool) -> &'static str {
    match reasoning {
        false => "specd-sglang-agent-tools-hermes",
        true => "specd-sglang-agent-tools-hermes-deepseek-r1",
    }
}
