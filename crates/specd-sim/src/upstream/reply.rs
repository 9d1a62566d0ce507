//! Answers both routes give: vLLM-shaped errors, bodies cut half-way, prompt encoding.

use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::St;

/// A vLLM-shaped error answer.
pub(crate) fn error(status: u16, msg: &str) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let kind = if status < 500 {
        "BadRequestError"
    } else {
        "InternalServerError"
    };
    let body = json!({"error": {"message": msg, "type": kind, "param": null, "code": status}});
    (code, Json(body)).into_response()
}

pub(crate) fn encode(st: &St, text: &str, special: bool) -> Result<Vec<u32>, String> {
    st.tok
        .encode(text, special)
        .map(|e| e.get_ids().to_vec())
        .map_err(|e| format!("tokenizer: {e}"))
}

/// A 200 whose body breaks off half-way.
pub(crate) fn cut_body(full: Vec<u8>) -> Response {
    let half = bytes::Bytes::from(full[..full.len() / 2].to_vec());
    let chunks: Vec<Result<bytes::Bytes, std::io::Error>> = vec![
        Ok(half),
        Err(std::io::Error::other("cut by the fake upstream")),
    ];
    let mut r = Response::new(Body::from_stream(futures_util::stream::iter(chunks)));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    r
}
