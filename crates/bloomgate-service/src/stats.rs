//! The service's figures, read once into [`Figures`]: [`json`] writes them
//! as the `/api/cache/stats` snapshot, and [`render`] as Prometheus text
//! for `GET /metrics` (through the instance's recorder, which also holds
//! the request counters and latency histograms), field by field from the
//! typed figures, never by a JSON path. Nothing is counted here, and no
//! figure is read twice.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use serde::Serialize;
use serde_json::{json, Value};

use crate::cache::BreakerState;
use crate::paths::SECKILL_ROUTE;
use crate::resource::{ResourceFigures, SqlLoads};
use crate::shield::{RebuildRecord, ShieldStats};
use crate::state::AppState;

pub mod ready;
mod render;

pub use render::render;

/// Every figure `/metrics` exports, read once from the counters.
#[derive(Debug, Clone)]
pub struct Figures {
    /// The demo SKU table's filter and rebuilds (`None` without it).
    pub skus: Option<SkuFigures>,
    /// The change outbox.
    pub outbox: OutboxFigures,
    /// The instance's Redis tier.
    pub redis: RedisFigures,
    /// The instance's SQL statements.
    pub sql: SqlFigures,
    /// Every guarded table, the SKU table first as `skus` (with the demo).
    pub resources: Vec<(String, ResourceFigures)>,
}

/// The demo SKU table's own figures (seed 000's flat `bloom`).
#[derive(Debug, Clone)]
pub struct SkuFigures {
    /// Its filter.
    pub bloom: ShieldStats,
    /// Its last rebuilds.
    pub rebuild_history: Vec<RebuildRecord>,
}

/// The change outbox's follower (`outbox` in the stats).
#[derive(Debug, Clone, Serialize)]
#[allow(missing_docs)] // each field is the counter of the same name
pub struct OutboxFigures {
    pub enabled: bool,
    pub in_step: bool,
    pub unvouched: u64,
    pub watermark: i64,
    pub open_gaps: usize,
    pub last_read_ms: u64,
    pub applied: u64,
    pub polls: u64,
    pub poll_failures: u64,
    pub gaps: u64,
    pub gaps_filled: u64,
    pub gaps_expired: u64,
    pub late_applied: u64,
    pub late_abandoned: u64,
    pub late_spanned: u64,
    pub late_rebuilds: u64,
    pub capture_lost: u64,
    pub rewound: u64,
    pub doorbell_healthy: bool,
    pub rebuilds: u64,
    pub out_of_step: u64,
    pub trimmed: u64,
    pub rerecorded: u64,
}

/// The instance's Redis tier (`redis` in the stats).
#[derive(Debug, Clone, Serialize)]
pub struct RedisFigures {
    /// Redis is configured.
    pub enabled: bool,
    /// Its counters, when it is.
    #[serde(flatten)]
    pub tier: Option<RedisTier>,
}

/// The counters of a configured Redis tier.
#[derive(Debug, Clone, Serialize)]
#[allow(missing_docs)] // each field is the counter of the same name
pub struct RedisTier {
    pub hits: u64,
    pub nil_hits: u64,
    pub misses: u64,
    pub fills_refused: u64,
    pub keys_written: u64,
    pub errors: u64,
    pub timeouts: u64,
    pub skipped: u64,
    pub breaker: BreakerState,
    pub breaker_opened: u64,
    pub owed_invalidations: usize,
    /// `DBSIZE` (`None` when it failed).
    pub keys: Option<u64>,
}

/// The instance's SQL statements (`sql` in the stats).
#[derive(Debug, Clone, Serialize)]
#[allow(missing_docs)] // each field is the counter of the same name
pub struct SqlFigures {
    pub queries: u64,
    pub found: u64,
    pub missing: u64,
    pub timeouts: u64,
    pub errors: u64,
    pub id_scans: u64,
    pub full_counts: u64,
    pub background_statements: u64,
    /// Slow statements, by name.
    pub slow: BTreeMap<&'static str, u64>,
    pub bulkhead_in_use: usize,
    pub bulkhead_rejected: u64,
}

