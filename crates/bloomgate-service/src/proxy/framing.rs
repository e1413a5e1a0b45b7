//! What hyper forgives and a proxy must refuse: a request with both
//! `Content-Length` and `Transfer-Encoding`, or with `Content-Length`
//! twice. hyper reads such a request safely (the `Transfer-Encoding`
//! wins, an equal second length is dropped) but hides that it came, so
//! the connection is read here too, head by head, with the same parser
//! (`httparse`), and each head's verdict is queued for its request.
//!
//! The scan follows the framing of clean requests (a length, chunks) to
//! find the next head. It stops for good, leaving every later request
//! unjudged (clean), at a head it refuses (that answer closes the
//! connection), at an upgrade (the bytes after are another protocol), and
//! at anything hyper itself will refuse (a head too large or malformed).

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::sync::lock;

/// Why a head is refused, and the status that says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    /// 400 (smuggling) or 431 (a head over the limit).
    pub status: u16,
    /// Why, for the answer's message.
    pub why: &'static str,
}

const BOTH: Refused = Refused {
    status: 400,
    why: "request smuggling refused: both Content-Length and Transfer-Encoding",
};
const TWICE: Refused = Refused {
    status: 400,
    why: "request smuggling refused: Content-Length more than once",
};
const TOO_LARGE: Refused = Refused {
    status: 431,
    why: "the request head is larger than gate.max_header_bytes",
};

/// What the scan says of a request's head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Head {
    /// Read and clean.
    Clean,
    /// Not read: the scan had stopped (an upgrade, a `CONNECT`, framing
    /// it could not follow). Served, and the connection closed after it.
    Unscanned,
    /// Refused.
    Refused(Refused),
}

#[derive(Debug, Default)]
struct Queue {
    /// Each head's verdict, oldest first (`None`: clean).
    heads: VecDeque<Option<Refused>>,
    /// The scan has stopped: later heads are not read.
    stopped: bool,
}

/// The verdicts of a connection's heads.
#[derive(Debug, Default, Clone)]
pub struct Verdicts(Arc<Mutex<Queue>>);

impl Verdicts {
    /// The verdict of the next request's head.
    #[must_use]
    pub fn next(&self) -> Head {
        match lock(&self.0).heads.pop_front() {
            Some(Some(r)) => Head::Refused(r),
            Some(None) => Head::Clean,
            // A head the scan did not read (it stopped, or never saw it).
            None => Head::Unscanned,
        }
    }

    fn push(&self, v: Option<Refused>) {
        lock(&self.0).heads.push_back(v);
    }

    fn stop(&self) {
        lock(&self.0).stopped = true;
    }
}

#[derive(Debug)]
enum State {
    /// Reading a request head (the bytes so far).
    Head(Vec<u8>),
    /// Inside a body of this many more bytes.
    Length(u64),
    /// Inside a chunked body.
    Chunks(Chunk),
    /// Not scanning any more.
    Done,
}

#[derive(Debug)]
enum Chunk {
    /// Reading a size line (the bytes so far).
    Size(Vec<u8>),
    /// Inside chunk data, then its CRLF: bytes left.
    Data(u64),
    /// Reading trailer lines; the bytes of the line so far.
    Trailer(Vec<u8>),
}

/// Longest chunk-size or trailer line followed (above hyper's 16 KiB
/// limits on chunk extensions and trailers).
const MAX_LINE: usize = 64 * 1024;

/// The scanner of one connection.
#[derive(Debug)]
pub struct Scanner {
    state: State,
    max_head: usize,
    max_headers: usize,
    verdicts: Verdicts,
}

impl Scanner {
    /// A scanner whose heads are at most `max_head` bytes and
    /// `max_headers` headers (hyper's own limits).
    #[must_use]
    pub fn new(max_head: usize, max_headers: usize) -> (Self, Verdicts) {
        let verdicts = Verdicts::default();
        (
            Self {
                state: State::Head(Vec::new()),
                max_head,
                max_headers,
                verdicts: verdicts.clone(),
            },
            verdicts,
        )
    }

    /// Stops the scan for good.
    fn done(&mut self) {
        self.state = State::Done;
        self.verdicts.stop();
    }

