//! Request intake: any bytes a client may send as a completions or chat body, with any
//! `x-speculation` header. Parsing may refuse; it must never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use specd::speculation::request::{parse, Endpoint, Intake};

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let endpoint = if flags & 1 == 0 {
        Endpoint::Completions
    } else {
        Endpoint::Chat
    };
    let header = match (flags >> 1) & 3 {
        0 => None,
        1 => Some("on"),
        2 => Some("auto"),
        _ => Some("sometimes"),
    };
    if let Ok(Value::Object(m)) = serde_json::from_slice::<Value>(rest) {
        if let Ok(Intake::Speculate(g)) = parse(endpoint, m, header) {
            assert!(g.max_tokens.is_none_or(|n| n >= 1));
            assert!(!g.body.contains_key("speculation"));
        }
    }
});
