//! `/api/gate/check` and `/api/gate/check/{*path}`, any method: the HTTP
//! gate's auth-request check ([`crate::proxy::check`]) on the service's
//! listener.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::http::json_errors::AsIs;
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
        // No body: nginx reads none from an auth subrequest, and a body
        // left unread costs it the keep-alive connection to bloomgate.
        Answer::Forbidden => {
            let mut resp = StatusCode::FORBIDDEN.into_response();
            resp.extensions_mut().insert(AsIs);
            resp
        }
        Answer::Refuse(r) => {
            let status = StatusCode::from_u16(r.status).unwrap_or(StatusCode::NOT_FOUND);
            let mut resp = (status, r.body.clone()).into_response();
            resp.headers_mut()
                .insert(CONTENT_TYPE, r.content_type.clone());
            // The route's answer as configured, JSON or not.
            resp.extensions_mut().insert(AsIs);
            resp
        }
        Answer::BadRequest(why) => crate::http::error::error_response(
            StatusCode::BAD_REQUEST,
            "bad_request",
            &why.to_string(),
        ),
    }
}
