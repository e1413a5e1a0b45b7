//! Statement limits: a timeout on every statement (`Within::within`), and
//! the counting and one-time logging of statements slower than
//! `sql.slow_query_ms`.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::sql::StoreCounters;

/// A bound on every statement's duration; a statement past it fails with
/// an I/O `TimedOut` error (and is counted). A statement slower than
/// `slow` is counted by name, and logged the first time only.
#[derive(Debug, Clone)]
pub(crate) struct StatementLimit {
    pub(crate) timeout: Duration,
    pub(crate) slow: Duration,
    pub(crate) counters: Arc<StoreCounters>,
}

impl StatementLimit {
    pub(crate) fn note_slow(&self, statement: &'static str, took: Duration) {
        let first = {
            let mut slow = crate::sync::lock(&self.counters.slow);
            let n = slow.entry(statement).or_default();
            *n += 1;
            *n == 1
        };
        if first {
            tracing::warn!(
                statement,
                took_ms = took.as_secs_f64() * 1e3,
                slow_query_ms = self.slow.as_millis() as u64,
                "slow SQL statement (logged once; later ones are counted in bloomgate_sql_slow_queries_total)"
            );
        }
    }
}

/// `.within(&limit)` on any sqlx future: the statement timeout.
pub(crate) trait Within<T>: Future<Output = Result<T, sqlx::Error>> + Sized {
    async fn within(
        self,
        limit: &StatementLimit,
        statement: &'static str,
    ) -> Result<T, sqlx::Error> {
        let started = Instant::now();
        match tokio::time::timeout(limit.timeout, self).await {
            Ok(r) => {
                let took = started.elapsed();
                if took >= limit.slow {
                    limit.note_slow(statement, took);
                }
                if let Err(e) = &r {
                    if !super::error::is_unique_violation(e) {
                        limit.counters.errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
                r
            }
            Err(_) => {
                limit.counters.timeouts.fetch_add(1, Ordering::Relaxed);
                Err(sqlx::Error::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("statement took longer than {:?}", limit.timeout),
                )))
            }
        }
    }
}

impl<T, F: Future<Output = Result<T, sqlx::Error>>> Within<T> for F {}
