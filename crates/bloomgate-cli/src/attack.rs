//! `bloomgate attack`: seed 000's experiment as a tool. GETs of one
//! missing id, distinct random ids, existing ids or a mix, against a
//! running service, bounded in count, time and rate; a report of what got
//! through to Redis and SQL, from the server's stats and (optionally) the
//! database's and Redis's own counters; an SVG plot over time.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use serde_json::{json, Value};

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

/// How many requests and for how long, after checking the bounds.
#[derive(Debug, Clone, Copy)]
struct Plan {
    requests: u64,
    deadline: Option<Duration>,
    interval: Option<Duration>,
}

fn plan(a: &AttackArgs) -> anyhow::Result<Plan> {
    if a.concurrency == 0 || a.concurrency > MAX_CONCURRENCY {
        bail!(
            "--concurrency must be 1..={MAX_CONCURRENCY} (got {})",
            a.concurrency
        );
    }
    let requests = match (a.requests, a.duration) {
        (Some(n), _) => n,
        (None, Some(_)) => MAX_REQUESTS,
        (None, None) => 100_000,
    };
    if requests == 0 || requests > MAX_REQUESTS {
        bail!("--requests must be 1..={MAX_REQUESTS} (got {requests})");
    }
    let deadline = match a.duration {
        Some(d) if !(d > 0.0 && d <= MAX_DURATION_SECS) => {
            bail!("--duration must be over 0 and at most {MAX_DURATION_SECS} seconds (got {d})")
        }
        Some(d) => Some(Duration::from_secs_f64(d)),
        None => None,
    };
    let interval = match a.rate {
        Some(r) if !(0.01..=10_000_000.0).contains(&r) => {
            bail!("--rate must be 0.01..=10000000 requests per second (got {r})")
        }
        Some(r) => Some(Duration::from_secs_f64(1.0 / r)),
        None => None,
    };
    if !(0.01..=60.0).contains(&a.sample_every) {
        bail!(
            "--sample-every must be 0.01..=60 seconds (got {})",
            a.sample_every
        );
    }
    match a.mode {
        Mode::Same if a.id == 0 || a.id > i64::MAX as u64 => {
            bail!("--id must be a positive 64-bit id (got {})", a.id)
        }
        Mode::Random | Mode::Mix
            if a.min_id == 0 || a.min_id > a.max_id || a.max_id > i64::MAX as u64 =>
        {
            bail!(
                "--min-id and --max-id must satisfy 1 <= min <= max <= 2^63-1 (got {}..={})",
                a.min_id,
                a.max_id
            )
        }
        Mode::Existing | Mode::Mix if a.existing_max == 0 || a.existing_max > i64::MAX as u64 => {
            bail!(
                "--existing-max must be a positive 64-bit id (got {})",
                a.existing_max
            )
        }
        Mode::Mix if !(0.0..=1.0).contains(&a.existing_ratio) => {
            bail!(
                "--existing-ratio must be in [0, 1] (got {})",
                a.existing_ratio
            )
        }
        _ => {}
    }
    if a.mode == Mode::Random && requests > a.max_id - a.min_id + 1 && a.duration.is_none() {
        bail!(
            "--mode random sends distinct ids: {requests} requests need a range of at least that many (got {}..={})",
            a.min_id, a.max_id
        );
    }
    Ok(Plan {
        requests,
        deadline,
        interval,
    })
}

