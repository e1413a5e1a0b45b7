//! Leases: a reader that missed takes the key with a token of its own
//! (in one script with the lookup), and its fill replaces only that
//! token; a write's `DEL` takes it away, so a fill that read before the
//! write never lands (see the module docs of [`super`]).

/// A reader's right to fill one key, valid until a write deletes the key
/// or the lease expires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub(super) token: String,
}

/// The prefix of lease tokens stored in place of a value.
pub const LEASE_PREFIX: &str = "__lease__:";

/// How long a lease lives: a reader slower than this between its GET and
/// its fill does not write back (the fill fails harmlessly).
pub const LEASE_MS: u64 = 5_000;

impl Lease {
    pub(super) fn new() -> Self {
        Self {
            token: format!("{LEASE_PREFIX}{:016x}", fastrand::u64(..)),
        }
    }
}

/// GET the key; on a miss set this reader's lease, in one step.
pub(super) const LOOKUP_OR_LEASE: &str = r"
local v = redis.call('GET', KEYS[1])
if v then return v end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false
";

/// Replace the key's value only if it still holds this reader's lease.
pub(super) const FILL_IF_LEASED: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
  return 1
end
return 0
";

/// Set a lease on a key that holds nothing.
pub(super) const LEASE_IF_EMPTY: &str = r"
return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) and 1 or 0
";

/// Set a lease on a key only while it still holds `ARGV[1]`: whatever
/// that value said stays true, since every change of the key deletes it.
pub(super) const LEASE_IF_HOLDS: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
";
