//! One connection's timer for hyper's header timeout, armed lazily.
//!
//! hyper asks its timer for a new sleep each time it waits for a request
//! head, and drops it when the head arrives: with tokio's timer, a boxed
//! entry registered in the timer wheel and removed again for every
//! request on a keep-alive connection (`perf`: about 2% of a Redis hit's
//! CPU). Here a connection keeps one tokio sleep, and each of hyper's
//! sleeps only notes its deadline. The tokio sleep stays at the deadline
//! it was given; when it fires before the deadline of the sleep being
//! waited on (that request's head came, and a later one is awaited now),
//! it is moved to that deadline. So the wheel is touched about once per
//! timeout period, not once per request; a timeout is never late; and the
//! cost is at most one early wake of the connection per period.
//!
//! A deadline earlier than the armed one (not hyper's way: its deadlines
//! only grow) moves the sleep back at once.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// A connection's timer: give each connection its own.
#[derive(Debug, Clone, Default)]
pub struct LazyTimer {
    armed: Arc<Mutex<Option<Pin<Box<tokio::time::Sleep>>>>>,
}

impl hyper::rt::Timer for LazyTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        let now = self.now();
        // Saturating, as tokio's own timer does.
        self.sleep_until(
            now.checked_add(duration)
                .unwrap_or(now + Duration::from_secs(86_400 * 365)),
        )
    }

    /// tokio's clock (the same as `Instant::now()` outside paused tests).
    fn now(&self) -> Instant {
        tokio::time::Instant::now().into_std()
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(LazySleep {
            deadline: tokio::time::Instant::from_std(deadline),
            armed: Arc::clone(&self.armed),
        })
    }
}

/// One of hyper's sleeps: a deadline, waited for on the connection's one
/// tokio sleep.
struct LazySleep {
    deadline: tokio::time::Instant,
    armed: Arc<Mutex<Option<Pin<Box<tokio::time::Sleep>>>>>,
}

impl hyper::rt::Sleep for LazySleep {}

impl Future for LazySleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut armed = crate::sync::lock(&self.armed);
        let sleep = armed.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(self.deadline)));
        if sleep.deadline() > self.deadline {
            sleep.as_mut().reset(self.deadline);
        }
        loop {
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            if sleep.deadline() >= self.deadline {
                return Poll::Ready(());
            }
            // An earlier deadline's wake: wait on for this one.
            sleep.as_mut().reset(self.deadline);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::rt::Timer;

    /// Polls a sleep once, without waiting.
    async fn poll_once(sleep: &mut Pin<Box<dyn hyper::rt::Sleep>>) -> Poll<()> {
        std::future::poll_fn(|cx| Poll::Ready(sleep.as_mut().poll(cx))).await
    }

    #[tokio::test(start_paused = true)]
    async fn each_sleep_ends_at_its_own_deadline_on_one_armed_sleep() {
        let timer = LazyTimer::default();
        let start = tokio::time::Instant::now();
        // A first wait, given up before its deadline (its head came).
        let mut first = timer.sleep(Duration::from_secs(10));
        assert!(poll_once(&mut first).await.is_pending());
        drop(first);
        tokio::time::advance(Duration::from_secs(4)).await;
        // The next wait is not over when the first one's deadline passes.
        let second = timer.sleep(Duration::from_secs(10));
        let ended = tokio::spawn(async move {
            second.await;
            tokio::time::Instant::now()
        });
        assert_eq!(ended.await.unwrap() - start, Duration::from_secs(14));
        // A deadline earlier than the armed one moves it back.
        let mut later = timer.sleep(Duration::from_secs(30));
        assert!(poll_once(&mut later).await.is_pending());
        drop(later);
        let before = tokio::time::Instant::now();
        timer.sleep(Duration::from_secs(1)).await;
        assert_eq!(tokio::time::Instant::now() - before, Duration::from_secs(1));
    }
}
