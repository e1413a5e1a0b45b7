//! What one run sends: its bounds ([`plan`]), the target it may attack
//! ([`check_target`]), the i-th key ([`Ids`]) and where it goes
//! ([`Target`]).

use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::Value;

use super::{AttackArgs, Mode, MAX_CONCURRENCY, MAX_DURATION_SECS, MAX_REQUESTS};

/// How many requests and for how long, after checking the bounds.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    pub requests: u64,
    pub deadline: Option<Duration>,
    pub interval: Option<Duration>,
}

pub fn plan(a: &AttackArgs) -> anyhow::Result<Plan> {
    if a.concurrency == 0 || a.concurrency > MAX_CONCURRENCY {
        bail!(
            "--concurrency must be 1..={MAX_CONCURRENCY} (got {})",
            a.concurrency
        );
    }
    let requests = match (a.requests, a.duration) {
        (Some(n), _) => n,
        (None, Some(_)) => MAX_REQUESTS,
        (None, None) => 100_000,
    };
    if requests == 0 || requests > MAX_REQUESTS {
        bail!("--requests must be 1..={MAX_REQUESTS} (got {requests})");
    }
    let deadline = match a.duration {
        Some(d) if !(d > 0.0 && d <= MAX_DURATION_SECS) => {
            bail!("--duration must be over 0 and at most {MAX_DURATION_SECS} seconds (got {d})")
        }
        Some(d) => Some(Duration::from_secs_f64(d)),
        None => None,
    };
    let interval = match a.rate {
        Some(r) if !(0.01..=10_000_000.0).contains(&r) => {
            bail!("--rate must be 0.01..=10000000 requests per second (got {r})")
        }
        Some(r) => Some(Duration::from_secs_f64(1.0 / r)),
        None => None,
    };
    if !(0.01..=60.0).contains(&a.sample_every) {
        bail!(
            "--sample-every must be 0.01..=60 seconds (got {})",
            a.sample_every
        );
    }
    match a.mode {
        Mode::Same if a.id == 0 || a.id > i64::MAX as u64 => {
            bail!("--id must be a positive 64-bit id (got {})", a.id)
        }
        Mode::Random | Mode::Mix
            if a.min_id == 0 || a.min_id > a.max_id || a.max_id > i64::MAX as u64 =>
        {
            bail!(
                "--min-id and --max-id must satisfy 1 <= min <= max <= 2^63-1 (got {}..={})",
                a.min_id,
                a.max_id
            )
        }
        Mode::Existing | Mode::Mix if a.existing_max == 0 || a.existing_max > i64::MAX as u64 => {
            bail!(
                "--existing-max must be a positive 64-bit id (got {})",
                a.existing_max
            )
        }
        Mode::Mix if !(0.0..=1.0).contains(&a.existing_ratio) => {
            bail!(
                "--existing-ratio must be in [0, 1] (got {})",
                a.existing_ratio
            )
        }
        _ => {}
    }
    if let Some(name) = &a.resource {
        let fine = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !fine {
            bail!("--resource must be a resource's name: lower-case letters, digits and _ (got {name:?})");
        }
    }
    if let Some(prefix) = &a.key_prefix {
        if a.resource.is_none() {
            bail!("--key-prefix is for a text resource's keys: give --resource too");
        }
        if prefix.len() > 200
            || prefix
                .bytes()
                .any(|b| !b.is_ascii_alphanumeric() && !b"-_.~".contains(&b))
        {
            bail!("--key-prefix must be at most 200 URL-safe characters: letters, digits, - _ . ~ (got {prefix:?})");
        }
    }
    if a.mode == Mode::Random && requests > a.max_id - a.min_id + 1 && a.duration.is_none() {
        bail!(
            "--mode random sends distinct ids: {requests} requests need a range of at least that many (got {}..={})",
            a.min_id, a.max_id
        );
    }
    Ok(Plan {
        requests,
        deadline,
        interval,
    })
}

