use super::*;

#[test]
fn prefixes_complete_as_the_library_completes_them() {
    let done = |t: &str, strings: bool| {
        let s: Vec<char> = t.chars().collect();
        fix_fast(&s, strings).map(|(h, t)| h + &t)
    };
    assert_eq!(done(r#"{"name": "get_w"#, false), Ok("{}".into()));
    assert_eq!(
        done(r#"{"name": "f", "arguments": {"city": "Os"#, true),
        Ok(r#"{"name": "f", "arguments": {"city": "Os"}}"#.into())
    );
    assert_eq!(done(r#"{"a": 1"#, true), Ok(r#"{"a": 1}"#.into()));
    assert_eq!(done("{", false), Ok("{}".into()));
}

/// The inputs on which the two servers' wrappers part ways.
#[test]
fn the_wrappers_recover_from_different_exceptions() {
    let end = |r: Result<Loaded, Raised>| r.map(|(_, n)| n);
    // "Extra data": both read the first value, SGLang after leading whitespace.
    assert_eq!(end(vllm_loads(r#"{"a": 1}; {"b""#, true)), Ok(8));
    assert_eq!(end(sglang_loads("\n{\"a\": 1} x", true)), Ok(9));
    assert_eq!(end(vllm_loads("\n{\"a\": 1} x", true)), Err(Raised::Decode));
    // A closer with nothing open.
    assert_eq!(end(sglang_loads(r#"{"a": 1}}"#, true)), Ok(8));
    assert_eq!(end(vllm_loads(r#"{"a": 1}}"#, true)), Err(Raised::EmptyPop));
    // `fix_fast` asserting on text after a closed container.
    assert_eq!(end(vllm_loads("[[1] x", true)), Err(Raised::Assertion));
    assert_eq!(end(sglang_loads("[[1] x", true)), Err(Raised::Decode));
    // `_fix`'s own exceptions pass through both.
    assert_eq!(end(sglang_loads("\"ab", false)), Err(Raised::Partial));
    assert_eq!(end(vllm_loads("x", true)), Err(Raised::Malformed));
}
