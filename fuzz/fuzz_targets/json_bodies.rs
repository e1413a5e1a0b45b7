//! Arbitrary bodies for every route that takes one (warm, create, update),
//! with or without a JSON content type: never a panic, only 400 or 415,
//! and messages that quote at most 64 characters of any input span.
#![no_main]

use axum::http::{HeaderMap, HeaderValue};
use bloomgate_service::error::AppError;
use bloomgate_service::http::input::json_body;
use bloomgate_service::model::SkuInput;
use bloomgate_service::http::routes::WarmRequest;
use libfuzzer_sys::fuzz_target;

fn check(r: Result<(), AppError>) {
    match r {
        Ok(()) => {}
        Err(AppError::BadRequest(m) | AppError::UnsupportedMediaType(m)) => {
            for span in m.split(['`', '"']).skip(1).step_by(2) {
                assert!(span.chars().count() <= 65, "a quoted span of {} chars: {m}", span.chars().count());
            }
        }
        Err(other) => panic!("unexpected error {other:?}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let mut headers = HeaderMap::new();
    if selector & 1 == 0 {
        headers.insert("content-type", HeaderValue::from_static("application/json"));
    }
    match selector >> 1 & 1 {
        0 => check(json_body::<Option<WarmRequest>>(&headers, body).map(drop)),
        _ => check(json_body::<SkuInput>(&headers, body).and_then(|s| {
            s.validate().map_err(|e| AppError::BadRequest(e.to_string()))
        })),
    }
});