/// The i-th id of a run: a pure function of the arguments, so runs repeat.
#[derive(Debug, Clone, Copy)]
pub struct Ids {
    mode: Mode,
    id: u64,
    min: u64,
    span: u64,
    /// A multiplier coprime with `span`: i ↦ (i·step + offset) mod span is
    /// a permutation, so the first `span` random ids are distinct.
    step: u64,
    offset: u64,
    existing_max: u64,
    /// `--existing-ratio` scaled to 2^64.
    existing_below: u64,
    seed: u64,
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl Ids {
    pub fn new(a: &AttackArgs) -> Self {
        let span = a.max_id - a.min_id + 1;
        let mix = bloomgate_filter::hash::splitmix64;
        let mut step = mix(a.seed) % span.max(1);
        let mut n = 0;
        while gcd(step, span) != 1 {
            n += 1;
            step = mix(a.seed.wrapping_add(n)) % span;
        }
        Self {
            mode: a.mode,
            id: a.id,
            min: a.min_id,
            span,
            step,
            offset: mix(a.seed ^ 0x5eed) % span,
            existing_max: a.existing_max,
            existing_below: (a.existing_ratio * 2f64.powi(64)).min(u64::MAX as f64) as u64,
            seed: a.seed,
        }
    }

    fn random(&self, i: u64) -> u64 {
        let k = (u128::from(i) * u128::from(self.step) + u128::from(self.offset))
            % u128::from(self.span);
        self.min + k as u64
    }

    fn existing(&self, i: u64) -> u64 {
        bloomgate_filter::hash::splitmix64(self.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ i)
            % self.existing_max
            + 1
    }

    pub fn nth(&self, i: u64) -> u64 {
        match self.mode {
            Mode::Same => self.id,
            Mode::Random => self.random(i),
            Mode::Existing => self.existing(i),
            Mode::Mix => {
                let coin = bloomgate_filter::hash::splitmix64(self.seed ^ i.rotate_left(17));
                if coin < self.existing_below {
                    self.existing(i)
                } else {
                    self.random(i)
                }
            }
        }
    }
}

/// Refuses targets off this machine unless allowed.
pub fn check_target(raw: &str, allow_remote: bool) -> anyhow::Result<String> {
    let url = reqwest::Url::parse(raw).with_context(|| format!("--url {raw:?} is not a URL"))?;
    if !matches!(url.scheme(), "http" | "https") {
        bail!("--url must be http:// or https:// (got {raw})");
    }
    let loopback = match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => bail!("--url has no host (got {raw})"),
    };
    if !loopback && !allow_remote {
        bail!("--url {raw} is not on this machine; pass --allow-remote to attack it anyway");
    }
    Ok(raw.trim_end_matches('/').to_string())
}

/// Where the keys go and which stats count them: seed 000's
/// `/api/seckill/{id}` and the top-level stats, or a resource's
/// `/api/{name}/{key}` and `resources.<name>` of the stats.
#[derive(Debug, Clone)]
pub struct Target {
    /// The path before the key, e.g. `/api/users/`.
    pub path: String,
    /// The path after the key (`--path`'s rest after `{id}`).
    pub after: String,
    /// `None` for seed 000's route; the resource's name otherwise.
    pub resource: Option<String>,
    /// Text keys are `{prefix}{n}`; integer keys are `n`.
    pub text_prefix: Option<String>,
}

