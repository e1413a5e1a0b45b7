//! Pause points for tests that need a deterministic interleaving: a task
//! stops at a named place until the test resumes it. Disarmed (the normal
//! state) a pause point costs one atomic load.

use std::sync::Arc;

use arc_swap::ArcSwapOption;
use tokio::sync::Notify;

/// One armed pause: the next task that reaches the point with a matching
/// key stops there.
#[derive(Debug)]
pub struct Pause {
    key: i64,
    reached: Notify,
    resume: Notify,
}

impl Pause {
    /// Resolves once a task has stopped at the point.
    pub async fn reached(&self) {
        self.reached.notified().await;
    }

    /// Lets the stopped task go on.
    pub fn resume(&self) {
        self.resume.notify_one();
    }
}

/// A place in the code where a test may stop a task.
#[derive(Debug, Default)]
pub struct PausePoint(ArcSwapOption<Pause>);

impl PausePoint {
    /// Arms the point for the next task that passes with `key`.
    pub fn arm(&self, key: i64) -> Arc<Pause> {
        let p = Arc::new(Pause {
            key,
            reached: Notify::new(),
            resume: Notify::new(),
        });
        self.0.store(Some(Arc::clone(&p)));
        p
    }

    /// Stops here if armed for `key`, once, until resumed.
    pub async fn pass(&self, key: i64) {
        // Unarmed (always, outside tests): one load, no reference taken.
        if self.0.load().as_ref().is_none_or(|p| p.key != key) {
            return;
        }
        let Some(p) = self.0.load_full() else {
            return;
        };
        if p.key != key {
            return;
        }
        // Disarm; only the task whose swap succeeds stops.
        let prev = self.0.compare_and_swap(&Some(Arc::clone(&p)), None);
        if prev.as_ref().is_some_and(|q| Arc::ptr_eq(q, &p)) {
            p.reached.notify_one();
            p.resume.notified().await;
        }
    }
}
