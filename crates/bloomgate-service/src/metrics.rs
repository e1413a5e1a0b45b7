//! Metrics: the counters behind `/api/cache/stats` and `GET /metrics`.
//!
//! Every value lives in one place. Counts that the JSON stats also show
//! are kept where they are counted (sharded [`Counter`]s and atomics in
//! the shield, reader, Redis tier and store); at each scrape
//! [`ServiceMetrics::render`] copies them into the `metrics` facade's
//! Prometheus recorder (`metrics-exporter-prometheus`), which renders the
//! text format with help text and histogram buckets. The rebuild duration
//! histogram is recorded into that recorder as rebuilds happen; request
//! latency, recorded on every request, has a histogram of its own
//! ([`latency`]: fixed buckets, sharded, no allocation) appended to the
//! recorder's text. Each service instance owns its recorder (none is
//! installed globally), so several instances in one process keep apart.

use std::cell::Cell;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use ::metrics::{Key, KeyName, Label, Metadata, Recorder, SharedString, Unit};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};

mod latency;
pub mod proxy;
pub mod resp;

use latency::LatencyHistogram;

const SHARDS: usize = 16;

#[derive(Debug, Default)]
#[repr(align(64))]
struct Shard(AtomicU64);

/// A monotonically increasing counter, sharded by thread.
#[derive(Debug, Default)]
pub struct Counter {
    shards: [Shard; SHARDS],
}

fn shard_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    INDEX.with(|i| {
        if i.get() == usize::MAX {
            i.set(NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS);
        }
        i.get()
    })
}

impl Counter {
    /// Adds one.
    #[inline]
    pub fn incr(&self) {
        self.add(1);
    }

    /// Adds `n`.
    #[inline]
    pub fn add(&self, n: u64) {
        self.shards[shard_index()].0.fetch_add(n, Ordering::Relaxed);
    }

    /// The current total.
    #[must_use]
    pub fn get(&self) -> u64 {
        self.shards
            .iter()
            .fold(0u64, |acc, s| acc.wrapping_add(s.0.load(Ordering::Relaxed)))
    }
}

thread_local! {
    static NOTED: Cell<Option<Outcome>> = const { Cell::new(None) };
}

/// The outcome label of a response, set by handlers that know better than
/// the status (the read route: `filter_rejected`, `l1_hit`, …). Without
/// one, a response is `ok` (below 400), `client_error` (4xx) or `error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome(usize);

impl Outcome {
    /// Every label, in index order.
    pub const LABELS: [&'static str; 11] = [
        "filter_rejected",
        "l1_hit",
        "l1_negative_hit",
        "redis_hit",
        "redis_nil_hit",
        "db_found",
        "db_missing",
        "ok",
        "client_error",
        "error",
        "cancelled",
    ];
    /// The filter said no.
    pub const FILTER_REJECTED: Self = Self(0);
    /// A cached SKU in L1.
    pub const L1_HIT: Self = Self(1);
    /// A cached "not found" in L1.
    pub const L1_NEGATIVE_HIT: Self = Self(2);
    /// A SKU from Redis.
    pub const REDIS_HIT: Self = Self(3);
    /// The null sentinel from Redis.
    pub const REDIS_NIL_HIT: Self = Self(4);
    /// A SKU from SQL.
    pub const DB_FOUND: Self = Self(5);
    /// SQL found nothing (cache penetration).
    pub const DB_MISSING: Self = Self(6);
    /// A success with no more specific outcome.
    pub const OK: Self = Self(7);
    /// A 4xx with no more specific outcome.
    pub const CLIENT_ERROR: Self = Self(8);
    /// A 5xx.
    pub const ERROR: Self = Self(9);
    /// Never answered: the client went away and the server dropped the
    /// request's future (status 499, nginx's "client closed request").
    pub const CANCELLED: Self = Self(10);

    /// Notes this outcome for the request being answered: the handler
    /// calls it just before it returns (after its last `.await`), and
    /// [`crate::http::edge`] takes it when the route's future is ready, in the
    /// same poll on the same thread. An extension on the response would
    /// cost an allocation per request. A handler that notes answers JSON
    /// (the edge then skips the check that rewrites non-JSON errors).
    pub fn note(self) {
        NOTED.set(Some(self));
    }

    /// Takes the noted outcome (and clears it).
    pub(crate) fn take_noted() -> Option<Self> {
        NOTED.take()
    }

    /// The label.
    #[must_use]
    pub const fn label(self) -> &'static str {
        Self::LABELS[self.0]
    }

    pub(crate) fn of_status(status: u16) -> Self {
        match status {
            500.. => Self::ERROR,
            400.. => Self::CLIENT_ERROR,
            _ => Self::OK,
        }
    }
}

