//! What to tell a user in each dialect's terms: the rights a feature
//! needs, and where to look when a connection is refused.

use super::Backend;

impl Backend {
    /// The rights that make bloomgate's own tables (the outbox).
    #[must_use]
    pub const fn outbox_rights(self) -> &'static str {
        match self {
            Self::Postgres => "CREATE on the schema",
            Self::MySql => "CREATE, ALTER and INDEX on the database, and SELECT, INSERT, UPDATE and DELETE on bloomgate's tables (MySQL gives a table's creator no rights on it)",
            Self::Sqlite => "a database file, and its directory, it may write",
        }
    }

    /// The rights that install capture triggers on a table.
    #[must_use]
    pub const fn trigger_rights(self) -> &'static str {
        match self {
            Self::MySql => {
                "the TRIGGER privilege on the table (with binary logging on, also SUPER or \
                 log_bin_trust_function_creators = 1)"
            }
            Self::Postgres => "the TRIGGER privilege on the table (or its ownership)",
            Self::Sqlite => "write access to the database file",
        }
    }
}

/// Where to look when the database refused a connection: `url` the
/// configured one, `text` what the driver said, lowercased. Empty when
/// nothing more specific is known.
#[must_use]
pub fn connect_hint(url: Option<&str>, text: &str) -> &'static str {
    let tls_off = url.is_some_and(|u| {
        let u = u.to_ascii_lowercase();
        u.contains("sslmode=disable") || u.contains("ssl-mode=disabled")
    });
    // MariaDB with require_secure_transport answers a plain login
    // "Access denied"; PostgreSQL's hba says "no encryption".
    let refused_plain = ["no encryption", "access denied", "insecure transport"]
        .iter()
        .any(|w| text.contains(w));
    if tls_off && refused_plain {
        " (TLS is disabled in the URL: a server that requires TLS refuses such logins)"
    } else if text.contains("certificaterequired") || text.contains("certificate required") {
        " (the server asks for a client certificate: sslcert and sslkey on PostgreSQL, ssl-cert and ssl-key on MySQL)"
    } else if text.contains("certificate") {
        " (the server's certificate did not verify: check sslrootcert on PostgreSQL or ssl-ca on MySQL, and that it names the URL's host)"
    } else {
        ""
    }
}
