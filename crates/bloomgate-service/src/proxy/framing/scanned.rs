//! The connection as hyper reads it: every byte through the
//! [`Scanner`], a head held back until it is whole, and the cut before a
//! refused one, whose JSON answer goes out as the connection shuts down.

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::{answer_bytes, Cut, Scanner, State, TOO_LARGE};

/// A connection read through a [`Scanner`].
///
/// A head not yet complete is held back from hyper until the scan has
/// read it whole, so hyper never holds part of a head the scan refuses:
/// at a refusal, what hyper has is whole requests, which it answers
/// before it closes.
#[derive(Debug)]
pub struct Scanned {
    inner: tokio::net::TcpStream,
    scanner: Scanner,
    /// Bytes read and scanned, not yet given to hyper: the first `ready`
    /// of them judged, the rest the start of a head still incomplete.
    pending: Vec<u8>,
    ready: usize,
    /// What reads give once `pending` is given.
    after: After,
    /// The answer to the refused head, and how much of it went out:
    /// written as hyper shuts the connection down.
    answer: Option<(Vec<u8>, usize)>,
    /// After the answer: our half is shut, then what the client still
    /// sends is read and dropped until it closes, so the close is not a
    /// reset (which may discard the answer before the client reads it).
    linger: Linger,
    /// Bytes dropped so, after the cut.
    dropped: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Linger {
    No,
    /// Our half to shut.
    Shut,
    /// The client's end to await.
    Drain,
}

/// The most a cut connection reads and drops before it closes anyway.
const MAX_DROPPED: usize = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum After {
    /// More of the client's bytes.
    Bytes,
    /// Nothing ever (cut before a refused head): the connection's task
    /// asks hyper to close after the requests before it.
    Nothing,
    /// The end of the stream (the client's).
    End,
    /// Nothing ever, and the client's half has ended (or it sent more
    /// than is read after a cut): the socket is not read again.
    Quiet,
}

impl Scanned {
    /// `inner`, each byte read also fed to `scanner`.
    pub fn new(inner: tokio::net::TcpStream, scanner: Scanner) -> Self {
        Self {
            inner,
            scanner,
            pending: Vec::new(),
            ready: 0,
            after: After::Bytes,
            answer: None,
            linger: Linger::No,
            dropped: 0,
        }
    }

    /// Reads and drops what the client sends after the cut: `Ready` at
    /// its end (or an error, or past [`MAX_DROPPED`]).
    fn drop_input(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let mut sink = [0u8; 4096];
        loop {
            let mut rb = ReadBuf::new(&mut sink);
            match Pin::new(&mut self.inner).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) if !rb.filled().is_empty() => {
                    self.dropped += rb.filled().len();
                    if self.dropped > MAX_DROPPED {
                        return Poll::Ready(Ok(()));
                    }
                }
                other => return other,
            }
        }
    }

    /// Cuts the connection before the refused head: nothing more is
    /// read, and the connection's task is told.
    fn cut(&mut self) {
        let refused = self.scanner.take_cut().unwrap_or(TOO_LARGE);
        self.answer = Some((answer_bytes(refused), 0));
        self.after = After::Nothing;
        self.scanner
            .verdicts
            .0
            .was_cut
            .store(true, Ordering::SeqCst);
        self.scanner.verdicts.0.cut.notify_one();
    }

    /// Reads into `buf` straight from the socket (nothing is pending):
    /// `None` when all it read was held back (read again).
    fn read_direct(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Option<Poll<std::io::Result<()>>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let read = buf.filled().len() - before;
        if !matches!(polled, Poll::Ready(Ok(()))) || read == 0 {
            return Some(polled);
        }
        match self.scanner.feed(&buf.filled()[before..]) {
            Some(cut) => {
                let at = match cut {
                    Cut::At(at) => at,
                    // Nothing was held, so no head began earlier.
                    Cut::Earlier => 0,
                };
                buf.set_filled(before + at);
                self.cut();
                // With nothing to give, hyper waits for the task.
                Some(if at == 0 { Poll::Pending } else { polled })
            }
            None => {
                let held = self.scanner.partial_len().min(read);
                let end = before + read;
                self.pending
                    .extend_from_slice(&buf.filled()[end - held..end]);
                buf.set_filled(end - held);
                (held < read).then_some(polled)
            }
        }
    }

    /// Reads after the held bytes; `Some` only for a wait or an error.
    fn read_after_held(&mut self, cx: &mut Context<'_>) -> Option<Poll<std::io::Result<()>>> {
        let held = self.pending.len();
        let mut chunk = [0u8; 8192];
        let mut rb = ReadBuf::new(&mut chunk);
        match Pin::new(&mut self.inner).poll_read(cx, &mut rb) {
            Poll::Ready(Ok(())) => {}
            other => return Some(other),
        }
        let new = rb.filled();
        if new.is_empty() {
            // The client ended mid-head: the scan judges what there is (a
            // malformed line gets the gate's answer); else hyper gets it.
            if self.scanner.finish() {
                self.pending.clear();
                self.cut();
                return None;
            }
            self.ready = held;
            self.after = After::End;
            return None;
        }
        self.pending.extend_from_slice(new);
        match self.scanner.feed(&self.pending[held..]) {
            // The held head is refused: hyper gets none of it.
            Some(Cut::Earlier) => {
                self.pending.clear();
                self.cut();
            }
            Some(Cut::At(at)) => {
                self.pending.truncate(held + at);
                self.ready = held + at;
                self.cut();
            }
            None => self.ready = self.pending.len() - self.scanner.partial_len(),
        }
        None
    }
}

