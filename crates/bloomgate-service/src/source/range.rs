//! The pieces of a key scan: the part of the key space one reader reads
//! ([`KeyRange`]) and what one page of it delivered ([`Page`]).

use crate::key::Key;

/// A part of the key space a rebuild reads on its own, in the source's
/// own key order: ascending, the keys above `after` and at most `upto`;
/// descending, the keys below `after` and at least `upto` (no bound where
/// `None`; the default range is every key, ascending).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyRange {
    /// Where the range starts (exclusive).
    pub after: Option<Key>,
    /// Where it ends (inclusive).
    pub upto: Option<Key>,
    /// Read from the largest key down.
    pub descending: bool,
}

impl KeyRange {
    /// Every key twice over, ascending and descending: two readers that
    /// meet in the middle, each bounding its pages by how far the other
    /// has got (the database compares, in its own collation), so together
    /// they read each key about once with no quantile known beforehand.
    #[must_use]
    pub fn meeting() -> Vec<Self> {
        vec![
            Self::default(),
            Self {
                descending: true,
                ..Self::default()
            },
        ]
    }

    /// Contiguous ranges cut at `bounds` (ascending, distinct): the first
    /// open below, the last open above; one range for no bounds.
    #[must_use]
    pub fn cut_at(bounds: Vec<Key>) -> Vec<Self> {
        let mut ranges = Vec::with_capacity(bounds.len() + 1);
        let mut after = None;
        for b in bounds {
            ranges.push(Self {
                after: after.clone(),
                upto: Some(b.clone()),
                descending: false,
            });
            after = Some(b);
        }
        ranges.push(Self {
            after,
            upto: None,
            descending: false,
        });
        ranges
    }
}

/// What one page delivered.
#[derive(Debug, Clone, Default)]
pub struct Page {
    /// Keys passed to the sink.
    pub keys: usize,
    /// The last of them (the next page starts after it).
    pub last: Option<Key>,
}
