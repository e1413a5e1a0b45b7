//! The service's figures, in one place: [`json`] assembles
//! `/api/cache/stats` and [`export`] copies the same counters into the
//! instance's Prometheus recorder for `GET /metrics`. Both read the
//! atomics the levels keep; nothing is counted here.

use std::sync::atomic::{AtomicU64, Ordering};

use ::metrics::{Label, SharedString};
use serde_json::json;

use crate::cache::RedisCounters;
use crate::metrics::ServiceMetrics;
use crate::paths::SECKILL_ROUTE;
use crate::reader::L1Counters;
use crate::state::AppState;

/// The `/api/cache/stats` body: seed 000's `bloom` keys first, then every
/// level; `resources` only when some are configured.
pub async fn json(state: &AppState) -> serde_json::Value {
    let r = &state.reader;
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
                "pending": l.pending(),
                "replayed": c.replayed.load(Ordering::Relaxed),
                "dropped": c.dropped.load(Ordering::Relaxed),
                "rebuilds_requested": c.rebuilds_requested.load(Ordering::Relaxed),
                "rebuilds_led": c.rebuilds_led.load(Ordering::Relaxed),
                "rebuilds_adopted": c.rebuilds_adopted.load(Ordering::Relaxed),
                "rebuilds_joined": c.rebuilds_joined.load(Ordering::Relaxed),
                "adopt_failures": c.adopt_failures.load(Ordering::Relaxed),
                "epoch": l.epoch(),
            })
        }),
        "shared": r.shared.as_ref().map(|s| {
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
            "background_statements": sql.background.load(Ordering::Relaxed),
            "slow": sql.slow_by_statement(),
            "bulkhead_in_use": r.bulkhead.in_use(),
            "bulkhead_rejected": r.bulkhead.rejected.get(),
        },
    });
    if !state.resources.is_empty() {
        body["resources"] = state
            .resources
            .iter()
            .map(|res| (res.name.to_string(), res.stats()))
            .collect::<serde_json::Map<_, _>>()
            .into();
    }
    body
}

/// A resource's series, each labelled `resource="<name>"`.
fn export_resource(m: &ServiceMetrics, res: &crate::resource::Resource) {
    let name = || label("resource", res.name.to_string());
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let r = &res.reader;
    let g = r.gate.stats();
    for (verdict, n) in [("rejected", g.rejected), ("passed", g.passed)] {
        m.counter(
            "bloomgate_resource_filter_checks_total",
            vec![name(), label("verdict", verdict)],
            n,
        );
    }
    m.gauge(
        "bloomgate_resource_filter_ready",
        vec![name()],
        f64::from(u8::from(g.ready)),
    );
    m.gauge(
        "bloomgate_resource_filter_fill_ratio",
        vec![name()],
        g.fill_ratio,
    );
    m.gauge(
        "bloomgate_resource_filter_items_estimated",
        vec![name()],
        g.estimated_items,
    );
    l1_lookups(
        m,
        "bloomgate_resource_l1_lookups_total",
        &[name()],
        &r.l1_counters,
    );
    if let Some(redis) = &r.redis {
        redis_lookups(
            m,
            "bloomgate_resource_redis_lookups_total",
            &[name()],
            &redis.counters,
        );
    }
    if let Some(t) = &res.table {
        m.counter(
            "bloomgate_resource_sql_statements_total",
            vec![name()],
            get(&t.counters.statements),
        );
    }
    let c = &res.counters;
    for (call, v) in [
        ("keys", &c.keys_added),
        ("invalidate", &c.invalidated),
        ("exists", &c.exists_checked),
        ("batch", &c.batch_keys),
        ("watch", &c.watched),
    ] {
        m.counter(
            "bloomgate_resource_call_keys_total",
            vec![name(), label("call", call)],
            get(v),
        );
    }
}

/// `metric{labels…, result}` for L1's hits, negative hits and misses.
fn l1_lookups(m: &ServiceMetrics, metric: &'static str, labels: &[Label], l1: &L1Counters) {
    for (result, c) in [
        ("hit", &l1.hits),
        ("negative_hit", &l1.negative_hits),
        ("miss", &l1.misses),
    ] {
        let mut l = labels.to_vec();
        l.push(label("result", result));
        m.counter(metric, l, c.get());
    }
}

/// `metric{labels…, result}` for Redis's hits, nil hits and misses.
fn redis_lookups(m: &ServiceMetrics, metric: &'static str, labels: &[Label], c: &RedisCounters) {
    for (result, v) in [
        ("hit", &c.hits),
        ("nil_hit", &c.nil_hits),
        ("miss", &c.misses),
    ] {
        let mut l = labels.to_vec();
        l.push(label("result", result));
        m.counter(metric, l, v.load(Ordering::Relaxed));
    }
}

fn label(k: &'static str, v: impl Into<SharedString>) -> Label {
    Label::new(k, v.into())
}

