//! What the run reads around itself: the server's stats, the database's
//! own statement counter and Redis's key count, before, during (for the
//! plot) and after.

use anyhow::{bail, Context};
use serde_json::Value;

/// A point of the plot.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub secs: f64,
    pub sent: u64,
    pub sql_queries: i64,
    pub redis_keys: i64,
}

/// Counters read before and after.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub stats: Value,
    pub db: Option<i64>,
    pub redis_keys: Option<i64>,
}

pub fn get(v: &Value, path: &[&str]) -> i64 {
    path.iter().fold(v, |v, k| &v[*k]).as_i64().unwrap_or(0)
}

pub async fn stats(client: &reqwest::Client, url: &str) -> anyhow::Result<Value> {
    let r = client
        .get(url)
        .send()
        .await
        .with_context(|| format!("fetching {url}"))?;
    if !r.status().is_success() {
        bail!("{url} answered {}", r.status());
    }
    Ok(r.json().await?)
}

/// The database's own statement counter.
pub enum DbCounter {
    MySql(sqlx::MySqlPool),
    Postgres(sqlx::PgPool),
}

impl DbCounter {
    pub async fn connect(url: &str) -> anyhow::Result<Self> {
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

pub async fn redis_dbsize(conn: &mut redis::aio::MultiplexedConnection) -> anyhow::Result<i64> {
    Ok(redis::cmd("DBSIZE").query_async(conn).await?)
}

pub async fn snapshot(
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
