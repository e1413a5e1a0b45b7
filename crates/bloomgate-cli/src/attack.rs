//! `bloomgate attack`: seed 000's experiment as a tool. GETs of one
//! missing id, distinct random ids, existing ids or a mix, against a
//! running service, bounded in count, time and rate; a report of what got
//! through to Redis and SQL, from the server's stats and (optionally) the
//! database's and Redis's own counters; an SVG plot over time. With
//! `--resource NAME` the keys go to a guarded resource's
//! `GET /api/{name}/{key}` instead (text keys for a text resource).

mod counters;
mod plan;
mod report;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use serde_json::json;

use counters::{get, snapshot, stats, DbCounter, Sample};
use plan::{check_target, plan, Ids, Target};
use report::{percentile, points_to_series, print_report};

/// Most requests one run sends (latencies are kept, 4 bytes each).
pub const MAX_REQUESTS: u64 = 20_000_000;
/// Most requests in flight.
pub const MAX_CONCURRENCY: u64 = 4096;
/// Longest run, seconds.
pub const MAX_DURATION_SECS: f64 = 3600.0;

/// Which ids to ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// One id over and over (`--id`, seed 000's 200100 loop).
    Same,
    /// Distinct random ids from `--min-id..=--max-id`.
    Random,
    /// Random ids from the catalogue, `1..=--existing-max`.
    Existing,
    /// `--existing-ratio` existing ids, the rest random.
    Mix,
}

/// `bloomgate attack`.
#[derive(Debug, Args)]
pub struct AttackArgs {
    /// Attack resource NAME (`GET /api/{NAME}/{key}`) instead of seed
    /// 000's `/api/seckill/{id}`; a text resource gets text keys.
    #[arg(long)]
    resource: Option<String>,
    /// A text resource's keys are this prefix and a number (default `u`,
    /// seed 002's `u1001`); refused for integer keys.
    #[arg(long)]
    key_prefix: Option<String>,
    /// The request path, `{id}` where the key goes (`/api/profiles/{id}`):
    /// an API behind the HTTP gate. Needs --resource, whose filter's
    /// figures the report reads.
    #[arg(long)]
    path: Option<String>,
    /// The stats to read (default `{--url}/api/cache/stats`): bloomgate's
    /// own listener when --url is the gate (which forwards that path to
    /// the upstream).
    #[arg(long)]
    stats_url: Option<String>,
    /// Base URL of the service (loopback only, unless --allow-remote).
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
    /// Which ids to request.
    #[arg(long, value_enum, default_value = "random")]
    mode: Mode,
    /// The id of `--mode same`.
    #[arg(long, default_value_t = 200_100)]
    id: u64,
    /// Smallest random id.
    #[arg(long, default_value_t = 1)]
    min_id: u64,
    /// Largest random id (seed 000 enumerates 1..10^7).
    #[arg(long, default_value_t = 10_000_000)]
    max_id: u64,
    /// Existing ids are 1..=EXISTING_MAX (the seeded catalogue).
    #[arg(long, default_value_t = 200_000)]
    existing_max: u64,
    /// Share of existing ids in `--mode mix`.
    #[arg(long, default_value_t = 0.5)]
    existing_ratio: f64,
    /// Requests to send (at most 20,000,000). Default 100,000 unless
    /// --duration is given.
    #[arg(long)]
    requests: Option<u64>,
    /// Stop after this many seconds (at most 3600).
    #[arg(long)]
    duration: Option<f64>,
    /// Requests per second in all, paced evenly (default: as fast as the
    /// service answers).
    #[arg(long)]
    rate: Option<f64>,
    /// Requests in flight (at most 4096).
    #[arg(long, default_value_t = 32)]
    concurrency: u64,
    /// RNG seed, for repeatable runs.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Allow a target that is not on this machine.
    #[arg(long)]
    allow_remote: bool,
    /// Also read the database's own statement counter (MySQL/MariaDB:
    /// `Com_select`; PostgreSQL: committed transactions of the database).
    #[arg(long)]
    database_url: Option<String>,
    /// Also count keys with Redis's own `DBSIZE`.
    #[arg(long)]
    redis_url: Option<String>,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
    /// Draw requests, SQL queries and Redis keys over time into an SVG.
    #[arg(long)]
    plot: Option<std::path::PathBuf>,
    /// Seconds between samples of the server's stats for the plot.
    #[arg(long, default_value_t = 0.25)]
    sample_every: f64,
}

#[derive(Debug, Default)]
struct Tally {
    ok: AtomicU64,
    not_found: AtomicU64,
    other: AtomicU64,
    errors: AtomicU64,
}

