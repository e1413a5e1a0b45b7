//! `GET /metrics`: the [`Figures`] as Prometheus text, read field by
//! field. One family set for every guarded table, labelled `resource`
//! (the SKU table is `resource="skus"`); the instance's own figures
//! (outbox, Redis and SQL errors, the bulkhead) carry no such label.

use ::metrics::{Label, SharedString};

use super::Figures;
use crate::cache::BreakerState;
use crate::metrics::ServiceMetrics;
use crate::resource::ResourceFigures;

/// The Prometheus text of `f` (requests by route, outcome and status, and
/// the latency histograms, come from the recorder).
pub fn render(m: &ServiceMetrics, f: &Figures) -> String {
    for (name, r) in &f.resources {
        render_resource(m, name, r);
    }
    let skus = || vec![label("resource", "skus")];
    if let Some(s) = &f.skus {
        let last_success = s.rebuild_history.iter().rev().find(|r| r.error.is_none());
        if let Some(r) = last_success {
            m.gauge(
                "bloomgate_filter_last_rebuild_timestamp_seconds",
                skus(),
                r.finished_at_ms as f64 / 1e3,
            );
        }
    }
    let o = &f.outbox;
    m.gauge("bloomgate_changes_in_step", vec![], flag(o.in_step));
    if f.skus.is_some() {
        m.counter("bloomgate_filter_unvouched_total", skus(), o.unvouched);
    }
    for (name, n) in [
        ("bloomgate_outbox_applied_total", o.applied),
        ("bloomgate_outbox_poll_failures_total", o.poll_failures),
        ("bloomgate_outbox_out_of_step_total", o.out_of_step),
        ("bloomgate_outbox_rewound_total", o.rewound),
        ("bloomgate_outbox_late_applied_total", o.late_applied),
        ("bloomgate_outbox_late_rebuilds_total", o.late_rebuilds),
    ] {
        m.counter(name, vec![], n);
    }
    m.gauge("bloomgate_outbox_open_gaps", vec![], o.open_gaps as f64);
    m.gauge(
        "bloomgate_outbox_last_read_timestamp_seconds",
        vec![],
        o.last_read_ms as f64 / 1e3,
    );
    if let Some(redis) = &f.redis.tier {
        for (kind, n) in [
            ("error", redis.errors),
            ("timeout", redis.timeouts),
            ("skipped", redis.skipped),
        ] {
            m.counter("bloomgate_redis_errors_total", vec![label("kind", kind)], n);
        }
        m.gauge(
            "bloomgate_redis_breaker_open",
            vec![],
            flag(redis.breaker != BreakerState::Closed),
        );
    }
    let sql = &f.sql;
    for (kind, n) in [("error", sql.errors), ("timeout", sql.timeouts)] {
        m.counter("bloomgate_sql_errors_total", vec![label("kind", kind)], n);
    }
    for (statement, n) in &sql.slow {
        m.counter(
            "bloomgate_sql_slow_queries_total",
            vec![label("statement", *statement)],
            *n,
        );
    }
    m.counter(
        "bloomgate_sql_bulkhead_rejected_total",
        vec![],
        sql.bulkhead_rejected,
    );
    m.counter("bloomgate_sql_full_counts_total", vec![], sql.full_counts);
    m.render()
}

