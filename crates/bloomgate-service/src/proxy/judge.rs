//! The gate's one decision: does a request's method and target name a
//! key its route's filter refuses? Asked by the reverse proxy and by the
//! auth-request check alike, through the same call the service's own
//! `exists` makes ([`Resource::exists_one`]): "no" only while the filter
//! vouches (built, in step; strict and redis modes as configured).
//!
//! A route with `cache_not_found_secs` also answers a key its filter let
//! through when the upstream answered 404 for it lately
//! ([`AbsentMemory`]): only for `GET` and `HEAD` whose every header is on
//! an allowlist ([`MEMORY_HEADERS`], and the route's
//! `not_found_memory_headers`): any other header (`Authorization`,
//! `Cookie`, `X-Api-Key`, a tenant's) means the 404 may be the caller's,
//! not the key's. Only while the filter vouches. A 404 is stored only for
//! a `GET` (a framework may answer `HEAD` on a `GET` route with 404) of
//! the key's one canonical spelling (the route's path with the key as its
//! column holds it, no escapes, dot segments, repeated slashes or query),
//! and answers only requests asked of the same `Host`: another spelling
//! may reach another of the upstream's routes, whose 404 would refuse a
//! key that exists.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::header::HeaderMap;

use super::route::{canonical, decode, key_of, normalise};
use crate::cache::{AbsentMemory, Recall, Ticket};
use crate::config::proxy::{Pattern, ProxyConfig, ProxyRoute};
use crate::key::Key;
use crate::resource::{Judged, Resource};

/// What a refusal answers.
#[derive(Debug, Clone)]
pub struct Refusal {
    /// The status (404 by default).
    pub status: u16,
    /// The content type (checked by the config's validation).
    pub content_type: hyper::header::HeaderValue,
    /// The body.
    pub body: Bytes,
}

/// One `[[gate.routes]]` entry, ready to judge.
#[derive(Debug)]
pub struct Route {
    /// Its index (the metrics' slot).
    pub slot: usize,
    /// Its path as configured (the metrics' label).
    pub path: String,
    pattern: Pattern,
    methods: Vec<String>,
    resource: Arc<Resource>,
    /// What a refusal answers.
    pub refusal: Refusal,
    /// Its remembered 404s (`cache_not_found_secs`).
    pub memory: Option<AbsentMemory<Key>>,
    /// Headers allowed beside [`MEMORY_HEADERS`] (`not_found_memory_headers`,
    /// lower case, `_` as `-`; a trailing `*` names a family).
    memory_headers: Vec<Box<str>>,
    /// What a key must match in full to be judged (`key_pattern`).
    key_pattern: Option<regex::Regex>,
    /// Keys never judged (`exclude`).
    exclude: Vec<String>,
    /// Format suffixes (`strip_suffix`).
    strip_suffix: Vec<String>,
}

/// The keys a request's key segment may name.
#[derive(Debug)]
enum Spellings {
    /// One key, as sent.
    One(Key),
    /// As sent and without a format suffix: refused only when both are.
    Two(Key, Key),
    /// Only the spelling without the suffix can be a key (as sent, it
    /// does not match `key_pattern`).
    Stripped(Key),
}

/// What a route makes of one spelling of a key.
#[derive(Debug)]
enum Spelling {
    /// A key the filter judges.
    Judged(Key),
    /// No key, by the route's own word (`key_pattern`, or not digits for
    /// an integer column).
    Unkeyed,
    /// Never judged: excluded, or a key the column cannot be asked about.
    Unjudged,
}

/// The verdict on one request.
#[derive(Debug)]
pub enum Judgement<'a> {
    /// No route matches (method or path): forwarded, not judged.
    Unrouted,
    /// A route matched and its filter may hold the key (or cannot vouch,
    /// or the key cannot be in the column): forwarded.
    Pass(&'a Route, Passed),
    /// A route matched and its filter vouches the key is absent.
    Refuse(&'a Route),
    /// A route matched, its filter let the key through, and the
    /// upstream's 404 for it is remembered.
    Remembered(&'a Route),
}

/// Why a routed request was forwarded.
#[derive(Debug, Default)]
pub struct Passed {
    /// The filter vouched and said "maybe" (an upstream 404 is then an
    /// observed false positive, or a row deleted since the build).
    pub maybe: bool,
    /// The upstream's 404 is to be remembered ([`Pending::remember`]).
    pub pending: Option<Pending>,
}

/// A forwarded request whose 404 the route remembers.
#[derive(Debug)]
pub struct Pending {
    key: Key,
    host: Box<str>,
    ticket: Ticket,
}

impl Pending {
    /// Remembers the upstream's 404 for this request's key (a no-op when
    /// a change of the key was applied meanwhile).
    pub async fn remember(self, route: &Route) {
        if let Some(m) = &route.memory {
            m.remember(&self.key, &self.host, self.ticket).await;
        }
    }
}

/// The request a verdict is asked about.
#[derive(Debug, Clone, Copy)]
pub struct Asked<'r> {
    /// Its method.
    pub method: &'r str,
    /// Its path, without the query.
    pub path: &'r str,
    /// Whether its target had a query.
    pub query: bool,
    /// Its `Host` (or the authority of an absolute target), as sent.
    pub host: &'r str,
    /// Its headers.
    pub headers: &'r HeaderMap,
}

/// How a request is judged: by the proxy, which forwards what passes and
/// may remember the upstream's 404, or by the check, which never sees
/// the upstream's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asker {
    /// The reverse proxy.
    Proxy,
    /// The auth-request check.
    Check,
}