pub async fn attack(a: AttackArgs) -> anyhow::Result<()> {
    let plan = plan(&a)?;
    let url = check_target(&a.url, a.allow_remote)?;
    let stats_url = match &a.stats_url {
        Some(s) => check_target(s, a.allow_remote)?,
        None => format!("{url}/api/cache/stats"),
    };
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .pool_max_idle_per_host(a.concurrency as usize)
        .build()?;
    let db = match &a.database_url {
        Some(u) => Some(DbCounter::connect(u).await?),
        None => None,
    };
    let mut redis = match &a.redis_url {
        Some(u) => Some(
            redis::Client::open(u.as_str())
                .context("--redis-url")?
                .get_multiplexed_async_connection()
                .await
                .context("--redis-url")?,
        ),
        None => None,
    };
    let before = snapshot(&client, &stats_url, db.as_ref(), redis.as_mut()).await?;
    let target = Target::new(&a, &before.stats)?;

    let ids = Ids::new(&a);
    let next = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let progress = indicatif::ProgressBar::new(plan.requests);
    if plan.deadline.is_some() && a.requests.is_none() {
        progress.set_length(0);
    }
    progress.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} {pos}/{len} requests {per_sec} {elapsed}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );

    // Sampler: the server's counters over time, for the plot.
    let samples = Arc::new(Mutex::new(Vec::<Sample>::new()));
    let sampler = a.plot.is_some().then(|| {
        let (client, url, samples, done, stop) = (
            client.clone(),
            stats_url.clone(),
            Arc::clone(&samples),
            Arc::clone(&done),
            Arc::clone(&stop),
        );
        let (q0, k0) = (
            target.sql(&before.stats).0,
            get(&before.stats, &["redis", "keys"]),
        );
        let target = target.clone();
        let every = Duration::from_secs_f64(a.sample_every);
        tokio::spawn(async move {
            loop {
                let finished = stop.load(Ordering::Relaxed);
                if let Ok(s) = stats(&client, &url).await {
                    let point = Sample {
                        secs: started.elapsed().as_secs_f64(),
                        sent: done.load(Ordering::Relaxed),
                        sql_queries: target.sql(&s).0 - q0,
                        redis_keys: get(&s, &["redis", "keys"]) - k0,
                    };
                    samples
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(point);
                }
                if finished {
                    return;
                }
                tokio::time::sleep(every).await;
            }
        })
    });

    let mut workers = Vec::new();
    for _ in 0..a.concurrency {
        let (client, next, done, tally, url, progress, target) = (
            client.clone(),
            Arc::clone(&next),
            Arc::clone(&done),
            Arc::clone(&tally),
            url.clone(),
            progress.clone(),
            target.clone(),
        );
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= plan.requests {
                    break;
                }
                if let Some(step) = plan.interval {
                    let at = started + step.mul_f64(i as f64);
                    tokio::time::sleep_until(at.into()).await;
                }
                if plan.deadline.is_some_and(|d| started.elapsed() >= d) {
                    break;
                }
                let sent = Instant::now();
                let slot = match client
                    .get(format!("{url}{}", target.path_of(ids.nth(i))))
                    .send()
                    .await
                {
                    Ok(r) if r.status() == 200 => &tally.ok,
                    Ok(r) if r.status() == 404 => &tally.not_found,
                    Ok(_) => &tally.other,
                    Err(_) => &tally.errors,
                };
                latencies.push(sent.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
                slot.fetch_add(1, Ordering::Relaxed);
                done.fetch_add(1, Ordering::Relaxed);
                progress.inc(1);
            }
            latencies
        }));
    }
    let mut latencies = Vec::new();
    for w in workers {
        latencies.extend(w.await?);
    }
    let elapsed = started.elapsed();
    progress.finish_and_clear();
    stop.store(true, Ordering::Relaxed);
    if let Some(s) = sampler {
        s.await?;
    }
    let after = snapshot(&client, &stats_url, db.as_ref(), redis.as_mut()).await?;
    latencies.sort_unstable();

    let sent = latencies.len() as u64;
    let per_k = |n: i64| {
        if sent == 0 {
            0.0
        } else {
            n as f64 * 1000.0 / sent as f64
        }
    };
    let delta = |p: &[&str]| get(&after.stats, p) - get(&before.stats, p);
    let outcomes = target.outcomes(&before.stats, &after.stats);
    let ((q1, m1), (q0, m0)) = (target.sql(&after.stats), target.sql(&before.stats));
    let sql_queries = q1 - q0;
    let db_delta = after.db.zip(before.db).map(|(a, b)| a - b);
    let redis_delta = after.redis_keys.zip(before.redis_keys).map(|(a, b)| a - b);
    let report = json!({
        "mode": format!("{:?}", a.mode).to_lowercase(),
        "url": url,
        "requests": sent,
        "seconds": elapsed.as_secs_f64(),
        "throughput": sent as f64 / elapsed.as_secs_f64().max(1e-9),
        "latency_ms": {
            "p50": percentile(&latencies, 0.50),
            "p90": percentile(&latencies, 0.90),
            "p99": percentile(&latencies, 0.99),
            "max": percentile(&latencies, 1.0),
        },
        "status": {
            "200": tally.ok.load(Ordering::Relaxed),
            "404": tally.not_found.load(Ordering::Relaxed),
            "other": tally.other.load(Ordering::Relaxed),
            "errors": tally.errors.load(Ordering::Relaxed),
        },
        "outcomes": outcomes,
        "resource": target.resource,
        "filter_rejected": delta(&target.figure(&["bloom", "rejected"])),
        "sql_queries": sql_queries,
        "sql_missing": m1 - m0,
        "sql_background": delta(&["sql", "background_statements"]),
        "database_counter": db_delta,
        "redis_keys_added": redis_delta,
        "per_1000": {
            "sql_queries": per_k(sql_queries),
            "database_counter": db_delta.map(per_k),
            "redis_keys_added": redis_delta.map(per_k),
        },
        "filter": {
            "ready": target.figure(&["bloom", "ready"]).iter().fold(&after.stats, |v, k| &v[*k]),
            "expected_fpr": target.figure(&["bloom", "expected_fpr"]).iter().fold(&after.stats, |v, k| &v[*k]),
        },
    });
    if let Some(path) = &a.plot {
        let points = samples
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        crate::plot::draw(
            path,
            &format!(
                "bloomgate attack --mode {}",
                report["mode"].as_str().unwrap_or("")
            ),
            &points_to_series(&points),
        )
        .with_context(|| format!("drawing {}", path.display()))?;
    }
    if a.json {
        println!("{report}");
    } else {
        print_report(&report);
    }
    if sent < plan.requests && plan.deadline.is_none() {
        bail!("stopped after {sent} of {} requests", plan.requests);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use serde_json::Value;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: AttackArgs,
    }

    fn args(extra: &[&str]) -> AttackArgs {
        Cli::parse_from(std::iter::once("attack").chain(extra.iter().copied())).a
    }

    #[test]
    fn random_ids_are_distinct_and_in_range() {
        for (min, max, seed) in [
            ("1", "1000", "1"),
            ("5", "5", "2"),
            ("100", "1099", "7"),
            ("1", "1024", "3"),
        ] {
            let a = args(&["--min-id", min, "--max-id", max, "--seed", seed]);
            let ids = Ids::new(&a);
            let span = a.max_id - a.min_id + 1;
            let got: std::collections::HashSet<u64> = (0..span).map(|i| ids.nth(i)).collect();
            assert_eq!(got.len() as u64, span, "{min}..={max}");
            assert!(got.iter().all(|&id| id >= a.min_id && id <= a.max_id));
        }
    }

    #[test]
    fn mix_follows_the_ratio() {
        let a = args(&[
            "--mode",
            "mix",
            "--existing-ratio",
            "0.3",
            "--existing-max",
            "1000",
            "--min-id",
            "1000000",
        ]);
        let ids = Ids::new(&a);
        let existing = (0..100_000).filter(|&i| ids.nth(i) <= 1000).count();
        // 30% of 10^5 draws: the standard deviation is about 145.
        assert!((29_300..=30_700).contains(&existing), "{existing}");
    }

    #[test]
    fn bounds_and_targets_are_checked() {
        for (bad, needle) in [
            (vec!["--concurrency", "0"], "--concurrency"),
            (vec!["--requests", "0"], "--requests"),
            (vec!["--requests", "20000001"], "--requests"),
            (vec!["--duration", "0"], "--duration"),
            (vec!["--duration", "3601"], "--duration"),
            (vec!["--rate", "0"], "--rate"),
            (vec!["--min-id", "10", "--max-id", "5"], "--min-id"),
            (
                vec!["--mode", "random", "--max-id", "10", "--requests", "11"],
                "distinct",
            ),
            (
                vec!["--mode", "mix", "--existing-ratio", "1.5"],
                "--existing-ratio",
            ),
            (vec!["--mode", "same", "--id", "0"], "--id"),
        ] {
            let e = plan(&args(&bad)).unwrap_err().to_string();
            assert!(e.contains(needle), "{bad:?}: {e}");
        }
        assert!(plan(&args(&["--duration", "5"])).is_ok());
        for ok in [
            "http://127.0.0.1:8080",
            "http://localhost:1/",
            "http://[::1]:80",
        ] {
            assert!(check_target(ok, false).is_ok(), "{ok}");
        }
        for remote in ["http://10.0.0.1:8080", "http://example.com"] {
            let e = check_target(remote, false).unwrap_err().to_string();
            assert!(e.contains("--allow-remote"), "{e}");
            assert!(check_target(remote, true).is_ok());
        }
        assert!(check_target("ftp://127.0.0.1", false).is_err());
        assert!(check_target("127.0.0.1:8080", false).is_err());
    }

    #[test]
    fn a_resource_gets_its_route_its_keys_and_its_figures() {
        let stats = json!({
            "bloom": {"rejected": 1},
            "sql": {"queries": 10, "missing": 4},
            "resources": {
                "users": {
                    "key_type": "text",
                    "filter": {"rejected": 7},
                    "sql": {"statements": 5, "loads": 3, "found": 1},
                },
                "orders": {"key_type": "int", "filter": {"rejected": 0}},
            },
        });
        let seckill = Target::new(&args(&[]), &stats).unwrap();
        assert_eq!(seckill.path_of(200_100), "/api/seckill/200100");
        assert_eq!(seckill.sql(&stats), (10, 4));
        let users = Target::new(&args(&["--resource", "users"]), &stats).unwrap();
        assert_eq!(users.path_of(1001), "/api/users/u1001");
        assert_eq!(get(&stats, &users.figure(&["bloom", "rejected"])), 7);
        assert_eq!(users.sql(&stats), (5, 2));
        let users = Target::new(
            &args(&["--resource", "users", "--key-prefix", "k-"]),
            &stats,
        )
        .unwrap();
        assert_eq!(users.path_of(9), "/api/users/k-9");
        let behind = Target::new(
            &args(&["--resource", "users", "--path", "/api/profiles/{id}/card"]),
            &stats,
        )
        .unwrap();
        assert_eq!(behind.path_of(7), "/api/profiles/u7/card");
        for bad in ["api/{id}", "/api/x", "/{id}/{id}"] {
            let e = Target::new(&args(&["--resource", "users", "--path", bad]), &stats)
                .unwrap_err()
                .to_string();
            assert!(e.contains("--path"), "{bad}: {e}");
        }
        let e = Target::new(&args(&["--path", "/p/{id}"]), &stats)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--resource"), "{e}");
        let orders = Target::new(&args(&["--resource", "orders"]), &stats).unwrap();
        assert_eq!(orders.path_of(42), "/api/orders/42");
        let e = Target::new(&args(&["--resource", "carts"]), &stats)
            .unwrap_err()
            .to_string();
        assert!(e.contains("carts") && e.contains("users, orders"), "{e}");
        let e = Target::new(
            &args(&["--resource", "orders", "--key-prefix", "k"]),
            &stats,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("integer keys"), "{e}");
        for (bad, needle) in [
            (vec!["--resource", "Users"], "--resource"),
            (vec!["--resource", "a/b"], "--resource"),
            (
                vec!["--resource", "users", "--key-prefix", "a/b"],
                "--key-prefix",
            ),
            (vec!["--key-prefix", "u"], "--resource"),
        ] {
            let e = plan(&args(&bad)).unwrap_err().to_string();
            assert!(e.contains(needle), "{bad:?}: {e}");
        }
        // What answered, by level: seed 000's request counts, or a
        // resource's levels.
        let after = json!({
            "requests": {"filter_rejected": 5, "db_found": 2},
            "resources": {"users": {
                "key_type": "text",
                "filter": {"rejected": 17},
                "l1": {"hits": 4, "negative_hits": 0},
                "sql": {"statements": 9, "loads": 7, "found": 4},
            }},
        });
        let before = json!({
            "requests": {"filter_rejected": 1, "db_found": 2},
            "resources": {"users": {
                "key_type": "text",
                "filter": {"rejected": 7},
                "sql": {"statements": 5, "loads": 3, "found": 1},
            }},
        });
        let seckill = Target::new(&args(&[]), &after).unwrap();
        assert_eq!(
            Value::from(seckill.outcomes(&before, &after)),
            json!({"filter_rejected": 4})
        );
        let users = Target::new(&args(&["--resource", "users"]), &after).unwrap();
        assert_eq!(
            Value::from(users.outcomes(&before, &after)),
            json!({"filter_rejected": 10, "l1_hit": 4, "db_found": 3, "db_missing": 1})
        );
    }
}
