//! The late set itself (see [`super`]): exact runs of given-up numbers,
//! and the spans past the limit with their counts. No I/O.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::feed::outbox::MAX_LATE;

/// Spans watched at most; more are merged.
pub(in crate::feed::outbox) const MAX_SPANS: usize = 16;

/// How often the spans are counted.
pub(in crate::feed::outbox) const SPAN_EVERY: Duration = Duration::from_secs(60);

/// The open gaps: numbers not seen yet, not given up either.
pub(in crate::feed::outbox) type Open = BTreeMap<i64, Instant>;

/// Numbers given up and not found yet: exact runs, then spans.
#[derive(Debug)]
pub(in crate::feed::outbox) struct Late {
    /// Inclusive runs, by first number.
    ranges: BTreeMap<i64, i64>,
    /// Runs kept exactly at most.
    pub(in crate::feed::outbox) limit: usize,
    /// Spans past the limit, by first number.
    spans: BTreeMap<i64, Span>,
    /// How often the spans are counted (a test shortens it).
    pub(in crate::feed::outbox) span_every: Duration,
    /// When they were last counted.
    spans_counted: Option<Instant>,
    /// No span grows over numbers at or below this one: the follower
    /// jumped past numbers it never read (see [`Late::seal`]).
    sealed_through: i64,
    /// A span's count grew and the rebuild entries are not recorded yet
    /// (kept until they are: the count that showed the growth is already
    /// the span's).
    pub(in crate::feed::outbox) growth_owed: bool,
}

/// Given-up numbers watched by their count (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::feed::outbox) struct Span {
    /// The last number.
    pub hi: i64,
    /// Entries in `lo..=hi` when last counted; `None`: to be counted
    /// afresh (the outbox trimmed into it).
    pub seen: Option<i64>,
}

impl Default for Late {
    fn default() -> Self {
        Self {
            ranges: BTreeMap::new(),
            limit: MAX_LATE,
            spans: BTreeMap::new(),
            span_every: SPAN_EVERY,
            spans_counted: None,
            sealed_through: i64::MIN,
            growth_owed: false,
        }
    }
}

impl Late {
    /// With at most `limit` exact runs (a test lowers it).
    pub(in crate::feed::outbox) fn with_limit(limit: usize) -> Self {
        Self {
            limit: limit.max(1),
            ..Self::default()
        }
    }

    /// No numbers, the same limits.
    pub(in crate::feed::outbox) fn emptied(&self) -> Self {
        Self {
            span_every: self.span_every,
            growth_owed: self.growth_owed,
            ..Self::with_limit(self.limit)
        }
    }

    /// Whether the spans are due to be counted (and, if so, counted now).
    pub(in crate::feed::outbox) fn spans_due(&mut self) -> bool {
        if self.spans.is_empty()
            || self
                .spans_counted
                .is_some_and(|t| t.elapsed() < self.span_every)
        {
            return false;
        }
        self.spans_counted = Some(Instant::now());
        true
    }

    pub(in crate::feed::outbox) fn is_empty(&self) -> bool {
        self.ranges.is_empty() && self.spans.is_empty()
    }

    /// Adds `from..=to`, merged with a run that ends just before or starts
    /// just after it. Returns how many numbers moved to spans to keep the
    /// exact runs within the limit (the oldest). `open`: the open gaps.
    pub(in crate::feed::outbox) fn add(&mut self, mut from: i64, mut to: i64, open: &Open) -> u64 {
        if from > to {
            return 0;
        }
        if let Some((&start, &end)) = self.ranges.range(..from).next_back() {
            if end + 1 >= from {
                self.ranges.remove(&start);
                (from, to) = (start, to.max(end));
            }
        }
        while let Some((&start, &end)) = self.ranges.range(from..).next() {
            if start > to + 1 {
                break;
            }
            self.ranges.remove(&start);
            to = to.max(end);
        }
        self.ranges.insert(from, to);
        let mut moved = 0;
        while self.ranges.len() > self.limit {
            if let Some((start, end)) = self.ranges.pop_first() {
                moved += (end - start + 1) as u64;
                self.add_span(start, end, open);
            }
        }
        moved
    }

