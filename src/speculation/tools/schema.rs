//! Schema-typed argument conversion of vLLM 0.32's grammar-engine tool parsers
//! (`ParserEngine._fix_arg_types` in `vllm/parser/engine/parser_engine.py`, with
//! `coerce_to_schema_type` and `extract_types_from_schema` of `vllm/tool_parsers/utils.py`):
//! a whole answer's arguments are read as JSON and each value the called tool's schema
//! types differently is converted; where anything changed, the arguments are written
//! again with `json.dumps`, else they stay as the model wrote them.

use serde_json::{Map, Value};

use super::pyjson::{self, PyValue};

/// The request's function tools: each name with its parameters' `properties`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Declared {
    tools: Vec<(String, Option<Map<String, Value>>)>,
}

impl Declared {
    /// The tools of a request body; `None` where one is of a shape whose conversion
    /// specd does not reproduce (vLLM fails on `properties` that is not an object).
    pub fn of(tools: &Value) -> Option<Self> {
        let mut out = Vec::new();
        for t in tools.as_array()? {
            let f = t.get("function")?;
            let name = f.get("name")?.as_str()?.to_string();
            let props = match f.get("parameters").and_then(|p| p.get("properties")) {
                None | Some(Value::Null) => None,
                Some(Value::Object(m)) => Some(m.clone()),
                Some(_) => return None,
            };
            out.push((name, props));
        }
        Some(Declared { tools: out })
    }

    /// `find_tool_properties`: the first tool of that name.
    fn properties(&self, name: &str) -> Option<&Map<String, Value>> {
        let (_, props) = self.tools.iter().find(|(n, _)| n == name)?;
        props.as_ref().filter(|p| !p.is_empty())
    }

    /// `_streamable_string_keys` of the tool's properties: the keys that can only be
    /// strings, whose unfinished values may stream (`None`: the tool has no properties).
    pub fn string_keys(&self, name: &str) -> Option<Vec<String>> {
        let props = self.properties(name)?;
        let only_string = |v: &Value| match v {
            Value::Object(m) => types_of(m).iter().all(|t| t == "string"),
            _ => true,
        };
        Some(
            props
                .iter()
                .filter(|(_, v)| only_string(v))
                .map(|(k, _)| k.clone())
                .collect(),
        )
    }

    /// `_fix_arg_types`: `args` as the tool's schema types them.
    pub fn fix(&self, args: &str, name: &str) -> String {
        if name.is_empty() {
            return args.to_string();
        }
        let (Some(props), Some(PyValue::Dict(mut kv))) =
            (self.properties(name), pyjson::loads(args))
        else {
            return args.to_string();
        };
        if coerce_dict(&mut kv, props) {
            pyjson::dumps(&PyValue::Dict(kv))
        } else {
            args.to_string()
        }
    }
}

/// `_coerce_dict`: whether any value changed.
fn coerce_dict(kv: &mut [(String, PyValue)], props: &Map<String, Value>) -> bool {
    let mut changed = false;
    for (k, v) in kv.iter_mut() {
        if let Some(Value::Object(schema)) = props.get(k) {
            changed |= coerce_value(v, schema);
        }
    }
    changed
}

/// `_coerce_value`: converts `v` in place; whether it changed.
fn coerce_value(v: &mut PyValue, schema: &Map<String, Value>) -> bool {
    match v {
        PyValue::Str(s) => match coerce_str(s, &types_of(schema)) {
            Coerced::Same => false,
            Coerced::New(n) => {
                *v = n;
                true
            }
        },
        PyValue::Dict(kv) => match schema.get("properties") {
            Some(Value::Object(p)) => coerce_dict(kv, p),
            _ => false,
        },
        PyValue::List(items) => match schema.get("items") {
            Some(Value::Object(s)) => {
                let mut changed = false;
                for item in items.iter_mut() {
                    changed |= coerce_value(item, s);
                }
                changed
            }
            _ => false,
        },
        _ => {
            let text = pyjson::dumps(v);
            let new = match coerce_str(&text, &types_of(schema)) {
                Coerced::Same => PyValue::Str(text),
                Coerced::New(n) => n,
            };
            if py_same(&new, v) {
                return false;
            }
            *v = new;
            true
        }
    }
}

/// `type(a) is type(b) and a == b` for the scalars `coerce_to_schema_type` returns.
fn py_same(a: &PyValue, b: &PyValue) -> bool {
    match (a, b) {
        (PyValue::Float(x), PyValue::Float(y)) => x == y,
        _ => a == b,
    }
}

/// What `coerce_to_schema_type` returns: the string itself, or a new value.
#[derive(Debug, PartialEq)]
enum Coerced {
    Same,
    New(PyValue),
}

