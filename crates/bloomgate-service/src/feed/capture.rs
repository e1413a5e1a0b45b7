//! Change capture at start-up and for `bloomgate capture`: which tables
//! the configuration captures ([`targets`]), the check made before
//! anything is written ([`check_before_migrate`]) and the install after
//! the outbox exists ([`install_missing`]). The triggers themselves, per
//! dialect, are `crate::sql`'s (`CaptureTarget`).
//!
//! A service that may not create triggers starts when a DBA installed
//! them (`capture install` with their own rights): it only checks that
//! they are there and current. When they are missing and it cannot
//! install them, the start stops with an error naming the config key and
//! what to run, before the database is touched.

use crate::config::resources::ResourceConfig;
use crate::config::{Config, ConfigError};
use crate::sql::{Backend, CaptureTarget, Database, StoreError};

/// One captured table with the config key that asked for it.
#[derive(Debug, Clone)]
pub struct Captured {
    /// `cache.capture` or `resources[i].capture`.
    pub key: String,
    /// The resource's name.
    pub name: String,
    /// The table's triggers.
    pub target: CaptureTarget,
    /// Whether bloomgate's migrations make the table (it may not exist
    /// before the first start).
    pub made_by_migrations: bool,
}

impl Captured {
    fn of(key: String, rc: &ResourceConfig, made_by_migrations: bool) -> Self {
        Self {
            key,
            name: rc.name.clone(),
            target: CaptureTarget {
                resource: rc.name.clone(),
                table: rc.table.clone(),
                key: rc.key.clone(),
            },
            made_by_migrations,
        }
    }
}

/// Every table the configuration captures, the demo SKU table first.
#[must_use]
pub fn targets(config: &Config) -> Vec<Captured> {
    config
        .captured_tables()
        .into_iter()
        .map(|c| Captured::of(c.key, &c.table, c.made_by_migrations))
        .collect()
}

/// The table of resource `name` (the demo SKU table's too), whether or
/// not the configuration captures it (`bloomgate capture --resource`).
#[must_use]
pub fn named(config: &Config, name: &str) -> Option<Captured> {
    let demo = ResourceConfig::skus(&config.cache);
    if demo.name == name {
        return Some(Captured::of("cache.capture".into(), &demo, true));
    }
    let (i, rc) = config
        .resources
        .iter()
        .enumerate()
        .find(|(_, r)| r.name == name)?;
    Some(Captured::of(
        ResourceConfig::key_of(i, "capture"),
        rc,
        false,
    ))
}

/// The refusal when `c`'s triggers are missing and cannot be made here.
fn refusal(c: &Captured, backend: Backend, why: &str) -> ConfigError {
    let privilege = backend.trigger_rights();
    ConfigError::Invalid {
        key: c.key.clone(),
        message: format!(
            "the capture triggers on table {:?} are missing or of an older version, and this \
             connection cannot install them ({why}): it needs {privilege}. Have them reviewed \
             and installed with `bloomgate capture show --config FILE --resource {}` and \
             `bloomgate capture install --config FILE --resource {}` as a user that has it",
            c.target.table, c.name, c.name
        ),
    }
}

/// Before the migrations: each table whose triggers are not current must
/// be one this connection may create triggers on. (A table bloomgate's
/// migrations make does not exist before the first of them: its triggers
/// are then checked by [`install_missing`] only.)
///
/// # Errors
/// [`ConfigError::Invalid`] naming the key; [`StoreError`] when the
/// catalogue cannot be read.
pub async fn check_before_migrate(
    store: &Database,
    captured: &[Captured],
) -> Result<Result<(), ConfigError>, StoreError> {
    for c in captured {
        if store.capture_state(&c.target).await?.is_current() {
            continue;
        }
        let may = store.may_create_triggers(&c.target.table).await;
        match may {
            Ok(true) => {}
            Ok(false) => return Ok(Err(refusal(c, store.backend(), "no privilege"))),
            // Not made yet by the migrations.
            Err(_) if c.made_by_migrations => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Ok(()))
}

/// What [`install_as_dba`] did, per table and for the service.
#[derive(Debug, Default)]
pub struct Installed {
    /// Each table's name and whether its triggers changed.
    pub tables: Vec<(String, bool)>,
    /// Capture functions given to the outbox's owner: (table, owner).
    pub owners: Vec<(String, String)>,
    /// The service's user, granted DML on bloomgate's tables.
    pub granted: Option<String>,
}

/// `bloomgate capture install` with a DBA's rights: bloomgate's tables
/// (the demo SKU table only when `demo`), each table's triggers, each
/// capture function given to the outbox's owner (see
/// [`crate::sql::Database::align_capture_owner`]), and, where this
/// connection owns bloomgate's tables and `service_user` (the configured
/// URL's user) is another role, plain DML on them for that role: the
/// service then starts with no TRIGGER privilege and no right to add
/// triggers to the outbox.
///
/// # Errors
/// [`StoreError`] from the first step that failed.
pub async fn install_as_dba(
    store: &Database,
    captured: &[Captured],
    demo: bool,
    service_user: Option<&str>,
) -> Result<Installed, StoreError> {
    store.migrate_for(demo).await?;
    let mut done = Installed::default();
    for c in captured {
        let changed = store.install_capture(&c.target, true).await?;
        done.tables.push((c.name.clone(), changed));
        if let Some(owner) = store.align_capture_owner(&c.target).await? {
            done.owners.push((c.target.table.clone(), owner));
        }
    }
    if let Some(user) = service_user {
        if store.grant_outbox_to(user).await? {
            done.granted = Some(user.to_owned());
        }
    }
    Ok(done)
}

/// After the migrations: installs the triggers that are missing or stale.
/// Returns the resources whose writes may have gone unrecorded before
/// (their triggers were missing or did not fire, [`crate::sql::CaptureState::has_gap`]):
/// a filter positioned in the outbox (a snapshot, an epoch) may lack
/// their rows, so they scan, and every other instance is asked to
/// rebuild them.
///
/// # Errors
/// [`ConfigError::Invalid`] naming the key when an install fails (the
/// table keeps no half-installed set).
pub async fn install_missing(
    store: &Database,
    captured: &[Captured],
) -> Result<Vec<String>, ConfigError> {
    let mut gaps = Vec::new();
    for c in captured {
        // Unreadable here, it is found by the install's own check below.
        if store
            .capture_state(&c.target)
            .await
            .is_ok_and(|state| state.has_gap())
        {
            gaps.push(c.name.clone());
        }
        match store.install_capture(&c.target, true).await {
            Ok(true) => {
                tracing::info!(table = %c.target.table, resource = %c.name, "capture triggers installed")
            }
            Ok(false) => {}
            Err(e) => return Err(refusal(c, store.backend(), &e.to_string())),
        }
        if let Ok(Some(owner)) = store.capture_owner_risk(&c.target).await {
            tracing::error!(
                table = %c.target.table, function_owner = %owner,
                "the capture function runs as {owner:?} while this service owns the outbox it writes: \
                 whoever holds this service's credentials could run code as {owner:?}. \
                 Run `bloomgate capture install` as a superuser to give the function to the outbox's owner"
            );
        }
    }
    Ok(gaps)
}
