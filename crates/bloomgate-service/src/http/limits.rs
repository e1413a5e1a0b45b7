//! The per-client rate limit as HTTP answers it: the SKU reads, each
//! resource's read, and the `batch` and `exists` calls take from the
//! client's bucket ([`crate::listen::rate`]); over the limit, 429 with the
//! JSON error shape and `Retry-After`.
//!
//! The edge checks a read before its fast answer (`http::edge`), so a
//! filter "no" under attack stays fast with the limit on; the calls check
//! in their handlers, once they know how many keys they carry. Our own
//! check rather than tower_governor's layer: that layer needs
//! tower_governor's `axum` feature, which turns on all of axum's default
//! features, and two of those (`matched-path`, `original-uri`) add
//! extensions to every request of every route, limited or not.

use std::net::{IpAddr, SocketAddr};

use axum::extract::ConnectInfo;
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;

use crate::listen::{Admit, RateLimit};

/// The client of a request: the peer address `run` records
/// (`ConnectInfo`); see [`RateLimit::client`] for requests without one.
pub fn client_of(limit: &RateLimit, extensions: &axum::http::Extensions) -> IpAddr {
    limit.client(extensions.get::<ConnectInfo<SocketAddr>>().map(|c| c.0))
}

/// Takes `units` from `client`'s bucket (`None`), or gives the 429 with
/// `Retry-After` to answer instead (also for more units than the burst
/// holds: such a call can never pass, and says so).
pub fn refuse(limit: &RateLimit, client: IpAddr, units: usize) -> Option<Response> {
    let too_many = |secs: u64, message: &str| {
        let mut res = crate::http::error::error_response(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_requests",
            message,
        );
        res.headers_mut()
            .insert(axum::http::header::RETRY_AFTER, HeaderValue::from(secs));
        res
    };
    match limit.admit(client, units) {
        Admit::Yes => None,
        Admit::Wait(secs) => Some(too_many(secs, "too many requests from this client; slow down")),
        Admit::Never => Some(too_many(
            1,
            &format!("{units} keys in one call are more than this client's burst (http.rate_limit_burst): send fewer"),
        )),
    }
}