/// Every route, in the configured order (the first that matches judges).
#[derive(Debug, Default)]
pub struct Routes {
    routes: Vec<Route>,
}

impl Routes {
    /// The configured routes, each bound to its resource.
    ///
    /// # Panics
    /// Never for a validated configuration (each route's pattern parses
    /// and names a resource in `resources`).
    ///
    /// `capacity`: keys each route's remembered 404s hold in process.
    #[must_use]
    pub fn of(config: &ProxyConfig, resources: &[Arc<Resource>], capacity: u64) -> Self {
        let routes = config
            .routes
            .iter()
            .enumerate()
            .filter_map(|(slot, r)| {
                let resource = resources.iter().find(|x| *x.name == *r.resource)?;
                let memory = (r.cache_not_found_secs > 0).then(|| {
                    resource.remember_absent(
                        &r.path,
                        capacity,
                        Duration::from_secs(r.cache_not_found_secs),
                    )
                });
                Some(Route {
                    slot,
                    path: r.path.clone(),
                    pattern: Pattern::parse(&r.path).ok()?,
                    methods: r.methods.clone(),
                    resource: Arc::clone(resource),
                    refusal: refusal(r),
                    memory,
                    key_pattern: r
                        .key_pattern
                        .as_ref()
                        .and_then(|p| regex::Regex::new(&format!("^(?:{p})$")).ok()),
                    exclude: r.exclude.clone(),
                    strip_suffix: r.strip_suffix.clone(),
                    memory_headers: r
                        .not_found_memory_headers
                        .iter()
                        .map(|h| spelled(h).into())
                        .collect(),
                })
            })
            .collect();
        Self { routes }
    }

    /// The routes.
    #[must_use]
    pub fn all(&self) -> &[Route] {
        &self.routes
    }

