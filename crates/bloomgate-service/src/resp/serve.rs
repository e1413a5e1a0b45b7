//! The listener: connections up to a limit, each one task that reads,
//! answers every whole command in its buffer in order (a pipeline in one
//! batch, at most `max_pipeline` or 64 KiB of replies before they are
//! written), and closes on a protocol error, `QUIT`, an HTTP request, an
//! idle timeout or the shutdown signal.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;

use super::commands::execute;
use super::connection::Session;
use super::frame::{self, Limits, Parsed};
use super::reply::Out;
use super::Registry;
use crate::config::resp::RespConfig;
use crate::sync::lock;

/// Replies buffered before they are written, bytes.
const FLUSH_AT: usize = 64 * 1024;

/// Serves RESP on `listener` until `signal`; then every connection ends
/// once the commands already in its buffer are answered (the caller
/// bounds that wait and aborts what is left).
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
    let permits = crate::listen::connection_permits(max_connections);
    // Each connection's stop: a oneshot of its own (polling one costs no
    // lock, unlike a channel every connection shares), dropped at shutdown.
    let stoppers: Arc<Mutex<HashMap<u64, oneshot::Sender<()>>>> = Arc::default();
    let mut signal = std::pin::pin!(signal);
    let next_id = AtomicU64::new(1);
    let mut tasks = tokio::task::JoinSet::new();
    while let Some((stream, peer, permit)) =
        crate::listen::next_connection(&listener, &permits, &mut signal).await
    {
        let (reg, conf) = (Arc::clone(&registry), Arc::clone(&conf));
        let id = next_id.fetch_add(1, Ordering::Relaxed);
        let (stop_tx, stop) = oneshot::channel();
        lock(&stoppers).insert(id, stop_tx);
        let stoppers = Arc::clone(&stoppers);
        tasks.spawn(async move {
            reg.metrics.resp.opened();
            connection(stream, peer.ip(), &reg, &conf, limits, id, stop).await;
            lock(&stoppers).remove(&id);
            reg.metrics.resp.closed();
            drop(permit);
        });
        while tasks.try_join_next().is_some() {}
    }
    drop(listener);
    lock(&stoppers).clear();
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// One connection, to its end.
async fn connection(
    mut stream: tokio::net::TcpStream,
    peer: std::net::IpAddr,
    reg: &Registry,
    conf: &RespConfig,
    limits: Limits,
    id: u64,
    stop: oneshot::Receiver<()>,
) {
    let mut stop = std::pin::pin!(stop);
    let idle = (conf.idle_timeout_secs > 0).then(|| Duration::from_secs(conf.idle_timeout_secs));
    // One timer for the connection, moved on only when it fires early (a
    // timer per read would touch the timer wheel on every command).
    let mut last_read = quanta::Instant::now();
    let idle_timer = tokio::time::sleep(idle.unwrap_or(Duration::from_secs(3600)));
    let mut idle_timer = std::pin::pin!(idle_timer);
    let mut session = Session::new(id, reg.token.is_some(), peer);
    let mut out = Out::new();
    let mut input = BytesMut::with_capacity(16 * 1024);
    let mut parsed = Parsed::default();
    // The buffer length an incomplete command needs before it is parsed
    // again, and whether it waits for a line's end (see `waits`).
    let mut need = 0;
    let mut need_line = false;
    // Replies wait at most this long for a client that does not read.
    let write_bound = idle.unwrap_or(Duration::from_secs(300));
    loop {
        // Every whole command in the buffer, in order, in batches.
        let mut answered = 0;
        let mut need_more = false;
        while answered < conf.max_pipeline && out.buf.len() < FLUSH_AT && !session.close {
            if waits(&input, need, need_line) {
                need_more = true;
                break;
            }
            match frame::parse(&input, &limits, &mut parsed) {
                Ok(Some(used)) => {
                    let n = parsed.args.len();
                    if n > 0 {
                        // Most commands have a few arguments: no allocation.
                        let mut few: [&[u8]; 8] = [&[]; 8];
                        let many: Vec<&[u8]>;
                        let args: &[&[u8]] = if n <= few.len() {
                            for (i, a) in few.iter_mut().take(n).enumerate() {
                                *a = parsed.arg(&input, i);
                            }
                            &few[..n]
                        } else {
                            many = (0..n).map(|i| parsed.arg(&input, i)).collect();
                            &many
                        };
                        execute(reg, &mut session, &mut out, args).await;
                        answered += 1;
                    }
                    input.advance(used);
                    need = 0;
                    need_line = false;
                }
                Ok(None) => {
                    need = parsed.need;
                    need_line = parsed.need_line;
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
            let written = tokio::time::timeout(write_bound, stream.write_all(&out.buf))
                .await
                .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()));
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
        // A buffer a large command grew goes back to its usual size.
        if input.is_empty() && input.capacity() > 4 * FLUSH_AT {
            input = BytesMut::with_capacity(16 * 1024);
        }
        if input.capacity() - input.len() < 4096 {
            input.reserve(16 * 1024);
        }
        // Memory stays bounded: the parser refuses a command over the
        // limits, and nothing is read until the buffer's commands are
        // answered.
        let n = tokio::select! {
            biased;
            // First: a client that never stops sending still stops at
            // shutdown.
            _ = &mut stop => {
                // What was answered reaches the client (no reset).
                linger(&mut stream).await;
                return;
            }
            r = stream.read_buf(&mut input) => r,
            () = &mut idle_timer, if idle.is_some() => {
                let idle = idle.unwrap_or_default();
                if last_read.elapsed() >= idle {
                    tracing::debug!(id, "RESP: idle connection closed");
                    return;
                }
                let left = idle.saturating_sub(last_read.elapsed());
                idle_timer.as_mut().reset(tokio::time::Instant::now() + left);
                continue;
            }
        };
        match n {
            Ok(0) | Err(_) => return,
            Ok(_) => last_read = quanta::Instant::now(),
        }
    }
}

/// Whether an incomplete command cannot be finished by the bytes that
/// arrived since it was last parsed (`need - 1` bytes then): too few for
/// the bulk it waits for, or, waiting for a line's end, no `\n` among
/// them. Past 4 KiB without one it is parsed again anyway, so an
/// over-long line is refused. A command trickled a byte at a time is
/// parsed once per line, not once per byte.
fn waits(input: &[u8], need: usize, need_line: bool) -> bool {
    if input.len() < need {
        return true;
    }
    if !need_line || need == 0 {
        return false;
    }
    let fresh = &input[need - 1..];
    fresh.len() < 4096 && !fresh.contains(&b'\n')
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

#[cfg(test)]
mod tests {
    use super::waits;

    #[test]
    fn an_incomplete_line_waits_for_its_end() {
        // Parsed at 10 bytes, waiting for a line: 5 more without `\n` wait.
        let mut input = vec![b'x'; 15];
        assert!(waits(&input, 11, true));
        input.push(b'\n');
        assert!(!waits(&input, 11, true));
        // 4 KiB without one: parsed again (an over-long line is refused).
        assert!(!waits(&vec![b'x'; 10 + 4096], 11, true));
        // A bulk waits for its length only.
        assert!(waits(&[0; 99], 100, false));
        assert!(!waits(&[0; 100], 100, false));
        assert!(!waits(&[], 0, false));
    }
}
