//! The request side of RESP: a command is an array of bulk strings
//! (`*2\r\n$4\r\nPING\r\n$2\r\nhi\r\n`) or an inline line (`PING hi\r\n`),
//! as Redis reads them. Limits are checked on the declared sizes, before
//! anything is kept, so a hostile length costs nothing; the arguments are
//! ranges into the caller's buffer (no copy, no allocation once the
//! range vector has grown).

use std::ops::Range;

/// Longest inline command or header line (Redis's `PROTO_INLINE_MAX_SIZE`).
pub const MAX_LINE: usize = 64 * 1024;

/// What one connection may send.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Longest argument, bytes.
    pub max_bulk: usize,
    /// Most arguments of one command.
    pub max_args: usize,
    /// Most bytes of one command.
    pub max_request: usize,
}

/// A frame that breaks the protocol or a limit: the connection answers
/// `-ERR Protocol error: …` and is closed, as Redis does.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// A multibulk count that is not a number or is over `max_args`.
    #[error("invalid multibulk length")]
    MultibulkLength,
    /// A bulk length that is not a number, negative or over `max_bulk`.
    #[error("invalid bulk length")]
    BulkLength,
    /// An element of a command that is not a bulk string.
    #[error("expected '$', got '{0}'")]
    ExpectedBulk(char),
    /// A bulk string not followed by CRLF.
    #[error("bulk string not terminated by CRLF")]
    Unterminated,
    /// A header or inline line longer than [`MAX_LINE`].
    #[error("too big inline request")]
    LineTooLong,
    /// A command over `max_request` bytes.
    #[error("request larger than resp.max_request_bytes")]
    RequestTooLarge,
    /// An inline command with an open quote.
    #[error("unbalanced quotes in request")]
    UnbalancedQuotes,
}

/// One parsed command: its arguments are `args` (ranges into the buffer
/// that was parsed), and it took `consumed` bytes. No arguments: an empty
/// line or `*0`, which is skipped.
#[derive(Debug, Default)]
pub struct Parsed {
    /// The arguments' byte ranges.
    pub args: Vec<Range<usize>>,
    /// Inline arguments unquoted into bytes of their own (rare: only
    /// inline commands with quotes), which `args` then index past the
    /// buffer's end: see [`Parsed::arg`].
    pub unquoted: Vec<u8>,
    /// After an incomplete parse: the buffer length below which parsing
    /// again cannot finish the command (the caller reads until then, so
    /// a command sent a byte at a time is not parsed again per byte).
    pub need: usize,
    /// After an incomplete parse: whether it waits for the end of a line
    /// (a header or an inline command), which only a `\n` read from
    /// `need - 1` on brings.
    pub need_line: bool,
}

impl Parsed {
    /// Argument `i` of the command parsed from `buf`.
    #[must_use]
    pub fn arg<'a>(&'a self, buf: &'a [u8], i: usize) -> &'a [u8] {
        let r = self.args[i].clone();
        if r.start >= buf.len() && !self.unquoted.is_empty() {
            let base = buf.len();
            &self.unquoted[r.start - base..r.end - base]
        } else {
            &buf[r]
        }
    }
}

/// Parses one command from the start of `buf` into `out`. `Ok(Some(n))`:
/// a whole command of `n` bytes (its arguments in `out`); `Ok(None)`: more
/// bytes are needed (`out` is then meaningless).
///
/// # Errors
/// [`FrameError`]: the connection must be closed.
pub fn parse(buf: &[u8], limits: &Limits, out: &mut Parsed) -> Result<Option<usize>, FrameError> {
    out.args.clear();
    out.unquoted.clear();
    out.need = buf.len() + 1;
    out.need_line = true;
    match buf.first() {
        None => Ok(None),
        Some(b'*') => multibulk(buf, limits, out),
        Some(_) => inline(buf, limits, out),
    }
}

/// A line ending in CRLF (or, inline, LF) at `at`: the line's end and the
/// next line's start.
fn line(buf: &[u8], at: usize) -> Result<Option<(usize, usize)>, FrameError> {
    let window = &buf[at..buf.len().min(at + MAX_LINE + 2)];
    match window.iter().position(|&b| b == b'\n') {
        Some(i) => {
            let end = if i > 0 && window[i - 1] == b'\r' {
                i - 1
            } else {
                i
            };
            Ok(Some((at + end, at + i + 1)))
        }
        None if window.len() > MAX_LINE => Err(FrameError::LineTooLong),
        None => Ok(None),
    }
}

/// A decimal number of at most 18 digits (so no overflow), or `None`.
fn number(digits: &[u8]) -> Option<i64> {
    let (negative, digits) = match digits.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, digits),
    };
    if digits.is_empty() || digits.len() > 18 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = digits
        .iter()
        .fold(0i64, |acc, d| acc * 10 + i64::from(d - b'0'));
    Some(if negative { -n } else { n })
}