/// The statuses the service sends, each its own series; anything else is
/// counted as `status="other"`.
const STATUSES: [u16; 15] = [
    200, 201, 204, 400, 401, 403, 404, 405, 409, 413, 415, 429, 499, 500, 503,
];

fn status_slot(status: u16) -> usize {
    STATUSES
        .iter()
        .position(|&s| s == status)
        .unwrap_or(STATUSES.len())
}

fn status_label(slot: usize) -> String {
    STATUSES
        .get(slot)
        .map_or_else(|| "other".to_string(), ToString::to_string)
}

/// Route label of requests that matched no route (one series for all, so
/// scanners cannot blow up the cardinality).
pub const UNMATCHED: &str = "(unmatched)";

/// Routes tracked apart (about ten, and five per resource, at most
/// `config::resources::MAX_RESOURCES` of them); more count as unmatched.
const MAX_ROUTES: usize = 128;

const SERIES_PER_ROUTE: usize = Outcome::LABELS.len() * (STATUSES.len() + 1);

/// Requests of one route: a count per outcome and status, a latency
/// histogram per outcome. Every slot is filled once and then read without
/// locks.
#[derive(Debug)]
struct RouteSeries {
    route: Box<str>,
    counts: Box<[OnceLock<Box<Counter>>]>,
    seconds: Box<[OnceLock<Box<LatencyHistogram>>]>,
}

impl RouteSeries {
    fn new(route: &str) -> Self {
        Self {
            route: route.into(),
            counts: (0..SERIES_PER_ROUTE).map(|_| OnceLock::new()).collect(),
            seconds: (0..Outcome::LABELS.len())
                .map(|_| OnceLock::new())
                .collect(),
        }
    }
}

type Labels = Vec<Label>;

