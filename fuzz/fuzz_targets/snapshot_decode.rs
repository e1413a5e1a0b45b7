//! Feeds arbitrary bytes to every snapshot decoder: none may panic, and a
//! file that decodes must re-encode to the same bytes.
#![no_main]

use bloomgate_filter::{snapshot, BlockedBloom, ClassicBloom, CountingBloom, Snapshot};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = snapshot::decode_header(data, None);
    if let Ok((f, kind)) = BlockedBloom::from_bytes(data) {
        assert_eq!(f.to_bytes(kind), data);
    }
    if let Ok((f, kind)) = ClassicBloom::from_bytes(data) {
        assert_eq!(f.to_bytes(kind), data);
    }
    if let Ok((f, kind)) = CountingBloom::from_bytes(data) {
        assert_eq!(f.to_bytes(kind), data);
    }
});
