//! The key of a guarded row: a 64-bit integer or a string, as a resource's
//! `key_type` says. Hashes exactly as the filter crate hashes an `i64` or
//! a `str`, so a SKU id is the same key either way.
//!
//! A text key is folded the way its column's collation compares ([`Fold`])
//! before it is hashed, cached or looked up, so that every spelling the
//! database calls equal (`U1001 ` and `u1001` under MariaDB's default
//! collation) is one key. A spelling the fold cannot put in its class is
//! a [`Key::Loose`]: the filter never refuses it and no cache holds it.

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
    /// A text key, folded as its column compares.
    Text(String),
    /// A text key outside what its column's fold knows (see [`Fold`]):
    /// the database may call it equal to other spellings. Never refused by
    /// a filter, never cached; as a row's key it marks its filter with
    /// [`LOOSE_MARK`] (it hashes as the mark).
    Loose(String),
}

/// What a filter holds once a row with a [`Key::Loose`] key was added:
/// holds a control character, so no parsed key is ever this text.
pub const LOOSE_MARK: &str = "\u{0}bloomgate:loose";

/// Why a key is not one of its column's (its text a 400 answers with;
/// each quotes at most 64 characters of the key).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// Not a 64-bit integer (the value as given).
    #[error("key must be a 64-bit integer, got {0}")]
    NotInt(String),
    /// Empty text.
    #[error("key must not be empty")]
    Empty,
    /// Text longer than [`MAX_TEXT_KEY`] bytes.
    #[error("key is longer than {MAX_TEXT_KEY} bytes: {0:?}")]
    TooLong(String),
    /// Text with a control character.
    #[error("key holds a control character: {0:?}")]
    Control(String),
    /// A JSON value neither a number nor a string, for an integer key.
    #[error("key must be an integer, got {0}")]
    NotJsonInt(String),
    /// A JSON value not a string, for a text key.
    #[error("key must be a string, got {0}")]
    NotJsonText(String),
}

impl Key {
    /// Parses `raw` as a key of type `ty`; the error says why, quoting at
    /// most 64 characters.
    ///
    /// # Errors
    /// [`KeyError`] (for a 400): not an integer, empty, too long, or
    /// holding a control character.
    pub fn parse(ty: KeyType, raw: &str) -> Result<Self, KeyError> {
        let quoted = || crate::text::clip(raw);
        match ty {
            KeyType::Int => raw
                .parse::<i64>()
                .map(Self::Int)
                .map_err(|_| KeyError::NotInt(format!("{:?}", quoted()))),
            KeyType::Text if raw.is_empty() => Err(KeyError::Empty),
            KeyType::Text if raw.len() > MAX_TEXT_KEY => Err(KeyError::TooLong(quoted())),
            KeyType::Text if raw.chars().any(char::is_control) => Err(KeyError::Control(quoted())),
            KeyType::Text => Ok(Self::Text(raw.to_owned())),
        }
    }

    /// Reads a key of type `ty` from a JSON value (a number or a string
    /// of digits for integers, a string for text).
    ///
    /// # Errors
    /// As [`Key::parse`], or for a value of another JSON type.
    pub fn from_json(ty: KeyType, v: &serde_json::Value) -> Result<Self, KeyError> {
        let clipped = |v: &serde_json::Value| crate::text::clip(&v.to_string());
        match (ty, v) {
            (KeyType::Int, serde_json::Value::Number(n)) => n
                .as_i64()
                .map(Self::Int)
                .ok_or_else(|| KeyError::NotInt(n.to_string())),
            (_, serde_json::Value::String(s)) => Self::parse(ty, s),
            (KeyType::Int, other) => Err(KeyError::NotJsonInt(clipped(other))),
            (KeyType::Text, other) => Err(KeyError::NotJsonText(clipped(other))),
        }
    }

    /// The key as JSON (a number or a string).
    #[must_use]
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Self::Int(i) => (*i).into(),
            Self::Text(s) | Self::Loose(s) => s.as_str().into(),
        }
    }

    /// Whether the filter may judge this key (and a cache hold it): every
    /// key but a [`Key::Loose`].
    #[must_use]
    pub const fn judged(&self) -> bool {
        !matches!(self, Self::Loose(_))
    }
}

/// How a text key column compares, as far as the filter needs to know:
/// found from the column's collation when its table is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fold {
    /// Byte for byte (a binary or deterministic collation; integers).
    #[default]
    Exact,
    /// ASCII letters compared without case (`case`) and trailing spaces
    /// ignored (`pad`), every other byte exactly: SQLite's `NOCASE` and
    /// `RTRIM`, MySQL's PAD SPACE `_bin` collations. Every key folds.
    Total {
        /// ASCII letters without case.
        case: bool,
        /// Trailing spaces ignored.
        pad: bool,
    },
    /// As [`Fold::Total`] for keys of printable ASCII (0x20–0x7E); any
    /// other key is [`Key::Loose`]: MySQL's and MariaDB's other collations
    /// (`utf8mb4_general_ci` …), whose classes among printable ASCII are
    /// exactly case (checked by hand on MariaDB 10.11: 69 classes of 95
    /// characters, no ignorable one), but which also call `é` equal to `e`.
    Ascii {
        /// ASCII letters without case.
        case: bool,
        /// Trailing spaces ignored.
        pad: bool,
    },
    /// Unknown (a nondeterministic PostgreSQL collation, a custom SQLite
    /// one): every text key is [`Key::Loose`].
    Opaque,
}