    /// Reads `bytes`, the next the connection received.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let used = match &mut self.state {
                State::Done => return,
                State::Head(buf) => {
                    if buf.is_empty() {
                        // Usually a whole head in one read: parsed in place.
                        match self.head(bytes) {
                            Some(used) => used,
                            None => {
                                if let State::Head(buf) = &mut self.state {
                                    buf.extend_from_slice(bytes);
                                }
                                bytes.len()
                            }
                        }
                    } else {
                        let before = buf.len();
                        let mut joined = std::mem::take(buf);
                        joined.extend_from_slice(bytes);
                        match self.head(&joined) {
                            Some(used) => used.saturating_sub(before),
                            None => {
                                if let State::Head(buf) = &mut self.state {
                                    *buf = joined;
                                }
                                bytes.len()
                            }
                        }
                    }
                }
                State::Length(left) => {
                    let n = (*left).min(bytes.len() as u64);
                    *left -= n;
                    if *left == 0 {
                        self.state = State::Head(Vec::new());
                    }
                    n as usize
                }
                State::Chunks(chunk) => match chunk_step(chunk, bytes) {
                    Step::Used(n) => n,
                    Step::End(n) => {
                        self.state = State::Head(Vec::new());
                        n
                    }
                    Step::Lost => {
                        self.done();
                        return;
                    }
                },
            };
            bytes = &bytes[used..];
        }
    }

    /// Parses a head at the start of `bytes`: the bytes it used, or
    /// `None` while it is incomplete (the state moves on either way, to
    /// `Done` for a head hyper refuses).
    fn head(&mut self, bytes: &[u8]) -> Option<usize> {
        // Most heads fit the stack's array, left uninitialised (httparse
        // writes what it reads): no allocation and no 4 KiB fill per head.
        let mut stack = [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; 128];
        let mut heap = Vec::new();
        let headers = if self.max_headers <= stack.len() {
            &mut stack[..self.max_headers]
        } else {
            heap.resize_with(self.max_headers, std::mem::MaybeUninit::uninit);
            &mut heap[..]
        };
        let mut req = httparse::Request::new(&mut []);
        match req.parse_with_uninit_headers(bytes, headers) {
            Ok(httparse::Status::Complete(used)) => {
                let (mut lengths, mut chunked, mut te, mut upgrade) = (0, false, false, false);
                let mut length = 0u64;
                for h in req.headers.iter() {
                    if h.name.eq_ignore_ascii_case("content-length") {
                        lengths += 1;
                        length = std::str::from_utf8(h.value)
                            .ok()
                            .and_then(|v| v.trim().parse().ok())
                            .unwrap_or(0);
                    } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                        te = true;
                        chunked =
                            h.value.rsplit(|&b| b == b',').next().is_some_and(|last| {
                                last.trim_ascii().eq_ignore_ascii_case(b"chunked")
                            });
                    } else if h.name.eq_ignore_ascii_case("upgrade") {
                        upgrade = true;
                    }
                }
                let verdict = if used > self.max_head {
                    Some(TOO_LARGE)
                } else if lengths > 0 && te {
                    Some(BOTH)
                } else if lengths > 1 {
                    Some(TWICE)
                } else {
                    None
                };
                self.verdicts.push(verdict);
                let connect = req.method == Some("CONNECT");
                if verdict.is_some() || upgrade || connect || (te && !chunked) {
                    self.done();
                    return Some(used);
                }
                self.state = if te {
                    State::Chunks(Chunk::Size(Vec::new()))
                } else if length > 0 {
                    State::Length(length)
                } else {
                    State::Head(Vec::new())
                };
                Some(used)
            }
            Ok(httparse::Status::Partial) if bytes.len() <= self.max_head => None,
            Ok(httparse::Status::Partial) => {
                // Over the limit: refused here if hyper does not refuse it
                // first (the connection ends either way).
                self.verdicts.push(Some(TOO_LARGE));
                self.done();
                Some(bytes.len())
            }
            _ => {
                self.done();
                Some(bytes.len())
            }
        }
    }
}

enum Step {
    Used(usize),
    End(usize),
    Lost,
}

/// Adds `bytes` up to a line's end to `line`: `Ok` with the end's index
/// in `bytes`, or the step when the line goes on (all used) or grew past
/// [`MAX_LINE`] (lost).
fn line_end(line: &mut Vec<u8>, bytes: &[u8]) -> Result<usize, Step> {
    let Some(nl) = bytes.iter().position(|&b| b == b'\n') else {
        line.extend_from_slice(bytes);
        return Err(if line.len() > MAX_LINE {
            Step::Lost
        } else {
            Step::Used(bytes.len())
        });
    };
    line.extend_from_slice(&bytes[..nl]);
    Ok(nl)
}

