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
//! An allow is 200 with no body.

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
    /// 400: the original request could not be read (a message).
    BadRequest(String),
}

/// Judges the original request the check describes. `method` and `path`
/// are the check request's own (`path` still percent-encoded).
pub async fn check<'a>(
    routes: &'a Routes,
    metrics: &ServiceMetrics,
    headers: &HeaderMap,
    method: &str,
    path: &str,
) -> Answer<'a> {
    let header = |name: &str| -> Result<Option<&str>, String> {
        headers
            .get(name)
            .map(|v| v.to_str().map_err(|_| format!("{name} is not text")))
            .transpose()
    };
    let read = || -> Result<(String, String, bool), String> {
        // A client may add either pair to its own request, and the
        // proxies copy client headers: a request with both is refused,
        // and each documented config clears the pair it does not set.
        if headers.contains_key("x-original-uri") && headers.contains_key("x-forwarded-uri") {
            return Err(
                "both X-Original-URI and X-Forwarded-Uri: clear the pair your proxy does not set (docs/http-gate.md)"
                    .to_owned(),
            );
        }
        for (uri, meth, nginx) in [
            ("x-original-uri", "x-original-method", true),
            ("x-forwarded-uri", "x-forwarded-method", false),
        ] {
            if let Some(u) = header(uri)? {
                let m =
                    header(meth)?.ok_or_else(|| format!("{uri} came without {meth}: set both"))?;
                return Ok((m.to_owned(), target_path(u)?.to_owned(), nginx));
            }
        }
        match path.strip_prefix(CHECK_PATH) {
            Some(rest) if rest.starts_with('/') => Ok((method.to_owned(), rest.to_owned(), false)),
            _ => Err(
                "no original request: send X-Original-Method and X-Original-URI, X-Forwarded-Method and X-Forwarded-Uri, or the path after /api/gate/check"
                    .to_owned(),
            ),
        }
    };
    let (method, path, nginx) = match read() {
        Ok(x) => x,
        Err(why) => return Answer::BadRequest(why),
    };
    let m = &metrics.gate;
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
        (Err(why), _) | (_, Err(why)) => return Answer::BadRequest(why),
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
fn target_path(uri: &str) -> Result<&str, String> {
    let uri = uri.split(['?', '#']).next().unwrap_or("");
    if uri.starts_with('/') {
        return Ok(uri);
    }
    let rest = uri
        .strip_prefix("http://")
        .or_else(|| uri.strip_prefix("https://"))
        .ok_or_else(|| {
            format!(
                "the original URI is not a path: {:?}",
                crate::text::clip(uri)
            )
        })?;
    Ok(rest.find('/').map_or("/", |i| &rest[i..]))
}

#[cfg(test)]
mod tests {
    use super::target_path;

    #[test]
    fn the_original_target_is_read_as_a_path() {
        assert_eq!(target_path("/api/p/1?x=/y").unwrap(), "/api/p/1");
        assert_eq!(target_path("http://h:1/api/p/1?q").unwrap(), "/api/p/1");
        assert_eq!(target_path("https://h").unwrap(), "/");
        assert!(target_path("api/p/1").is_err());
    }
}
