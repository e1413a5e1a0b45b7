//! Route patterns and paths as the gate compares them: a path is split
//! on `/` (so a `%2F` stays inside its segment), its dot segments are
//! removed (RFC 3986 §5.2.4, `%2E` counted as a dot) and repeated slashes
//! merged (nginx's `merge_slashes on`); segments then match the
//! pattern's literals after one percent-decoding, case-sensitively.

use crate::config::proxy::{Pattern, Segment};

/// The raw (still percent-encoded) key segment of `path` when it
/// matches `pattern` (`path` normalised by [`normalise`]).
#[must_use]
pub fn key_of<'a>(pattern: &Pattern, path: &[&'a str]) -> Option<&'a str> {
    let segments = pattern.segments();
    if path.len() != segments.len() {
        return None;
    }
    for (want, got) in segments.iter().zip(path) {
        match want {
            Segment::Literal(l) => {
                if *got == l {
                    continue;
                }
                if !got.contains('%') || decode(got).as_deref() != Some(l.as_bytes()) {
                    return None;
                }
            }
            Segment::Key | Segment::Any => {
                if got.is_empty() {
                    return None;
                }
            }
        }
    }
    Some(path[pattern.key_index()])
}

/// Whether `path` (without its query) is `pattern`'s own spelling with
/// `key` in its key segment, byte for byte: no escapes, dot segments or
/// repeated slashes, and every other segment a literal of the pattern.
#[must_use]
pub fn canonical(pattern: &Pattern, path: &str, key: &str) -> bool {
    let Some(rest) = path.strip_prefix('/') else {
        return false;
    };
    let segments = pattern.segments();
    let mut got = rest.split('/');
    for want in segments {
        let Some(g) = got.next() else {
            return false;
        };
        let ok = match want {
            Segment::Literal(l) => g == l,
            Segment::Key => g == key && !g.contains('%') && dots(g).is_none(),
            Segment::Any => false,
        };
        if !ok {
            return false;
        }
    }
    got.next().is_none()
}

/// The segments of a request path (without its query), dot segments
/// removed and repeated slashes merged; a path that ends in `/` (or in a
/// dot segment) keeps an empty last segment, so `/a/42/` is not `/a/42`.
/// `None` for a target that is not a path (`*`, or no leading `/`).
#[must_use]
pub fn normalise(path: &str) -> Option<Vec<&str>> {
    let rest = path.strip_prefix('/')?;
    let mut out: Vec<&str> = Vec::new();
    let mut trailing = false;
    for s in rest.split('/') {
        trailing = false;
        match dots(s) {
            Some(1) => trailing = true,
            Some(_) => {
                out.pop();
                trailing = true;
            }
            None if s.is_empty() => trailing = true,
            None => out.push(s),
        }
    }
    if trailing {
        out.push("");
    }
    Some(out)
}

/// `Some(1)` for `.`, `Some(2)` for `..` (either spelled with `%2E`).
fn dots(s: &str) -> Option<u8> {
    let b = s.as_bytes();
    let dot_at = |i: usize| -> Option<usize> {
        match b.get(i)? {
            b'.' => Some(i + 1),
            b'%' if b.get(i + 1) == Some(&b'2') && matches!(b.get(i + 2), Some(b'e' | b'E')) => {
                Some(i + 3)
            }
            _ => None,
        }
    };
    let first = dot_at(0)?;
    if first == b.len() {
        return Some(1);
    }
    let second = dot_at(first)?;
    (second == b.len()).then_some(2)
}

/// Percent-decodes once; `None` for a `%` not followed by two hex digits.
#[must_use]
pub fn decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hi = hex(*b.get(i + 1)?)?;
            let lo = hex(*b.get(i + 2)?)?;
            out.push(hi << 4 | lo);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(out)
}

const fn hex(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(pattern: &str, path: &str) -> Option<String> {
        let p = Pattern::parse(pattern).unwrap();
        let segs = normalise(path)?;
        key_of(&p, &segs).map(str::to_string)
    }

    #[test]
    fn dot_segments_and_repeated_slashes_are_normalised() {
        let p = "/api/profiles/{key}";
        for path in [
            "/api/profiles/u1",
            "//api//profiles///u1",
            "/api/./profiles/u1",
            "/api/x/../profiles/u1",
            "/api/x/%2e%2E/profiles/u1",
            "/api/%2E/profiles/./u1",
            "/../api/profiles/u1",
            "/api/profil%65s/u1",
        ] {
            assert_eq!(key(p, path).as_deref(), Some("u1"), "{path}");
        }
        for path in [
            "/api/profiles/u1/",
            "/api/profiles/u1/.",
            "/api/profiles/u1/x/..",
            "/api/profiles/",
            "/api/profiles",
            "/API/profiles/u1",
            "/api/profiles/u1/x",
            "api/profiles/u1",
            "*",
        ] {
            assert_eq!(key(p, path), None, "{path}");
        }
        assert_eq!(
            key(p, "/api/profiles/a%2Fb").as_deref(),
            Some("a%2Fb"),
            "a %2F stays inside the key"
        );
        assert_eq!(key(p, "/api/profiles/..."), Some("...".into()));
    }

    #[test]
    fn only_the_patterns_own_spelling_is_canonical() {
        let p = Pattern::parse("/api/profiles/{key}").unwrap();
        assert!(canonical(&p, "/api/profiles/u1", "u1"));
        for path in [
            "/api/profiles/U1",
            "/api/profil%65s/u1",
            "/api/profiles/%75%31",
            "//api/profiles/u1",
            "/api/./profiles/u1",
            "/api/x/../profiles/u1",
            "/api/profiles/u1/",
            "/api/profiles/u1/x/..",
            "/api/profiles",
            "api/profiles/u1",
        ] {
            assert!(!canonical(&p, path, "u1"), "{path}");
        }
        assert!(
            !canonical(&p, "/api/profiles/007", "7"),
            "an integer key spelled otherwise"
        );
        assert!(!canonical(&p, "/api/profiles/%25", "%"), "an escaped key");
        let any = Pattern::parse("/t/{tenant}/u/{key}").unwrap();
        assert!(
            !canonical(&any, "/t/a/u/1", "1"),
            "a route that is not key-only"
        );
    }

    #[test]
    fn other_names_match_any_segment() {
        let p = "/t/{tenant}/users/{key}";
        assert_eq!(key(p, "/t/acme/users/7").as_deref(), Some("7"));
        assert_eq!(key(p, "/t//users/7"), None, "merged: one segment short");
        assert!(!Pattern::parse(p).unwrap().key_only());
        assert!(Pattern::parse("/u/{key}").unwrap().key_only());
    }

    #[test]
    fn decoding_is_once_and_strict() {
        assert_eq!(decode("a%2541").unwrap(), b"a%41");
        assert_eq!(decode("%e4%bd%a0").unwrap(), "你".as_bytes());
        assert_eq!(decode("%4"), None);
        assert_eq!(decode("%zz"), None);
        assert_eq!(decode("a+b").unwrap(), b"a+b");
    }
}