fn chunk_step(chunk: &mut Chunk, bytes: &[u8]) -> Step {
    match chunk {
        Chunk::Size(line) => {
            let nl = match line_end(line, bytes) {
                Ok(nl) => nl,
                Err(step) => return step,
            };
            let digits: &[u8] = line.split(|&b| b == b';').next().unwrap_or(&[]);
            let size = std::str::from_utf8(digits)
                .ok()
                .and_then(|d| u64::from_str_radix(d.trim(), 16).ok());
            *chunk = match size {
                None => return Step::Lost,
                Some(0) => Chunk::Trailer(Vec::new()),
                // The data, then its CRLF.
                Some(n) => Chunk::Data(n.saturating_add(2)),
            };
            Step::Used(nl + 1)
        }
        Chunk::Data(left) => {
            let n = (*left).min(bytes.len() as u64);
            *left -= n;
            if *left == 0 {
                *chunk = Chunk::Size(Vec::new());
            }
            Step::Used(n as usize)
        }
        Chunk::Trailer(line) => {
            let nl = match line_end(line, bytes) {
                Ok(nl) => nl,
                Err(step) => return step,
            };
            // hyper ends a trailer line only at CRLF; a bare LF is not a
            // line's end to it, so the scan cannot follow: it stops.
            if line.last() != Some(&b'\r') {
                return Step::Lost;
            }
            let empty = line.len() == 1;
            line.clear();
            if empty {
                Step::End(nl + 1)
            } else {
                Step::Used(nl + 1)
            }
        }
    }
}

/// A connection read through a [`Scanner`].
#[derive(Debug)]
pub struct Scanned<T> {
    inner: T,
    scanner: Scanner,
}

impl<T> Scanned<T> {
    /// `inner`, each byte read also fed to `scanner`.
    pub fn new(inner: T, scanner: Scanner) -> Self {
        Self { inner, scanner }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Scanned<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            if !matches!(this.scanner.state, State::Done) {
                this.scanner.feed(&buf.filled()[before..]);
            }
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Scanned<T> {
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
        Pin::new(&mut self.inner).poll_shutdown(cx)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The verdicts of a byte stream fed in pieces of `step` bytes.
    fn verdicts(stream: &[u8], step: usize) -> Vec<Option<Refused>> {
        let (mut s, v) = Scanner::new(64 * 1024, 100);
        for piece in stream.chunks(step) {
            s.feed(piece);
        }
        let mut out = Vec::new();
        while let Some(x) = lock(&v.0).heads.pop_front() {
            out.push(x);
        }
        out
    }

    #[test]
    fn each_head_is_judged_across_bodies_in_any_pieces() {
        let stream = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n\
            POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello\
            POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
            3;ext=1\r\nabc\r\n0\r\nX-T: 1\r\n\r\n\
            POST /d HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nz\
            GET /e HTTP/1.1\r\n\r\n";
        for step in [1, 2, 7, 64, stream.len()] {
            assert_eq!(
                verdicts(stream, step),
                [None, None, None, Some(TWICE)],
                "pieces of {step}"
            );
        }
    }

    #[test]
    fn length_with_chunked_is_refused_either_order() {
        for head in [
            &b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
        ] {
            assert_eq!(verdicts(head, 5), [Some(BOTH)]);
        }
    }

    #[test]
    fn a_body_that_looks_like_a_head_is_not_one() {
        let stream = b"POST / HTTP/1.1\r\nContent-Length: 56\r\n\r\n\
            GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n\
            GET / HTTP/1.1\r\n\r\n";
        assert_eq!(verdicts(stream, 3), [None, None]);
    }

    #[test]
    fn a_head_over_the_limit_is_refused_whole_or_in_pieces() {
        let big = format!("GET / HTTP/1.1\r\nX-Big: {}\r\n\r\n", "b".repeat(300));
        let (mut s, v) = Scanner::new(256, 100);
        s.feed(big.as_bytes());
        assert_eq!(v.next(), Head::Refused(TOO_LARGE));
        let (mut s, v) = Scanner::new(256, 100);
        for piece in big.as_bytes().chunks(100) {
            s.feed(piece);
        }
        assert_eq!(v.next(), Head::Refused(TOO_LARGE));
    }

    #[test]
    fn after_an_upgrade_or_a_bare_lf_trailer_later_heads_are_unscanned() {
        let (mut s, v) = Scanner::new(64 * 1024, 100);
        s.feed(
            b"GET /ws HTTP/1.1\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\nGET / HTTP/1.1\r\n\r\n",
        );
        assert_eq!(v.next(), Head::Clean);
        assert_eq!(v.next(), Head::Unscanned);
        // A trailer ended by a bare LF: hyper reads on as trailer, the
        // scan cannot follow, so what follows is not judged clean.
        let (mut s, v) = Scanner::new(64 * 1024, 100);
        s.feed(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\nGET /fake HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n");
        assert_eq!(v.next(), Head::Clean);
        assert_eq!(v.next(), Head::Unscanned);
    }
}