    /// A run of given-up numbers joins the spans: it extends the span
    /// below it when every number between them was seen (none is an open
    /// gap or in a run), the count grown by those; otherwise it starts a
    /// span of its own with a count of 0.
    fn add_span(&mut self, lo: i64, hi: i64, open: &Open) {
        // A span starting at `lo` itself counts as below: the run is
        // inside it.
        let below = self.spans.range(..=lo).next_back().map(|(&s, &sp)| (s, sp));
        if let Some((start, span)) = below.filter(|(_, sp)| lo <= sp.hi) {
            // Inside a span (merged over the run): its count already covers
            // the run's numbers; one past its end extends it by unseen
            // numbers only.
            if hi > span.hi {
                self.spans.insert(
                    start,
                    Span {
                        hi,
                        seen: span.seen,
                    },
                );
            }
            return;
        }
        if let Some((start, span)) = below {
            let (a, b) = (span.hi + 1, lo - 1);
            let run_within = self
                .ranges
                .range(..=b)
                .next_back()
                .is_some_and(|(_, &e)| e >= a);
            let unread = a <= self.sealed_through;
            if a > b || (open.range(a..=b).next().is_none() && !run_within && !unread) {
                let seen = span.seen.map(|n| n + (lo - span.hi - 1));
                self.spans.insert(start, Span { hi, seen });
                return;
            }
        }
        self.spans.insert(lo, Span { hi, seen: Some(0) });
    }

    /// The follower jumped to `to` past numbers it never read (its
    /// position was trimmed): no span grows over them, since they were
    /// not all seen.
    pub(in crate::feed::outbox) fn seal(&mut self, to: i64) {
        self.sealed_through = self.sealed_through.max(to);
    }

    /// Removes `seq` (its entry was found), splitting its run.
    pub(in crate::feed::outbox) fn remove(&mut self, seq: i64) {
        let Some((&start, &end)) = self.ranges.range(..=seq).next_back() else {
            return;
        };
        if seq > end {
            return;
        }
        self.ranges.remove(&start);
        if start < seq {
            self.ranges.insert(start, seq - 1);
        }
        if seq < end {
            self.ranges.insert(seq + 1, end);
        }
    }

    /// Forgets the numbers at or below `trimmed` (the outbox holds nothing
    /// there any more); returns how many. A span cut short is counted
    /// afresh.
    pub(in crate::feed::outbox) fn forget_through(&mut self, trimmed: i64) -> u64 {
        let mut forgotten = 0;
        while let Some((&start, &end)) = self.ranges.first_key_value() {
            if start > trimmed {
                break;
            }
            self.ranges.remove(&start);
            forgotten += (end.min(trimmed) - start + 1) as u64;
            if end > trimmed {
                self.ranges.insert(trimmed + 1, end);
            }
        }
        while let Some((&lo, &span)) = self.spans.first_key_value() {
            if lo > trimmed {
                break;
            }
            self.spans.remove(&lo);
            forgotten += (span.hi.min(trimmed) - lo + 1) as u64;
            if span.hi > trimmed {
                self.spans.insert(
                    trimmed + 1,
                    Span {
                        hi: span.hi,
                        seen: None,
                    },
                );
                // Counted afresh at once: a late commit in what is left
                // between its last count and this one goes unseen (a
                // transaction open for about the outbox's retention).
                self.spans_counted = None;
            }
        }
        forgotten
    }

    /// The exact runs, in order.
    pub(in crate::feed::outbox) fn ranges(&self) -> Vec<(i64, i64)> {
        self.ranges.iter().map(|(&a, &b)| (a, b)).collect()
    }

    /// The spans, in order.
    pub(in crate::feed::outbox) fn spans(&self) -> Vec<(i64, Span)> {
        self.spans.iter().map(|(&lo, &s)| (lo, s)).collect()
    }

    /// The two neighbouring spans closest together, when there are more
    /// than [`MAX_SPANS`].
    pub(in crate::feed::outbox) fn merge_due(&self) -> Option<((i64, Span), (i64, Span))> {
        if self.spans.len() <= MAX_SPANS {
            return None;
        }
        let spans = self.spans();
        spans
            .windows(2)
            .min_by_key(|w| w[1].0 - w[0].1.hi)
            .map(|w| (w[0], w[1]))
    }

