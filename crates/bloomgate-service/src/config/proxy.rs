//! The `[gate]` table: bloomgate in front of an HTTP API it did not
//! write, as a reverse proxy on a listener of its own and as an
//! auth-request check on the service's (see [`crate::proxy`]).

use std::net::SocketAddr;

use serde::Deserialize;

use super::{invalid, ConfigError};

/// The `[gate]` table.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ProxyConfig {
    /// Where the reverse proxy listens; unset: no proxy, only the
    /// auth-request check (`/api/gate/check`) on the service's listener.
    pub listen: Option<SocketAddr>,
    /// The protected service, `http://host:port` (no path).
    pub upstream: String,
    /// Response headers later than this answer 504, milliseconds.
    pub timeout_ms: u64,
    /// A body (either way) that moves no byte for this long is cut,
    /// milliseconds. A body may take as long as it likes in all.
    pub idle_timeout_ms: u64,
    /// Connecting to the upstream gives up after this long (502),
    /// milliseconds.
    pub connect_timeout_ms: u64,
    /// Idle keep-alive connections kept to the upstream, by each of the
    /// gate's threads.
    pub pool_max_idle: usize,
    /// An idle upstream connection is closed after this long, seconds.
    pub pool_idle_secs: u64,
    /// Most client connections open at once; 0: as `http.max_connections`.
    pub max_connections: u64,
    /// Threads serving the gate's client connections (each handed to the
    /// least busy), each a single-threaded runtime with its own upstream
    /// pool; 0: one per core.
    pub threads: usize,
    /// Longest request target (path and query), bytes (414 past it).
    pub max_uri_bytes: usize,
    /// Longest request head (request line and headers), bytes (431 past it).
    pub max_header_bytes: usize,
    /// Most request headers (431 past it).
    pub max_headers: usize,
    /// Peers (addresses or CIDRs: `10.0.0.0/8`, `::1`) whose
    /// `X-Forwarded-*` and `Forwarded` headers are kept, the gate's own
    /// appended; from any other peer they are replaced, since an API that
    /// reads the leftmost value would read the client's own. Empty: no
    /// peer is trusted.
    pub trusted_proxies: Vec<String>,
    /// The routes the filter judges; every other request is forwarded.
    pub routes: Vec<ProxyRoute>,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        Self {
            listen: None,
            upstream: String::new(),
            timeout_ms: 30_000,
            idle_timeout_ms: 60_000,
            connect_timeout_ms: 5_000,
            pool_max_idle: 256,
            pool_idle_secs: 90,
            max_connections: 0,
            threads: 0,
            max_uri_bytes: 8 * 1024,
            max_header_bytes: 64 * 1024,
            max_headers: 100,
            trusted_proxies: Vec::new(),
            routes: Vec::new(),
        }
    }
}

