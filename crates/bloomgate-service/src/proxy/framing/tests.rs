//! The scan's verdicts over byte streams cut in any pieces.

use super::*;

/// The clean heads of a byte stream fed in pieces of `step` bytes, and
/// the refusal it was cut at, if any.
fn verdicts(stream: &[u8], step: usize) -> (usize, Option<Refused>) {
    let (mut s, v) = Scanner::new(64 * 1024, 100);
    for piece in stream.chunks(step) {
        if s.feed(piece).is_some() {
            break;
        }
    }
    let mut clean = 0;
    while v.next() == Head::Clean {
        clean += 1;
    }
    (clean, s.take_cut())
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
        assert_eq!(verdicts(stream, step), (3, Some(TWICE)), "pieces of {step}");
    }
}

#[test]
fn length_with_chunked_is_refused_either_order() {
    for head in [
        &b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
    ] {
        assert_eq!(verdicts(head, 5), (0, Some(BOTH)));
    }
}

#[test]
fn a_body_that_looks_like_a_head_is_not_one() {
    let stream = b"POST / HTTP/1.1\r\nContent-Length: 56\r\n\r\n\
        GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n\
        GET / HTTP/1.1\r\n\r\n";
    assert_eq!(verdicts(stream, 3), (2, None));
}

#[test]
fn a_head_over_the_limit_is_refused_whole_or_in_pieces() {
    let big = format!("GET / HTTP/1.1\r\nX-Big: {}\r\n\r\n", "b".repeat(300));
    let (mut s, v) = Scanner::new(256, 100);
    assert_eq!(s.feed(big.as_bytes()), Some(Cut::At(0)));
    assert_eq!(s.take_cut(), Some(TOO_LARGE));
    assert_eq!(v.next(), Head::Unscanned);
    let (mut s, v) = Scanner::new(256, 100);
    // In pieces it is still incomplete when it passes the limit: the
    // connection is cut there (hyper never sees it), with the same answer.
    let cuts: Vec<Option<Cut>> = big.as_bytes().chunks(100).map(|p| s.feed(p)).collect();
    assert_eq!(cuts[..3], [None, None, Some(Cut::Earlier)]);
    assert_eq!(s.take_cut(), Some(TOO_LARGE));
    assert_eq!(v.next(), Head::Unscanned);
}

