//! One shutdown signal for every background loop of an instance: the
//! shields' monitors and owed rebuilds, both change followers and the outbox
//! watchdog, the Redis tier's owed invalidations,
//! the snapshot saver, the metrics upkeep, a resource's build and watch.
//! Each is spawned through [`Background::spawn`], which ends it when the
//! signal is given; [`Background::stop`] gives it and waits for them
//! (`run` does, after the drain and the last snapshot). Work that must not
//! be cut halfway (the shared filter's refill, an outbox entry recorded
//! again after a late commit) goes through [`Background::track`]: `stop`
//! waits for it, within its bound, but does not cancel it. The rebuild
//! worker, and the single-flight loads whose first reader went away, are
//! plain tasks that end by themselves (cancelling one would leave its
//! callers' tickets unanswered).
//!
//! After the signal the instance's parts are not restarted (a rebuild
//! left owed): an `AppState` that `run` returned from
//! is not served again. A loop also ends when what it serves is dropped
//! (its `Weak` no longer upgrades), so a part used alone stops too.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The signal and the tasks it ends. Cheap to clone; clones share both.
#[derive(Debug, Clone, Default)]
pub struct Background {
    token: CancellationToken,
    tracker: TaskTracker,
}

impl Background {
    /// A fresh signal with no tasks.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Spawns `task`, which ends at its own end or when the signal is
    /// given, whichever comes first.
    pub fn spawn<F>(&self, task: F) -> tokio::task::JoinHandle<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let token = self.token.clone();
        self.tracker.spawn(async move {
            tokio::select! {
                () = token.cancelled() => {}
                () = task => {}
            }
        })
    }

    /// Spawns `task` to run to its end: [`Background::stop`] waits for it
    /// (within its bound) but does not cancel it.
    pub fn track<F>(&self, task: F) -> tokio::task::JoinHandle<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.tracker.spawn(task)
    }

    /// True once the signal was given.
    #[must_use]
    pub fn is_stopping(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Gives the signal and waits at most `within` for every task to end;
    /// false when some had not.
    pub async fn stop(&self, within: Duration) -> bool {
        self.token.cancel();
        self.tracker.close();
        tokio::time::timeout(within, self.tracker.wait())
            .await
            .is_ok()
    }

    /// Tasks still running.
    #[must_use]
    pub fn running(&self) -> usize {
        self.tracker.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Count(std::sync::Arc<std::sync::atomic::AtomicUsize>);

    impl Drop for Count {
        fn drop(&mut self) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn stop_ends_every_loop_and_waits_for_it() {
        let bg = Background::new();
        let ended = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        for _ in 0..3 {
            // Dropped with the task, polled or not.
            let count = Count(std::sync::Arc::clone(&ended));
            bg.spawn(async move {
                let _count = count;
                loop {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            });
        }
        tokio::task::yield_now().await;
        assert_eq!(bg.running(), 3);
        assert_eq!(ended.load(std::sync::atomic::Ordering::SeqCst), 0);
        assert!(bg.stop(Duration::from_secs(5)).await);
        assert_eq!(ended.load(std::sync::atomic::Ordering::SeqCst), 3);
        assert_eq!(bg.running(), 0);
        assert!(bg.is_stopping());
    }
}