    /// Judges the request `asked`, asked by `asker`.
    pub async fn judge(&self, asked: &Asked<'_>, asker: Asker) -> Judgement<'_> {
        if self.routes.is_empty() {
            return Judgement::Unrouted;
        }
        let method = asked.method;
        let Some(segments) = normalise(asked.path) else {
            return Judgement::Unrouted;
        };
        for route in &self.routes {
            if !route.methods.iter().any(|m| m == method) {
                continue;
            }
            let Some(raw) = key_of(&route.pattern, &segments) else {
                continue;
            };
            let key = match route.keys(raw) {
                None => return Judgement::Pass(route, Passed::default()),
                Some(Spellings::One(key)) => key,
                // Refused only when the filter refuses both.
                Some(Spellings::Two(whole, stripped)) => {
                    let r = &route.resource;
                    let absent = r.judge_one(&whole).await == Judged::Absent
                        && r.judge_one(&stripped).await == Judged::Absent;
                    return if absent {
                        Judgement::Refuse(route)
                    } else {
                        Judgement::Pass(route, Passed::default())
                    };
                }
                // A memory is the whole key's: the stripped one is judged
                // by the filter alone.
                Some(Spellings::Stripped(key)) => {
                    return match route.resource.judge_one(&key).await {
                        Judged::Absent => Judgement::Refuse(route),
                        Judged::Maybe { .. } => Judgement::Pass(route, Passed::default()),
                    };
                }
            };
            return match route.resource.judge_one(&key).await {
                Judged::Absent => Judgement::Refuse(route),
                Judged::Maybe { vouched: true } => match &route.memory {
                    Some(m) if route.remembers(asked, asker) => {
                        // Only a canonical GET's 404 is stored.
                        let store = asker == Asker::Proxy
                            && method == "GET"
                            && !asked.query
                            && plain_host(asked.host)
                            && canonical(&route.pattern, asked.path, &key.to_string());
                        let host = asked.host.to_ascii_lowercase();
                        match m.recall(&key, &host, store).await {
                            Recall::Absent => Judgement::Remembered(route),
                            Recall::Unknown(ticket) => Judgement::Pass(
                                route,
                                Passed {
                                    maybe: true,
                                    pending: store.then(|| Pending {
                                        key,
                                        host: host.into(),
                                        ticket,
                                    }),
                                },
                            ),
                        }
                    }
                    _ => Judgement::Pass(
                        route,
                        Passed {
                            maybe: true,
                            pending: None,
                        },
                    ),
                },
                Judged::Maybe { vouched: false } => Judgement::Pass(route, Passed::default()),
            };
        }
        Judgement::Unrouted
    }
}

/// The headers a request may carry and still have its 404 remembered, or
/// be answered from memory: what browsers, HTTP clients and the proxies
/// in between send with every request alike. With any other, the 404 may
/// be the caller's (`Authorization`, `Cookie`, `X-Api-Key`, a tenant's
/// header), or the upstream may route by it.
pub const MEMORY_HEADERS: [&str; 18] = [
    "accept",
    "accept-encoding",
    "accept-language",
    "user-agent",
    "cache-control",
    "pragma",
    "if-none-match",
    "if-modified-since",
    "connection",
    "host",
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-request-id",
    "traceparent",
    "tracestate",
    "origin",
    "referer",
    "dnt",
];

/// The auth-request check's own headers, which name the original request
/// (see `proxy::check`), and the empty length nginx's documented config
/// sets on its subrequest.
const CHECK_HEADERS: [&str; 5] = [
    "x-original-uri",
    "x-original-method",
    "x-forwarded-uri",
    "x-forwarded-method",
    "content-length",
];

/// Families of [`MEMORY_HEADERS`]: a browser's fetch metadata and client
/// hints.
pub const MEMORY_FAMILIES: [&str; 2] = ["sec-fetch-", "sec-ch-ua"];

/// A header name as the allowlist compares it: lower case, `_` read as
/// `-` (CGI and WSGI servers read `X_Forwarded_Host` as the dashed one).
fn spelled(name: &str) -> String {
    name.to_ascii_lowercase().replace('_', "-")
}

impl Route {
    /// Whether a request's 404 is the key's: a `GET` or `HEAD` whose every
    /// header is allowed, none rerouting it. `X-Forwarded-Host` and
    /// `Forwarded` (spelled with dashes) are allowed where every host they
    /// name is the request's (a load balancer in front adds them); the
    /// check's own headers that describe the original request, when the
    /// check asks.
    fn remembers(&self, asked: &Asked<'_>, asker: Asker) -> bool {
        let allowed = |name: &str| {
            if matches!(name, "x-forwarded-host" | "forwarded")
                || (asker == Asker::Check && CHECK_HEADERS.contains(&name))
            {
                return true;
            }
            let name = spelled(name);
            MEMORY_HEADERS.contains(&name.as_str())
                || MEMORY_FAMILIES.iter().any(|f| name.starts_with(f))
                || self
                    .memory_headers
                    .iter()
                    .any(|h| match h.strip_suffix('*') {
                        Some(family) => name.starts_with(family),
                        None => **h == *name,
                    })
        };
        matches!(asked.method, "GET" | "HEAD")
            && asked.headers.keys().all(|k| allowed(k.as_str()))
            && !reroutes(asked.headers, asked.host)
    }
}

/// Headers some upstreams (or the frameworks behind them) route by
/// instead of, or besides, `Host` and the target: a request carrying one
/// may have reached another route of the upstream, so its 404 is not
/// stored (it may still be answered from what a plain request stored).
/// `X-Forwarded-Host` and `Forwarded` are not among them when every host
/// they name is the request's `Host` (a load balancer in front adds them
/// to every request): see [`names_another_host`].
const REROUTING: [&str; 9] = [
    "x-original-url",
    "x-rewrite-url",
    "x-forwarded-prefix",
    "x-original-host",
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
    "accept-version",
    "api-version",
];

/// Whether a request carries a header an upstream may route by.
fn reroutes(headers: &HeaderMap, host: &str) -> bool {
    REROUTING.iter().any(|h| headers.contains_key(*h)) || names_another_host(headers, host)
}

/// Whether `X-Forwarded-Host` or `Forwarded`'s `host=` names a host other
/// than `host` (or cannot be read).
fn names_another_host(headers: &HeaderMap, host: &str) -> bool {
    let other = |named: &str| {
        let named = named.trim().trim_matches('"');
        !named.eq_ignore_ascii_case(host)
    };
    let values = |name| headers.get_all(name).into_iter().map(|v| v.to_str());
    let forwarded_host = values("x-forwarded-host").any(|v| match v {
        Ok(v) => v.split(',').any(other),
        Err(_) => true,
    });
    forwarded_host
        || values("forwarded").any(|v| match v {
            Ok(v) => v.split([',', ';']).any(|pair| match pair.split_once('=') {
                Some((k, named)) => k.trim().eq_ignore_ascii_case("host") && other(named),
                // Not `key=value`: unreadable.
                None => !pair.trim().is_empty(),
            }),
            Err(_) => true,
        })
}

/// Whether a `Host` is one the memory can key on: present and visible
/// ASCII (anything else would be folded to one spelling shared by many).
fn plain_host(host: &str) -> bool {
    !host.is_empty() && host.bytes().all(|b| b.is_ascii_graphic())
}

impl Route {
    /// The keys a raw segment names, once decoded and folded as its column
    /// compares; `None` for one not judged: a path parameter, a bad
    /// escape, a key the column cannot hold, an excluded key, one that
    /// does not match `key_pattern`.
    fn keys(&self, raw: &str) -> Option<Spellings> {
        if raw.contains(';') {
            // A path parameter (`u1;jsessionid=…`): Java servers strip it
            // and serve `u1`, so the key is not judged.
            return None;
        }
        let decoded;
        let text = if raw.contains('%') {
            decoded = decode(raw)?;
            std::str::from_utf8(&decoded).ok()?
        } else {
            raw
        };
        let whole = self.spelling(text);
        let stripped = self
            .strip_suffix
            .iter()
            .find_map(|s| text.strip_suffix(s.as_str()).filter(|t| !t.is_empty()))
            .map(|t| self.spelling(t));
        match (whole, stripped) {
            (Spelling::Judged(k), None) => Some(Spellings::One(k)),
            (Spelling::Judged(a), Some(Spelling::Judged(b))) => Some(Spellings::Two(a, b)),
            (Spelling::Unkeyed, Some(Spelling::Judged(b))) => Some(Spellings::Stripped(b)),
            _ => None,
        }
    }

