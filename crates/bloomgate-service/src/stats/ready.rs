//! Readiness, for an orchestrator's probe (`GET /readyz`): an instance is
//! ready when every guarded table's filter is built (or restored) and in
//! step with the change feed. Until then its filter cannot say "no" for
//! the database, so a load balancer should send it nothing. Liveness
//! (`/healthz`) asks none of this.

use serde_json::{json, Map, Value};

use crate::state::AppState;

/// Whether the instance is ready, and the body that says why: every
/// resource's state (see [`crate::shield::Shield::readiness`]), the SKU table
/// first as `skus`.
#[must_use]
pub fn readiness(state: &AppState) -> (bool, Value) {
    let mut resources = Map::new();
    let mut waiting = Vec::new();
    let sku_builds = state.cache_config().bloom_build_on_start;
    let shields = std::iter::once((crate::sql::SKU_RESOURCE, state.skus.shield(), sku_builds))
        .filter(|_| state.demo)
        .chain(state.resources.iter().map(|r| (&*r.name, r.shield(), true)));
    for (name, shield, builds) in shields {
        let (ready, v) = shield.readiness(builds);
        if !ready {
            waiting.push(format!("{name}: {}", v["state"].as_str().unwrap_or("?")));
        }
        resources.insert(name.to_owned(), v);
    }
    let ready = waiting.is_empty();
    let mut body = json!({ "ready": ready, "resources": resources });
    if !ready {
        body["error"] = "not_ready".into();
        body["message"] = format!("not ready: {}", waiting.join("; ")).into();
    }
    (ready, body)
}
