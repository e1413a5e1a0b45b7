//! The SQL store's errors as [`StoreError`]s: each driver error is
//! classified as it is made ([`err`]), so the layers above act on its
//! [`Failure`] without naming the driver; [`driver_error`] gives the
//! driver's error back inside `sql`, and the classifiers read each
//! dialect's codes (a missing right, table or unique key).

use crate::source::{Failure, StoreError};

/// Whether the database refused a statement for a missing right
/// (PostgreSQL's `42501`, MySQL's "… command denied", SQLite's read-only
/// file).
pub fn is_permission_denied(e: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = e else {
        return false;
    };
    let text = db.message().to_ascii_lowercase();
    db.code().as_deref() == Some("42501") || text.contains("denied") || text.contains("readonly")
}

/// Whether a statement failed for a table that is not there
/// (PostgreSQL's `42P01`, MySQL's `42S02`, SQLite's "no such table").
pub(crate) fn is_undefined_table(e: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = e else {
        return false;
    };
    matches!(db.code().as_deref(), Some("42P01" | "42S02"))
        || db.message().contains("no such table")
}

/// Whether a statement broke a unique key.
pub(crate) fn is_unique_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.is_unique_violation())
}

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
