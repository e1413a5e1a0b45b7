//! `bloomgate capture show|install|remove` as a DBA runs it, on SQLite:
//! the DDL printed for review, installed once (idempotently), seen to
//! record another program's writes, and removed; bad names refused.

use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_bloomgate"))
        .args(args)
        .output()
        .unwrap()
}

fn ok(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "stdout {stdout}, stderr {}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn capture_show_install_remove() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}/app.db", dir.path().display());
    let config = dir.path().join("bloomgate.toml");
    std::fs::write(
        &config,
        format!(
            "database_url = \"{db}\"\n\n[[resources]]\nname = \"users\"\ntable = \"users\"\nkey = \"id\"\nkey_type = \"text\"\ncapture = \"triggers\"\n"
        ),
    )
    .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let pool = rt.block_on(async {
        let pool = sqlx::SqlitePool::connect(&format!("{db}?mode=rwc"))
            .await
            .unwrap();
        sqlx::query("CREATE TABLE users (id TEXT PRIMARY KEY, name TEXT NOT NULL)")
            .execute(&pool)
            .await
            .unwrap();
        pool
    });
    let cfg = config.to_str().unwrap();

    let shown = ok(&run(&["capture", "show", "--config", cfg]));
    assert!(
        shown.contains("-- users (table users, key column id): not installed"),
        "{shown}"
    );
    assert_eq!(shown.matches("CREATE TRIGGER").count(), 3, "{shown}");
    // Show changes nothing: no outbox, no trigger.
    let triggers = |pool: &sqlx::SqlitePool| {
        rt.block_on(async {
            sqlx::query_scalar::<_, i64>(
                "SELECT COUNT(*) FROM sqlite_master WHERE type = 'trigger'",
            )
            .fetch_one(pool)
            .await
            .unwrap()
        })
    };
    assert_eq!(triggers(&pool), 0);

    assert_eq!(
        ok(&run(&["capture", "install", "--config", cfg])).trim(),
        "users: installed"
    );
    assert_eq!(
        ok(&run(&[
            "capture",
            "install",
            "--config",
            cfg,
            "--resource",
            "users"
        ]))
        .trim(),
        "users: already current"
    );
    assert_eq!(triggers(&pool), 3);
    assert!(ok(&run(&["capture", "show", "--config", cfg])).contains("installed and current"));

    // Another program's writes are recorded in its own transaction.
    let kinds: Vec<(String, String)> = rt.block_on(async {
        for s in [
            "INSERT INTO users VALUES ('u1', 'a')",
            "UPDATE users SET name = 'b' WHERE id = 'u1'",
            "UPDATE users SET id = 'u2' WHERE id = 'u1'",
            "DELETE FROM users WHERE id = 'u2'",
        ] {
            sqlx::query(s).execute(&pool).await.unwrap();
        }
        let mut tx = pool.begin().await.unwrap();
        sqlx::query("INSERT INTO users VALUES ('u3', 'rolled back')")
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.rollback().await.unwrap();
        sqlx::query_as(
            "SELECT item_key, kind FROM bloomgate_changes WHERE resource = 'users' ORDER BY seq",
        )
        .fetch_all(&pool)
        .await
        .unwrap()
    });
    let expect = [
        ("u1", "c"),
        ("u1", "u"),
        ("u1", "d"),
        ("u2", "c"),
        ("u2", "d"),
    ];
    let got: Vec<(&str, &str)> = kinds
        .iter()
        .map(|(k, c)| (k.as_str(), c.as_str()))
        .collect();
    assert_eq!(got, expect);

    assert_eq!(
        ok(&run(&["capture", "remove", "--config", cfg])).trim(),
        "users: 3 trigger(s) dropped"
    );
    assert_eq!(triggers(&pool), 0);

    for (args, needle) in [
        (
            vec!["capture", "show", "--config", cfg, "--resource", "nope"],
            "no resource \"nope\"",
        ),
        (
            vec!["capture", "wipe", "--config", cfg],
            "invalid value 'wipe'",
        ),
    ] {
        let out = run(&args);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            !out.status.success() && err.contains(needle),
            "{args:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
    rt.block_on(pool.close());
}
