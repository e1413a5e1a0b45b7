//! The request latency histogram: fixed buckets, sharded by thread like
//! [`super::Counter`], recorded with two uncontended atomic additions and
//! no allocation, rendered in the Prometheus text format.
//!
//! It replaced the `metrics` recorder's histogram on the request path,
//! which kept every sample in a shared lock-free list of 64-sample blocks
//! (an allocation every 64 requests, one shared tail both cores pushed
//! to) until an upkeep pass folded them into buckets.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{shard_index, SHARDS};

/// Seconds: request latency buckets, 50 µs to 10 s.
pub const LATENCY_BUCKETS: [f64; 17] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
];

/// The buckets' upper bounds in nanoseconds, for the comparison made on
/// every request.
const BOUNDS_NANOS: [u64; 17] = {
    let mut out = [0u64; 17];
    let micros = [
        50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
        1_000_000, 2_500_000, 5_000_000, 10_000_000,
    ];
    let mut i = 0;
    while i < 17 {
        out[i] = micros[i] * 1_000;
        i += 1;
    }
    out
};

#[derive(Debug, Default)]
#[repr(align(64))]
struct Shard {
    /// Samples per bucket, not cumulative; the last is `+Inf`.
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    sum_nanos: AtomicU64,
}

/// One series' latency histogram.
#[derive(Debug, Default)]
pub struct LatencyHistogram {
    shards: [Shard; SHARDS],
}

/// What a histogram holds at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    /// Samples at or below each bound of [`LATENCY_BUCKETS`] (cumulative).
    pub cumulative: [u64; LATENCY_BUCKETS.len()],
    /// Every sample.
    pub count: u64,
    /// Their sum, in seconds.
    pub sum_seconds: f64,
}

impl LatencyHistogram {
    /// Records one latency.
    #[inline]
    pub fn record(&self, latency: std::time::Duration) {
        let nanos = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        let bucket = BOUNDS_NANOS.partition_point(|&b| b < nanos);
        let shard = &self.shards[shard_index()];
        shard.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        shard.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// The sums over every shard.
    #[must_use]
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut per = [0u64; LATENCY_BUCKETS.len() + 1];
        let mut sum = 0u64;
        for s in &self.shards {
            for (p, b) in per.iter_mut().zip(&s.buckets) {
                *p = p.wrapping_add(b.load(Ordering::Relaxed));
            }
            sum = sum.wrapping_add(s.sum_nanos.load(Ordering::Relaxed));
        }
        let mut cumulative = [0u64; LATENCY_BUCKETS.len()];
        let mut running = 0u64;
        for (c, p) in cumulative.iter_mut().zip(per) {
            running += p;
            *c = running;
        }
        #[allow(clippy::cast_precision_loss)]
        let sum_seconds = sum as f64 / 1e9;
        HistogramSnapshot {
            cumulative,
            count: running + per[LATENCY_BUCKETS.len()],
            sum_seconds,
        }
    }
}

/// A label value as the text format wants it.
pub(super) fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Writes the `_bucket`, `_sum` and `_count` lines of one series of
/// `name`, labelled `labels` (name, value pairs).
pub fn write_series(out: &mut String, name: &str, labels: &[(&str, &str)], h: &HistogramSnapshot) {
    let mut l = String::new();
    for (k, v) in labels {
        let _ = write!(l, "{k}=\"{}\",", escape(v));
    }
    for (bound, n) in LATENCY_BUCKETS.iter().zip(h.cumulative) {
        let _ = writeln!(out, "{name}_bucket{{{l}le=\"{bound}\"}} {n}");
    }
    let _ = writeln!(out, "{name}_bucket{{{l}le=\"+Inf\"}} {}", h.count);
    let l = l.trim_end_matches(',');
    let _ = writeln!(out, "{name}_sum{{{l}}} {}", h.sum_seconds);
    let _ = writeln!(out, "{name}_count{{{l}}} {}", h.count);
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{write_series, LatencyHistogram, BOUNDS_NANOS, LATENCY_BUCKETS};

    #[test]
    fn the_bounds_are_the_buckets() {
        for (s, n) in LATENCY_BUCKETS.iter().zip(BOUNDS_NANOS) {
            assert!((s * 1e9 - n as f64).abs() < 1e-3, "{s} {n}");
        }
    }

    /// A bound is inclusive (`le`), every sample lands once, over threads.
    #[test]
    fn samples_land_in_their_buckets_from_every_thread() {
        let h = LatencyHistogram::default();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..1000 {
                        h.record(Duration::from_micros(50)); // on the first bound
                        h.record(Duration::from_micros(51)); // just past it
                        h.record(Duration::from_millis(3));
                        h.record(Duration::from_secs(11)); // past the last
                    }
                });
            }
        });
        let snap = h.snapshot();
        assert_eq!(snap.count, 16_000);
        assert_eq!(snap.cumulative[0], 4000, "50 µs is within le=0.00005");
        assert_eq!(snap.cumulative[1], 8000);
        assert_eq!(snap.cumulative[5], 8000, "2.5 ms");
        assert_eq!(snap.cumulative[6], 12_000, "5 ms");
        assert_eq!(snap.cumulative[16], 12_000, "10 s");
        let want = 4000.0 * (50e-6 + 51e-6 + 3e-3 + 11.0);
        assert!(
            (snap.sum_seconds - want).abs() < 1e-6,
            "{}",
            snap.sum_seconds
        );
    }

    #[test]
    fn a_series_is_written_in_the_text_format() {
        let h = LatencyHistogram::default();
        h.record(Duration::from_micros(300));
        let mut out = String::new();
        write_series(
            &mut out,
            "x_seconds",
            &[("route", "/a\"b"), ("outcome", "ok")],
            &h.snapshot(),
        );
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), LATENCY_BUCKETS.len() + 3);
        assert_eq!(
            lines[0],
            r#"x_seconds_bucket{route="/a\"b",outcome="ok",le="0.00005"} 0"#
        );
        assert_eq!(
            lines[3],
            r#"x_seconds_bucket{route="/a\"b",outcome="ok",le="0.0005"} 1"#
        );
        assert_eq!(
            lines[17],
            r#"x_seconds_bucket{route="/a\"b",outcome="ok",le="+Inf"} 1"#
        );
        assert_eq!(
            lines[18],
            r#"x_seconds_sum{route="/a\"b",outcome="ok"} 0.0003"#
        );
        assert_eq!(
            lines[19],
            r#"x_seconds_count{route="/a\"b",outcome="ok"} 1"#
        );
    }
}