/// One `[[gate.routes]]` entry.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProxyRoute {
    /// The upstream's path, with one `{key}` segment; other `{name}`
    /// segments match any one segment (`/api/{tenant}/users/{key}`).
    pub path: String,
    /// The `[[resources]]` entry whose filter judges the key.
    pub resource: String,
    /// The methods judged (`GET`, `HEAD`); others are forwarded.
    #[serde(default = "default_methods")]
    pub methods: Vec<String>,
    /// A regular expression a key must match in full to be judged; a key
    /// that does not is forwarded (`/api/profiles/me` beside
    /// `/api/profiles/{key}`). An integer key is judged only when it is
    /// digits alone, whatever this says.
    #[serde(default)]
    pub key_pattern: Option<String>,
    /// Keys never judged: the API's other routes at the key's place
    /// (`["me", "search", "new"]`).
    #[serde(default)]
    pub exclude: Vec<String>,
    /// Suffixes the API may read as a format (`[".json", ".xml"]`, Rails'
    /// `(.:format)`): a key with one is refused only when the filter
    /// refuses it both with and without it. The path is forwarded as sent.
    #[serde(default)]
    pub strip_suffix: Vec<String>,
    /// The status of a refusal.
    #[serde(default = "default_status")]
    pub not_found_status: u16,
    /// The body of a refusal; unset: `{"error":"not_found","message":…}`.
    #[serde(default)]
    pub not_found_body: Option<String>,
    /// The content type of a refusal.
    #[serde(default = "default_content_type")]
    pub not_found_content_type: String,
    /// Seconds an upstream 404 for a key the filter let through is
    /// remembered, in process and in Redis, and answered by the gate;
    /// 0: not remembered. Needs the resource's `capture = "triggers"`
    /// (a create drops the memory) and a route whose only variable is
    /// `{key}`.
    #[serde(default)]
    pub cache_not_found_secs: u64,
    /// Headers that may come with a request whose 404 is remembered or
    /// answered from memory, beside the default list (`Accept`,
    /// `User-Agent`, `X-Request-Id`, …): any other header means the 404
    /// may be the caller's. Names compare case-insensitively, `_` read as
    /// `-`; a trailing `*` names a family (`x-b3-*`).
    #[serde(default)]
    pub not_found_memory_headers: Vec<String>,
}

impl ProxyRoute {
    fn validate_shape(&self, at: &dyn Fn(&str) -> String) -> Result<(), ConfigError> {
        if let Some(p) = &self.key_pattern {
            if let Err(e) = regex::Regex::new(&format!("^(?:{p})$")) {
                return Err(invalid(
                    &at("key_pattern"),
                    format!(
                        "not a regular expression: {}",
                        crate::text::clip(&e.to_string())
                    ),
                ));
            }
        }
        if self.exclude.iter().any(String::is_empty) {
            return Err(invalid(&at("exclude"), "a key is not empty"));
        }
        if self.strip_suffix.iter().any(String::is_empty) {
            return Err(invalid(&at("strip_suffix"), "a suffix is not empty"));
        }
        Ok(())
    }

    fn validate_memory_headers(&self, key: &str) -> Result<(), ConfigError> {
        for h in &self.not_found_memory_headers {
            let name = h.strip_suffix('*').unwrap_or(h);
            let ok = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            if !ok {
                return Err(invalid(
                    key,
                    format!(
                        "{:?} is not a header name (letters, digits, - and _, a trailing * for a family)",
                        crate::text::clip(h)
                    ),
                ));
            }
        }
        Ok(())
    }

    fn validate_not_found_cache(&self, key: &str, captured: &[&str]) -> Result<(), ConfigError> {
        if self.cache_not_found_secs == 0 {
            return Ok(());
        }
        if self.cache_not_found_secs > MAX_TIMEOUT_MS / 1000 {
            return Err(invalid(key, "must be at most 86400 (a day)"));
        }
        if !captured.contains(&self.resource.as_str()) {
            return Err(invalid(
                key,
                format!(
                    "needs capture = \"triggers\" on the [[resources]] entry {:?}: a row created by any program must drop a remembered 404",
                    self.resource
                ),
            ));
        }
        if !Pattern::parse(&self.path).is_ok_and(|p| p.key_only()) {
            return Err(invalid(
                key,
                format!(
                    "needs a path whose only variable is {{key}} ({:?} has others: their 404 may not be the key's)",
                    self.path
                ),
            ));
        }
        Ok(())
    }
}

fn default_methods() -> Vec<String> {
    vec!["GET".into(), "HEAD".into()]
}

const fn default_status() -> u16 {
    404
}

fn default_content_type() -> String {
    "application/json".into()
}

impl ProxyConfig {
    /// Whether the table says anything: a listener or a route.
    #[must_use]
    pub fn is_set(&self) -> bool {
        self.listen.is_some() || !self.routes.is_empty()
    }