/// The i-th id of a run: a pure function of the arguments, so runs repeat.
#[derive(Debug, Clone, Copy)]
struct Ids {
    mode: Mode,
    id: u64,
    min: u64,
    span: u64,
    /// A multiplier coprime with `span`: i ↦ (i·step + offset) mod span is
    /// a permutation, so the first `span` random ids are distinct.
    step: u64,
    offset: u64,
    existing_max: u64,
    /// `--existing-ratio` scaled to 2^64.
    existing_below: u64,
    seed: u64,
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl Ids {
    fn new(a: &AttackArgs) -> Self {
        let span = a.max_id - a.min_id + 1;
        let mix = bloomgate_filter::hash::splitmix64;
        let mut step = mix(a.seed) % span.max(1);
        let mut n = 0;
        while gcd(step, span) != 1 {
            n += 1;
            step = mix(a.seed.wrapping_add(n)) % span;
        }
        Self {
            mode: a.mode,
            id: a.id,
            min: a.min_id,
            span,
            step,
            offset: mix(a.seed ^ 0x5eed) % span,
            existing_max: a.existing_max,
            existing_below: (a.existing_ratio * 2f64.powi(64)).min(u64::MAX as f64) as u64,
            seed: a.seed,
        }
    }

    fn random(&self, i: u64) -> u64 {
        let k = (u128::from(i) * u128::from(self.step) + u128::from(self.offset))
            % u128::from(self.span);
        self.min + k as u64
    }

    fn existing(&self, i: u64) -> u64 {
        bloomgate_filter::hash::splitmix64(self.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ i)
            % self.existing_max
            + 1
    }

    fn nth(&self, i: u64) -> u64 {
        match self.mode {
            Mode::Same => self.id,
            Mode::Random => self.random(i),
            Mode::Existing => self.existing(i),
            Mode::Mix => {
                let coin = bloomgate_filter::hash::splitmix64(self.seed ^ i.rotate_left(17));
                if coin < self.existing_below {
                    self.existing(i)
                } else {
                    self.random(i)
                }
            }
        }
    }
}

/// Refuses targets off this machine unless allowed.
fn check_target(raw: &str, allow_remote: bool) -> anyhow::Result<String> {
    let url = reqwest::Url::parse(raw).with_context(|| format!("--url {raw:?} is not a URL"))?;
    if !matches!(url.scheme(), "http" | "https") {
        bail!("--url must be http:// or https:// (got {raw})");
    }
    let loopback = match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => bail!("--url has no host (got {raw})"),
    };
    if !loopback && !allow_remote {
        bail!("--url {raw} is not on this machine; pass --allow-remote to attack it anyway");
    }
    Ok(raw.trim_end_matches('/').to_string())
}

/// A point of the plot.
#[derive(Debug, Clone, Copy)]
struct Sample {
    secs: f64,
    sent: u64,
    sql_queries: i64,
    redis_keys: i64,
}

/// Counters read before and after.
#[derive(Debug, Clone)]
struct Snapshot {
    stats: Value,
    db: Option<i64>,
    redis_keys: Option<i64>,
}

fn get(v: &Value, path: &[&str]) -> i64 {
    path.iter().fold(v, |v, k| &v[*k]).as_i64().unwrap_or(0)
}

async fn stats(client: &reqwest::Client, url: &str) -> anyhow::Result<Value> {
    let r = client
        .get(format!("{url}/api/cache/stats"))
        .send()
        .await
        .with_context(|| format!("fetching {url}/api/cache/stats"))?;
    if !r.status().is_success() {
        bail!("{url}/api/cache/stats answered {}", r.status());
    }
    Ok(r.json().await?)
}

/// The database's own statement counter.
enum DbCounter {
    MySql(sqlx::MySqlPool),
    Postgres(sqlx::PgPool),
}

impl DbCounter {
    async fn connect(url: &str) -> anyhow::Result<Self> {
        if url.starts_with("mysql:") || url.starts_with("mariadb:") {
            let url = url.replacen("mariadb:", "mysql:", 1);
            Ok(Self::MySql(
                sqlx::MySqlPool::connect(&url)
                    .await
                    .context("--database-url")?,
            ))
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            Ok(Self::Postgres(
                sqlx::PgPool::connect(url).await.context("--database-url")?,
            ))
        } else {
            bail!("--database-url must be mysql:// or postgres:// (SQLite keeps no server-side query counter)")
        }
    }

    async fn read(&self) -> anyhow::Result<i64> {
        use sqlx::Row;
        Ok(match self {
            Self::MySql(p) => {
                let row = sqlx::query("SHOW GLOBAL STATUS LIKE 'Com_select'")
                    .fetch_one(p)
                    .await?;
                let v: String = row.try_get(1)?;
                v.parse()?
            }
            Self::Postgres(p) => {
                // Statistics are flushed when a backend goes idle; ask for
                // a fresh snapshot.
                sqlx::query("SELECT pg_stat_clear_snapshot()")
                    .execute(p)
                    .await?;
                sqlx::query_scalar::<_, i64>(
                    "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()",
                )
                .fetch_one(p)
                .await?
            }
        })
    }
}

