//! Arbitrary bytes as a RESP connection's input: never a panic; every
//! command parsed lies inside the buffer and within the limits; a command
//! found in a prefix is found the same in the whole (frames split across
//! reads parse alike); a parse that needs more bytes never claims any.
#![no_main]

use bloomgate_service::resp::frame::{parse, Limits, Parsed};
use libfuzzer_sys::fuzz_target;

const LIMITS: Limits = Limits {
    max_bulk: 512,
    max_args: 16,
    max_request: 2048,
};

fuzz_target!(|data: &[u8]| {
    let (mut whole, mut part) = (Parsed::default(), Parsed::default());
    let mut at = 0;
    while at < data.len() {
        let rest = &data[at..];
        let Ok(found) = parse(rest, &LIMITS, &mut whole) else {
            return;
        };
        let Some(used) = found else {
            // More is needed, and it says at least how much more.
            assert!(whole.need > rest.len());
            return;
        };
        assert!(used > 0 && used <= rest.len());
        assert!(whole.args.len() <= LIMITS.max_args);
        let args: Vec<Vec<u8>> = (0..whole.args.len()).map(|i| whole.arg(rest, i).to_vec()).collect();
        if rest[0] == b'*' {
            assert!(args.iter().all(|a| a.len() <= LIMITS.max_bulk));
        }
        // The same command from exactly its own bytes.
        let own = &rest[..used];
        assert_eq!(parse(own, &LIMITS, &mut part), Ok(Some(used)));
        let again: Vec<Vec<u8>> = (0..part.args.len()).map(|i| part.arg(own, i).to_vec()).collect();
        assert_eq!(args, again);
        // Any shorter prefix of a multibulk command needs more bytes.
        if rest[0] == b'*' && used > 1 {
            assert_eq!(parse(&own[..used - 1], &LIMITS, &mut part), Ok(None));
        }
        at += used;
    }
});
