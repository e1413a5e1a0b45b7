//! The service's figures, assembled once: [`json`] reads every level's
//! counters into the `/api/cache/stats` snapshot, and [`render`] writes
//! that same snapshot as Prometheus text for `GET /metrics` (through the
//! instance's recorder, which also holds the request counters and latency
//! histograms). Nothing is counted here, and no figure is read twice.

use std::sync::atomic::Ordering;

use ::metrics::{Label, SharedString};
use serde_json::{json, Value};

use crate::metrics::ServiceMetrics;
use crate::paths::SECKILL_ROUTE;
use crate::state::AppState;

pub mod ready;

/// The `/api/cache/stats` body: seed 000's `bloom` keys first, then every
/// level; then `resources`, every guarded table in one shape, the SKU
/// table first as `skus`.
pub async fn json(state: &AppState) -> serde_json::Value {
    let r = &state.skus.reader;
    let l1 = &r.l1_counters;
    let sql = &r.store.counters;
    let redis = match &r.redis {
        Some(redis) => {
            let c = &redis.counters;
            json!({
                "enabled": true,
                "hits": c.hits.load(Ordering::Relaxed),
                "nil_hits": c.nil_hits.load(Ordering::Relaxed),
                "misses": c.misses.load(Ordering::Relaxed),
                "fills_refused": c.fills_refused.load(Ordering::Relaxed),
                "keys_written": c.keys_written.load(Ordering::Relaxed),
                "errors": c.errors.load(Ordering::Relaxed),
                "timeouts": c.timeouts.load(Ordering::Relaxed),
                "skipped": c.skipped.load(Ordering::Relaxed),
                "breaker": redis.breaker_state(),
                "breaker_opened": redis.breaker_opened(),
                "owed_invalidations": redis.owed_invalidations(),
                "keys": redis.key_count().await.ok(),
            })
        }
        None => json!({ "enabled": false }),
    };
    let outbox = {
        let o = &state.outbox.counters;
        json!({
            "enabled": state.outbox.store.outbox_on(),
            "in_step": r.gate.in_step(),
            "unvouched": r.gate.unvouched(),
            "watermark": state.outbox.watermark(),
            "open_gaps": state.outbox.open_gaps(),
            "last_read_ms": state.outbox.last_ok_ms(),
            "applied": o.applied.load(Ordering::Relaxed),
            "polls": o.polls.load(Ordering::Relaxed),
            "poll_failures": o.poll_failures.load(Ordering::Relaxed),
            "gaps": o.gaps.load(Ordering::Relaxed),
            "gaps_filled": o.gaps_filled.load(Ordering::Relaxed),
            "gaps_expired": o.gaps_expired.load(Ordering::Relaxed),
            "late_applied": o.late_applied.load(Ordering::Relaxed),
            "late_abandoned": o.late_abandoned.load(Ordering::Relaxed),
            "late_spanned": o.late_spanned.load(Ordering::Relaxed),
            "late_rebuilds": o.late_rebuilds.load(Ordering::Relaxed),
            "capture_lost": o.capture_lost.load(Ordering::Relaxed),
            "rewound": o.rewound.load(Ordering::Relaxed),
            "doorbell_healthy": state.outbox.doorbell_healthy(),
            "rebuilds": o.rebuilds.load(Ordering::Relaxed),
            "out_of_step": o.out_of_step.load(Ordering::Relaxed),
            "trimmed": o.trimmed.load(Ordering::Relaxed),
            "rerecorded": sql.rerecorded.load(Ordering::Relaxed),
        })
    };
    let mut body = json!({
        "bloom": r.gate.stats(),
        "now_ms": crate::model::now_millis(),
        "requests": state.metrics.requests_by_outcome(SECKILL_ROUTE),
        "rebuild_history": r.gate.history(),
        "l1": {
            "hits": l1.hits.get(),
            "negative_hits": l1.negative_hits.get(),
            "misses": l1.misses.get(),
            "stale_skipped": l1.stale_skipped.get(),
            "entries": r.l1.entry_count(),
        },
        "redis": redis,
        "outbox": outbox,
        "changes": state.changes.as_ref().map(|l| {
            let c = &l.counters;
            json!({
                "published": c.published.load(Ordering::Relaxed),
                "publish_failures": c.publish_failures.load(Ordering::Relaxed),
                "applied": c.applied.load(Ordering::Relaxed),
                "gaps": c.gaps.load(Ordering::Relaxed),
                "rebuilds_requested": c.rebuilds_requested.load(Ordering::Relaxed),
                "rebuilds_led": c.rebuilds_led.load(Ordering::Relaxed),
                "rebuilds_adopted": c.rebuilds_adopted.load(Ordering::Relaxed),
                "rebuilds_joined": c.rebuilds_joined.load(Ordering::Relaxed),
                "adopt_failures": c.adopt_failures.load(Ordering::Relaxed),
                "epoch": l.epoch(),
            })
        }),
        "shared": r.shared().map(|s| {
            let c = &s.counters;
            json!({
                "checks": c.checks.load(Ordering::Relaxed),
                "overruled": c.overruled.load(Ordering::Relaxed),
                "errors": c.errors.load(Ordering::Relaxed),
                "refills": c.refills.load(Ordering::Relaxed),
            })
        }),
        "sql": {
            "queries": sql.queries.load(Ordering::Relaxed),
            "found": sql.found.load(Ordering::Relaxed),
            "missing": sql.missing.load(Ordering::Relaxed),
            "timeouts": sql.timeouts.load(Ordering::Relaxed),
            "errors": sql.errors.load(Ordering::Relaxed),
            "id_scans": sql.id_scans.load(Ordering::Relaxed),
            "full_counts": sql.full_counts.load(Ordering::Relaxed),
            "background_statements": sql.background.load(Ordering::Relaxed),
            "slow": sql.slow_by_statement(),
            "bulkhead_in_use": r.bulkhead.in_use(),
            "bulkhead_rejected": r.bulkhead.rejected.get(),
        },
    });
    let mut resources = serde_json::Map::new();
    if state.demo {
        resources.insert("skus".into(), skus(state, body["bloom"].clone()));
    } else if let Some(body) = body.as_object_mut() {
        // No demo SKU table: none of its figures.
        for key in ["bloom", "requests", "rebuild_history", "l1", "shared"] {
            body.remove(key);
        }
    }
    for res in &state.resources {
        resources.insert(res.name.to_string(), res.stats());
    }
    if state.gate.is_set() {
        body["gate"] = gate(state, &resources);
    }
    body["resources"] = resources.into();
    body
}