/// Copies the values the JSON stats show into `state`'s recorder and
/// renders `GET /metrics`. Both read the same counters.
pub async fn export(state: &crate::state::AppState) -> String {
    let m = &state.metrics;
    let r = &state.reader;
    let g = r.gate.stats();
    m.counter("bloomgate_filter_rejected_total", vec![], g.rejected);
    m.counter("bloomgate_filter_passed_total", vec![], g.passed);
    m.counter(
        "bloomgate_filter_passed_missing_total",
        vec![],
        g.passed_missing,
    );
    m.gauge("bloomgate_filter_observed_fpr", vec![], g.observed_fpr);
    m.gauge("bloomgate_filter_expected_fpr", vec![], g.expected_fpr);
    m.gauge("bloomgate_filter_target_fpr", vec![], g.target_fpr);
    m.gauge("bloomgate_filter_items", vec![], g.added as f64);
    m.gauge(
        "bloomgate_filter_estimated_items",
        vec![],
        g.estimated_items,
    );
    m.gauge("bloomgate_filter_capacity", vec![], g.capacity as f64);
    m.gauge("bloomgate_filter_fill_ratio", vec![], g.fill_ratio);
    m.gauge("bloomgate_filter_size_bytes", vec![], (g.bits / 8) as f64);
    m.gauge(
        "bloomgate_filter_ready",
        vec![],
        f64::from(u8::from(g.ready)),
    );
    m.counter("bloomgate_filter_rebuilds_total", vec![], g.rebuilds);
    m.counter(
        "bloomgate_filter_rebuild_failures_total",
        vec![],
        g.rebuild_failures,
    );
    if let Some(ms) = r.gate.last_success_ms() {
        m.gauge(
            "bloomgate_filter_last_rebuild_timestamp_seconds",
            vec![],
            ms as f64 / 1e3,
        );
    }
    for kind in crate::gate::Alarm::KINDS {
        let on = g.alarm_kind == Some(kind);
        m.gauge(
            "bloomgate_filter_alarm",
            vec![label("alarm", kind)],
            f64::from(u8::from(on)),
        );
    }
    m.counter("bloomgate_filter_alarms_total", vec![], g.alarms_raised);
    let o = &state.outbox.counters;
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    m.gauge(
        "bloomgate_changes_in_step",
        vec![],
        f64::from(u8::from(r.gate.in_step())),
    );
    m.counter(
        "bloomgate_filter_unvouched_total",
        vec![],
        r.gate.unvouched(),
    );
    m.counter("bloomgate_outbox_applied_total", vec![], get(&o.applied));
    m.counter(
        "bloomgate_outbox_poll_failures_total",
        vec![],
        get(&o.poll_failures),
    );
    m.counter(
        "bloomgate_outbox_out_of_step_total",
        vec![],
        get(&o.out_of_step),
    );
    m.gauge(
        "bloomgate_outbox_open_gaps",
        vec![],
        state.outbox.open_gaps() as f64,
    );
    m.gauge(
        "bloomgate_outbox_last_read_timestamp_seconds",
        vec![],
        state.outbox.last_ok_ms() as f64 / 1e3,
    );
    l1_lookups(m, "bloomgate_l1_lookups_total", &[], &r.l1_counters);
    m.gauge("bloomgate_l1_entries", vec![], r.l1.entry_count() as f64);
    if let Some(redis) = &r.redis {
        let c = &redis.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        redis_lookups(m, "bloomgate_redis_lookups_total", &[], c);
        m.counter(
            "bloomgate_redis_keys_written_total",
            vec![],
            get(&c.keys_written),
        );
        for (kind, v) in [
            ("error", &c.errors),
            ("timeout", &c.timeouts),
            ("skipped", &c.skipped),
        ] {
            m.counter(
                "bloomgate_redis_errors_total",
                vec![label("kind", kind)],
                get(v),
            );
        }
        let open = redis.breaker_state() != crate::cache::BreakerState::Closed;
        m.gauge(
            "bloomgate_redis_breaker_open",
            vec![],
            f64::from(u8::from(open)),
        );
    }
    let sql = &r.store.counters;
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    for (result, v) in [("found", &sql.found), ("missing", &sql.missing)] {
        m.counter(
            "bloomgate_sql_queries_total",
            vec![label("result", result)],
            get(v),
        );
    }
    for (kind, v) in [("error", &sql.errors), ("timeout", &sql.timeouts)] {
        m.counter(
            "bloomgate_sql_errors_total",
            vec![label("kind", kind)],
            get(v),
        );
    }
    for (statement, n) in sql.slow_by_statement() {
        m.counter(
            "bloomgate_sql_slow_queries_total",
            vec![label("statement", statement)],
            n,
        );
    }
    m.counter(
        "bloomgate_sql_bulkhead_rejected_total",
        vec![],
        r.bulkhead.rejected.get(),
    );
    for res in &state.resources {
        export_resource(m, res);
    }
    m.render()
}
