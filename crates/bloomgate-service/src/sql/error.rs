//! The SQL store's errors as [`StoreError`]s: each driver error is
//! classified as it is made ([`err`]), so the layers above act on its
//! [`Failure`] without naming the driver; [`driver_error`] gives the
//! driver's error back inside `sql`.

use super::is_permission_denied;
use crate::source::{Failure, StoreError};

/// What kind of failure `e` is.
fn failure_of(e: &sqlx::Error) -> Failure {
    match e {
        sqlx::Error::PoolTimedOut => Failure::Unreachable,
        sqlx::Error::Io(io)
            if matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotConnected
            ) =>
        {
            Failure::Unreachable
        }
        e if is_permission_denied(e) => Failure::PermissionDenied,
        _ => Failure::Other,
    }
}

/// The error of `op` that a driver error makes.
pub(crate) fn err(op: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |source| StoreError::of(op, failure_of(&source), source)
}

/// The driver's error, when the SQL store raised it.
pub(crate) fn driver_error(e: &StoreError) -> Option<&sqlx::Error> {
    e.source.downcast_ref()
}
