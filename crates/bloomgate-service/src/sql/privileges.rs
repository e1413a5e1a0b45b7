//! What this connection may do, asked of the server before anything is
//! written: whether it may create triggers on a table (the capture's
//! start-up check).
//!
//! PostgreSQL answers with `has_table_privilege`, which counts roles. On
//! MySQL and MariaDB the `information_schema` privilege views list only
//! grants made to the user by name and for the exact schema: a grant
//! through a role, or on a schema pattern (`` `app\_%`.* ``), is missed,
//! and a service that holds the right would be refused. So the server's
//! own `SHOW GRANTS` is read: the user's grants and, on MariaDB, its
//! current role's; on MySQL 8 the active roles' are asked for with
//! `USING`. Schema patterns match as the server matches them (`%`, `_`,
//! `\` escapes).

use sqlx::Row;

use super::error::err;
use super::scan::text_at;
use crate::source::StoreError;
use crate::sql::limits::Within;
use crate::sql::{Backend, Database};

impl Database {
    /// Whether this connection's user may create triggers on `table`
    /// (SQLite: always).
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn may_create_triggers(&self, table: &str) -> Result<bool, StoreError> {
        self.may("TRIGGER", table).await
    }

    /// Whether this connection's user may add entries to bloomgate's
    /// outbox (`INSERT` on `bloomgate_changes`; SQLite: always): an outbox
    /// it may only read is one it cannot run on.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn may_write_outbox(&self) -> Result<bool, StoreError> {
        self.may("INSERT", "bloomgate_changes").await
    }

    /// Whether this connection's user holds `right` on `table` (SQLite:
    /// always): PostgreSQL's `has_table_privilege`; MySQL's grants,
    /// roles and schema patterns included.
    async fn may(&self, right: &'static str, table: &str) -> Result<bool, StoreError> {
        match self.backend {
            Backend::Sqlite => Ok(true),
            Backend::Postgres => {
                let row =
                    sqlx::query("SELECT CASE WHEN has_table_privilege($1, $2) THEN 1 ELSE 0 END")
                        .bind(super::capture::q(self.backend, table))
                        .bind(right)
                        .fetch_one(&self.pool)
                        .within(&self.bg_limit, "privilege")
                        .await
                        .map_err(err("privilege"))?;
                let n: i64 = row.try_get(0).map_err(err("privilege"))?;
                Ok(n > 0)
            }
            Backend::MySql => {
                let db = self
                    .one_text("SELECT DATABASE()")
                    .await?
                    .unwrap_or_default();
                let grants = self.mysql_grants().await?;
                Ok(grants.iter().any(|g| grants_right(g, right, &db, table)))
            }
        }
    }

    /// The lines of `SHOW GRANTS` for this connection, with its active
    /// roles' on MySQL 8 (MariaDB lists its current role's itself).
    async fn mysql_grants(&self) -> Result<Vec<String>, StoreError> {
        let mut lines = self.texts("SHOW GRANTS").await?;
        let version = self.one_text("SELECT VERSION()").await?.unwrap_or_default();
        if !version.contains("MariaDB") {
            let roles = self
                .one_text("SELECT CURRENT_ROLE()")
                .await?
                .unwrap_or_default();
            if !roles.is_empty() && roles != "NONE" {
                // `roles` is the server's own list of quoted names.
                lines.extend(
                    self.texts(&format!("SHOW GRANTS FOR CURRENT_USER() USING {roles}"))
                        .await?,
                );
            }
        }
        Ok(lines)
    }

    async fn texts(&self, q: &str) -> Result<Vec<String>, StoreError> {
        sqlx::query(q)
            .fetch_all(&self.pool)
            .within(&self.bg_limit, "capture privilege")
            .await
            .map_err(err("capture privilege"))?
            .iter()
            .map(|r| text_at(r, 0).map(Option::unwrap_or_default))
            .collect::<Result<_, _>>()
            .map_err(err("capture privilege"))
    }

    async fn one_text(&self, q: &str) -> Result<Option<String>, StoreError> {
        Ok(self.texts(q).await?.into_iter().next())
    }
}

/// Whether the `SHOW GRANTS` line `line` gives TRIGGER (or every right)
/// on `table` of schema `db`.
#[cfg(test)]
fn grants_trigger(line: &str, db: &str, table: &str) -> bool {
    grants_right(line, "TRIGGER", db, table)
}