/// `extract_types_from_schema`.
fn types_of(schema: &Map<String, Value>) -> Vec<String> {
    let mut types: Vec<String> = Vec::new();
    let mut add = |t: &str| {
        if !types.iter().any(|x| x == t) {
            types.push(t.to_string());
        }
    };
    match schema.get("type") {
        Some(Value::String(t)) => add(t),
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).for_each(&mut add),
        _ => {}
    }
    if let Some(Value::Array(vals)) = schema.get("enum") {
        for v in vals {
            add(match v {
                Value::Null => "null",
                Value::Bool(_) => "boolean",
                Value::Number(n) if n.is_f64() => "number",
                Value::Number(_) => "integer",
                Value::String(_) => "string",
                Value::Array(_) => "array",
                Value::Object(_) => "object",
            });
        }
    }
    for field in ["anyOf", "oneOf", "allOf"] {
        if let Some(Value::Array(choices)) = schema.get(field) {
            for c in choices {
                let sub = match c {
                    Value::Object(m) => types_of(m),
                    _ => vec!["string".to_string()],
                };
                sub.iter().for_each(|t| add(t));
            }
        }
    }
    if types.is_empty() {
        types.push("string".into());
    }
    types
}

/// `_TYPE_ALIASES`.
fn alias(t: &str) -> &str {
    match t {
        "str" | "text" | "varchar" | "char" | "enum" => "string",
        "int" | "int32" | "int64" | "uint" | "uint32" | "uint64" | "long" | "short"
        | "unsigned" => "integer",
        "float" | "float32" | "float64" | "double" => "number",
        "bool" => "boolean",
        "dict" => "object",
        "arr" | "list" | "sequence" => "array",
        t => t,
    }
}

/// `coerce_to_schema_type(value, types)`.
fn coerce_str(value: &str, types: &[String]) -> Coerced {
    let norm: Vec<String> = types
        .iter()
        .map(|t| alias(&py_strip(t).to_lowercase()).to_string())
        .collect();
    let has = |t: &str| norm.iter().any(|n| n == t);
    for t in [
        "null", "integer", "number", "boolean", "object", "array", "string",
    ] {
        if !has(t) {
            continue;
        }
        match t {
            "null" if value.to_lowercase() == "null" => return Coerced::New(PyValue::Null),
            "integer" => {
                if let Some(i) = py_int(value) {
                    return Coerced::New(PyValue::Int(i));
                }
            }
            "number" => {
                if let Some(f) = py_float(value).filter(|f| f.is_finite()) {
                    return Coerced::New(number(f));
                }
            }
            "boolean" => match py_strip(&value.to_lowercase()) {
                "true" | "1" => return Coerced::New(PyValue::Bool(true)),
                "false" | "0" => return Coerced::New(PyValue::Bool(false)),
                _ => {}
            },
            "object" | "array" => {
                if let Some(p) = pyjson::loads(value).filter(finite) {
                    return Coerced::New(p);
                }
            }
            "string" => return Coerced::Same,
            _ => {}
        }
    }
    match pyjson::loads(value).filter(finite) {
        Some(p) => Coerced::New(p),
        None => Coerced::Same,
    }
}

/// `val if val != int(val) else int(val)`.
fn number(f: f64) -> PyValue {
    if f.fract() != 0.0 {
        return PyValue::Float(f);
    }
    PyValue::Int(integral_digits(f))
}

/// The exact decimal digits of an integral, finite float (Python's `int(f)`).
fn integral_digits(f: f64) -> String {
    if f.abs() < 1e18 {
        return format!("{}", f as i64);
    }
    // mantissa · 2^exp, doubled in decimal.
    let bits = f.abs().to_bits();
    let exp = ((bits >> 52) & 0x7ff) as i32 - 1075;
    let mantissa = (bits & ((1 << 52) - 1)) | (1 << 52);
    let mut digits: Vec<u8> = mantissa.to_string().bytes().map(|b| b - b'0').collect();
    for _ in 0..exp {
        let mut carry = 0;
        for d in digits.iter_mut().rev() {
            let v = *d * 2 + carry;
            *d = v % 10;
            carry = v / 10;
        }
        if carry > 0 {
            digits.insert(0, carry);
        }
    }
    let s: String = digits.iter().map(|d| char::from(b'0' + d)).collect();
    if f < 0.0 {
        format!("-{s}")
    } else {
        s
    }
}

/// `_is_json_finite`.
fn finite(v: &PyValue) -> bool {
    match v {
        PyValue::Float(f) => f.is_finite(),
        PyValue::List(items) => items.iter().all(finite),
        PyValue::Dict(kv) => kv.iter().all(|(_, v)| finite(v)),
        _ => true,
    }
}

/// Python's `str.strip()`.
fn py_strip(s: &str) -> &str {
    s.trim_matches(|c: char| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c))
}

/// ASCII digits with single underscores between them (Python's numeric literals).
fn digit_run(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with('_')
        && !s.ends_with('_')
        && !s.contains("__")
        && s.bytes().all(|b| b.is_ascii_digit() || b == b'_')
}

