//! The service's life: [`prepare`] (seed, then every resource's filter
//! from its snapshot, else a shared epoch, else a scan, and the change
//! feed's followers), [`run`] (serve, drain, save the last snapshots, stop
//! every background loop) and [`serve`], both from a configuration.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;
use crate::http;
use crate::state::{AppState, StartError};

mod start;
use start::{Build, Filter, Start, Starts};

/// Serves `state` on `listener` until `shutdown` resolves, then stops
/// accepting and drains in-flight requests for at most
/// `http.shutdown_grace_secs`. After that it returns anyway; the requests
/// still running end when the runtime shuts down (for `bloomgate serve`,
/// when the process exits). Then it saves the last snapshot and ends every
/// background loop of `state` through its one signal
/// ([`crate::tasks::Background::stop`]).
///
/// # Errors
/// I/O errors from the listener.
pub async fn run(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    run_with(listener, Listeners::default(), state, shutdown).await
}

/// The listeners beside the service's own: the Redis-protocol one
/// (`[resp]`) and the HTTP gate's reverse proxy (`[gate]`).
#[derive(Debug, Default)]
pub struct Listeners {
    /// Where RESP is answered (`resp.listen`).
    pub resp: Option<tokio::net::TcpListener>,
    /// Where the reverse proxy listens (`gate.listen`).
    pub gate: Option<tokio::net::TcpListener>,
}

/// [`run`], with the other listeners too: they stop accepting on the
/// same signal, and their connections end (or are cut after
/// `http.shutdown_grace_secs`) before the background loops stop, so none
/// answers "no" once the change feed is no longer read.
///
/// # Errors
/// I/O errors from the listener.
pub async fn run_with(
    listener: tokio::net::TcpListener,
    others: Listeners,
    mut state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    if others.resp.is_none() {
        // No second listener: HTTP keeps the whole connection budget.
        state.resp.listen = None;
    }
    let (stop_all, stopped) = tokio::sync::watch::channel(false);
    let shutdown = async move {
        shutdown.await;
        let _ = stop_all.send(true);
    };
    let grace = Duration::from_secs(state.http.shutdown_grace_secs);
    let signalled = |stopped: &tokio::sync::watch::Receiver<bool>| {
        let mut s = stopped.clone();
        async move {
            let _ = s.wait_for(|s| *s).await;
        }
    };
    let mut tasks = Vec::new();
    if let Some(listener) = others.resp {
        let registry = crate::resp::Registry::of(&state, &state.resp.keys);
        let max = match state.resp.max_connections {
            0 => state.default_max_connections(),
            n => n,
        };
        let served = crate::resp::serve::serve(
            listener,
            registry,
            state.resp.clone(),
            usize::try_from(max).unwrap_or(usize::MAX),
            signalled(&stopped),
        );
        tasks.push(("RESP", bounded(served, signalled(&stopped), grace)));
    }
    if let Some(listener) = others.gate {
        // One per thread of the gate: each its own upstream pool.
        let proxy = {
            let (config, routes) = (state.gate.clone(), Arc::clone(&state.gate_routes));
            let metrics = Arc::clone(&state.metrics);
            let service = tokio::runtime::Handle::current();
            move || {
                crate::proxy::Proxy::new(&config, Arc::clone(&routes), Arc::clone(&metrics))
                    .on_service_runtime(service.clone())
            }
        };
        let max = match state.gate.max_connections {
            0 => state.default_max_connections(),
            n => n,
        };
        let limits = crate::proxy::Limits {
            header_timeout: Duration::from_millis(state.http.header_timeout_ms),
            max_connections: usize::try_from(max).unwrap_or(usize::MAX),
            max_header_bytes: state.gate.max_header_bytes,
            max_headers: state.gate.max_headers,
            write_idle: Duration::from_millis(state.gate.idle_timeout_ms),
        };
        let served = crate::proxy::serve_per_core(
            listener,
            state.gate.threads,
            proxy,
            limits,
            signalled(&stopped),
            grace,
        );
        // The gate's threads drain within `grace` of their own, counted
        // from the moment the acceptor hangs up: this bound comes after.
        let bound = grace + Duration::from_secs(1);
        tasks.push(("gate", bounded(served, signalled(&stopped), bound)));
    }
    let before_background = async move {
        for (name, task) in tasks {
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(listener = name, error = %e, "a listener failed"),
                Err(e) => tracing::warn!(listener = name, error = %e, "a listener's task failed"),
            }
        }
    };
    run_http(listener, state, shutdown, before_background).await
}

