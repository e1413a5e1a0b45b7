//! The capture function never runs with more rights than the owner of the
//! outbox it writes (`sql::owners`). Reproduced on PostgreSQL: the
//! service made its outbox (so owns it), a superuser installed the
//! capture, and a trigger the service role adds to its outbox then ran as
//! the superuser on an application's ordinary insert.

mod common;

use bloomgate_service::config::{Capture, SqlConfig};
use bloomgate_service::feed::capture::{install_as_dba, targets};
use bloomgate_service::sql::Database;
use sqlx::Row;

async fn exec(pool: &sqlx::AnyPool, q: &str) {
    sqlx::raw_sql(q).execute(pool).await.unwrap();
}

/// Who the service's trigger on the outbox ran as: `(current_user,
/// rolsuper)` of each time it fired.
async fn ran_as(pool: &sqlx::AnyPool) -> Vec<(String, bool)> {
    sqlx::query("SELECT who, CAST(CASE WHEN super THEN 1 ELSE 0 END AS BIGINT) FROM esc_log")
        .fetch_all(pool)
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get::<String, _>(0), r.get::<i64, _>(1) == 1))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capture_function_runs_as_the_outbox_owner_not_as_the_installer() {
    let Some(admin_url) = common::postgres_database("owners_escalation").await else {
        return;
    };
    let user = "bg_owners_svc";
    let admin = common::sql_pool(&admin_url).await;
    for s in [
        "CREATE TABLE users (id VARCHAR(32) NOT NULL PRIMARY KEY, name VARCHAR(100) NOT NULL)"
            .to_string(),
        format!("DROP ROLE IF EXISTS {user}"),
        format!("CREATE ROLE {user} LOGIN"),
        format!("GRANT SELECT, INSERT, UPDATE, DELETE ON users TO {user}"),
        format!("GRANT USAGE, CREATE ON SCHEMA public TO {user}"),
    ] {
        exec(&admin, &s).await;
    }
    let service_url = common::as_user(&admin_url, user);
    // The service made its outbox (a start before capture was asked for).
    let service_store = Database::connect_unmigrated(&service_url, &SqlConfig::default())
        .await
        .unwrap();
    service_store.migrate_for(false).await.unwrap();
    // A superuser installs the capture.
    let mut c = common::config(&service_url, None, "owners");
    let mut users = common::users_resource("users");
    users.capture = Capture::Triggers;
    c.resources = vec![users];
    let captured = targets(&c);
    let dba = Database::connect_unmigrated(&admin_url, &SqlConfig::default())
        .await
        .unwrap();
    let done = install_as_dba(&dba, &captured, false, Some(user))
        .await
        .unwrap();
    assert_eq!(
        done.owners,
        [("users".to_string(), user.to_string())],
        "the function given to the outbox's owner"
    );
    assert_eq!(done.granted, None, "the service owns its tables already");
    assert_eq!(
        service_store
            .capture_owner_risk(&captured[0].target)
            .await
            .unwrap(),
        None
    );

    // With leaked service credentials: a trigger on the outbox.
    let service = common::sql_pool(&service_url).await;
    exec(
        &service,
        "CREATE TABLE esc_log (who TEXT, super BOOLEAN); \
         CREATE FUNCTION esc() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
           INSERT INTO public.esc_log SELECT current_user, rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user; \
           RETURN NULL; END $$; \
         CREATE TRIGGER esc AFTER INSERT ON bloomgate_changes FOR EACH ROW EXECUTE FUNCTION esc()",
    )
    .await;
    // The application's ordinary insert, as the superuser.
    exec(&admin, "INSERT INTO users VALUES ('u1', 'one')").await;
    assert_eq!(ran_as(&admin).await, [(user.to_string(), false)]);

    // The state the previous release left (the installer's function over
    // the service's outbox) is what the service warns of at start, and a
    // DBA's install mends it.
    exec(
        &admin,
        &format!(
            "ALTER FUNCTION \"{}_fn\"() OWNER TO postgres",
            captured[0].target.trigger_names(dba.backend())[0]
        ),
    )
    .await;
    exec(&admin, "INSERT INTO users VALUES ('u2', 'two')").await;
    assert_eq!(
        ran_as(&admin).await[1],
        ("postgres".to_string(), true),
        "the escalation, reproduced"
    );
    assert_eq!(
        service_store
            .capture_owner_risk(&captured[0].target)
            .await
            .unwrap()
            .as_deref(),
        Some("postgres")
    );
    let mended = install_as_dba(&dba, &captured, false, Some(user))
        .await
        .unwrap();
    assert_eq!(mended.owners, [("users".to_string(), user.to_string())]);
    exec(&admin, "INSERT INTO users VALUES ('u3', 'three')").await;
    assert_eq!(ran_as(&admin).await[2], (user.to_string(), false));

    service_store.close().await;
    service.close().await;
    dba.close().await;
    admin.close().await;
    let db = admin_url.rsplit('/').next().unwrap();
    let root = common::sql_pool(common::POSTGRES_ADMIN_URL).await;
    exec(&root, &format!("DROP DATABASE {db} WITH (FORCE)")).await;
    exec(&root, &format!("DROP ROLE {user}")).await;
    root.close().await;
}
