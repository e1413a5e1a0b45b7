//! The `[resp]` table: the Redis-protocol listener that answers
//! RedisBloom's `BF.*` commands from the resources' filters.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::Deserialize;

use super::{invalid, ConfigError};

/// The `[resp]` table. Off unless `listen` is set.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RespConfig {
    /// Where to answer RESP2 and RESP3 (`HELLO 3`); unset: no listener.
    pub listen: Option<SocketAddr>,
    /// Redis key names a client already uses, mapped to resource names
    /// (`"bf:users" = "users"`). A key not mapped is a resource name.
    pub keys: BTreeMap<String, String>,
    /// Most connections open at once (the next wait in the kernel's
    /// backlog); 0: half the open-file budget `http.max_connections`
    /// would take alone (the other half is HTTP's).
    pub max_connections: u64,
    /// A connection that sends nothing for this long is closed, seconds
    /// (a reply the client does not read for this long too); 0: never
    /// (a reply not read is still dropped after 300 s).
    pub idle_timeout_secs: u64,
    /// Longest argument of a command, bytes (a key is at most 255).
    pub max_bulk_bytes: usize,
    /// Most arguments of one command (`BF.MEXISTS key item…`).
    pub max_args: usize,
    /// Most bytes of one command, all its arguments together.
    pub max_request_bytes: usize,
    /// Commands answered from one read before the replies are written
    /// (a client pipelining more waits for the replies to drain).
    pub max_pipeline: usize,
}

impl Default for RespConfig {
    fn default() -> Self {
        Self {
            listen: None,
            keys: BTreeMap::new(),
            max_connections: 0,
            idle_timeout_secs: 300,
            max_bulk_bytes: 64 * 1024,
            max_args: 4096,
            max_request_bytes: 1 << 20,
            max_pipeline: 1024,
        }
    }
}

impl RespConfig {
    /// Checks the limits and the key map against the resource names
    /// served (`names`); `token`: whether an admin token is set.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the key.
    pub fn validate(&self, names: &[&str], token: bool) -> Result<(), ConfigError> {
        let Some(listen) = self.listen else {
            return Ok(());
        };
        if !token && !listen.ip().is_loopback() {
            return Err(invalid(
                "admin_token",
                format!("required when resp.listen is a non-loopback address ({listen})"),
            ));
        }
        for (key, value) in [
            ("resp.max_bulk_bytes", self.max_bulk_bytes),
            ("resp.max_args", self.max_args),
            ("resp.max_request_bytes", self.max_request_bytes),
            ("resp.max_pipeline", self.max_pipeline),
        ] {
            if value == 0 {
                return Err(invalid(key, "must be at least 1"));
            }
        }
        if self.max_bulk_bytes < 256 {
            return Err(invalid(
                "resp.max_bulk_bytes",
                "must be at least 256 (a key may be 255 bytes)",
            ));
        }
        if self.max_args < 3 {
            return Err(invalid(
                "resp.max_args",
                "must be at least 3 (BF.EXISTS key item)",
            ));
        }
        for (redis_key, resource) in &self.keys {
            if names.contains(&redis_key.as_str()) && redis_key != resource {
                return Err(invalid(
                    &format!("resp.keys.{redis_key}"),
                    format!(
                        "{redis_key:?} is a served resource's own name; mapping it to {resource:?} would hide that filter"
                    ),
                ));
            }
            if !names.contains(&resource.as_str()) {
                return Err(invalid(
                    &format!("resp.keys.{redis_key}"),
                    format!(
                        "names no served resource: {resource:?} (served: {})",
                        names.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(listen: &str) -> RespConfig {
        RespConfig {
            listen: Some(listen.parse().unwrap()),
            ..RespConfig::default()
        }
    }

    #[test]
    fn refusals_name_the_key() {
        let key_of = |r: Result<(), ConfigError>| match r {
            Err(ConfigError::Invalid { key, .. }) => key,
            other => panic!("{other:?}"),
        };
        assert!(on("127.0.0.1:6390").validate(&["users"], false).is_ok());
        assert!(RespConfig::default().validate(&[], false).is_ok(), "off");
        assert_eq!(
            key_of(on("0.0.0.0:6390").validate(&["users"], false)),
            "admin_token"
        );
        assert!(on("0.0.0.0:6390").validate(&["users"], true).is_ok());
        let mut mapped = on("127.0.0.1:6390");
        mapped.keys.insert("bf:users".into(), "users".into());
        assert!(mapped.validate(&["users"], false).is_ok());
        assert_eq!(
            key_of(mapped.validate(&["skus"], false)),
            "resp.keys.bf:users"
        );
        let mut hiding = on("127.0.0.1:6390");
        hiding.keys.insert("users".into(), "orders".into());
        assert_eq!(
            key_of(hiding.validate(&["users", "orders"], false)),
            "resp.keys.users"
        );
        hiding.keys.insert("users".into(), "users".into());
        assert!(hiding.validate(&["users", "orders"], false).is_ok());
        let mut tiny = on("127.0.0.1:6390");
        tiny.max_bulk_bytes = 10;
        assert_eq!(key_of(tiny.validate(&[], false)), "resp.max_bulk_bytes");
        let mut none = on("127.0.0.1:6390");
        none.max_pipeline = 0;
        assert_eq!(key_of(none.validate(&[], false)), "resp.max_pipeline");
    }

    #[test]
    fn the_table_loads_from_toml() {
        let c: super::super::Config = toml::from_str(
            "[resp]\nlisten = \"127.0.0.1:6390\"\nidle_timeout_secs = 5\n[resp.keys]\n\"bf:skus\" = \"skus\"\n",
        )
        .unwrap();
        assert_eq!(c.resp.listen, Some("127.0.0.1:6390".parse().unwrap()));
        assert_eq!(c.resp.keys["bf:skus"], "skus");
        assert!(c.validate().is_ok());
    }
}