    /// Checks the table against the `[[resources]]` names (`names`).
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the key.
    pub fn validate(&self, names: &[&str], captured: &[&str]) -> Result<(), ConfigError> {
        if self.listen.is_some() || !self.upstream.is_empty() {
            upstream_authority(&self.upstream)?;
        }
        for (key, value) in [
            ("gate.timeout_ms", self.timeout_ms),
            ("gate.idle_timeout_ms", self.idle_timeout_ms),
            ("gate.connect_timeout_ms", self.connect_timeout_ms),
            ("gate.max_uri_bytes", self.max_uri_bytes as u64),
            ("gate.max_headers", self.max_headers as u64),
        ] {
            if value == 0 {
                return Err(invalid(key, "must be at least 1"));
            }
        }
        for (key, value) in [
            ("gate.timeout_ms", self.timeout_ms),
            ("gate.idle_timeout_ms", self.idle_timeout_ms),
            ("gate.connect_timeout_ms", self.connect_timeout_ms),
        ] {
            if value > MAX_TIMEOUT_MS {
                return Err(invalid(
                    key,
                    format!("must be at most {MAX_TIMEOUT_MS} (a day)"),
                ));
            }
        }
        for p in &self.trusted_proxies {
            if trusted_net(p).is_none() {
                return Err(invalid(
                    "gate.trusted_proxies",
                    format!(
                        "{:?} is not an address or a CIDR (10.0.0.0/8, ::1)",
                        crate::text::clip(p)
                    ),
                ));
            }
        }
        if self.max_header_bytes < 8192 {
            return Err(invalid("gate.max_header_bytes", "must be at least 8192"));
        }
        for (i, r) in self.routes.iter().enumerate() {
            let at = |field: &str| format!("gate.routes[{i}].{field}");
            Pattern::parse(&r.path)
                .map_err(|why| invalid(&at("path"), format!("{:?}: {why}", r.path)))?;
            if !names.contains(&r.resource.as_str()) {
                return Err(invalid(
                    &at("resource"),
                    format!(
                        "names no [[resources]] entry: {:?} (configured: {})",
                        r.resource,
                        names.join(", ")
                    ),
                ));
            }
            if r.methods.is_empty() {
                return Err(invalid(&at("methods"), "must name at least one method"));
            }
            for m in &r.methods {
                if !matches!(m.as_str(), "GET" | "HEAD") {
                    return Err(invalid(
                        &at("methods"),
                        format!(
                            "{:?} is not a method the gate judges: GET and HEAD only (an API may create with PUT or POST to a key no row has yet)",
                            crate::text::clip(m)
                        ),
                    ));
                }
            }
            r.validate_shape(&at)?;
            if !(400..=599).contains(&r.not_found_status) {
                return Err(invalid(&at("not_found_status"), "must be 400 to 599"));
            }
            if http_header_value_invalid(&r.not_found_content_type) {
                return Err(invalid(
                    &at("not_found_content_type"),
                    "must be a valid header value",
                ));
            }
            r.validate_not_found_cache(&at("cache_not_found_secs"), captured)?;
            r.validate_memory_headers(&at("not_found_memory_headers"))?;
        }
        self.validate_overlaps()
    }

