//! The read path's SQL bulkhead.

use std::sync::Arc;
use std::time::Duration;

use crate::metrics::Counter;

/// The bulkhead: at most `permits` read-path loads query SQL at once; a
/// load waits at most `queue_timeout` for a slot, then gives up with
/// [`super::LoadError::Overloaded`] (a 503 with `Retry-After`). Answers from L1
/// or Redis never wait for it.
#[derive(Debug, Clone)]
pub struct Bulkhead {
    slots: Arc<tokio::sync::Semaphore>,
    permits: usize,
    queue_timeout: Duration,
    /// Loads turned away.
    pub rejected: Arc<Counter>,
}

impl Bulkhead {
    /// A bulkhead of `permits` slots.
    #[must_use]
    pub fn new(permits: usize, queue_timeout: Duration) -> Self {
        Self {
            slots: Arc::new(tokio::sync::Semaphore::new(permits)),
            permits,
            queue_timeout,
            rejected: Arc::default(),
        }
    }

    /// Waits at most the queue timeout for a slot; `None` (counted as
    /// rejected) when none came free.
    pub async fn slot(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        match tokio::time::timeout(self.queue_timeout, self.slots.acquire()).await {
            Ok(Ok(permit)) => Some(permit),
            _ => {
                self.rejected.incr();
                None
            }
        }
    }

    /// Slots in use now.
    #[must_use]
    pub fn in_use(&self) -> usize {
        self.permits.saturating_sub(self.slots.available_permits())
    }
}
