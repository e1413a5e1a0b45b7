//! The optional per-client rate limit (`governor`, keyed by the peer IP
//! address), shared by the listeners: the HTTP reads and calls, and the
//! Redis-protocol reads, each take one unit per key so that 1,000 rows
//! cost what 1,000 reads do. Off by default: a flash sale's legitimate
//! clients may sit behind few addresses, so an operator chooses the
//! rate. How a refusal is answered is each protocol's own (`http::limits`:
//! 429 with `Retry-After`; `resp`: an error reply).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

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

/// A listener's limiter (one bucket per client), when
/// `http.rate_limit_per_sec` is set.
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

impl RateLimit {
    /// The client of a request from `peer`. Requests without a peer
    /// address (a router served without connect info, or driven in
    /// process) share one bucket, and the first of them logs a warning: a
    /// limit that cannot tell clients apart is still a limit.
    pub fn client(&self, peer: Option<SocketAddr>) -> IpAddr {
        match peer {
            Some(peer) => peer.ip(),
            None => {
                if !self.warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "rate limit: requests carry no peer address (serve with connect info); \
                         they share one bucket"
                    );
                }
                IpAddr::V4(Ipv4Addr::UNSPECIFIED)
            }
        }
    }

    /// Takes `units` from `client`'s bucket, if it holds them.
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
