//! JSON as Python's `json` module reads and writes it, for tool-call arguments: vLLM's
//! parsers `json.loads` what the model wrote and answer `json.dumps(…, ensure_ascii=False)`
//! of it, so a speculated answer must re-serialize the same way — `", "` and `": "`
//! separators, keys in first-seen order with the last value, integers as written,
//! floats as Python's `repr`, `NaN` and `Infinity` accepted.

use std::fmt::Write;

/// A value as `json.loads` builds it.
#[derive(Debug, Clone, PartialEq)]
pub enum PyValue {
    Null,
    Bool(bool),
    /// An integer literal, normalized as Python's `int` prints it.
    Int(String),
    Float(f64),
    Str(String),
    List(Vec<PyValue>),
    /// Keys in first-seen order; a repeated key keeps its place and takes the last value.
    Dict(Vec<(String, PyValue)>),
}

impl PyValue {
    pub fn get(&self, key: &str) -> Option<&PyValue> {
        match self {
            PyValue::Dict(kv) => kv.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
}

/// `json.loads(text)`: `None` where Python raises.
pub fn loads(text: &str) -> Option<PyValue> {
    loads_or_extra(text).ok()
}

/// `json.loads(text)` telling Python's "Extra data" error (a whole value followed by
/// more than whitespace: `Err(true)`) from the others (`Err(false)`).
pub fn loads_or_extra(text: &str) -> Result<PyValue, bool> {
    let mut p = Parser {
        s: text.as_bytes(),
        text,
        i: 0,
        depth: 0,
    };
    p.ws();
    let v = p.value().ok_or(false)?;
    p.ws();
    if p.i == p.s.len() {
        Ok(v)
    } else {
        Err(true)
    }
}

/// `json.JSONDecoder().raw_decode(text)`: the value at the very start of `text` and the
/// byte offset where it ends; `None` where Python raises.
pub fn raw_decode(text: &str) -> Option<(PyValue, usize)> {
    let mut p = Parser {
        s: text.as_bytes(),
        text,
        i: 0,
        depth: 0,
    };
    let v = p.value()?;
    Some((v, p.i))
}

/// `json.dumps(v, ensure_ascii=False)`.
pub fn dumps(v: &PyValue) -> String {
    let mut out = String::new();
    write_value(v, &mut out);
    out
}

/// Python's recursion limit stops deeper documents; specd stops well before it.
const MAX_DEPTH: usize = 512;

struct Parser<'a> {
    s: &'a [u8],
    text: &'a str,
    i: usize,
    depth: usize,
}

impl Parser<'_> {
    /// JSON whitespace (Python's scanner skips exactly these four).
    fn ws(&mut self) {
        while matches!(self.s.get(self.i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn eat(&mut self, lit: &str) -> bool {
        if self.text[self.i..].starts_with(lit) {
            self.i += lit.len();
            return true;
        }
        false
    }

    fn value(&mut self) -> Option<PyValue> {
        match *self.s.get(self.i)? {
            b'{' => self.nested(Self::dict),
            b'[' => self.nested(Self::list),
            b'"' => self.string().map(PyValue::Str),
            b'n' if self.eat("null") => Some(PyValue::Null),
            b't' if self.eat("true") => Some(PyValue::Bool(true)),
            b'f' if self.eat("false") => Some(PyValue::Bool(false)),
            b'N' if self.eat("NaN") => Some(PyValue::Float(f64::NAN)),
            b'I' if self.eat("Infinity") => Some(PyValue::Float(f64::INFINITY)),
            b'-' if self.eat("-Infinity") => Some(PyValue::Float(f64::NEG_INFINITY)),
            _ => self.number(),
        }
    }

    fn nested(&mut self, f: fn(&mut Self) -> Option<PyValue>) -> Option<PyValue> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return None;
        }
        let v = f(self);
        self.depth -= 1;
        v
    }

    fn dict(&mut self) -> Option<PyValue> {
        self.i += 1;
        let mut kv: Vec<(String, PyValue)> = Vec::new();
        self.ws();
        if self.eat("}") {
            return Some(PyValue::Dict(kv));
        }
        loop {
            self.ws();
            if self.s.get(self.i) != Some(&b'"') {
                return None;
            }
            let k = self.string()?;
            self.ws();
            if !self.eat(":") {
                return None;
            }
            self.ws();
            let v = self.value()?;
            match kv.iter_mut().find(|(key, _)| *key == k) {
                Some(slot) => slot.1 = v,
                None => kv.push((k, v)),
            }
            self.ws();
            if self.eat("}") {
                return Some(PyValue::Dict(kv));
            }
            if !self.eat(",") {
                return None;
            }
        }
    }

    fn list(&mut self) -> Option<PyValue> {
        self.i += 1;
        let mut items = Vec::new();
        self.ws();
        if self.eat("]") {
            return Some(PyValue::List(items));
        }
        loop {
            self.ws();
            items.push(self.value()?);
            self.ws();
            if self.eat("]") {
                return Some(PyValue::List(items));
            }
            if !self.eat(",") {
                return None;
            }
        }
    }

    /// A string literal (strict: no raw control characters). A lone surrogate, which
    /// Python keeps and Rust strings cannot hold, reads as an error.
    fn string(&mut self) -> Option<String> {
        self.i += 1;
        let mut out = String::new();
        loop {
            let start = self.i;
            while let Some(&c) = self.s.get(self.i) {
                if c == b'"' || c == b'\\' || c < 0x20 {
                    break;
                }
                self.i += 1;
            }
            out.push_str(&self.text[start..self.i]);
            match *self.s.get(self.i)? {
                b'"' => {
                    self.i += 1;
                    return Some(out);
                }
                b'\\' => {
                    self.i += 1;
                    out.push(self.escape()?);
                }
                _ => return None,
            }
        }
    }

    fn escape(&mut self) -> Option<char> {
        let c = *self.s.get(self.i)?;
        self.i += 1;
        Some(match c {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let hi = self.hex4()?;
                if (0xD800..0xDC00).contains(&hi) && self.eat("\\u") {
                    let lo = self.hex4()?;
                    if !(0xDC00..0xE000).contains(&lo) {
                        return None;
                    }
                    char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))?
                } else {
                    char::from_u32(hi)?
                }
            }
            _ => return None,
        })
    }

    fn hex4(&mut self) -> Option<u32> {
        let h = self.text.get(self.i..self.i + 4)?;
        if !h.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        self.i += 4;
        u32::from_str_radix(h, 16).ok()
    }

    /// Python's number pattern `-?(0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?`.
    fn number(&mut self) -> Option<PyValue> {
        let start = self.i;
        self.eat("-");
        let digits = |p: &mut Self| {
            let d = p.i;
            while p.s.get(p.i).is_some_and(u8::is_ascii_digit) {
                p.i += 1;
            }
            p.i - d
        };
        let int_start = self.i;
        let n = digits(self);
        if n == 0 || (n > 1 && self.s[int_start] == b'0') {
            // "01" reads as 0 followed by extra data: an error either way.
            return None;
        }
        let int_end = self.i;
        let mut float = false;
        if self.s.get(self.i) == Some(&b'.')
            && self.s.get(self.i + 1).is_some_and(u8::is_ascii_digit)
        {
            self.i += 1;
            digits(self);
            float = true;
        }
        if matches!(self.s.get(self.i), Some(b'e' | b'E')) {
            let save = self.i;
            self.i += 1;
            if matches!(self.s.get(self.i), Some(b'+' | b'-')) {
                self.i += 1;
            }
            if digits(self) == 0 {
                self.i = save;
            } else {
                float = true;
            }
        }
        let lit = &self.text[start..self.i];
        if float {
            return lit.parse::<f64>().ok().map(PyValue::Float);
        }
        let negative = lit.starts_with('-');
        let body = &self.text[int_start..int_end];
        Some(PyValue::Int(if body == "0" || !negative {
            body.to_string()
        } else {
            format!("-{body}")
        }))
    }
}

