//! The run's report: percentiles, the plot's series and the text form.

use serde_json::Value;

use super::counters::Sample;

pub fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    f64::from(sorted[i]) / 1000.0
}

pub fn points_to_series(points: &[Sample]) -> crate::plot::Series {
    let mut s = crate::plot::Series::default();
    for w in points.windows(2) {
        let dt = (w[1].secs - w[0].secs).max(1e-9);
        s.requests_per_sec
            .push((w[1].secs, (w[1].sent - w[0].sent) as f64 / dt));
        s.sql_per_sec
            .push((w[1].secs, (w[1].sql_queries - w[0].sql_queries) as f64 / dt));
    }
    s.redis_keys = points
        .iter()
        .map(|p| (p.secs, p.redis_keys as f64))
        .collect();
    s
}

pub fn print_report(r: &Value) {
    let f = |p: &[&str]| p.iter().fold(r, |v, k| &v[*k]).as_f64().unwrap_or(0.0);
    println!(
        "{} requests ({} mode) in {:.2} s: {:.0} req/s",
        r["requests"],
        r["mode"].as_str().unwrap_or(""),
        f(&["seconds"]),
        f(&["throughput"])
    );
    println!(
        "latency ms: p50 {:.3}  p90 {:.3}  p99 {:.3}  max {:.3}",
        f(&["latency_ms", "p50"]),
        f(&["latency_ms", "p90"]),
        f(&["latency_ms", "p99"]),
        f(&["latency_ms", "max"])
    );
    let s = &r["status"];
    println!(
        "status: 200 {}  404 {}  other {}  errors {}",
        s["200"], s["404"], s["other"], s["errors"]
    );
    if let Some(o) = r["outcomes"].as_object() {
        let parts: Vec<String> = o.iter().map(|(k, v)| format!("{k} {v}")).collect();
        println!("answered by: {}", parts.join("  "));
    }
    println!(
        "sql queries +{} (missing ids +{}), {:.2} per 1,000 requests",
        r["sql_queries"],
        r["sql_missing"],
        f(&["per_1000", "sql_queries"])
    );
    if !r["database_counter"].is_null() {
        println!(
            "database's own counter +{}, {:.2} per 1,000 requests",
            r["database_counter"],
            f(&["per_1000", "database_counter"])
        );
    }
    if r["redis_keys_added"].is_null() {
        println!("redis: not configured");
    } else {
        println!(
            "redis keys +{}, {:.2} per 1,000 requests",
            r["redis_keys_added"],
            f(&["per_1000", "redis_keys_added"])
        );
    }
    println!(
        "filter: ready {}, expected FPR {}",
        r["filter"]["ready"], r["filter"]["expected_fpr"]
    );
}

#[cfg(test)]
mod tests {
    use super::percentile;

    #[test]
    fn percentiles_pick_the_nearest_rank() {
        let v: Vec<u32> = (1..=100).map(|x| x * 1000).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&v, 1.0), 100.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }
}
