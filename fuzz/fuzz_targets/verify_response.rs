//! vLLM verify responses: any JSON the upstream may answer with is either read or refused
//! as a protocol error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use specd::upstream::vllm::parse_verify_response;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    if let Ok(v) = serde_json::from_slice::<Value>(rest) {
        let expected = usize::from(flags & 7);
        if let Ok(samples) = parse_verify_response(&v, expected, flags & 8 != 0) {
            assert_eq!(samples.len(), expected);
        }
    }
});
