//! Arbitrary path segments as SKU ids: never a panic; an accepted id is a
//! positive i64 that prints back to the input; a refusal quotes at most 64
//! characters of it.
#![no_main]

use bloomgate_service::error::AppError;
use bloomgate_service::http::input::{parse_id, MAX_QUOTED};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(raw) = std::str::from_utf8(data) else {
        return;
    };
    match parse_id(raw) {
        Ok(id) => {
            assert!(id > 0);
            assert_eq!(raw.trim_start_matches('+').trim_start_matches('0'), id.to_string());
        }
        Err(AppError::BadRequest(message)) => {
            // The message's fixed text plus at most 64 quoted characters,
            // each escaped to at most 10 by `{:?}`, and the ellipsis.
            assert!(message.chars().count() <= 80 + 10 * MAX_QUOTED, "{message}");
        }
        Err(other) => panic!("unexpected error {other:?}"),
    }
});
