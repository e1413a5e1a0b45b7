//! The HTTP gate's series (`[gate]`): requests by route and outcome,
//! upstream 404s after a filter "maybe" (the observed false positives),
//! upstream latency, and upstream requests in flight. Rendered only
//! once the gate has routes or a listener.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::OnceLock;

use super::latency::{escape, write_series, LatencyHistogram};
use super::Counter;

/// The outcome label of a gate request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Refused by the filter: answered by the gate.
    Rejected = 0,
    /// Sent to the upstream, which answered.
    Forwarded = 1,
    /// The upstream could not be reached or did not answer in time.
    UpstreamError = 2,
    /// Refused before any route was asked: smuggling, an open-proxy
    /// target, a limit.
    BadRequest = 3,
    /// Let through by the filter, answered by the gate from the
    /// upstream's remembered 404 (`cache_not_found_secs`).
    NotFoundCached = 4,
}

const OUTCOMES: [&str; 5] = [
    "rejected",
    "forwarded",
    "upstream_error",
    "bad_request",
    "not_found_cached",
];

/// The route label of a request no route judged.
pub const UNROUTED: &str = "(none)";

#[derive(Debug, Default)]
struct Series {
    outcomes: [Counter; 5],
    /// Upstream 404s after the filter said "maybe".
    upstream_not_found: Counter,
    /// Requests the filter judged "maybe" and the upstream answered.
    judged: Counter,
}

/// The gate's counters.
#[derive(Debug, Default)]
pub struct ProxyMetrics {
    /// Route paths by slot; the slot past the last is [`UNROUTED`].
    routes: OnceLock<Box<[Box<str>]>>,
    series: OnceLock<Box<[Series]>>,
    upstream_seconds: LatencyHistogram,
    in_flight: AtomicI64,
}

impl ProxyMetrics {
    /// Names the route slots (once: when the gate is built).
    pub fn init(&self, routes: &[&str]) {
        let names: Box<[Box<str>]> = routes.iter().map(|&n| n.into()).collect();
        let _ = self
            .series
            .set((0..=names.len()).map(|_| Series::default()).collect());
        let _ = self.routes.set(names);
    }

    /// The slot of requests no route judged.
    #[must_use]
    pub fn unrouted(&self) -> usize {
        self.routes.get().map_or(0, |r| r.len())
    }

    fn series(&self, slot: usize) -> Option<&Series> {
        self.series.get().and_then(|s| s.get(slot))
    }

    /// Counts one request of route `slot`.
    pub fn record(&self, slot: usize, outcome: Outcome) {
        if let Some(s) = self.series(slot) {
            s.outcomes[outcome as usize].incr();
        }
    }

    /// Counts the upstream's answer to a request route `slot`'s filter
    /// let through ("maybe"): `not_found` when it was a 404.
    pub fn judged(&self, slot: usize, not_found: bool) {
        if let Some(s) = self.series(slot) {
            s.judged.incr();
            if not_found {
                s.upstream_not_found.incr();
            }
        }
    }

    /// Requests `(judged, upstream 404s)` of route `slot` so far.
    #[must_use]
    pub fn observed(&self, slot: usize) -> (u64, u64) {
        self.series(slot)
            .map_or((0, 0), |s| (s.judged.get(), s.upstream_not_found.get()))
    }

    /// The count of `outcome` on route `slot`.
    #[must_use]
    pub fn count(&self, slot: usize, outcome: Outcome) -> u64 {
        self.series(slot)
            .map_or(0, |s| s.outcomes[outcome as usize].get())
    }

    /// Records how long the upstream took to answer with headers.
    pub fn upstream_latency(&self, d: std::time::Duration) {
        self.upstream_seconds.record(d);
    }

    /// An upstream request started (`+1`) or ended (`-1`).
    pub fn in_flight(&self, delta: i64) {
        self.in_flight.fetch_add(delta, Ordering::Relaxed);
    }

    /// Upstream requests in flight now.
    #[must_use]
    pub fn in_flight_now(&self) -> i64 {
        self.in_flight.load(Ordering::Relaxed).max(0)
    }

    /// The families in the text format (nothing without a gate).
    pub fn render(&self, out: &mut String) {
        let (Some(routes), Some(series)) = (self.routes.get(), self.series.get()) else {
            return;
        };
        let route = |slot: usize| routes.get(slot).map_or(UNROUTED, |r| &**r);
        let family = "bloomgate_gate_requests_total";
        let _ = writeln!(
            out,
            "# HELP {family} Requests the HTTP gate answered, by route and outcome.\n# TYPE {family} counter"
        );
        for (slot, s) in series.iter().enumerate() {
            for (o, name) in OUTCOMES.iter().enumerate() {
                let n = s.outcomes[o].get();
                if n > 0 {
                    let r = escape(route(slot));
                    let _ = writeln!(out, "{family}{{route=\"{r}\",outcome=\"{name}\"}} {n}");
                }
            }
        }
        out.push('\n');
        for (family, help, pick) in [
            (
                "bloomgate_gate_judged_total",
                "Requests a route's filter let through while it vouched (maybe) that the upstream answered; not those forwarded because it could not vouch or the key could not be in the column.",
                (|s: &Series| s.judged.get()) as fn(&Series) -> u64,
            ),
            (
                "bloomgate_gate_upstream_not_found_total",
                "Upstream 404s for keys a route's filter let through while it vouched: the observed false positives (and rows deleted since the filter was built).",
                |s: &Series| s.upstream_not_found.get(),
            ),
        ] {
            let _ = writeln!(out, "# HELP {family} {help}\n# TYPE {family} counter");
            for (slot, s) in series.iter().enumerate().take(routes.len()) {
                let r = escape(route(slot));
                let _ = writeln!(out, "{family}{{route=\"{r}\"}} {}", pick(s));
            }
            out.push('\n');
        }
        let family = "bloomgate_gate_observed_fpr";
        let _ = writeln!(
            out,
            "# HELP {family} Of the absent keys a route was asked while its filter vouched (refused, or let through and then answered 404 upstream or from a remembered 404), the share let through, since the start (0 before any).\n# TYPE {family} gauge"
        );
        for (slot, s) in series.iter().enumerate().take(routes.len()) {
            let passed =
                s.upstream_not_found.get() + s.outcomes[Outcome::NotFoundCached as usize].get();
            let absent = passed + s.outcomes[Outcome::Rejected as usize].get();
            let ratio = if absent == 0 {
                0.0
            } else {
                passed as f64 / absent as f64
            };
            let r = escape(route(slot));
            let _ = writeln!(out, "{family}{{route=\"{r}\"}} {ratio}");
        }
        out.push('\n');
        let family = "bloomgate_gate_upstream_duration_seconds";
        let _ = writeln!(
            out,
            "# HELP {family} Time until the upstream's response headers.\n# TYPE {family} histogram"
        );
        write_series(out, family, &[], &self.upstream_seconds.snapshot());
        out.push('\n');
        let family = "bloomgate_gate_upstream_in_flight";
        let _ = writeln!(
            out,
            "# HELP {family} Upstream requests holding or waiting for a pooled connection.\n# TYPE {family} gauge\n{family} {}\n",
            self.in_flight.load(Ordering::Relaxed).max(0)
        );
    }
}
