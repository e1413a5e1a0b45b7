//! Quoting what clients sent in error messages: at most [`MAX_QUOTED`]
//! characters of it; quoting a connection URL without its password
//! ([`redact_url`]); and a driver's error without the account it names
//! ([`public_error`]). Pure; below every module that explains a refusal.

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

/// A database driver's error as the unauthenticated stats, readiness and
/// dashboard may show it: the account names the drivers quote are
/// replaced by `…` (MySQL's `'user'@'host'`, MariaDB's `Host '…'`,
/// PostgreSQL's `user "…"`, `role "…"` and `host "…"`, a URL's
/// `user:password@`), so a
/// failed login says what failed without telling every client who the
/// service logs in as, or from where. The full text goes to the log.
#[must_use]
pub fn public_error(message: &str) -> String {
    // MySQL/MariaDB: 'user'@'host', `user`@`host`.
    let mut out = message.to_owned();
    for q in ['\'', '`'] {
        out = account_at(&out, q);
    }
    // PostgreSQL: user "name", role "name", host "address"; MariaDB:
    // Host 'address' is not allowed to connect.
    for word in ["user \"", "role \"", "host \"", "Host '"] {
        out = quoted_after(&out, word);
    }
    // A URL quoted whole: no user, no password.
    out.split(' ')
        .map(|w| match w.split_once("://") {
            Some((scheme, rest)) if rest.contains('@') => {
                let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
                format!("{scheme}://…@{host}")
            }
            _ => w.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `s` with every `{q}a{q}@{q}b{q}` as `{q}…{q}@{q}…{q}`.
fn account_at(s: &str, q: char) -> String {
    let sep = format!("{q}@{q}");
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find(&sep) {
        let (Some(open), Some(close)) = (rest[..at].rfind(q), rest[at + 3..].find(q)) else {
            break;
        };
        out.push_str(&rest[..open]);
        out.push_str(&format!("{q}…{q}@{q}…{q}"));
        rest = &rest[at + 3 + close + 1..];
    }
    out.push_str(rest);
    out
}

/// `s` with what follows each `word` (which ends in a quote) up to the
/// closing quote as `…`.
fn quoted_after(s: &str, word: &str) -> String {
    let q = word.chars().last().unwrap_or('"');
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find(word) {
        let start = at + word.len();
        let Some(close) = rest[start..].find(q) else {
            break;
        };
        out.push_str(&rest[..start]);
        out.push('…');
        rest = &rest[start + close..];
    }
    out.push_str(rest);
    out
}

/// `url` with the password of its `user:password@` part replaced by `***`,
/// for messages that must name a URL: no password is ever written to a
/// log line or an error.
#[must_use]
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let tail = redact_query(tail);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            let hidden = if userinfo.contains(':') { ":***" } else { "" };
            format!("{scheme}://{user}{hidden}@{host}{tail}")
        }
        None => format!("{scheme}://{authority}{tail}"),
    }
}

/// The user a database URL names (percent-decoded), if any.
#[must_use]
pub fn url_user(url: &str) -> Option<String> {
    let (_, rest) = url.split_once("://")?;
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let (userinfo, _) = authority.rsplit_once('@')?;
    let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
    let bytes = user.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied().and_then(hex),
            bytes.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok().filter(|u| !u.is_empty())
}

/// The path and query of a URL with the value of every secret query
/// parameter (PostgreSQL's `password`, `sslpassword`; any `*password*`,
/// `*secret*` or `*token*`) replaced by `***`.
fn redact_query(tail: &str) -> String {
    let Some((path, query)) = tail.split_once('?') else {
        return tail.to_owned();
    };
    let (query, fragment) = query
        .split_once('#')
        .map_or((query, None), |(q, f)| (q, Some(f)));
    let params: Vec<String> = query
        .split('&')
        .map(|p| match p.split_once('=') {
            Some((name, _)) if is_secret(name) => format!("{name}=***"),
            _ => p.to_owned(),
        })
        .collect();
    let mut out = format!("{path}?{}", params.join("&"));
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(f);
    }
    out
}

fn is_secret(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["password", "secret", "token"]
        .iter()
        .any(|w| name.contains(w))
}

/// A database URL that names a CA (`sslrootcert` on PostgreSQL, `ssl-ca`
/// on MySQL) but no TLS mode, with the mode that checks the server against
/// that CA and its name added (`sslmode=verify-full`,
/// `ssl-mode=VERIFY_IDENTITY`): the drivers' default (`prefer`,
/// `PREFERRED`) would read the CA and verify nothing. `None` when the URL
/// needs no change.
#[must_use]
pub fn verify_named_ca(url: &str) -> Option<String> {
    let (scheme, _) = url.split_once("://")?;
    let query = url.split_once('?').map_or("", |(_, q)| q);
    let names = |want: &[&str]| {
        query.split('&').any(|p| {
            let name = p.split_once('=').map_or(p, |(n, _)| n);
            want.iter().any(|w| name.eq_ignore_ascii_case(w))
        })
    };
    let add = match scheme {
        "postgres" | "postgresql" if names(&["sslrootcert"]) && !names(&["sslmode"]) => {
            "sslmode=verify-full"
        }
        "mysql" | "mariadb"
            if names(&["ssl-ca", "ssl_ca"]) && !names(&["ssl-mode", "ssl_mode"]) =>
        {
            "ssl-mode=VERIFY_IDENTITY"
        }
        _ => return None,
    };
    Some(format!("{url}&{add}"))
}

