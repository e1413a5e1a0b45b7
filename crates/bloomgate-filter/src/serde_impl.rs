//! serde support (feature `serde`). Every filter serialises as its snapshot
//! (see [`crate::snapshot`]; [`ScalableBloom::to_bytes`] for chains): bytes,
//! versioned and checksummed, never an array of words. Binary formats
//! (postcard, bincode, MessagePack) store the bytes as they are; text
//! formats (JSON, TOML) store them as one base64 string. Deserialising
//! verifies everything the snapshot loaders verify, so bad bytes are an
//! error, never a filter that could answer "no" for a key it held. The
//! concurrent filters travel as their plain twins' snapshots. The key kind
//! of a snapshot is not kept (it is [`KeyKind::Unspecified`]).
//!
//! ```
//! use bloomgate_filter::{BlockedBloom, Filter};
//! let mut f = BlockedBloom::with_fpr(1000, 0.01).unwrap();
//! f.insert(&42u64);
//! let json = serde_json::to_string(&f).unwrap();
//! let g: BlockedBloom = serde_json::from_str(&json).unwrap();
//! assert!(g.contains(&42u64));
//! ```

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

use crate::snapshot::{KeyKind, Snapshot};
use crate::{
    AtomicBloom, AtomicClassicBloom, BlockedBloom, ClassicBloom, CountingBloom, ScalableBloom,
};

fn put<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
    if s.is_human_readable() {
        s.serialize_str(&STANDARD.encode(bytes))
    } else {
        s.serialize_bytes(bytes)
    }
}

/// Takes the bytes however the format hands them over: borrowed or owned
/// bytes, a base64 string, or a sequence of byte values.
struct BytesVisitor;

impl<'de> de::Visitor<'de> for BytesVisitor {
    type Value = Vec<u8>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a bloomgate snapshot: bytes, or base64 text")
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
        Ok(v.to_vec())
    }

    fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
        Ok(v)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Vec<u8>, E> {
        STANDARD
            .decode(v)
            .map_err(|e| E::custom(format!("snapshot is not base64: {e}")))
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 20));
        while let Some(b) = seq.next_element::<u8>()? {
            out.push(b);
        }
        Ok(out)
    }
}

fn take<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    if d.is_human_readable() {
        d.deserialize_str(BytesVisitor)
    } else {
        d.deserialize_byte_buf(BytesVisitor)
    }
}

/// serde through a filter's bytes: `$to` encodes, `$from` decodes and
/// verifies.
macro_rules! through_bytes {
    ($t:ty, $to:expr, $from:expr) => {
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let to: fn(&$t) -> Vec<u8> = $to;
                put(&to(self), s)
            }
        }

        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let from: fn(&[u8]) -> crate::Result<$t> = $from;
                from(&take(d)?).map_err(de::Error::custom)
            }
        }
    };
}

through_bytes!(BlockedBloom, |f| f.to_bytes(KeyKind::Unspecified), |b| Ok(
    BlockedBloom::from_bytes(b)?.0
));
through_bytes!(ClassicBloom, |f| f.to_bytes(KeyKind::Unspecified), |b| Ok(
    ClassicBloom::from_bytes(b)?.0
));
through_bytes!(CountingBloom, |f| f.to_bytes(KeyKind::Unspecified), |b| Ok(
    CountingBloom::from_bytes(b)?.0
));
through_bytes!(
    ScalableBloom,
    ScalableBloom::to_bytes,
    ScalableBloom::from_bytes
);
through_bytes!(
    AtomicBloom,
    |f| f.to_blocked().to_bytes(KeyKind::Unspecified),
    |b| AtomicBloom::from_blocked(&BlockedBloom::from_bytes(b)?.0)
);
through_bytes!(
    AtomicClassicBloom,
    |f| f.to_classic().to_bytes(KeyKind::Unspecified),
    |b| AtomicClassicBloom::from_classic(&ClassicBloom::from_bytes(b)?.0)
);
