//! `StoreError`: a database failure with the operation that failed, and
//! what kind of failure it was, in terms the layers above act on.

use super::is_permission_denied;

/// A database failure, with the operation that failed.
#[derive(Debug, thiserror::Error)]
#[error("database error during {op}: {source}")]
pub struct StoreError {
    /// What the store was doing.
    pub op: &'static str,
    /// The driver's error (a `sqlx::Error` for the SQL store; whatever a
    /// [`crate::source::Source`] of a user's reports for theirs).
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

impl StoreError {
    /// An error of `op`, caused by `source`.
    pub fn new(
        op: &'static str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self {
            op,
            source: source.into(),
        }
    }

    /// The driver's error, when the SQL store raised it.
    #[must_use]
    pub fn sqlx(&self) -> Option<&sqlx::Error> {
        self.source.downcast_ref()
    }

    /// The database took no connection (as opposed to a statement that
    /// failed or timed out once connected).
    #[must_use]
    pub fn is_unreachable(&self) -> bool {
        match self.sqlx() {
            Some(sqlx::Error::PoolTimedOut) => true,
            Some(sqlx::Error::Io(io)) => matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotConnected
            ),
            _ => false,
        }
    }

    /// The database refused a right this connection lacks.
    #[must_use]
    pub fn is_permission_denied(&self) -> bool {
        self.sqlx().is_some_and(is_permission_denied)
    }
}

pub(crate) fn err(op: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |source| StoreError::new(op, source)
}
