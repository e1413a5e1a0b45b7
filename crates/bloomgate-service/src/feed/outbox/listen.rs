//! PostgreSQL's doorbell: a connection that `LISTEN`s on
//! [`crate::sql::NOTIFY_CHANNEL`], which the capture triggers and the service's own
//! outbox entries notify on commit. Each notification wakes the follower;
//! while the connection answers, the follower polls only every
//! `sql.outbox_idle_poll_ms`. A listener drops notifications while it is
//! disconnected, so every (re)connection wakes the follower too, which
//! reads whatever it missed: polling stays the backstop.

use std::sync::Arc;
use std::time::Duration;

use crate::feed::outbox::Outbox;
use crate::shield::Shield;

/// How long a quiet listener counts as an answer (the doorbell's health
/// needs one every second or so).
const QUIET: Duration = Duration::from_millis(900);

impl Outbox {
    /// Starts the listener when the store is PostgreSQL's; ends with the
    /// follower (the service's shutdown, or its last handle dropped).
    pub(super) fn spawn_listener(&self, anchor: &Arc<Shield>) {
        if !self.store.outbox_listens() {
            return;
        }
        let (outbox, shield) = (self.clone(), Arc::clone(anchor));
        self.background.spawn(async move {
            let _guard = Shield::follow(&shield);
            let over = || Shield::only_followers_left(&shield);
            let mut backoff = Duration::from_millis(100);
            let mut failing = false;
            while !over() {
                let mut listener = match outbox.store.outbox_listen().await {
                    Some(Ok(l)) => l,
                    None => return,
                    Some(Err(e)) => {
                        if !std::mem::replace(&mut failing, true) {
                            tracing::warn!(error = %e, "outbox LISTEN: cannot connect; polling meanwhile");
                        }
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                        continue;
                    }
                };
                if std::mem::take(&mut failing) {
                    tracing::info!("outbox LISTEN connected again");
                }
                backoff = Duration::from_millis(100);
                // Whatever was notified while not listening: read it now.
                outbox.doorbell_ok();
                outbox.ring();
                while !over() {
                    match tokio::time::timeout(QUIET, listener.recv()).await {
                        Err(_) => outbox.doorbell_ok(),
                        Ok(Ok(true)) => {
                            outbox.doorbell_ok();
                            outbox.ring();
                        }
                        // The connection was lost (and is made again by the
                        // next call): what was sent meanwhile is gone.
                        Ok(Ok(false)) => outbox.doorbell_lost(),
                        Ok(Err(e)) => {
                            tracing::warn!(error = %e, "outbox LISTEN lost; reconnecting");
                            outbox.doorbell_lost();
                            break;
                        }
                    }
                }
            }
        });
    }
}