async fn redis_dbsize(conn: &mut redis::aio::MultiplexedConnection) -> anyhow::Result<i64> {
    Ok(redis::cmd("DBSIZE").query_async(conn).await?)
}

async fn snapshot(
    client: &reqwest::Client,
    url: &str,
    db: Option<&DbCounter>,
    redis: Option<&mut redis::aio::MultiplexedConnection>,
) -> anyhow::Result<Snapshot> {
    let stats = stats(client, url).await?;
    let db = match db {
        Some(d) => Some(d.read().await?),
        None => None,
    };
    let redis_keys = match redis {
        Some(c) => Some(redis_dbsize(c).await?),
        None => stats["redis"]["keys"].as_i64(),
    };
    Ok(Snapshot {
        stats,
        db,
        redis_keys,
    })
}

#[derive(Debug, Default)]
struct Tally {
    ok: AtomicU64,
    not_found: AtomicU64,
    other: AtomicU64,
    errors: AtomicU64,
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    f64::from(sorted[i]) / 1000.0
}

pub async fn attack(a: AttackArgs) -> anyhow::Result<()> {
    let plan = plan(&a)?;
    let url = check_target(&a.url, a.allow_remote)?;
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
    let before = snapshot(&client, &url, db.as_ref(), redis.as_mut()).await?;

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
            url.clone(),
            Arc::clone(&samples),
            Arc::clone(&done),
            Arc::clone(&stop),
        );
        let (q0, k0) = (
            get(&before.stats, &["sql", "queries"]),
            get(&before.stats, &["redis", "keys"]),
        );
        let every = Duration::from_secs_f64(a.sample_every);
        tokio::spawn(async move {
            loop {
                let finished = stop.load(Ordering::Relaxed);
                if let Ok(s) = stats(&client, &url).await {
                    let point = Sample {
                        secs: started.elapsed().as_secs_f64(),
                        sent: done.load(Ordering::Relaxed),
                        sql_queries: get(&s, &["sql", "queries"]) - q0,
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
        let (client, next, done, tally, url, progress) = (
            client.clone(),
            Arc::clone(&next),
            Arc::clone(&done),
            Arc::clone(&tally),
            url.clone(),
            progress.clone(),
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
                    .get(format!("{url}/api/seckill/{}", ids.nth(i)))
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
    let after = snapshot(&client, &url, db.as_ref(), redis.as_mut()).await?;
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
    let outcomes: serde_json::Map<String, Value> = after.stats["requests"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| {
                    let was = before.stats["requests"][k].as_i64().unwrap_or(0);
                    (k.clone(), json!(v.as_i64().unwrap_or(0) - was))
                })
                .filter(|(_, v)| v.as_i64() != Some(0))
                .collect()
        })
        .unwrap_or_default();
    let sql_queries = delta(&["sql", "queries"]);
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
        "filter_rejected": delta(&["bloom", "rejected"]),
        "sql_queries": sql_queries,
        "sql_missing": delta(&["sql", "missing"]),
        "sql_background": delta(&["sql", "background_statements"]),
        "database_counter": db_delta,
        "redis_keys_added": redis_delta,
        "per_1000": {
            "sql_queries": per_k(sql_queries),
            "database_counter": db_delta.map(per_k),
            "redis_keys_added": redis_delta.map(per_k),
        },
        "filter": {
            "ready": after.stats["bloom"]["ready"],
            "expected_fpr": after.stats["bloom"]["expected_fpr"],
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

fn points_to_series(points: &[Sample]) -> crate::plot::Series {
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

fn print_report(r: &Value) {
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
    use super::*;
    use clap::Parser;

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
    fn percentiles_pick_the_nearest_rank() {
        let v: Vec<u32> = (1..=100).map(|x| x * 1000).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&v, 1.0), 100.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }
}
