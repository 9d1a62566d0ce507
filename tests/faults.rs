//! Upstream faults, injected by the stand-in upstream: every one gives the client a clean
//! OpenAI-style error (an HTTP status before streaming started; an error event and `[DONE]`
//! after), never a hang; other streams carry on; specd recovers by itself.

mod common;

use std::time::{Duration, Instant};

use common::fault::{self, continuation, MODEL};
use common::*;
use futures_util::future::join_all;
use serde_json::{json, Value};
use specd_sim::fault::{Call, Fault};
use specd_sim::Upstream;

/// A token-id prompt the n-gram drafter has nothing for at first (so `auto` relays).
fn prompt(seed: u32) -> Vec<u32> {
    (0..6).map(|i| 200 + seed * 10 + i).collect()
}

fn body(prompt: &[u32], max_tokens: u32, mode: &str, stream: bool) -> Value {
    json!({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
           "logprobs": 0, "return_tokens_as_token_ids": true, "stream": stream,
           "speculation": mode})
}

async fn start(extra: &[&str]) -> (Upstream, Specd) {
    let up = fault::start().await;
    let specd = Specd::start_ready(&up.url, extra).await;
    (up, specd)
}

/// An error event followed by `[DONE]` closes the stream; returns the error object.
fn assert_error_end(events: &[Value], done: bool, broken: bool) -> Value {
    assert!(done && !broken, "stream must end with [DONE], not a cut");
    let last = events.last().expect("events");
    error_of(last)
        .unwrap_or_else(|| panic!("last event is not an error: {last}"))
        .clone()
}

#[tokio::test]
async fn upstream_5xx_before_the_first_token_is_the_http_status() {
    let (up, specd) = start(&[]).await;
    let p = prompt(1);
    up.fail(Call::Verify, Fault::Status(500));
    for stream in [false, true] {
        let (s, v) = post(&specd.url, "/v1/completions", &body(&p, 8, "on", stream)).await;
        assert_eq!(s, 500, "{v}");
        assert_eq!(v["error"]["code"], 500, "{v}");
        assert!(v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("fault injected"));
    }
    // 500 is an answer, not a transport failure: not retried.
    assert_eq!(up.calls(Call::Verify), 2);
    up.clear();
    up.fail(Call::Stream, Fault::Status(500));
    let (s, v) = post(&specd.url, "/v1/completions", &body(&p, 8, "auto", true)).await;
    assert_eq!(s, 500, "relay start failing: {v}");
    up.clear();
    let (s, v) = post(&specd.url, "/v1/completions", &body(&p, 8, "on", false)).await;
    assert_eq!(s, 200, "recovers with the upstream: {v}");
    assert_eq!(token_ids(&v), continuation(&p, 8));
}

#[tokio::test]
async fn transient_verify_failures_are_retried_without_changing_output() {
    let (up, specd) = start(&[]).await;
    let p = prompt(2);
    let want = continuation(&p, 12);
    // Two failures of one call (a broken connection, then a 503) are absorbed.
    up.fail_times(Call::Verify, Fault::Cut(0), 1);
    up.fail_times(Call::Verify, Fault::Status(503), 1);
    let (s, v) = post(&specd.url, "/v1/completions", &body(&p, 12, "on", false)).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        token_ids(&v),
        want,
        "retries neither lose nor duplicate tokens"
    );
    // Three in a row are not: the retries are bounded.
    up.fail_times(Call::Verify, Fault::Status(503), 3);
    let before = up.calls(Call::Verify);
    let (s, v) = post(&specd.url, "/v1/completions", &body(&p, 12, "on", false)).await;
    assert_eq!(s, 503, "{v}");
    assert_eq!(up.calls(Call::Verify) - before, 3);
    let m = specd.metrics().await;
    assert!(metric_value(&m, "specd_upstream_errors_total{kind=\"status\"}").unwrap() >= 4.0);
}

#[tokio::test]
async fn malformed_json_gives_502() {
    let (up, specd) = start(&[]).await;
    let p = prompt(3);
    up.fail(Call::Verify, Fault::Malformed(0));
    let (s, v) = post(&specd.url, "/v1/completions", &body(&p, 8, "on", false)).await;
    assert_eq!(s, 502, "{v}");
    assert_eq!(v["error"]["type"], "UpstreamError");
    up.clear();
    // A malformed event in the middle of a relay stream.
    up.fail(Call::Stream, Fault::Malformed(4));
    let mut r = SseReader::open(&specd.url, "/v1/completions", &body(&p, 30, "auto", true)).await;
    assert_eq!(r.status, 200);
    let (events, done) = r.rest().await;
    let err = assert_error_end(&events, done, r.broken);
    assert_eq!(err["code"], 502, "{err}");
    let got = stream_token_ids(&events);
    assert_eq!(
        got,
        continuation(&p, got.len()),
        "tokens before the error are right"
    );
    assert!(!got.is_empty());
}