/// The HTTP gate's routes: what each answered, and the false positives
/// it observed beside its filter's expected rate.
fn gate(state: &AppState, resources: &serde_json::Map<String, Value>) -> Value {
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
                .get(r.resource())
                .map_or(Value::Null, |x| x["filter"]["expected_fpr"].clone());
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
/// resource uses), with its SQL counters and its shared rebuilds, which
/// the doorbell leads.
fn skus(state: &AppState, bloom: Value) -> Value {
    let sql = &state.skus.reader.store.counters;
    let mut v = state.skus.stats_with(bloom);
    let queries = sql.queries.load(Ordering::Relaxed);
    v["sql"] = json!({
        "statements": queries,
        "loads": queries,
        "found": sql.found.load(Ordering::Relaxed),
        "missing": sql.missing.load(Ordering::Relaxed),
    });
    if let Some(log) = &state.changes {
        let c = &log.counters;
        v["epochs"] = json!({
            "published": c.epochs_stored.load(Ordering::Relaxed),
            "adopted": c.rebuilds_adopted.load(Ordering::Relaxed),
            "adopt_failures": c.adopt_failures.load(Ordering::Relaxed),
            "held": log.epoch(),
        });
    }
    v
}

/// The number at `path` in a snapshot (0 when absent).
fn num(v: &Value, path: &[&str]) -> f64 {
    path.iter().fold(v, |v, k| &v[*k]).as_f64().unwrap_or(0.0)
}

/// The count at `path` in a snapshot (0 when absent).
fn count(v: &Value, path: &[&str]) -> u64 {
    path.iter().fold(v, |v, k| &v[*k]).as_u64().unwrap_or(0)
}

/// 1 when the boolean at `path` is true.
fn flag(v: &Value, path: &[&str]) -> f64 {
    f64::from(u8::from(path.iter().fold(v, |v, k| &v[*k]) == true))
}

/// Copies the [`json`] snapshot into `state`'s recorder and renders
/// `GET /metrics`: the same figures, assembled once, in the other format.
pub async fn export(state: &AppState) -> String {
    let snapshot = json(state).await;
    render(&state.metrics, &snapshot)
}

/// The Prometheus text of a [`json`] snapshot (requests by route, outcome
/// and status, and the latency histograms, come from the recorder). One
/// family set for every guarded table, labelled `resource` (the SKU table
/// is `resource="skus"`); the instance's own figures (outbox, change
/// log, Redis and SQL errors, the bulkhead) carry no such label.
pub fn render(m: &ServiceMetrics, s: &Value) -> String {
    if let Some(resources) = s["resources"].as_object() {
        for (name, r) in resources {
            render_resource(m, name, r);
        }
    }
    let skus = || vec![label("resource", "skus")];
    let last_success = s["rebuild_history"]
        .as_array()
        .and_then(|h| h.iter().rev().find(|r| r["error"].is_null()))
        .map(|r| num(r, &["finished_at_ms"]));
    if let Some(ms) = last_success {
        m.gauge(
            "bloomgate_filter_last_rebuild_timestamp_seconds",
            skus(),
            ms / 1e3,
        );
    }
    let o = &s["outbox"];
    m.gauge("bloomgate_changes_in_step", vec![], flag(o, &["in_step"]));
    if !s["bloom"].is_null() {
        m.counter(
            "bloomgate_filter_unvouched_total",
            skus(),
            count(o, &["unvouched"]),
        );
    }
    for (name, key) in [
        ("bloomgate_outbox_applied_total", "applied"),
        ("bloomgate_outbox_poll_failures_total", "poll_failures"),
        ("bloomgate_outbox_out_of_step_total", "out_of_step"),
        ("bloomgate_outbox_rewound_total", "rewound"),
        ("bloomgate_outbox_late_applied_total", "late_applied"),
        ("bloomgate_outbox_late_rebuilds_total", "late_rebuilds"),
    ] {
        m.counter(name, vec![], count(o, &[key]));
    }
    m.gauge("bloomgate_outbox_open_gaps", vec![], num(o, &["open_gaps"]));
    m.gauge(
        "bloomgate_outbox_last_read_timestamp_seconds",
        vec![],
        num(o, &["last_read_ms"]) / 1e3,
    );
    let redis = &s["redis"];
    if redis["enabled"] == true {
        for (kind, key) in [
            ("error", "errors"),
            ("timeout", "timeouts"),
            ("skipped", "skipped"),
        ] {
            m.counter(
                "bloomgate_redis_errors_total",
                vec![label("kind", kind)],
                count(redis, &[key]),
            );
        }
        let open = redis["breaker"] != "closed";
        m.gauge(
            "bloomgate_redis_breaker_open",
            vec![],
            f64::from(u8::from(open)),
        );
    }
    let sql = &s["sql"];
    for (kind, key) in [("error", "errors"), ("timeout", "timeouts")] {
        m.counter(
            "bloomgate_sql_errors_total",
            vec![label("kind", kind)],
            count(sql, &[key]),
        );
    }
    if let Some(slow) = sql["slow"].as_object() {
        for (statement, n) in slow {
            m.counter(
                "bloomgate_sql_slow_queries_total",
                vec![label("statement", statement.clone())],
                n.as_u64().unwrap_or(0),
            );
        }
    }
    m.counter(
        "bloomgate_sql_bulkhead_rejected_total",
        vec![],
        count(sql, &["bulkhead_rejected"]),
    );
    m.counter(
        "bloomgate_sql_full_counts_total",
        vec![],
        count(sql, &["full_counts"]),
    );
    m.render()
}

/// One guarded table's series, each labelled `resource="<name>"`: its
/// filter, its L1 and Redis lookups, its SQL loads and statements, and
/// its key API calls.
fn render_resource(m: &ServiceMetrics, name: &str, r: &Value) {
    let res = || vec![label("resource", name.to_owned())];
    let b = &r["filter"];
    for (metric, key) in [
        ("bloomgate_filter_rejected_total", "rejected"),
        ("bloomgate_filter_passed_total", "passed"),
        ("bloomgate_filter_passed_missing_total", "passed_missing"),
        ("bloomgate_filter_rebuilds_total", "rebuilds"),
        (
            "bloomgate_filter_rebuild_failures_total",
            "rebuild_failures",
        ),
        ("bloomgate_filter_alarms_total", "alarms_raised"),
        (
            "bloomgate_filter_rebuild_page_retries_total",
            "rebuild_page_retries",
        ),
    ] {
        m.counter(metric, res(), count(b, &[key]));
    }
    for (metric, key) in [
        ("bloomgate_filter_audited_total", "sampled"),
        ("bloomgate_filter_false_negatives_total", "false_negatives"),
    ] {
        m.counter(metric, res(), count(&r["audit"], &[key]));
    }
    for (metric, key) in [
        ("bloomgate_filter_observed_fpr", "observed_fpr"),
        ("bloomgate_filter_expected_fpr", "expected_fpr"),
        ("bloomgate_filter_target_fpr", "target_fpr"),
        ("bloomgate_filter_items", "added"),
        ("bloomgate_filter_estimated_items", "estimated_items"),
        ("bloomgate_filter_capacity", "capacity"),
        ("bloomgate_filter_fill_ratio", "fill_ratio"),
        ("bloomgate_filter_rebuild_scanned_keys", "rebuild_scanned"),
        (
            "bloomgate_filter_rebuild_estimated_keys",
            "rebuild_estimated_total",
        ),
        (
            "bloomgate_filter_rebuild_keys_per_second",
            "rebuild_rows_per_sec",
        ),
    ] {
        m.gauge(metric, res(), num(b, &[key]));
    }
    m.gauge(
        "bloomgate_filter_size_bytes",
        res(),
        (count(b, &["bits"]) / 8) as f64,
    );
    m.gauge("bloomgate_filter_ready", res(), flag(b, &["ready"]));
    for kind in crate::gate::Alarm::KINDS {
        let on = b["alarm_kind"] == kind;
        let mut labels = res();
        labels.push(label("alarm", kind));
        m.gauge("bloomgate_filter_alarm", labels, f64::from(u8::from(on)));
    }
    lookups(
        m,
        "bloomgate_l1_lookups_total",
        &res(),
        &r["l1"],
        L1_RESULTS,
    );
    m.gauge("bloomgate_l1_entries", res(), num(r, &["l1", "entries"]));
    if r["redis"].is_object() {
        lookups(
            m,
            "bloomgate_redis_lookups_total",
            &res(),
            &r["redis"],
            REDIS_RESULTS,
        );
        m.counter(
            "bloomgate_redis_keys_written_total",
            res(),
            count(r, &["redis", "keys_written"]),
        );
    }
    let sql = &r["sql"];
    if sql.is_object() {
        let found = count(sql, &["found"]);
        let missing = sql["missing"]
            .as_u64()
            .unwrap_or_else(|| count(sql, &["loads"]).saturating_sub(found));
        for (result, n) in [("found", found), ("missing", missing)] {
            let mut labels = res();
            labels.push(label("result", result));
            m.counter("bloomgate_sql_queries_total", labels, n);
        }
        m.counter(
            "bloomgate_sql_statements_total",
            res(),
            count(sql, &["statements"]),
        );
    }
    if r["calls"].is_object() {
        for (call, key) in [
            ("keys", "keys_added"),
            ("invalidate", "invalidated"),
            ("exists", "exists_checked"),
            ("batch", "batch_keys"),
            ("watch", "watched"),
        ] {
            let mut labels = res();
            labels.push(label("call", call));
            m.counter(
                "bloomgate_call_keys_total",
                labels,
                count(r, &["calls", key]),
            );
        }
    }
}

/// `metric{labels…, result}` for each `(result, key)` of a level's lookups.
fn lookups(
    m: &ServiceMetrics,
    metric: &'static str,
    labels: &[Label],
    level: &Value,
    results: [(&'static str, &str); 3],
) {
    for (result, key) in results {
        let mut l = labels.to_vec();
        l.push(label("result", result));
        m.counter(metric, l, count(level, &[key]));
    }
}

/// L1's lookups: hits, negative hits, misses.
const L1_RESULTS: [(&str, &str); 3] = [
    ("hit", "hits"),
    ("negative_hit", "negative_hits"),
    ("miss", "misses"),
];
/// Redis's lookups: hits, nil hits, misses.
const REDIS_RESULTS: [(&str, &str); 3] =
    [("hit", "hits"), ("nil_hit", "nil_hits"), ("miss", "misses")];

fn label(k: &'static str, v: impl Into<SharedString>) -> Label {
    Label::new(k, v.into())
}
