//! The commands: RedisBloom's `BF.*` (with its reply shapes, RESP3
//! booleans and maps where RedisBloom sends them) and what clients send on
//! connect. Anything else is `-ERR unknown command`, worded as Redis
//! words it.

use super::connection::{answer, unknown_command, Session, SPECS};
use super::reply::Out;
use super::{Filter, Registry, Target};
use crate::error::AppError;
use crate::key::{Fold, Key};
use crate::metrics::resp::COMMANDS;

/// Answers one command (`args`, at least one) into `out`.
pub async fn execute(reg: &Registry, s: &mut Session, out: &mut Out, args: &[&[u8]]) {
    let mut upper = [0u8; 16];
    let name = args[0];
    let n = name.len().min(upper.len());
    upper[..n].copy_from_slice(&name[..n]);
    upper[..n].make_ascii_lowercase();
    let lower: &[u8] = if name.len() <= upper.len() {
        &upper[..n]
    } else {
        name
    };
    // A browser's request sent to this port (cross-protocol scripting):
    // closed without a word, as Redis does.
    if lower == b"post" || lower == b"host:" {
        tracing::warn!(
            "RESP: an HTTP request arrived on the Redis-protocol port; connection closed"
        );
        s.close = true;
        s.silent = true;
        return;
    }
    let Some(spec) = SPECS.iter().find(|sp| sp.name.as_bytes() == lower) else {
        reg.metrics
            .resp
            .record(reg.metrics.resp.no_resource(), 8, None, true);
        out.error(&unknown_command(args));
        return;
    };
    let argc = args.len() as i64;
    if (spec.arity > 0 && argc != spec.arity) || (spec.arity < 0 && argc < -spec.arity) {
        out.error(&format!(
            "ERR wrong number of arguments for '{}' command",
            spec.name
        ));
        return;
    }
    let command = COMMANDS.iter().position(|c| *c == spec.name);
    let Some(command) = command else {
        let before = out.buf.len();
        answer(reg, s, out, spec.name, args);
        let error = out.buf.get(before) == Some(&b'-');
        reg.metrics
            .resp
            .record(reg.metrics.resp.no_resource(), 7, None, error);
        return;
    };
    // The TSC clock: a system clock read costs more than the command
    // (`clock_gettime` took 8% of a pipelined run's profile).
    let started = quanta::Instant::now();
    let target = reg.target(args[1]);
    // Reads take one unit per item from the client's rate, as HTTP's.
    if let (Some(rate), 0 | 1) = (&reg.rate, command) {
        use crate::listen::Admit;
        let refused = match rate.admit(s.peer, args.len() - 2) {
            Admit::Yes => None,
            Admit::Wait(secs) => Some(format!(
                "ERR too many requests from this client; retry in {secs} s"
            )),
            Admit::Never => Some(format!(
                "ERR {} items in one command are more than this client's burst (http.rate_limit_burst): send fewer",
                args.len() - 2
            )),
        };
        if let Some(why) = refused {
            out.error(&why);
            let slot = target.map_or_else(|| reg.metrics.resp.no_resource(), |t| t.slot);
            reg.metrics.resp.record(slot, command, None, true);
            return;
        }
    }
    let before = out.buf.len();
    bloom(s, out, command, target, args).await;
    let error = out.buf.get(before) == Some(&b'-');
    let slot = target.map_or_else(|| reg.metrics.resp.no_resource(), |t| t.slot);
    reg.metrics
        .resp
        .record(slot, command, Some(started.elapsed()), error);
}