impl Fold {
    /// Parses `raw` as a key of type `ty` ([`Key::parse`]), folded.
    ///
    /// # Errors
    /// As [`Key::parse`].
    pub fn parse(self, ty: KeyType, raw: &str) -> Result<Key, KeyError> {
        Key::parse(ty, raw).map(|k| self.apply(k))
    }

    /// `key` folded: the one spelling of its class, or [`Key::Loose`].
    #[must_use]
    pub fn apply(self, key: Key) -> Key {
        let (Key::Text(s) | Key::Loose(s)) = key else {
            return key;
        };
        let fold = |s: String, case: bool, pad: bool| {
            let mut s = s;
            if pad {
                s.truncate(s.trim_end_matches(' ').len());
            }
            if case {
                s.make_ascii_lowercase();
            }
            Key::Text(s)
        };
        match self {
            Self::Exact => Key::Text(s),
            Self::Total { case, pad } => fold(s, case, pad),
            Self::Ascii { case, pad } if s.bytes().all(|b| (0x20..=0x7e).contains(&b)) => {
                fold(s, case, pad)
            }
            Self::Ascii { .. } | Self::Opaque => Key::Loose(s),
        }
    }

    /// Whether some row key may be [`Key::Loose`], so that a filter's "no"
    /// stands only while it does not hold [`LOOSE_MARK`].
    #[must_use]
    pub const fn has_loose(self) -> bool {
        matches!(self, Self::Ascii { .. } | Self::Opaque)
    }

    /// The suffix this fold adds to a filter's identity: none for
    /// [`Fold::Exact`], so such filters keep the identity they had.
    #[must_use]
    pub fn identity_suffix(self) -> String {
        match self {
            Self::Exact => String::new(),
            other => format!("~{}", other.describe()),
        }
    }

    /// A short name: `exact`, `total-ci-pad`, `ascii-ci-pad`, `opaque` …
    #[must_use]
    pub fn describe(self) -> String {
        let parts = |kind: &str, case: bool, pad: bool| {
            format!(
                "{kind}-{}{}",
                if case { "ci" } else { "cs" },
                if pad { "-pad" } else { "" }
            )
        };
        match self {
            Self::Exact => "exact".into(),
            Self::Total { case, pad } => parts("total", case, pad),
            Self::Ascii { case, pad } => parts("ascii", case, pad),
            Self::Opaque => "opaque".into(),
        }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Int(i) => write!(f, "{i}"),
            Self::Text(s) | Self::Loose(s) => f.write_str(s),
        }
    }
}

impl BloomKey for Key {
    #[inline]
    fn hash_pair(&self, seed: u64) -> HashPair {
        match self {
            Self::Int(i) => i.hash_pair(seed),
            Self::Text(s) => s.as_str().hash_pair(seed),
            Self::Loose(_) => LOOSE_MARK.hash_pair(seed),
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

    #[test]
    fn folds_put_every_spelling_of_a_class_in_one_key() {
        let t = |s: &str| Key::Text(s.into());
        let l = |s: &str| Key::Loose(s.into());
        let ci_pad = Fold::Ascii {
            case: true,
            pad: true,
        };
        assert_eq!(ci_pad.apply(t("U1001  ")), t("u1001"));
        assert_eq!(ci_pad.apply(t(" u1001")), t(" u1001"));
        assert_eq!(ci_pad.apply(t("é1")), l("é1"));
        assert_eq!(ci_pad.apply(l("é1")), l("é1"));
        assert_eq!(ci_pad.apply(Key::Int(7)), Key::Int(7));
        let nocase = Fold::Total {
            case: true,
            pad: false,
        };
        assert_eq!(nocase.apply(t("ÉA ")), t("Éa "));
        assert_eq!(nocase.apply(l("ÉA")), t("Éa"));
        assert_eq!(Fold::Exact.apply(t("U1 ")), t("U1 "));
        assert_eq!(Fold::Opaque.apply(t("u1")), l("u1"));
        // Folding twice changes nothing.
        for fold in [ci_pad, nocase, Fold::Exact, Fold::Opaque] {
            for k in ["Ab ", "é", "x"] {
                let once = fold.apply(t(k));
                assert_eq!(fold.apply(once.clone()), once);
            }
        }
        assert!(!l("x").judged() && t("x").judged());
        assert_eq!(l("a").hash_pair(3), l("b").hash_pair(3));
        assert_eq!(l("a").hash_pair(3), LOOSE_MARK.hash_pair(3));
        assert_eq!(Fold::Exact.identity_suffix(), "");
        assert_eq!(ci_pad.identity_suffix(), "~ascii-ci-pad");
    }
}
