//! The gate's one decision: does a request's method and target name a
//! key its route's filter refuses? Asked by the reverse proxy and by the
//! auth-request check alike, through the same call the service's own
//! `exists` makes ([`Resource::exists_one`]): "no" only while the filter
//! vouches (built, in step; strict and redis modes as configured).

use std::sync::Arc;

use bytes::Bytes;

use super::route::{decode, key_of, normalise};
use crate::config::proxy::{Pattern, ProxyConfig, ProxyRoute};
use crate::resource::Resource;

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
}

/// The verdict on one request.
#[derive(Debug, Clone, Copy)]
pub enum Judgement<'a> {
    /// No route matches (method or path): forwarded, not judged.
    Unrouted,
    /// A route matched and its filter may hold the key (or cannot vouch,
    /// or the key cannot be in the column): forwarded.
    Pass(&'a Route),
    /// A route matched and its filter vouches the key is absent.
    Refuse(&'a Route),
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
    #[must_use]
    pub fn of(config: &ProxyConfig, resources: &[Arc<Resource>]) -> Self {
        let routes = config
            .routes
            .iter()
            .enumerate()
            .filter_map(|(slot, r)| {
                let resource = resources.iter().find(|x| *x.name == *r.resource)?;
                Some(Route {
                    slot,
                    path: r.path.clone(),
                    pattern: Pattern::parse(&r.path).ok()?,
                    methods: r.methods.clone(),
                    resource: Arc::clone(resource),
                    refusal: refusal(r),
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

    /// Judges `method` and `path` (the target without its query).
    pub async fn judge(&self, method: &str, path: &str) -> Judgement<'_> {
        if self.routes.is_empty() {
            return Judgement::Unrouted;
        }
        let Some(segments) = normalise(path) else {
            return Judgement::Unrouted;
        };
        for route in &self.routes {
            if !route.methods.iter().any(|m| m == method) {
                continue;
            }
            let Some(raw) = key_of(&route.pattern, &segments) else {
                continue;
            };
            return if route.holds(raw).await {
                Judgement::Pass(route)
            } else {
                Judgement::Refuse(route)
            };
        }
        Judgement::Unrouted
    }
}

impl Route {
    /// False only when the raw key decodes to a key the column could hold
    /// and the resource's filter vouches that it is absent.
    async fn holds(&self, raw: &str) -> bool {
        if raw.contains(';') {
            // A path parameter (`u1;jsessionid=…`): Java servers strip it
            // and serve `u1`, so the key is not judged.
            return true;
        }
        let decoded;
        let text = if raw.contains('%') {
            let Some(bytes) = decode(raw) else {
                return true;
            };
            decoded = bytes;
            let Ok(text) = std::str::from_utf8(&decoded) else {
                return true;
            };
            text
        } else {
            raw
        };
        let r = &self.resource;
        match r.fold().parse(r.key_type(), text) {
            Ok(key) => r.exists_one(&key).await,
            Err(_) => true,
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
