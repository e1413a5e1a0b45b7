//! How the service reaches Redis: one server (`redis_url`) or a Redis
//! Cluster (`redis_cluster`, a list of seed nodes). Every Redis use (the
//! value tier and its leases, the doorbell stream, the shared
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

/// Where Redis is, and how to check its certificate when it speaks TLS.
/// Its `Debug` hides the URLs' passwords.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisTarget {
    /// One server or a cluster's nodes.
    pub nodes: RedisNodes,
    /// CA and client certificate files for `rediss://` (`redis_tls_*`).
    pub tls: TlsFiles,
}

/// One server or a cluster. Its `Debug` hides the URLs' passwords.
#[derive(Clone, PartialEq, Eq)]
pub enum RedisNodes {
    /// One server (`redis://host:port/db`, or `rediss://` for TLS).
    Server(String),
    /// A Redis Cluster, by some of its nodes (`redis://host:port` each).
    Cluster(Vec<String>),
}

pub use bloomgate_redis::tls::TlsFiles;

impl std::fmt::Debug for RedisNodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::text::redact_url;
        match self {
            Self::Server(url) => f.debug_tuple("Server").field(&redact_url(url)).finish(),
            Self::Cluster(nodes) => f
                .debug_tuple("Cluster")
                .field(&nodes.iter().map(|n| redact_url(n)).collect::<Vec<_>>())
                .finish(),
        }
    }
}

impl std::fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTarget")
            .field("nodes", &self.nodes)
            .field("tls", &self.tls)
            .finish()
    }
}

impl RedisTarget {
    /// Where `config` says Redis is, if anywhere: `redis_cluster` when it
    /// names nodes, else `redis_url`.
    #[must_use]
    pub fn of(config: &crate::config::Config) -> Option<Self> {
        let nodes = if config.redis_cluster.is_empty() {
            RedisNodes::Server(config.redis_url.clone()?)
        } else {
            RedisNodes::Cluster(config.redis_cluster.clone())
        };
        Some(Self {
            nodes,
            tls: TlsFiles {
                ca: config.redis_tls_ca.clone(),
                cert: config.redis_tls_cert.clone(),
                key: config.redis_tls_key.clone(),
            },
        })
    }

    /// One server, without TLS files.
    #[must_use]
    pub fn server(url: impl Into<String>) -> Self {
        Self {
            nodes: RedisNodes::Server(url.into()),
            tls: TlsFiles::default(),
        }
    }

    /// A cluster by its seed nodes, without TLS files.
    #[must_use]
    pub fn cluster(nodes: Vec<String>) -> Self {
        Self {
            nodes: RedisNodes::Cluster(nodes),
            tls: TlsFiles::default(),
        }
    }

    /// The configuration key that names this target, for errors.
    #[must_use]
    pub const fn key(&self) -> &'static str {
        match self.nodes {
            RedisNodes::Server(_) => "redis_url",
            RedisNodes::Cluster(_) => "redis_cluster",
        }
    }

    /// A connection that reconnects by itself: a single server's
    /// `ConnectionManager`, or a cluster connection that follows slot
    /// moves and reconnects to nodes. `response` bounds each command.
    ///
    /// # Errors
    /// A bad URL, an unreadable TLS file, or no node reachable.
    pub async fn connect(&self, connect: Duration, response: Duration) -> RedisResult<Conn> {
        self.connect_with(connect, Some(response)).await
    }

    /// [`RedisTarget::connect`] for a caller that bounds every command
    /// itself (the cache tier's guard): no second timer per command on a
    /// single server. A cluster connection keeps `connect` as its
    /// response timeout: it sends commands of its own (slot refreshes,
    /// node checks) that no caller's timeout bounds.
    ///
    /// # Errors
    /// A bad URL, an unreadable TLS file, or no node reachable.
    pub async fn connect_guarded(&self, connect: Duration) -> RedisResult<Conn> {
        self.connect_with(connect, None).await
    }

    async fn connect_with(
        &self,
        connect: Duration,
        response: Option<Duration>,
    ) -> RedisResult<Conn> {
        match &self.nodes {
            RedisNodes::Server(url) => {
                let client = self.tls.client(url).map_err(tls_error)?;
                let mut config = redis::aio::ConnectionManagerConfig::new()
                    .set_connection_timeout(connect)
                    .set_number_of_retries(1);
                if let Some(response) = response {
                    config = config.set_response_timeout(response);
                }
                let conn = redis::aio::ConnectionManager::new_with_config(client, config).await?;
                Ok(Conn::Single(conn))
            }
            RedisNodes::Cluster(nodes) => {
                let builder = self
                    .tls
                    .cluster(nodes.clone())
                    .map_err(tls_error)?
                    .connection_timeout(connect)
                    .retries(1);
                let client = builder
                    .response_timeout(response.unwrap_or(connect))
                    .build()?;
                Ok(Conn::Cluster(client.get_async_connection().await?))
            }
        }
    }

    /// Connects once, as every later use will: what start-up does before
    /// anything else uses Redis, so that a wrong address, password or
    /// certificate stops the start with one clear error. (No command is
    /// sent: a `PING` would need every cluster primary up, and is refused
    /// while Redis loads its data or by an ACL without it, none of which
    /// stopped a start before.)
    ///
    /// # Errors
    /// As [`RedisTarget::connect`].
    pub async fn check(&self, timeout: Duration) -> RedisResult<()> {
        self.connect(timeout, timeout).await.map(drop)
    }
}

fn tls_error(e: bloomgate_redis::Error) -> redis::RedisError {
    match e {
        bloomgate_redis::Error::Redis(e) => e,
        other => redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "TLS files",
            other.to_string(),
        )),
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