    /// What this route makes of `text`, decoded.
    fn spelling(&self, text: &str) -> Spelling {
        // ASCII case aside: many frameworks route `/ME` as `/me`, and
        // forwarding more is the safe side.
        if self.exclude.iter().any(|e| e.eq_ignore_ascii_case(text)) {
            return Spelling::Unjudged;
        }
        let r = &self.resource;
        let int = r.key_type() == crate::key::KeyType::Int;
        if (int && !text.bytes().all(|b| b.is_ascii_digit()))
            || self.key_pattern.as_ref().is_some_and(|p| !p.is_match(text))
        {
            return Spelling::Unkeyed;
        }
        match r.fold().parse(r.key_type(), text) {
            Ok(k) => Spelling::Judged(k),
            Err(_) => Spelling::Unjudged,
        }
    }

    /// The resource's name.
    #[must_use]
    pub fn resource(&self) -> &str {
        &self.resource.name
    }
}

fn refusal(r: &ProxyRoute) -> Refusal {
    let body = match &r.not_found_body {
        Some(b) => Bytes::from(b.clone()),
        None => Bytes::from(
            serde_json::json!({
                "error": "not_found",
                "message": format!("no {} with this key", r.resource),
            })
            .to_string(),
        ),
    };
    Refusal {
        status: r.not_found_status,
        content_type: hyper::header::HeaderValue::from_str(&r.not_found_content_type)
            .unwrap_or(hyper::header::HeaderValue::from_static("application/json")),
        body,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, hyper::header::HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn forwarded_hosts_equal_to_host_do_not_reroute() {
        let host = "api.test";
        assert!(!reroutes(&headers(&[]), host));
        for same in [
            &[("x-forwarded-host", "api.test")][..],
            &[("x-forwarded-host", "API.test, api.test")],
            &[("forwarded", "for=10.0.0.1;host=api.test;proto=https")],
            &[("forwarded", "for=10.0.0.1, for=10.0.0.2;host=\"api.test\"")],
            &[("forwarded", "for=10.0.0.1")],
        ] {
            assert!(!reroutes(&headers(same), host), "{same:?}");
        }
        for other in [
            &[("x-forwarded-host", "evil.example")][..],
            &[
                ("x-forwarded-host", "api.test"),
                ("x-forwarded-host", "evil.example"),
            ],
            &[("x-forwarded-host", "api.test, evil.example")],
            &[("forwarded", "host=evil.example")],
            &[("forwarded", "evil.example")],
            &[("x-original-url", "/api/profiles/u1")],
            &[("x-http-method-override", "DELETE")],
            &[("accept-version", "2")],
        ] {
            assert!(reroutes(&headers(other), host), "{other:?}");
        }
    }

    #[test]
    fn only_a_plain_host_keys_the_memory() {
        assert!(plain_host("api.test:8080"));
        assert!(!plain_host(""));
        assert!(!plain_host("api test"));
        assert!(!plain_host("ápi.test"));
    }
}
