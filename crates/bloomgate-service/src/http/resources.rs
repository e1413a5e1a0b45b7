//! The routes of each resource, registered by name (so each has its own
//! `route` label in metrics):
//!
//! * `GET /api/{name}/{key}`: the row as a JSON object, or a 404 JSON error;
//! * `POST /api/{name}/batch` `{"keys": [...]}`: the rows found and the
//!   keys missing;
//! * `POST /api/{name}/exists` `{"keys": [...]}`: the filter's answers;
//! * `POST /api/{name}/keys` and `POST /api/{name}/invalidate` (admin):
//!   writes made elsewhere, applied on every instance;
//! * `POST /api/{name}/warm` (admin) with seed 000's body
//!   `{"limit":N,"rebuild_bloom":bool}`: its first keys into the caches,
//!   and a rebuild of its filter.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Path};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::json;

use crate::error::AppError;
use crate::http::admin::authorize;
use crate::http::edge::Fast;
use crate::http::input::json_body;
use crate::http::route_table::Routes;
use crate::key::Key;
use crate::listen::RateLimit;
use crate::metrics::Outcome;
use crate::resource::reader::Lookup;
use crate::resource::reader::SourceRows;
use crate::resource::{Guarded, Resource};
use crate::sql::Database;
use crate::state::AppState;

/// The body of every resource call.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeysBody {
    keys: Vec<serde_json::Value>,
    /// `invalidate` only: the rows were deleted (counted toward the
    /// rebuild after deletes).
    #[serde(default)]
    deleted: bool,
}

/// How a resource's calls spell its keys in JSON: a SKU id is a positive
/// 64-bit integer; another resource's key is of its key type.
trait JsonKeys: Guarded {
    /// Key `i` of a call's body.
    fn key_from_json(&self, i: usize, v: &serde_json::Value) -> Result<Self::Key, AppError>;
    /// A key in a call's answer.
    fn to_json(key: &Self::Key) -> serde_json::Value;
}

impl JsonKeys for Database {
    fn key_from_json(&self, i: usize, v: &serde_json::Value) -> Result<i64, AppError> {
        match Key::from_json(crate::key::KeyType::Int, v) {
            Ok(Key::Int(id)) if id > 0 => Ok(id),
            Ok(k) => Err(AppError::BadRequest(format!(
                "keys[{i}]: a SKU id is a positive 64-bit integer, got {k}"
            ))),
            // Its own words, with the value clipped.
            Err(e) => Err(AppError::BadRequest(format!("keys[{i}]: {e}"))),
        }
    }

    fn to_json(key: &i64) -> serde_json::Value {
        json!(key)
    }
}

impl JsonKeys for SourceRows {
    fn key_from_json(&self, i: usize, v: &serde_json::Value) -> Result<Key, AppError> {
        Key::from_json(self.0.key_type(), v)
            .map(|k| self.0.fold().apply(k))
            .map_err(|e| AppError::BadRequest(format!("keys[{i}]: {e}")))
    }

    fn to_json(key: &Key) -> serde_json::Value {
        key.to_json()
    }
}

