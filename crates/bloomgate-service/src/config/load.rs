//! Loading in layers: defaults, then a TOML file, then `BLOOMGATE_*`
//! environment variables (and the conventional `DATABASE_URL`,
//! `REDIS_URL`), deserialised once with the failing key named.

use std::path::Path;

use super::Config;
use crate::config::{invalid, ConfigError};

/// Keys whose environment values are always strings, even when they look
/// like numbers (a numeric admin token, say).
const STRING_KEYS: [&str; 14] = [
    "listen",
    "scan_database_url",
    "scan_database_url_file",
    "watch_column",
    "bloom_snapshot_path",
    "database_url",
    "database_url_file",
    "redis_url",
    "redis_url_file",
    "redis_tls_ca",
    "redis_tls_cert",
    "redis_tls_key",
    "admin_token",
    "redis_prefix",
];

/// The project's own variables that are no configuration key: the tests'
/// servers and golden files, the benchmarks' sizes, and the filter crate's
/// `BLOOMGATE_L2_CACHE_BYTES` (a name the published crate reads). Loading
/// skips them, so a shell that exports one still runs `serve`; every
/// other unknown `BLOOMGATE_*` stays an error.
pub const RESERVED_ENV: [&str; 4] = [
    "BLOOMGATE_TEST_",
    "BLOOMGATE_BENCH_",
    "BLOOMGATE_BLESS",
    "BLOOMGATE_L2_CACHE_BYTES",
];

/// Whether `name` is one of [`RESERVED_ENV`]: a prefix (ending in `_`)
/// or a whole name.
#[must_use]
pub fn is_reserved_env(name: &str) -> bool {
    RESERVED_ENV.iter().any(|r| {
        if r.ends_with('_') {
            name.starts_with(r)
        } else {
            name == *r
        }
    })
}

/// Reads `{key}_file` (a mounted secret) into `key`; refuses both set.
fn url_from_file(table: &mut toml::Table, key: &str) -> Result<(), ConfigError> {
    let file_key = format!("{key}_file");
    let Some(value) = table.get(&file_key) else {
        return Ok(());
    };
    let path = value
        .as_str()
        .ok_or_else(|| invalid(&file_key, "must be a file path"))?
        .to_string();
    if table.contains_key(key) {
        return Err(invalid(
            &file_key,
            format!("set either {key} or {file_key}, not both"),
        ));
    }
    let text = std::fs::read_to_string(&path)
        .map_err(|e| invalid(&file_key, format!("cannot read {path}: {e}")))?;
    let url = text.trim();
    if url.is_empty() {
        return Err(invalid(&file_key, format!("{path} is empty")));
    }
    table.insert(key.into(), toml::Value::String(url.into()));
    Ok(())
}

/// Parses an environment value as a TOML scalar (bool, integer, float),
/// falling back to a string.
fn env_value(raw: &str) -> toml::Value {
    if let Ok(b) = raw.parse::<bool>() {
        return toml::Value::Boolean(b);
    }
    if let Ok(i) = raw.parse::<i64>() {
        return toml::Value::Integer(i);
    }
    if let Ok(f) = raw.parse::<f64>() {
        if raw.contains(['.', 'e', 'E']) {
            return toml::Value::Float(f);
        }
    }
    toml::Value::String(raw.into())
}

fn set_path(table: &mut toml::Table, path: &[String], value: toml::Value) {
    match path {
        [] => {}
        [last] => {
            table.insert(last.clone(), value);
        }
        [head, rest @ ..] => {
            let entry = table
                .entry(head.clone())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            if !entry.is_table() {
                *entry = toml::Value::Table(toml::Table::new());
            }
            if let toml::Value::Table(t) = entry {
                set_path(t, rest, value);
            }
        }
    }
}

impl Config {
    /// Loads defaults, then `file` (if given), then the process environment.
    ///
    /// # Errors
    /// [`ConfigError`] naming the offending key.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_from(file, std::env::vars())
    }

    /// As [`Config::load`], with an explicit environment (for tests).
    ///
    /// # Errors
    /// [`ConfigError`] naming the offending key.
    pub fn load_from(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let mut table = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.display().to_string(),
                    source,
                })?;
                text.parse::<toml::Table>().map_err(|e| {
                    invalid("(file)", format!("{}: {}", path.display(), e.message()))
                })?
            }
            None => toml::Table::new(),
        };
        let mut conventional = Vec::new();
        for (name, raw) in env {
            if is_reserved_env(&name) {
                continue;
            }
            if let Some(rest) = name.strip_prefix("BLOOMGATE_") {
                let path: Vec<String> = rest.split("__").map(str::to_ascii_lowercase).collect();
                let value = if path.len() == 1 && path[0] == "redis_cluster" {
                    toml::Value::Array(
                        raw.split(',')
                            .map(str::trim)
                            .filter(|n| !n.is_empty())
                            .map(|n| toml::Value::String(n.into()))
                            .collect(),
                    )
                } else if path
                    .last()
                    .is_some_and(|k| STRING_KEYS.contains(&k.as_str()))
                {
                    toml::Value::String(raw)
                } else {
                    env_value(&raw)
                };
                set_path(&mut table, &path, value);
            } else if name == "DATABASE_URL" || name == "REDIS_URL" {
                conventional.push((name.to_ascii_lowercase(), raw));
            }
        }
        // A file named in the config or by BLOOMGATE_* wins over the
        // conventional DATABASE_URL / REDIS_URL.
        url_from_file(&mut table, "database_url")?;
        url_from_file(&mut table, "redis_url")?;
        url_from_file(&mut table, "scan_database_url")?;
        for (key, raw) in conventional {
            table.entry(key).or_insert(toml::Value::String(raw));
        }
        let mut config: Self = serde_path_to_error::deserialize(toml::Value::Table(table))
            .map_err(|e| invalid(&e.path().to_string(), e.inner().to_string()))?;
        if let Some(verified) = crate::text::verify_named_ca(&config.database_url) {
            tracing::warn!(
                url = %crate::text::redact_url(&verified),
                "database_url names a CA but no TLS mode, under which the driver would not check the server against it: verifying (sslmode=verify-full / ssl-mode=VERIFY_IDENTITY)"
            );
            config.database_url = verified;
        }
        config.validate()?;
        Ok(config)
    }
}
