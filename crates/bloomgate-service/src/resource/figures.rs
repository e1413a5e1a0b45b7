//! A resource's figures for `/api/cache/stats` (`resources.<name>`) and
//! `/metrics`: its funnel's, its calls', its shared rebuilds' and its SQL
//! table's, typed, so the metrics read fields rather than JSON paths.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use super::{CallCounters, EpochCounters, Guarded, Resource};
use crate::resource::reader::FunnelFigures;
use crate::shield::ShieldStats;

/// Everything under `resources.<name>`.
#[derive(Debug, Clone, Serialize)]
pub struct ResourceFigures {
    /// Its filter, L1, audit, Redis and shared filter.
    #[serde(flatten)]
    pub funnel: FunnelFigures,
    /// Keys its calls named.
    pub calls: CallFigures,
    /// Its shared rebuilds.
    pub epochs: EpochFigures,
    /// Its SQL statements (a configured table, and the SKU table).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sql: Option<SqlLoads>,
}

/// Keys the key API's calls and the watch named.
#[derive(Debug, Clone, Serialize)]
pub struct CallFigures {
    /// Keys added through `keys`.
    pub keys_added: u64,
    /// Keys dropped through `invalidate`.
    pub invalidated: u64,
    /// Keys answered by `exists`.
    pub exists_checked: u64,
    /// Keys asked for in `batch`.
    pub batch_keys: u64,
    /// Keys the watch found new to this instance's filter.
    pub watched: u64,
}

/// Shared rebuilds.
#[derive(Debug, Clone, Serialize)]
pub struct EpochFigures {
    /// Epochs this instance built and stored.
    pub published: u64,
    /// Epochs this instance adopted instead of scanning.
    pub adopted: u64,
    /// Announced epochs it could not adopt.
    pub adopt_failures: u64,
    /// The newest epoch its filter came from or went to.
    pub held: u64,
}

/// A resource's SQL statements and row loads.
#[derive(Debug, Clone, Serialize)]
pub struct SqlLoads {
    /// Statements sent.
    pub statements: u64,
    /// Point loads.
    pub loads: u64,
    /// Point loads that found a row.
    pub found: u64,
    /// Batch loads (a configured table's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_loads: Option<u64>,
    /// Point loads that found none (the SKU table's; a table's are
    /// `loads - found`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub missing: Option<u64>,
}

impl SqlLoads {
    /// Point loads that found no row.
    #[must_use]
    pub fn missing(&self) -> u64 {
        self.missing
            .unwrap_or_else(|| self.loads.saturating_sub(self.found))
    }
}

fn get(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

impl CallCounters {
    /// The figures under `calls`.
    #[must_use]
    pub fn figures(&self) -> CallFigures {
        CallFigures {
            keys_added: get(&self.keys_added),
            invalidated: get(&self.invalidated),
            exists_checked: get(&self.exists_checked),
            batch_keys: get(&self.batch_keys),
            watched: get(&self.watched),
        }
    }
}

impl EpochCounters {
    /// The figures under `epochs`.
    #[must_use]
    pub fn figures(&self) -> EpochFigures {
        EpochFigures {
            published: get(&self.published),
            adopted: get(&self.adopted),
            adopt_failures: get(&self.adopt_failures),
            held: get(&self.held),
        }
    }
}

impl<R: Guarded> Resource<R> {
    /// Figures for `/api/cache/stats` under `resources.<name>`.
    #[must_use]
    pub fn stats(&self) -> ResourceFigures {
        self.stats_with(self.reader.shield.stats())
    }

    /// [`Resource::stats`] with its filter's figures read already (the
    /// default resource's are seed 000's flat `bloom` line too: one
    /// reading for both).
    #[must_use]
    pub fn stats_with(&self, filter: ShieldStats) -> ResourceFigures {
        ResourceFigures {
            funnel: self.reader.figures(self.key_type(), filter),
            calls: self.counters.figures(),
            epochs: self.epochs.figures(),
            sql: self.table.as_ref().map(|t| {
                let c = &t.counters;
                SqlLoads {
                    statements: get(&c.statements),
                    loads: get(&c.loads),
                    found: get(&c.found),
                    batch_loads: Some(get(&c.batch_loads)),
                    missing: None,
                }
            }),
        }
    }
}
