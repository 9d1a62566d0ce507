//! Passthrough against the real vLLM: everything specd does not speculate on must look
//! exactly like talking to the upstream directly.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn models_are_the_same_through_specd() {
    let up = upstream();
    let specd = Specd::start_ready(&up, &["--speculation", "off"]).await;
    let direct: Value = client()
        .get(format!("{up}/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let via: Value = client()
        .get(format!("{}/v1/models", specd.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let strip = |v: &Value| {
        let mut v = v.clone();
        for m in v["data"].as_array_mut().unwrap() {
            m.as_object_mut().unwrap().remove("created");
            m.as_object_mut().unwrap().remove("permission");
        }
        v
    };
    assert_eq!(strip(&direct), strip(&via));
    assert_eq!(via["data"][0]["owned_by"], "vllm");
}

#[tokio::test]
async fn completions_and_chat_match_direct_when_passed_through() {
    let up = upstream();
    let specd = Specd::start_ready(&up, &["--speculation", "off"]).await;
    let model = model_name();
    let comp = json!({"model": model, "prompt": "def fibonacci(n):\n    ", "max_tokens": 24, "temperature": 0});
    let (s1, d) = post(&up, "/v1/completions", &comp).await;
    let (s2, v) = post(&specd.url, "/v1/completions", &comp).await;
    assert_eq!((s1, s2), (200, 200));
    assert_eq!(d["choices"][0]["text"], v["choices"][0]["text"]);
    assert_eq!(d["usage"], v["usage"]);

    let mut sc = comp.clone();
    sc["stream"] = json!(true);
    sc["stream_options"] = json!({"include_usage": true});
    let (_, de, ddone) = post_stream(&up, "/v1/completions", &sc).await;
    let (_, ve, vdone) = post_stream(&specd.url, "/v1/completions", &sc).await;
    assert!(ddone && vdone);
    assert_eq!(stream_text(&de), stream_text(&ve));
    assert_eq!(de.last().unwrap()["usage"], ve.last().unwrap()["usage"]);

    let chat = json!({"model": model, "messages": [{"role": "user", "content": "Say something about specd."}],
                      "max_tokens": 20, "temperature": 0, "stream": true, "stream_options": {"include_usage": true}});
    let (_, de, _) = post_stream(&up, "/v1/chat/completions", &chat).await;
    let (_, ve, _) = post_stream(&specd.url, "/v1/chat/completions", &chat).await;
    assert_eq!(stream_text(&de), stream_text(&ve));
    assert_eq!(de.last().unwrap()["usage"], ve.last().unwrap()["usage"]);

    // Other routes, query strings and headers pass too.
    let tok = json!({"model": model, "prompt": "hello world"});
    let (_, a) = post(&up, "/tokenize", &tok).await;
    let (_, b) = post(&specd.url, "/tokenize", &tok).await;
    assert_eq!(a, b);
    let r = client()
        .get(format!("{}/v1/models?x=1", specd.url))
        .header("authorization", "Bearer abc")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = client()
        .get(format!("{}/no/such/route", specd.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404, "the upstream's 404 is relayed");

    let m = specd.metrics().await;
    assert!(
        m.contains(
            "specd_requests_total{mode=\"passthrough\",route=\"completions\",status=\"200\"}"
        ),
        "{m}"
    );
    assert!(m.contains("specd_passthrough_total{reason=\"disabled\"}"));
    assert!(m.contains("specd_time_to_first_token_seconds_count{mode=\"passthrough\"}"));
    assert!(m.contains("specd_upstream_info{kind=\"vllm\""));
}

/// A TCP forwarder the test can stop and restart, standing between specd and the real
/// vLLM, to take the upstream away and bring it back.
async fn forwarder(listener: TcpListener, target: String, stop: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.cancelled() => return,
        };
        let Ok((mut inbound, _)) = accepted else {
            return;
        };
        let target = target.clone();
        let s2 = stop.clone();
        tokio::spawn(async move {
            let Ok(mut outbound) = TcpStream::connect(&target).await else {
                return;
            };
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                _ = s2.cancelled() => { let _ = inbound.shutdown().await; }
            }
        });
    }
}

#[tokio::test]
async fn upstream_down_gives_502_and_specd_recovers() {
    let up = upstream();
    let target = up.trim_start_matches("http://").to_string();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let fwd = tokio::spawn(forwarder(listener, target.clone(), stop.clone()));
    let specd = Specd::start_ready(&format!("http://{addr}"), &["--speculation", "off"]).await;
    let body = json!({"model": model_name(), "prompt": "hello", "max_tokens": 4, "temperature": 0});
    let (s, _) = post(&specd.url, "/v1/completions", &body).await;
    assert_eq!(s, 200);

    // Take the upstream away.
    stop.cancel();
    fwd.await.unwrap();
    let (s, v) = post(&specd.url, "/v1/completions", &body).await;
    assert_eq!(s, 502, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("upstream"));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let r = client()
            .get(format!("{}/readyz", specd.url))
            .send()
            .await
            .unwrap();
        if r.status() == 503 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "readyz never turned 503"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        client()
            .get(format!("{}/livez", specd.url))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );

    // Bring it back on the same address.
    let listener = TcpListener::bind(addr).await.unwrap();
    tokio::spawn(forwarder(listener, target, CancellationToken::new()));
    specd.wait_ready(common::READY_TIMEOUT).await;
    let (s, _) = post(&specd.url, "/v1/completions", &body).await;
    assert_eq!(s, 200);
    let m = specd.metrics().await;
    assert!(
        m.contains("specd_upstream_errors_total{kind=\"connect\"}"),
        "{m}"
    );
}
