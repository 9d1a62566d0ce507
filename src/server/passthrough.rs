//! Transparent forwarding: method, path, query, end-to-end headers (Authorization
//! included) and body go to the upstream; the response streams back as it arrives.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::TryStreamExt;

use super::observe::{route_label, ObservedBody, Outcome};
use super::Shared;
use crate::error::ApiError;
use crate::metrics::labels::{PassthroughReason, StreamMode};
use crate::upstream::retry;

/// Hop-by-hop headers (RFC 9110 §7.6.1) are never forwarded; nor is Host, which names
/// specd, or Content-Length, which the client library recomputes.
fn is_hop_by_hop(name: &HeaderName, connection_listed: &[String]) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
            | "content-length"
    ) || connection_listed.iter().any(|c| c == name.as_str())
}

/// End-to-end headers of a message.
pub fn end_to_end(headers: &HeaderMap) -> HeaderMap {
    let listed: Vec<String> = headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|s| s.trim().to_ascii_lowercase()))
        .collect();
    let mut out = HeaderMap::new();
    for (k, v) in headers {
        if !is_hop_by_hop(k, &listed) && k.as_str() != "x-speculation" {
            out.append(k.clone(), v.clone());
        }
    }
    out
}

/// A forwarded request's body.
pub enum Payload {
    /// Bytes specd holds: a send that failed before any answer came (a pooled connection
    /// the upstream closed as it was used, a reset) is repeated, as a verify call is —
    /// nothing of the answer has reached the client.
    Bytes(Bytes),
    /// The client's body as it streams in: sent once.
    Stream(reqwest::Body),
}

/// Every route specd does not handle itself.
pub async fn any(State(st): State<Shared>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let path_q = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let route = route_label(parts.uri.path());
    let body = Payload::Stream(reqwest::Body::wrap_stream(body.into_data_stream()));
    forward(
        &st,
        parts.method,
        &path_q,
        &parts.headers,
        body,
        route,
        None,
    )
    .await
}

/// The upstream's own Prometheus metrics, since specd's take `/metrics`.
pub async fn upstream_metrics(State(st): State<Shared>, req: Request) -> Response {
    let headers = req.headers().clone();
    forward(
        &st,
        Method::GET,
        "/metrics",
        &headers,
        Payload::Bytes(Bytes::new()),
        "other",
        None,
    )
    .await
}

/// Forward one request; `reason` is set when a generation request was sent to
/// passthrough by specd's decision (counted in `specd_passthrough_total`).
pub async fn forward(
    st: &Shared,
    method: Method,
    path_q: &str,
    headers: &HeaderMap,
    body: Payload,
    route: &'static str,
    reason: Option<PassthroughReason>,
) -> Response {
    if let Some(r) = reason {
        st.metrics
            .passthrough
            .with_label_values(&[r.as_str()])
            .inc();
    }
    let in_flight = st.in_flight.enter(StreamMode::Passthrough);
    let mut outcome = Outcome::new(st.metrics.clone(), route, in_flight);
    let up = &st.upstream;
    let (url, headers) = (up.url(path_q), end_to_end(headers));
    let send = |body: reqwest::Body| {
        let req = up.client.request(method.clone(), url.clone());
        let req = req.headers(headers.clone()).body(body);
        async move { req.send().await.map_err(|e| up.map_send_error(e)) }
    };
    let result = match body {
        Payload::Bytes(b) => retry(path_q, || send(reqwest::Body::from(b.clone()))).await,
        Payload::Stream(b) => send(b).await,
    };
    let resp = match result {
        Ok(r) => r,
        Err(err) => {
            tracing::warn!(error = %err, path = path_q, "passthrough request failed");
            outcome.set_status(err.status().as_u16());
            outcome.complete();
            return err.into_response();
        }
    };
    let status = StatusCode::from_u16(resp.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    if status.is_server_error() {
        up.count_error("status");
    }
    outcome.set_status(status.as_u16());
    let sse = resp
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let headers = end_to_end(resp.headers());
    let stream = resp.bytes_stream().map_err(std::io::Error::other);
    let body = Body::from_stream(
        ObservedBody::new(Box::pin(stream), outcome, sse).with_cut(st.drain_cut.signal()),
    );
    let mut out = Response::new(body);
    *out.status_mut() = status;
    *out.headers_mut() = headers;
    out
}

/// Forward a generation request whose body specd already read (and possibly rewrote).
pub async fn forward_bytes(
    st: &Shared,
    path: &str,
    headers: &HeaderMap,
    body: Bytes,
    reason: PassthroughReason,
) -> Response {
    let route = route_label(path);
    forward(
        st,
        Method::POST,
        path,
        headers,
        Payload::Bytes(body),
        route,
        Some(reason),
    )
    .await
}

impl From<reqwest::Error> for ApiError {
    fn from(e: reqwest::Error) -> Self {
        ApiError::UpstreamUnreachable(e.to_string())
    }
}
