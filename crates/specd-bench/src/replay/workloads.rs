//! Workloads the bench replays. Built-in sets are generated deterministically from a seed
//! and the embedded corpus (specd's own sources); files are JSONL, one request body per line.

use std::path::Path;

use serde_json::{json, Map, Value};

use super::corpus::{self, FILES};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Endpoint {
    Completions,
    Chat,
}

impl Endpoint {
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Completions => "/v1/completions",
            Endpoint::Chat => "/v1/chat/completions",
        }
    }
}

/// One request: the body without `model`, `stream` and `speculation` (the runner sets them).
#[derive(Debug, Clone)]
pub struct BenchRequest {
    pub endpoint: Endpoint,
    pub body: Map<String, Value>,
    /// Prompt length in tokens when it was measured while building the workload.
    pub prompt_tokens: Option<u32>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Workload {
    pub name: String,
    pub about: String,
    #[serde(skip)]
    pub requests: Vec<BenchRequest>,
    /// Sizes the set was designed with, and the sizes used after fitting the model's context.
    pub nominal_prompt_tokens: Option<u32>,
    pub nominal_max_tokens: Option<u32>,
    pub prompt_tokens_mean: Option<f64>,
    pub max_tokens_mean: f64,
    pub note: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("reading {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {msg}")]
    Line {
        path: String,
        line: usize,
        msg: String,
    },
    #[error("unknown workload '{0}'; built-in sets: {1}")]
    Unknown(String, String),
}

/// A built-in set: what it stands for and its nominal sizes (prompt, output) in tokens.
pub struct Builtin {
    pub name: &'static str,
    pub about: &'static str,
    pub prompt_tokens: u32,
    pub max_tokens: u32,
}

/// `max_tokens == 0` means "the long generation length" (`--long-tokens`).
pub const BUILTINS: &[Builtin] = &[
    Builtin { name: "code-edit", about: "rewrite part of a source file with one identifier renamed (output mostly copies the input)", prompt_tokens: 1200, max_tokens: 1200 },
    Builtin { name: "doc-qa", about: "question on a long document, answered by quoting it (short output)", prompt_tokens: 6000, max_tokens: 128 },
    Builtin { name: "summarise", about: "section-by-section summary of a long document quoting each section", prompt_tokens: 3000, max_tokens: 768 },
    Builtin { name: "multi-turn", about: "chat whose last turn asks to repeat and combine earlier answers", prompt_tokens: 1500, max_tokens: 512 },
    Builtin { name: "agent", about: "agent loop with repeated, slowly changing tool output (test logs, file reads)", prompt_tokens: 3000, max_tokens: 256 },
    Builtin { name: "open-short", about: "open-ended writing from a short prompt, short output (the hard case)", prompt_tokens: 64, max_tokens: 128 },
    Builtin { name: "open-long", about: "open-ended writing from a short prompt, long output", prompt_tokens: 64, max_tokens: 0 },
];

pub fn builtin(name: &str) -> Option<&'static Builtin> {
    BUILTINS.iter().find(|b| b.name == name)
}