#[cfg(test)]
mod tests {
    use super::{public_error, redact_url, url_user, verify_named_ca};

    #[test]
    fn a_url_names_its_user() {
        assert_eq!(url_user("postgres://svc:pw@h/db").as_deref(), Some("svc"));
        assert_eq!(url_user("mysql://a%40b@h:3306/db").as_deref(), Some("a@b"));
        assert_eq!(url_user("postgres://h/db?user=x"), None);
        assert_eq!(url_user("sqlite://data/x.db"), None);
        assert_eq!(url_user("postgres://:pw@h/db"), None);
    }

    #[test]
    fn driver_errors_lose_the_account_they_name() {
        assert_eq!(
            public_error("error returned from database: 1045 (28000): Access denied for user 'bg_svc'@'10.0.0.5' (using password: YES)"),
            "error returned from database: 1045 (28000): Access denied for user '…'@'…' (using password: YES)"
        );
        assert_eq!(
            public_error(
                "error returned from database: password authentication failed for user \"bg_svc\""
            ),
            "error returned from database: password authentication failed for user \"…\""
        );
        assert_eq!(
            public_error("permission denied for table users; role \"app\" lacks SELECT"),
            "permission denied for table users; role \"…\" lacks SELECT"
        );
        assert_eq!(
            public_error("cannot reach mysql://svc:hunter2@db:3306/app"),
            "cannot reach mysql://…@db:3306/app"
        );
        assert_eq!(
            public_error(
                "no pg_hba.conf entry for host \"10.0.0.5\", user \"svc\", database \"app\""
            ),
            "no pg_hba.conf entry for host \"…\", user \"…\", database \"app\""
        );
        assert_eq!(
            public_error("Host '10.0.0.5' is not allowed to connect to this MariaDB server"),
            "Host '…' is not allowed to connect to this MariaDB server"
        );
        assert_eq!(public_error("`a`@`h` then 'b'@'i'"), "`…`@`…` then '…'@'…'");
        assert_eq!(public_error("statement timed out"), "statement timed out");
        // A lone `'@'` with no closing quote is left as it is.
        assert_eq!(
            public_error("odd ' @ quote '@' alone"),
            "odd ' @ quote '@' alone"
        );
    }

    #[test]
    fn a_named_ca_without_a_mode_is_verified() {
        assert_eq!(
            verify_named_ca("postgres://u@h/db?sslrootcert=/ca.pem").as_deref(),
            Some("postgres://u@h/db?sslrootcert=/ca.pem&sslmode=verify-full")
        );
        assert_eq!(
            verify_named_ca("mysql://u@h/db?ssl-ca=/ca.pem").as_deref(),
            Some("mysql://u@h/db?ssl-ca=/ca.pem&ssl-mode=VERIFY_IDENTITY")
        );
        for unchanged in [
            "postgres://u@h/db?sslrootcert=/ca.pem&sslmode=require",
            "postgres://u@h/db",
            "mysql://u@h/db?ssl-mode=DISABLED&ssl-ca=/ca.pem",
            "sqlite://data/x.db",
        ] {
            assert_eq!(verify_named_ca(unchanged), None, "{unchanged}");
        }
    }

    #[test]
    fn a_urls_password_is_never_quoted() {
        for (url, shown) in [
            ("redis://127.0.0.1:6379/", "redis://127.0.0.1:6379/"),
            ("rediss://app:s3cret@r:6380/0", "rediss://app:***@r:6380/0"),
            ("rediss://:s3cret@r:6380", "rediss://:***@r:6380"),
            (
                "postgres://u@h/db?sslmode=verify-full",
                "postgres://u@h/db?sslmode=verify-full",
            ),
            ("mysql://u:p@ss@h:3306/db", "mysql://u:***@h:3306/db"),
            (
                "postgres://u@h/db?password=s3cret&sslmode=require",
                "postgres://u@h/db?password=***&sslmode=require",
            ),
            (
                "postgres://h/db?sslmode=verify-full&sslpassword=k3y#x",
                "postgres://h/db?sslmode=verify-full&sslpassword=***#x",
            ),
            ("redis://h:6379/?Token=abc", "redis://h:6379/?Token=***"),
            ("sqlite://data/x.db", "sqlite://data/x.db"),
            ("not a url", "not a url"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }
}