/// Reads every figure once.
pub async fn figures(state: &AppState) -> Figures {
    let r = &state.skus.reader;
    let sql = &r.store.counters;
    let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let redis = match &r.redis {
        Some(redis) => {
            let c = &redis.counters;
            RedisFigures {
                enabled: true,
                tier: Some(RedisTier {
                    hits: c.hits.get(),
                    nil_hits: c.nil_hits.get(),
                    misses: c.misses.get(),
                    fills_refused: get(&c.fills_refused),
                    keys_written: get(&c.keys_written),
                    errors: get(&c.errors),
                    timeouts: get(&c.timeouts),
                    skipped: get(&c.skipped),
                    breaker: redis.breaker_state(),
                    breaker_opened: redis.breaker_opened(),
                    owed_invalidations: redis.owed_invalidations(),
                    keys: redis.key_count().await.ok(),
                }),
            }
        }
        None => RedisFigures {
            enabled: false,
            tier: None,
        },
    };
    let o = &state.outbox.counters;
    let outbox = OutboxFigures {
        enabled: state.outbox.store.outbox_on(),
        in_step: r.shield.in_step(),
        unvouched: r.shield.unvouched(),
        watermark: state.outbox.watermark(),
        open_gaps: state.outbox.open_gaps(),
        last_read_ms: state.outbox.last_ok_ms(),
        applied: get(&o.applied),
        polls: get(&o.polls),
        poll_failures: get(&o.poll_failures),
        gaps: get(&o.gaps),
        gaps_filled: get(&o.gaps_filled),
        gaps_expired: get(&o.gaps_expired),
        late_applied: get(&o.late_applied),
        late_abandoned: get(&o.late_abandoned),
        late_spanned: get(&o.late_spanned),
        late_rebuilds: get(&o.late_rebuilds),
        capture_lost: get(&o.capture_lost),
        rewound: get(&o.rewound),
        doorbell_healthy: state.outbox.doorbell_healthy(),
        rebuilds: get(&o.rebuilds),
        out_of_step: get(&o.out_of_step),
        trimmed: get(&o.trimmed),
        rerecorded: get(&sql.rerecorded),
    };
    let sql = SqlFigures {
        queries: get(&sql.queries),
        found: get(&sql.found),
        missing: get(&sql.missing),
        timeouts: get(&sql.timeouts),
        errors: get(&sql.errors),
        id_scans: get(&sql.id_scans),
        full_counts: get(&sql.full_counts),
        background_statements: get(&sql.background),
        slow: sql.slow_by_statement(),
        bulkhead_in_use: r.bulkhead.in_use(),
        bulkhead_rejected: r.bulkhead.rejected.get(),
    };
    let mut resources = Vec::with_capacity(state.resources.len() + 1);
    let skus = state.demo.then(|| {
        let bloom = r.shield.stats();
        resources.push(("skus".to_owned(), skus(state, bloom.clone())));
        SkuFigures {
            bloom,
            rebuild_history: r.shield.history(),
        }
    });
    for res in &state.resources {
        resources.push((res.name.to_string(), res.stats()));
    }
    Figures {
        skus,
        outbox,
        redis,
        sql,
        resources,
    }
}

/// The `/api/cache/stats` body: seed 000's `bloom` keys first, then every
/// level; then `resources`, every guarded table in one shape, the SKU
/// table first as `skus`. Without the demo SKU table, none of its
/// figures (`bloom`, `requests`, `rebuild_history`, `l1`, `shared`).
pub async fn json(state: &AppState) -> Value {
    let f = figures(state).await;
    let r = &state.skus.reader;
    let mut body = serde_json::Map::new();
    let mut put = |k: &str, v: Value| {
        body.insert(k.to_owned(), v);
    };
    if let Some(skus) = &f.skus {
        put("bloom", to(&skus.bloom));
    }
    put("now_ms", crate::model::now_millis().into());
    if let Some(skus) = &f.skus {
        let l1 = &r.l1_counters;
        put(
            "requests",
            to(&state.metrics.requests_by_outcome(SECKILL_ROUTE)),
        );
        put("rebuild_history", to(&skus.rebuild_history));
        put(
            "l1",
            json!({
                "hits": l1.hits.get(),
                "negative_hits": l1.negative_hits.get(),
                "misses": l1.misses.get(),
                "stale_skipped": l1.stale_skipped.get(),
                "entries": r.l1.entry_count(),
            }),
        );
    }
    put("redis", to(&f.redis));
    put("outbox", to(&f.outbox));
    put(
        "changes",
        state.changes.as_ref().map_or(Value::Null, |l| {
            let c = &l.counters;
            // The default resource's shared rebuilds, under the names the
            // stream's section has always given them.
            let e = &state.skus.epochs;
            json!({
                "published": c.published.load(Ordering::Relaxed),
                "publish_failures": c.publish_failures.load(Ordering::Relaxed),
                "applied": c.applied.load(Ordering::Relaxed),
                "gaps": c.gaps.load(Ordering::Relaxed),
                "rebuilds_requested": e.requested.load(Ordering::Relaxed),
                "rebuilds_led": e.led.load(Ordering::Relaxed),
                "rebuilds_adopted": e.followed.load(Ordering::Relaxed),
                "rebuilds_joined": e.joined.load(Ordering::Relaxed),
                "adopt_failures": e.adopt_failures.load(Ordering::Relaxed),
                "epoch": e.held.load(Ordering::Relaxed),
            })
        }),
    );
    if f.skus.is_some() {
        put(
            "shared",
            r.shared().map_or(Value::Null, |s| {
                let c = &s.counters;
                json!({
                    "checks": c.checks.load(Ordering::Relaxed),
                    "overruled": c.overruled.load(Ordering::Relaxed),
                    "errors": c.errors.load(Ordering::Relaxed),
                    "refills": c.refills.load(Ordering::Relaxed),
                })
            }),
        );
    }
    put("sql", to(&f.sql));
    if state.gate.is_set() {
        put("gate", gate(state, &f.resources));
    }
    let resources: serde_json::Map<String, Value> = f
        .resources
        .iter()
        .map(|(name, r)| (name.clone(), to(r)))
        .collect();
    put("resources", resources.into());
    body.into()
}

