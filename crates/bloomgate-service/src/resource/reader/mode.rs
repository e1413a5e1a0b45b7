//! How a reader's filter answers: alone, confirmed by the shared filter,
//! or the shared filter alone.

use super::{Rows, ShieldedReader};
use crate::share::redis_filter::SharedFilter;

/// How a reader's filter answers (`cache.bloom_mode`, a resource's
/// `bloom_mode`).
#[derive(Debug, Clone)]
pub enum Mode {
    /// The in-process filter alone.
    Local,
    /// The in-process filter; its "no" confirmed by the shared filter.
    Strict(SharedFilter),
    /// The shared filter answers every check.
    Redis(SharedFilter),
}

impl Mode {
    /// The shared filter, in `strict` and `redis` modes.
    #[must_use]
    pub fn shared(&self) -> Option<&SharedFilter> {
        match self {
            Self::Local => None,
            Self::Strict(s) | Self::Redis(s) => Some(s),
        }
    }

    /// `redis` mode: the shared filter answers alone.
    #[must_use]
    pub fn shared_only(&self) -> bool {
        matches!(self, Self::Redis(_))
    }
}

impl<R: Rows> ShieldedReader<R> {
    /// Answers in `mode` from now on (set while assembling).
    pub fn set_mode(&mut self, mode: Mode) {
        self.mode = mode;
    }

    /// How the filter answers.
    #[must_use]
    pub fn mode(&self) -> &Mode {
        &self.mode
    }

    /// The shared filter, in `strict` and `redis` modes.
    #[must_use]
    pub fn shared(&self) -> Option<&SharedFilter> {
        self.mode.shared()
    }
}
