//! What hyper forgives and a proxy must refuse: a request with both
//! `Content-Length` and `Transfer-Encoding`, or with `Content-Length`
//! twice. hyper reads such a request safely (the `Transfer-Encoding`
//! wins, an equal second length is dropped) but hides that it came, so
//! the connection is read here too, head by head, with the same parser
//! (`httparse`, hyper's settings), and each clean head is counted for its
//! request.
//!
//! The scan follows the framing of clean requests (a length, chunks) to
//! find the next head. It stops for good, leaving every later request
//! unscanned, at an upgrade (the bytes after are another protocol), and
//! at a head it refuses: smuggling, a head over the limit, and anything
//! hyper itself would refuse (malformed; hyper answers that with a bare
//! status and no body). hyper never sees a refused head: the connection
//! is cut where it begins ([`Scanned`] reads nothing more and tells the
//! connection's task, which lets hyper finish the requests before it and
//! close), and the gate's own JSON answer goes out before the socket
//! closes.

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

/// The answer to a head httparse (hyper's parser, with hyper's settings)
/// refuses.
fn malformed(e: httparse::Error) -> Refused {
    let why = match e {
        httparse::Error::TooManyHeaders => {
            return Refused {
                status: 431,
                why: "the request has more headers than gate.max_headers",
            }
        }
        httparse::Error::HeaderName => "malformed request head: an invalid header name",
        httparse::Error::HeaderValue => {
            "malformed request head: an invalid header value (or a folded line)"
        }
        httparse::Error::NewLine => "malformed request head: an invalid line ending",
        httparse::Error::Version => "malformed request head: an invalid HTTP version",
        httparse::Error::Token | httparse::Error::Status => {
            "malformed request head: an invalid method or target"
        }
    };
    Refused { status: 400, why }
}

/// What the scan says of a request's head (a refused one never reaches
/// hyper).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Head {
    /// Read and clean.
    Clean,
    /// Not read: the scan had stopped (an upgrade, a `CONNECT`, framing
    /// it could not follow). Served, and the connection closed after it.
    Unscanned,
}

#[derive(Debug, Default)]
struct Shared {
    /// Heads read clean and not yet dispatched by hyper.
    clean: Mutex<usize>,
    /// Notified once, when the connection is cut before a head.
    cut: tokio::sync::Notify,
}

/// The verdicts of a connection's heads.
#[derive(Debug, Default, Clone)]
pub struct Verdicts(Arc<Shared>);

impl Verdicts {
    /// The verdict of the next request's head.
    #[must_use]
    pub fn next(&self) -> Head {
        let mut clean = lock(&self.0.clean);
        if *clean == 0 {
            // A head the scan did not read (it stopped, or never saw it).
            return Head::Unscanned;
        }
        *clean -= 1;
        Head::Clean
    }

    /// Resolves once the connection is cut before a head hyper would
    /// refuse: the connection should close after the requests before it
    /// (hyper's `graceful_shutdown`), the gate's answer to that head
    /// going out as it shuts down.
    pub async fn cut(&self) {
        self.0.cut.notified().await;
    }