/// A figure as JSON (they all serialise: a failure would be a bug,
/// answered as `null` rather than a 500).
fn to<T: Serialize + ?Sized>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or_default()
}

/// The HTTP gate's routes: what each answered, and the false positives
/// it observed beside its filter's expected rate.
fn gate(state: &AppState, resources: &[(String, ResourceFigures)]) -> Value {
    use crate::metrics::proxy::Outcome;
    let m = &state.metrics.gate;
    let counts = |slot: usize| {
        json!({
            "rejected": m.count(slot, Outcome::Rejected),
            "forwarded": m.count(slot, Outcome::Forwarded),
            "upstream_error": m.count(slot, Outcome::UpstreamError),
            "bad_request": m.count(slot, Outcome::BadRequest),
            "not_found_cached": m.count(slot, Outcome::NotFoundCached),
        })
    };
    let routes: Vec<Value> = state
        .gate_routes
        .all()
        .iter()
        .map(|r| {
            let (judged, not_found) = m.observed(r.slot);
            let mut v = counts(r.slot);
            v["path"] = r.path.clone().into();
            v["resource"] = r.resource().into();
            v["judged"] = judged.into();
            v["upstream_not_found"] = not_found.into();
            // Of the absent keys asked (refused, or let through and then
            // not found upstream or answered from a remembered 404), the
            // share the filter let through.
            let rejected = m.count(r.slot, Outcome::Rejected);
            let passed = not_found + m.count(r.slot, Outcome::NotFoundCached);
            v["observed_fpr"] = if passed + rejected > 0 {
                (passed as f64 / (passed + rejected) as f64).into()
            } else {
                Value::Null
            };
            v["not_found_memory"] = r.memory.as_ref().map_or(Value::Null, |mem| {
                let c = mem.counters();
                json!({
                    "ttl_secs": mem.ttl().as_secs(),
                    "remembered": c.remembered.load(Ordering::Relaxed),
                    "refused": c.refused.load(Ordering::Relaxed),
                    "recalled": c.recalled.load(Ordering::Relaxed),
                })
            });
            v["expected_fpr"] = resources
                .iter()
                .find(|(name, _)| name == r.resource())
                .map_or(Value::Null, |(_, x)| x.funnel.filter.expected_fpr.into());
            v
        })
        .collect();
    json!({
        "listen": state.gate.listen.map(|a| a.to_string()),
        "routes": routes,
        "unrouted": counts(m.unrouted()),
        "upstream_in_flight": m.in_flight_now(),
    })
}

/// The SKU table as the default resource `skus`: [`crate::resource::Resource::stats_with`] (the
/// same figures as the flat keys seed 000 prints, under the names every
/// resource uses), with its SQL counters.
fn skus(state: &AppState, bloom: ShieldStats) -> ResourceFigures {
    let sql = &state.skus.source().counters;
    let mut v = state.skus.stats_with(bloom);
    let queries = sql.queries.load(Ordering::Relaxed);
    v.sql = Some(SqlLoads {
        statements: queries,
        loads: queries,
        found: sql.found.load(Ordering::Relaxed),
        batch_loads: None,
        missing: Some(sql.missing.load(Ordering::Relaxed)),
    });
    v
}

/// Reads every figure and renders `GET /metrics`: the same figures as the
/// stats, read once, in the other format.
pub async fn export(state: &AppState) -> String {
    render(&state.metrics, &figures(state).await)
}