pub fn builtin_names() -> String {
    BUILTINS
        .iter()
        .map(|b| b.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Tokens kept free below the context length (chat templates, rounding).
const CONTEXT_MARGIN: u32 = 16;

/// Fit nominal (prompt, output) sizes into `max_model_len`: shrink the prompt first while
/// the output takes at most half the context, otherwise scale both by the same factor.
pub fn fit_sizes(prompt: u32, output: u32, max_model_len: u32) -> (u32, u32) {
    let budget = max_model_len.saturating_sub(CONTEXT_MARGIN).max(2);
    if prompt + output <= budget {
        return (prompt, output);
    }
    if output <= budget / 2 {
        return (budget - output, output);
    }
    let f = f64::from(budget) / f64::from(prompt + output);
    let p = (f64::from(prompt) * f).floor().max(1.0) as u32;
    let o = (f64::from(output) * f).floor().max(1.0) as u32;
    (p, o)
}

fn name_seed(name: &str, seed: u64, i: usize) -> u64 {
    // FNV-1a of the name, mixed with the seed and the index.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (i as u64).wrapping_mul(0xd6e8_feb8_6659_fd93)
}

fn msg(role: &str, content: impl Into<String>) -> Value {
    json!({"role": role, "content": content.into()})
}

fn chat(messages: Vec<Value>, max_tokens: u32) -> BenchRequest {
    let mut body = Map::new();
    body.insert("messages".into(), Value::Array(messages));
    body.insert("max_tokens".into(), max_tokens.into());
    BenchRequest {
        endpoint: Endpoint::Chat,
        body,
        prompt_tokens: None,
    }
}

fn completion(prompt: String, max_tokens: u32) -> BenchRequest {
    let mut body = Map::new();
    body.insert("prompt".into(), prompt.into());
    body.insert("max_tokens".into(), max_tokens.into());
    BenchRequest {
        endpoint: Endpoint::Completions,
        body,
        prompt_tokens: None,
    }
}

const TOPICS: &[&str] = &[
    "why a proxy in front of a language model server might make answers arrive sooner",
    "what a good benchmark for a web service should measure",
    "how caches change the cost of repeated work",
    "the trade-off between latency and throughput in a busy service",
    "how to tell whether an optimisation really helped",
    "what makes an error message useful",
    "how a team should roll out a risky change to production",
    "why measurements on a laptop differ from measurements on a server",
    "the life of a request from a client to a GPU and back",
    "how to read a latency histogram",
    "what a sidecar process is and when to use one",
    "why small models are useful for testing large systems",
];

/// Request `i` of built-in set `b`, with a prompt of about `chars` characters and `max_tokens`.
pub fn make(b: &Builtin, i: usize, seed: u64, chars: usize, max_tokens: u32) -> BenchRequest {
    let mut rng = fastrand::Rng::with_seed(name_seed(b.name, seed, i));
    let secs = corpus::sections();
    match b.name {
        "code-edit" => {
            let (path, src) = FILES[rng.usize(..FILES.len())];
            let lang = if path.ends_with(".py") {
                "Python"
            } else {
                "Rust"
            };
            let start = rng.usize(..src.lines().count().max(1));
            let win = corpus::window(src, start, chars.saturating_sub(260).max(200));
            let ids = corpus::repeated_identifiers(&win);
            let old = if ids.is_empty() {
                "value".to_string()
            } else {
                ids[rng.usize(..ids.len())].clone()
            };
            let new = format!("{old}_{}", ["next", "v2", "local", "inner"][i % 4]);
            completion(
                format!(
                    "Below is part of the {lang} file `{path}`, then the same text after renaming `{old}` to `{new}`. Everything else stays exactly the same.\n\n--- {path} (before)\n{win}--- {path} (after)\n"
                ),
                max_tokens,
            )
        }
        "doc-qa" | "summarise" => {
            let doc = corpus::document(
                rng.usize(..secs.len().max(1)),
                chars.saturating_sub(300).max(200),
            );
            let task = if b.name == "doc-qa" {
                let sents: Vec<String> = doc
                    .split("\n\n")
                    .filter(|p| !p.starts_with("## "))
                    .flat_map(corpus::sentences)
                    .filter(|s| s.split_whitespace().count() >= 8)
                    .collect();
                let phrase = match sents.get(rng.usize(..sents.len().max(1))) {
                    Some(s) => {
                        let w: Vec<&str> = s.split_whitespace().collect();
                        let at = rng.usize(..w.len().saturating_sub(4).max(1));
                        w[at..(at + 4).min(w.len())].join(" ")
                    }
                    None => "the upstream".to_string(),
                };
                format!("Question: which sentence of the document mentions \"{phrase}\"? Quote it in full, then explain what it means in one sentence.")
            } else {
                "Summarise the document above. For every section, give its title, quote its first sentence exactly, then summarise the rest in your own words.".to_string()
            };
            chat(
                vec![
                    msg("system", "You answer questions about a document. Quote the document word for word where you can."),
                    msg("user", format!("{doc}\n{task}")),
                ],
                max_tokens,
            )
        }
        "multi-turn" => {
            let mut messages = vec![msg(
                "system",
                "You are a helpful assistant who knows the specd code base.",
            )];
            let mut used = 60;
            let first = rng.usize(..secs.len().max(1));
            let mut titles = Vec::new();
            for j in 0..secs.len() {
                let s = &secs[(first + j) % secs.len()];
                let q = format!("What does `{}` do?", s.title);
                let mut a = String::new();
                for p in &s.paragraphs {
                    if !a.is_empty() && a.len() + p.len() > 700 {
                        break;
                    }
                    a.push_str(p);
                    a.push('\n');
                }
                if titles.len() >= 2 && used + q.len() + a.len() + 200 > chars {
                    break;
                }
                used += q.len() + a.len() + 20;
                titles.push(s.title.clone());
                messages.push(msg("user", q));
                messages.push(msg("assistant", a));
            }
            let last = match i % 3 {
                0 => "Repeat your first answer word for word, then add one sentence about how it relates to your last answer.".to_string(),
                1 => "Put your previous two answers together into one answer, keeping their wording.".to_string(),
                _ => format!("Quote what you said about `{}` again, then explain it in simpler words.", titles[rng.usize(..titles.len())]),
            };
            messages.push(msg("user", last));
            chat(messages, max_tokens)
        }
        "agent" => agent(&mut rng, chars, max_tokens),
        _ => {
            // Open-ended: alternate completions (continue a paragraph) and chat (an essay).
            if i % 2 == 0 {
                let s = &secs[rng.usize(..secs.len().max(1))];
                let p = &s.paragraphs[rng.usize(..s.paragraphs.len().max(1))];
                let lead: Vec<String> = corpus::sentences(p).into_iter().take(2).collect();
                completion(format!("{}\n\n{}", s.title, lead.join(" ")), max_tokens)
            } else {
                let topic = TOPICS[rng.usize(..TOPICS.len())];
                chat(
                    vec![msg("user", format!("Write an essay about {topic}."))],
                    max_tokens,
                )
            }
        }
    }
}

/// A test log listing `names`, one failing (which one depends on `step`).
fn test_log(module: &str, names: &[String], step: usize) -> String {
    let fail = (step * 7 + 3) % names.len().max(1);
    let mut out = format!("running {} tests\n", names.len());
    for (j, n) in names.iter().enumerate() {
        let r = if j == fail { "FAILED" } else { "ok" };
        out.push_str(&format!("test {module}::tests::{n} ... {r}\n"));
    }
    out.push_str(&format!(
        "\ntest result: FAILED. {} passed; 1 failed; 0 ignored; finished in 0.{:02}s\n",
        names.len().saturating_sub(1),
        (step * 13) % 100
    ));
    out
}

fn agent(rng: &mut fastrand::Rng, chars: usize, max_tokens: u32) -> BenchRequest {
    let (path, src) = FILES[rng.usize(..FILES.len())];
    let module = path
        .trim_end_matches(".rs")
        .trim_end_matches(".py")
        .replace(['/', '.'], "::");
    let mut names = corpus::function_names(src);
    names.truncate(24);
    let mut messages = vec![
        msg("system", "You are a coding agent working on the specd repository. Each turn, reply with a Thought and one Action: run_tests, read_file <path> or edit_file <path>."),
        msg("user", "Task: make the test suite pass."),
    ];
    let mut used = 250;
    let mut step = 0;
    loop {
        let log = test_log(&module, &names, step);
        let failing = names
            .get((step * 7 + 3) % names.len().max(1))
            .cloned()
            .unwrap_or_default();
        let read = corpus::window(src, rng.usize(..src.lines().count().max(1)), 600);
        let turn = [
            msg(
                "assistant",
                "Thought: run the tests to see what fails.\nAction: run_tests",
            ),
            msg("user", format!("Observation:\n{log}")),
            msg(
                "assistant",
                format!("Thought: `{failing}` fails; read its file.\nAction: read_file {path}"),
            ),
            msg("user", format!("Observation:\n{read}")),
            msg(
                "assistant",
                format!(
                    "Thought: change `{failing}` so the test passes.\nAction: edit_file {path}"
                ),
            ),
            msg("user", format!("Observation:\nedited {path}")),
        ];
        let size: usize = log.len() + read.len() + 300;
        if step > 0 && used + size + log.len() > chars {
            break;
        }
        used += size;
        messages.extend(turn);
        step += 1;
    }
    messages.push(msg(
        "assistant",
        "Thought: run the tests again.\nAction: run_tests",
    ));
    messages.push(msg(
        "user",
        format!("Observation:\n{}", test_log(&module, &names, step)),
    ));
    chat(messages, max_tokens)
}

/// Read a JSONL file: each line a completions body (`prompt`) or a chat body (`messages`),
/// optionally with a `workload` field naming its group (default: the file's stem).
pub fn load_jsonl(path: &Path, default_max_tokens: u32) -> Result<Vec<Workload>, WorkloadError> {
    let p = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| WorkloadError::Io {
        path: p.clone(),
        source,
    })?;
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".into());
    let mut out: Vec<Workload> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let err = |msg: String| WorkloadError::Line {
            path: p.clone(),
            line: n + 1,
            msg,
        };
        let mut body = match serde_json::from_str::<Value>(line) {
            Ok(Value::Object(m)) => m,
            Ok(_) => return Err(err("not a JSON object".into())),
            Err(e) => return Err(err(e.to_string())),
        };
        let group = match body.remove("workload") {
            Some(Value::String(s)) => s,
            None | Some(Value::Null) => stem.clone(),
            Some(_) => return Err(err("'workload' must be a string".into())),
        };
        let endpoint = if body.contains_key("messages") {
            Endpoint::Chat
        } else if body.contains_key("prompt") {
            Endpoint::Completions
        } else {
            return Err(err(
                "needs 'prompt' (completions) or 'messages' (chat)".into()
            ));
        };
        if body.get("max_tokens").is_none_or(Value::is_null)
            && body.get("max_completion_tokens").is_none_or(Value::is_null)
        {
            body.insert("max_tokens".into(), default_max_tokens.into());
        }
        for k in ["stream", "stream_options", "speculation"] {
            body.remove(k);
        }
        let req = BenchRequest {
            endpoint,
            body,
            prompt_tokens: None,
        };
        match out.iter_mut().find(|w| w.name == group) {
            Some(w) => w.requests.push(req),
            None => out.push(Workload {
                name: group,
                about: format!("requests from {p}"),
                requests: vec![req],
                nominal_prompt_tokens: None,
                nominal_max_tokens: None,
                prompt_tokens_mean: None,
                max_tokens_mean: 0.0,
                note: None,
            }),
        }
    }
    for w in &mut out {
        w.max_tokens_mean = mean_max_tokens(&w.requests);
    }
    Ok(out)
}

