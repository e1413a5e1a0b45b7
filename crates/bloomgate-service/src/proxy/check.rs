//! The auth-request check: a proxy the user already runs asks, for each
//! request, whether bloomgate lets it through. The original request
//! arrives in one of three ways:
//! - `X-Original-Method` and `X-Original-URI` (nginx `auth_request`):
//!   a refusal is 403, the one deny nginx passes on besides 401 (its
//!   config turns it into the client's 404: `error_page 403 =404`);
//! - `X-Forwarded-Method` and `X-Forwarded-Uri` (Caddy `forward_auth`,
//!   Traefik `ForwardAuth`): a refusal is the route's own answer, which
//!   those proxies hand to the client;
//! - the original path after the check's own (`/api/gate/check/api/…`,
//!   Envoy `ext_authz` with `path_prefix`), with the check's method: a
//!   refusal is the route's answer.
//!
//! An allow is 200 with no body. A header value that is not text (a raw
//! `é` in a query, which Caddy passes on as it came) never gets a 400: of
//! the original URI only the path is read, and a path, method or host
//! that is not text lets the request through unjudged.

use hyper::header::HeaderMap;

use super::judge::{Asked, Asker, Judgement, Refusal, Routes};
use crate::metrics::proxy::Outcome;
use crate::metrics::ServiceMetrics;

/// The check's path; the original path may follow it.
pub const CHECK_PATH: &str = "/api/gate/check";

/// The check's answer.
#[derive(Debug)]
pub enum Answer<'a> {
    /// 200: the request may go on.
    Allow,
    /// 403: refused, asked nginx's way.
    Forbidden,
    /// Refused: the route's own answer.
    Refuse(&'a Refusal),
    /// 400: the original request could not be read.
    BadRequest(Unreadable),
}

/// Why the check could not read the original request (its 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Unreadable {
    /// Both header pairs came: one was the client's own.
    #[error("both X-Original-URI and X-Forwarded-Uri: clear the pair your proxy does not set (docs/http-gate.md)")]
    BothPairs,
    /// An original URI without its method.
    #[error("{uri} came without {method}: set both")]
    NoMethod {
        /// The URI's header.
        uri: &'static str,
        /// The method's header, missing.
        method: &'static str,
    },
    /// An original URI that is neither a path nor an absolute URI (as
    /// sent, clipped).
    #[error("the original URI is not a path: {0:?}")]
    NotAPath(String),
    /// Neither header pair nor a path after the check's own.
    #[error("no original request: send X-Original-Method and X-Original-URI, X-Forwarded-Method and X-Forwarded-Uri, or the path after /api/gate/check")]
    NoOriginal,
}

/// A header value that is not text: the request goes through unjudged.
#[derive(Debug, Clone, Copy)]
struct NotText;