fn multibulk(buf: &[u8], limits: &Limits, out: &mut Parsed) -> Result<Option<usize>, FrameError> {
    let Some((end, mut at)) = line(buf, 0)? else {
        return Ok(None);
    };
    let count = number(&buf[1..end]).ok_or(FrameError::MultibulkLength)?;
    if count <= 0 {
        // `*0` and `*-1`: nothing to do, as Redis.
        return Ok(Some(at));
    }
    let count = usize::try_from(count).map_err(|_| FrameError::MultibulkLength)?;
    if count > limits.max_args {
        return Err(FrameError::MultibulkLength);
    }
    let mut total = 0usize;
    for _ in 0..count {
        let Some(&first) = buf.get(at) else {
            return Ok(None);
        };
        if first != b'$' {
            return Err(FrameError::ExpectedBulk(char::from(first)));
        }
        let Some((end, data)) = line(buf, at)? else {
            return Ok(None);
        };
        let len = number(&buf[at + 1..end]).ok_or(FrameError::BulkLength)?;
        let len = usize::try_from(len).map_err(|_| FrameError::BulkLength)?;
        if len > limits.max_bulk {
            return Err(FrameError::BulkLength);
        }
        total += len + 16;
        if total > limits.max_request {
            return Err(FrameError::RequestTooLarge);
        }
        if buf.len() < data + len + 2 {
            out.need = data + len + 2;
            out.need_line = false;
            return Ok(None);
        }
        if &buf[data + len..data + len + 2] != b"\r\n" {
            return Err(FrameError::Unterminated);
        }
        out.args.push(data..data + len);
        at = data + len + 2;
    }
    Ok(Some(at))
}

/// An inline command: words split on spaces and tabs; `"…"` (with `\"`,
/// `\\`, `\n`, `\r`, `\t`, `\xHH`) and `'…'` (with `\'`) group words, as
/// `redis-cli` and telnet users write them.
fn inline(buf: &[u8], limits: &Limits, out: &mut Parsed) -> Result<Option<usize>, FrameError> {
    let Some((end, next)) = line(buf, 0)? else {
        return Ok(None);
    };
    let text = &buf[..end];
    if text.len() > limits.max_request {
        return Err(FrameError::RequestTooLarge);
    }
    let base = buf.len();
    let mut i = 0;
    while i < text.len() {
        if text[i] == b' ' || text[i] == b'\t' {
            i += 1;
            continue;
        }
        if out.args.len() == limits.max_args {
            return Err(FrameError::MultibulkLength);
        }
        match text[i] {
            q @ (b'"' | b'\'') => {
                let start = base + out.unquoted.len();
                i = unquote(text, i + 1, q, &mut out.unquoted)?;
                out.args.push(start..base + out.unquoted.len());
            }
            _ => {
                let start = i;
                while i < text.len() && text[i] != b' ' && text[i] != b'\t' {
                    i += 1;
                }
                out.args.push(start..i);
            }
        }
        if out.args.last().is_some_and(|a| a.len() > limits.max_bulk) {
            return Err(FrameError::BulkLength);
        }
    }
    Ok(Some(next))
}

/// The value of an ASCII hex digit.
fn hex_digit(b: u8) -> Option<u8> {
    char::from(b).to_digit(16).map(|d| d as u8)
}

