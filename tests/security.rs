//! Security: credentials go to the upstream untouched, specd's own API key, the admin
//! address, nothing of prompts or outputs in the logs, no way for a client to pick the
//! upstream, and TLS to an upstream behind a private CA.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::fault::{self, continuation, MODEL};
use common::*;
use serde_json::{json, Value};
use specd_sim::fault::{Call, Fault};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn tokens_body(prompt: &[u32], mode: &str, stream: bool) -> Value {
    json!({"model": MODEL, "prompt": prompt, "max_tokens": 24, "temperature": 0, "logprobs": 0,
           "return_tokens_as_token_ids": true, "stream": stream, "speculation": mode})
}

async fn send(req: reqwest::RequestBuilder) -> (u16, String) {
    let r = req.send().await.expect("request");
    (r.status().as_u16(), r.text().await.unwrap_or_default())
}

#[tokio::test]
async fn authorization_reaches_the_upstream_untouched() {
    let up = fault::start().await;
    let specd = Specd::start_ready(&up.url, &[]).await;
    let auth = "Bearer client-secret-Zq9";
    let c = client();
    let prompt: Vec<u32> = (300..308).collect();
    for (mode, stream) in [("on", false), ("auto", true), ("off", true)] {
        let (s, t) = send(
            c.post(format!("{}/v1/completions", specd.url))
                .header("authorization", auth)
                .json(&tokens_body(&prompt, mode, stream)),
        )
        .await;
        assert_eq!(s, 200, "{mode}: {t}");
    }
    let text =
        json!({"model": MODEL, "prompt": "a text prompt", "max_tokens": 4, "speculation": "on"});
    let (s, _) = send(
        c.post(format!("{}/v1/completions", specd.url))
            .header("authorization", auth)
            .json(&text),
    )
    .await;
    assert_eq!(s, 200);
    let (s, _) = send(
        c.get(format!("{}/v1/models", specd.url))
            .header("authorization", auth),
    )
    .await;
    assert_eq!(s, 200);

    let seen = up.seen();
    let for_client: Vec<_> = seen
        .iter()
        .filter(|r| matches!(r.path.as_str(), "/v1/completions" | "/tokenize"))
        // specd's own tokenizer check at start is no client's request.
        .filter(|r| !r.body.to_string().contains("specd check:"))
        .collect();
    assert!(
        up.calls(Call::Verify) > 0 && up.calls(Call::Stream) > 0 && up.calls(Call::Tokenize) > 0
    );
    for r in &for_client {
        assert_eq!(
            r.authorization.as_deref(),
            Some(auth),
            "{} {}",
            r.path,
            r.body
        );
    }
    let models: Vec<_> = seen.iter().filter(|r| r.path == "/v1/models").collect();
    assert!(models
        .iter()
        .any(|r| r.authorization.as_deref() == Some(auth)));
    // specd's own health checks carry no client's credentials.
    assert!(seen
        .iter()
        .filter(|r| r.path == "/health")
        .all(|r| r.authorization.is_none()));
}

#[tokio::test]
async fn api_key_guards_the_client_address() {
    let up = fault::start().await;
    let specd = Specd::start_ready(&up.url, &["--api-key", "k-123"]).await;
    let c = client();
    let url = format!("{}/v1/completions", specd.url);
    let b = tokens_body(&[400, 401, 402], "on", false);
    let (s, t) = send(c.post(&url).json(&b)).await;
    assert_eq!(s, 401, "{t}");
    let v: Value = serde_json::from_str(&t).unwrap();
    assert_eq!(v["error"]["type"], "AuthenticationError");
    for wrong in [
        "Bearer k-12",
        "Bearer k-1234",
        "Bearer K-123",
        "Basic k-123",
        "k-123",
    ] {
        let (s, _) = send(c.post(&url).header("authorization", wrong).json(&b)).await;
        assert_eq!(s, 401, "{wrong}");
    }
    let (s, t) = send(
        c.post(&url)
            .header("authorization", "Bearer k-123")
            .json(&b),
    )
    .await;
    assert_eq!(s, 200, "{t}");
    let (s, _) = send(c.get(format!("{}/v1/models", specd.url))).await;
    assert_eq!(s, 401, "forwarded routes are guarded too");
    // Probes and metrics stay open to the orchestrator.
    for p in ["/livez", "/readyz", "/metrics"] {
        let (s, _) = send(c.get(format!("{}{p}", specd.url))).await;
        assert_eq!(s, 200, "{p}");
    }
    let m = specd.metrics().await;
    assert_eq!(
        metric_value(&m, "specd_rejected_requests_total{reason=\"unauthorized\"}"),
        Some(7.0)
    );
    assert!(up
        .seen()
        .iter()
        .filter(|r| r.path == "/v1/completions")
        .all(|r| r.authorization.as_deref() == Some("Bearer k-123")));
}

