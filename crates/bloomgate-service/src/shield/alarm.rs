//! The shield's alarms: past capacity (checked on every insert), a fill
//! ratio over one half and an observed false-positive rate over twice the
//! expected one (checked by the monitor task), raised once per crossing.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::shield::Shield;
use crate::sync::lock;

/// Why the filter needs attention (002 §六: a filter past its capacity, or
/// more than half full, or letting through more than it should, no longer
/// protects the database as sized).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Alarm {
    /// More items than the filter was sized for.
    PastCapacity {
        /// Items in the filter.
        items: u64,
        /// Items it was sized for.
        capacity: u64,
    },
    /// More than half the bits are set.
    FillRatio {
        /// Fraction of bits set.
        fill_ratio: f64,
    },
    /// Over the last window, ids that passed the filter but did not exist
    /// were more than twice the filter's expected false-positive rate.
    ObservedFpr {
        /// Passed-but-missing over all missing ids in the window.
        observed: f64,
        /// The filter's expected rate at its load.
        expected: f64,
    },
    /// The audit found a row for a key the filter refused (see
    /// `reader::audit`); in force until the rebuild it owes succeeds.
    FalseNegative,
}

impl Alarm {
    /// Every kind, as named by [`Alarm::kind`].
    pub const KINDS: [&'static str; 4] = [
        "past_capacity",
        "fill_ratio",
        "observed_fpr",
        "false_negative",
    ];

    /// The alarm's kind: `past_capacity`, `fill_ratio` or `observed_fpr`.
    #[must_use]
    pub const fn kind(&self) -> &'static str {
        match self {
            Self::PastCapacity { .. } => Self::KINDS[0],
            Self::FillRatio { .. } => Self::KINDS[1],
            Self::ObservedFpr { .. } => Self::KINDS[2],
            Self::FalseNegative => Self::KINDS[3],
        }
    }
}

impl std::fmt::Display for Alarm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::PastCapacity { items, capacity } => {
                write!(f, "past_capacity: {items} items, sized for {capacity}")
            }
            Self::FillRatio { fill_ratio } => write!(f, "fill_ratio: {fill_ratio:.3} > 0.5"),
            Self::ObservedFpr { observed, expected } => write!(
                f,
                "observed_fpr: {observed:.6} > 2 x expected {expected:.6}"
            ),
            Self::FalseNegative => write!(
                f,
                "false_negative: the filter refused a key the database has"
            ),
        }
    }
}

/// Missing ids a monitoring window must see before its observed rate
/// counts: fewer is noise.
pub const MIN_WINDOW_SAMPLES: u64 = 200;

impl Shield {
    /// The alarm in force, if any.
    pub fn alarm(&self) -> Option<Alarm> {
        *lock(&self.alarm)
    }