    fn push_clean(&self) {
        *lock(&self.0.clean) += 1;
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

/// Where a refused head begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// At this offset in the bytes just read.
    At(usize),
    /// In an earlier read: hyper holds its first part.
    Earlier,
}

/// The scanner of one connection.
#[derive(Debug)]
pub struct Scanner {
    state: State,
    max_head: usize,
    max_headers: usize,
    verdicts: Verdicts,
    /// A head hyper would refuse, and the answer it gets instead.
    cut: Option<Refused>,
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
                cut: None,
            },
            verdicts,
        )
    }

    /// Stops the scan for good.
    fn done(&mut self) {
        self.state = State::Done;
    }

    /// Stops the scan at a head it refuses.
    fn refuse(&mut self, refused: Refused) {
        self.cut = Some(refused);
        self.done();
    }

    /// Reads `bytes`, the next the connection received. `Some(cut)` when
    /// a refused head begins in them, or began in an earlier read: the
    /// connection is cut there, and [`Scanner::take_cut`] says what that
    /// head is answered.
    pub fn feed(&mut self, bytes: &[u8]) -> Option<Cut> {
        let total = bytes.len();
        let mut bytes = bytes;
        while !bytes.is_empty() {
            let at = total - bytes.len();
            let used = match &mut self.state {
                State::Done => return None,
                State::Head(buf) => {
                    let begins = if buf.is_empty() {
                        Cut::At(at)
                    } else {
                        Cut::Earlier
                    };
                    let used = if buf.is_empty() {
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
                    };
                    if self.cut.is_some() {
                        return Some(begins);
                    }
                    used
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
                        return None;
                    }
                },
            };
            bytes = &bytes[used..];
        }
        None
    }

    /// The answer to the head the connection was cut before, once.
    pub fn take_cut(&mut self) -> Option<Refused> {
        self.cut.take()
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
                if let Some(refused) = verdict {
                    self.refuse(refused);
                    return Some(used);
                }
                self.verdicts.push_clean();
                let connect = req.method == Some("CONNECT");
                if upgrade || connect || (te && !chunked) {
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
                // Over the limit and still incomplete: hyper would refuse
                // it with a bare 431 (past its buffer) or wait for it.
                self.refuse(TOO_LARGE);
                Some(bytes.len())
            }
            Err(e) => {
                self.refuse(malformed(e));
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
pub struct Scanned {
    inner: tokio::net::TcpStream,
    scanner: Scanner,
    /// What reads give once the connection is cut.
    after: After,
    /// The answer to the refused head, and how much of it went out:
    /// written as hyper shuts the connection down, or, if hyper ends it
    /// with an error instead, as much as the socket takes at once when
    /// the connection is dropped.
    answer: Option<(Vec<u8>, usize)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum After {
    /// Not cut.
    Bytes,
    /// Nothing ever: the connection's task asks hyper to close after the
    /// requests before the cut.
    Nothing,
    /// The end of the stream: hyper holds part of the refused head, which
    /// it cannot finish, so it ends the connection (after the requests
    /// before it).
    End,
}

impl Scanned {
    /// `inner`, each byte read also fed to `scanner`.
    pub fn new(inner: tokio::net::TcpStream, scanner: Scanner) -> Self {
        Self {
            inner,
            scanner,
            after: After::Bytes,
            answer: None,
        }
    }
}

impl Drop for Scanned {
    fn drop(&mut self) {
        if let Some((answer, sent)) = &self.answer {
            let _ = self.inner.try_write(&answer[*sent..]);
        }
    }
}

/// The gate's JSON answer to a head refused before hyper read it, whole
/// on the wire (the connection closes after it).
fn answer_bytes(refused: Refused) -> Vec<u8> {
    let code = if refused.status == 431 {
        "header_too_large"
    } else {
        "bad_request"
    };
    let body = serde_json::json!({ "error": code, "message": refused.why }).to_string();
    let reason = if refused.status == 431 {
        "Request Header Fields Too Large"
    } else {
        "Bad Request"
    };
    format!(
        "HTTP/1.1 {} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        refused.status,
        body.len()
    )
    .into_bytes()
}

impl AsyncRead for Scanned {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        match this.after {
            After::Bytes => {}
            // The connection's task was told (`Verdicts::cut`): hyper is
            // asked to close, and is woken by that.
            After::Nothing => return Poll::Pending,
            After::End => return Poll::Ready(Ok(())),
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            if !matches!(this.scanner.state, State::Done) {
                if let Some(cut) = this.scanner.feed(&buf.filled()[before..]) {
                    let refused = this.scanner.take_cut().unwrap_or(TOO_LARGE);
                    this.answer = Some((answer_bytes(refused), 0));
                    this.scanner.verdicts.0.cut.notify_one();
                    match cut {
                        Cut::Earlier => {
                            buf.set_filled(before);
                            this.after = After::End;
                        }
                        Cut::At(at) => {
                            buf.set_filled(before + at);
                            this.after = After::Nothing;
                            if at == 0 {
                                return Poll::Pending;
                            }
                        }
                    }
                }
            }
        }
        polled
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
        while let Some((answer, sent)) = &mut this.answer {
            match Pin::new(&mut this.inner).poll_write(cx, &answer[*sent..]) {
                Poll::Ready(Ok(n)) if n > 0 && *sent + n < answer.len() => *sent += n,
                // All of it, or a client that is gone: the socket closes.
                Poll::Ready(_) => this.answer = None,
                Poll::Pending => return Poll::Pending,
            }
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

#[cfg(test)]
mod tests;
