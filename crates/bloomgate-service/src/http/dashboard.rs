//! `GET /dashboard`: one HTML page, embedded in the binary (no CDN: the
//! machines may be offline), that polls `/api/cache/stats` and draws
//! read rates by outcome, hit ratios, penetration, fill and FPR, the
//! alarm and the rebuild history.

use axum::response::Html;

/// The page.
pub const PAGE: &str = include_str!("../../assets/dashboard.html");

/// Serves the page.
#[utoipa::path(get, path = "/dashboard",
    responses((status = 200, description = "The live dashboard", body = String, content_type = "text/html")))]
pub async fn page() -> Html<&'static str> {
    Html(PAGE)
}
