//! `Llama3JsonToolParser.extract_tool_calls_streaming` (vLLM 0.32): after every
//! generated token the whole text so far is read as `;`-separated partial JSON objects
//! (`partial_json.rs`); the object at the cursor sends its name once complete (strings
//! are not read partially until then), then its arguments re-serialized with
//! `json.dumps` as they grow — only the part two steps agree on while the object is
//! open (so closing quotes and braces the completion made up are held back), the rest
//! once it parses whole, and what was held when the next object starts. Any error ends
//! the step with nothing sent and the state unchanged, as vLLM's `except` does.

use super::super::partial_json;
use super::super::pyjson::{self, PyValue};
use super::super::{CallDelta, StreamDelta};
use super::BOT_TOKEN;

/// A Python exception inside the step: vLLM logs it and sends nothing.
struct Raised;

/// The parser's state for one answer.
#[derive(Debug, Clone)]
pub struct Stream {
    /// `prev_tool_call_arr`: the objects read at the last step that got past the start
    /// of a new call.
    prev: Vec<PyValue>,
    /// `current_tool_id` (-1 before the first call).
    current: isize,
    name_sent: bool,
    /// `streamed_args_for_tool`.
    streamed: Vec<String>,
}

impl Default for Stream {
    fn default() -> Self {
        Stream {
            prev: Vec::new(),
            current: -1,
            name_sent: false,
            streamed: Vec::new(),
        }
    }
}

impl Stream {
    /// One step: the whole text so far and the text this step added; `None`: nothing
    /// to send. Text that does not start with a call is content as it comes (an empty
    /// piece included, as vLLM's `DeltaMessage(content=delta_text)`).
    pub fn step(&mut self, current: &str, delta: &str) -> Option<StreamDelta> {
        if !(current.starts_with(BOT_TOKEN) || current.starts_with('{')) {
            return Some(StreamDelta {
                content: Some(delta.to_string()),
                calls: Vec::new(),
            });
        }
        self.calls(current).unwrap_or(None)
    }

    /// `get_remaining_unstreamed_args`: the last object's arguments not yet sent, added
    /// to the last call piece of a stream's final step.
    pub fn remaining_args(&self) -> String {
        let Some(last) = self.prev.last() else {
            return String::new();
        };
        let expected = match last.get("arguments") {
            Some(PyValue::Str(s)) => s.clone(),
            Some(v) => pyjson::dumps(v),
            None => "{}".to_string(),
        };
        let actual = self
            .streamed
            .get(self.prev.len() - 1)
            .map_or("", String::as_str);
        expected
            .strip_prefix(actual)
            .map_or_else(String::new, str::to_string)
    }

    fn calls(&mut self, current: &str) -> Result<Option<StreamDelta>, Raised> {
        let objects = read_objects(current, self.name_sent)?;
        let Some(count) = isize::try_from(objects.len()).ok().filter(|&n| n > 0) else {
            return Ok(None);
        };
        // `tool_call_arr[self.current_tool_id]`: -1 is the last.
        let at = if self.current < 0 {
            count + self.current
        } else {
            self.current
        };
        let (cur, complete) = usize::try_from(at)
            .ok()
            .and_then(|k| objects.get(k))
            .ok_or(Raised)?;
        if count > self.current + 1 {
            // A new call: first what the completion held back of the one before.
            let mut delta = None;
            if self.current >= 0 {
                let args = dict_get(cur, "arguments")?;
                if let Some(a) = args.filter(|a| truthy(a)) {
                    let json = pyjson::dumps(a);
                    let diff = self.send(self.current, &json)?;
                    delta = Some(args_piece(self.current, diff));
                }
            }
            self.current = count - 1;
            self.name_sent = false;
            self.streamed.push(String::new());
            return Ok(delta);
        }
        let delta = if !self.name_sent {
            match dict_get(cur, "name")? {
                Some(n) if truthy(n) => {
                    // pydantic takes only a string name.
                    let PyValue::Str(name) = n else {
                        return Err(Raised);
                    };
                    self.name_sent = true;
                    Some(StreamDelta {
                        content: None,
                        calls: vec![CallDelta {
                            index: self.current as u32,
                            id: None,
                            name: Some(name.clone()),
                            arguments: None,
                        }],
                    })
                }
                _ => None,
            }
        } else {
            self.arguments(cur, *complete)?
        };
        self.prev = objects.into_iter().map(|(o, _)| o).collect();
        Ok(delta)
    }

