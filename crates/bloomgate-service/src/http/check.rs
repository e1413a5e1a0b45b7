//! `/api/gate/check` and `/api/gate/check/{*path}`, any method: the HTTP
//! gate's auth-request check ([`crate::proxy::check`]) on the service's
//! listener.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::proxy::check::{check, Answer};
use crate::state::AppState;

/// Answers one check.
pub async fn gate_check(State(state): State<Arc<AppState>>, req: Request) -> Response {
    let answer = check(
        &state.gate_routes,
        &state.metrics,
        req.headers(),
        req.method().as_str(),
        req.uri().path(),
    )
    .await;
    match answer {
        Answer::Allow => StatusCode::OK.into_response(),
        Answer::Forbidden => crate::http::error::error_response(
            StatusCode::FORBIDDEN,
            "not_found",
            "the gate's filter says this key does not exist",
        ),
        Answer::Refuse(r) => {
            let status = StatusCode::from_u16(r.status).unwrap_or(StatusCode::NOT_FOUND);
            let mut resp = (status, r.body.clone()).into_response();
            if let Ok(ct) = HeaderValue::from_str(&r.content_type) {
                resp.headers_mut().insert(CONTENT_TYPE, ct);
            }
            resp
        }
        Answer::BadRequest(why) => {
            crate::http::error::error_response(StatusCode::BAD_REQUEST, "bad_request", &why)
        }
    }
}
