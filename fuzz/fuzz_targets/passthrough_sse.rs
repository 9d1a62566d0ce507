//! A passed-through event stream, split into chunks anywhere and possibly cut: what the
//! client gets is the input's complete events, then either the rest of the input or an
//! error event and `[DONE]`.
#![no_main]

use std::sync::Arc;

use futures_util::{FutureExt, StreamExt};
use libfuzzer_sys::fuzz_target;
use specd::metrics::Metrics;
use specd::server::observe::{ObservedBody, Outcome};

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let cut_off = flags & 1 == 1;
    let step = usize::from(flags >> 1).max(1);
    let mut chunks: Vec<Result<bytes::Bytes, String>> = rest
        .chunks(step)
        .map(|c| Ok(bytes::Bytes::copy_from_slice(c)))
        .collect();
    if cut_off {
        chunks.push(Err("cut".into()));
    }
    let outcome = Outcome::new(Arc::new(Metrics::new()), "completions", "passthrough");
    let body = ObservedBody::new(futures_util::stream::iter(chunks), outcome, true);
    let Some(out) = body.collect::<Vec<_>>().now_or_never() else {
        panic!("a ready stream must finish in one poll");
    };
    let out: Vec<u8> = out
        .into_iter()
        .map(|c| c.expect("errors become events"))
        .flat_map(|b| b.to_vec())
        .collect();
    // Forwarded bytes are the input's, up to where specd had to end the stream itself.
    let same = out.iter().zip(rest).take_while(|(a, b)| a == b).count();
    if same < out.len() {
        assert!(out[same..].starts_with(b"data: {\"error\""), "{:?}", String::from_utf8_lossy(&out));
        assert!(out.ends_with(b"data: [DONE]\n\n"));
    }
});
