//! The crate's error enum and its `Result`.

/// What can go wrong with a shared filter.
///
/// ```
/// use bloomgate_redis::{Error, RedisBloom};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let url = std::env::var("BLOOMGATE_TEST_REDIS_URL")
/// #     .unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
/// let client = redis::Client::open(url)?;
/// let conn = match redis::aio::ConnectionManager::new(client).await {
///     Ok(c) => c,
/// #   // Without a Redis to talk to, the example has nothing to show
/// #   // (under CI=true it fails instead).
/// #   Err(_) if std::env::var("CI").as_deref() != Ok("true") => return Ok(()),
///     Err(e) => return Err(e.into()),
/// };
/// let key = "bgdoc:error";
/// # let _: () = redis::cmd("DEL").arg(key).arg(format!("{key}:meta")).query_async(&mut conn.clone()).await?;
/// let f = RedisBloom::create(conn.clone(), key, 1000, 0.01, 1).await?;
/// // The same key with another shape is refused, never silently resized.
/// let other = RedisBloom::create(conn.clone(), key, 5000, 0.01, 1).await;
/// assert!(matches!(other, Err(Error::ShapeMismatch { .. })));
/// f.destroy().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Redis failed or is unreachable.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// Sizing or filter construction failed.
    #[error(transparent)]
    Filter(#[from] bloomgate_filter::Error),
    /// The metadata under `{key}:meta` is missing or not a bloomgate filter's.
    #[error("shared filter {key}: {reason}")]
    Meta {
        /// The filter's key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A filter of another shape already exists under the key.
    #[error("shared filter {key} exists with another shape")]
    ShapeMismatch {
        /// The filter's key.
        key: String,
    },
    /// A TLS file (CA, client certificate or key) could not be read.
    #[cfg(feature = "tls")]
    #[error("cannot read {}: {source}", path.display())]
    TlsFile {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The key or segment size cannot be used.
    #[error("shared filter {key}: {reason}")]
    Invalid {
        /// The filter's key.
        key: String,
        /// What is wrong.
        reason: String,
    },
}

/// Shorthand for results in this crate.
///
/// ```
/// use bloomgate_redis::{RedisBloom, Result};
/// async fn seen(f: &RedisBloom, id: u64) -> Result<bool> {
///     f.contains(&id).await
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let url = std::env::var("BLOOMGATE_TEST_REDIS_URL")
/// #     .unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
/// let client = redis::Client::open(url)?;
/// let conn = match redis::aio::ConnectionManager::new(client).await {
///     Ok(c) => c,
/// #   // Without a Redis to talk to, the example has nothing to show
/// #   // (under CI=true it fails instead).
/// #   Err(_) if std::env::var("CI").as_deref() != Ok("true") => return Ok(()),
///     Err(e) => return Err(e.into()),
/// };
/// let key = "bgdoc:result";
/// # let _: () = redis::cmd("DEL").arg(key).arg(format!("{key}:meta")).query_async(&mut conn.clone()).await?;
/// let f = RedisBloom::create(conn, key, 1000, 0.01, 1).await?;
/// f.insert(&5u64).await?;
/// assert!(seen(&f, 5).await?);
/// f.destroy().await?;
/// # Ok(())
/// # }
/// ```
pub type Result<T, E = Error> = std::result::Result<T, E>;