pub fn max_tokens_of(body: &Map<String, Value>) -> Option<u64> {
    body.get("max_completion_tokens")
        .and_then(Value::as_u64)
        .or_else(|| body.get("max_tokens").and_then(Value::as_u64))
}

pub fn mean_max_tokens(reqs: &[BenchRequest]) -> f64 {
    if reqs.is_empty() {
        return 0.0;
    }
    reqs.iter()
        .map(|r| max_tokens_of(&r.body).unwrap_or(0) as f64)
        .sum::<f64>()
        / reqs.len() as f64
}

/// The workloads as JSONL (one body per line with its `workload` field), readable by
/// [`load_jsonl`].
pub fn to_jsonl(workloads: &[Workload]) -> String {
    let mut out = String::new();
    for w in workloads {
        for r in &w.requests {
            let mut b = Map::new();
            b.insert("workload".into(), w.name.clone().into());
            b.extend(r.body.clone());
            out.push_str(&Value::Object(b).to_string());
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_fit_the_context() {
        assert_eq!(fit_sizes(1000, 200, 4096), (1000, 200));
        assert_eq!(fit_sizes(6000, 128, 2048), (2048 - 16 - 128, 128));
        let (p, o) = fit_sizes(64, 2048, 2048);
        assert!(p + o <= 2032 && o > 1900, "{p} {o}");
        for (p, o) in [(1200, 1200), (3000, 768), (1, 1)] {
            let (a, b) = fit_sizes(p, o, 2048);
            assert!(a + b <= 2032 && a >= 1 && b >= 1);
        }
    }

    #[test]
    fn builtins_are_deterministic_and_sized() {
        for b in BUILTINS {
            let chars = 4000;
            let r1 = make(b, 3, 1, chars, 100);
            let r2 = make(b, 3, 1, chars, 100);
            assert_eq!(r1.body, r2.body, "{}", b.name);
            let other = make(b, 4, 1, chars, 100);
            assert_ne!(r1.body, other.body, "{} varies with the index", b.name);
            let len = Value::Object(r1.body.clone()).to_string().len();
            let cap = if b.prompt_tokens < 100 {
                2000
            } else {
                chars + 1200
            };
            assert!(len <= cap, "{}: {len} > {cap}", b.name);
            assert_eq!(max_tokens_of(&r1.body), Some(100));
        }
        let big = make(builtin("summarise").expect("exists"), 0, 1, 12_000, 1);
        let small = make(builtin("summarise").expect("exists"), 0, 1, 3_000, 1);
        assert!(
            Value::Object(big.body).to_string().len()
                > 2 * Value::Object(small.body).to_string().len()
        );
    }

    #[test]
    fn agent_repeats_tool_output() {
        let r = make(builtin("agent").expect("exists"), 0, 1, 8000, 10);
        let msgs = r.body["messages"].as_array().expect("messages");
        let logs = msgs
            .iter()
            .filter(|m| {
                m["content"]
                    .as_str()
                    .is_some_and(|c| c.contains("running "))
            })
            .count();
        assert!(logs >= 3, "{logs} test logs");
    }

    #[test]
    fn jsonl_round_trip() {
        let w = vec![Workload {
            name: "x".into(),
            about: String::new(),
            requests: vec![
                completion("hello".into(), 5),
                chat(vec![msg("user", "hi")], 7),
            ],
            nominal_prompt_tokens: None,
            nominal_max_tokens: None,
            prompt_tokens_mean: None,
            max_tokens_mean: 6.0,
            note: None,
        }];
        let dir = std::env::temp_dir().join(format!("specd-bench-{}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).expect("tmp");
        let f = dir.join("set.jsonl");
        std::fs::write(
            &f,
            format!("# comment\n{}\n{{\"prompt\": \"p\"}}\n", to_jsonl(&w)),
        )
        .expect("write");
        let back = load_jsonl(&f, 33).expect("load");
        assert_eq!(back.len(), 2);
        assert_eq!(back[0].name, "x");
        assert_eq!(back[0].requests.len(), 2);
        assert_eq!(back[0].requests[1].endpoint, Endpoint::Chat);
        assert_eq!(back[1].name, "set");
        assert_eq!(max_tokens_of(&back[1].requests[0].body), Some(33));
        std::fs::write(&f, "{\"nothing\": 1}\n").expect("write");
        assert!(matches!(
            load_jsonl(&f, 1),
            Err(WorkloadError::Line { line: 1, .. })
        ));
        let _ = std::fs::remove_dir_all(dir);
    }
}
