//! The upstream SSE parser: any bytes, split anywhere, give the same events as when fed
//! whole.
#![no_main]

use libfuzzer_sys::fuzz_target;
use specd::upstream::sse::SseParser;

fuzz_target!(|data: &[u8]| {
    let Some((&cut, rest)) = data.split_first() else {
        return;
    };
    let mut whole = SseParser::new();
    let want = whole.feed(rest);
    let cut = usize::from(cut).min(rest.len());
    let mut parts = SseParser::new();
    let mut got = parts.feed(&rest[..cut]);
    got.extend(parts.feed(&rest[cut..]));
    assert_eq!(want, got);
    assert_eq!(whole.pending(), parts.pending());
});
