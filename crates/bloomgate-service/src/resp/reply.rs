//! Replies in RESP2 or RESP3, written into the connection's output buffer.
//! A RESP3 type a RESP2 client cannot read is written as RESP2 writes it
//! (a boolean as an integer, a map as a flat array, a null as `$-1`).

/// The protocol a connection speaks (`HELLO 3` switches).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    /// RESP2, every connection's start.
    Two,
    /// RESP3.
    Three,
}

/// The output buffer of one connection.
#[derive(Debug)]
pub struct Out {
    /// The bytes to write.
    pub buf: Vec<u8>,
    /// The protocol replies are written in.
    pub proto: Proto,
}

impl Out {
    /// An empty buffer, speaking RESP2.
    #[must_use]
    pub fn new() -> Self {
        Self {
            buf: Vec::with_capacity(16 * 1024),
            proto: Proto::Two,
        }
    }

    fn line(&mut self, tag: u8, n: i64) {
        self.buf.push(tag);
        self.buf
            .extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
        self.buf.extend_from_slice(b"\r\n");
    }

    /// `+text` (no CR or LF in `text`).
    pub fn simple(&mut self, text: &str) {
        self.buf.push(b'+');
        self.buf.extend_from_slice(text.as_bytes());
        self.buf.extend_from_slice(b"\r\n");
    }

    /// `+OK`.
    pub fn ok(&mut self) {
        self.buf.extend_from_slice(b"+OK\r\n");
    }

    /// An error: `message` starts with its code (`ERR …`, `NOAUTH …`);
    /// CR and LF become spaces.
    pub fn error(&mut self, message: &str) {
        self.buf.push(b'-');
        self.buf.extend(
            message
                .bytes()
                .map(|b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
        );
        self.buf.extend_from_slice(b"\r\n");
    }

    /// `:n`.
    pub fn int(&mut self, n: i64) {
        self.line(b':', n);
    }

    /// `#t`/`#f` in RESP3, `:1`/`:0` in RESP2.
    pub fn bool(&mut self, b: bool) {
        match (self.proto, b) {
            (Proto::Three, true) => self.buf.extend_from_slice(b"#t\r\n"),
            (Proto::Three, false) => self.buf.extend_from_slice(b"#f\r\n"),
            (Proto::Two, true) => self.buf.extend_from_slice(b":1\r\n"),
            (Proto::Two, false) => self.buf.extend_from_slice(b":0\r\n"),
        }
    }

    /// A bulk string.
    pub fn bulk(&mut self, bytes: &[u8]) {
        self.line(b'$', bytes.len() as i64);
        self.buf.extend_from_slice(bytes);
        self.buf.extend_from_slice(b"\r\n");
    }

    /// A null: `_` in RESP3, `$-1` in RESP2.
    pub fn null(&mut self) {
        match self.proto {
            Proto::Three => self.buf.extend_from_slice(b"_\r\n"),
            Proto::Two => self.buf.extend_from_slice(b"$-1\r\n"),
        }
    }

    /// The header of an array of `n` elements.
    pub fn array(&mut self, n: usize) {
        self.line(b'*', n as i64);
    }

    /// The header of a map of `n` pairs (RESP2: an array of `2n`).
    pub fn map(&mut self, n: usize) {
        match self.proto {
            Proto::Three => self.line(b'%', n as i64),
            Proto::Two => self.line(b'*', 2 * n as i64),
        }
    }

    /// The header of a set of `n` elements (RESP2: an array).
    pub fn set(&mut self, n: usize) {
        match self.proto {
            Proto::Three => self.line(b'~', n as i64),
            Proto::Two => self.line(b'*', n as i64),
        }
    }

    /// A verbatim text (`=` in RESP3, a bulk string in RESP2), as Redis
    /// answers `INFO`.
    pub fn verbatim(&mut self, text: &str) {
        match self.proto {
            Proto::Three => {
                self.line(b'=', text.len() as i64 + 4);
                self.buf.extend_from_slice(b"txt:");
                self.buf.extend_from_slice(text.as_bytes());
                self.buf.extend_from_slice(b"\r\n");
            }
            Proto::Two => self.bulk(text.as_bytes()),
        }
    }
}

impl Default for Out {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_type_in_both_protocols() {
        let mut o = Out::new();
        o.bool(true);
        o.null();
        o.map(1);
        o.int(-3);
        o.error("ERR a\r\nb");
        assert_eq!(o.buf, b":1\r\n$-1\r\n*2\r\n:-3\r\n-ERR a  b\r\n");
        let mut o = Out::new();
        o.proto = Proto::Three;
        o.bool(false);
        o.null();
        o.map(1);
        o.verbatim("x");
        assert_eq!(o.buf, b"#f\r\n_\r\n%1\r\n=5\r\ntxt:x\r\n");
    }
}