/// Judges the original request the check describes. `method` and `path`
/// are the check request's own (`path` still percent-encoded).
pub async fn check<'a>(
    routes: &'a Routes,
    metrics: &ServiceMetrics,
    headers: &HeaderMap,
    method: &str,
    path: &str,
) -> Answer<'a> {
    // A header value that is not text (a raw `é` in a query Caddy passes
    // on as it came) is no reason to refuse: the request goes through
    // unjudged (`NotText`). Of an original URI only the path must be
    // text: the check never reads the query.
    let header = |name: &'static str| -> Result<Option<&str>, NotText> {
        headers
            .get(name)
            .map(|v| v.to_str().map_err(|_| NotText))
            .transpose()
    };
    let uri_path = |name: &'static str| -> Result<Option<&str>, NotText> {
        let Some(v) = headers.get(name) else {
            return Ok(None);
        };
        let bytes = v.as_bytes();
        let end = bytes
            .iter()
            .position(|b| matches!(b, b'?' | b'#'))
            .unwrap_or(bytes.len());
        match std::str::from_utf8(&bytes[..end]) {
            Ok(path) if path.bytes().all(|b| b.is_ascii_graphic()) => Ok(Some(path)),
            _ => Err(NotText),
        }
    };
    let read = || -> Result<Result<(String, String, bool), NotText>, Unreadable> {
        // A client may add either pair to its own request, and the
        // proxies copy client headers: a request with both is refused,
        // and each documented config clears the pair it does not set.
        if headers.contains_key("x-original-uri") && headers.contains_key("x-forwarded-uri") {
            return Err(Unreadable::BothPairs);
        }
        for (uri, meth, nginx) in [
            ("x-original-uri", "x-original-method", true),
            ("x-forwarded-uri", "x-forwarded-method", false),
        ] {
            let u = match uri_path(uri) {
                Ok(None) => continue,
                Ok(Some(u)) => Ok(u),
                Err(not_text) => Err(not_text),
            };
            let m = match header(meth) {
                Ok(m) => Ok(m.ok_or(Unreadable::NoMethod { uri, method: meth })?),
                Err(not_text) => Err(not_text),
            };
            return match (u, m) {
                (Ok(u), Ok(m)) => Ok(Ok((m.to_owned(), target_path(u)?.to_owned(), nginx))),
                _ => Ok(Err(NotText)),
            };
        }
        match path.strip_prefix(CHECK_PATH) {
            Some(rest) if rest.starts_with('/') => {
                Ok(Ok((method.to_owned(), rest.to_owned(), false)))
            }
            _ => Err(Unreadable::NoOriginal),
        }
    };
    let m = &metrics.gate;
    let unjudged = || {
        m.record(m.unrouted(), Outcome::Forwarded);
        Answer::Allow
    };
    let (method, path, nginx) = match read() {
        Ok(Ok(x)) => x,
        Ok(Err(NotText)) => return unjudged(),
        Err(why) => return Answer::BadRequest(why),
    };
    let refuse = |route: &'a super::judge::Route| {
        if nginx {
            Answer::Forbidden
        } else {
            Answer::Refuse(&route.refusal)
        }
    };
    // The original request's host: a forward-auth proxy names it; nginx's
    // subrequest carries the original `Host` where the config says so
    // (docs/gate/nginx.conf does: else it names the upstream block).
    let host = match (header("x-forwarded-host"), header("host")) {
        (Ok(Some(h)), _) | (Ok(None), Ok(Some(h))) => h,
        (Err(NotText), _) | (_, Err(NotText)) => return unjudged(),
        (Ok(None), Ok(None)) => "",
    };
    let asked = Asked {
        method: &method,
        path: &path,
        // The check stores no 404, so its query does not matter.
        query: false,
        host,
        headers,
    };
    match routes.judge(&asked, Asker::Check).await {
        Judgement::Refuse(route) => {
            m.record(route.slot, Outcome::Rejected);
            refuse(route)
        }
        Judgement::Remembered(route) => {
            m.record(route.slot, Outcome::NotFoundCached);
            refuse(route)
        }
        Judgement::Pass(route, _) => {
            m.record(route.slot, Outcome::Forwarded);
            Answer::Allow
        }
        Judgement::Unrouted => {
            m.record(m.unrouted(), Outcome::Forwarded);
            Answer::Allow
        }
    }
}

/// The path of an original target: origin-form without its query, or the
/// path of an absolute one.
fn target_path(uri: &str) -> Result<&str, Unreadable> {
    let uri = uri.split(['?', '#']).next().unwrap_or("");
    if uri.starts_with('/') {
        return Ok(uri);
    }
    let rest = uri
        .strip_prefix("http://")
        .or_else(|| uri.strip_prefix("https://"))
        .ok_or_else(|| Unreadable::NotAPath(crate::text::clip(uri)))?;
    Ok(rest.find('/').map_or("/", |i| &rest[i..]))
}

#[cfg(test)]
mod tests {
    use super::{target_path, Unreadable};

    #[test]
    fn the_original_target_is_read_as_a_path() {
        assert_eq!(target_path("/api/p/1?x=/y").unwrap(), "/api/p/1");
        assert_eq!(target_path("http://h:1/api/p/1?q").unwrap(), "/api/p/1");
        assert_eq!(target_path("https://h").unwrap(), "/");
        assert_eq!(
            target_path("api/p/1"),
            Err(Unreadable::NotAPath("api/p/1".into()))
        );
        assert_eq!(
            Unreadable::NotAPath("api/p/1".into()).to_string(),
            "the original URI is not a path: \"api/p/1\""
        );
    }
}
