//! A passed-through event stream, split into chunks anywhere and possibly cut: what the
//! client gets is the input's complete events, then either the rest of the input or an
//! error event and `[DONE]`.
#![no_main]

use std::sync::{Arc, OnceLock};

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
    // One registry for the whole run: building it per input would dominate the time.
    static METRICS: OnceLock<Arc<Metrics>> = OnceLock::new();
    let metrics = METRICS.get_or_init(|| Arc::new(Metrics::new())).clone();
    let outcome = Outcome::new(metrics, "completions", "passthrough");
    let body = ObservedBody::new(futures_util::stream::iter(chunks), outcome, true);
    let Some(out) = body.collect::<Vec<_>>().now_or_never() else {
        panic!("a ready stream must finish in one poll");
    };
    let out: Vec<u8> = out
        .into_iter()
        .map(|c| c.expect("errors become events"))
        .flat_map(|b| b.to_vec())
        .collect();
    // Forwarded bytes are the input's, up to where specd had to end the stream itself with
    // an error event and `[DONE]` (the input may itself continue with `data: `, so look for
    // a split point rather than the first difference).
    if out.as_slice() == &rest[..out.len().min(rest.len())] {
        return;
    }
    let marker = b"data: {\"error\"";
    let ok = (0..out.len()).any(|p| {
        out[p..].starts_with(marker) && rest.starts_with(&out[..p]) && out.ends_with(b"data: [DONE]\n\n")
    });
    assert!(ok, "{:?}", String::from_utf8_lossy(&out));
});
