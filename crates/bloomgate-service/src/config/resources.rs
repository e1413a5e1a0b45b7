//! `[[resources]]`: the tables a configuration guards beside the SKUs, and
//! the checks that need no database (names, rates, limits). The checks
//! against the database's catalogue (the table and columns exist, the key
//! column's type) run when [`crate::sql::table::SqlTable::open`] opens each one.

use serde::Deserialize;

use super::BloomLayout;
use super::ConfigError;

/// How a resource's keys are spelled (`key_type` in the config).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyType {
    /// A signed 64-bit integer column.
    Int,
    /// A text column (`CHAR`, `VARCHAR`, `TEXT`).
    Text,
}

/// Route segments a resource may not take: `/api/{name}/…` would shadow
/// or collide with the service's own routes.
pub const RESERVED_NAMES: [&str; 6] = ["seckill", "cache", "skus", "ping", "metrics", "gate"];

/// One guarded table.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ResourceConfig {
    /// The resource's name: its routes (`/api/{name}/{key}`), its Redis
    /// namespace (`{prefix}rv:{name}:…`), its label in stats and `/metrics`.
    pub name: String,
    /// The SQL table.
    pub table: String,
    /// The key column (unique: the primary key, usually).
    pub key: String,
    /// `int` (a 64-bit integer column) or `text`.
    pub key_type: KeyType,
    /// The columns a read answers with; all of them when empty.
    #[serde(default)]
    pub columns: Vec<String>,
    /// Keys the filter is sized for.
    #[serde(default = "default_expected")]
    pub bloom_expected: u64,
    /// The filter's target false-positive rate.
    #[serde(default = "default_fpp")]
    pub bloom_fpp: f64,
    /// `blocked` or `classic`.
    #[serde(default)]
    pub bloom_layout: BloomLayout,
    /// Most keys in one `batch`, `keys`, `invalidate` or `exists` call.
    #[serde(default = "default_max_batch")]
    pub max_batch_keys: usize,
    /// A column that grows on insert (an auto id, `created_at`): rows past
    /// the largest value seen are added to the filter every
    /// `watch_every_ms`, so rows other programs insert are admitted
    /// without a call.
    #[serde(default)]
    pub watch_column: Option<String>,
    /// How often the watch column is read, milliseconds.
    #[serde(default = "default_watch_every")]
    pub watch_every_ms: u64,
    /// Where the filter's snapshot is kept, so a restart needs no scan of
    /// the table. Unset: `<cache.bloom_snapshot_path>.<name>` when that is
    /// set, else no snapshot.
    #[serde(default)]
    pub bloom_snapshot_path: Option<std::path::PathBuf>,
    /// `local`, `strict` or `redis`, as `cache.bloom_mode` (its default).
    /// `strict` keeps a shared filter in Redis under
    /// `{prefix}rf:{name}:bloom:{tag}`, so a key told to one instance is never
    /// refused by another before the outbox reaches it.
    #[serde(default)]
    pub bloom_mode: Option<super::BloomMode>,
    /// Rebuild when the capacity alarm fires, as `cache.bloom_auto_rebuild`
    /// (its default).
    #[serde(default)]
    pub bloom_auto_rebuild: Option<bool>,
    /// Bytes per string of the shared filter in Redis (`strict`, `redis`),
    /// as `cache.bloom_segment_bytes` (its default).
    #[serde(default)]
    pub bloom_segment_bytes: Option<u64>,
    /// Deletes told (`invalidate` with `"deleted": true`) after which the
    /// filter is rebuilt and shared, as `cache.bloom_rebuild_after_deletes`
    /// (its default).
    #[serde(default)]
    pub bloom_rebuild_after_deletes: Option<u64>,
    /// `none` or `triggers`, as `cache.capture`: triggers on the table
    /// record every write, whoever makes it (see [`super::Capture`]).
    #[serde(default)]
    pub capture: super::Capture,
}

const fn default_expected() -> u64 {
    100_000
}

const fn default_fpp() -> f64 {
    0.001
}

const fn default_max_batch() -> usize {
    1000
}

