//! A router and the patterns of its routes, built together: the edge
//! (`crate::http::edge`) wraps the whole router and names each request's route
//! by matching these patterns itself.

use std::sync::Arc;

use std::convert::Infallible;

use axum::extract::Request;
use axum::response::IntoResponse;
use axum::routing::{MethodRouter, Route};
use axum::Router;
use tower::{Layer, Service};

use crate::state::AppState;

/// A router with the patterns of its routes, which the edge matches to
/// name each request's route: both come from one [`Routes::route`] call,
/// so they cannot disagree.
pub struct Routes {
    router: Router<Arc<AppState>>,
    patterns: Vec<String>,
}

impl Default for Routes {
    fn default() -> Self {
        Self::new()
    }
}

impl Routes {
    /// No routes.
    #[must_use]
    pub fn new() -> Self {
        Self {
            router: Router::new(),
            patterns: Vec::new(),
        }
    }

    /// Adds `method` at `path`, as `Router::route` does.
    #[must_use]
    pub fn route(mut self, path: &str, method: MethodRouter<Arc<AppState>>) -> Self {
        self.router = self.router.route(path, method);
        self.patterns.push(path.to_owned());
        self
    }

    /// Adds every route of `other`, as `Router::merge` does.
    #[must_use]
    pub fn merge(mut self, other: Self) -> Self {
        self.router = self.router.merge(other.router);
        self.patterns.extend(other.patterns);
        self
    }

    /// Applies `layer` to every route so far (a layer for this group
    /// only), as `Router::layer` does. It takes a layer, not the router,
    /// so no route can join the router without its pattern.
    #[must_use]
    pub fn layer<L>(mut self, layer: L) -> Self
    where
        L: Layer<Route> + Clone + Send + Sync + 'static,
        L::Service: Service<Request> + Clone + Send + Sync + 'static,
        <L::Service as Service<Request>>::Response: IntoResponse + 'static,
        <L::Service as Service<Request>>::Error: Into<Infallible> + 'static,
        <L::Service as Service<Request>>::Future: Send + 'static,
    {
        self.router = self.router.layer(layer);
        self
    }

    /// The router and its patterns.
    pub fn into_parts(self) -> (Router<Arc<AppState>>, Vec<String>) {
        (self.router, self.patterns)
    }
}
