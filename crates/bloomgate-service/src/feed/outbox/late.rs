//! The late set: sequence numbers given up as gaps, kept as ranges (a
//! long transaction's rows, a jump past `MAX_GAPS`, the numbers missing
//! before a start position are runs), each with when it was given up.
//! Numbers of the same run cost one range, so a 100,000-row transaction
//! costs one entry, not 100,000; at most [`MAX_LATE`] ranges are kept.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::{Entry, Outbox, MAX_LATE};
use crate::store::StoreError;

/// Inclusive ranges of given-up numbers, by first number.
#[derive(Debug, Default)]
pub(super) struct Late {
    ranges: BTreeMap<i64, (i64, Instant)>,
}

impl Late {
    pub(super) fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Adds `from..=to` (given up at `at`), merged with a range that ends
    /// just before or starts just after it. Returns how many numbers were
    /// dropped to stay within [`MAX_LATE`] ranges (the oldest numbers).
    pub(super) fn add(&mut self, mut from: i64, mut to: i64, mut at: Instant) -> u64 {
        if from > to {
            return 0;
        }
        if let Some((&start, &(end, when))) = self.ranges.range(..from).next_back() {
            if end + 1 >= from {
                self.ranges.remove(&start);
                (from, to, at) = (start, to.max(end), at.max(when));
            }
        }
        while let Some((&start, &(end, when))) = self.ranges.range(from..).next() {
            if start > to + 1 {
                break;
            }
            self.ranges.remove(&start);
            (to, at) = (to.max(end), at.max(when));
        }
        self.ranges.insert(from, (to, at));
        let mut dropped = 0;
        while self.ranges.len() > MAX_LATE {
            if let Some((start, (end, _))) = self.ranges.pop_first() {
                dropped += (end - start + 1) as u64;
            }
        }
        dropped
    }

    /// Removes `seq` (its entry was found), splitting its range.
    pub(super) fn remove(&mut self, seq: i64) {
        let Some((&start, &(end, when))) = self.ranges.range(..=seq).next_back() else {
            return;
        };
        if seq > end {
            return;
        }
        self.ranges.remove(&start);
        if start < seq {
            self.ranges.insert(start, (seq - 1, when));
        }
        if seq < end {
            self.ranges.insert(seq + 1, (end, when));
        }
    }

    /// Forgets ranges given up longer than `keep` ago.
    pub(super) fn expire(&mut self, keep: Duration) {
        self.ranges.retain(|_, (_, when)| when.elapsed() < keep);
    }

    /// The ranges, in order.
    pub(super) fn ranges(&self) -> Vec<(i64, i64)> {
        self.ranges.iter().map(|(&a, &(b, _))| (a, b)).collect()
    }
}

impl Outbox {
    /// The entries visible now within the inclusive `ranges`, a few
    /// hundred ranges per statement.
    pub(super) async fn within_ranges(
        &self,
        ranges: &[(i64, i64)],
    ) -> Result<Vec<Entry>, StoreError> {
        let mut out = Vec::new();
        for chunk in ranges.chunks(250) {
            let cond: Vec<String> = (0..chunk.len())
                .map(|i| {
                    format!(
                        "seq BETWEEN {} AND {}",
                        self.store.ph(2 * i + 1),
                        self.store.ph(2 * i + 2)
                    )
                })
                .collect();
            let q = format!(
                "SELECT seq, item_key, kind, origin, resource FROM bloomgate_changes WHERE {}",
                cond.join(" OR ")
            );
            let binds: Vec<i64> = chunk.iter().flat_map(|&(a, b)| [a, b]).collect();
            out.extend(self.fetch(&q, &binds).await?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_merge_split_and_stay_bounded() {
        let now = Instant::now();
        let mut late = Late::default();
        assert_eq!(late.add(5, 5, now), 0);
        late.add(6, 9, now);
        late.add(3, 4, now);
        late.add(20, 25, now);
        assert_eq!(late.ranges(), [(3, 9), (20, 25)]);
        late.remove(3);
        late.remove(7);
        late.remove(25);
        late.remove(12);
        assert_eq!(late.ranges(), [(4, 6), (8, 9), (20, 24)]);
        late.add(10, 19, now);
        assert_eq!(late.ranges(), [(4, 6), (8, 24)]);
        late.add(100_000, 199_999, now);
        assert_eq!(late.ranges().len(), 3, "a jump is one range");
        let mut many = Late::default();
        let mut dropped = 0;
        for i in 0..=MAX_LATE as i64 {
            dropped += many.add(i * 10, i * 10 + 1, now);
        }
        assert_eq!(dropped, 2, "the oldest range went");
        assert_eq!(many.ranges()[0], (10, 11));
        many.expire(Duration::ZERO);
        assert!(many.is_empty());
    }
}
