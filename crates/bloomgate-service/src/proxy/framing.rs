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

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

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
const BAD_LENGTH: Refused = Refused {
    status: 400,
    why: "an invalid Content-Length (one decimal number, please)",
};
const NOT_CHUNKED: Refused = Refused {
    status: 400,
    why: "a Transfer-Encoding that does not end in chunked",
};
const TE_ON_1_0: Refused = Refused {
    status: 400,
    why: "Transfer-Encoding on an HTTP/1.0 request",
};
const BAD_TARGET: Refused = Refused {
    status: 400,
    why: "malformed request head: an invalid target",
};
const TOO_LARGE: Refused = Refused {
    status: 431,
    why: "the request head is larger than gate.max_header_bytes",
};

/// A target `http::Uri` takes for certain: an origin-form path and query
/// of unreserved, sub-delimiter and percent bytes (checked without the
/// copy `Uri` parsing makes).
fn plain_target(target: &str) -> bool {
    target.starts_with('/')
        && target
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/%?".contains(&b))
}

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
    /// Notified when `clean` falls to 0.
    dispatched: tokio::sync::Notify,
    /// Notified once, when the connection is cut before a head.
    cut: tokio::sync::Notify,
    /// Whether it was.
    was_cut: AtomicBool,
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
        if *clean == 0 {
            self.0.dispatched.notify_one();
        }
        Head::Clean
    }

    /// Resolves once the connection is cut before a refused head and
    /// hyper has taken every clean request before it: the connection
    /// should close after those (hyper's `graceful_shutdown`; asked
    /// sooner, hyper would drop the ones it has not started), the gate's
    /// answer to that head going out as it shuts down.
    pub async fn cut(&self) {
        self.0.cut.notified().await;
        while *lock(&self.0.clean) > 0 {
            self.0.dispatched.notified().await;
        }
    }

    /// Heads read clean that hyper has not taken yet.
    fn undispatched(&self) -> usize {
        *lock(&self.0.clean)
    }

    /// Whether the connection was cut before a refused head.
    #[must_use]
    pub fn was_cut(&self) -> bool {
        self.0.was_cut.load(Ordering::SeqCst)
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
    /// Bytes handed to httparse so far: a partial head is parsed again
    /// only once its end (an empty line) has come, so this grows with
    /// what the client sent, not with the square of it.
    parsed: u64,
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
                parsed: 0,
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
                                // Empty lines before a request line are
                                // skipped (httparse does too): what is held
                                // starts at the request line, so its first
                                // empty line ends the head (`ends_a_head`),
                                // and line ends alone are never held.
                                let start = bytes
                                    .iter()
                                    .position(|b| !matches!(b, b'\r' | b'\n'))
                                    .unwrap_or(bytes.len());
                                if let State::Head(buf) = &mut self.state {
                                    buf.extend_from_slice(&bytes[start..]);
                                }
                                bytes.len()
                            }
                        }
                    } else if !ends_a_head(buf, bytes) && buf.len() + bytes.len() < self.max_head {
                        // Still no empty line, and under the limit: what
                        // came is kept without parsing the head again (a
                        // head sent a byte at a time would cost the square
                        // of its length).
                        buf.extend_from_slice(bytes);
                        bytes.len()
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

    /// The client ended the connection with a partial head held: judges
    /// it as it stands, so a head hyper would refuse (a malformed line
    /// sent after the first read) gets the gate's answer, not hyper's.
    /// `true` when it is refused (see [`Scanner::take_cut`]).
    pub fn finish(&mut self) -> bool {
        let State::Head(buf) = &mut self.state else {
            return false;
        };
        if buf.is_empty() {
            return false;
        }
        let held = std::mem::take(buf);
        let _ = self.head(&held);
        self.cut.is_some()
    }

    /// Bytes handed to httparse since the scanner began.
    #[must_use]
    pub fn parsed(&self) -> u64 {
        self.parsed
    }

    /// The bytes of a head begun and not yet complete.
    fn partial_len(&self) -> usize {
        match &self.state {
            State::Head(buf) => buf.len(),
            _ => 0,
        }
    }

    /// Parses a head at the start of `bytes`: the bytes it used, or
    /// `None` while it is incomplete (the state moves on either way, to
    /// `Done` for a head hyper refuses).
    fn head(&mut self, bytes: &[u8]) -> Option<usize> {
        self.parsed += bytes.len() as u64;
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
                let mut length = Some(0u64);
                for h in req.headers.iter() {
                    if h.name.eq_ignore_ascii_case("content-length") {
                        lengths += 1;
                        // Digits alone (hyper also takes a list of equal
                        // numbers; a proxy need not).
                        let digits = h.value.trim_ascii();
                        length = std::str::from_utf8(digits)
                            .ok()
                            .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
                            .and_then(|d| d.parse().ok())
                            // hyper's largest (two values mean "chunked"
                            // and "to the end" to it).
                            .filter(|&n: &u64| n <= u64::MAX - 2);
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
                } else if length.is_none() {
                    Some(BAD_LENGTH)
                } else if te && req.version == Some(0) {
                    Some(TE_ON_1_0)
                } else if te && !chunked {
                    Some(NOT_CHUNKED)
                } else if req
                    .path
                    .is_none_or(|p| !plain_target(p) && hyper::Uri::try_from(p).is_err())
                {
                    // What hyper would refuse after httparse took it.
                    Some(BAD_TARGET)
                } else {
                    None
                };
                let length = length.unwrap_or(0);
                if let Some(refused) = verdict {
                    self.refuse(refused);
                    return Some(used);
                }
                self.verdicts.push_clean();
                let connect = req.method == Some("CONNECT");
                if upgrade || connect {
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
            // hyper refuses a head still incomplete at its buffer's size.
            Ok(httparse::Status::Partial) if bytes.len() < self.max_head => None,
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

/// Whether `more`, read after the partial head `held`, brings an empty
/// line (`\n\n`, or `\n\r\n`: httparse takes bare line feeds too), looked
/// for only where it can newly be: the last two bytes held and `more`.
fn ends_a_head(held: &[u8], more: &[u8]) -> bool {
    let tail = &held[held.len().saturating_sub(2)..];
    let (mut before, mut last) = (0u8, 0u8);
    for &b in tail.iter().chain(more) {
        if b == b'\n' && (last == b'\n' || (last == b'\r' && before == b'\n')) {
            return true;
        }
        (before, last) = (last, b);
    }
    false
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

mod scanned;
pub use scanned::Scanned;

#[cfg(test)]
mod tests;
