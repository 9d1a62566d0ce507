//! Scalars read the way vLLM's request models (pydantic, lax mode) read them, so a request
//! vLLM accepts is accepted here and one it refuses is refused: integers also from floats
//! without a fraction, booleans and digit strings; numbers also from booleans and numeric
//! strings; booleans also from 0/1 and the usual words.
//!
//! The `opt_*` functions are `deserialize_with` readers for `Option` fields: `null` and a
//! missing field are `None`, a value that does not read is an error naming what was
//! expected (the field name is added by the caller from the error's path).

use serde::de::Error as _;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

pub fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e18)
                .map(|f| f as i64)
        }),
        Value::Bool(b) => Some(i64::from(*b)),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

pub fn float(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::Bool(b) => Some(f64::from(u8::from(*b))),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

pub fn boolean(v: &Value) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(*b),
        Value::Number(n) => match n.as_f64() {
            Some(0.0) => Some(false),
            Some(1.0) => Some(true),
            _ => None,
        },
        Value::String(s) => match s.trim().to_ascii_lowercase().as_str() {
            "0" | "off" | "f" | "false" | "n" | "no" => Some(false),
            "1" | "on" | "t" | "true" | "y" | "yes" => Some(true),
            _ => None,
        },
        _ => None,
    }
}

/// A token id list: JSON numbers only (no strings), each a non-negative 32-bit integer.
pub fn token_ids(v: &Value) -> Result<Vec<u32>, &'static str> {
    v.as_array()
        .ok_or("must be a list of token ids")?
        .iter()
        .map(|t| {
            t.is_number()
                .then(|| int(t))
                .flatten()
                .and_then(|x| u32::try_from(x).ok())
                .ok_or("must hold non-negative integer token ids")
        })
        .collect()
}

fn read<'de, D, T>(
    d: D,
    f: impl FnOnce(&Value) -> Option<T>,
    expected: &str,
) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
{
    match Value::deserialize(d)? {
        Value::Null => Ok(None),
        v => f(&v).map(Some).ok_or_else(|| D::Error::custom(expected)),
    }
}

pub fn opt_int<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    read(d, int, "must be an integer")
}

/// A finite number (JSON has no infinities; a numeric string may spell one).
pub fn opt_float<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    read(
        d,
        |v| float(v).filter(|x| x.is_finite()),
        "must be a number",
    )
}

pub fn opt_bool<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    read(d, boolean, "must be a boolean")
}

/// A string, strictly (pydantic does not make strings of numbers).
pub fn opt_string<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    match Value::deserialize(d)? {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(s)),
        _ => Err(D::Error::custom("must be a string")),
    }
}

pub fn opt_token_ids<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u32>>, D::Error> {
    match Value::deserialize(d)? {
        Value::Null => Ok(None),
        v => token_ids(&v).map(Some).map_err(D::Error::custom),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_like_pydantic_lax_mode() {
        assert_eq!(int(&json!(4.0)), Some(4));
        assert_eq!(int(&json!(4.5)), None);
        assert_eq!(int(&json!(" 7 ")), Some(7));
        assert_eq!(int(&json!(true)), Some(1));
        assert_eq!(float(&json!("0.5")), Some(0.5));
        assert_eq!(boolean(&json!("Yes")), Some(true));
        assert_eq!(boolean(&json!(2)), None);
        assert!(token_ids(&json!([1, "2"])).is_err());
        assert_eq!(token_ids(&json!([1, 2.0])), Ok(vec![1, 2]));
    }
}