#[test]
fn after_an_upgrade_or_a_bare_lf_trailer_later_heads_are_unscanned() {
    let (mut s, v) = Scanner::new(64 * 1024, 100);
    s.feed(b"GET /ws HTTP/1.1\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\nGET / HTTP/1.1\r\n\r\n");
    assert_eq!(v.next(), Head::Clean);
    assert_eq!(v.next(), Head::Unscanned);
    // A trailer ended by a bare LF: hyper reads on as trailer, the
    // scan cannot follow, so what follows is not judged clean.
    let (mut s, v) = Scanner::new(64 * 1024, 100);
    s.feed(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\nGET /fake HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n");
    assert_eq!(v.next(), Head::Clean);
    assert_eq!(v.next(), Head::Unscanned);
}

#[test]
fn the_cut_falls_where_a_head_hyper_refuses_begins() {
    let clean = b"POST /a HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc";
    let bad = b"GET / HTTP/1.1\r\nBad Name: 1\r\n\r\n";
    let stream = [&clean[..], &bad[..]].concat();
    // Whole: the cut is at the bad head's first byte.
    let (mut s, v) = Scanner::new(64 * 1024, 100);
    assert_eq!(s.feed(&stream), Some(Cut::At(clean.len())));
    assert_eq!(s.take_cut(), Some(malformed(httparse::Error::HeaderName)));
    assert_eq!(s.take_cut(), None, "told once");
    assert_eq!(v.next(), Head::Clean);
    assert_eq!(v.next(), Head::Unscanned, "nothing after the cut is judged");
    // In pieces: the read that shows the fault cuts at 0 when the head
    // began in an earlier one, at the head's start otherwise.
    let (mut s, _v) = Scanner::new(64 * 1024, 100);
    let split = clean.len() + 18; // "…HTTP/1.1\r\nBa" | "d Name…"
    assert_eq!(s.feed(&stream[..split]), None);
    assert_eq!(s.feed(&stream[split..]), Some(Cut::Earlier));
    assert_eq!(s.take_cut().map(|r| r.status), Some(400));
    // Still incomplete past the limit: 431.
    let (mut s, _v) = Scanner::new(256, 100);
    let big = format!("GET / HTTP/1.1\r\nX-Big: {}", "b".repeat(300));
    assert_eq!(s.feed(big.as_bytes()), Some(Cut::At(0)));
    assert_eq!(s.take_cut(), Some(TOO_LARGE));
    // Too many headers for the limit: 431, not 400.
    let (mut s, _v) = Scanner::new(64 * 1024, 2);
    assert_eq!(
        s.feed(b"GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n"),
        Some(Cut::At(0))
    );
    assert_eq!(s.take_cut().map(|r| r.status), Some(431));
    // A stream of clean heads is never cut.
    let (mut s, _v) = Scanner::new(64 * 1024, 100);
    for piece in clean.repeat(5).chunks(7) {
        assert_eq!(s.feed(piece), None);
    }
}

#[test]
fn the_answer_is_one_whole_json_response() {
    let raw = String::from_utf8(answer_bytes(malformed(httparse::Error::Version))).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{head}");
    assert!(
        head.contains(&format!("content-length: {}", body.len())),
        "{head}"
    );
    assert!(head.contains("connection: close"), "{head}");
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["error"], "bad_request");
    assert!(v["message"].as_str().unwrap().contains("HTTP version"));
    let raw = String::from_utf8(answer_bytes(TOO_LARGE)).unwrap();
    assert!(raw.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"));
    assert!(raw.contains("\"error\":\"header_too_large\""));
}

#[test]
fn what_hyper_refuses_after_httparse_is_refused_too() {
    for (head, want) in [
        (
            &b"POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n"[..],
            BAD_LENGTH,
        ),
        (b"POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\n", BAD_LENGTH),
        (b"POST / HTTP/1.1\r\nContent-Length: \r\n\r\n", BAD_LENGTH),
        (
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
            NOT_CHUNKED,
        ),
        (
            b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            TE_ON_1_0,
        ),
        (b"GET http://[::1/x HTTP/1.1\r\n\r\n", BAD_TARGET),
        (
            b"POST / HTTP/1.1\r\nContent-Length: 18446744073709551614\r\n\r\n",
            BAD_LENGTH,
        ),
    ] {
        assert_eq!(
            verdicts(head, 4),
            (0, Some(want)),
            "{}",
            String::from_utf8_lossy(head)
        );
    }
    assert!(plain_target("/api/profiles/u%201?x=1&y=a,b"));
    assert!(!plain_target("/a{b}") && !plain_target("http://h/x") && !plain_target("*"));
    // What stays clean: a padded length, chunked last, OPTIONS *, a
    // quote (outside the plain set, taken by `Uri`).
    let fine = b"POST / HTTP/1.1\r\nContent-Length:  2 \r\n\r\nab\
        POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n\
        OPTIONS * HTTP/1.1\r\n\r\n\
        GET /a\"b HTTP/1.1\r\n\r\n";
    assert_eq!(verdicts(fine, 3), (4, None));
}

#[test]
fn a_head_at_hyper_s_buffer_size_is_refused_before_it_completes() {
    let (mut s, _v) = Scanner::new(64, 100);
    let head = format!("GET / HTTP/1.1\r\nX: {}", "a".repeat(64 - 19));
    assert_eq!(head.len(), 64);
    assert_eq!(s.feed(head.as_bytes()), Some(Cut::At(0)));
    assert_eq!(s.take_cut(), Some(TOO_LARGE));
}

/// A head sent a byte at a time is parsed once its end has come, not again
/// from its start at every byte: the bytes handed to httparse grow with
/// what the client sent (before, a 60 KiB head cost 1.8 GB of parsing on
/// a thread that serves other connections).
#[test]
fn a_head_sent_a_byte_at_a_time_is_parsed_about_once() {
    let mut head = b"GET /a HTTP/1.1\r\nHost: x\r\n".to_vec();
    while head.len() < 60 * 1024 {
        head.extend_from_slice(b"X-Pad: 0123456789abcdef0123456789abcdef\r\n");
    }
    let lines = head.len();
    head.extend_from_slice(b"\r\n");
    for ending in [&b"\r\n"[..], b"\n"] {
        let mut stream = head[..lines].to_vec();
        stream.extend_from_slice(ending);
        stream.extend_from_slice(b"GET /b HTTP/1.1\r\n\r\n");
        let (mut s, v) = Scanner::new(64 * 1024, 2000);
        for byte in stream.chunks(1) {
            assert!(s.feed(byte).is_none(), "no refusal");
        }
        assert_eq!((v.next(), v.next()), (Head::Clean, Head::Clean));
        assert!(
            s.parsed() < 3 * stream.len() as u64,
            "{} bytes parsed for a stream of {}",
            s.parsed(),
            stream.len()
        );
    }
    // Empty lines before a request line (which httparse skips) are never
    // held, so line ends sent a byte at a time cost no parse of what came
    // before them either.
    for blank in [&b"\n"[..], b"\r\n"] {
        let (mut s, v) = Scanner::new(64 * 1024, 2000);
        for _ in 0..(60 * 1024 / blank.len()) {
            for byte in blank.chunks(1) {
                assert!(s.feed(byte).is_none(), "no refusal");
            }
        }
        assert_eq!(s.partial_len(), 0, "line ends alone are not held");
        for byte in b"GET /c HTTP/1.1\r\n\r\n".chunks(1) {
            assert!(s.feed(byte).is_none());
        }
        assert_eq!(v.next(), Head::Clean);
        assert!(s.parsed() < 200 * 1024, "{} bytes parsed", s.parsed());
    }
    // Over the limit without an end: refused once it reaches the limit,
    // as before.
    let mut long = head[..lines].to_vec();
    while long.len() < 70 * 1024 {
        long.extend_from_slice(b"X-Pad: 0123456789abcdef0123456789abcdef\r\n");
    }
    let (mut s, _) = Scanner::new(64 * 1024, 4000);
    let mut cut = None;
    for byte in &long {
        if let Some(c) = s.feed(std::slice::from_ref(byte)) {
            cut = Some(c);
            break;
        }
    }
    assert_eq!(cut, Some(Cut::Earlier));
    assert_eq!(s.take_cut(), Some(TOO_LARGE));
    assert!(s.parsed() < 2 * long.len() as u64, "{}", s.parsed());
}

/// A malformed line that came after the first read is judged when the
/// head ends, or, when the client ends the connection first, by
/// `finish`: the gate's answer, never a head passed to hyper unjudged.
#[test]
fn a_partial_head_the_client_ends_is_judged_as_it_stands() {
    let (mut s, _) = Scanner::new(64 * 1024, 100);
    assert!(s.feed(b"GET / HTTP/1.1\r\n").is_none());
    assert!(
        s.feed(b"Bad Header\r\n").is_none(),
        "held until the head ends"
    );
    assert!(s.finish(), "refused at the end");
    assert_eq!(s.take_cut().map(|r| r.status), Some(400));
    let (mut s, _) = Scanner::new(64 * 1024, 100);
    assert!(s.feed(b"GET / HTTP/1.1\r\n").is_none());
    assert!(s.feed(b"Host: x\r\n").is_none());
    assert!(!s.finish(), "a clean partial head is not refused");
    assert!(s.take_cut().is_none());
    let (mut s, _) = Scanner::new(64 * 1024, 100);
    assert!(!s.finish(), "nothing held");
}