    /// The current call's arguments as far as they can be sent.
    fn arguments(&mut self, cur: &PyValue, complete: bool) -> Result<Option<StreamDelta>, Raised> {
        let Some(args) = dict_get(cur, "arguments")?.filter(|a| truthy(a)) else {
            return Ok(None);
        };
        let k = self.current;
        let sent = self.sent(k)?.chars().count();
        let json = pyjson::dumps(args);
        let prev = self.prev.get(k as usize).ok_or(Raised)?;
        let prev_args = dict_get(prev, "arguments")?;
        let diff: Option<String> = if complete {
            Some(json.chars().skip(sent).collect())
        } else if let Some(p) = prev_args.filter(|p| truthy(p)) {
            let prev_json = pyjson::dumps(p);
            (json != prev_json).then(|| {
                let prefix = json
                    .chars()
                    .zip(prev_json.chars())
                    .take_while(|(a, b)| a == b)
                    .map(|(a, _)| a);
                prefix.skip(sent).collect()
            })
        } else {
            None
        };
        Ok(diff.map(|d| {
            self.streamed[k as usize].push_str(&d);
            args_piece(k, d)
        }))
    }

    fn sent(&self, k: isize) -> Result<&String, Raised> {
        usize::try_from(k)
            .ok()
            .and_then(|k| self.streamed.get(k))
            .ok_or(Raised)
    }

    /// `json[sent:]` of call `k`, recorded as sent.
    fn send(&mut self, k: isize, json: &str) -> Result<String, Raised> {
        let sent = self.sent(k)?.chars().count();
        let diff: String = json.chars().skip(sent).collect();
        self.streamed[k as usize].push_str(&diff);
        Ok(diff)
    }
}

fn args_piece(k: isize, diff: String) -> StreamDelta {
    StreamDelta {
        content: None,
        calls: vec![CallDelta {
            index: k as u32,
            id: None,
            name: None,
            arguments: Some(diff),
        }],
    }
}

/// The `;`-separated objects of the text (after `<|python_tag|>`), each with whether
/// its own text parses whole (`is_complete_json`); `parameters` read as `arguments`.
fn read_objects(current: &str, strings: bool) -> Result<Vec<(PyValue, bool)>, Raised> {
    let chars: Vec<char> = current.chars().collect();
    let mut start = if current.starts_with(BOT_TOKEN) {
        BOT_TOKEN.chars().count()
    } else {
        0
    };
    let mut out = Vec::new();
    while start < chars.len() {
        let rest: String = chars[start..].iter().collect();
        let (mut obj, end) = partial_json::vllm_loads(&rest, strings).map_err(|_| Raised)?;
        let own: String = chars[start..(start + end).min(chars.len())]
            .iter()
            .collect();
        let complete = pyjson::loads(&own).is_some();
        // Past the value and the two characters of "; ", whatever they are.
        start += end + 2;
        if contains(&obj, "parameters")? {
            if contains(&obj, "arguments")? {
                return Err(Raised);
            }
            let PyValue::Dict(kv) = &mut obj else {
                return Err(Raised);
            };
            let params = kv
                .iter()
                .find(|(k, _)| k == "parameters")
                .map(|(_, v)| v.clone())
                .ok_or(Raised)?;
            kv.push(("arguments".to_string(), params));
        }
        out.push((obj, complete));
    }
    Ok(out)
}

/// Python's `key in obj`: a dict's key, a list's item, a string's substring; a
/// `TypeError` for the rest.
fn contains(obj: &PyValue, key: &str) -> Result<bool, Raised> {
    match obj {
        PyValue::Dict(kv) => Ok(kv.iter().any(|(k, _)| k == key)),
        PyValue::List(items) => Ok(items
            .iter()
            .any(|v| matches!(v, PyValue::Str(s) if s == key))),
        PyValue::Str(s) => Ok(s.contains(key)),
        _ => Err(Raised),
    }
}

/// `obj.get(key)`: an `AttributeError` for what is not a dict.
fn dict_get<'a>(obj: &'a PyValue, key: &str) -> Result<Option<&'a PyValue>, Raised> {
    match obj {
        PyValue::Dict(_) => Ok(obj.get(key)),
        _ => Err(Raised),
    }
}

/// Python's truth value.
fn truthy(v: &PyValue) -> bool {
    match v {
        PyValue::Null => false,
        PyValue::Bool(b) => *b,
        PyValue::Int(s) => s != "0",
        PyValue::Float(f) => *f != 0.0,
        PyValue::Str(s) => !s.is_empty(),
        PyValue::List(l) => !l.is_empty(),
        PyValue::Dict(kv) => !kv.is_empty(),
    }
}
