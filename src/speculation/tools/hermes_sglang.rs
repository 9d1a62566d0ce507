//! SGLang 0.5.23's `hermes` tool parser (`srt/function_call/hermes_detector.py` on
//! `base_format_detector.py`), reproduced step for step. It reads the same
//! `<tool_call>{"name": …, "arguments": …}</tool_call>` markup as vLLM's, differently:
//! - a whole answer: the content is the text before the first `<tool_call>`,
//!   whitespace-stripped; a call naming a function outside the request's tools is
//!   dropped; `parameters` (when truthy) stands for `arguments`; one region that is not
//!   JSON leaves the whole text as content.
//! - a stream: fed the text of each chunk, it reads the open call with a partial-JSON
//!   reader (`partial_json.rs`), sends the name first, then argument text as the common
//!   prefix of successive readings, and the rest once the call's JSON is complete.

use super::hermes::regions;
use super::partial_json;
use super::pyjson::{self, PyValue};
use super::{Call, CallDelta, Extracted, StreamDelta};

const START: &str = "<tool_call>";
const END: &str = "</tool_call>";

/// `detect_and_parse` as `_process_tool_calls` uses it: `None` where the text holds no
/// `<tool_call>` (the caller keeps its text as it is).
pub fn extract(text: &str, names: &[String]) -> Option<Extracted> {
    let idx = text.find(START)?;
    let normal = super::hermes::strip(&text[..idx]).to_string();
    let mut calls = Vec::new();
    for raw in regions(text) {
        if raw.is_empty() {
            continue;
        }
        let Some(v) = pyjson::loads(super::hermes::strip(raw)) else {
            // Any error: no calls, the whole text is content.
            return Some(Extracted::text(text));
        };
        let acts = match v {
            PyValue::List(items) => items,
            one => vec![one],
        };
        for act in &acts {
            match call_of(act, names) {
                Ok(Some(c)) => calls.push(c),
                Ok(None) => {}
                Err(()) => return Some(Extracted::text(text)),
            }
        }
    }
    Some(Extracted {
        content: Some(normal),
        calls,
    })
}

/// `parse_base_json` of one action: `Ok(None)` for a call to an unknown function,
/// `Err` where Python raises (not an object, an unhashable name).
fn call_of(act: &PyValue, names: &[String]) -> Result<Option<Call>, ()> {
    let PyValue::Dict(_) = act else {
        return Err(());
    };
    let name = match act.get("name") {
        Some(PyValue::Str(n)) if !n.is_empty() => n,
        Some(PyValue::List(_) | PyValue::Dict(_)) => return Err(()),
        _ => return Ok(None),
    };
    if !names.contains(name) {
        return Ok(None);
    }
    let args = match act.get("parameters").filter(|v| truthy(v)) {
        Some(p) => p.clone(),
        None => act
            .get("arguments")
            .cloned()
            .unwrap_or(PyValue::Dict(Vec::new())),
    };
    Ok(Some(Call {
        id: None,
        name: name.clone(),
        arguments: pyjson::dumps(&args),
    }))
}

fn truthy(v: &PyValue) -> bool {
    match v {
        PyValue::Null => false,
        PyValue::Bool(b) => *b,
        PyValue::Int(s) => !s.trim_start_matches('-').trim_start_matches('0').is_empty(),
        PyValue::Float(f) => *f != 0.0,
        PyValue::Str(s) => !s.is_empty(),
        PyValue::List(l) => !l.is_empty(),
        PyValue::Dict(d) => !d.is_empty(),
    }
}

/// `_ends_with_partial_token`: the shortest end of `buffer` that starts `token`.
fn partial_len(buffer: &str, token: &str) -> usize {
    let chars: Vec<char> = buffer.chars().collect();
    let max = (chars.len() + 1).min(token.chars().count());
    (1..max)
        .find(|&i| {
            let tail: String = chars[chars.len() - i..].iter().collect();
            token.starts_with(&tail)
        })
        .unwrap_or(0)
}

/// Drop the last `n` characters of `s`, returning them.
fn split_tail(s: &mut String, n: usize) -> String {
    let at = s
        .char_indices()
        .rev()
        .nth(n.saturating_sub(1))
        .map_or(0, |(i, _)| i);
    if n == 0 {
        return String::new();
    }
    s.split_off(at)
}

/// The detector's streaming state for one answer.
#[derive(Debug, Clone, Default)]
pub struct Stream {
    names: Vec<String>,
    buffer: String,
    normal_buffer: String,
    /// `prev_tool_call_arr`: the last reading of each call's arguments (`None`: read
    /// without arguments).
    prev: Vec<Option<PyValue>>,
    current: i64,
    name_sent: bool,
    streamed: Vec<String>,
    /// The call pieces sent: a stop then reads `"tool_calls"`.
    pub called: bool,
}

impl Stream {
    pub fn new(names: Vec<String>) -> Self {
        Stream {
            names,
            current: -1,
            ..Stream::default()
        }
    }

    /// `parse_stream_chunk(new_text)`: the content and call pieces it adds.
    pub fn step(&mut self, new_text: &str) -> StreamDelta {
        self.buffer.push_str(new_text);
        let mut d = StreamDelta::default();
        if !self.buffer.contains(START) {
            let n = partial_len(&self.buffer, START);
            let mut safe = std::mem::take(&mut self.buffer);
            self.buffer = split_tail(&mut safe, n);
            d.content = Some(self.clean(&safe)).filter(|c| !c.is_empty());
            return d;
        }
        let bot = self.buffer.find(START).unwrap_or(0);
        if bot > 0 {
            let normal = self.buffer[..bot].to_string();
            self.buffer.drain(..bot);
            d.content = Some(normal);
            return d;
        }
        if let Some(c) = self.base_step() {
            self.called = true;
            d.calls.push(c);
        }
        d
    }