impl Target {
    /// Seed 000's route, or `--resource NAME` as the service describes it
    /// in `stats` (a text resource gets text keys).
    ///
    /// # Errors
    /// A resource the service does not guard (the message names those it
    /// does).
    pub fn new(a: &AttackArgs, stats: &Value) -> anyhow::Result<Self> {
        let Some(name) = &a.resource else {
            if a.path.is_some() {
                bail!("--path needs --resource: the resource whose filter judges the keys");
            }
            return Ok(Self {
                path: "/api/seckill/".into(),
                after: String::new(),
                resource: None,
                text_prefix: None,
            });
        };
        let Some(r) = stats["resources"].get(name.as_str()) else {
            let known: Vec<&str> = stats["resources"]
                .as_object()
                .map(|m| m.keys().map(String::as_str).collect())
                .unwrap_or_default();
            bail!(
                "--resource {name}: the service guards no such resource (it guards: {})",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            );
        };
        let text = r["key_type"].as_str() == Some("text");
        if !text && a.key_prefix.is_some() {
            bail!("--key-prefix: resource {name} has integer keys");
        }
        let (path, after) = match &a.path {
            None => (format!("/api/{name}/"), String::new()),
            Some(p) => {
                let ok = p.starts_with('/') && p.matches("{id}").count() == 1;
                let Some((before, after)) = p.split_once("{id}").filter(|_| ok) else {
                    bail!("--path must start with / and hold {{id}} once (got {p:?})");
                };
                (before.to_owned(), after.to_owned())
            }
        };
        Ok(Self {
            path,
            after,
            resource: Some(name.clone()),
            text_prefix: text.then(|| a.key_prefix.clone().unwrap_or_else(|| "u".into())),
        })
    }

    /// The URL path of the i-th request's key.
    pub fn path_of(&self, n: u64) -> String {
        match &self.text_prefix {
            Some(prefix) => format!("{}{prefix}{n}{}", self.path, self.after),
            None => format!("{}{n}{}", self.path, self.after),
        }
    }

    /// The stats path of a figure: `bloom.rejected` at the top for seed
    /// 000's route, under `resources.<name>` for a resource.
    pub fn figure<'a>(&'a self, path: &[&'a str]) -> Vec<&'a str> {
        match &self.resource {
            None => path.to_vec(),
            // A resource's filter figures are under `filter` (the flat
            // `bloom` object is the SKU table's, for seed 000's grep).
            Some(name) => ["resources", name.as_str()]
                .into_iter()
                .chain(path.iter().enumerate().map(|(i, k)| {
                    if i == 0 && *k == "bloom" {
                        "filter"
                    } else {
                        k
                    }
                }))
                .collect(),
        }
    }

    /// What answered the run's requests, by level, as the difference of
    /// two stats snapshots: seed 000's route has its own request counts
    /// by outcome; a resource's are read from its levels' counters (a
    /// request that joined another's SQL load counts once, in the load).
    pub fn outcomes(&self, before: &Value, after: &Value) -> serde_json::Map<String, Value> {
        let delta = |p: &[&str]| {
            let p = self.figure(p);
            super::counters::get(after, &p) - super::counters::get(before, &p)
        };
        let counted: Vec<(String, i64)> = match &self.resource {
            None => after["requests"]
                .as_object()
                .map(|m| {
                    m.keys()
                        .map(|k| (k.clone(), delta(&["requests", k.as_str()])))
                        .collect()
                })
                .unwrap_or_default(),
            Some(_) => {
                let missing = self.sql(after).1 - self.sql(before).1;
                vec![
                    ("filter_rejected".into(), delta(&["bloom", "rejected"])),
                    ("l1_hit".into(), delta(&["l1", "hits"])),
                    ("l1_negative_hit".into(), delta(&["l1", "negative_hits"])),
                    ("redis_hit".into(), delta(&["redis", "hits"])),
                    ("redis_nil_hit".into(), delta(&["redis", "nil_hits"])),
                    ("db_found".into(), delta(&["sql", "found"])),
                    ("db_missing".into(), missing),
                ]
            }
        };
        counted
            .into_iter()
            .filter(|(_, n)| *n != 0)
            .map(|(k, n)| (k, Value::from(n)))
            .collect()
    }

    /// The statements the request path sent to SQL, and the loads that
    /// found nothing, in `stats`.
    pub fn sql(&self, stats: &Value) -> (i64, i64) {
        let get = |p: &[&str]| super::counters::get(stats, &self.figure(p));
        match &self.resource {
            None => (get(&["sql", "queries"]), get(&["sql", "missing"])),
            Some(_) => (
                get(&["sql", "statements"]),
                get(&["sql", "loads"]) - get(&["sql", "found"]),
            ),
        }
    }
}