/// One guarded table's series, each labelled `resource="<name>"`: its
/// filter, its L1 and Redis lookups, its SQL loads and statements, and
/// its key API calls.
fn render_resource(m: &ServiceMetrics, name: &str, r: &ResourceFigures) {
    let res = || vec![label("resource", name.to_owned())];
    let b = &r.funnel.filter;
    for (metric, n) in [
        ("bloomgate_filter_rejected_total", b.rejected),
        ("bloomgate_filter_passed_total", b.passed),
        ("bloomgate_filter_passed_missing_total", b.passed_missing),
        ("bloomgate_filter_rebuilds_total", b.rebuilds),
        (
            "bloomgate_filter_rebuild_failures_total",
            b.rebuild_failures,
        ),
        ("bloomgate_filter_alarms_total", b.alarms_raised),
        (
            "bloomgate_filter_rebuild_page_retries_total",
            b.rebuild_page_retries,
        ),
    ] {
        m.counter(metric, res(), n);
    }
    let audit = &r.funnel.audit;
    m.counter("bloomgate_filter_audited_total", res(), audit.sampled);
    m.counter(
        "bloomgate_filter_false_negatives_total",
        res(),
        audit.false_negatives,
    );
    for (metric, x) in [
        ("bloomgate_filter_observed_fpr", b.observed_fpr),
        ("bloomgate_filter_expected_fpr", b.expected_fpr),
        ("bloomgate_filter_target_fpr", b.target_fpr),
        ("bloomgate_filter_items", b.added as f64),
        ("bloomgate_filter_estimated_items", b.estimated_items),
        ("bloomgate_filter_capacity", b.capacity as f64),
        ("bloomgate_filter_fill_ratio", b.fill_ratio),
        (
            "bloomgate_filter_rebuild_scanned_keys",
            b.rebuild_scanned as f64,
        ),
        (
            "bloomgate_filter_rebuild_estimated_keys",
            b.rebuild_estimated_total as f64,
        ),
        (
            "bloomgate_filter_rebuild_keys_per_second",
            b.rebuild_rows_per_sec,
        ),
    ] {
        m.gauge(metric, res(), x);
    }
    m.gauge("bloomgate_filter_size_bytes", res(), (b.bits / 8) as f64);
    m.gauge("bloomgate_filter_ready", res(), flag(b.ready));
    for kind in crate::shield::Alarm::KINDS {
        let mut labels = res();
        labels.push(label("alarm", kind));
        m.gauge(
            "bloomgate_filter_alarm",
            labels,
            flag(b.alarm_kind == Some(kind)),
        );
    }
    let l1 = &r.funnel.l1;
    lookups(
        m,
        "bloomgate_l1_lookups_total",
        &res(),
        [
            ("hit", l1.hits),
            ("negative_hit", l1.negative_hits),
            ("miss", l1.misses),
        ],
    );
    m.gauge("bloomgate_l1_entries", res(), l1.entries as f64);
    if let Some(redis) = &r.funnel.redis {
        lookups(
            m,
            "bloomgate_redis_lookups_total",
            &res(),
            [
                ("hit", redis.hits),
                ("nil_hit", redis.nil_hits),
                ("miss", redis.misses),
            ],
        );
        m.counter(
            "bloomgate_redis_keys_written_total",
            res(),
            redis.keys_written,
        );
    }
    if let Some(sql) = &r.sql {
        for (result, n) in [("found", sql.found), ("missing", sql.missing())] {
            let mut labels = res();
            labels.push(label("result", result));
            m.counter("bloomgate_sql_queries_total", labels, n);
        }
        m.counter("bloomgate_sql_statements_total", res(), sql.statements);
    }
    let c = &r.calls;
    for (call, n) in [
        ("keys", c.keys_added),
        ("invalidate", c.invalidated),
        ("exists", c.exists_checked),
        ("batch", c.batch_keys),
        ("watch", c.watched),
    ] {
        let mut labels = res();
        labels.push(label("call", call));
        m.counter("bloomgate_call_keys_total", labels, n);
    }
}

/// `metric{labels…, result}` for each `(result, count)` of a level's lookups.
fn lookups(
    m: &ServiceMetrics,
    metric: &'static str,
    labels: &[Label],
    results: [(&'static str, u64); 3],
) {
    for (result, n) in results {
        let mut l = labels.to_vec();
        l.push(label("result", result));
        m.counter(metric, l, n);
    }
}

/// 1 for true.
fn flag(on: bool) -> f64 {
    f64::from(u8::from(on))
}

fn label(k: &'static str, v: impl Into<SharedString>) -> Label {
    Label::new(k, v.into())
}