/// Runs `served` until it ends, or until `grace` after `stopped`: past
/// it the listener is dropped, which aborts the RESP listener's
/// connections (bounded from the signal, as the HTTP drain is; the
/// listeners drain at once). The gate's threads end their connections
/// at their own bound, within this one.
fn bounded(
    served: impl Future<Output = std::io::Result<()>> + Send + 'static,
    stopped: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> tokio::task::JoinHandle<std::io::Result<()>> {
    tokio::spawn(async move {
        tokio::select! {
            r = served => r,
            () = async {
                stopped.await;
                tokio::time::sleep(grace).await;
            } => {
                tracing::warn!(
                    grace_secs = grace.as_secs(),
                    "connections still open after the shutdown grace period; closing them"
                );
                Ok(())
            }
        }
    })
}

async fn run_http(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
    before_background: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let grace = Duration::from_secs(state.http.shutdown_grace_secs);
    let background = state.background.clone();
    // Every filter's snapshot: the SKUs' and each resource's.
    let persist: Vec<_> =
        std::iter::once((state.skus.persist.clone(), Arc::clone(state.skus.shield())))
            .chain(
                state
                    .resources
                    .iter()
                    .map(|r| (r.persist.clone(), Arc::clone(r.shield()))),
            )
            .filter_map(|(persist, shield)| Some((persist?, shield)))
            .collect();
    let (stopping_tx, stopping_rx) = tokio::sync::oneshot::channel::<()>();
    let signal = async move {
        shutdown.await;
        let _ = stopping_tx.send(());
    };
    // The peer address is an extension on every request, which costs an
    // allocation each: only the per-client rate limit needs it.
    let served = http::serve(listener, state, signal);
    let bound = async move {
        if stopping_rx.await.is_ok() {
            tokio::time::sleep(grace).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    let result = tokio::select! {
        served = served => served,
        () = bound => {
            tracing::warn!(grace_secs = grace.as_secs(), "requests still in flight after the shutdown grace period; closing them");
            Ok(())
        }
    };
    // The other listener's connections end before the change feed stops
    // being read.
    before_background.await;
    // The last snapshots, so the next start needs no SQL scan.
    for (persist, shield) in persist {
        let path = persist.path().display().to_string();
        match persist.save(&shield).await {
            Ok(_) => tracing::info!(%path, "filter snapshot saved at shutdown"),
            Err(e) => {
                tracing::warn!(%path, error = %e, "saving the filter snapshot at shutdown failed")
            }
        }
    }
    // Then every background loop, through the one signal.
    if !background.stop(grace).await {
        tracing::warn!(
            still_running = background.running(),
            "background tasks still running after the shutdown grace period"
        );
    }
    result
}

/// Seeds an empty database with `config.seed_if_empty` catalogue SKUs and,
/// when configured, starts building the filter in the background (reads
/// fail open until it is ready; a failed build is retried with capped
/// exponential backoff until it succeeds). Returns the build task, if any.
///
/// # Errors
/// [`StartError::Store`].
pub async fn prepare(
    state: &AppState,
    config: &Config,
) -> Result<Option<tokio::task::JoinHandle<()>>, StartError> {
    let store = state.skus.source();
    let mut seeded = false;
    // Emptiness by `LIMIT 1`: a count of a large table could outlast
    // any statement timeout. Without the demo table, nothing is seeded.
    if state.demo && config.seed_if_empty > 0 && store.is_empty().await? {
        seeded = true;
        tracing::info!(
            count = config.seed_if_empty,
            "empty database: seeding the catalogue"
        );
        let inserted = store
            .seed_range(1, config.seed_if_empty as i64, |_| {})
            .await?;
        tracing::info!(inserted, "catalogue seeded");
        // The shared filter was filled from SQL when it was opened, before
        // the seed: add the seeded ids (in redis mode it alone answers).
        if let Some(shared) = state.skus.shared() {
            shared.fill().await;
        }
    }
    let c = &config.cache;
    state
        .metrics
        .spawn_upkeep(Duration::from_secs(5), &state.background);
    // Where the outbox follower starts: before the scan (or the snapshot's
    // or epoch's own position), so every create after it is followed.
    let outbox = &state.outbox;
    // Without bloomgate's outbox (`sql.outbox` off) there is no position
    // to follow from, so nothing positioned in it (a snapshot, an epoch)
    // is restored: every filter is built from its table.
    let outbox_on = outbox.store.outbox_on();
    let mut outbox_from = if outbox_on {
        match outbox.start_position().await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "change outbox unreadable at start; following from its beginning");
                0
            }
        }
    } else {
        0
    };
    // Rebuild requests a scanned filter covers (see `Outbox::max_seq`); a
    // snapshot or an epoch covers those up to its own position.
    let covered_now = if outbox_on {
        outbox.max_seq().await.unwrap_or(0)
    } else {
        0
    };
    // The doorbell's position before any epoch is adopted: one announced
    // meanwhile is read again by its follower (adopting it twice is
    // harmless; missing it is not).
    let doorbell_from = match &state.changes {
        Some(changes) => Some(changes.last_id().await.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "doorbell stream unreadable at start; following from its end once it answers");
            "$".to_string()
        })),
        None => None,
    };
    // The demo SKU table's filter, where it is served, then every
    // configured resource's: each from its snapshot, else a shared epoch,
    // else a scan. The SKU table seeded here scans (the seed is in no
    // filter and no outbox entry), and its filter replaces any epoch left
    // from before, which describes other data.
    let first = Start {
        outbox,
        outbox_on,
        covered_now,
    };
    let mut filters: Vec<Filter<'_>> = Vec::with_capacity(state.resources.len() + 1);
    if state.demo {
        filters.push(Filter {
            table: &state.skus,
            seeded,
            build: c.bloom_build_on_start,
            demo: true,
        });
    } else {
        // Not served: the requests before now are no rebuild's business.
        outbox.cover(&state.skus.name, covered_now);
    }
    filters.extend(state.resources.iter().map(|r| Filter {
        table: r as &dyn Starts,
        seeded: false,
        build: true,
        demo: false,
    }));
    let mut starts = Vec::with_capacity(filters.len());
    for f in &filters {
        starts.push(if c.bloom_enabled {
            Some(f.table.position(&first, !f.seeded, &mut outbox_from).await)
        } else {
            outbox.cover(f.table.name(), covered_now);
            None
        });
    }
    if let (Some(changes), Some(from)) = (&state.changes, doorbell_from) {
        let led: std::sync::Weak<crate::resource::Resource<crate::sql::Database>> =
            Arc::downgrade(&state.skus);
        changes.spawn_follower(from, state.skus.shield(), led);
    }
    if outbox_on {
        outbox.spawn_follower(outbox_from, state.skus.shield());
    } else if config.sql.outbox.is_none() {
        follow_once_made(state, Duration::from_millis(config.sql.out_of_step_ms / 3));
    }
    // Filters build from their sources after the follower's start
    // position is fixed, so every key recorded after it is followed.
    // `cache.bloom_build_on_start` holds back the SKU table's build only.
    let build = Build {
        retry: (
            Duration::from_millis(c.bloom_retry_min_ms),
            Duration::from_millis(c.bloom_retry_max_ms),
        ),
        monitor_every: Duration::from_millis(c.bloom_monitor_ms),
        snapshot_every: Duration::from_secs(c.bloom_snapshot_every_secs),
        outbox_from,
        covered_now,
    };
    let mut sku_build = None;
    for (f, start) in filters.iter().zip(starts) {
        let task = f.table.start(&build, start, f, &state.background).await;
        if f.demo {
            sku_build = task;
        }
    }
    if !state.demo {
        // Not served: its snapshot saver only.
        state
            .skus
            .spawn_upkeep(None, Duration::from_secs(c.bloom_snapshot_every_secs));
    }
    Ok(sku_build)
}