impl AsyncRead for Scanned {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.ready > 0 {
                let n = this.ready.min(buf.remaining());
                buf.put_slice(&this.pending[..n]);
                this.pending.drain(..n);
                this.ready -= n;
                return Poll::Ready(Ok(()));
            }
            match this.after {
                After::Bytes => {}
                // The connection's task was told (`Verdicts::cut`): hyper
                // is asked to close, and woken by that. What the client
                // sends meanwhile is dropped; an error (a reset: the
                // client is gone) is passed on, cancelling a request in
                // flight, but not its end: a client that only shut its
                // half (`nc`) still reads the answers.
                After::Nothing => {
                    return match this.drop_input(cx) {
                        Poll::Ready(Ok(())) => {
                            this.after = After::Quiet;
                            Poll::Pending
                        }
                        other => other,
                    }
                }
                After::Quiet => return Poll::Pending,
                After::End => return Poll::Ready(Ok(())),
            }
            if this.pending.is_empty() {
                if matches!(this.scanner.state, State::Done) {
                    return Pin::new(&mut this.inner).poll_read(cx, buf);
                }
                if let Some(polled) = this.read_direct(cx, buf) {
                    return polled;
                }
            } else if let Some(polled) = this.read_after_held(cx) {
                return polled;
            }
        }
    }
}

impl AsyncWrite for Scanned {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if this.answer.is_some() && this.scanner.verdicts.undispatched() > 0 {
            // hyper closes without a clean request it was given (one
            // before it asked to close): the answer would read as that
            // request's, so none is sent.
            this.answer = None;
        }
        while let Some((answer, sent)) = &mut this.answer {
            match Pin::new(&mut this.inner).poll_write(cx, &answer[*sent..]) {
                Poll::Ready(Ok(n)) if n > 0 && *sent + n < answer.len() => *sent += n,
                // All of it, or a client that is gone.
                Poll::Ready(_) => {
                    this.answer = None;
                    this.linger = Linger::Shut;
                }
                Poll::Pending => return Poll::Pending,
            }
        }
        // Our half first (the answer is all there is), then the client's
        // end is awaited, bounded by the idle timeout (`WriteIdle`) and
        // by `MAX_DROPPED`.
        if this.linger == Linger::Shut {
            std::task::ready!(Pin::new(&mut this.inner).poll_shutdown(cx))?;
            this.linger = Linger::Drain;
        }
        if this.linger == Linger::Drain {
            let _ = std::task::ready!(this.drop_input(cx));
            this.linger = Linger::No;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