const fn default_watch_every() -> u64 {
    1000
}

/// A resource's snapshot when it names none: `<cache_path>.<name>`
/// (`cache.bloom_snapshot_path` is the default resource's, and the
/// others' default).
#[must_use]
pub fn derived_snapshot_path(cache_path: &std::path::Path, name: &str) -> std::path::PathBuf {
    let mut p = cache_path.as_os_str().to_owned();
    p.push(format!(".{name}"));
    p.into()
}

/// The most keys a batch call may allow.
pub const MAX_BATCH_LIMIT: usize = 10_000;

/// True for a plain SQL identifier: a letter or `_`, then letters, digits
/// or `_`, at most 64 in all. Nothing else is ever put into a statement.
#[must_use]
pub fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && s.len() <= 64
}

fn invalid(key: String, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        message: message.into(),
    }
}

impl ResourceConfig {
    /// The config key of field `field` of the resource at `index`.
    #[must_use]
    pub fn key_of(index: usize, field: &str) -> String {
        format!("resources[{index}].{field}")
    }

    /// The columns a read selects: the configured ones, or `None` for all.
    #[must_use]
    pub fn selected(&self) -> Option<&[String]> {
        (!self.columns.is_empty()).then_some(&self.columns)
    }

    /// Checks what needs no database.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming `resources[i].<field>`.
    pub fn validate(&self, index: usize) -> Result<(), ConfigError> {
        let key = |f: &str| Self::key_of(index, f);
        check_name(&self.name, index)?;
        let idents = [("table", &self.table), ("key", &self.key)]
            .into_iter()
            .chain(self.watch_column.iter().map(|w| ("watch_column", w)));
        for (field, value) in idents {
            if !is_identifier(value) {
                return Err(invalid(
                    key(field),
                    format!(
                        "must be a plain SQL identifier (letters, digits, _), got {:?}",
                        crate::text::clip(value)
                    ),
                ));
            }
        }
        if let Some(bad) = self.columns.iter().find(|c| !is_identifier(c)) {
            return Err(invalid(
                key("columns"),
                format!(
                    "must be plain SQL identifiers (letters, digits, _), got {:?}",
                    crate::text::clip(bad)
                ),
            ));
        }
        super::check_filter(
            &key,
            self.bloom_layout,
            self.bloom_expected,
            self.bloom_fpp,
            self.bloom_segment_bytes,
        )?;
        if !(1..=MAX_BATCH_LIMIT).contains(&self.max_batch_keys) {
            return Err(invalid(
                key("max_batch_keys"),
                format!(
                    "must be between 1 and {MAX_BATCH_LIMIT}, got {}",
                    self.max_batch_keys
                ),
            ));
        }
        if self.watch_every_ms < 10 {
            return Err(invalid(key("watch_every_ms"), "must be at least 10"));
        }
        Ok(())
    }
}

impl ResourceConfig {
    /// The SKU table as a configured table (`cache.watch_column`'s): the
    /// catalogue checks and the watch of any table.
    #[must_use]
    pub fn skus(c: &super::CacheConfig) -> Self {
        Self {
            name: "skus".into(),
            table: "skus".into(),
            key: "id".into(),
            key_type: KeyType::Int,
            columns: Vec::new(),
            bloom_expected: c.bloom_expected,
            bloom_fpp: c.bloom_fpp,
            bloom_layout: c.bloom_layout,
            max_batch_keys: default_max_batch(),
            watch_column: c.watch_column.clone(),
            watch_every_ms: c.watch_every_ms,
            bloom_snapshot_path: None,
            bloom_mode: None,
            bloom_auto_rebuild: None,
            bloom_segment_bytes: None,
            bloom_rebuild_after_deletes: None,
            capture: super::Capture::None,
        }
    }
}

