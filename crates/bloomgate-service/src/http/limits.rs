//! The optional per-client rate limit on every read (`governor`, keyed by
//! the peer IP address): the SKU reads, each resource's read, and the
//! `batch` and `exists` calls, which take one unit per key so that 1,000
//! rows cost what 1,000 reads do. Off by default: a flash sale's
//! legitimate clients may sit behind few addresses, so an operator chooses
//! the rate. Over the limit: 429 with the JSON error shape and
//! `Retry-After`.
//!
//! The edge checks a read before its fast answer (`http::edge`), so a
//! filter "no" under attack stays fast with the limit on; the calls check
//! in their handlers, once they know how many keys they carry. Our own
//! check rather than tower_governor's layer: that layer needs
//! tower_governor's `axum` feature, which turns on all of axum's default
//! features, and two of those (`matched-path`, `original-uri`) add
//! extensions to every request of every route, limited or not.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

use crate::config::HttpConfig;

/// Checks (on one thread) between two sweeps of the addresses whose
/// bucket is full again.
const SWEEP_EVERY: u64 = 1 << 16;

/// Limiters that keep a sweep count of their own (the HTTP one and the
/// Redis-protocol listener's; more share slots, still each swept).
const COUNTED: usize = 4;

thread_local! {
    /// Checks on this thread since its limiter's last sweep, per limiter:
    /// counted per thread, so the cores share no counter on the limited
    /// route, and per limiter, so one's traffic never takes the other's
    /// sweeps.
    static CHECKS: [std::cell::Cell<u64>; COUNTED] = const { [const { std::cell::Cell::new(0) }; COUNTED] };
}

/// The next limiter's slot in [`CHECKS`].
static NEXT_SLOT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The limiter of the SKU reads (one bucket per client for both routes),
/// when `http.rate_limit_per_sec` is set.
#[derive(Debug)]
pub struct RateLimit {
    limiter: DefaultKeyedRateLimiter<IpAddr>,
    warned: AtomicBool,
    /// Its slot in the per-thread sweep counts.
    slot: usize,
}

/// A limiter for `c`, or `None` when rate limiting is off.
#[must_use]
pub fn rate_limit(c: &HttpConfig) -> Option<Arc<RateLimit>> {
    if c.rate_limit_per_sec == 0 {
        return None;
    }
    let period = Duration::from_nanos((1_000_000_000 / c.rate_limit_per_sec).max(1));
    let burst = NonZeroU32::new(c.rate_limit_burst).unwrap_or(NonZeroU32::MIN);
    let quota = Quota::with_period(period)?.allow_burst(burst);
    Some(Arc::new(RateLimit {
        limiter: RateLimiter::keyed(quota),
        warned: AtomicBool::new(false),
        slot: NEXT_SLOT.fetch_add(1, Ordering::Relaxed) % COUNTED,
    }))
}

/// The client of a request: the peer address `run` records
/// (`ConnectInfo`). Requests without one (a router served without connect
/// info, or driven in process) share one bucket, and the first of them
/// logs a warning: a limit that cannot tell clients apart is still a
/// limit.
pub fn client_of(limit: &RateLimit, extensions: &axum::http::Extensions) -> IpAddr {
    client(
        limit,
        extensions.get::<ConnectInfo<SocketAddr>>().map(|c| c.0),
    )
}

/// [`client_of`] for a handler that extracted the peer address.
pub fn client(limit: &RateLimit, peer: Option<SocketAddr>) -> IpAddr {
    match peer {
        Some(peer) => peer.ip(),
        None => {
            if !limit.warned.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "rate limit: requests carry no peer address (serve with connect info); \
                     they share one bucket"
                );
            }
            IpAddr::V4(Ipv4Addr::UNSPECIFIED)
        }
    }
}

impl RateLimit {
    /// Takes `units` from `client`'s bucket (`None`), or gives the 429
    /// with `Retry-After` to answer instead (also for more units than the
    /// burst holds: such a call can never pass, and says so).
    pub fn refuse(&self, client: IpAddr, units: usize) -> Option<Response> {
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
        match self.admit(client, units) {
            Admit::Yes => None,
            Admit::Wait(secs) => Some(too_many(secs, "too many requests from this client; slow down")),
            Admit::Never => Some(too_many(
                1,
                &format!("{units} keys in one call are more than this client's burst (http.rate_limit_burst): send fewer"),
            )),
        }
    }

    /// Takes `units` from `client`'s bucket, if it holds them (the
    /// protocol-free part of [`RateLimit::refuse`], for the RESP listener).
    pub fn admit(&self, client: IpAddr, units: usize) -> Admit {
        let checks = CHECKS.with(|c| {
            let n = c[self.slot].get() + 1;
            c[self.slot].set(n % SWEEP_EVERY);
            n
        });
        if checks == SWEEP_EVERY {
            // Forget the clients whose bucket has refilled, so the table
            // stays the size of the recent clients.
            self.limiter.retain_recent();
        }
        let n =
            NonZeroU32::new(u32::try_from(units).unwrap_or(u32::MAX)).unwrap_or(NonZeroU32::MIN);
        match self.limiter.check_key_n(&client, n) {
            Ok(Ok(())) => Admit::Yes,
            Ok(Err(not_until)) => {
                let wait = not_until.wait_time_from(DefaultClock::default().now());
                Admit::Wait(wait.as_secs() + u64::from(wait.subsec_nanos() > 0))
            }
            Err(_) => Admit::Never,
        }
    }
}

/// A rate limit's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Within the rate.
    Yes,
    /// Over it: retry in this many seconds.
    Wait(u64),
    /// More units than the burst: never.
    Never,
}
