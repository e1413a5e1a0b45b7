//! Dropping every cached value of a table at once, for the changes no
//! trigger sees (`TRUNCATE`, foreign-key cascades, a restore): a warm
//! with `rebuild_bloom`, the remedy for them, rebuilds the filter and
//! sweeps the table's values out of Redis, so no deleted row is served
//! from there until its TTL.

use bloomgate_redis::Conn;

use crate::cache::{CacheError, RedisTier};

/// Keys deleted per `UNLINK` (and asked for per `SCAN` step).
const SWEEP_BATCH: usize = 1000;

/// `text` with Redis glob's special characters escaped.
fn glob_literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

impl RedisTier {
    /// Deletes every value under this tier's namespace
    /// (`{prefix}{namespace}*`: rows, `__nil__`s and leases, never the
    /// filter's or the change feed's keys), `SCAN` and `UNLINK` a batch at
    /// a time; returns how many. On a Redis Cluster nothing is swept (a
    /// `SCAN` reaches one node): the values there expire within
    /// `cache.redis_ttl_secs`, and this returns `None`.
    ///
    /// # Errors
    /// [`CacheError`] from the first command that failed.
    pub async fn sweep(&self) -> Result<Option<u64>, CacheError> {
        if matches!(self.conn, Conn::Cluster(_)) {
            return Ok(None);
        }
        let pattern = format!(
            "{}{}*",
            glob_literal(&self.prefix),
            glob_literal(&self.namespace)
        );
        let (mut cursor, mut deleted) = (0_u64, 0_u64);
        loop {
            let mut conn = self.conn.clone();
            let (next, keys): (u64, Vec<String>) = self
                .guarded(
                    redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(&pattern)
                        .arg("COUNT")
                        .arg(SWEEP_BATCH)
                        .query_async(&mut conn),
                )
                .await?;
            if !keys.is_empty() {
                let n: u64 = self
                    .guarded(redis::cmd("UNLINK").arg(&keys).query_async(&mut conn))
                    .await?;
                deleted += n;
            }
            if next == 0 {
                return Ok(Some(deleted));
            }
            cursor = next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::glob_literal;

    #[test]
    fn a_prefix_is_matched_literally() {
        assert_eq!(glob_literal("bg:*?[x]\\:"), "bg:\\*\\?\\[x\\]\\\\:");
        assert_eq!(glob_literal("plain:"), "plain:");
    }
}
