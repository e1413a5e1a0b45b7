//! What a membership check costs: in-process replica, one `GETRANGE` of the
//! key's block (this crate), `k` pipelined `GETBIT`s, and go-zero's check
//! (`k` `GETBIT`s in one Lua script), side by side in one run against one
//! Redis on loopback. Sequential checks from one client (each waits for its
//! answer), then batches of 1,000 keys per round trip. Median of 3 rounds.
//!
//! `cargo run --release -p bloomgate-redis --example check_cost [REDIS_URL]`
//! (default `redis://127.0.0.1:6379/`; uses the key `bgbench:check_cost`).

use std::time::Instant;

use bloomgate_filter::hash::splitmix64;
use bloomgate_filter::{AtomicBloom, BlockedBloom, Filter};
use bloomgate_redis::RedisBloom;

const LUA_GETBITS: &str = r"
for _, offset in ipairs(ARGV) do
  if tonumber(redis.call('getbit', KEYS[1], offset)) == 0 then return 0 end
end
return 1
";

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "redis://127.0.0.1:6379/".into());
    let client = redis::Client::open(url)?;
    let conn = redis::aio::ConnectionManager::new(client).await?;
    let key = "bgbench:check_cost";
    let _: () = redis::cmd("DEL")
        .arg(key)
        .arg(format!("{key}:meta"))
        .query_async(&mut conn.clone())
        .await?;
    let n = 1_000_000u64;
    let shared = RedisBloom::create(conn.clone(), key, n, 0.01, 5).await?;
    let members: Vec<u64> = (0..n).map(splitmix64).collect();
    for chunk in members.chunks(10_000) {
        shared.insert_many(chunk).await?;
    }
    let mut local = BlockedBloom::new(shared.params(), 5)?;
    local.insert_many(&members);
    let replica = AtomicBloom::from_blocked(&local)?;
    let probes: Vec<u64> = (0..20_000u64)
        .map(|i| {
            if i % 2 == 0 {
                members[(i * 37) as usize]
            } else {
                i | (1 << 61)
            }
        })
        .collect();
    let script = redis::Script::new(LUA_GETBITS);
    let mut c = conn.clone();

    let mut rows: Vec<(&str, Vec<f64>)> = [
        "in-process replica (AtomicBloom)",
        "GETRANGE of the block (RedisBloom::contains)",
        "k GETBITs, pipelined",
        "go-zero: k GETBITs in one Lua script",
        "GETRANGE, 1,000 keys per round trip",
        "Lua script, 1,000 keys per round trip",
    ]
    .into_iter()
    .map(|name| (name, Vec::new()))
    .collect();
    let mut agree = true;
    for _ in 0..3 {
        let t = Instant::now();
        let mut hits = 0u64;
        for _ in 0..50 {
            for p in &probes {
                hits += u64::from(replica.contains(std::hint::black_box(p)));
            }
        }
        rows[0]
            .1
            .push(t.elapsed().as_nanos() as f64 / (50.0 * probes.len() as f64));
        let local_hits = hits / 50;

        let t = Instant::now();
        let mut h = 0u64;
        for p in &probes {
            h += u64::from(shared.contains(p).await?);
        }
        rows[1]
            .1
            .push(t.elapsed().as_nanos() as f64 / probes.len() as f64);
        agree &= h == local_hits;

        let t = Instant::now();
        let mut h = 0u64;
        for p in &probes {
            let mut pipe = redis::pipe();
            for off in shared.offsets_of(p) {
                pipe.cmd("GETBIT").arg(key).arg(off);
            }
            let bits: Vec<u8> = pipe.query_async(&mut c).await?;
            h += u64::from(bits.iter().all(|&b| b == 1));
        }
        rows[2]
            .1
            .push(t.elapsed().as_nanos() as f64 / probes.len() as f64);
        agree &= h == local_hits;

        let t = Instant::now();
        let mut h = 0u64;
        for p in &probes {
            let mut inv = script.key(key);
            for off in shared.offsets_of(p) {
                inv.arg(off);
            }
            let r: i64 = inv.invoke_async(&mut c).await?;
            h += u64::from(r == 1);
        }
        rows[3]
            .1
            .push(t.elapsed().as_nanos() as f64 / probes.len() as f64);
        agree &= h == local_hits;

        let t = Instant::now();
        let mut h = 0u64;
        for chunk in probes.chunks(1000) {
            h += shared
                .contains_many(chunk)
                .await?
                .iter()
                .filter(|&&b| b)
                .count() as u64;
        }
        rows[4]
            .1
            .push(t.elapsed().as_nanos() as f64 / probes.len() as f64);
        agree &= h == local_hits;

        // The script is loaded once (EVALSHA then); pipelined like ours.
        let _: i64 = {
            let mut inv = script.key(key);
            inv.arg(0);
            inv.invoke_async(&mut c).await?
        };
        let sha = script.get_hash().to_string();
        let t = Instant::now();
        let mut h = 0u64;
        for chunk in probes.chunks(1000) {
            let mut pipe = redis::pipe();
            for p in chunk {
                let cmd = pipe.cmd("EVALSHA").arg(&sha).arg(1).arg(key);
                for off in shared.offsets_of(p) {
                    cmd.arg(off);
                }
            }
            let rs: Vec<i64> = pipe.query_async(&mut c).await?;
            h += rs.iter().filter(|&&r| r == 1).count() as u64;
        }
        rows[5]
            .1
            .push(t.elapsed().as_nanos() as f64 / probes.len() as f64);
        agree &= h == local_hits;
    }
    assert!(agree, "every method gave the in-process filter's answers");
    println!(
        "n = {n} keys at 1% ({} hashes), {} probes (half members), median of 3 rounds\n",
        shared.params().hashes,
        probes.len()
    );
    println!("| check | ns per check | ÷ in-process | ÷ go-zero Lua (same batching) |");
    println!("|---|---|---|---|");
    let base = median(rows[0].1.clone());
    let (lua1, lua_batch) = (median(rows[3].1.clone()), median(rows[5].1.clone()));
    for (i, (name, v)) in rows.iter().enumerate() {
        let m = median(v.clone());
        let vs_lua = match i {
            0 => "—".to_string(),
            1..=3 => format!("{:.2}", m / lua1),
            _ => format!("{:.2}", m / lua_batch),
        };
        println!("| {name} | {m:.1} | {:.0} | {vs_lua} |", m / base);
    }
    RedisBloom::open(conn, key).await?.destroy().await?;
    Ok(())
}
