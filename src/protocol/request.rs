//! The completions and chat request bodies, as far as specd reads them. Every field
//! specd does not read stays in `other`: the client's body is forwarded (to the upstream's
//! tokenizer, or whole on passthrough) with those fields as they came.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

use super::lax;

#[derive(Debug, Default, Deserialize)]
pub struct RequestBody {
    #[serde(default, deserialize_with = "lax::opt_string")]
    pub model: Option<String>,
    /// Completions: a string, token ids, or a list of those (its shape is read by the
    /// intake, which needs to tell one prompt from several before anything else).
    #[serde(default)]
    pub prompt: Option<Value>,
    /// Chat: the conversation, rendered by the upstream's own template.
    #[serde(default)]
    pub messages: Option<Value>,
    #[serde(default, deserialize_with = "lax::opt_int")]
    pub max_tokens: Option<i64>,
    /// Chat's newer name for `max_tokens`; it wins when both are given.
    #[serde(default, deserialize_with = "lax::opt_int")]
    pub max_completion_tokens: Option<i64>,
    #[serde(default, deserialize_with = "lax::opt_float")]
    pub temperature: Option<f64>,
    #[serde(default, deserialize_with = "lax::opt_float")]
    pub top_p: Option<f64>,
    #[serde(default, deserialize_with = "lax::opt_int")]
    pub top_k: Option<i64>,
    #[serde(default, deserialize_with = "lax::opt_float")]
    pub min_p: Option<f64>,
    #[serde(default, deserialize_with = "lax::opt_int")]
    pub seed: Option<i64>,
    /// Completions: how many top logprobs (an integer); chat: whether to return them (a
    /// boolean). Read per endpoint.
    #[serde(default)]
    pub logprobs: Option<Value>,
    #[serde(default, deserialize_with = "lax::opt_int")]
    pub top_logprobs: Option<i64>,
    #[serde(default, deserialize_with = "stop_strings")]
    pub stop: Vec<String>,
    #[serde(default, deserialize_with = "lax::opt_token_ids")]
    pub stop_token_ids: Option<Vec<u32>>,
    #[serde(default, deserialize_with = "lax::opt_bool")]
    pub stream: Option<bool>,
    /// Read by [`StreamOptions::read`]; a value specd does not understand is forwarded.
    #[serde(default)]
    pub stream_options: Option<Value>,
    #[serde(default, deserialize_with = "lax::opt_bool")]
    pub ignore_eos: Option<bool>,
    #[serde(default, deserialize_with = "lax::opt_bool")]
    pub skip_special_tokens: Option<bool>,
    #[serde(default, deserialize_with = "lax::opt_bool")]
    pub include_stop_str_in_output: Option<bool>,
    #[serde(default, deserialize_with = "lax::opt_bool")]
    pub return_tokens_as_token_ids: Option<bool>,
    /// Chat tools; only their absence is speculated (see the passthrough policy).
    #[serde(default)]
    pub tools: Option<Value>,
    #[serde(default)]
    pub tool_choice: Option<Value>,
    /// Everything else, passed through untouched.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// `stop`: a string or a list of strings; none when null or missing.
fn stop_strings<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let expected = || D::Error::custom("must be a string or a list of strings");
    match Value::deserialize(d)? {
        Value::Null => Ok(Vec::new()),
        Value::String(s) => Ok(vec![s]),
        Value::Array(a) => a
            .into_iter()
            .map(|s| match s {
                Value::String(s) => Ok(s),
                _ => Err(expected()),
            })
            .collect(),
        _ => Err(expected()),
    }
}

/// `stream_options` as specd implements it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamOptions {
    pub include_usage: bool,
}

impl StreamOptions {
    /// `None` when the value holds something specd does not implement
    /// (`continuous_usage_stats`) or cannot read: the upstream is to answer that.
    pub fn read(v: Option<&Value>) -> Option<StreamOptions> {
        let o = match v {
            None | Some(Value::Null) => return Some(StreamOptions::default()),
            Some(Value::Object(o)) => o,
            Some(_) => return None,
        };
        let flag = |k: &str| match o.get(k) {
            None | Some(Value::Null) => Some(false),
            Some(v) => lax::boolean(v),
        };
        if flag("continuous_usage_stats")? {
            return None;
        }
        Some(StreamOptions {
            include_usage: flag("include_usage")?,
        })
    }

    /// Whether vLLM counts the field as given (Python truthiness of the raw value): given
    /// without `stream`, it is an error.
    pub fn is_given(v: Option<&Value>) -> bool {
        match v {
            None | Some(Value::Null) | Some(Value::Bool(false)) => false,
            Some(Value::Object(o)) => !o.is_empty(),
            Some(Value::Array(a)) => !a.is_empty(),
            Some(Value::String(s)) => !s.is_empty(),
            Some(Value::Number(n)) => n.as_f64() != Some(0.0),
            Some(Value::Bool(true)) => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_known_fields_and_keeps_the_rest() {
        let v = json!({"model": "m", "max_tokens": "5", "stop": "x", "user": "u", "n": 1});
        let b = RequestBody::deserialize(&v).expect("valid");
        assert_eq!(b.max_tokens, Some(5));
        assert_eq!(b.stop, vec!["x"]);
        assert_eq!(b.other.len(), 2);
        assert!(RequestBody::deserialize(&json!({"stop": [1]})).is_err());
    }

    #[test]
    fn stream_options_not_understood() {
        let read = |v: Value| StreamOptions::read(Some(&v));
        assert_eq!(
            read(json!({"include_usage": "true"})),
            Some(StreamOptions {
                include_usage: true
            })
        );
        assert_eq!(read(json!({"include_usage": "x"})), None);
        assert_eq!(read(json!({"continuous_usage_stats": true})), None);
        assert_eq!(read(json!("x")), None);
    }
}
