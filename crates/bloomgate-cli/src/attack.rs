//! `bloomgate attack`: random-id GETs against a running service, to show
//! what reaches Redis and SQL.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use serde_json::Value;

/// `bloomgate attack`.
#[derive(Debug, Args)]
pub struct AttackArgs {
    /// Base URL of the service.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
    /// Requests to send.
    #[arg(long, default_value_t = 100_000)]
    requests: u64,
    /// Requests in flight.
    #[arg(long, default_value_t = 32)]
    concurrency: u64,
    /// Ids are drawn uniformly from 1..=MAX_ID.
    #[arg(long, default_value_t = 10_000_000)]
    max_id: u64,
    /// RNG seed, for repeatable runs.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout_secs: u64,
}

fn get(v: &Value, path: &[&str]) -> i64 {
    path.iter().fold(v, |v, k| &v[*k]).as_i64().unwrap_or(0)
}

pub async fn attack(a: AttackArgs) -> anyhow::Result<()> {
    if a.concurrency == 0 || a.max_id == 0 {
        bail!("--concurrency and --max-id must be at least 1");
    }
    let url = url_base(&a.url)?;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;
    let stats_url = format!("{url}/api/cache/stats");
    let before: Value = client
        .get(&stats_url)
        .send()
        .await
        .context("fetching stats")?
        .json()
        .await?;
    let next = Arc::new(AtomicU64::new(0));
    let codes: Arc<[AtomicU64; 4]> = Arc::new(Default::default()); // 200, 404, other, errors
    let started = Instant::now();
    let deadline = started + Duration::from_secs(a.timeout_secs);
    let mut tasks = Vec::new();
    for _ in 0..a.concurrency {
        let (client, next, codes, url) = (
            client.clone(),
            Arc::clone(&next),
            Arc::clone(&codes),
            url.clone(),
        );
        let (total, max_id, seed) = (a.requests, a.max_id, a.seed);
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total || Instant::now() > deadline {
                    break;
                }
                let id = bloomgate_filter::hash::splitmix64(
                    seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ i,
                ) % max_id
                    + 1;
                let slot = match client.get(format!("{url}/api/seckill/{id}")).send().await {
                    Ok(r) if r.status() == 200 => 0,
                    Ok(r) if r.status() == 404 => 1,
                    Ok(_) => 2,
                    Err(_) => 3,
                };
                codes[slot].fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await?;
    }
    let elapsed = started.elapsed();
    let after: Value = client.get(&stats_url).send().await?.json().await?;
    let sent: u64 = codes.iter().map(|c| c.load(Ordering::Relaxed)).sum();
    println!(
        "sent {sent} requests in {:.2}s ({:.0} req/s)",
        elapsed.as_secs_f64(),
        sent as f64 / elapsed.as_secs_f64()
    );
    println!(
        "200: {}  404: {}  other: {}  errors: {}",
        codes[0].load(Ordering::Relaxed),
        codes[1].load(Ordering::Relaxed),
        codes[2].load(Ordering::Relaxed),
        codes[3].load(Ordering::Relaxed)
    );
    let delta = |p: &[&str]| get(&after, p) - get(&before, p);
    println!("bloom rejected   +{}", delta(&["bloom", "rejected"]));
    println!("sql queries      +{}", delta(&["sql", "queries"]));
    println!(
        "redis misses     +{}  nil hits +{}",
        delta(&["redis", "misses"]),
        delta(&["redis", "nil_hits"])
    );
    println!("redis keys       +{}", delta(&["redis", "keys"]));
    if sent < a.requests {
        bail!("stopped after {sent} of {} requests (timeout)", a.requests);
    }
    Ok(())
}

fn url_base(raw: &str) -> anyhow::Result<String> {
    let u = raw.trim_end_matches('/');
    if !(u.starts_with("http://") || u.starts_with("https://")) {
        bail!("--url must start with http:// (got {raw})");
    }
    Ok(u.to_string())
}
