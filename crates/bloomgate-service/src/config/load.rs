//! Loading in layers: defaults, then a TOML file, then `BLOOMGATE_*`
//! environment variables (and the conventional `DATABASE_URL`,
//! `REDIS_URL`), deserialised once with the failing key named.

use super::*;

/// Keys whose environment values are always strings, even when they look
/// like numbers (a numeric admin token, say).
const STRING_KEYS: [&str; 6] = [
    "listen",
    "bloom_snapshot_path",
    "database_url",
    "redis_url",
    "admin_token",
    "redis_prefix",
];

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
        for (key, raw) in conventional {
            table.entry(key).or_insert(toml::Value::String(raw));
        }
        let config: Self = serde_path_to_error::deserialize(toml::Value::Table(table))
            .map_err(|e| invalid(&e.path().to_string(), e.inner().to_string()))?;
        config.validate()?;
        Ok(config)
    }
}