#[tokio::test]
async fn a_stream_cut_mid_way_ends_with_an_error_event() {
    let (up, specd) = start(&[]).await;
    let p = prompt(4);
    up.fail(Call::Stream, Fault::Cut(5));
    let mut r = SseReader::open(&specd.url, "/v1/completions", &body(&p, 40, "auto", true)).await;
    assert_eq!(r.status, 200);
    let (events, done) = r.rest().await;
    let err = assert_error_end(&events, done, r.broken);
    assert_eq!(err["code"], 502);
    let got = stream_token_ids(&events);
    assert_eq!(
        got,
        continuation(&p, 5),
        "the tokens sent before the cut, once each"
    );
    // Non-streamed: the same failure is the HTTP status.
    let (s, v) = post(&specd.url, "/v1/completions", &body(&p, 40, "auto", false)).await;
    assert_eq!(s, 502, "{v}");
}

#[tokio::test]
async fn passthrough_streams_cut_by_the_upstream_end_with_an_error_event() {
    let (up, specd) = start(&["--speculation", "off"]).await;
    let p = prompt(5);
    up.fail_times(Call::Stream, Fault::Cut(3), 1);
    let mut r = SseReader::open(&specd.url, "/v1/completions", &body(&p, 20, "off", true)).await;
    let (events, done) = r.rest().await;
    let err = assert_error_end(&events, done, r.broken);
    assert_eq!(err["code"], 502);
    assert_eq!(stream_token_ids(&events), continuation(&p, 3));
    // Ending without [DONE] after a malformed event is not a success either.
    up.fail_times(Call::Stream, Fault::Malformed(2), 1);
    let mut r = SseReader::open(&specd.url, "/v1/completions", &body(&p, 20, "off", true)).await;
    let (events, done) = r.rest().await;
    assert_error_end(&events, done, r.broken);
    // An intact stream passes unchanged.
    let (s, events, done) =
        post_stream(&specd.url, "/v1/completions", &body(&p, 20, "off", true)).await;
    assert!(s == 200 && done);
    assert_eq!(stream_token_ids(&events), continuation(&p, 20));
    assert!(events.iter().all(|e| error_of(e).is_none()));
    let m = specd.metrics().await;
    let cut = "specd_requests_total{mode=\"passthrough\",route=\"completions\",status=\"502\"}";
    assert_eq!(metric_value(&m, cut), Some(2.0), "{m}");
}

/// A connection the upstream closes before answering (an idle keep-alive connection it
/// closed as specd sent on it) is no answer: a passed-through request whose body specd
/// holds is sent again, as a verify call is, and the client sees nothing of it.
#[tokio::test]
async fn passthrough_requests_are_sent_again_when_the_connection_closes_unanswered() {
    let (up, specd) = start(&["--speculation", "off"]).await;
    let p = prompt(7);
    up.fail_times(Call::Stream, Fault::Drop, 2);
    let (s, events, done) =
        post_stream(&specd.url, "/v1/completions", &body(&p, 12, "off", true)).await;
    assert!(s == 200 && done, "{s}");
    assert_eq!(stream_token_ids(&events), continuation(&p, 12));
    assert!(events.iter().all(|e| error_of(e).is_none()));
    assert_eq!(up.calls(Call::Stream), 3);
    up.fail_times(Call::Complete, Fault::Drop, 1);
    let (s, v) = post(&specd.url, "/v1/completions", &body(&p, 12, "off", false)).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(token_ids(&v), continuation(&p, 12));
    // Bounded: three in a row are the upstream's failure, a 502.
    up.fail_times(Call::Stream, Fault::Drop, 3);
    let before = up.calls(Call::Stream);
    let (s, v) = post(&specd.url, "/v1/completions", &body(&p, 12, "off", true)).await;
    assert_eq!(s, 502, "{v}");
    assert_eq!(v["error"]["code"], 502, "{v}");
    assert_eq!(up.calls(Call::Stream) - before, 3);
    let m = specd.metrics().await;
    let dropped = "specd_upstream_errors_total{kind=\"protocol\"}";
    assert_eq!(metric_value(&m, dropped), Some(6.0), "{m}");
}

