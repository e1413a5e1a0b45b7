//! Admin authorisation: `Authorization: Bearer <token>` on the warm and
//! SKU-write endpoints when `admin_token` is set; without one, only calls
//! addressed to this machine (`Host`) from no page or one of its own
//! (`Origin`).

use axum::http::header::AUTHORIZATION;
use axum::http::HeaderMap;
use subtle::ConstantTimeEq;

use crate::error::AppError;

/// Checks the bearer token. The scheme is matched case-insensitively (RFC
/// 9110 §11.1), the token in constant time; failures are logged without
/// the token. Without a configured token the server listens on loopback
/// only (see `Config::validate`), and an admin call is admitted when its
/// `Host` names this machine (`localhost`, a loopback address, with any
/// port) and its `Origin`, if any, does too: a page elsewhere reaching
/// loopback (DNS rebinding: `Host` is the attacker's name; a cross-site
/// form: `Origin` is the attacker's page) gets a 403. `curl localhost:8080`
/// sends `Host: localhost:8080` and no `Origin`.
///
/// # Errors
/// [`AppError::Unauthorized`] without credentials, [`AppError::Forbidden`]
/// with wrong ones, or without a token from elsewhere.
pub fn authorize(token: Option<&str>, headers: &HeaderMap, path: &str) -> Result<(), AppError> {
    let Some(token) = token else {
        return local_only(headers, path);
    };
    let given = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim_start().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim());
    let Some(given) = given else {
        tracing::warn!(path, "admin call without a bearer token");
        return Err(AppError::Unauthorized);
    };
    if bool::from(given.as_bytes().ct_eq(token.as_bytes())) {
        Ok(())
    } else {
        tracing::warn!(path, "admin call with a wrong bearer token");
        Err(AppError::Forbidden("invalid bearer token".into()))
    }
}

/// Without a token: `Host` and `Origin` (when sent) must name this
/// machine.
fn local_only(headers: &HeaderMap, path: &str) -> Result<(), AppError> {
    let header = |name| headers.get(name).map(|v| v.to_str().unwrap_or("\u{0}"));
    if let Some(host) = header(axum::http::header::HOST) {
        if !is_loopback_authority(host) {
            tracing::warn!(
                path,
                "admin call addressed to another host; set admin_token to call it from elsewhere"
            );
            return Err(AppError::Forbidden(
                "admin calls without admin_token must be addressed to localhost or a loopback address (Host)".into(),
            ));
        }
    }
    if let Some(origin) = header(axum::http::header::ORIGIN) {
        let authority = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"));
        if !authority.is_some_and(is_loopback_authority) {
            tracing::warn!(path, "admin call from a page of another origin");
            return Err(AppError::Forbidden(
                "admin calls without admin_token are refused from pages of other origins (Origin)"
                    .into(),
            ));
        }
    }
    Ok(())
}

/// `localhost`, `*.localhost`, `127.x.y.z` or `[::1]`, with an optional
/// port.
fn is_loopback_authority(authority: &str) -> bool {
    let host = if let Some(rest) = authority.strip_prefix('[') {
        match rest.split_once(']') {
            Some((h, port)) if port.is_empty() || is_port(port) => h,
            _ => return false,
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, port)) if is_port(port) => h,
            Some(_) => return false,
            None => authority,
        }
    };
    let host = host.to_ascii_lowercase();
    host == "localhost"
        || host.ends_with(".localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn is_port(p: &str) -> bool {
    p.strip_prefix(':')
        .unwrap_or(p)
        .bytes()
        .all(|b| b.is_ascii_digit())
        && !p.trim_start_matches(':').is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn without_a_token_only_this_machine_may_call() {
        for ok in [
            vec![],
            vec![("host", "localhost:8080")],
            vec![("host", "127.0.0.1:8080")],
            vec![("host", "[::1]:8080")],
            vec![("host", "localhost")],
            vec![("host", "LOCALHOST:1")],
            vec![
                ("host", "127.0.0.1:8080"),
                ("origin", "http://localhost:8080"),
            ],
            vec![("host", "127.0.0.1:9"), ("origin", "https://[::1]")],
        ] {
            assert!(authorize(None, &headers(&ok), "/x").is_ok(), "{ok:?}");
        }
        for bad in [
            vec![("host", "attacker.example:8080")],
            vec![("host", "localhost.attacker.example")],
            vec![("host", "127.0.0.1.nip.io:8080")],
            vec![("host", "10.0.0.1:8080")],
            vec![("host", "localhost:80x")],
            vec![
                ("host", "127.0.0.1:8080"),
                ("origin", "http://evil.example"),
            ],
            vec![("host", "127.0.0.1:8080"), ("origin", "null")],
        ] {
            let e = authorize(None, &headers(&bad), "/x").unwrap_err();
            assert_eq!(e.status().0, 403, "{bad:?}");
        }
        // With a token, the token alone decides.
        let with = headers(&[("host", "attacker.example"), ("authorization", "Bearer t")]);
        assert!(authorize(Some("t"), &with, "/x").is_ok());
    }
}
