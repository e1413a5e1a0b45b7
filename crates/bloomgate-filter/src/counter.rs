//! An insert count that many threads add to without a locked instruction
//! and without sharing a cache line.
//!
//! A single `AtomicU64` counted by every insert costs each insert a locked
//! `fetch_add` (a quarter of an `AtomicBloom` insert in cache) and, with
//! several inserting threads, makes them all write one cache line. Here
//! each thread that counts holds a slot id of its own, `0..SLOTS`, for as
//! long as it lives; every counter has a padded cell per slot, which only
//! the slot's holder writes, with a relaxed load and store. Reading sums
//! the cells. A thread that finds every id taken (more than [`SLOTS`]
//! counting at once) or that counts while its thread-locals are being
//! destroyed adds to a shared cell with `fetch_add`.
//!
//! A cell is never written by two threads at once: ids are handed out and
//! taken back under one lock, so the previous holder's last store happens
//! before the next holder's first load.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

/// How many threads count in cells of their own at once.
pub(crate) const SLOTS: usize = 32;

/// One counter cell on a pair of cache lines of its own (the unit the
/// adjacent-line prefetcher pulls in).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Cell(AtomicU64);

/// A sum of per-thread cells (see the module docs): cell `id` for the
/// thread holding slot id `id`, the last one shared. All of them are
/// behind the pointer, so a struct holding a `Count` holds no atomics
/// itself (and the compiler may keep its other fields in registers across
/// calls).
#[derive(Debug)]
pub(crate) struct Count {
    cells: Box<[Cell; SLOTS + 1]>,
}

impl Default for Count {
    fn default() -> Self {
        Self {
            cells: Box::new(std::array::from_fn(|_| Cell::default())),
        }
    }
}

impl Count {
    /// A count starting at `n`.
    pub(crate) fn new(n: u64) -> Self {
        let c = Self::default();
        c.cells[SLOTS].0.store(n, Ordering::Relaxed);
        c
    }

    /// Adds `n`.
    #[inline]
    pub(crate) fn add(&self, n: u64) {
        match SLOT.try_with(|s| s.0) {
            Ok(Some(id)) => {
                let cell = &self.cells[id].0;
                // Only this thread writes this cell while it holds `id`.
                cell.store(
                    cell.load(Ordering::Relaxed).wrapping_add(n),
                    Ordering::Relaxed,
                );
            }
            _ => {
                self.cells[SLOTS].0.fetch_add(n, Ordering::Relaxed);
            }
        }
    }

    /// The sum: exact once every adding thread is ordered before the
    /// read (joined, or synchronised with it some other way).
    pub(crate) fn get(&self) -> u64 {
        self.cells
            .iter()
            .fold(0u64, |s, c| s.wrapping_add(c.0.load(Ordering::Relaxed)))
    }
}

/// The ids no live thread holds.
struct Ids {
    /// Ids below `fresh` that were given back.
    free: Vec<usize>,
    /// The lowest id never handed out.
    fresh: usize,
}

static IDS: Mutex<Ids> = Mutex::new(Ids {
    free: Vec::new(),
    fresh: 0,
});

/// A thread's slot id (`None` when all were taken); given back when the
/// thread ends.
struct Slot(Option<usize>);

impl Slot {
    fn take() -> Self {
        let mut ids = IDS.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(id) = ids.free.pop() {
            return Self(Some(id));
        }
        if ids.fresh < SLOTS {
            ids.fresh += 1;
            return Self(Some(ids.fresh - 1));
        }
        Self(None)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(id) = self.0 {
            IDS.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .free
                .push(id);
        }
    }
}

thread_local! {
    static SLOT: Slot = Slot::take();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Barrier};

    #[test]
    fn counts_exactly_across_more_threads_than_slots_and_thread_turnover() {
        let count = Arc::new(Count::new(7));
        // Three waves of SLOTS + 8 threads each, all alive at once within a
        // wave (so some find every id taken and use the shared cell), each
        // wave reusing the ids the previous one gave back.
        let per_thread = 10_000u64;
        let threads = SLOTS + 8;
        for _ in 0..3 {
            let barrier = Arc::new(Barrier::new(threads));
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let (count, barrier) = (Arc::clone(&count), Arc::clone(&barrier));
                    std::thread::spawn(move || {
                        let step = 1 + (t % 3) as u64;
                        count.add(step);
                        barrier.wait();
                        for _ in 1..per_thread {
                            count.add(step);
                        }
                        SLOT.with(|s| s.0)
                    })
                })
                .collect();
            let ids: Vec<Option<usize>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
            let held: Vec<usize> = ids.iter().flatten().copied().collect();
            let mut distinct = held.clone();
            distinct.sort_unstable();
            distinct.dedup();
            assert_eq!(distinct.len(), held.len(), "no id held twice at once");
            assert!(
                ids.iter().any(Option::is_none),
                "some threads found every id taken"
            );
        }
        let per_wave: u64 = (0..threads)
            .map(|t| per_thread * (1 + (t % 3) as u64))
            .sum();
        assert_eq!(count.get(), 7 + 3 * per_wave);
        assert!(
            count
                .cells
                .iter()
                .filter(|c| c.0.load(Ordering::Relaxed) > 0)
                .count()
                > 1,
            "threads counted in cells of their own"
        );
    }
}