fn write_value(v: &PyValue, out: &mut String) {
    match v {
        PyValue::Null => out.push_str("null"),
        PyValue::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        PyValue::Int(i) => out.push_str(i),
        PyValue::Float(f) => out.push_str(&float_repr(*f)),
        PyValue::Str(s) => write_str(s, out),
        PyValue::List(items) => {
            out.push('[');
            for (n, item) in items.iter().enumerate() {
                if n > 0 {
                    out.push_str(", ");
                }
                write_value(item, out);
            }
            out.push(']');
        }
        PyValue::Dict(kv) => {
            out.push('{');
            for (n, (k, item)) in kv.iter().enumerate() {
                if n > 0 {
                    out.push_str(", ");
                }
                write_str(k, out);
                out.push_str(": ");
                write_value(item, out);
            }
            out.push('}');
        }
    }
}

/// A string as `json.dumps(ensure_ascii=False)` writes it: only `"`, `\` and control
/// characters are escaped.
fn write_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `float.__repr__`: the shortest digits that round-trip, positional for
/// decimal exponents -4..16, else `d.ddde±XX`; `json` writes the non-finite ones as
/// `NaN`, `Infinity` and `-Infinity`.
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    // Rust's `{:e}` is the shortest round-trip form too: "-1.5e-7", "1e16".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1;
        let body = if point <= 0 {
            format!("0.{}{digits}", "0".repeat((-point) as usize))
        } else if point as usize >= digits.len() {
            format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
        } else {
            let (a, b) = digits.split_at(point as usize);
            format!("{a}.{b}")
        };
        return format!("{sign}{body}");
    }
    let (first, rest) = digits.split_at(1);
    let frac = if rest.is_empty() {
        String::new()
    } else {
        format!(".{rest}")
    };
    let esign = if exp < 0 { '-' } else { '+' };
    format!("{sign}{first}{frac}e{esign}{:02}", exp.abs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(s: &str) -> Option<String> {
        loads(s).map(|v| dumps(&v))
    }

    #[test]
    fn reserializes_as_python() {
        // Outputs of Python 3: json.dumps(json.loads(s), ensure_ascii=False).
        let cases = [
            (r#"{"city":"Paris"}"#, r#"{"city": "Paris"}"#),
            (
                r#" { "a" : 1 , "b":[1,2.50,-0,1e3] } "#,
                r#"{"a": 1, "b": [1, 2.5, 0, 1000.0]}"#,
            ),
            (r#"{"a":1,"b":2,"a":3}"#, r#"{"a": 3, "b": 2}"#),
            (
                r#""caf\u00e9 \ud83d\ude00 \/ \u0001""#,
                "\"café 😀 / \\u0001\"",
            ),
            (
                r#"[1E400, -1e-7, 0.0001, 1e16, 123456789012345678, 0.1]"#,
                "[Infinity, -1e-07, 0.0001, 1e+16, 123456789012345678, 0.1]",
            ),
            (
                "[NaN, -Infinity, true, false, null]",
                "[NaN, -Infinity, true, false, null]",
            ),
            (
                "[1.5e300, 2e-5, 12345678901234567.0]",
                "[1.5e+300, 2e-05, 1.2345678901234568e+16]",
            ),
            ("{}", "{}"),
            ("[]", "[]"),
        ];
        for (input, want) in cases {
            assert_eq!(round(input).as_deref(), Some(want), "{input}");
        }
    }

    #[test]
    fn refuses_what_python_refuses() {
        for bad in [
            "",
            "{",
            "01",
            "1.",
            "[1,]",
            "{\"a\" 1}",
            "\"a\nb\"",
            "{\"a\":1} x",
            "'a'",
            "\"\\ud800\"",
            "\"\\x\"",
            "nul",
            "-",
            "+1",
            ".5",
        ] {
            assert_eq!(loads(bad), None, "{bad:?}");
        }
    }
}
