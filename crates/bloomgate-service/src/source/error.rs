//! `StoreError`: a source's failure with the operation that failed, and
//! what kind of failure it was, in terms the layers above act on. The SQL
//! source classifies its driver's errors as it makes them (`sql::err`); a
//! source of a user's reports [`Failure::Other`] unless it says otherwise.

/// What kind of failure a [`StoreError`] is, as the layers above act on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Failure {
    /// The database took no connection (as opposed to a statement that
    /// failed or timed out once connected).
    Unreachable,
    /// The database refused a right this connection lacks.
    PermissionDenied,
    /// Anything else.
    #[default]
    Other,
}

/// A source's failure, with the operation that failed.
#[derive(Debug, thiserror::Error)]
#[error("database error during {op}: {source}")]
pub struct StoreError {
    /// What the store was doing.
    pub op: &'static str,
    /// The driver's error (a `sqlx::Error` for the SQL store; whatever a
    /// [`crate::source::Source`] of a user's reports for theirs).
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
    /// What kind of failure it is.
    pub failure: Failure,
}

impl StoreError {
    /// An error of `op`, caused by `source` ([`Failure::Other`]).
    pub fn new(
        op: &'static str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self::of(op, Failure::Other, source)
    }

    /// An error of `op` of the kind `failure`, caused by `source`.
    pub fn of(
        op: &'static str,
        failure: Failure,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self {
            op,
            source: source.into(),
            failure,
        }
    }

    /// The database took no connection (as opposed to a statement that
    /// failed or timed out once connected).
    #[must_use]
    pub fn is_unreachable(&self) -> bool {
        self.failure == Failure::Unreachable
    }

    /// The database refused a right this connection lacks.
    #[must_use]
    pub fn is_permission_denied(&self) -> bool {
        self.failure == Failure::PermissionDenied
    }
}
