//! The Redis-protocol listener (`[resp]`): RedisBloom's `BF.*` commands,
//! answered from the resources' filters, for any Redis client.
//!
//! A Redis key name is a resource name (`BF.EXISTS users u1001`), or a
//! name `[resp.keys]` maps to one (`"bf:users" = "users"`). Reads ask a
//! resource exactly what the HTTP key API's `exists` asks (its filter,
//! vouched for: "maybe" while it is not built or not in step; strict and
//! redis modes included); `BF.ADD`, `BF.MADD` and `BF.INSERT` are its
//! `keys` call, which reaches every instance. A key that cannot be in the
//! column, and a name that is no resource, answer 0, as RedisBloom does
//! for a missing filter.
//!
//! [`frame`] reads commands (limits checked before anything is kept),
//! [`reply`] writes RESP2 or RESP3, [`commands`] answers the `BF.*` ones
//! and [`connection`] the rest, and
//! [`serve`] runs the listener: one task per connection (none per
//! command), replies in order, pipelines answered in batches.

use std::collections::HashMap;
use std::sync::Arc;

use crate::resource::Resource;
use crate::sql::Database;
use crate::state::AppState;

pub mod commands;
pub mod connection;
pub mod frame;
pub mod reply;
pub mod serve;

/// A resource as the listener sees it.
#[derive(Debug, Clone)]
pub enum Filter {
    /// The demo SKU table (`skus`): positive 64-bit integer keys.
    Skus(Arc<Resource<Database>>),
    /// A configured table or source.
    Table(Arc<Resource>),
}

/// One resource the listener answers for, with its metrics slot.
#[derive(Debug, Clone)]
pub struct Target {
    /// Its index among the listener's resources (the metrics' slot).
    pub slot: usize,
    /// The resource.
    pub filter: Filter,
}

impl Target {
    /// The resource's name.
    #[must_use]
    pub fn name(&self) -> &str {
        match &self.filter {
            Filter::Skus(r) => &r.name,
            Filter::Table(r) => &r.name,
        }
    }
}

/// Everything a connection needs: the names it answers for, the token,
/// the metrics.
#[derive(Debug)]
pub struct Registry {
    by_name: HashMap<Box<[u8]>, Target>,
    /// The resources, in slot order.
    pub targets: Vec<Target>,
    /// The admin token (writes need `AUTH` with it).
    pub token: Option<Arc<str>>,
    /// The instance's metrics.
    pub metrics: Arc<crate::metrics::ServiceMetrics>,
    /// When the listener started (`INFO`'s uptime).
    pub started: std::time::Instant,
    /// The port it listens on (`INFO`).
    pub port: u16,
    /// The per-client rate limit on reads (`http.rate_limit_per_sec`,
    /// counted apart from HTTP's).
    pub rate: Option<Arc<crate::listen::RateLimit>>,
}

impl Registry {
    /// The resources `state` serves (the SKU table when the demo is on),
    /// under their names and the `keys` map's.
    #[must_use]
    pub fn of(state: &AppState, keys: &std::collections::BTreeMap<String, String>) -> Self {
        let mut targets = Vec::new();
        if state.demo {
            targets.push(Target {
                slot: 0,
                filter: Filter::Skus(Arc::clone(&state.skus)),
            });
        }
        for r in &state.resources {
            targets.push(Target {
                slot: targets.len(),
                filter: Filter::Table(Arc::clone(r)),
            });
        }
        let mut by_name: HashMap<Box<[u8]>, Target> = targets
            .iter()
            .map(|t| (Box::from(t.name().as_bytes()), t.clone()))
            .collect();
        for (alias, name) in keys {
            // A resource's own name is never remapped (the config refuses
            // it; an embedder's resource added later could collide).
            if let Some(t) = targets.iter().find(|t| t.name() == name) {
                by_name
                    .entry(Box::from(alias.as_bytes()))
                    .or_insert_with(|| t.clone());
            }
        }
        let names: Vec<String> = targets.iter().map(|t| t.name().to_owned()).collect();
        state.metrics.resp.init(&names);
        Self {
            by_name,
            targets,
            token: state.admin_token.clone(),
            metrics: Arc::clone(&state.metrics),
            started: std::time::Instant::now(),
            port: 0,
            rate: crate::listen::rate::rate_limit(&state.http),
        }
    }

    /// The resource a Redis key names.
    #[must_use]
    pub fn target(&self, key: &[u8]) -> Option<&Target> {
        self.by_name.get(key)
    }
}
