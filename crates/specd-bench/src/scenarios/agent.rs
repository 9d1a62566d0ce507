//! The `agent` scenario: tool-calling conversations shaped like the transcripts the
//! `agent-tools` test model was trained on (scripts/train_tools.py) — `tools` in every
//! request, hermes calls with JSON arguments, the tools' results in the next turn, final
//! answers that quote them — sent as an agent loop sends them: the question (the model
//! calls a tool), then the question with the call and its results (the model answers,
//! quoting them). Earlier finished exchanges make up the history, so later turns carry
//! tool output seen before, where suffix drafting pays most.

use serde_json::{json, Value};

const CITIES: &[&str] = &[
    "Paris", "Rome", "Oslo", "Lima", "Cairo", "Tokyo", "Quito", "Delhi", "Berlin", "Madrid",
];
const SKIES: &[&str] = &["sunny", "cloudy", "rainy", "windy", "foggy"];
const WORDS: &[&str] = &[
    "river", "stone", "cloud", "apple", "table", "green", "quiet", "window", "paper", "light",
    "garden", "seven", "orange", "silver", "winter", "music", "bridge", "candle", "forest",
    "little",
];

fn tool(name: &str, description: &str, params: Value) -> Value {
    let required: Vec<&String> = params
        .as_object()
        .map(|p| p.keys().collect())
        .unwrap_or_default();
    json!({"type": "function", "function": {"name": name, "description": description,
           "parameters": {"type": "object", "properties": params, "required": required}}})
}

/// The tools `agent-tools` was trained with.
pub fn tools() -> Value {
    json!([
        tool(
            "get_weather",
            "the weather in a city",
            json!({"city": {"type": "string"}})
        ),
        tool(
            "add",
            "the sum of two numbers",
            json!({"a": {"type": "number"}, "b": {"type": "number"}})
        ),
        tool(
            "search",
            "search the notes",
            json!({"query": {"type": "string"}})
        ),
    ])
}

/// A question, the calls that answer it with their results, and the answer quoting them.
struct Task {
    question: String,
    calls: Vec<(&'static str, Value)>,
    results: Vec<Value>,
    answer: String,
}

fn words(rng: &mut fastrand::Rng, n: usize) -> String {
    (0..n)
        .map(|_| WORDS[rng.usize(..WORDS.len())])
        .collect::<Vec<_>>()
        .join(" ")
}

fn task(rng: &mut fastrand::Rng) -> Task {
    let city = |rng: &mut fastrand::Rng| CITIES[rng.usize(..CITIES.len())];
    let sky = |rng: &mut fastrand::Rng| SKIES[rng.usize(..SKIES.len())];
    match rng.usize(..4) {
        0 => {
            let (c, t, s) = (city(rng), rng.i32(-5..35), sky(rng));
            Task {
                question: format!("What is the weather in {c}?"),
                calls: vec![("get_weather", json!({"city": c}))],
                results: vec![json!({"city": c, "temperature": t, "sky": s})],
                answer: format!("It is {t} degrees and {s} in {c}."),
            }
        }
        1 => {
            let (a, b) = (rng.u32(2..90), rng.u32(2..60));
            Task {
                question: format!("What is {a} plus {b}?"),
                calls: vec![("add", json!({"a": a, "b": b}))],
                results: vec![json!({"sum": a + b})],
                answer: format!("{a} plus {b} is {}.", a + b),
            }
        }
        2 => {
            let n = rng.usize(1..4);
            let q = words(rng, n);
            let hits = [words(rng, 2), words(rng, 2)];
            Task {
                question: format!("Search my notes for {q}."),
                calls: vec![("search", json!({"query": q}))],
                results: vec![json!({"results": hits})],
                answer: format!("I found {} and {}.", hits[0], hits[1]),
            }
        }
        _ => {
            let (c1, c2) = (city(rng), city(rng));
            let (t1, t2) = (rng.i32(-5..35), rng.i32(-5..35));
            Task {
                question: format!("Compare the weather in {c1} and {c2}."),
                calls: vec![
                    ("get_weather", json!({"city": c1})),
                    ("get_weather", json!({"city": c2})),
                ],
                results: vec![
                    json!({"city": c1, "temperature": t1, "sky": sky(rng)}),
                    json!({"city": c2, "temperature": t2, "sky": sky(rng)}),
                ],
                answer: format!("{c1} has {t1} degrees and {c2} has {t2}."),
            }
        }
    }
}

/// The question, the assistant's calls and the tools' results (ids `call_K_J`).
fn called(t: &Task, k: usize) -> Vec<Value> {
    let id = |j: usize| format!("call_{k}_{j}");
    let calls: Vec<Value> = (t.calls.iter().enumerate())
        .map(|(j, (name, args))| {
            json!({"id": id(j), "type": "function",
                   "function": {"name": name, "arguments": args.to_string()}})
        })
        .collect();
    let mut out = vec![
        json!({"role": "user", "content": t.question}),
        json!({"role": "assistant", "content": null, "tool_calls": calls}),
    ];
    for (j, r) in t.results.iter().enumerate() {
        out.push(json!({"role": "tool", "tool_call_id": id(j), "content": r.to_string()}));
    }
    out
}

/// One agent loop's requests, in order, for `model` with `max_tokens` each: 0–2 finished
/// exchanges as history, then the new question (answered with calls), then the question
/// with its calls and results (answered by quoting them). Deterministic in `seed`.
pub fn episode(model: &str, max_tokens: u32, seed: u64) -> Vec<Value> {
    let mut rng = fastrand::Rng::with_seed(seed ^ 0xa9e7);
    let mut history = Vec::new();
    for k in 0..rng.usize(0..3) {
        let t = task(&mut rng);
        history.extend(called(&t, k));
        history.push(json!({"role": "assistant", "content": t.answer}));
    }
    let t = task(&mut rng);
    let k = history.len();
    let turn = called(&t, k);
    let body = |messages: Vec<Value>| {
        json!({"model": model, "messages": messages, "tools": tools(), "tool_choice": "auto",
               "max_tokens": max_tokens, "temperature": 0})
    };
    let ask: Vec<Value> = history.iter().chain(&turn[..1]).cloned().collect();
    let answer: Vec<Value> = history.into_iter().chain(turn).collect();
    vec![body(ask), body(answer)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn episodes_call_then_quote_the_results() {
        let e = episode("m", 64, 7);
        assert_eq!(e, episode("m", 64, 7));
        assert_ne!(e, episode("m", 64, 8));
        assert_eq!(e.len(), 2);
        let ask = e[0]["messages"].as_array().expect("messages");
        let answer = e[1]["messages"].as_array().expect("messages");
        assert_eq!(ask.last().expect("question")["role"], "user");
        assert_eq!(answer.last().expect("result")["role"], "tool");
        assert!(answer.starts_with(ask));
        assert!(e
            .iter()
            .all(|b| b["tools"].as_array().is_some_and(|t| t.len() == 3)));
        let with_history = (0..20)
            .map(|s| episode("m", 64, s))
            .filter(|e| e[0]["messages"].as_array().is_some_and(|m| m.len() > 1))
            .count();
        assert!(
            (5..20).contains(&with_history),
            "{with_history} of 20 have history"
        );
    }
}