/// The keys of a `{"keys": [...]}` body, at most the resource's
/// `max_batch_keys`, and its `deleted` flag (which only `invalidate`
/// takes).
fn keys_of<R: JsonKeys>(
    r: &Resource<R>,
    call: Call,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(Vec<R::Key>, bool), AppError> {
    let b: KeysBody = json_body(headers, body)?;
    if b.deleted && !matches!(call, Call::Invalidate) {
        return Err(AppError::BadRequest(
            "\"deleted\" is for invalidate only".into(),
        ));
    }
    if b.keys.len() > r.max_batch_keys {
        return Err(AppError::BadRequest(format!(
            "at most {} keys per call, got {}",
            r.max_batch_keys,
            b.keys.len()
        )));
    }
    let keys = b
        .keys
        .iter()
        .enumerate()
        .map(|(i, v)| r.source().key_from_json(i, v))
        .collect::<Result<_, _>>()?;
    Ok((keys, b.deleted))
}

/// `keys` and `invalidate` are admin calls (writes made elsewhere);
/// `batch` and `exists` are reads, open to every client.
fn authorize_call(
    call: Call,
    token: Option<&str>,
    headers: &HeaderMap,
    base: &str,
) -> Result<(), AppError> {
    if matches!(call, Call::Keys | Call::Invalidate) {
        authorize(token, headers, &format!("{base}/{}", call.word()))?;
    }
    Ok(())
}

/// The SKU table's key API routes, `/api/skus/{batch,exists,keys,invalidate}`
/// (a GET of one reads it as an id, which is a 400, as for `/api/skus/abc`).
pub fn sku_routes(state: &AppState, limit: Option<&Arc<RateLimit>>) -> Routes {
    let mut bodies = Routes::new();
    for c in Call::ALL {
        let limit = limit.cloned();
        let route = get(move |s: axum::extract::State<Arc<AppState>>| async move {
            crate::http::routes::sku_detail(s, Path(c.word().to_owned())).await
        })
        .post(
            move |axum::extract::State(s): axum::extract::State<Arc<AppState>>,
                  peer: Option<Extension<ConnectInfo<SocketAddr>>>,
                  h: HeaderMap,
                  b: Bytes| {
                let rate = Rate::of(limit.clone(), peer);
                let token = s.admin_token.clone();
                call(Arc::clone(&s.skus), token, c, rate, h, b, "/api/skus")
            },
        );
        bodies = bodies.route(&format!("/api/skus/{}", c.word()), route);
    }
    bodies.layer(DefaultBodyLimit::max(state.http.body_limit_bytes))
}

async fn read(r: Arc<Resource>, raw: String) -> Response {
    let key = match r.fold().parse(r.key_type(), &raw) {
        Ok(k) => k,
        Err(e) => return AppError::BadRequest(e.to_string()).into_response(),
    };
    let (res, outcome) = read_key(&r, key, &raw).await;
    outcome.note();
    res
}

/// The read of `key` (spelled `raw`) through the funnel, as the route
/// answers it.
async fn read_key(r: &Resource, key: Key, raw: &str) -> (Response, Outcome) {
    let answer = r.get(key).await;
    let outcome = answer.as_ref().map_or(Outcome::ERROR, Lookup::outcome);
    crate::http::telemetry::record_outcome_only(outcome.label());
    let res = match answer {
        Ok(answer) => row_response(r, raw, answer),
        Err(e) => e.into_response(),
    };
    (res, outcome)
}

/// What [`read`] answers for the raw path segment `raw` when it can answer
/// without waiting (a filter "no", an L1 entry): [`read_fast`]'s answer
/// now. `None` for a key that does not parse, and every read that goes on
/// to Redis or SQL.
pub fn read_now(r: &Resource, raw: &str) -> Option<(Response, Outcome)> {
    let key = r.fold().parse(r.key_type(), raw).ok()?;
    answer_now(r, &key, raw)
}

fn answer_now(r: &Resource, key: &Key, raw: &str) -> Option<(Response, Outcome)> {
    let answer = r.get_now(key)?;
    let outcome = answer.outcome();
    crate::http::telemetry::record_outcome_only(outcome.label());
    Some((row_response(r, raw, answer), outcome))
}

/// [`read`] without the router, as the edge runs it (as it does the
/// seckill read, `crate::http::routes::sku_detail_fast`): [`read_now`]'s
/// answer, else the read past L1 as the route's work. A key that does not
/// parse goes to the router, whose handler answers its 400.
pub fn read_fast(r: &Arc<Resource>, raw: &str) -> Fast {
    let Ok(key) = r.fold().parse(r.key_type(), raw) else {
        return Fast::Route;
    };
    if let Some((res, outcome)) = answer_now(r, &key, raw) {
        return Fast::Now(res, outcome);
    }
    let (r, raw) = (Arc::clone(r), raw.to_owned());
    Fast::Later(Box::pin(async move { read_key(&r, key, &raw).await }))
}

/// The answer for a row or its absence (`raw`: the key as decoded from the
/// path; the edge offers the fast answer only keys with nothing to decode).
fn row_response(r: &Resource, raw: &str, answer: Lookup<crate::source::Row>) -> Response {
    match answer {
        Lookup::Found(cached, _) => (
            [(CONTENT_TYPE, HeaderValue::from_static("application/json"))],
            cached.body(),
        )
            .into_response(),
        Lookup::Missing(_) => crate::http::error::not_found(&format!(
            "{} {} not found",
            r.name,
            crate::http::input::clip(raw)
        )),
    }
}

/// The pattern of a resource's read route.
#[must_use]
pub fn read_route(name: &str) -> String {
    format!("/api/{name}/{{key}}")
}

/// The per-client rate limit as a call sees it: the reads (`batch`,
/// `exists`) take one unit per key; the admin calls none.
struct Rate {
    limit: Option<Arc<RateLimit>>,
    peer: Option<SocketAddr>,
}

impl Rate {
    fn of(limit: Option<Arc<RateLimit>>, peer: Option<Extension<ConnectInfo<SocketAddr>>>) -> Self {
        Self {
            limit,
            peer: peer.map(|Extension(ConnectInfo(p))| p),
        }
    }

    fn refuse(&self, call: Call, keys: usize) -> Option<Response> {
        match (&self.limit, call) {
            (Some(limit), Call::Batch | Call::Exists) => {
                crate::http::limits::refuse(limit, limit.client(self.peer), keys.max(1))
            }
            _ => None,
        }
    }
}

/// The calls that read a `{"keys": [...]}` body.
#[derive(Debug, Clone, Copy)]
enum Call {
    Batch,
    Exists,
    Keys,
    Invalidate,
}

impl Call {
    const ALL: [Self; 4] = [Self::Batch, Self::Exists, Self::Keys, Self::Invalidate];

    /// The last segment of its path.
    const fn word(self) -> &'static str {
        match self {
            Self::Batch => "batch",
            Self::Exists => "exists",
            Self::Keys => "keys",
            Self::Invalidate => "invalidate",
        }
    }
}