    /// `_clean_normal_text`.
    fn clean(&mut self, text: &str) -> String {
        if text.is_empty() {
            return String::new();
        }
        self.normal_buffer.push_str(text);
        if self.normal_buffer.contains(END) {
            let cleaned = self.normal_buffer.replace(END, "");
            self.normal_buffer.clear();
            return cleaned;
        }
        let n = partial_len(&self.normal_buffer, END);
        let mut safe = std::mem::take(&mut self.normal_buffer);
        self.normal_buffer = split_tail(&mut safe, n);
        safe
    }

    /// `BaseFormatDetector.parse_streaming_increment("")` on a buffer that starts with
    /// `<tool_call>`: at most one call piece (normal text never comes out of it here).
    fn base_step(&mut self) -> Option<CallDelta> {
        let current = self.buffer.clone();
        let start = current.find(START)? + START.len();
        if start >= current.len() {
            return None;
        }
        let read = partial_json::sglang_loads(&current[start..], self.name_sent);
        let (mut obj, end_chars) = read.ok()?;
        // Anything but an object fails one of the parser's lookups: an empty step.
        if !matches!(obj, PyValue::Dict(_)) {
            return None;
        }
        let end = char_to_byte(&current[start..], end_chars);
        let complete =
            pyjson::loads(&current[start..start + end]).is_some_and(|v| orjson_reads(&v));
        if let Some(name) = obj.get("name") {
            let known = matches!(name, PyValue::Str(n) if self.names.contains(n));
            if !known {
                // An unknown function: the parser forgets the call.
                self.buffer.clear();
                self.current = -1;
                self.name_sent = false;
                self.streamed.pop();
                return None;
            }
        }
        if let Some(p) = obj.get("parameters").cloned() {
            if obj.get("arguments").is_some() {
                return None;
            }
            if let PyValue::Dict(kv) = &mut obj {
                kv.push(("arguments".into(), p));
            }
        }
        if matches!(&obj, PyValue::Dict(kv) if kv.is_empty()) {
            return None;
        }
        if !self.name_sent {
            let Some(PyValue::Str(name)) = obj.get("name") else {
                return None;
            };
            if self.current == -1 {
                self.current = 0;
                self.streamed.push(String::new());
            }
            while self.streamed.len() <= self.current as usize {
                self.streamed.push(String::new());
            }
            self.name_sent = true;
            return Some(CallDelta {
                index: self.current as u32,
                id: None,
                name: Some(name.clone()),
                arguments: Some(String::new()),
            });
        }
        let args = obj.get("arguments")?.clone();
        let id = self.current as usize;
        let sent = self.streamed.get(id).map_or(0, |s| s.chars().count());
        let cur = pyjson::dumps(&args);
        let prev = self.prev.get(id).cloned().flatten().filter(truthy);
        let diff = if complete {
            self.buffer = current[start + end..].to_string();
            Some(cur.chars().skip(sent).collect::<String>())
        } else if let Some(p) = prev {
            let prev = pyjson::dumps(&p);
            (cur != prev).then(|| common_prefix(&prev, &cur).chars().skip(sent).collect())
        } else {
            None
        };
        while self.prev.len() <= id {
            self.prev.push(None);
        }
        self.prev[id] = Some(args);
        if complete {
            self.name_sent = false;
            self.current += 1;
        }
        let diff = diff?;
        if let Some(s) = self.streamed.get_mut(id) {
            s.push_str(&diff);
        }
        Some(CallDelta {
            index: id as u32,
            id: None,
            name: None,
            arguments: Some(diff),
        })
    }

    /// `_check_for_unstreamed_tool_args` at the end of a stream: what the last call's
    /// reading has beyond what was sent.
    pub fn remaining(&self) -> Option<CallDelta> {
        let last = self.prev.len().checked_sub(1)?;
        let sent = self.streamed.get(last)?;
        let expected = match &self.prev[last] {
            Some(PyValue::Str(s)) => s.clone(),
            Some(v) => pyjson::dumps(v),
            None => "{}".to_string(),
        };
        let rest = expected.strip_prefix(sent.as_str())?;
        (!rest.is_empty()).then(|| CallDelta {
            index: last as u32,
            id: None,
            name: None,
            arguments: Some(rest.to_string()),
        })
    }
}

/// orjson (`_is_complete_json`) is stricter than `json.loads`: no `NaN`, `Infinity` or
/// number beyond a double, no integer beyond 64 bits.
fn orjson_reads(v: &PyValue) -> bool {
    match v {
        PyValue::Float(f) => f.is_finite(),
        PyValue::Int(i) => i.parse::<i64>().is_ok() || i.parse::<u64>().is_ok(),
        PyValue::List(items) => items.iter().all(orjson_reads),
        PyValue::Dict(kv) => kv.iter().all(|(_, v)| orjson_reads(v)),
        _ => true,
    }
}

fn char_to_byte(s: &str, chars: usize) -> usize {
    s.char_indices().nth(chars).map_or(s.len(), |(i, _)| i)
}

fn common_prefix(a: &str, b: &str) -> String {
    a.chars()
        .zip(b.chars())
        .take_while(|(x, y)| x == y)
        .map(|(x, _)| x)
        .collect()
}
