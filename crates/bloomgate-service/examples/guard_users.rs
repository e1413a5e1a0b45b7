//! Seed 002's `get_user("u1001")`, guarded from Rust: a `Source` of your
//! own (here over your own SQLite `users` table), added to the service as
//! resource `users`. `cargo run -p bloomgate-service --example guard_users`
//! serves it on 127.0.0.1:8080 (`GET /api/users/u1001`).
use std::sync::Arc;

use bloomgate_service::key::{Key, KeyType};
use bloomgate_service::resource::ResourceOptions;
use bloomgate_service::source::{BoxFuture, Row, Source};
use bloomgate_service::store::StoreError;
use sqlx::{Row as _, SqlitePool};

#[derive(Debug)]
pub struct Users(pub SqlitePool);

impl Source for Users {
    fn key_type(&self) -> KeyType {
        KeyType::Text
    }
    fn load<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<Row>, StoreError>> {
        Box::pin(async move {
            let row = sqlx::query("SELECT id, name FROM users WHERE id = ?")
                .bind(key.to_string())
                .fetch_optional(&self.0)
                .await
                .map_err(|e| StoreError::new("load user", e))?;
            Ok(row.map(|r| {
                let mut out = Row::new();
                out.insert("id".into(), r.get::<String, _>(0).into());
                out.insert("name".into(), r.get::<String, _>(1).into());
                out
            }))
        })
    }
    fn scan<'a>(
        &'a self,
        after: Option<&'a Key>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Key>, StoreError>> {
        Box::pin(async move {
            let after = after.map_or(String::new(), ToString::to_string);
            let ids: Vec<String> =
                sqlx::query_scalar("SELECT id FROM users WHERE id > ? ORDER BY id LIMIT ?")
                    .bind(after)
                    .bind(limit as i64)
                    .fetch_all(&self.0)
                    .await
                    .map_err(|e| StoreError::new("scan users", e))?;
            Ok(ids.into_iter().map(Key::Text).collect())
        })
    }
    fn count(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move {
            let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM users")
                .fetch_one(&self.0)
                .await
                .map_err(|e| StoreError::new("count users", e))?;
            Ok(n as u64)
        })
    }
}

/// The service with `users` guarded beside the SKUs, ready to `run`.
pub async fn guarded(
    config: &bloomgate_service::Config,
    users: SqlitePool,
) -> bloomgate_service::AppState {
    let state = bloomgate_service::AppState::connect(config)
        .await
        .expect("connects");
    let state = state
        .with_resource("users", Arc::new(Users(users)), &ResourceOptions::default())
        .expect("a free name");
    bloomgate_service::prepare(&state, config)
        .await
        .expect("prepares");
    state
}

#[tokio::main]
async fn main() {
    // A fresh checkout has no `data/` yet (SQLite creates the file, not
    // its directory).
    std::fs::create_dir_all("data").expect("data/");
    let users = SqlitePool::connect("sqlite://data/users.db?mode=rwc")
        .await
        .expect("users.db");
    sqlx::query("CREATE TABLE IF NOT EXISTS users (id TEXT PRIMARY KEY, name TEXT NOT NULL)")
        .execute(&users)
        .await
        .expect("table");
    sqlx::query("INSERT OR IGNORE INTO users VALUES ('u1001', 'Ada')")
        .execute(&users)
        .await
        .expect("row");
    let config = bloomgate_service::Config::load(None).expect("config");
    let state = guarded(&config, users).await;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .expect("listen");
    bloomgate_service::run(listener, state, bloomgate_service::shutdown_signal())
        .await
        .expect("serve");
}
