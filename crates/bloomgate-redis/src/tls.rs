//! Connecting to a Redis that speaks TLS (`rediss://`), one server or a
//! Cluster, with the server's certificate checked against a CA file of the
//! caller's and, optionally, a client certificate (feature `tls`).
//!
//! TLS is rustls with the *ring* provider: no system OpenSSL at run time.
//! Without a CA file the server is checked against the Mozilla roots that
//! `webpki-roots` ships, which managed Redis services' public certificates
//! chain to. A CA file replaces those roots: only a certificate it signed
//! is accepted, and the certificate must name the host of the URL.
//!
//! ```no_run
//! use bloomgate_redis::{tls::TlsFiles, Conn, RedisBloom};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let files = TlsFiles {
//!     ca: Some("/etc/redis-tls/ca.crt".into()),
//!     ..TlsFiles::default()
//! };
//! let client = files.client("rediss://app:secret@redis.internal:6380/")?;
//! let conn: Conn = redis::aio::ConnectionManager::new(client).await?.into();
//! let users = RedisBloom::create(conn, "users", 1_000_000, 0.001, 1).await?;
//! users.insert("u1001").await?;
//! # Ok(())
//! # }
//! ```

use std::path::{Path, PathBuf};

use crate::Error;

/// The files a TLS connection to Redis reads: all optional, in PEM.
///
/// ```
/// use bloomgate_redis::tls::TlsFiles;
/// let none = TlsFiles::default();
/// assert!(none.is_empty());
/// // A plain URL needs no file; `rediss://` is verified with these.
/// assert!(none.client("redis://127.0.0.1:6379/").is_ok());
/// let missing = TlsFiles {
///     ca: Some("/nonexistent/ca.pem".into()),
///     ..TlsFiles::default()
/// };
/// let err = missing.client("rediss://127.0.0.1:6380/").unwrap_err();
/// assert!(err.to_string().contains("/nonexistent/ca.pem"));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA that signed the server's certificate; without it, the
    /// Mozilla roots.
    pub ca: Option<PathBuf>,
    /// A client certificate, for servers that ask for one (`tls-auth-clients`).
    pub cert: Option<PathBuf>,
    /// The client certificate's private key (with `cert`).
    pub key: Option<PathBuf>,
}

fn read(path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|source| Error::TlsFile {
        path: path.to_path_buf(),
        source,
    })
}

impl TlsFiles {
    /// No file given: the default roots, no client certificate.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.ca.is_none() && self.cert.is_none() && self.key.is_none()
    }

    /// The files' contents as the `redis` crate takes them.
    ///
    /// # Errors
    /// [`Error::TlsFile`] when a file cannot be read; [`Error::Invalid`]
    /// when only one of `cert` and `key` is given.
    pub fn certificates(&self) -> Result<redis::TlsCertificates, Error> {
        install_provider();
        let client_tls = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
                client_cert: read(cert)?,
                client_key: read(key)?,
            }),
            (None, None) => None,
            _ => {
                return Err(Error::Invalid {
                    key: "(tls)".into(),
                    reason: "a client certificate needs both its certificate and its key".into(),
                })
            }
        };
        Ok(redis::TlsCertificates {
            client_tls,
            root_cert: self.ca.as_deref().map(read).transpose()?,
        })
    }

    /// A client for one server: `redis://` as it is, `rediss://` verified
    /// with these files.
    ///
    /// # Errors
    /// A file that cannot be read, or a URL the `redis` crate refuses.
    pub fn client(&self, url: &str) -> Result<redis::Client, Error> {
        if !url.starts_with("rediss://") {
            return Ok(redis::Client::open(url)?);
        }
        Ok(redis::Client::build_with_tls(url, self.certificates()?)?)
    }

    /// A cluster client builder for these seed nodes, verifying every
    /// `rediss://` node with these files.
    ///
    /// # Errors
    /// A file that cannot be read.
    pub fn cluster(
        &self,
        nodes: Vec<String>,
    ) -> Result<redis::cluster::ClusterClientBuilder, Error> {
        let tls = nodes.iter().any(|n| n.starts_with("rediss://"));
        let builder = redis::cluster::ClusterClientBuilder::new(nodes);
        Ok(if tls {
            builder.certs(self.certificates()?)
        } else {
            builder
        })
    }
}

/// rustls needs one process-wide crypto provider; ring is the one this
/// crate enables. Another provider installed first is kept.
fn install_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