    /// Records `seen`, a count of span `lo` as it was read (`read`), if it
    /// is still that span; extended since, by what the extension added
    /// (seen numbers between it and the run that extended it).
    pub(in crate::feed::outbox) fn counted(&mut self, lo: i64, read: Span, seen: i64) {
        if let Some(span) = self.spans.get_mut(&lo) {
            if span.hi >= read.hi {
                let added = match (span.seen, read.seen) {
                    (Some(now), Some(then)) => now - then,
                    _ => 0,
                };
                span.seen = Some(seen + added);
            }
        }
    }

    /// Replaces spans `a` and `b` by one over both, `seen` entries in it,
    /// if both are still as they were read.
    pub(in crate::feed::outbox) fn merged(&mut self, a: (i64, Span), b: (i64, Span), seen: i64) {
        if self.spans.get(&a.0) != Some(&a.1) || self.spans.get(&b.0) != Some(&b.1) {
            return;
        }
        self.spans.remove(&b.0);
        self.spans.insert(
            a.0,
            Span {
                hi: b.1.hi,
                seen: Some(seen),
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_merge_split_and_stay_bounded() {
        let none = Open::new();
        let mut late = Late::default();
        assert_eq!(late.add(5, 5, &none), 0);
        late.add(6, 9, &none);
        late.add(3, 4, &none);
        late.add(20, 25, &none);
        assert_eq!(late.ranges(), [(3, 9), (20, 25)]);
        late.remove(3);
        late.remove(7);
        late.remove(25);
        late.remove(12);
        assert_eq!(late.ranges(), [(4, 6), (8, 9), (20, 24)]);
        late.add(10, 19, &none);
        assert_eq!(late.ranges(), [(4, 6), (8, 24)]);
        late.add(100_000, 199_999, &none);
        assert_eq!(late.ranges().len(), 3, "a jump is one range");
        assert!(late.spans().is_empty());
    }

    #[test]
    fn runs_past_the_limit_become_spans_not_forgotten() {
        let none = Open::new();
        let mut late = Late::with_limit(2);
        late.add(10, 11, &none);
        late.add(20, 20, &none);
        assert_eq!(late.add(30, 30, &none), 2, "the oldest run moved");
        assert_eq!(late.ranges(), [(20, 20), (30, 30)]);
        assert_eq!(
            late.spans(),
            [(
                10,
                Span {
                    hi: 11,
                    seen: Some(0)
                }
            )]
        );
        // The next oldest run is adjacent: the span grows, still exact.
        assert_eq!(late.add(12, 12, &none), 1);
        assert_eq!(
            late.spans(),
            [(
                10,
                Span {
                    hi: 12,
                    seen: Some(0)
                }
            )]
        );
        assert_eq!(late.ranges(), [(20, 20), (30, 30)]);
        // Forgotten only once trimmed past; a span cut short is recounted.
        assert_eq!(late.forget_through(11), 2);
        assert_eq!(late.spans(), [(12, Span { hi: 12, seen: None })]);
        assert_eq!(late.forget_through(25), 2);
        assert_eq!(late.ranges(), [(30, 30)]);
        assert!(late.spans().is_empty());
    }

    #[test]
    fn a_span_grows_over_seen_numbers_and_counts_them() {
        let none = Open::new();
        let mut late = Late::with_limit(1);
        late.add(10, 10, &none);
        late.add(20, 21, &none);
        // 10 moved; then 20..=21 moves over 11..=19, all seen.
        late.add(30, 30, &none);
        assert_eq!(
            late.spans(),
            [(
                10,
                Span {
                    hi: 21,
                    seen: Some(9)
                }
            )]
        );
        // An open gap between: a span of its own, the count not guessed.
        let open = Open::from([(25, Instant::now())]);
        late.add(40, 40, &open);
        assert_eq!(
            late.spans(),
            [
                (
                    10,
                    Span {
                        hi: 21,
                        seen: Some(9)
                    }
                ),
                (
                    30,
                    Span {
                        hi: 30,
                        seen: Some(0)
                    }
                )
            ]
        );
        late.add(50, 50, &open);
        assert_eq!(
            late.spans()[1],
            (
                30,
                Span {
                    hi: 40,
                    seen: Some(9)
                }
            )
        );
        // Past a jump over numbers never read, no span grows over them.
        late.seal(45);
        late.add(60, 60, &none);
        let fresh = Span {
            hi: 50,
            seen: Some(0),
        };
        assert_eq!(late.spans()[2], (50, fresh));
    }

    #[test]
    fn a_run_starting_where_a_span_starts_never_replaces_it() {
        let none = Open::new();
        let mut late = Late::with_limit(1);
        late.add(10, 12, &none);
        late.add(20, 20, &none);
        let span = Span {
            hi: 12,
            seen: Some(0),
        };
        assert_eq!(late.spans(), [(10, span)]);
        // 10 given up again moves to the spans: 10..=12 stays whole.
        assert_eq!(late.add(10, 10, &none), 1);
        assert_eq!(late.spans(), [(10, span)]);
    }

    #[test]
    fn a_run_inside_a_merged_span_never_cuts_it_back() {
        let mut late = Late::with_limit(1);
        let open = Open::from([(15, Instant::now()), (35, Instant::now())]);
        late.add(10, 10, &open);
        late.add(20, 20, &open);
        late.add(30, 30, &open);
        let spans = late.spans();
        late.merged(spans[0], spans[1], 5);
        let merged = Span {
            hi: 20,
            seen: Some(5),
        };
        assert_eq!(late.spans(), [(10, merged)]);
        // A run below the merged span's end moves there: covered already.
        // Before, the span was cut back to it, with a count of -4.
        late.add(12, 12, &open);
        assert_eq!(late.spans(), [(10, merged)]);
        // One that reaches past its end extends it by unseen numbers.
        late.add(18, 25, &open);
        assert_eq!(
            late.spans(),
            [(
                10,
                Span {
                    hi: 25,
                    seen: Some(5)
                }
            )]
        );
    }

    #[test]
    fn a_count_keeps_what_an_extension_added_meanwhile() {
        let none = Open::new();
        let mut late = Late::with_limit(1);
        late.add(10, 10, &none);
        late.add(20, 20, &none);
        let read = late.spans()[0].1;
        assert_eq!(read.seen, Some(0));
        // While the count of 10..=10 runs, 20 moves over 11..=19 (seen).
        late.add(30, 30, &none);
        assert_eq!(late.spans()[0].1.seen, Some(9));
        late.counted(10, read, 1);
        assert_eq!(
            late.spans()[0].1,
            Span {
                hi: 20,
                seen: Some(10)
            },
            "the count plus the nine seen numbers the extension added"
        );
    }

    #[test]
    fn spans_past_the_bound_merge_the_closest_pair() {
        let mut late = Late::with_limit(1);
        // An open gap after each run keeps every span apart.
        let open: Open = (0..=MAX_SPANS as i64 + 2)
            .map(|i| (i * 1000 + 1, Instant::now()))
            .chain([(950, Instant::now())])
            .collect();
        for i in 0..=MAX_SPANS as i64 + 1 {
            // Spans 1000 apart, except the first two, 100 apart.
            let at = if i == 0 { 900 } else { i * 1000 };
            late.add(at, at, &open);
        }
        assert_eq!(late.spans().len(), MAX_SPANS + 1);
        let (a, b) = late.merge_due().expect("over the bound");
        assert_eq!((a.0, b.0), (900, 1000), "the closest pair");
        late.merged(a, b, 3);
        assert_eq!(
            late.spans()[0],
            (
                900,
                Span {
                    hi: 1000,
                    seen: Some(3)
                }
            )
        );
        assert!(late.merge_due().is_none());
        // A pair that changed since it was read is not merged.
        let stale = (
            900,
            Span {
                hi: 1000,
                seen: Some(0),
            },
        );
        late.merged(stale, late.spans()[1], 9);
        assert_eq!(late.spans().len(), MAX_SPANS);
    }
}
