//! [`Conn`]: one Redis server's connection or a Redis Cluster's, behind one
//! `ConnectionLike`.

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

/// A connection to one Redis server or to a Redis Cluster.
///
/// ```
/// use bloomgate_redis::Conn;
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
/// // A single server's connection; a cluster's `ClusterConnection` converts too.
/// let shared: Conn = conn.into();
/// assert!(matches!(shared, Conn::Single(_)));
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub enum Conn {
    /// One server (reconnecting).
    Single(ConnectionManager),
    /// A cluster: commands are routed by their key's hash slot.
    Cluster(ClusterConnection),
}

impl From<ConnectionManager> for Conn {
    fn from(c: ConnectionManager) -> Self {
        Self::Single(c)
    }
}

impl From<ClusterConnection> for Conn {
    fn from(c: ClusterConnection) -> Self {
        Self::Cluster(c)
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(c) => c.req_packed_commands(cmd, offset, count),
            Self::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}
