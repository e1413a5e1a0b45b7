//! The listener: connections up to a limit, each one task that reads,
//! answers every whole command in its buffer in order (a pipeline in one
//! batch, at most `max_pipeline` or 64 KiB of replies before they are
//! written), and closes on a protocol error, `QUIT`, an HTTP request, an
//! idle timeout or the shutdown signal.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::commands::execute;
use super::connection::Session;
use super::frame::{self, Limits, Parsed};
use super::reply::Out;
use super::Registry;
use crate::config::resp::RespConfig;

/// Replies buffered before they are written, bytes.
const FLUSH_AT: usize = 64 * 1024;

/// Serves RESP on `listener` until `signal`, then closes every connection
/// after the command it is answering.
///
/// # Errors
/// None today: accept errors are retried.
pub async fn serve(
    listener: tokio::net::TcpListener,
    mut registry: Registry,
    config: RespConfig,
    max_connections: usize,
    signal: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    registry.port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    let registry = Arc::new(registry);
    let limits = Limits {
        max_bulk: config.max_bulk_bytes,
        max_args: config.max_args,
        max_request: config.max_request_bytes,
    };
    let conf = Arc::new(config);
    let permits = Arc::new(tokio::sync::Semaphore::new(
        max_connections.clamp(1, tokio::sync::Semaphore::MAX_PERMITS),
    ));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut signal = std::pin::pin!(signal);
    let next_id = AtomicU64::new(1);
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        let permit = tokio::select! {
            () = &mut signal => break,
            p = Arc::clone(&permits).acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let stream = tokio::select! {
            () = &mut signal => break,
            accepted = listener.accept() => match accepted {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "RESP: accepting a connection failed; retrying in 100 ms");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let (reg, conf, stop) = (Arc::clone(&registry), Arc::clone(&conf), stop_rx.clone());
        let id = next_id.fetch_add(1, Ordering::Relaxed);
        tasks.spawn(async move {
            reg.metrics.resp.opened();
            connection(stream, &reg, &conf, limits, id, stop).await;
            reg.metrics.resp.closed();
            drop(permit);
        });
        while tasks.try_join_next().is_some() {}
    }
    drop(listener);
    let _ = stop_tx.send(true);
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// One connection, to its end.
async fn connection(
    mut stream: tokio::net::TcpStream,
    reg: &Registry,
    conf: &RespConfig,
    limits: Limits,
    id: u64,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let idle = (conf.idle_timeout_secs > 0).then(|| Duration::from_secs(conf.idle_timeout_secs));
    let mut session = Session::new(id, reg.token.is_some());
    let mut out = Out::new();
    let mut input = BytesMut::with_capacity(16 * 1024);
    let mut parsed = Parsed::default();
    loop {
        // Every whole command in the buffer, in order, in batches.
        let mut answered = 0;
        let mut need_more = false;
        while answered < conf.max_pipeline && out.buf.len() < FLUSH_AT && !session.close {
            match frame::parse(&input, &limits, &mut parsed) {
                Ok(Some(used)) => {
                    if !parsed.args.is_empty() {
                        let args: Vec<&[u8]> = (0..parsed.args.len())
                            .map(|i| parsed.arg(&input, i))
                            .collect();
                        execute(reg, &mut session, &mut out, &args).await;
                        answered += 1;
                    }
                    input.advance(used);
                }
                Ok(None) => {
                    need_more = true;
                    break;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "RESP: protocol error; closing the connection");
                    reg.metrics.resp.protocol_error();
                    out.error(&format!("ERR Protocol error: {e}"));
                    session.close = true;
                }
            }
        }
        if session.silent {
            return;
        }
        if !out.buf.is_empty() {
            let written = match idle {
                Some(t) => tokio::time::timeout(t, stream.write_all(&out.buf))
                    .await
                    .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into())),
                None => stream.write_all(&out.buf).await,
            };
            out.buf.clear();
            if written.is_err() {
                return;
            }
        }
        if session.close {
            linger(&mut stream).await;
            return;
        }
        if !need_more {
            continue;
        }
        if input.capacity() - input.len() < 4096 {
            input.reserve(16 * 1024);
        }
        let read = async {
            match idle {
                Some(t) => tokio::time::timeout(t, stream.read_buf(&mut input))
                    .await
                    .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into())),
                None => stream.read_buf(&mut input).await,
            }
        };
        let n = tokio::select! {
            r = read => r,
            _ = stop.changed() => return,
        };
        match n {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        // Memory stays bounded: the parser refuses a command over the
        // limits, and nothing is read until the buffer's commands are
        // answered.
        if input.is_empty() {
            input = BytesMut::with_capacity(16 * 1024);
        }
    }
}

/// Closes the write side, then reads and drops what the client still
/// sends (at most 1 MiB, at most a second), so the error written last
/// reaches it instead of being lost to a reset (a lingering close).
async fn linger(stream: &mut tokio::net::TcpStream) {
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 16 * 1024];
    let mut left = 1usize << 20;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    while left > 0 {
        match tokio::time::timeout_at(deadline, stream.read(&mut sink)).await {
            Ok(Ok(n)) if n > 0 => left = left.saturating_sub(n),
            _ => return,
        }
    }
}