/// An empty `SPECD_*` variable counts as unset (a compose file's `${VAR:-}` leaves it
/// empty): empty parser names start specd with its defaults, and an empty API key asks for
/// no key, as vLLM treats an empty `VLLM_API_KEY`.
#[tokio::test]
async fn empty_variables_count_as_unset() {
    let up = fault::start().await;
    let specd = Specd::start_env(
        &up.url,
        &[],
        &[
            ("SPECD_API_KEY", ""),
            ("SPECD_REASONING_PARSER", ""),
            ("SPECD_TOOL_CALL_PARSER", ""),
            ("SPECD_ENABLE_AUTO_TOOL_CHOICE", ""),
            ("SPECD_LOG", "info"),
        ],
    );
    specd.wait_ready(common::READY_TIMEOUT).await;
    let b = tokens_body(&[410, 411, 412], "on", false);
    let (s, t) = send(
        client()
            .post(format!("{}/v1/completions", specd.url))
            .json(&b),
    )
    .await;
    assert_eq!(s, 200, "{t}");
    let v: Value = serde_json::from_str(&t).unwrap();
    assert!(
        v["usage"]["speculation"]["rounds"].as_u64() > Some(0),
        "{v}"
    );
    let log = specd.log_text();
    assert!(log.contains("empty variables count as unset"), "{log}");
}

#[tokio::test]
async fn admin_endpoints_on_their_own_address() {
    let up = fault::start().await;
    let specd = Specd::start_ready(
        &up.url,
        &["--metrics-listen", "127.0.0.1:0", "--api-key", "k"],
    )
    .await;
    let admin = specd.admin_url.clone().expect("admin address");
    assert_ne!(admin, specd.url);
    let c = client();
    let (s, t) = send(c.get(format!("{admin}/metrics"))).await;
    assert!(s == 200 && t.contains("specd_build_info"), "{t}");
    for p in ["/livez", "/readyz"] {
        let (s, _) = send(c.get(format!("{admin}{p}"))).await;
        assert_eq!(s, 200, "{p}");
    }
    // On the client address these paths are the upstream's, behind the API key.
    let (s, _) = send(c.get(format!("{}/metrics", specd.url))).await;
    assert_eq!(s, 401);
    let (s, t) = send(c.get(format!("{}/metrics", specd.url)).bearer_auth("k")).await;
    assert!(s == 200 && t.contains("stand-in upstream metrics"), "{t}");
    assert!(!t.contains("specd_"));
    let (s, _) = send(c.get(format!("{admin}/v1/models"))).await;
    assert_eq!(s, 404, "the admin address serves nothing else");
}

#[tokio::test]
async fn prompts_and_outputs_stay_out_of_the_logs() {
    let up = fault::start().await;
    for format in ["text", "json"] {
        // Default level: no SPECD_LOG.
        let mut specd = Specd::start_env(&up.url, &["--log-format", format], &[]);
        specd.wait_ready(common::READY_TIMEOUT).await;
        let secret = "SECRET-PROMPT-4f1c";
        let c = client();
        let mut outputs = Vec::new();
        for b in [
            json!({"model": MODEL, "prompt": secret, "max_tokens": 24, "speculation": "on"}),
            json!({"model": MODEL, "prompt": secret, "max_tokens": 24, "speculation": "auto", "stream": true}),
            json!({"model": MODEL, "prompt": secret, "max_tokens": 24, "speculation": "off"}),
            json!({"model": MODEL, "prompt": secret, "max_tokens": -1}),
        ] {
            let (_, t) = send(c.post(format!("{}/v1/completions", specd.url)).json(&b)).await;
            if let Ok(v) = serde_json::from_str::<Value>(&t) {
                if let Some(text) = v.pointer("/choices/0/text").and_then(Value::as_str) {
                    outputs.push(text.to_string());
                }
            }
        }
        let (_, _) = send(
            c.post(format!("{}/v1/completions", specd.url))
                .body(format!("{{\"prompt\": \"{secret}")),
        )
        .await;
        // Failures are logged too, without the request.
        up.fail(Call::Verify, Fault::Status(500));
        let (s, _) = send(
            c.post(format!("{}/v1/completions", specd.url))
                .json(&json!({"model": MODEL, "prompt": secret, "speculation": "on"})),
        )
        .await;
        assert_eq!(s, 500);
        up.clear();
        // Read the whole log: stop specd and wait for its stderr to close.
        specd.terminate();
        let _ = specd.child.wait();
        let logs = specd.final_log_text();
        assert!(logs.contains("listening"), "logs are captured: {logs}");
        assert!(
            !logs.contains(secret),
            "{format} log holds the prompt:\n{logs}"
        );
        assert!(outputs.concat().len() >= 8, "outputs: {outputs:?}");
        for o in &outputs {
            let o = o.trim();
            if o.len() >= 6 {
                assert!(
                    !logs.contains(o),
                    "{format} log holds an output {o:?}:\n{logs}"
                );
            }
        }
    }
}