    /// Raises `alarm` unless one is in force (one warning per crossing) and,
    /// with auto-rebuild on, asks for a rebuild sized for twice the items.
    pub(super) fn raise(self: &Arc<Self>, alarm: Alarm) {
        {
            let mut current = lock(&self.alarm);
            if current.is_some() {
                return;
            }
            *current = Some(alarm);
        }
        self.alarms_raised.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            ?alarm,
            auto_rebuild = self.config.auto_rebuild,
            "bloom filter alarm"
        );
        if self.config.auto_rebuild {
            let items = self
                .current
                .load()
                .as_deref()
                .map_or(0, |f| f.as_filter().items());
            self.min_capacity
                .fetch_max(items.saturating_mul(2), Ordering::Relaxed);
            drop(self.request_rebuild());
        }
    }

    /// Raises the false-negative alarm over any other in force (it is the
    /// one that matters most); the caller owes the rebuild.
    pub fn raise_false_negative(&self) {
        let was = lock(&self.alarm).replace(Alarm::FalseNegative);
        if was != Some(Alarm::FalseNegative) {
            self.alarms_raised.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The alarm the published filter deserves now, from its own figures
    /// (`fill` is the fill ratio, which costs a pass over the bits).
    pub(super) fn structural_alarm(&self, fill: bool) -> Option<Alarm> {
        let guard = self.current.load();
        let f = guard.as_deref()?.as_filter();
        let (items, capacity) = (f.items(), self.capacity.load(Ordering::Relaxed));
        if items > capacity {
            return Some(Alarm::PastCapacity { items, capacity });
        }
        if fill {
            let fill_ratio = f.fill_ratio();
            if fill_ratio > 0.5 {
                return Some(Alarm::FillRatio { fill_ratio });
            }
        }
        None
    }

    /// One monitoring step: closes the window of missing ids, checks the
    /// observed rate against twice the expected one and the fill ratio,
    /// and raises or clears the alarm.
    pub fn monitor_step(self: &Arc<Self>) {
        let (rejected, passed_missing) = (self.rejected.get(), self.passed_missing.get());
        let (r0, p0) = std::mem::replace(&mut *lock(&self.window), (rejected, passed_missing));
        let (dr, dp) = (
            rejected.saturating_sub(r0),
            passed_missing.saturating_sub(p0),
        );
        let expected = self
            .current
            .load()
            .as_deref()
            .map(|f| f.as_filter().expected_fpr(f.as_filter().items()));
        let observed_alarm = match expected {
            Some(expected) if dr + dp >= MIN_WINDOW_SAMPLES => {
                let observed = dp as f64 / (dr + dp) as f64;
                (observed > 2.0 * expected).then_some(Alarm::ObservedFpr { observed, expected })
            }
            _ => None,
        };
        let observed_ok =
            expected.is_some() && dr + dp >= MIN_WINDOW_SAMPLES && observed_alarm.is_none();
        let false_negative = *lock(&self.alarm) == Some(Alarm::FalseNegative);
        match self.structural_alarm(true).or(observed_alarm) {
            // A false negative's alarm stays until its rebuild is done.
            Some(_) if false_negative && self.rebuild_is_owed() => {}
            Some(alarm) => self.raise(alarm),
            None => {
                // An observed-rate alarm clears only after a full window
                // below the threshold; a structural one as soon as it holds.
                let mut current = lock(&self.alarm);
                let clears = match *current {
                    Some(Alarm::ObservedFpr { .. }) => observed_ok,
                    Some(Alarm::FalseNegative) => !self.rebuild_is_owed(),
                    Some(_) => true,
                    None => false,
                };
                if clears {
                    *current = None;
                    tracing::info!("bloom filter alarm cleared");
                }
            }
        }
    }

    /// Runs [`Shield::monitor_step`] every `every` until the shield is dropped.
    pub fn spawn_monitor(self: &Arc<Self>, every: Duration) {
        let shield = Arc::downgrade(self);
        self.background.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(shield) = shield.upgrade() else {
                    return;
                };
                shield.monitor_step();
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BloomLayout;
    use crate::shield::ShieldConfig;
    use crate::sql::Database;

    /// Sized filters reach half full only past their capacity, so the
    /// fill-ratio alarm is the safety net for a capacity that does not
    /// match the filter (here: set by hand). It fires on its own
    /// threshold, shows in stats, and is raised once.
    #[tokio::test]
    async fn a_filter_over_half_full_raises_the_fill_ratio_alarm() {
        let dir = tempfile::tempdir().unwrap();
        let store = Database::connect(&format!("sqlite://{}/g.db", dir.path().display()))
            .await
            .unwrap();
        let shield = Arc::new(Shield::new(
            ShieldConfig {
                enabled: true,
                layout: BloomLayout::Blocked,
                expected: 1000,
                fpp: 0.01,
                auto_rebuild: false,
                scan_rows_per_sec: 0,
            },
            Arc::new(store),
        ));
        shield.request_rebuild().wait().await.unwrap();
        shield.capacity.store(u64::MAX, Ordering::Relaxed);
        for id in 0..500 {
            shield.insert(id);
        }
        shield.monitor_step();
        assert_eq!(shield.stats().alarm_kind, None, "{:?}", shield.stats());
        for id in 500..10_000 {
            shield.insert(id);
        }
        assert!(matches!(
            shield.structural_alarm(true),
            Some(Alarm::FillRatio { fill_ratio }) if fill_ratio > 0.5
        ));
        shield.monitor_step();
        shield.monitor_step();
        let s = shield.stats();
        assert_eq!(s.alarm_kind, Some("fill_ratio"));
        assert_eq!(s.alarms_raised, 1);
    }
}
