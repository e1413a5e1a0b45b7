//! `bloomgate capture show|install|remove`: the capture triggers of the
//! configured tables, for a DBA to review and install with their own
//! rights (the service then needs no TRIGGER privilege: it checks them).

use std::path::PathBuf;

use anyhow::{bail, Context};
use bloomgate_service::feed::capture::Captured;
use bloomgate_service::sql::Database;

/// What to do with the triggers.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Action {
    /// Print the DDL (and whether the database has it), changing nothing.
    Show,
    /// Create the outbox tables if needed and install the triggers
    /// (replacing older versions).
    Install,
    /// Drop every bloomgate trigger on the tables (and, with `--outbox`,
    /// bloomgate's own tables).
    Remove,
}

/// `bloomgate capture`.
#[derive(Debug, clap::Args)]
pub struct CaptureArgs {
    /// show, install or remove.
    #[arg(value_enum)]
    action: Action,
    /// TOML configuration file (its tables and `database_url`).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Only this resource (`skus` for the SKU table); default: every one
    /// whose `capture` is `"triggers"`.
    #[arg(long)]
    resource: Option<String>,
    /// Database URL to use instead of the configured one (a DBA's own;
    /// `DATABASE_URL` in the environment keeps its password off the
    /// command line).
    #[arg(long)]
    database_url: Option<String>,
    /// With `remove`: also drop bloomgate's own tables (the outbox, its
    /// state, the migrations), as an install by a DBA made them. Stop
    /// every instance first.
    #[arg(long)]
    outbox: bool,
}

/// The tables `a` names.
fn chosen(a: &CaptureArgs, config: &bloomgate_service::Config) -> anyhow::Result<Vec<Captured>> {
    let Some(name) = &a.resource else {
        let all = bloomgate_service::feed::capture::targets(config);
        if all.is_empty() {
            bail!("no table has capture = \"triggers\" in the configuration; name one with --resource");
        }
        return Ok(all);
    };
    if let Some(c) = bloomgate_service::feed::capture::named(config, name) {
        return Ok(vec![c]);
    }
    let known: Vec<&str> = config.resources.iter().map(|r| r.name.as_str()).collect();
    bail!(
        "no resource {name:?} in the configuration (resources: skus{}{})",
        if known.is_empty() { "" } else { ", " },
        known.join(", ")
    );
}

/// Runs `bloomgate capture`.
///
/// # Errors
/// A bad configuration or resource name, or the database's refusal.
pub async fn capture(a: CaptureArgs) -> anyhow::Result<()> {
    let mut config = bloomgate_service::Config::load(a.config.as_deref())?;
    // The service's own user, which a DBA's install grants what it needs.
    let service_user = bloomgate_service::text::url_user(&config.database_url);
    if let Some(url) = &a.database_url {
        config.database_url.clone_from(url);
    }
    config.validate()?;
    let targets = chosen(&a, &config)?;
    let store = Database::connect_unmigrated(&config.database_url, &config.sql)
        .await
        .context("database_url")?;
    // A configured table reaches the DDL only after the catalogue
    // accepted its name and key column, as at start-up.
    for (i, rc) in config.resources.iter().enumerate() {
        if targets.iter().any(|c| c.name == rc.name) {
            bloomgate_service::sql::table::SqlTable::open(&store, rc, i).await??;
        }
    }
    match a.action {
        Action::Show => {
            let outbox = store.outbox_for_triggers().await?;
            for c in &targets {
                let state = store.capture_state(&c.target).await?;
                println!(
                    "-- {} (table {}, key column {}): {}",
                    c.name,
                    c.target.table,
                    c.target.key,
                    if state.is_current() {
                        "installed and current".to_string()
                    } else if state.current.is_empty()
                        && state.disabled.is_empty()
                        && state.stale.is_empty()
                    {
                        "not installed".to_string()
                    } else {
                        format!(
                            "{} of {} current, disabled: {:?}, older ones: {:?}",
                            state.current.len(),
                            state.wanted,
                            state.disabled,
                            state.stale
                        )
                    }
                );
                println!(
                    "-- they write into {outbox}, which the service (or `capture install`) creates"
                );
                // MySQL's trigger bodies hold `;`: its client needs another
                // delimiter around them.
                let mysql = store.backend() == bloomgate_service::sql::Backend::MySql;
                let end = if mysql { "//" } else { ";" };
                if mysql {
                    println!("DELIMITER //");
                }
                for name in &state.stale {
                    for s in store.capture_drop_ddl(&c.target.table, name) {
                        println!("{s}{end}");
                    }
                }
                for s in store.capture_ddl(&c.target, &outbox) {
                    println!("{s}{end}");
                }
                for name in c.target.trigger_names(store.backend()) {
                    if let Some(s) = store.capture_always_ddl(&c.target, &name) {
                        println!("{s}{end}");
                    }
                }
                if mysql {
                    println!("DELIMITER ;");
                }
            }
            let user = service_user.as_deref().unwrap_or("<the service's user>");
            println!(
                "-- the service ({user}) needs SELECT on each table, and, where another role owns \
                 bloomgate's tables (`capture install` as a DBA grants these itself):"
            );
            for s in store.outbox_grants(user) {
                println!("{s};");
            }
            if store.backend() == bloomgate_service::sql::Backend::Postgres {
                println!(
                    "-- each capture function belongs to the outbox's owner (`capture install` gives it), \
                     so it never runs with rights that role lacks"
                );
            }
        }
        Action::Install => {
            // The outbox tables the triggers write into; the demo SKU
            // table only where the config serves it.
            let done = bloomgate_service::feed::capture::install_as_dba(
                &store,
                &targets,
                config.demo(),
                service_user.as_deref(),
            )
            .await
            .context("installing the capture triggers")?;
            for (name, changed) in &done.tables {
                let what = if *changed {
                    "installed"
                } else {
                    "already current"
                };
                println!("{name}: {what}");
            }
            for (table, owner) in &done.owners {
                println!(
                    "{table}: its capture function now belongs to {owner}, the outbox's owner"
                );
            }
            if let Some(user) = &done.granted {
                println!("granted {user} SELECT, INSERT, UPDATE, DELETE on bloomgate's tables");
            }
        }
        Action::Remove => {
            for c in &targets {
                let n = store.remove_capture(&c.target).await?;
                println!("{}: {n} trigger(s) dropped", c.name);
            }
            if a.outbox {
                store.drop_own_tables().await?;
                println!("bloomgate's own tables dropped");
            }
        }
    }
    store.close().await;
    Ok(())
}
