//! What the catalogue says of a configured table when it is opened: its
//! columns and the [`Kind`] each is read as, and how a text key column
//! compares (its collation, and the
//! [`Fold`] that puts every spelling the database calls equal into one
//! key).
//!
//! Per dialect:
//! * **MySQL / MariaDB**: `information_schema.COLUMNS.COLLATION_NAME`.
//!   `binary` and NO PAD `_bin` collations are [`Fold::Exact`]; the other
//!   `_bin` ones (PAD SPACE) ignore trailing spaces ([`Fold::Total`]);
//!   `_ci` and `_cs` collations fold printable ASCII (case for `_ci`,
//!   trailing spaces unless NO PAD: `nopad` or `_0900_` in the name) and
//!   leave every other key [`Key::Loose`](crate::key::Key::Loose), since
//!   they call `é` equal to `e`. Any other name is [`Fold::Opaque`].
//! * **PostgreSQL**: a deterministic collation compares bytes
//!   ([`Fold::Exact`]); a nondeterministic one is [`Fold::Opaque`].
//! * **SQLite**: the column's `COLLATE` in its `CREATE TABLE`: none or
//!   `BINARY` is exact, `NOCASE` folds ASCII case and `RTRIM` trailing
//!   spaces (both [`Fold::Total`]: SQLite folds nothing else), any other
//!   is [`Fold::Opaque`].

use sqlx::Row as _;

use crate::key::Fold;
use crate::sql::{err, text_at, Backend, Database, StoreError, Within};

/// How a column's values are read and answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A JSON integer.
    Int,
    /// A JSON number.
    Float,
    /// `true` or `false`.
    Bool,
    /// A JSON string (text, dates, decimals and the rest).
    Text,
}

/// Maps a catalogue type name (lower case) to a kind.
pub(super) fn kind_of(backend: Backend, data_type: &str, column_type: &str) -> Kind {
    let t = data_type.to_ascii_lowercase();
    let is = |names: &[&str]| names.iter().any(|n| t == *n);
    match backend {
        Backend::Sqlite => {
            // SQLite's affinity rules, in their order.
            if t.contains("int") {
                Kind::Int
            } else if t.contains("char") || t.contains("clob") || t.contains("text") {
                Kind::Text
            } else if t.contains("real") || t.contains("floa") || t.contains("doub") {
                Kind::Float
            } else if t.contains("bool") {
                Kind::Bool
            } else {
                Kind::Text
            }
        }
        Backend::MySql if column_type.eq_ignore_ascii_case("tinyint(1)") => Kind::Bool,
        Backend::MySql | Backend::Postgres => {
            if is(&[
                "tinyint",
                "smallint",
                "mediumint",
                "int",
                "integer",
                "bigint",
            ]) {
                Kind::Int
            } else if is(&["float", "double", "real", "double precision"]) {
                Kind::Float
            } else if is(&["boolean", "bool"]) {
                Kind::Bool
            } else {
                Kind::Text
            }
        }
    }
}

/// True when `data_type` holds text a key can be compared with.
pub(super) fn is_text_type(backend: Backend, data_type: &str) -> bool {
    let t = data_type.to_ascii_lowercase();
    match backend {
        Backend::Sqlite => t.contains("char") || t.contains("clob") || t.contains("text"),
        _ => [
            "char",
            "varchar",
            "text",
            "character varying",
            "character",
            "tinytext",
            "mediumtext",
            "longtext",
        ]
        .contains(&t.as_str()),
    }
}

/// A selected column: its name, and the kind it is read as.
#[derive(Debug)]
pub(super) struct Column {
    pub(super) name: String,
    pub(super) kind: Kind,
}

