//! qwen3_coder's argument text as vLLM 0.32 reads it (`vllm/parser/qwen3.py`,
//! `_qwen3_arg_converter`), and the part of the converted arguments that may stream
//! (`ParserEngine._safe_arg_prefix` in `vllm/parser/engine/parser_engine.py`).

use crate::speculation::tools::pyjson::{self, PyValue};

/// `_qwen3_arg_converter`: every `<parameter=NAME>VALUE</parameter>` (a value also ends
/// where the next parameter opens) as a JSON object of strings, written by
/// `json.dumps`; `partial`: an unfinished last parameter counts too.
pub fn convert(raw: &str, partial: bool) -> String {
    let mut params: Vec<(String, PyValue)> = Vec::new();
    let mut set = |name: &str, value: &str| {
        let v = PyValue::Str(trim_wrapping_newlines(value).to_string());
        match params.iter_mut().find(|(k, _)| k == name) {
            Some(kv) => kv.1 = v,
            None => params.push((name.to_string(), v)),
        }
    };
    let found = params_in(raw);
    for m in &found {
        set(&raw[m.name.0..m.name.1], &raw[m.value.0..m.value.1]);
    }
    if partial {
        // `_PARAM_RE.sub("", raw_args)`, then `_PARTIAL_PARAM_RE.search`.
        let mut remaining = String::new();
        let mut at = 0;
        for m in &found {
            remaining.push_str(&raw[at..m.start]);
            at = m.end;
        }
        remaining.push_str(&raw[at..]);
        if let Some((name, value)) = partial_param(&remaining) {
            set(name, value);
        }
    }
    pyjson::dumps(&PyValue::Dict(params))
}

/// One match of `_PARAM_RE`: byte ranges.
struct Param {
    start: usize,
    end: usize,
    name: (usize, usize),
    value: (usize, usize),
}

/// `_PARAM_RE.finditer`: `<\s*parameter\s*=\s*([^>]*)>(.*?)(?:<\s*/\s*parameter\s*>|(?=<\s*parameter\s*=))`.
fn params_in(s: &str) -> Vec<Param> {
    let mut out = Vec::new();
    let mut pos = 0;
    while let Some(off) = s[pos..].find('<') {
        let start = pos + off;
        match param_at(s, start) {
            Some(m) => {
                pos = m.end;
                out.push(m);
            }
            None => pos = start + 1,
        }
    }
    out
}

fn param_at(s: &str, start: usize) -> Option<Param> {
    let j = opener(s, start)?;
    let j = skip_ws(s, j);
    let close = j + s[j..].find('>')?;
    let vstart = close + 1;
    let mut p = vstart;
    loop {
        let lt = p + s[p..].find('<')?;
        if let Some(end) = closer(s, lt) {
            return Some(Param {
                start,
                end,
                name: (j, close),
                value: (vstart, lt),
            });
        }
        if opener(s, lt).is_some() {
            return Some(Param {
                start,
                end: lt,
                name: (j, close),
                value: (vstart, lt),
            });
        }
        p = lt + 1;
    }
}

/// `<\s*parameter\s*=` at `i`: the position after it.
fn opener(s: &str, i: usize) -> Option<usize> {
    let j = skip_ws(s, i + s[i..].strip_prefix('<').map(|_| 1)?);
    let j = j + s[j..].strip_prefix("parameter").map(|_| 9)?;
    let j = skip_ws(s, j);
    Some(j + s[j..].strip_prefix('=').map(|_| 1)?)
}

/// `<\s*/\s*parameter\s*>` at `i`: the position after it.
fn closer(s: &str, i: usize) -> Option<usize> {
    let j = skip_ws(s, i + s[i..].strip_prefix('<').map(|_| 1)?);
    let j = skip_ws(s, j + s[j..].strip_prefix('/').map(|_| 1)?);
    let j = j + s[j..].strip_prefix("parameter").map(|_| 9)?;
    let j = skip_ws(s, j);
    Some(j + s[j..].strip_prefix('>').map(|_| 1)?)
}

/// `_PARTIAL_PARAM_RE.search`: `<\s*parameter\s*=\s*([^>]+)>(.*)$`, leftmost.
fn partial_param(s: &str) -> Option<(&str, &str)> {
    let mut pos = 0;
    while let Some(off) = s[pos..].find('<') {
        let start = pos + off;
        pos = start + 1;
        let Some(j) = opener(s, start) else {
            continue;
        };
        let Some(close) = s[j..].find('>').map(|c| j + c) else {
            continue;
        };
        if close == j {
            continue;
        }
        // The greedy `\s*` gives one character back when the name is all whitespace.
        let mut k = skip_ws(s, j);
        if k == close {
            k = s[..close].char_indices().next_back().map_or(j, |(i, _)| i);
        }
        return Some((&s[k..close], &s[close + 1..]));
    }
    None
}

/// `\s*` of Python's `regex`: Unicode White_Space.
fn skip_ws(s: &str, i: usize) -> usize {
    i + s[i..]
        .char_indices()
        .find(|(_, c)| !c.is_whitespace())
        .map_or(s.len() - i, |(k, _)| k)
}

/// `_trim_wrapping_newlines`: one leading and one trailing newline.
fn trim_wrapping_newlines(v: &str) -> &str {
    let v = v.strip_prefix('\n').unwrap_or(v);
    v.strip_suffix('\n').unwrap_or(v)
}

/// `_safe_arg_prefix`: `json` up to its last top-level value, which is left out unless
/// it is a string of a key in `string_keys` (`None`: every key), whose text so far
/// streams without its closing quote.
pub fn safe_prefix<'a>(json: &'a str, string_keys: Option<&[String]>) -> &'a str {
    let b = json.as_bytes();
    let (mut last_colon, mut last_key, mut pending): (Option<usize>, Option<&str>, Option<&str>) =
        (None, None, None);
    let (mut in_str, mut escape, mut string_start, mut depth) = (false, false, None, 0i64);
    for (i, &c) in b.iter().enumerate() {
        if escape {
            escape = false;
            continue;
        }
        if in_str {
            if c == b'\\' {
                escape = true;
            } else if c == b'"' {
                in_str = false;
                if depth == 1 {
                    if let Some(s) = string_start {
                        pending = Some(&json[s + 1..i]);
                    }
                }
            }
            continue;
        }
        match c {
            b'"' => {
                in_str = true;
                string_start = Some(i);
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth -= 1,
            b':' if depth == 1 => {
                last_colon = Some(i);
                last_key = pending.take();
            }
            _ => {}
        }
    }
    let Some(colon) = last_colon else {
        return "";
    };
    let mut end = colon + 1;
    while matches!(b.get(end), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        end += 1;
    }
    if b.get(end) != Some(&b'"') {
        return &json[..end];
    }
    if let Some(keys) = string_keys {
        if !last_key.is_some_and(|k| keys.iter().any(|s| s == k)) {
            return &json[..end];
        }
    }
    let mut escape = false;
    for (i, &c) in b.iter().enumerate().skip(end + 1) {
        if escape {
            escape = false;
        } else if c == b'\\' {
            escape = true;
        } else if c == b'"' {
            return &json[..i];
        }
    }
    json
}
