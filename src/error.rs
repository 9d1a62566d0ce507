//! Errors returned to clients, shaped like OpenAI's (and vLLM's) error bodies.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    #[error("request body is larger than {0} bytes")]
    TooLarge(usize),
    #[error("invalid or missing API key")]
    Unauthorized,
    #[error("too many concurrent requests; retry later")]
    Overloaded { retry_after_secs: u64 },
    #[error("specd is shutting down")]
    Draining,
    /// Still in flight when `--drain-timeout` passed.
    #[error("specd shut down before this request finished: the drain timeout passed")]
    DrainTimeout,
    #[error("upstream unreachable: {0}")]
    UpstreamUnreachable(String),
    #[error("upstream timed out: {0}")]
    UpstreamTimeout(String),
    /// The upstream answered with an error; its status and message are kept.
    #[error("{message}")]
    Upstream { status: u16, message: String },
    #[error("upstream protocol error: {0}")]
    UpstreamProtocol(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::Overloaded { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Draining | ApiError::DrainTimeout => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::UpstreamUnreachable(_) | ApiError::UpstreamProtocol(_) => {
                StatusCode::BAD_GATEWAY
            }
            ApiError::UpstreamTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ApiError::Upstream { status, .. } => {
                StatusCode::from_u16(*status).unwrap_or(StatusCode::BAD_GATEWAY)
            }
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            ApiError::BadRequest(_) => "BadRequestError",
            ApiError::NotFound(_) => "NotFoundError",
            ApiError::TooLarge(_) => "RequestTooLargeError",
            ApiError::Unauthorized => "AuthenticationError",
            ApiError::Overloaded { .. } => "RateLimitError",
            ApiError::Draining | ApiError::DrainTimeout => "ServiceUnavailableError",
            ApiError::UpstreamUnreachable(_)
            | ApiError::UpstreamTimeout(_)
            | ApiError::UpstreamProtocol(_) => "UpstreamError",
            ApiError::Upstream { status, .. } if *status < 500 => "BadRequestError",
            ApiError::Upstream { .. } => "UpstreamError",
            ApiError::Internal(_) => "InternalServerError",
        }
    }

    /// The JSON body: `{"error": {"message", "type", "param", "code"}}`.
    pub fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.to_string(),
                "type": self.kind(),
                "param": null,
                "code": self.status().as_u16(),
            }
        })
    }

    /// An SSE event for an error that happens after streaming has started.
    pub fn sse_event(&self) -> String {
        format!("data: {}\n\n", self.body())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let mut resp = (status, axum::Json(self.body())).into_response();
        if let ApiError::Overloaded { retry_after_secs } = self {
            if let Ok(v) = HeaderValue::from_str(&retry_after_secs.to_string()) {
                resp.headers_mut().insert("retry-after", v);
            }
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_is_openai_shaped() {
        let e = ApiError::BadRequest("max_tokens must be at least 1".into());
        let b = e.body();
        assert_eq!(b["error"]["code"], 400);
        assert_eq!(b["error"]["type"], "BadRequestError");
        assert_eq!(b["error"]["message"], "max_tokens must be at least 1");
        assert_eq!(
            ApiError::TooLarge(10).status(),
            StatusCode::PAYLOAD_TOO_LARGE
        );
    }

    #[test]
    fn overloaded_sets_retry_after() {
        let r = ApiError::Overloaded {
            retry_after_secs: 2,
        }
        .into_response();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()["retry-after"], "2");
    }
}
