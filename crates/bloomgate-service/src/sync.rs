//! The one lock helper: every mutex in the service guards state that each
//! step leaves consistent (counters, maps, queues, an optional string), so
//! a panic elsewhere that poisoned it leaves it usable, and a request or
//! background task never panics on a poisoned lock.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, taking the guard of a poisoned lock too.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