/// An instance that started without bloomgate's outbox (`sql.outbox`
/// unset, none there) looks for it every `every`: once another instance
/// or a DBA made it (and this user may write it), it follows it as if it
/// had started with it. The follower starts at the outbox's position now;
/// what was recorded before is covered by a rebuild of every filter, owed
/// (a "no" is not vouched for) until it succeeds, and by dropping L1.
fn follow_once_made(state: &AppState, every: Duration) {
    let outbox = state.outbox.clone();
    let anchor = Arc::clone(state.skus.shield());
    let resources = state.resources.clone();
    state.background.spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            if !matches!(outbox.store.outbox_exists().await, Ok(true)) {
                continue;
            }
            let from = match outbox.start_position().await {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(error = %e, "bloomgate's outbox appeared but is not readable yet");
                    continue;
                }
            };
            outbox.store.set_outbox_on();
            outbox.spawn_follower(from, &anchor);
            for r in &resources {
                r.shield().rebuild_owed(|| {});
                r.reader.invalidate_all_local();
            }
            tracing::warn!(
                from,
                "bloomgate's outbox appeared after this instance started without it: following it now, and rebuilding every filter"
            );
            return;
        }
    });
}

/// Starts the whole service from a configuration: connect, seed if empty,
/// build the filter in the background, listen, serve until `shutdown`.
///
/// # Errors
/// [`StartError`].
pub async fn serve(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StartError> {
    let state = AppState::connect(&config).await?;
    prepare(&state, &config).await?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| StartError::Bind {
            addr: config.listen,
            source,
        })?;
    tracing::info!(addr = %config.listen, "listening");
    let bind = |addr: Option<std::net::SocketAddr>, what: &'static str| async move {
        let Some(addr) = addr else { return Ok(None) };
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| StartError::Bind { addr, source })?;
        tracing::info!(%addr, "{what}");
        Ok::<_, StartError>(Some(l))
    };
    let others = Listeners {
        resp: bind(config.resp.listen, "answering RESP (BF.*)").await?,
        gate: bind(config.gate.listen, "the HTTP gate is listening").await?,
    };
    run_with(listener, others, state.clone(), shutdown)
        .await
        .map_err(|source| StartError::Bind {
            addr: config.listen,
            source,
        })?;
    state.skus.source().close().await;
    Ok(())
}

/// Resolves on Ctrl-C or SIGTERM. The handlers are installed by this call,
/// not when the future is first polled, so a signal that arrives while the
/// service is still starting (after it listens, before `run` polls the
/// future) is not lost to the default action. Call it within a Tokio
/// runtime.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    let signals = {
        use tokio::signal::unix::{signal, SignalKind};
        (
            signal(SignalKind::interrupt()).ok(),
            signal(SignalKind::terminate()).ok(),
        )
    };
    async move {
        #[cfg(unix)]
        {
            let wait = |s: Option<tokio::signal::unix::Signal>| async move {
                match s {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            let (int, term) = signals;
            tokio::select! {
                () = wait(int) => {},
                () = wait(term) => {},
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
        tracing::info!("shutting down");
    }
}
