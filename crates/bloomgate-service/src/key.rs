//! The key of a guarded row: a 64-bit integer or a string, as a resource's
//! `key_type` says. Hashes exactly as the filter crate hashes an `i64` or
//! a `str`, so a SKU id is the same key either way.

use std::fmt;

use bloomgate_filter::{BloomKey, HashPair};

pub use crate::config::resources::KeyType;

/// The longest text key accepted (bytes): the outbox stores keys in a
/// `VARCHAR(255)`.
pub const MAX_TEXT_KEY: usize = 255;

/// One key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    /// An integer key.
    Int(i64),
    /// A text key.
    Text(String),
}

impl Key {
    /// Parses `raw` as a key of type `ty`; the error says why, quoting at
    /// most 64 characters.
    ///
    /// # Errors
    /// A message for a 400: not an integer, empty, too long, or holding a
    /// control character.
    pub fn parse(ty: KeyType, raw: &str) -> Result<Self, String> {
        let quoted = crate::text::clip(raw);
        match ty {
            KeyType::Int => raw
                .parse::<i64>()
                .map(Self::Int)
                .map_err(|_| format!("key must be a 64-bit integer, got {quoted:?}")),
            KeyType::Text if raw.is_empty() => Err("key must not be empty".into()),
            KeyType::Text if raw.len() > MAX_TEXT_KEY => Err(format!(
                "key is longer than {MAX_TEXT_KEY} bytes: {quoted:?}"
            )),
            KeyType::Text if raw.chars().any(char::is_control) => {
                Err(format!("key holds a control character: {quoted:?}"))
            }
            KeyType::Text => Ok(Self::Text(raw.to_owned())),
        }
    }

    /// Reads a key of type `ty` from a JSON value (a number or a string
    /// of digits for integers, a string for text).
    ///
    /// # Errors
    /// As [`Key::parse`], or for a value of another JSON type.
    pub fn from_json(ty: KeyType, v: &serde_json::Value) -> Result<Self, String> {
        match (ty, v) {
            (KeyType::Int, serde_json::Value::Number(n)) => n
                .as_i64()
                .map(Self::Int)
                .ok_or_else(|| format!("key must be a 64-bit integer, got {n}")),
            (_, serde_json::Value::String(s)) => Self::parse(ty, s),
            (KeyType::Int, other) => Err(format!(
                "key must be an integer, got {}",
                crate::text::clip(&other.to_string())
            )),
            (KeyType::Text, other) => Err(format!(
                "key must be a string, got {}",
                crate::text::clip(&other.to_string())
            )),
        }
    }

    /// The key as JSON (a number or a string).
    #[must_use]
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Self::Int(i) => (*i).into(),
            Self::Text(s) => s.as_str().into(),
        }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Int(i) => write!(f, "{i}"),
            Self::Text(s) => f.write_str(s),
        }
    }
}

impl BloomKey for Key {
    #[inline]
    fn hash_pair(&self, seed: u64) -> HashPair {
        match self {
            Self::Int(i) => i.hash_pair(seed),
            Self::Text(s) => s.as_str().hash_pair(seed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_hash_as_their_plain_types() {
        assert_eq!(Key::Int(42).hash_pair(7), 42i64.hash_pair(7));
        assert_eq!(Key::Text("u1001".into()).hash_pair(7), "u1001".hash_pair(7));
    }

    #[test]
    fn parse_refuses_what_cannot_be_a_key() {
        assert_eq!(Key::parse(KeyType::Int, "-5"), Ok(Key::Int(-5)));
        assert!(Key::parse(KeyType::Int, "u1").is_err());
        assert_eq!(
            Key::parse(KeyType::Text, "u1001"),
            Ok(Key::Text("u1001".into()))
        );
        assert!(Key::parse(KeyType::Text, "").is_err());
        assert!(Key::parse(KeyType::Text, "a\nb").is_err());
        assert!(Key::parse(KeyType::Text, &"x".repeat(256)).is_err());
        assert!(Key::parse(KeyType::Text, &"x".repeat(255)).is_ok());
        let json = serde_json::json!([7, "8", "u1", true]);
        let a = json.as_array().unwrap();
        assert_eq!(Key::from_json(KeyType::Int, &a[0]), Ok(Key::Int(7)));
        assert_eq!(Key::from_json(KeyType::Int, &a[1]), Ok(Key::Int(8)));
        assert!(Key::from_json(KeyType::Int, &a[2]).is_err());
        assert!(Key::from_json(KeyType::Text, &a[0]).is_err());
        assert!(Key::from_json(KeyType::Text, &a[3]).is_err());
    }
}
