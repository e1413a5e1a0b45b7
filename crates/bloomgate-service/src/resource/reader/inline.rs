//! [`Inline`]: a load run inside the read that started it, and handed to
//! a task of its own only if that read goes away.

/// A load, run in the future of the read that started it: no task to
/// spawn, schedule and wake in the usual case (`perf`: the task's spawn,
/// scheduling and wake-up were about 4% of a Redis hit's CPU), and its
/// answer handed straight to that read. If that read goes away first (its
/// client left, or the request timed out), dropping this spawns the rest
/// of the load as a task of its own, so the readers that joined it, and
/// the caches, still get its answer.
pub(super) struct Inline<T: 'static>(
    pub(super) Option<std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>>,
);

impl<T: 'static> std::future::Future for Inline<T> {
    type Output = Option<T>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<T>> {
        let Some(load) = self.0.as_mut() else {
            return std::task::Poll::Ready(None);
        };
        let out = std::task::ready!(load.as_mut().poll(cx));
        self.0 = None;
        std::task::Poll::Ready(Some(out))
    }
}

impl<T: 'static> Drop for Inline<T> {
    fn drop(&mut self) {
        if let Some(load) = self.0.take() {
            // Dropped outside a runtime, or while the runtime shuts down
            // (which cancels the spawned task at once), the load ends
            // unfinished: its readers get "the load stopped", a 503.
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                drop(runtime.spawn(async move { drop(load.await) }));
            }
        }
    }
}