#[tokio::test]
async fn verify_timeout_bounds_a_hung_upstream() {
    // 3 s: far above a 30 ms verify even on a loaded machine, so only the hang times out.
    let (up, specd) = start(&["--verify-timeout", "3"]).await;
    let p = prompt(6);
    up.fail(Call::Verify, Fault::Hang);
    let t = Instant::now();
    let (s, v) = post(&specd.url, "/v1/completions", &body(&p, 8, "on", true)).await;
    let took = t.elapsed();
    assert_eq!(s, 504, "{v}");
    assert!(
        took < Duration::from_secs(10),
        "timeouts are not retried: {took:?}"
    );
    println!("FAULT verify hang: HTTP 504 after {} ms", took.as_millis());
    // The stand-in notices the closed connection on its own task: wait for it.
    let abandoned = wait_for(Duration::from_secs(5), || async { up.running() == 0 }).await;
    assert!(
        abandoned,
        "the hung call was abandoned: {} running",
        up.running()
    );

    // Mid-stream: tokens flow, then the upstream stops answering.
    up.clear();
    up.fail(Call::Verify, Fault::Delay(Duration::from_millis(30)));
    let mut r = SseReader::open(&specd.url, "/v1/completions", &body(&p, 1500, "on", true)).await;
    assert_eq!(r.status, 200);
    let first = r.next().await.expect("a first chunk");
    assert!(first.contains("token_id:"), "{first}");
    up.clear();
    up.fail(Call::Verify, Fault::Hang);
    let t = Instant::now();
    let (events, done) = r.rest().await;
    let err = assert_error_end(&events, done, r.broken);
    assert_eq!(err["code"], 504, "{err}");
    println!(
        "FAULT verify hang mid-stream: error event 504 + [DONE] after {} ms",
        t.elapsed().as_millis()
    );

    // A relay whose tokens stop coming is bounded the same way: the next token would come
    // an hour later, so ending at all means the bound ended it (on a loaded machine after
    // more than one segment's wait, hence no tighter limit than the test's own).
    up.clear();
    up.set_token_delay(Duration::from_secs(3600));
    let t = Instant::now();
    let relay = async {
        let mut r =
            SseReader::open(&specd.url, "/v1/completions", &body(&p, 50, "auto", true)).await;
        if r.status == 504 {
            // On a loaded machine even the first token can miss the bound: then the
            // timeout comes before any event and is the HTTP status.
            println!("FAULT relay hang before the first token: HTTP 504");
        } else {
            let (events, done) = r.rest().await;
            let err = assert_error_end(&events, done, r.broken);
            assert_eq!(err["code"], 504, "{err}");
            println!(
                "FAULT relay hang: error event 504 + [DONE] after {} ms",
                t.elapsed().as_millis()
            );
        }
    };
    assert!(
        tokio::time::timeout(Duration::from_secs(300), relay)
            .await
            .is_ok(),
        "a relay whose next token never comes ends with the idle bound"
    );
}

#[tokio::test]
async fn slow_upstream_within_the_timeout_is_only_slower() {
    let (up, specd) = start(&["--verify-timeout", "5"]).await;
    let p = prompt(7);
    up.fail(Call::Verify, Fault::Delay(Duration::from_millis(200)));
    up.set_token_delay(Duration::from_millis(20));
    for mode in ["on", "auto"] {
        let (s, events, done) =
            post_stream(&specd.url, "/v1/completions", &body(&p, 16, mode, true)).await;
        assert!(s == 200 && done, "{mode}");
        assert_eq!(stream_token_ids(&events), continuation(&p, 16), "{mode}");
    }
}