    /// Two routes that judge one request are a configuration error: the
    /// first would judge it against its own table, whichever the API
    /// meant (`/api/{kind}/{key}` listed before `/api/profiles/{key}`).
    fn validate_overlaps(&self) -> Result<(), ConfigError> {
        let parsed: Vec<Option<Pattern>> = self
            .routes
            .iter()
            .map(|r| Pattern::parse(&r.path).ok())
            .collect();
        for (i, a) in self.routes.iter().enumerate() {
            for (j, b) in self.routes.iter().enumerate().skip(i + 1) {
                let (Some(pa), Some(pb)) = (&parsed[i], &parsed[j]) else {
                    continue;
                };
                let same_method = a.methods.iter().any(|m| b.methods.contains(m));
                if same_method && pa.overlaps(pb) {
                    return Err(invalid(
                        &format!("gate.routes[{j}].path"),
                        format!(
                            "{:?} and gate.routes[{i}].path {:?} match the same requests: make them disjoint (a literal segment where one has a variable)",
                            b.path, a.path
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// One segment of a route's path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// Matches this text exactly (a request's segment once decoded).
    Literal(String),
    /// The key: any one non-empty segment.
    Key,
    /// Any one non-empty segment (`{tenant}`).
    Any,
}

/// A route's path, parsed: `/api/profiles/{key}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    segments: Vec<Segment>,
    key: usize,
}

impl Pattern {
    /// Parses a route's path: it starts with `/`, has exactly one
    /// `{key}`, every `{…}` is a whole segment, and literals are written
    /// decoded (no `%`, no dot segments).
    ///
    /// # Errors
    /// Why it is not a route's path.
    pub fn parse(path: &str) -> Result<Self, &'static str> {
        let Some(rest) = path.strip_prefix('/') else {
            return Err("must start with /");
        };
        let mut segments = Vec::new();
        let mut key = None;
        for s in rest.split('/') {
            if s.is_empty() {
                return Err("has an empty segment");
            }
            if let Some(name) = s.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                let word = name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
                if name.is_empty() || !word {
                    return Err("a {name} is letters, digits and _");
                }
                if name == "key" {
                    if key.is_some() {
                        return Err("has more than one {key}");
                    }
                    key = Some(segments.len());
                    segments.push(Segment::Key);
                } else {
                    segments.push(Segment::Any);
                }
            } else if s.contains(['{', '}']) {
                return Err("a {name} must be a whole segment");
            } else if s.contains(['%', '?', '#']) {
                return Err("write literals decoded, without %, ? or #");
            } else if s == "." || s == ".." {
                return Err("has a dot segment");
            } else {
                segments.push(Segment::Literal(s.to_owned()));
            }
        }
        let key = key.ok_or("needs one {key} segment")?;
        Ok(Self { segments, key })
    }

    /// The segments.
    #[must_use]
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// The index of the `{key}` segment.
    #[must_use]
    pub fn key_index(&self) -> usize {
        self.key
    }

    /// Whether some path matches both patterns: as many segments, and at
    /// each a variable on either side or the same literal.
    #[must_use]
    pub fn overlaps(&self, other: &Self) -> bool {
        self.segments.len() == other.segments.len()
            && self
                .segments
                .iter()
                .zip(&other.segments)
                .all(|pair| match pair {
                    (Segment::Literal(a), Segment::Literal(b)) => a == b,
                    _ => true,
                })
    }

    /// Whether the key is the only variable segment.
    #[must_use]
    pub fn key_only(&self) -> bool {
        !self.segments.iter().any(|s| matches!(s, Segment::Any))
    }
}

/// The network of a `gate.trusted_proxies` entry: a CIDR, or one address.
#[must_use]
pub fn trusted_net(entry: &str) -> Option<ipnet::IpNet> {
    let entry = entry.trim();
    entry.parse::<ipnet::IpNet>().ok().or_else(|| {
        entry
            .parse::<std::net::IpAddr>()
            .ok()
            .map(ipnet::IpNet::from)
    })
}

/// The longest timeout, milliseconds: a day.
const MAX_TIMEOUT_MS: u64 = 86_400_000;

fn http_header_value_invalid(v: &str) -> bool {
    v.is_empty() || v.bytes().any(|b| b < 0x20 || b == 0x7f)
}

/// The upstream's `host:port` (port 80 when it names none).
///
/// # Errors
/// [`ConfigError::Invalid`] for `gate.upstream` when it is not
/// `http://host[:port]` with no path.
pub fn upstream_authority(upstream: &str) -> Result<String, ConfigError> {
    let bad = |why: &str| invalid("gate.upstream", format!("{upstream:?}: {why}"));
    if upstream.is_empty() {
        return Err(bad("required when gate.listen is set"));
    }
    let Some(rest) = upstream.strip_prefix("http://") else {
        return Err(bad(
            "must start with http:// (an https upstream is not supported: put TLS in front of the gate, not behind it)",
        ));
    };
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.is_empty() || authority.contains(['/', '?', '#', '@']) {
        return Err(bad("must be http://host:port with no path"));
    }
    let uri: Result<hyper::http::uri::Authority, _> = authority.parse();
    if uri.is_err() {
        return Err(bad("not a host and port"));
    }
    Ok(authority.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_of(r: Result<(), ConfigError>) -> String {
        match r {
            Err(ConfigError::Invalid { key, .. }) => key,
            other => panic!("{other:?}"),
        }
    }

    fn route(path: &str) -> ProxyRoute {
        ProxyRoute {
            path: path.into(),
            resource: "users".into(),
            methods: default_methods(),
            not_found_status: 404,
            not_found_body: None,
            not_found_content_type: default_content_type(),
            cache_not_found_secs: 0,
            not_found_memory_headers: Vec::new(),
            key_pattern: None,
            exclude: Vec::new(),
            strip_suffix: Vec::new(),
        }
    }

    #[test]
    fn routes_say_what_a_key_is_and_never_overlap() {
        let mut c = ProxyConfig {
            upstream: "http://127.0.0.1:9000".into(),
            routes: vec![route("/api/profiles/{key}")],
            ..ProxyConfig::default()
        };
        let check = |c: &ProxyConfig| c.validate(&["users"], &[]);
        for m in ["PUT", "POST", "DELETE", "PATCH", "get"] {
            c.routes[0].methods = vec!["GET".into(), m.into()];
            assert_eq!(key_of(check(&c)), "gate.routes[0].methods", "{m}");
        }
        c.routes[0].methods = default_methods();
        c.routes[0].key_pattern = Some("[a-z]+(".into());
        assert_eq!(key_of(check(&c)), "gate.routes[0].key_pattern");
        c.routes[0].key_pattern = Some("[a-z][a-z0-9]*".into());
        c.routes[0].exclude = vec!["me".into(), String::new()];
        assert_eq!(key_of(check(&c)), "gate.routes[0].exclude");
        c.routes[0].exclude = vec!["me".into()];
        c.routes[0].strip_suffix = vec![String::new()];
        assert_eq!(key_of(check(&c)), "gate.routes[0].strip_suffix");
        c.routes[0].strip_suffix = vec![".json".into()];
        assert!(check(&c).is_ok(), "{:?}", check(&c));
        // A broader route beside it: an error naming both.
        c.routes.push(route("/api/{kind}/{key}"));
        let e = check(&c).unwrap_err().to_string();
        assert!(
            e.contains("gate.routes[1].path")
                && e.contains("gate.routes[0].path")
                && e.contains("/api/{kind}/{key}")
                && e.contains("/api/profiles/{key}"),
            "{e}"
        );
        // Disjoint: another literal, another length, or other methods.
        for (path, methods) in [
            ("/api/orders/{key}", default_methods()),
            ("/api/{kind}/{key}/x", default_methods()),
        ] {
            c.routes[1] = route(path);
            c.routes[1].methods = methods;
            assert!(check(&c).is_ok(), "{path}: {:?}", check(&c));
        }
        c.routes[0].methods = vec!["GET".into()];
        c.routes[1] = route("/api/{kind}/{key}");
        c.routes[1].methods = vec!["HEAD".into()];
        assert!(check(&c).is_ok(), "{:?}", check(&c));
    }

    #[test]
    fn memory_headers_are_header_names() {
        let mut r = route("/api/profiles/{key}");
        for ok in ["x-b3-*", "X_Client", "x-api-version"] {
            r.not_found_memory_headers = vec![ok.into()];
            assert!(r.validate_memory_headers("k").is_ok(), "{ok}");
        }
        for bad in ["", "*", "x b3", "x:y", "é"] {
            r.not_found_memory_headers = vec![bad.into()];
            assert_eq!(key_of(r.validate_memory_headers("k")), "k", "{bad:?}");
        }
    }

    #[test]
    fn remembered_404s_need_capture_and_a_key_only_route() {
        let mut c = ProxyConfig {
            upstream: "http://127.0.0.1:9000".into(),
            routes: vec![route("/api/profiles/{key}")],
            ..ProxyConfig::default()
        };
        c.routes[0].cache_not_found_secs = 60;
        let at = "gate.routes[0].cache_not_found_secs";
        assert_eq!(key_of(c.validate(&["users"], &[])), at, "no capture");
        assert!(c.validate(&["users"], &["users"]).is_ok());
        c.routes[0].path = "/api/{tenant}/profiles/{key}".into();
        assert_eq!(key_of(c.validate(&["users"], &["users"])), at, "{{tenant}}");
        c.routes[0].path = "/api/profiles/{key}".into();
        c.routes[0].cache_not_found_secs = 86_401;
        assert_eq!(key_of(c.validate(&["users"], &["users"])), at, "over a day");
    }

    #[test]
    fn the_table_loads_from_toml_with_its_defaults() {
        let c: super::super::Config = toml::from_str(
            "[gate]\nlisten = \"127.0.0.1:8088\"\nupstream = \"http://127.0.0.1:9000\"\n\
             [[gate.routes]]\npath = \"/api/profiles/{key}\"\nresource = \"users\"\n\
             [[resources]]\nname = \"users\"\ntable = \"users\"\nkey = \"id\"\nkey_type = \"text\"\n",
        )
        .unwrap();
        assert_eq!(c.gate.routes[0].methods, ["GET", "HEAD"]);
        assert_eq!(c.gate.routes[0].not_found_status, 404);
        assert!(c.validate().is_ok(), "{:?}", c.validate());
    }

    #[test]
    fn refusals_name_the_key() {
        let mut c = ProxyConfig {
            listen: Some("127.0.0.1:8088".parse().unwrap()),
            upstream: "http://127.0.0.1:9000".into(),
            routes: vec![route("/api/profiles/{key}")],
            ..ProxyConfig::default()
        };
        assert!(c.validate(&["users"], &[]).is_ok());
        assert_eq!(
            key_of(c.validate(&["orders"], &[])),
            "gate.routes[0].resource"
        );
        for bad in [
            "https://x:1",
            "http://",
            "http://h:1/base",
            "127.0.0.1:9000",
            "",
        ] {
            c.upstream = bad.into();
            assert_eq!(
                key_of(c.validate(&["users"], &[])),
                "gate.upstream",
                "{bad}"
            );
        }
        c.upstream = "http://127.0.0.1:9000/".into();
        assert!(c.validate(&["users"], &[]).is_ok());
        for bad in [
            "/api/profiles",
            "api/{key}",
            "/a/{key}/{key}",
            "/a/x{key}",
            "/a/{}",
            "/a%20b/{key}",
            "/a/../{key}",
        ] {
            c.routes = vec![route(bad)];
            assert_eq!(
                key_of(c.validate(&["users"], &[])),
                "gate.routes[0].path",
                "{bad}"
            );
        }
        c.routes = vec![route("/a/{key}")];
        c.routes[0].methods = vec!["PUT".into()];
        assert_eq!(
            key_of(c.validate(&["users"], &[])),
            "gate.routes[0].methods"
        );
        c.routes[0].methods = vec!["GET".into()];
        c.routes[0].not_found_status = 200;
        assert_eq!(
            key_of(c.validate(&["users"], &[])),
            "gate.routes[0].not_found_status"
        );
        c.routes[0].not_found_status = 410;
        c.idle_timeout_ms = u64::MAX;
        assert_eq!(key_of(c.validate(&["users"], &[])), "gate.idle_timeout_ms");
        c.idle_timeout_ms = 1000;
        c.max_header_bytes = 100;
        assert_eq!(key_of(c.validate(&["users"], &[])), "gate.max_header_bytes");
    }
}
