//! The change feed: how every instance learns every write. `outbox`: the
//! table `bloomgate_changes` in SQL, written in each write's own
//! transaction, and the follower that applies it; `capture`: the
//! triggers that write it inside other programs' transactions; `doorbell`:
//! the Redis stream that rings the followers and announces shared
//! rebuilds (it holds no change).

pub mod capture;
pub mod doorbell;
pub mod outbox;