/// Metric names, kinds and help text.
const DESCRIPTIONS: &[(&str, Kind, &str)] = &[
    ("bloomgate_requests_total", Kind::Counter, "HTTP requests by route, outcome and status."),
    (REQUEST_DURATION, Kind::Own, "HTTP request latency by route and outcome."),
    ("bloomgate_filter_audited_total", Kind::Counter, "Refused keys looked up in the database by the audit of the filter's no, by resource."),
    ("bloomgate_filter_false_negatives_total", Kind::Counter, "Refused keys the database had (the audit found a false 404): each stops the filter's no until a rebuild, by resource."),
    ("bloomgate_filter_rejected_total", Kind::Counter, "Reads answered 404 by the Bloom filter alone, by resource (the SKU table is resource=\"skus\")."),
    ("bloomgate_filter_passed_total", Kind::Counter, "Reads the Bloom filter let through."),
    ("bloomgate_filter_passed_missing_total", Kind::Counter, "Reads the filter let through that SQL or the caches then did not find (false positives and deleted SKUs)."),
    ("bloomgate_filter_observed_fpr", Kind::Gauge, "passed_missing / (rejected + passed_missing) since start: the observed false-positive estimate."),
    ("bloomgate_filter_expected_fpr", Kind::Gauge, "The filter's exact expected false-positive rate at its current item count."),
    ("bloomgate_filter_target_fpr", Kind::Gauge, "The configured false-positive target (cache.bloom_fpp)."),
    ("bloomgate_filter_items", Kind::Gauge, "Ids inserted into the published filter."),
    ("bloomgate_filter_estimated_items", Kind::Gauge, "Distinct ids estimated from the filter's set bits."),
    ("bloomgate_filter_capacity", Kind::Gauge, "Items the published filter was sized for."),
    ("bloomgate_filter_fill_ratio", Kind::Gauge, "Fraction of the filter's bits that are set."),
    ("bloomgate_filter_size_bytes", Kind::Gauge, "Size of the published filter's bit array."),
    ("bloomgate_filter_ready", Kind::Gauge, "1 when a filter is built and gating reads."),
    ("bloomgate_filter_rebuilds_total", Kind::Counter, "Completed filter rebuilds."),
    ("bloomgate_filter_rebuild_failures_total", Kind::Counter, "Filter rebuilds that failed (the previous filter stayed)."),
    ("bloomgate_filter_rebuild_scanned_keys", Kind::Gauge, "Keys the running (or last) rebuild has scanned so far."),
    ("bloomgate_filter_rebuild_estimated_keys", Kind::Gauge, "The source's estimate of its keys when that rebuild's scan started (its statistics; 0 when it has none)."),
    ("bloomgate_filter_rebuild_keys_per_second", Kind::Gauge, "Keys per second of the running (or last) rebuild's scan."),
    ("bloomgate_filter_rebuild_page_retries_total", Kind::Counter, "Pages of a rebuild's scan read again after failing."),
    ("bloomgate_filter_rebuild_duration_seconds", Kind::Histogram, "Duration of every filter rebuild, failed ones included."),
    ("bloomgate_filter_last_rebuild_timestamp_seconds", Kind::Gauge, "Unix time the last successful rebuild finished."),
    ("bloomgate_filter_alarm", Kind::Gauge, "1 while the named capacity alarm is in force."),
    ("bloomgate_filter_alarms_total", Kind::Counter, "Capacity alarms raised (once per crossing)."),
    ("bloomgate_changes_in_step", Kind::Gauge, "1 while this instance reads the change feed (the SQL outbox) within sql.out_of_step_ms; 0 while its filter's no is not trusted."),
    ("bloomgate_filter_unvouched_total", Kind::Counter, "Filter rejections passed on because the instance was out of step."),
    ("bloomgate_outbox_applied_total", Kind::Counter, "Change-outbox entries from other instances applied here."),
    ("bloomgate_outbox_poll_failures_total", Kind::Counter, "Failed reads of the change outbox."),
    ("bloomgate_outbox_out_of_step_total", Kind::Counter, "Times this instance went out of step with the change feed."),
    ("bloomgate_outbox_rewound_total", Kind::Counter, "Times the change outbox was found behind this instance's position (a restored database): each a rebuild of every filter."),
    ("bloomgate_outbox_late_applied_total", Kind::Counter, "Changes applied late: committed after their numbers were given up as gaps (a transaction open past sql.outbox_gap_ms)."),
    ("bloomgate_outbox_late_rebuilds_total", Kind::Counter, "Rebuilds of every filter after a late commit among numbers watched by their count (more given-up runs than are looked up one by one)."),
    ("bloomgate_outbox_open_gaps", Kind::Gauge, "Outbox sequence numbers not seen yet (transactions not committed yet)."),
    ("bloomgate_outbox_last_read_timestamp_seconds", Kind::Gauge, "When the change outbox was last read."),
    ("bloomgate_l1_lookups_total", Kind::Counter, "In-process cache lookups by result."),
    ("bloomgate_l1_entries", Kind::Gauge, "Entries in the in-process cache."),
    ("bloomgate_redis_lookups_total", Kind::Counter, "Redis lookups by result."),
    ("bloomgate_redis_keys_written_total", Kind::Counter, "Redis keys written by fills and warms (values and null sentinels)."),
    ("bloomgate_redis_errors_total", Kind::Counter, "Redis commands that failed, by kind (error, timeout, skipped while the breaker was open)."),
    ("bloomgate_redis_breaker_open", Kind::Gauge, "1 while the Redis circuit breaker is open."),
    ("bloomgate_sql_queries_total", Kind::Counter, "SQL point lookups by result; result=\"missing\" is cache penetration."),
    ("bloomgate_sql_errors_total", Kind::Counter, "SQL statements that failed, by kind (error, timeout)."),
    ("bloomgate_sql_slow_queries_total", Kind::Counter, "SQL statements slower than sql.slow_query_ms, by statement."),
    ("bloomgate_sql_bulkhead_rejected_total", Kind::Counter, "Read-path loads turned away because the SQL bulkhead was full."),
    ("bloomgate_sql_full_counts_total", Kind::Counter, "Full COUNT(*) statements: the background row check of a restored filter only, never on the way to readiness."),
    ("bloomgate_sql_statements_total", Kind::Counter, "SQL statements a table's reads ran (point loads, batch loads, scans, counts, watches)."),
    ("bloomgate_call_keys_total", Kind::Counter, "Keys named in a table's key API calls, by call."),
];

const REQUEST_DURATION: &str = "bloomgate_request_duration_seconds";

#[derive(Debug, Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
    /// Rendered by this module, not the recorder ([`latency`]).
    Own,
}
/// Seconds: rebuild duration buckets, 1 ms to 10 min.
const REBUILD_BUCKETS: &[f64] = &[
    0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), ::metrics::Level::INFO, Some(module_path!()));

/// One instance's metrics: its own Prometheus recorder and the request
/// counters by route, outcome and status.
#[derive(Debug)]
pub struct ServiceMetrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    /// Slot 0 is [`UNMATCHED`]; the others fill in as routes are seen.
    routes: Box<[OnceLock<RouteSeries>]>,
    adding: Mutex<()>,
    /// Requests the edge took without the router: answered at once, or
    /// run as the route's own work (whatever their end: 200, 503, 499).
    fast_answers: Counter,
    /// The Redis-protocol listener's series.
    pub resp: resp::RespMetrics,
    /// The HTTP gate's series.
    pub gate: proxy::ProxyMetrics,
}

