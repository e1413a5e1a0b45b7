//! The OpenAPI 3 contract of every route, generated from the handlers'
//! annotations (utoipa) and served at `/openapi.json`.

use axum::Json;
use utoipa::OpenApi;

use crate::http::routes;

/// The service's OpenAPI document.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "bloomgate",
        description = "The seckill SKU service behind a Bloom-filter shield."
    ),
    paths(
        routes::sku_detail,
        routes::sku_by_id,
        routes::warm,
        routes::stats,
        routes::create_sku,
        routes::update_sku,
        routes::delete_sku,
        routes::ping,
        routes::readyz,
        routes::metrics,
        crate::http::dashboard::page,
    ),
    components(schemas(
        crate::model::Sku,
        crate::model::SkuInput,
        crate::error::ErrorBody,
        routes::WarmRequest
    ))
)]
pub struct ApiDoc;

/// `GET /openapi.json`.
pub async fn serve() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
