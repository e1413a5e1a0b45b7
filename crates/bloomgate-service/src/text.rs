//! Quoting what clients sent in error messages: at most [`MAX_QUOTED`]
//! characters of it. Pure; below every module that explains a refusal.

/// The most characters of a client's input an error message quotes.
pub const MAX_QUOTED: usize = 64;

/// `s`, cut to [`MAX_QUOTED`] characters with `…` when longer.
#[must_use]
pub fn clip(s: &str) -> String {
    match s.char_indices().nth(MAX_QUOTED) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_string(),
    }
}

/// Clips every quoted span (between backticks or double quotes) of a
/// parser's message, which may echo the client's input.
#[must_use]
pub fn clip_quoted(message: &str) -> String {
    let mut out = String::with_capacity(message.len().min(512));
    let mut rest = message;
    while let Some(open) = rest.find(['`', '"']) {
        let quote = &rest[open..=open];
        out.push_str(&rest[..=open]);
        let after = &rest[open + 1..];
        let Some(close) = after.find(quote) else {
            out.push_str(&clip(after));
            return out;
        };
        out.push_str(&clip(&after[..close]));
        out.push_str(quote);
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    out
}