impl Default for ServiceMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ServiceMetrics {
    /// A recorder with every metric described and histogram buckets set.
    #[must_use]
    pub fn new() -> Self {
        let builder = PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Full("bloomgate_filter_rebuild_duration_seconds".into()),
                REBUILD_BUCKETS,
            )
            .expect("bucket lists are not empty");
        let recorder = builder.build_recorder();
        for &(name, kind, help) in DESCRIPTIONS {
            let (key, help) = (KeyName::from(name), SharedString::from(help));
            match kind {
                Kind::Counter => recorder.describe_counter(key, Some(Unit::Count), help),
                Kind::Gauge => recorder.describe_gauge(key, None, help),
                Kind::Histogram => recorder.describe_histogram(key, Some(Unit::Seconds), help),
                Kind::Own => {}
            }
        }
        let handle = recorder.handle();
        let routes: Box<[OnceLock<RouteSeries>]> =
            (0..MAX_ROUTES).map(|_| OnceLock::new()).collect();
        let _ = routes[0].set(RouteSeries::new(UNMATCHED));
        Self {
            recorder,
            handle,
            routes,
            adding: Mutex::new(()),
            fast_answers: Counter::default(),
            resp: resp::RespMetrics::default(),
            gate: proxy::ProxyMetrics::default(),
        }
    }

    /// Folds the recorder's histogram samples (now only rebuild durations;
    /// request latency has its own histogram) into their buckets every
    /// `every`, so memory stays bounded between scrapes; stops when the
    /// metrics are dropped.
    pub fn spawn_upkeep(
        self: &Arc<Self>,
        every: std::time::Duration,
        bg: &crate::tasks::Background,
    ) {
        let weak = Arc::downgrade(self);
        bg.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                match weak.upgrade() {
                    Some(m) => m.handle.run_upkeep(),
                    None => return,
                }
            }
        });
    }

    /// The histogram the shield records rebuild durations in.
    pub fn rebuild_histogram(&self) -> ::metrics::Histogram {
        self.recorder.register_histogram(
            &Key::from_static_name("bloomgate_filter_rebuild_duration_seconds"),
            &METADATA,
        )
    }

    /// The index of `route`'s series: a lock-free scan of the routes seen
    /// so far; a new route takes the next slot (under a lock, once); past
    /// `MAX_ROUTES`, the unmatched series.
    pub(crate) fn route_index(&self, route: &str) -> usize {
        let find = || {
            self.routes
                .iter()
                .take_while(|r| r.get().is_some())
                .position(|r| r.get().is_some_and(|r| *r.route == *route))
        };
        if let Some(i) = find() {
            return i;
        }
        let _adding = crate::sync::lock(&self.adding);
        if let Some(i) = find() {
            return i;
        }
        match self.routes.iter().position(|r| r.get().is_none()) {
            Some(i) => {
                let _ = self.routes[i].set(RouteSeries::new(route));
                i
            }
            None => 0,
        }
    }

    /// Counts a request the edge took without the router
    /// (`EdgeLayer::fast_get`).
    #[inline]
    pub(crate) fn fast_answered(&self) {
        self.fast_answers.incr();
    }

    /// Requests the edge took without the router: answered at once (a
    /// filter "no", an L1 entry) or run as the route's own work.
    #[must_use]
    pub fn fast_answers(&self) -> u64 {
        self.fast_answers.get()
    }

    /// Counts one request of series `route`.
    pub(crate) fn record(
        &self,
        route: usize,
        outcome: Outcome,
        status: u16,
        latency: std::time::Duration,
    ) {
        let Some(r) = self.routes.get(route).and_then(OnceLock::get) else {
            return;
        };
        let slot = outcome.0 * (STATUSES.len() + 1) + status_slot(status);
        r.counts[slot].get_or_init(Box::default).incr();
        r.seconds[outcome.0]
            .get_or_init(Box::default)
            .record(latency);
    }

    /// The request latency family in the text format.
    fn render_latency(&self, out: &mut String) {
        let help = DESCRIPTIONS
            .iter()
            .find(|d| d.0 == REQUEST_DURATION)
            .map_or("", |d| d.2);
        let mut header = false;
        for r in self.routes.iter().filter_map(OnceLock::get) {
            for (o, h) in r.seconds.iter().enumerate() {
                let Some(h) = h.get() else { continue };
                if !header {
                    let _ = write!(
                        out,
                        "# HELP {REQUEST_DURATION} {help}\n# TYPE {REQUEST_DURATION} histogram\n"
                    );
                    header = true;
                }
                latency::write_series(
                    out,
                    REQUEST_DURATION,
                    &[("route", &r.route), ("outcome", Outcome::LABELS[o])],
                    &h.snapshot(),
                );
            }
        }
        if header {
            out.push('\n');
        }
    }

    /// Requests so far by (route, outcome, status), without empty series.
    #[must_use]
    pub fn requests(&self) -> Vec<(String, &'static str, String, u64)> {
        let mut out = Vec::new();
        for r in self.routes.iter().filter_map(OnceLock::get) {
            for (slot, c) in r.counts.iter().enumerate() {
                if let Some(c) = c.get() {
                    let (o, st) = (slot / (STATUSES.len() + 1), slot % (STATUSES.len() + 1));
                    out.push((
                        r.route.to_string(),
                        Outcome::LABELS[o],
                        status_label(st),
                        c.get(),
                    ));
                }
            }
        }
        out
    }

    /// Requests of `route` so far, summed by outcome.
    #[must_use]
    pub fn requests_by_outcome(
        &self,
        route: &str,
    ) -> std::collections::BTreeMap<&'static str, u64> {
        let mut out = std::collections::BTreeMap::new();
        for (r, outcome, _, n) in self.requests() {
            if r == route {
                *out.entry(outcome).or_default() += n;
            }
        }
        out
    }

    /// Sets counter `name{labels}` to `value` (values only grow: the
    /// recorder keeps the maximum).
    pub fn counter(&self, name: &'static str, labels: Labels, value: u64) {
        self.recorder
            .register_counter(&Key::from_parts(name, labels), &METADATA)
            .absolute(value);
    }

    /// Sets gauge `name{labels}` to `value`.
    pub fn gauge(&self, name: &'static str, labels: Labels, value: f64) {
        self.recorder
            .register_gauge(&Key::from_parts(name, labels), &METADATA)
            .set(value);
    }

    /// The Prometheus text format, after copying the request counters in;
    /// the caller copies the other counters first (see `routes::metrics`).
    #[must_use]
    pub fn render(&self) -> String {
        for (route, outcome, status, n) in self.requests() {
            self.counter(
                "bloomgate_requests_total",
                vec![
                    Label::new("route", route),
                    Label::new("outcome", outcome),
                    Label::new("status", status),
                ],
                n,
            );
        }
        self.handle.run_upkeep();
        let mut out = self.handle.render();
        if !out.is_empty() && !out.ends_with("\n\n") {
            out.push('\n');
        }
        self.render_latency(&mut out);
        self.resp.render(&mut out);
        self.gate.render(&mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::{Counter, Outcome, ServiceMetrics, MAX_ROUTES, UNMATCHED};

    #[test]
    fn labels_stay_bounded_whatever_arrives() {
        let m = ServiceMetrics::new();
        for i in 0..(MAX_ROUTES as u64 + 8) {
            m.record(
                m.route_index(&format!("/r{i}")),
                Outcome::OK,
                200,
                std::time::Duration::from_millis(1),
            );
        }
        m.record(
            m.route_index("/r0"),
            Outcome::of_status(418),
            418,
            std::time::Duration::from_millis(1),
        );
        let all = m.requests();
        let routes: std::collections::BTreeSet<&str> = all.iter().map(|r| r.0.as_str()).collect();
        assert_eq!(routes.len(), MAX_ROUTES);
        assert!(routes.contains(UNMATCHED));
        let total: u64 = all.iter().map(|r| r.3).sum();
        assert_eq!(total, MAX_ROUTES as u64 + 9, "nothing is lost");
        let unmatched: u64 = all.iter().filter(|r| r.0 == UNMATCHED).map(|r| r.3).sum();
        assert_eq!(unmatched, 9, "the routes past the table count as unmatched");
        assert!(all
            .iter()
            .any(|r| r.0 == "/r0" && r.1 == "client_error" && r.2 == "other" && r.3 == 1));
        let text = m.render();
        assert!(
            text.contains(r#"bloomgate_requests_total{route="/r0",outcome="ok",status="200"} 1"#),
            "{text}"
        );
    }

    #[test]
    fn sums_over_threads() {
        let c = Counter::default();
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..10_000 {
                        c.incr();
                    }
                });
            }
        });
        assert_eq!(c.get(), 80_000);
    }
}
