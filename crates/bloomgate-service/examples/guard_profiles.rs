//! Guarding a source that is not a SQL table (a SQL table needs only
//! `[[resources]]` in the config): a directory of JSON documents,
//! `data/profiles/<key>.json`, served as resource `profiles` through the
//! whole funnel. `cargo run -p bloomgate-service --example guard_profiles`
//! serves it on 127.0.0.1:8080: `curl localhost:8080/api/profiles/u1001`.
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bloomgate_service::key::{Key, KeyType};
use bloomgate_service::resource::ResourceOptions;
use bloomgate_service::source::{Row, Source};
use bloomgate_service::sql::StoreError;

/// One JSON object per file, named by its key.
#[derive(Debug)]
pub struct Profiles(pub PathBuf);

impl Profiles {
    /// Keys are file names of letters, digits, `-` and `_` only, so no key
    /// reaches outside the directory. Other files are no rows, and are not
    /// scanned either: the filter never holds a key `load` would refuse.
    fn plain(key: &str) -> bool {
        !key.is_empty()
            && key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    }

    fn path(&self, key: &Key) -> Option<PathBuf> {
        let key = key.to_string();
        Self::plain(&key).then(|| self.0.join(format!("{key}.json")))
    }

    async fn keys(&self) -> Result<Vec<String>, StoreError> {
        let mut dir = tokio::fs::read_dir(&self.0)
            .await
            .map_err(|e| StoreError::new("list", e))?;
        let mut keys = Vec::new();
        while let Some(entry) = dir
            .next_entry()
            .await
            .map_err(|e| StoreError::new("list", e))?
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(key) = name.strip_suffix(".json").filter(|k| Self::plain(k)) {
                keys.push(key.to_owned());
            }
        }
        keys.sort_unstable();
        Ok(keys)
    }
}

impl Source for Profiles {
    fn key_type(&self) -> KeyType {
        KeyType::Text
    }
    async fn load(&self, key: &Key) -> Result<Option<Row>, StoreError> {
        let Some(path) = self.path(key) else {
            return Ok(None);
        };
        match tokio::fs::read(&path).await {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| StoreError::new("parse", e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StoreError::new("read", e)),
        }
    }
    async fn scan(&self, after: Option<&Key>, limit: usize) -> Result<Vec<Key>, StoreError> {
        let after = after.map(ToString::to_string);
        let keys = self.keys().await?.into_iter();
        Ok(keys
            .filter(|k| after.as_ref().is_none_or(|a| k > a))
            .take(limit)
            .map(Key::Text)
            .collect())
    }
    async fn count(&self) -> Result<u64, StoreError> {
        Ok(self.keys().await?.len() as u64)
    }
}

/// Everything `main` does once it has a config, a listener and a shutdown
/// signal: a sample profile on first run, the service with `profiles`
/// guarded beside the SKUs, served until `shutdown`.
pub async fn serve(
    config: &bloomgate_service::Config,
    dir: &Path,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    tokio::fs::create_dir_all(dir).await?;
    let sample = dir.join("u1001.json");
    if !tokio::fs::try_exists(&sample).await? {
        tokio::fs::write(&sample, br#"{"id":"u1001","name":"Ada"}"#).await?;
    }
    let state = bloomgate_service::AppState::connect(config)
        .await
        .map_err(std::io::Error::other)?;
    let profiles = Arc::new(Profiles(dir.to_owned()));
    let state = state
        .with_resource("profiles", profiles, &ResourceOptions::default())
        .await
        .map_err(std::io::Error::other)?;
    bloomgate_service::prepare(&state, config)
        .await
        .map_err(std::io::Error::other)?;
    bloomgate_service::run(listener, state, shutdown).await
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let config = bloomgate_service::Config::load(None).map_err(std::io::Error::other)?;
    let listener = tokio::net::TcpListener::bind(config.listen).await?;
    serve(
        &config,
        Path::new("data/profiles"),
        listener,
        bloomgate_service::shutdown_signal(),
    )
    .await
}