#[tokio::test]
async fn refused_connections_then_recovery() {
    let (up, specd) = start(&[]).await;
    let p = prompt(8);
    // A stream in flight when the upstream goes away.
    up.set_token_delay(Duration::from_millis(20));
    let mut r = SseReader::open(&specd.url, "/v1/completions", &body(&p, 500, "auto", true)).await;
    // The first event may already carry tokens: they count with the rest.
    let first = r.next().await.expect("a first event");
    let first: Value = serde_json::from_str(&first).unwrap_or(Value::Null);
    let t_down = Instant::now();
    up.down().await;
    let (events, done) = r.rest().await;
    let err = assert_error_end(&events, done, r.broken);
    assert_eq!(err["code"], 502);
    let mut got = token_ids(&first);
    got.extend(stream_token_ids(&events));
    assert_eq!(got, continuation(&p, got.len()));

    // New requests: a prompt Text needs the tokenizer call, token ids go to verify.
    for b in [
        body(&p, 8, "on", true),
        json!({"model": MODEL, "prompt": "hello", "max_tokens": 4}),
    ] {
        let t = Instant::now();
        let (s, v) = post(&specd.url, "/v1/completions", &b).await;
        assert_eq!(s, 502, "{v}");
        println!(
            "FAULT refused: HTTP 502 after {} ms",
            t.elapsed().as_millis()
        );
    }
    let c = client();
    let ready = |want: u16| {
        let c = c.clone();
        let url = format!("{}/readyz", specd.url);
        move || {
            let (c, url) = (c.clone(), url.clone());
            async move { c.get(url).send().await.is_ok_and(|r| r.status() == want) }
        }
    };
    assert!(
        wait_for(Duration::from_secs(20), ready(503)).await,
        "readyz never turned 503"
    );
    println!(
        "FAULT refused: /readyz 503 {} ms after the upstream went",
        t_down.elapsed().as_millis()
    );

    up.up().await;
    let t_up = Instant::now();
    assert!(
        wait_for(Duration::from_secs(20), ready(200)).await,
        "readyz never recovered"
    );
    println!(
        "RECOVERY refused: /readyz 200 {} ms after the upstream returned (health interval 0.2 s)",
        t_up.elapsed().as_millis()
    );
    up.set_token_delay(Duration::ZERO);
    let (s, v) = post(&specd.url, "/v1/completions", &body(&p, 8, "auto", false)).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(token_ids(&v), continuation(&p, 8));
}

#[tokio::test]
async fn unhealthy_upstream_turns_readyz_and_back() {
    let (up, specd) = start(&[]).await;
    let c = client();
    let url = format!("{}/readyz", specd.url);
    let status = || {
        let (c, url) = (c.clone(), url.clone());
        async move {
            c.get(url)
                .send()
                .await
                .map(|r| r.status().as_u16())
                .unwrap_or(0)
        }
    };
    up.fail(Call::Health, Fault::Status(503));
    let t = Instant::now();
    assert!(wait_for(Duration::from_secs(20), || async { status().await == 503 }).await);
    println!(
        "FAULT /health 503: /readyz 503 after {} ms",
        t.elapsed().as_millis()
    );
    up.clear();
    let t = Instant::now();
    assert!(wait_for(Duration::from_secs(20), || async { status().await == 200 }).await);
    println!(
        "RECOVERY /health: /readyz 200 after {} ms",
        t.elapsed().as_millis()
    );
    let m = specd.metrics().await;
    assert_eq!(metric_value(&m, "specd_upstream_ready"), Some(1.0));
}

#[tokio::test]
async fn a_failing_stream_leaves_the_others_alone() {
    let (up, specd) = start(&[]).await;
    up.set_token_delay(Duration::from_millis(5));
    let bad = prompt(9);
    // Every call for the marked prompt fails, verify and relay alike.
    up.fail_marked(Call::Stream, Fault::Cut(3), bad[0]);
    up.fail_marked(Call::Verify, Fault::Status(500), bad[0]);
    let mut jobs = Vec::new();
    for i in 0..8u32 {
        let p = if i == 0 { bad.clone() } else { prompt(10 + i) };
        let mode = if i % 2 == 0 { "auto" } else { "on" };
        let url = specd.url.clone();
        jobs.push(async move {
            let r = post_stream(&url, "/v1/completions", &body(&p, 120, mode, true)).await;
            (p, r)
        });
    }
    let results = join_all(jobs).await;
    for (i, (p, (s, events, done))) in results.into_iter().enumerate() {
        if i == 0 {
            assert!(s == 200 && done);
            assert!(error_of(events.last().unwrap()).is_some());
            continue;
        }
        assert!(s == 200 && done, "stream {i}");
        assert_eq!(
            stream_token_ids(&events),
            continuation(&p, 120),
            "stream {i}"
        );
        assert!(events.iter().all(|e| error_of(e).is_none()), "stream {i}");
    }
    let m = specd.metrics().await;
    assert_eq!(metric_sum(&m, "specd_active_streams"), 0.0);
}