/// The `BF.*` commands (`command`: the index in [`COMMANDS`]).
async fn bloom(
    s: &Session,
    out: &mut Out,
    command: usize,
    target: Option<&Target>,
    args: &[&[u8]],
) {
    let writes = matches!(command, 2..=4);
    if writes && !s.authed {
        out.error("NOAUTH Authentication required.");
        return;
    }
    match (command, target) {
        // A read of a name that is no resource is an error, not "absent"
        // (RedisBloom's 0): a typo in `[resp.keys]` must not make a whole
        // table look empty.
        (0 | 1 | 5, None) => out.error(&format!(
            "ERR no filter named '{}': bloomgate's filters are its configured resources ([[resources]], [resp.keys])",
            String::from_utf8_lossy(&args[1][..args[1].len().min(128)])
        )),
        // BF.EXISTS
        (0, Some(t)) => out.bool(exists_one(t, args[2]).await),
        // BF.MEXISTS
        (1, Some(t)) => {
            let answers = exists(t, &args[2..]).await;
            out.array(answers.len());
            for a in answers {
                out.bool(a);
            }
        }
        // BF.ADD, BF.MADD, BF.INSERT
        (2..=4, _) => {
            let (items, nocreate) = if command == 4 {
                match insert_items(args) {
                    Ok(parsed) => parsed,
                    Err(e) => return out.error(&e.to_string()),
                }
            } else {
                (&args[2..], false)
            };
            let Some(t) = target else {
                return out.error(&if nocreate {
                    "ERR not found".to_owned()
                } else {
                    format!(
                        "ERR no filter named '{}': bloomgate's filters are its configured resources ([[resources]], [resp.keys]) and cannot be created by a command",
                        String::from_utf8_lossy(&args[1][..args[1].len().min(128)])
                    )
                });
            };
            match add(t, items).await {
                Ok(added) if command == 2 => out.bool(added[0]),
                Ok(added) => {
                    out.array(added.len());
                    for a in added {
                        out.bool(a);
                    }
                }
                Err(e) => out.error(&e),
            }
        }
        // BF.CARD
        (5, Some(t)) => out.int(figures(t).added as i64),
        // BF.INFO
        (_, None) => out.error("ERR not found"),
        (_, Some(t)) => info(out, t, args.get(2).copied()),
    }
}

/// The parsed key of `raw` for `t`, or `None` where it cannot be in the
/// column (not UTF-8, not an integer for an integer key, empty, too long).
fn key_of<K: FromRaw>(raw: &[u8], ty: crate::key::KeyType, fold: Fold) -> Option<K> {
    K::from_raw(std::str::from_utf8(raw).ok()?, ty, fold)
}

/// The answer for an item that is no key bloomgate judges (`key_of`
/// found none): "maybe" for a text column, which may hold what
/// [`Key::parse`] refuses (empty, over 255 bytes, a control character,
/// bytes that are not UTF-8) and whose rebuild hashed such rows as they
/// are, so no "no" can be vouched for; "no" for an integer column, which
/// cannot hold anything but an integer.
fn unjudged(ty: crate::key::KeyType) -> bool {
    ty == crate::key::KeyType::Text
}

/// How a raw item becomes a resource's key.
trait FromRaw: Sized {
    fn from_raw(raw: &str, ty: crate::key::KeyType, fold: Fold) -> Option<Self>;
    /// What a key of type `ty` may be, for the refusal's message.
    fn described(ty: crate::key::KeyType) -> &'static str;
}

impl FromRaw for i64 {
    fn from_raw(raw: &str, _: crate::key::KeyType, _: Fold) -> Option<Self> {
        raw.parse::<i64>().ok().filter(|&id| id > 0)
    }
    fn described(_: crate::key::KeyType) -> &'static str {
        "positive 64-bit integers"
    }
}

impl FromRaw for Key {
    fn from_raw(raw: &str, ty: crate::key::KeyType, fold: Fold) -> Option<Self> {
        fold.parse(ty, raw).ok()
    }
    fn described(ty: crate::key::KeyType) -> &'static str {
        match ty {
            crate::key::KeyType::Int => "64-bit integers",
            crate::key::KeyType::Text => "text of 1 to 255 bytes without control characters",
        }
    }
}

/// The filter's answers for `items`: false only where it says "no" and
/// the instance vouches for it (as the HTTP `exists` call).
async fn exists(t: &Target, items: &[&[u8]]) -> Vec<bool> {
    match &t.filter {
        Filter::Skus(r) => exists_in(r, items, r.key_type()).await,
        Filter::Table(r) => exists_in(r, items, r.key_type()).await,
    }
}

async fn exists_in<R>(
    r: &crate::resource::Resource<R>,
    items: &[&[u8]],
    ty: crate::key::KeyType,
) -> Vec<bool>
where
    R: crate::resource::Guarded,
    R::Key: FromRaw + Clone,
{
    let mut answers = vec![unjudged(ty); items.len()];
    let mut keys = Vec::with_capacity(items.len());
    let mut at = Vec::with_capacity(items.len());
    for (i, raw) in items.iter().enumerate() {
        if let Some(k) = key_of::<R::Key>(raw, ty, r.fold()) {
            keys.push(k);
            at.push(i);
        }
    }
    for (keys, at) in keys
        .chunks(r.max_batch_keys)
        .zip(at.chunks(r.max_batch_keys))
    {
        // Within the limit by construction.
        let verdicts = r
            .exists(keys)
            .await
            .unwrap_or_else(|_| vec![true; keys.len()]);
        for (&i, v) in at.iter().zip(verdicts) {
            answers[i] = v;
        }
    }
    answers
}