/// Python's `int(s)` in base 10, as Python prints the result (ASCII digits only).
fn py_int(s: &str) -> Option<String> {
    let t = py_strip(s);
    let (neg, body) = match t.as_bytes().first()? {
        b'-' => (true, &t[1..]),
        b'+' => (false, &t[1..]),
        _ => (false, t),
    };
    if !digit_run(body) {
        return None;
    }
    let digits: String = body.chars().filter(|c| *c != '_').collect();
    let digits = digits.trim_start_matches('0');
    Some(match (digits.is_empty(), neg) {
        (true, _) => "0".to_string(),
        (false, true) => format!("-{digits}"),
        (false, false) => digits.to_string(),
    })
}

/// Python's `float(s)` (ASCII digits only).
fn py_float(s: &str) -> Option<f64> {
    let t = py_strip(s);
    let body = t.strip_prefix(['-', '+']).unwrap_or(t);
    let lower = body.to_ascii_lowercase();
    let neg = t.starts_with('-');
    let special = match lower.as_str() {
        "inf" | "infinity" => Some(f64::INFINITY),
        "nan" => Some(f64::NAN),
        _ => None,
    };
    if let Some(f) = special {
        return Some(if neg { -f } else { f });
    }
    let (mant, exp) = match lower.split_once('e') {
        Some((m, e)) => (m, Some(e)),
        None => (lower.as_str(), None),
    };
    let (int, frac) = match mant.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (mant, None),
    };
    let int_ok = int.is_empty() || digit_run(int);
    let frac_ok = frac.is_none_or(|f| f.is_empty() || digit_run(f));
    let some_digits = !int.is_empty() || frac.is_some_and(|f| !f.is_empty());
    let exp_ok = exp.is_none_or(|e| digit_run(e.strip_prefix(['-', '+']).unwrap_or(e)));
    if !(int_ok && frac_ok && some_digits && exp_ok) {
        return None;
    }
    let clean: String = t.chars().filter(|c| *c != '_').collect();
    clean.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn declared(props: Value) -> Declared {
        let tools = json!([{"type": "function", "function": {"name": "f",
            "parameters": {"type": "object", "properties": props}}}]);
        Declared::of(&tools).expect("tools")
    }

    /// Outputs of vLLM 0.32's `ParserEngine._fix_arg_types` (Python 3.12).
    #[test]
    fn converts_as_vllm() {
        let d = declared(json!({
            "a": {"type": "number"}, "i": {"type": "integer"}, "s": {"type": "string"},
            "b": {"type": "boolean"}, "o": {"type": "object", "properties": {"x": {"type": "integer"}}},
            "l": {"type": "array", "items": {"type": "string"}},
            "u": {"anyOf": [{"type": "null"}, {"type": "integer"}]},
        }));
        let cases = [
            (r#"{"a": 3, "s": "x"}"#, r#"{"a": 3, "s": "x"}"#),
            (r#"{"a":2.0}"#, r#"{"a": 2}"#),
            (r#"{"a": 1.5}"#, r#"{"a": 1.5}"#),
            (r#"{"a": "1_000"}"#, r#"{"a": 1000}"#),
            (r#"{"s": 5}"#, r#"{"s": "5"}"#),
            (r#"{"s": true}"#, r#"{"s": "true"}"#),
            (r#"{"i": " 7 "}"#, r#"{"i": 7}"#),
            (r#"{"b": "TRUE"}"#, r#"{"b": true}"#),
            (r#"{"b": 1}"#, r#"{"b": true}"#),
            (r#"{"o": {"x": "4"}}"#, r#"{"o": {"x": 4}}"#),
            (r#"{"l": [1, "a"]}"#, r#"{"l": ["1", "a"]}"#),
            (r#"{"u": "null"}"#, r#"{"u": null}"#),
            (
                r#"{"a": 12345678901234567890}"#,
                r#"{"a": 12345678901234567168}"#,
            ),
            (r#"{"a": NaN}"#, r#"{"a": "NaN"}"#),
            (r#"{"a": "x"}"#, r#"{"a": "x"}"#),
            (r#"{"zz": 1}"#, r#"{"zz": 1}"#),
            ("[1]", "[1]"),
            ("{bad", "{bad"),
        ];
        for (args, want) in cases {
            assert_eq!(d.fix(args, "f"), want, "{args}");
        }
        assert_eq!(d.fix(r#"{"a":2.0}"#, "g"), r#"{"a":2.0}"#);
    }

    #[test]
    fn python_numbers() {
        assert_eq!(py_int("-0_1").as_deref(), Some("-1"));
        assert_eq!(py_int("1__0"), None);
        assert_eq!(py_float("1e3"), Some(1000.0));
        assert_eq!(py_float(".5"), Some(0.5));
        assert_eq!(py_float("1."), Some(1.0));
        assert_eq!(py_float("."), None);
        assert_eq!(py_float("e5"), None);
        assert_eq!(integral_digits(1e20), "100000000000000000000");
        assert_eq!(integral_digits(-2f64.powi(70)), "-1180591620717411303424");
    }
}