/// Send a raw HTTP/1.1 request and return the whole answer.
async fn raw_http(addr: &str, request: String) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(request.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn clients_cannot_choose_the_upstream() {
    let up = fault::start().await;
    let other = fault::start().await;
    let specd = Specd::start_ready(&up.url, &[]).await;
    let addr = specd.url.trim_start_matches("http://").to_string();
    let o = other.addr;
    let body = json!({"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 2, "upstream": other.url,
                      "base_url": other.url, "api_base": other.url})
    .to_string();
    let attempts = [
        format!("GET http://{o}/v1/models HTTP/1.1\r\nHost: {o}\r\nConnection: close\r\n\r\n"),
        format!("GET //{o}/v1/models HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"),
        format!("GET /@{o}/v1/models HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"),
        format!("GET /v1/models HTTP/1.1\r\nHost: {o}\r\nX-Forwarded-Host: {o}\r\nForwarded: host={o}\r\nConnection: close\r\n\r\n"),
        format!("CONNECT {o} HTTP/1.1\r\nHost: {o}\r\nConnection: close\r\n\r\n"),
        format!("POST http://{o}/v1/completions HTTP/1.1\r\nHost: {o}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()),
        format!("POST /v1/completions HTTP/1.1\r\nHost: {o}\r\nX-Upstream: http://{o}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()),
    ];
    for a in &attempts {
        let answer = raw_http(&addr, a.clone()).await;
        assert!(answer.starts_with("HTTP/1.1"), "{a:?} -> {answer:?}");
    }
    assert!(
        other.seen().is_empty(),
        "a client reached another server: {:?}",
        other.seen()
    );
    assert!(up.seen().iter().any(|r| r.path == "/v1/completions"));
}

fn private_ca() -> (String, Arc<tokio_rustls::rustls::ServerConfig>) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "specd test CA");
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let leaf =
        CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
    let cert = leaf.signed_by(&key, &issuer).unwrap();
    let cfg = tokio_rustls::rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
    (ca_cert.pem(), Arc::new(cfg))
}

#[tokio::test]
async fn tls_upstream_behind_a_private_ca() {
    let (ca_pem, cfg) = private_ca();
    let up = fault::start_tls(cfg).await;
    assert!(up.url.starts_with("https://"));
    let dir = std::env::temp_dir().join(format!("specd-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = dir.join("ca.pem");
    std::fs::write(&ca, ca_pem).unwrap();

    let specd = Specd::start_ready(&up.url, &["--upstream-ca-cert", ca.to_str().unwrap()]).await;
    let prompt: Vec<u32> = (500..506).collect();
    for (mode, stream) in [("on", false), ("auto", true), ("off", false)] {
        let b = tokens_body(&prompt, mode, stream);
        let ids = if stream {
            let (s, events, done) = post_stream(&specd.url, "/v1/completions", &b).await;
            assert!(s == 200 && done, "{mode}");
            stream_token_ids(&events)
        } else {
            let (s, v) = post(&specd.url, "/v1/completions", &b).await;
            assert_eq!(s, 200, "{mode}: {v}");
            token_ids(&v)
        };
        assert_eq!(ids, continuation(&prompt, 24), "{mode}");
    }
    // Without the CA the upstream is not trusted: never ready, requests fail cleanly.
    let untrusting = Specd::start(&up.url, &[]);
    let (s, v) = post(
        &untrusting.url,
        "/v1/completions",
        &tokens_body(&prompt, "off", false),
    )
    .await;
    assert_eq!(s, 502, "{v}");
    let r = client()
        .get(format!("{}/readyz", untrusting.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    // A CA file that is not PEM is a start-up error.
    let junk = dir.join("junk.pem");
    std::fs::write(&junk, "not a certificate").unwrap();
    let out = std::process::Command::new(bin())
        .args([
            "serve",
            "--upstream",
            &up.url,
            "--listen",
            "127.0.0.1:0",
            "--upstream-ca-cert",
        ])
        .arg(&junk)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let _ = std::fs::remove_dir_all(&dir);
}
