//! The optional per-client rate limit on the public read route
//! (tower_governor, keyed by the peer IP address). Off by default: a flash
//! sale's legitimate clients may sit behind few addresses, so an operator
//! chooses the rate. Over the limit: 429 with the JSON error shape.

use std::time::Duration;

use axum::body::Body;
use governor::middleware::NoOpMiddleware;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::PeerIpKeyExtractor;
use tower_governor::GovernorLayer;

use crate::config::HttpConfig;

/// The layer, when `http.rate_limit_per_sec` is set.
pub type RateLimit = GovernorLayer<PeerIpKeyExtractor, NoOpMiddleware, Body>;

/// A rate-limit layer for `c`, or `None` when rate limiting is off.
#[must_use]
pub fn rate_limit_layer(c: &HttpConfig) -> Option<RateLimit> {
    if c.rate_limit_per_sec == 0 {
        return None;
    }
    let config = GovernorConfigBuilder::default()
        .period(Duration::from_nanos(1_000_000_000 / c.rate_limit_per_sec))
        .burst_size(c.rate_limit_burst)
        .finish()?;
    Some(GovernorLayer::new(config))
}
