//! Graceful shutdown: on SIGTERM /readyz turns 503 and new requests are refused with a
//! clean 503, while the streams in flight finish, up to --drain-timeout.

mod common;

use std::time::{Duration, Instant};

use common::fault::{self, continuation, MODEL};
use common::*;
use serde_json::{json, Value};
use specd_sim::fault::{Call, Fault};

fn body(prompt: &[u32], max_tokens: u32, mode: &str) -> Value {
    json!({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
           "logprobs": 0, "return_tokens_as_token_ids": true, "stream": true, "speculation": mode})
}

/// Wait for the process to exit; its status, or `None` past the deadline.
async fn exited(specd: &mut Specd, within: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(Some(s)) = specd.child.try_wait() {
            return Some(s);
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_streams_in_flight() {
    let up = fault::start().await;
    up.set_token_delay(Duration::from_millis(10));
    let mut specd = Specd::start_env(
        &up.url,
        &["--drain-timeout", "60", "--metrics-listen", "127.0.0.1:0"],
        &[("SPECD_LOG", "info")],
    );
    specd.wait_ready(common::READY_TIMEOUT).await;
    let admin = specd.admin().to_string();
    let prompts: Vec<Vec<u32>> = (0..3)
        .map(|i| (600 + i * 10..606 + i * 10).collect())
        .collect();
    let mut readers = Vec::new();
    for (p, mode) in prompts.iter().zip(["auto", "on", "off"]) {
        let mut r = SseReader::open(&specd.url, "/v1/completions", &body(p, 200, mode)).await;
        assert_eq!(r.status, 200);
        let first = r.next().await.expect("first chunk");
        readers.push((r, vec![serde_json::from_str::<Value>(&first).unwrap()]));
    }
    let t = Instant::now();
    specd.terminate();
    let c = client();
    let ok = wait_for(Duration::from_secs(10), || async {
        c.get(format!("{admin}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status() == 503)
    })
    .await;
    assert!(ok, "/readyz turns 503 while draining");
    let (s, v) = post(&specd.url, "/v1/completions", &body(&prompts[0], 4, "auto")).await;
    assert_eq!(s, 503, "new requests are refused: {v}");
    assert_eq!(v["error"]["type"], "ServiceUnavailableError");
    for (i, (mut r, mut events)) in readers.into_iter().enumerate() {
        let (rest, done) = r.rest().await;
        events.extend(rest);
        assert!(done && !r.broken, "stream {i} finished");
        assert_eq!(
            stream_token_ids(&events),
            continuation(&prompts[i], 200),
            "stream {i}"
        );
    }
    let status = exited(&mut specd, Duration::from_secs(20))
        .await
        .expect("specd exits once drained");
    assert!(status.success(), "{status}");
    println!(
        "SHUTDOWN drained 3 streams and exited {} ms after SIGTERM",
        t.elapsed().as_millis()
    );
    let log = specd.final_log_text();
    assert!(log.contains("drained"), "{log}");
}

/// Streams still going when the drain timeout passes end with a 503 error event and
/// `[DONE]`: speculated ones and passthrough ones alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_timeout_bounds_the_shutdown() {
    let up = fault::start().await;
    up.set_token_delay(Duration::from_millis(50));
    // Verify rounds answer at once on the fake upstream, so on a fast machine speculation
    // can finish the stream inside the drain timeout; with them held, the stream goes at
    // the relay's 50 ms per token.
    up.fail(Call::Verify, Fault::Hang);
    let mut specd = Specd::start_ready(&up.url, &["--drain-timeout", "1"]).await;
    let mut readers = Vec::new();
    for (i, mode) in ["auto", "off"].into_iter().enumerate() {
        let p: Vec<u32> = (700 + i as u32 * 10..706 + i as u32 * 10).collect();
        let mut r = SseReader::open(&specd.url, "/v1/completions", &body(&p, 1000, mode)).await;
        let first = r.next().await.expect("first chunk");
        readers.push((
            mode,
            r,
            vec![serde_json::from_str::<Value>(&first).unwrap()],
        ));
    }
    let t = Instant::now();
    specd.terminate();
    let status = exited(&mut specd, Duration::from_secs(15))
        .await
        .expect("exits after the drain timeout");
    let took = t.elapsed();
    assert!(status.success());
    assert!(
        took >= Duration::from_millis(900),
        "waited for the streams: {took:?}"
    );
    for (mode, mut r, mut events) in readers {
        let (rest, done) = r.rest().await;
        events.extend(rest);
        assert!(done && !r.broken, "{mode}: the stream is ended, not cut");
        let last = events.last().expect("events");
        let err = error_of(last).unwrap_or_else(|| panic!("{mode}: ends with an error: {last}"));
        assert_eq!(err["type"], "ServiceUnavailableError", "{mode}: {err}");
        assert!(
            err["message"]
                .as_str()
                .is_some_and(|m| m.contains("drain timeout")),
            "{mode}: {err}"
        );
        let n = stream_token_ids(&events).len();
        assert!(
            n < 1000,
            "{mode}: the 50 s stream could not finish in 1 s ({n} tokens)"
        );
    }
    println!(
        "SHUTDOWN drain timeout 1 s: exited {} ms after SIGTERM",
        took.as_millis()
    );
}

#[tokio::test]
async fn idle_shutdown_is_immediate() {
    let up = fault::start().await;
    let mut specd = Specd::start_ready(&up.url, &["--drain-timeout", "30"]).await;
    let t = Instant::now();
    specd.terminate();
    let status = exited(&mut specd, Duration::from_secs(10))
        .await
        .expect("exits");
    assert!(status.success());
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

/// A SIGTERM that arrives as soon as specd reports its address still drains and exits
/// cleanly (the handlers are in place before specd listens).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_right_after_start_exits_cleanly() {
    let up = fault::start().await;
    for _ in 0..5 {
        let mut specd = Specd::start(&up.url, &["--drain-timeout", "5"]);
        specd.terminate();
        let status = exited(&mut specd, Duration::from_secs(10))
            .await
            .expect("exits");
        assert!(status.success(), "{status}");
    }
}