/// `(name, data type, column type)` of each column of `table`, in order.
pub(super) async fn catalogue(
    store: &Database,
    table: &str,
) -> Result<Vec<(String, String, String)>, StoreError> {
    let q = match store.backend() {
        Backend::Sqlite => {
            "SELECT name, type, type FROM pragma_table_info(?) ORDER BY cid".to_owned()
        }
        Backend::MySql => "SELECT CONVERT(COLUMN_NAME USING utf8mb4), CONVERT(DATA_TYPE USING utf8mb4), CONVERT(COLUMN_TYPE USING utf8mb4) \
             FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? \
             ORDER BY ORDINAL_POSITION"
            .to_owned(),
        Backend::Postgres => "SELECT CAST(column_name AS TEXT), CAST(data_type AS TEXT), CAST(udt_name AS TEXT) \
             FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = $1 \
             ORDER BY ordinal_position"
            .to_owned(),
    };
    let rows = sqlx::query(&q)
        .bind(table.to_owned())
        .fetch_all(&store.pool)
        .within(&store.bg_limit, "catalogue")
        .await
        .map_err(err("catalogue"))?;
    rows.iter()
        .map(|r| {
            Ok((
                text_at(r, 0)?.unwrap_or_default(),
                text_at(r, 1)?.unwrap_or_default(),
                text_at(r, 2)?.unwrap_or_default(),
            ))
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(err("catalogue"))
}

/// The fold of `table.column` (plain names, found in the catalogue), and
/// the collation's name as the database spells it (empty when it has
/// none to tell).
///
/// # Errors
/// [`StoreError`] when the catalogue cannot be read.
pub(super) async fn key_fold(
    store: &Database,
    table: &str,
    column: &str,
) -> Result<(Fold, String), StoreError> {
    match store.backend() {
        Backend::MySql => {
            let q = "SELECT CONVERT(COLLATION_NAME USING utf8mb4) FROM information_schema.COLUMNS \
                     WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = ?";
            let name = one_text(store, q, table, column).await?.unwrap_or_default();
            Ok((mysql_fold(&name), name))
        }
        Backend::Postgres => {
            let q = "SELECT CAST(co.collname AS TEXT), \
                     CAST(CASE WHEN co.collisdeterministic THEN 1 ELSE 0 END AS BIGINT) \
                     FROM pg_attribute a JOIN pg_collation co ON co.oid = a.attcollation \
                     WHERE a.attrelid = to_regclass(quote_ident(current_schema()) || '.' || quote_ident($1)) \
                     AND a.attname = $2";
            let row = sqlx::query(q)
                .bind(table.to_owned())
                .bind(column.to_owned())
                .fetch_optional(&store.pool)
                .within(&store.bg_limit, "key collation")
                .await;
            match row {
                Ok(Some(r)) => {
                    let name = text_at(&r, 0).map_err(err("key collation"))?;
                    let deterministic: i64 = r.try_get(1).map_err(err("key collation"))?;
                    let fold = if deterministic == 1 {
                        Fold::Exact
                    } else {
                        Fold::Opaque
                    };
                    Ok((fold, name.unwrap_or_default()))
                }
                Ok(None) => Ok((Fold::Exact, String::new())),
                // Before PostgreSQL 12 there is no `collisdeterministic`
                // (undefined column, 42703), and no nondeterministic
                // collation either. Any other failure is not an answer.
                Err(e)
                    if e.as_database_error().and_then(|d| d.code()).as_deref() == Some("42703") =>
                {
                    tracing::debug!(error = %e, "no collisdeterministic: every collation is deterministic");
                    Ok((Fold::Exact, String::new()))
                }
                Err(e) => Err(err("key collation")(e)),
            }
        }
        Backend::Sqlite => {
            let q = "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ? AND ? <> ''";
            let sql = one_text(store, q, table, column).await?.unwrap_or_default();
            let name = sqlite_collation(&sql, column);
            Ok((sqlite_fold(name.as_deref()), name.unwrap_or_default()))
        }
    }
}

/// Says at start how `table.column`'s keys are judged, where that is not
/// byte for byte.
pub(super) fn tell(table: &str, column: &str, fold: Fold, collation: &str) {
    match fold {
        Fold::Exact => {}
        Fold::Total { .. } => tracing::info!(
            %table, %column, %collation, fold = %fold.describe(),
            "the key column's collation calls several spellings equal: keys are folded as it compares"
        ),
        Fold::Ascii { .. } => tracing::info!(
            %table, %column, %collation, fold = %fold.describe(),
            "the key column's collation calls several spellings equal: keys of printable ASCII are folded as it compares; \
             other keys are never refused by the filter, and once such a row exists, none is (a binary collation avoids both)"
        ),
        Fold::Opaque => tracing::warn!(
            %table, %column, %collation,
            "the key column's collation is not one bloomgate can fold: the filter refuses no key of this table and no cache holds its rows; \
             give the column a binary or deterministic collation"
        ),
    }
}

async fn one_text(
    store: &Database,
    q: &str,
    a: &str,
    b: &str,
) -> Result<Option<String>, StoreError> {
    let row = sqlx::query(q)
        .bind(a.to_owned())
        .bind(b.to_owned())
        .fetch_optional(&store.pool)
        .within(&store.bg_limit, "key collation")
        .await
        .map_err(err("key collation"))?;
    match row {
        Some(r) => text_at(&r, 0).map_err(err("key collation")),
        None => Ok(None),
    }
}

/// The fold of a MySQL or MariaDB collation (empty: none, so binary).
/// Only collations without a language fold: a language's rules make
/// ASCII spellings differ that case alone would merge (Turkish `I` and
/// `i`, Spanish `cH` and `ch`, Danish `aA` and `aa`: checked on MariaDB
/// 10.11, each compares unequal), so any other name is opaque.
fn mysql_fold(name: &str) -> Fold {
    /// Collations (after the character set) whose classes among printable
    /// ASCII are exactly case; `nopad` variants included.
    const PLAIN: &[&str] = &[
        "general_ci",
        "unicode_ci",
        "unicode_520_ci",
        "swedish_ci",
        "0900_ai_ci",
        "0900_as_ci",
        "0900_as_cs",
        "uca1400_ai_ci",
        "uca1400_as_ci",
        "uca1400_ai_cs",
        "uca1400_as_cs",
    ];
    let name = name.to_ascii_lowercase();
    let no_pad = name.contains("nopad") || name.contains("_0900_");
    if name.is_empty() || name == "binary" {
        return Fold::Exact;
    }
    if name.ends_with("_bin") {
        return if no_pad {
            Fold::Exact
        } else {
            Fold::Total {
                case: false,
                pad: true,
            }
        };
    }
    let rest = name
        .split_once('_')
        .map_or("", |(_, r)| r)
        .replace("nopad_", "");
    if !PLAIN.contains(&rest.as_str()) {
        return Fold::Opaque;
    }
    Fold::Ascii {
        case: rest.ends_with("_ci"),
        pad: !no_pad,
    }
}

/// The fold of a SQLite collation (`None`: the column names none).
fn sqlite_fold(name: Option<&str>) -> Fold {
    match name.map(str::to_ascii_uppercase).as_deref() {
        None | Some("BINARY") => Fold::Exact,
        Some("NOCASE") => Fold::Total {
            case: true,
            pad: false,
        },
        Some("RTRIM") => Fold::Total {
            case: false,
            pad: true,
        },
        Some(_) => Fold::Opaque,
    }
}

/// The `COLLATE` of `column` in a SQLite `CREATE TABLE` statement: the
/// column definitions are split at top-level commas, and the one whose
/// first word (unquoted) is the column gives its collation. A column that
/// cannot be found answers an unknown collation, so an odd statement
/// costs the filter its "no" rather than a wrong fold.
fn sqlite_collation(sql: &str, column: &str) -> Option<String> {
    let sql = strip_comments(sql);
    let body = sql.find('(').map_or("", |at| &sql[at + 1..]);
    let mut parts = Vec::new();
    let (mut depth, mut start, mut quote) = (0usize, 0usize, None::<char>);
    for (i, c) in body.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '`' | '\'') => quote = Some(c),
            (None, '[') => quote = Some(']'),
            (None, '(') => depth += 1,
            (None, ')') if depth == 0 => {
                parts.push(&body[start..i]);
                break;
            }
            (None, ')') => depth -= 1,
            (None, ',') if depth == 0 => {
                parts.push(&body[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    let unquote = |w: &str| {
        w.trim_matches(|c| matches!(c, '"' | '`' | '[' | ']'))
            .to_owned()
    };
    let Some(def) = parts.iter().find(|p| {
        p.split_whitespace()
            .next()
            .is_some_and(|w| unquote(w).eq_ignore_ascii_case(column))
    }) else {
        return Some("(not found)".into());
    };
    // The column's own `COLLATE`, not one inside a `CHECK (…)` or a
    // `DEFAULT (…)`: what is in parentheses is blanked first.
    let mut depth = 0usize;
    let top: String = def
        .chars()
        .map(|c| match c {
            '(' => {
                depth += 1;
                ' '
            }
            ')' => {
                depth = depth.saturating_sub(1);
                ' '
            }
            _ if depth > 0 => ' ',
            c => c,
        })
        .collect();
    let words: Vec<&str> = top.split_whitespace().collect();
    words
        .iter()
        .position(|w| w.eq_ignore_ascii_case("collate"))
        .map(|at| words.get(at + 1).map_or_else(String::new, |w| unquote(w)))
}

/// `sql` without its `--` and `/* */` comments (outside quotes).
fn strip_comments(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    let mut quote = None::<char>;
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) => {
                if c == q {
                    quote = None;
                }
                out.push(c);
            }
            (None, '\'' | '"' | '`') => {
                quote = Some(c);
                out.push(c);
            }
            (None, '[') => {
                quote = Some(']');
                out.push(c);
            }
            (None, '-') if chars.peek() == Some(&'-') => {
                for n in chars.by_ref() {
                    if n == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            (None, '/') if chars.peek() == Some(&'*') => {
                chars.next();
                let mut last = ' ';
                for n in chars.by_ref() {
                    if last == '*' && n == '/' {
                        break;
                    }
                    last = n;
                }
                out.push(' ');
            }
            (None, c) => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mysql_collations_fold_as_they_compare() {
        let ascii = |case, pad| Fold::Ascii { case, pad };
        assert_eq!(mysql_fold(""), Fold::Exact);
        assert_eq!(mysql_fold("binary"), Fold::Exact);
        assert_eq!(mysql_fold("utf8mb4_nopad_bin"), Fold::Exact);
        assert_eq!(mysql_fold("utf8mb4_0900_bin"), Fold::Exact);
        assert_eq!(
            mysql_fold("utf8mb4_bin"),
            Fold::Total {
                case: false,
                pad: true
            }
        );
        assert_eq!(mysql_fold("utf8mb4_general_ci"), ascii(true, true));
        assert_eq!(mysql_fold("latin1_swedish_ci"), ascii(true, true));
        assert_eq!(mysql_fold("utf8mb4_uca1400_ai_ci"), ascii(true, true));
        assert_eq!(mysql_fold("utf8mb4_general_nopad_ci"), ascii(true, false));
        assert_eq!(mysql_fold("utf8mb4_0900_ai_ci"), ascii(true, false));
        assert_eq!(mysql_fold("utf8mb4_0900_as_cs"), ascii(false, false));
        assert_eq!(
            mysql_fold("utf8mb4_uca1400_nopad_ai_ci"),
            ascii(true, false)
        );
        for language in [
            "utf8mb4_turkish_ci",
            "utf8mb4_tr_0900_ai_ci",
            "utf8mb4_spanish2_ci",
            "utf8mb4_danish_ci",
            "latin1_general_cs",
            "something_new",
        ] {
            assert_eq!(mysql_fold(language), Fold::Opaque, "{language}");
        }
    }

    #[test]
    fn sqlite_columns_name_their_collation() {
        let sql = r#"CREATE TABLE "users" ("id" TEXT PRIMARY KEY COLLATE nocase, name TEXT COLLATE RTRIM, note TEXT CHECK (note <> 'a,b'), [Code] varchar(10) collate BINARY)"#;
        assert_eq!(sqlite_collation(sql, "id").as_deref(), Some("nocase"));
        assert_eq!(sqlite_collation(sql, "name").as_deref(), Some("RTRIM"));
        assert_eq!(sqlite_collation(sql, "note"), None);
        assert_eq!(sqlite_collation(sql, "code").as_deref(), Some("BINARY"));
        assert_eq!(
            sqlite_collation(sql, "gone").as_deref(),
            Some("(not found)")
        );
        assert_eq!(
            sqlite_fold(sqlite_collation(sql, "id").as_deref()),
            Fold::Total {
                case: true,
                pad: false
            }
        );
        assert_eq!(sqlite_fold(None), Fold::Exact);
        let tricky = "CREATE TABLE t (id TEXT -- the key, a comment\n CHECK (id <> 'x' COLLATE BINARY) COLLATE NOCASE /* , */, n TEXT)";
        assert_eq!(sqlite_collation(tricky, "id").as_deref(), Some("NOCASE"));
        assert_eq!(sqlite_collation(tricky, "n"), None);
        assert_eq!(sqlite_fold(Some("(not found)")), Fold::Opaque);
    }
}
