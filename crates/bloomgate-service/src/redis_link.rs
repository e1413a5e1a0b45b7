//! How the service reaches Redis: one server (`redis_url`) or a Redis
//! Cluster (`redis_cluster`, a list of seed nodes). Every Redis use (the
//! value tier and its leases, the change log and its doorbell, the shared
//! filter, the shared-rebuild epochs) connects through [`RedisTarget`] and
//! talks over a [`Conn`], which routes each command by its key's hash slot
//! on a cluster.
//!
//! No command the service sends names two keys that must share a slot:
//! every Lua script takes one key, and batches of commands on many keys
//! ([`query_each`]) are one pipeline on a single server but separate
//! commands on a cluster (a cluster pipeline must stay in one slot; the
//! cluster connection multiplexes them, so they still share round trips
//! per node). So no key carries a hash tag, and a cluster spreads the
//! SKU values, the filter's segments and an epoch's segments over every
//! node.

use std::time::Duration;

use bloomgate_redis::Conn;
use futures_util::future::try_join_all;
use redis::{Cmd, FromRedisValue, RedisResult};

/// Where Redis is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One server (`redis://host:port/db`).
    Server(String),
    /// A Redis Cluster, by some of its nodes (`redis://host:port` each).
    Cluster(Vec<String>),
}

impl RedisTarget {
    /// A connection that reconnects by itself: a single server's
    /// `ConnectionManager`, or a cluster connection that follows slot
    /// moves and reconnects to nodes. `response` bounds each command.
    ///
    /// # Errors
    /// A bad URL, or no node reachable.
    pub async fn connect(&self, connect: Duration, response: Duration) -> RedisResult<Conn> {
        match self {
            Self::Server(url) => {
                let client = redis::Client::open(url.as_str())?;
                let config = redis::aio::ConnectionManagerConfig::new()
                    .set_connection_timeout(connect)
                    .set_response_timeout(response)
                    .set_number_of_retries(1);
                let conn = redis::aio::ConnectionManager::new_with_config(client, config).await?;
                Ok(Conn::Single(conn))
            }
            Self::Cluster(nodes) => {
                let client = redis::cluster::ClusterClientBuilder::new(nodes.clone())
                    .connection_timeout(connect)
                    .response_timeout(response)
                    .retries(1)
                    .build()?;
                Ok(Conn::Cluster(client.get_async_connection().await?))
            }
        }
    }
}

/// Runs commands that each name one key, replies in order: one pipeline
/// on a single server, concurrent commands on a cluster (each routed to
/// its key's node).
///
/// # Errors
/// The first command's error.
pub async fn query_each<T: FromRedisValue>(conn: &Conn, cmds: Vec<Cmd>) -> RedisResult<Vec<T>> {
    match conn {
        Conn::Single(c) => {
            let mut pipe = redis::pipe();
            for cmd in cmds {
                pipe.add_command(cmd);
            }
            pipe.query_async(&mut c.clone()).await
        }
        Conn::Cluster(c) => {
            try_join_all(cmds.into_iter().map(|cmd| {
                let mut c = c.clone();
                async move { cmd.query_async::<T>(&mut c).await }
            }))
            .await
        }
    }
}