/// Checks a resource's name: a lower-case identifier, not reserved.
///
/// # Errors
/// [`ConfigError::Invalid`] naming `resources[index].name`.
pub fn check_name(name: &str, index: usize) -> Result<(), ConfigError> {
    let key = ResourceConfig::key_of(index, "name");
    if !is_identifier(name) || name != name.to_ascii_lowercase() {
        return Err(invalid(
            key,
            format!(
                "must be a lower-case identifier (a-z, 0-9, _), got {:?}",
                crate::text::clip(name)
            ),
        ));
    }
    if RESERVED_NAMES.contains(&name) {
        return Err(invalid(
            key,
            format!(
                "{name:?} is taken by the service's own routes ({})",
                RESERVED_NAMES.join(", ")
            ),
        ));
    }
    Ok(())
}

/// The most resources one service guards (each has six routes, which
/// the request metrics count apart).
pub const MAX_RESOURCES: usize = 16;

/// Checks every resource, and that no two share a name.
///
/// # Errors
/// [`ConfigError::Invalid`] naming the first bad key.
pub fn validate_all(resources: &[ResourceConfig]) -> Result<(), ConfigError> {
    if resources.len() > MAX_RESOURCES {
        return Err(invalid(
            "resources".into(),
            format!("at most {MAX_RESOURCES} resources, got {}", resources.len()),
        ));
    }
    for (i, r) in resources.iter().enumerate() {
        r.validate(i)?;
        if let Some(first) = resources[..i].iter().position(|o| o.name == r.name) {
            return Err(invalid(
                ResourceConfig::key_of(i, "name"),
                format!("{:?} is also the name of resources[{first}]", r.name),
            ));
        }
        // One set of capture triggers per table: a second would take the
        // first's for stale and replace them.
        let captured = |o: &ResourceConfig| o.capture == super::Capture::Triggers;
        if captured(r) {
            if let Some(first) = resources[..i]
                .iter()
                .position(|o| captured(o) && o.table == r.table)
            {
                return Err(invalid(
                    ResourceConfig::key_of(i, "capture"),
                    format!(
                        "table {:?} is captured by resources[{first}] already: one captured resource per table",
                        r.table
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// A table the configuration captures ([`super::Config::captured_tables`]).
#[derive(Debug, Clone)]
pub struct CapturedTable {
    /// `cache.capture` or `resources[i].capture`.
    pub key: String,
    /// The table's resource.
    pub table: ResourceConfig,
    /// Whether bloomgate's own migrations make the table (the demo SKU
    /// table: it does not exist before the first start).
    pub made_by_migrations: bool,
}

impl super::Config {
    /// Every table captured by triggers, the demo SKU table first (when
    /// served), each with the key that asks for it.
    #[must_use]
    pub fn captured_tables(&self) -> Vec<CapturedTable> {
        let demo = (self.cache.capture == super::Capture::Triggers && self.demo()).then(|| {
            CapturedTable {
                key: "cache.capture".into(),
                table: ResourceConfig::skus(&self.cache),
                made_by_migrations: true,
            }
        });
        let configured = self
            .resources
            .iter()
            .enumerate()
            .filter(|(_, rc)| rc.capture == super::Capture::Triggers)
            .map(|(i, rc)| CapturedTable {
                key: ResourceConfig::key_of(i, "capture"),
                table: rc.clone(),
                made_by_migrations: false,
            });
        demo.into_iter().chain(configured).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_captured_resource_per_table() {
        let users: ResourceConfig = toml::from_str(
            "name = \"users\"\ntable = \"users\"\nkey = \"id\"\nkey_type = \"text\"\ncapture = \"triggers\"",
        )
        .unwrap();
        let mut again = users.clone();
        again.name = "people".into();
        assert!(validate_all(std::slice::from_ref(&users)).is_ok());
        let err = validate_all(&[users.clone(), again.clone()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("resources[1].capture"), "{err}");
        again.capture = crate::config::Capture::None;
        assert!(
            validate_all(&[users, again]).is_ok(),
            "one captured, one not"
        );
    }

    #[test]
    fn identifiers_are_plain() {
        assert!(is_identifier("users"));
        assert!(is_identifier("_t1"));
        assert!(!is_identifier("1t"));
        assert!(!is_identifier("users; DROP TABLE skus"));
        assert!(!is_identifier("a\"b"));
        assert!(!is_identifier(""));
        assert!(!is_identifier(&"a".repeat(65)));
    }
}