/// Whether the `SHOW GRANTS` line `line` gives `right` (or every right)
/// on `table` of schema `db`.
fn grants_right(line: &str, right: &str, db: &str, table: &str) -> bool {
    let Some(rest) = line.strip_prefix("GRANT ") else {
        return false;
    };
    let (Some(on), Some(to)) = (rest.find(" ON "), rest.rfind(" TO ")) else {
        return false;
    };
    if to < on {
        return false;
    }
    let rights = &rest[..on];
    let object = &rest[on + 4..to];
    let holds = rights.split(", ").any(|r| {
        let r = r.trim();
        r == "ALL PRIVILEGES" || r == "ALL" || r == right
    });
    if !holds || object.starts_with("FUNCTION ") || object.starts_with("PROCEDURE ") {
        return false;
    }
    let Some((schema, rest)) = ident(object) else {
        return false;
    };
    let Some(rest) = rest.strip_prefix('.') else {
        return false;
    };
    let Some((name, _)) = ident(rest) else {
        return false;
    };
    match (schema.as_str(), name.as_str()) {
        ("*", _) => true,
        (s, "*") => like(s, db),
        (s, t) => s == db && t == table,
    }
}

/// One name at the start of `s`: `*`, or quoted in backticks (a doubled
/// backtick is one), or bare; with what follows it.
fn ident(s: &str) -> Option<(String, &str)> {
    if let Some(rest) = s.strip_prefix('*') {
        return Some(("*".into(), rest));
    }
    let Some(body) = s.strip_prefix('`') else {
        let end = s.find('.').unwrap_or(s.len());
        return Some((s[..end].to_owned(), &s[end..]));
    };
    let mut name = String::new();
    let mut chars = body.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if c == '`' {
            if chars.peek().is_some_and(|&(_, n)| n == '`') {
                chars.next();
                name.push('`');
            } else {
                return Some((name, &body[i + 1..]));
            }
        } else {
            name.push(c);
        }
    }
    None
}

/// Whether `text` matches the grant pattern `pattern`: `%` any run, `_`
/// any one character, `\` makes the next one literal.
fn like(pattern: &str, text: &str) -> bool {
    fn go(p: &[char], t: &[char]) -> bool {
        match p.split_first() {
            None => t.is_empty(),
            Some(('%', rest)) => (0..=t.len()).any(|i| go(rest, &t[i..])),
            Some(('_', rest)) => !t.is_empty() && go(rest, &t[1..]),
            Some(('\\', rest)) if !rest.is_empty() => {
                t.first() == Some(&rest[0]) && go(&rest[1..], &t[1..])
            }
            Some((c, rest)) => t.first() == Some(c) && go(rest, &t[1..]),
        }
    }
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    go(&p, &t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grant_lines_give_trigger_where_the_server_would() {
        let yes = [
            "GRANT ALL PRIVILEGES ON *.* TO `svc`@`%`",
            "GRANT SELECT, TRIGGER ON `app`.* TO `svc`@`%`",
            "GRANT TRIGGER ON `ap%`.* TO `svc`@`%`",
            "GRANT TRIGGER ON `app`.`users` TO `svc_role`",
            "GRANT INSERT, TRIGGER ON app.* TO 'svc'@'%'",
        ];
        for line in yes {
            assert!(grants_trigger(line, "app", "users"), "{line}");
        }
        let no = [
            "GRANT SELECT, INSERT ON `app`.* TO `svc`@`%`",
            "GRANT TRIGGER ON `other`.* TO `svc`@`%`",
            "GRANT TRIGGER ON `ap\\_%`.* TO `svc`@`%`",
            "GRANT TRIGGER ON `app`.`orders` TO `svc`@`%`",
            "GRANT `role` TO `svc`@`%`",
            "GRANT EXECUTE ON PROCEDURE `app`.`p` TO `svc`@`%`",
            "GRANT CREATE ROUTINE, TRIGGERS ON `app`.* TO `svc`@`%`",
        ];
        for (i, line) in no.iter().enumerate() {
            // The pattern line is a "no" for a schema it does not match.
            let db = if i == 2 { "apx" } else { "app" };
            assert!(!grants_trigger(line, db, "users"), "{line}");
        }
        assert!(grants_trigger(
            "GRANT TRIGGER ON `ap\\_%`.* TO x",
            "ap_1",
            "t"
        ));
        assert!(!grants_trigger(
            "GRANT TRIGGER ON `ap\\_%`.* TO x",
            "apx1",
            "t"
        ));
        assert!(grants_trigger("GRANT TRIGGER ON `a``b`.* TO x", "a`b", "t"));
    }

    #[test]
    fn patterns_match_as_grants_do() {
        assert!(like("app", "app"));
        assert!(!like("app", "apps"));
        assert!(like("app%", "apps"));
        assert!(like("a_p", "axp"));
        assert!(!like("a\\_p", "axp"));
        assert!(like("a\\_p", "a_p"));
        assert!(like("%", ""));
    }
}
