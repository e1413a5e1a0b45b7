//! What every listener shares: the accept loop within a connection limit
//! ([`accept`]), asking a connection to close on shutdown ([`drain`]),
//! hyper's header timer ([`lazy_timer`]) and the per-client rate limit
//! ([`rate`]). The HTTP API (`http`), the HTTP gate (`proxy`) and the
//! Redis-protocol listener (`resp`) stand side by side on it, none
//! importing another's loop. Protocol-free: no axum here, and no module of
//! the crate above the leaves.

pub mod accept;
pub mod drain;
pub mod lazy_timer;
pub mod rate;

pub use accept::{connection_permits, default_max_connections, next_connection};
pub use drain::until_stopped;
pub use lazy_timer::LazyTimer;
pub use rate::{Admit, RateLimit};