/// One call: `keys` and `invalidate` are admin calls (writes made
/// elsewhere); `batch` and `exists` are reads.
async fn call<R: JsonKeys>(
    r: Arc<Resource<R>>,
    token: Option<Arc<str>>,
    call: Call,
    rate: Rate,
    headers: HeaderMap,
    body: Bytes,
    base: &'static str,
) -> Result<Response, AppError> {
    authorize_call(call, token.as_deref(), &headers, base)?;
    let (keys, deleted) = keys_of(&r, call, &headers, &body)?;
    if let Some(res) = rate.refuse(call, keys.len()) {
        return Ok(res);
    }
    let answer = match call {
        Call::Batch => {
            let answer = r.batch(&keys).await?;
            let found: Vec<serde_json::Value> = answer
                .found
                .iter()
                .map(|(k, row)| json!({ "key": R::to_json(k), "row": row.row }))
                .collect();
            let missing: Vec<serde_json::Value> = answer.missing.iter().map(R::to_json).collect();
            json!({ "found": found, "missing": missing })
        }
        Call::Exists => json!({ "exists": r.exists(&keys).await? }),
        Call::Keys => {
            let added = r.add_keys(&keys).await?;
            json!({ "added": added.iter().filter(|a| **a).count() })
        }
        Call::Invalidate if deleted => {
            if r.deleted(&keys).await? {
                r.rebuild_shared();
            }
            json!({ "invalidated": keys.len(), "deleted": true })
        }
        Call::Invalidate => {
            r.invalidate(&keys).await?;
            json!({ "invalidated": keys.len() })
        }
    };
    Ok(Json(answer).into_response())
}

/// `POST /api/{name}/warm`: seed 000's warm of the resource.
async fn warm(
    r: Arc<Resource>,
    token: Option<Arc<str>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, AppError> {
    authorize(token.as_deref(), &headers, "/api/{name}/warm")?;
    let req = crate::http::routes::WarmRequest::parse(&headers, &body)?;
    let report = r.warm(req.limit, req.rebuild_bloom).await?;
    Ok(Json(report).into_response())
}

/// Every resource's routes.
pub fn routes(state: &AppState, limit: Option<&Arc<RateLimit>>) -> Routes {
    let mut router = Routes::new();
    for r in &state.resources {
        let base = format!("/api/{}", r.name);
        let mut bodies = Routes::new();
        for c in Call::ALL {
            let (for_get, for_post) = (Arc::clone(r), Arc::clone(r));
            let token = state.admin_token.clone();
            let limit = limit.cloned();
            // A GET of a key spelled like a call (`/api/users/keys`) reads
            // that key: the static route would otherwise answer 405.
            let route = get(move || read(Arc::clone(&for_get), c.word().to_owned())).post(
                move |peer: Option<Extension<ConnectInfo<SocketAddr>>>, h: HeaderMap, b: Bytes| {
                    let rate = Rate::of(limit.clone(), peer);
                    call(
                        Arc::clone(&for_post),
                        token.clone(),
                        c,
                        rate,
                        h,
                        b,
                        "/api/{name}",
                    )
                },
            );
            bodies = bodies.route(&format!("{base}/{}", c.word()), route);
        }
        let (for_get, for_post) = (Arc::clone(r), Arc::clone(r));
        let token = state.admin_token.clone();
        let warm_route = get(move || read(Arc::clone(&for_get), "warm".to_owned()))
            .post(move |h: HeaderMap, b: Bytes| warm(Arc::clone(&for_post), token.clone(), h, b));
        bodies = bodies.route(&format!("{base}/warm"), warm_route);
        let r = Arc::clone(r);
        router = router
            .route(
                &read_route(&r.name),
                get(move |Path(raw): Path<String>| read(Arc::clone(&r), raw)),
            )
            .merge(bodies.layer(DefaultBodyLimit::max(state.http.body_limit_bytes)));
    }
    router
}