/// The filter's answer for one item, without the batch's buffers.
async fn exists_one(t: &Target, raw: &[u8]) -> bool {
    match &t.filter {
        Filter::Skus(r) => match key_of::<i64>(raw, r.key_type(), r.fold()) {
            Some(k) => r.exists_one(&k).await,
            None => unjudged(r.key_type()),
        },
        Filter::Table(r) => match key_of::<Key>(raw, r.key_type(), r.fold()) {
            Some(k) => r.exists_one(&k).await,
            None => unjudged(r.key_type()),
        },
    }
}

/// Adds `items` through the key API's `keys` call (every instance); each
/// answer says whether the item was new to this instance's filter.
async fn add(t: &Target, items: &[&[u8]]) -> Result<Vec<bool>, String> {
    match &t.filter {
        Filter::Skus(r) => add_to(r, items, r.key_type()).await,
        Filter::Table(r) => add_to(r, items, r.key_type()).await,
    }
}

async fn add_to<R>(
    r: &crate::resource::Resource<R>,
    items: &[&[u8]],
    ty: crate::key::KeyType,
) -> Result<Vec<bool>, String>
where
    R: crate::resource::Guarded,
    R::Key: FromRaw + Clone,
{
    let mut keys = Vec::with_capacity(items.len());
    for raw in items {
        let Some(k) = key_of::<R::Key>(raw, ty, r.fold()) else {
            return Err(format!(
                "ERR '{}' cannot be a key of {} (its keys are {})",
                String::from_utf8_lossy(&raw[..raw.len().min(64)]),
                r.name,
                R::Key::described(ty)
            ));
        };
        keys.push(k);
    }
    let mut added = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(r.max_batch_keys) {
        // New: the filter said a vouched "no" before (not counted as a
        // read). Where it cannot vouch, 0: "may have been there".
        let before: Vec<bool> = chunk
            .iter()
            .map(|k| r.shield().probe(k) == crate::shield::Verdict::Reject)
            .collect();
        let kept = r.add_keys(chunk).await.map_err(app_error)?;
        added.extend(before.into_iter().zip(kept).map(|(new, kept)| new && kept));
    }
    Ok(added)
}

fn app_error(e: AppError) -> String {
    match e {
        AppError::BadRequest(m) => format!("ERR {m}"),
        AppError::Unavailable(why) => {
            tracing::warn!(%why, "RESP: adding keys failed");
            "ERR unavailable: the keys were not confirmed for every instance (a store did not answer); send the command again".into()
        }
        other => format!("ERR {other}"),
    }
}