/// Copies a quoted word from `text[i..]` up to its closing `q` into `out`;
/// returns the index after the quote (which must end the word).
fn unquote(text: &[u8], mut i: usize, q: u8, out: &mut Vec<u8>) -> Result<usize, FrameError> {
    while i < text.len() {
        let b = text[i];
        if b == q {
            let after = i + 1;
            if after < text.len() && text[after] != b' ' && text[after] != b'\t' {
                return Err(FrameError::UnbalancedQuotes);
            }
            return Ok(after);
        }
        if b == b'\\' && i + 1 < text.len() {
            let e = text[i + 1];
            i += 2;
            if q == b'\'' {
                out.push(if e == b'\'' { e } else { b });
                if e != b'\'' {
                    out.push(e);
                }
                continue;
            }
            match e {
                b'n' => out.push(b'\n'),
                b'r' => out.push(b'\r'),
                b't' => out.push(b'\t'),
                b'x' if i + 1 < text.len() => {
                    let hex = match (hex_digit(text[i]), hex_digit(text[i + 1])) {
                        (Some(hi), Some(lo)) => Some(hi * 16 + lo),
                        _ => None,
                    };
                    match hex {
                        Some(v) => {
                            out.push(v);
                            i += 2;
                        }
                        None => out.extend_from_slice(b"x"),
                    }
                }
                other => out.push(other),
            }
            continue;
        }
        out.push(b);
        i += 1;
    }
    Err(FrameError::UnbalancedQuotes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        max_bulk: 1024,
        max_args: 8,
        max_request: 4096,
    };

    type Words = Option<(Vec<Vec<u8>>, usize)>;

    fn words(input: &[u8]) -> Result<Words, FrameError> {
        let mut p = Parsed::default();
        Ok(parse(input, &LIMITS, &mut p)?.map(|n| {
            let args = (0..p.args.len())
                .map(|i| p.arg(input, i).to_vec())
                .collect();
            (args, n)
        }))
    }

    #[test]
    fn a_multibulk_command_and_its_length() {
        let input = b"*2\r\n$4\r\nPING\r\n$2\r\nhi\r\n*1\r\n";
        let (args, n) = words(input).unwrap().unwrap();
        assert_eq!(args, vec![b"PING".to_vec(), b"hi".to_vec()]);
        assert_eq!(n, input.len() - 4);
        // Every prefix is incomplete, never an error, and says how long
        // the buffer must grow before another try can finish.
        for cut in 0..n {
            let mut p = Parsed::default();
            assert_eq!(
                parse(&input[..cut], &LIMITS, &mut p),
                Ok(None),
                "cut at {cut}"
            );
            assert!(p.need > cut && p.need <= n, "cut at {cut}: need {}", p.need);
        }
    }

    #[test]
    fn binary_arguments_pass_whole() {
        let input = b"*2\r\n$9\r\nBF.EXISTS\r\n$4\r\n\r\n\x00\xff\r\n";
        let (args, _) = words(input).unwrap().unwrap();
        assert_eq!(args[1], b"\r\n\x00\xff".to_vec());
    }

    #[test]
    fn hostile_sizes_are_refused_before_anything_is_kept() {
        assert_eq!(words(b"*-1\r\n").unwrap().unwrap().1, 5);
        assert_eq!(words(b"*9\r\n"), Err(FrameError::MultibulkLength));
        assert_eq!(
            words(b"*1000000\r\n"),
            Err(FrameError::MultibulkLength),
            "10^6 arguments"
        );
        assert_eq!(words(b"*x\r\n"), Err(FrameError::MultibulkLength));
        assert_eq!(words(b"*1\r\n$-5\r\n"), Err(FrameError::BulkLength));
        assert_eq!(
            words(b"*1\r\n$536870912\r\n"),
            Err(FrameError::BulkLength),
            "512 MB declared"
        );
        assert_eq!(
            words(b"*1\r\n$99999999999999999999\r\n"),
            Err(FrameError::BulkLength)
        );
        assert_eq!(words(b"*1\r\n:5\r\n"), Err(FrameError::ExpectedBulk(':')));
        assert_eq!(words(b"*1\r\n$2\r\nabcd"), Err(FrameError::Unterminated));
        let long = vec![b'a'; MAX_LINE + 10];
        assert_eq!(words(&long), Err(FrameError::LineTooLong));
        let mut many = b"*8\r\n".to_vec();
        for _ in 0..8 {
            many.extend_from_slice(b"$1000\r\n");
            many.extend_from_slice(&[b'k'; 1000]);
            many.extend_from_slice(b"\r\n");
        }
        assert_eq!(words(&many), Err(FrameError::RequestTooLarge));
    }

    #[test]
    fn inline_commands_as_telnet_sends_them() {
        let (args, n) = words(b"PING  hi\r\nrest").unwrap().unwrap();
        assert_eq!(args, vec![b"PING".to_vec(), b"hi".to_vec()]);
        assert_eq!(n, 10);
        let (args, _) = words(b"ECHO \"a b\\x41\" 'c\\'d'\n").unwrap().unwrap();
        assert_eq!(
            args,
            vec![b"ECHO".to_vec(), b"a bA".to_vec(), b"c'd".to_vec()]
        );
        assert_eq!(words(b"\r\n").unwrap().unwrap().0.len(), 0);
        assert_eq!(words(b"ECHO \"open\r\n"), Err(FrameError::UnbalancedQuotes));
        assert_eq!(words(b"PING").unwrap(), None);
        assert_eq!(
            words(b"ECHO \"\\x+f\"\n").unwrap().unwrap().0[1],
            b"x+f".to_vec()
        );
        let long_arg = format!("ECHO {}\r\n", "a".repeat(1025));
        assert_eq!(words(long_arg.as_bytes()), Err(FrameError::BulkLength));
        let long_line = format!("ECHO {}\r\n", "a ".repeat(2100));
        assert_eq!(
            words(long_line.as_bytes()),
            Err(FrameError::RequestTooLarge)
        );
    }
}