/// `BF.INSERT key [CAPACITY n] [ERROR e] [EXPANSION n] [NOCREATE]
/// [NONSCALING] ITEMS item…`: the items, and whether `NOCREATE` was
/// given. The creation options are checked and then ignored, as
/// RedisBloom ignores them for a filter that exists.
fn insert_items<'a>(args: &'a [&'a [u8]]) -> Result<(&'a [&'a [u8]], bool), InsertError> {
    let mut i = 2;
    let (mut nocreate, mut sized) = (false, false);
    while i < args.len() {
        let word = args[i].to_ascii_uppercase();
        let value = args.get(i + 1).and_then(|v| std::str::from_utf8(v).ok());
        match word.as_slice() {
            b"ITEMS" => {
                if i + 1 == args.len() {
                    return Err(InsertError::Arity);
                }
                if nocreate && sized {
                    return Err(InsertError::NoCreateSized);
                }
                return Ok((&args[i + 1..], nocreate));
            }
            b"NOCREATE" => nocreate = true,
            b"NONSCALING" => {}
            b"CAPACITY" => {
                if value
                    .and_then(|v| v.parse::<u64>().ok())
                    .is_none_or(|c| c == 0)
                {
                    return Err(InsertError::Capacity);
                }
                sized = true;
                i += 1;
            }
            b"ERROR" => {
                if !value
                    .and_then(|v| v.parse::<f64>().ok())
                    .is_some_and(|e| e > 0.0 && e < 1.0)
                {
                    return Err(InsertError::ErrorRate);
                }
                sized = true;
                i += 1;
            }
            b"EXPANSION" => {
                if value
                    .and_then(|v| v.parse::<u64>().ok())
                    .is_none_or(|x| x == 0)
                {
                    return Err(InsertError::Expansion);
                }
                i += 1;
            }
            _ => return Err(InsertError::Unknown),
        }
        i += 1;
    }
    Err(InsertError::NoItems)
}

/// Why a `BF.INSERT` was refused, worded as RedisBloom words it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
enum InsertError {
    #[error("ERR wrong number of arguments for 'bf.insert' command")]
    Arity,
    #[error("ERR NOCREATE cannot be used together with CAPACITY or ERROR")]
    NoCreateSized,
    #[error("ERR Bad capacity")]
    Capacity,
    #[error("ERR Bad error rate")]
    ErrorRate,
    #[error("ERR Bad expansion")]
    Expansion,
    #[error("ERR unknown argument received")]
    Unknown,
    #[error("ERR ITEMS is required")]
    NoItems,
}

fn figures(t: &Target) -> crate::shield::ShieldStats {
    match &t.filter {
        Filter::Skus(r) => r.shield().stats(),
        Filter::Table(r) => r.shield().stats(),
    }
}

/// `BF.INFO`: RedisBloom's five fields (a map in RESP3), or one of them
/// as a singleton array (RedisBloom's shape; valkey-bloom answers a bare
/// integer). The expansion rate is null: a filter does not scale, it is
/// rebuilt larger.
fn info(out: &mut Out, t: &Target, selector: Option<&[u8]>) {
    let g = figures(t);
    let fields: [(&str, Option<i64>); 5] = [
        ("Capacity", Some(g.capacity as i64)),
        ("Size", Some(g.bits.div_ceil(8) as i64)),
        ("Number of filters", Some(1)),
        ("Number of items inserted", Some(g.added as i64)),
        ("Expansion rate", None),
    ];
    let value = |out: &mut Out, v: Option<i64>| match v {
        Some(n) => out.int(n),
        None => out.null(),
    };
    match selector {
        None => {
            out.map(fields.len());
            for (name, v) in fields {
                out.simple(name);
                value(out, v);
            }
        }
        Some(sel) => {
            let index = [
                &b"CAPACITY"[..],
                b"SIZE",
                b"FILTERS",
                b"ITEMS",
                b"EXPANSION",
            ]
            .iter()
            .position(|w| w.eq_ignore_ascii_case(sel));
            match index {
                Some(i) => {
                    out.array(1);
                    value(out, fields[i].1);
                }
                None => out.error("ERR Invalid information value"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_options_as_redisbloom_reads_them() {
        let a = |s: &str| -> Vec<Vec<u8>> { s.split(' ').map(|w| w.as_bytes().to_vec()).collect() };
        let check = |s: &str| {
            let owned = a(s);
            let args: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
            insert_items(&args).map(|(items, nc)| (items.len(), nc))
        };
        assert_eq!(check("BF.INSERT k ITEMS a b"), Ok((2, false)));
        assert_eq!(check("BF.INSERT k nocreate items a"), Ok((1, true)));
        assert_eq!(
            check("BF.INSERT k CAPACITY 10 ERROR 0.01 EXPANSION 2 NONSCALING ITEMS a"),
            Ok((1, false))
        );
        assert_eq!(
            check("BF.INSERT k CAPACITY 10 NOCREATE ITEMS a"),
            Err(InsertError::NoCreateSized)
        );
        assert_eq!(
            check("BF.INSERT k CAPACITY x ITEMS a"),
            Err(InsertError::Capacity)
        );
        assert_eq!(
            check("BF.INSERT k ERROR 2 ITEMS a"),
            Err(InsertError::ErrorRate)
        );
        assert_eq!(
            check("BF.INSERT k EXPANSION 0 ITEMS a"),
            Err(InsertError::Expansion)
        );
        assert_eq!(check("BF.INSERT k ITEMS"), Err(InsertError::Arity));
        assert_eq!(check("BF.INSERT k a b"), Err(InsertError::Unknown));
        assert_eq!(check("BF.INSERT k NOCREATE"), Err(InsertError::NoItems));
        assert_eq!(
            InsertError::Capacity.to_string(),
            "ERR Bad capacity",
            "RedisBloom's words"
        );
    }
}
