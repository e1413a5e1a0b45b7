//! Configuration layering and validation.

use std::io::Write;

use bloomgate_service::config::ConfigError;
use bloomgate_service::Config;

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect()
}

fn toml_file(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

#[test]
fn defaults_match_seed_000() {
    let c = Config::load_from(None, env(&[])).unwrap();
    assert_eq!(c.listen.to_string(), "127.0.0.1:8080");
    assert!(c.cache.bloom_enabled && c.cache.bloom_build_on_start);
    assert_eq!(c.cache.bloom_expected, 500_000);
    assert!((c.cache.bloom_fpp - 0.001).abs() < 1e-12);
    assert!(c.database_url.starts_with("sqlite://"));
    assert_eq!(c.redis_url, None);
}

#[test]
fn file_then_environment_override_defaults() {
    let f = toml_file(
        "listen = \"127.0.0.1:9100\"\n[cache]\nbloom_expected = 1000\nbloom_fpp = 0.01\n",
    );
    let c = Config::load_from(
        Some(f.path()),
        env(&[
            ("BLOOMGATE_CACHE__BLOOM_ENABLED", "false"),
            ("BLOOMGATE_LISTEN", "127.0.0.1:9000"),
            ("BLOOMGATE_CACHE__BLOOM_FPP", "0.05"),
            ("DATABASE_URL", "mysql://root@127.0.0.1/test"),
            ("REDIS_URL", "redis://127.0.0.1:6379/"),
            ("BLOOMGATE_ADMIN_TOKEN", "12345"),
            ("UNRELATED", "x"),
        ]),
    )
    .unwrap();
    assert_eq!(c.listen.to_string(), "127.0.0.1:9000");
    assert!(!c.cache.bloom_enabled);
    assert_eq!(c.cache.bloom_expected, 1000);
    assert!((c.cache.bloom_fpp - 0.05).abs() < 1e-12);
    assert_eq!(c.database_url, "mysql://root@127.0.0.1/test");
    assert_eq!(c.redis_url.as_deref(), Some("redis://127.0.0.1:6379/"));
    assert_eq!(c.admin_token.as_deref(), Some("12345"));
    // The BLOOMGATE_ form wins over the conventional name.
    let c = Config::load_from(
        None,
        env(&[
            ("DATABASE_URL", "mysql://a/b"),
            ("BLOOMGATE_DATABASE_URL", "postgres://c/d"),
        ]),
    )
    .unwrap();
    assert_eq!(c.database_url, "postgres://c/d");
}

fn key_of(e: ConfigError) -> String {
    match e {
        ConfigError::Invalid { key, .. } => key,
        ConfigError::Read { path, .. } => format!("read {path}"),
    }
}

#[test]
fn invalid_values_name_the_key() {
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[("BLOOMGATE_CACHE__BLOOM_FPP", "1.5")], "cache.bloom_fpp"),
        (
            &[("BLOOMGATE_CACHE__BLOOM_FPP", "often")],
            "cache.bloom_fpp",
        ),
        (
            &[("BLOOMGATE_CACHE__BLOOM_EXPECTED", "0")],
            "cache.bloom_expected",
        ),
        (
            &[("BLOOMGATE_CACHE__BLOOM_EXPECTED", "-4")],
            "cache.bloom_expected",
        ),
        (
            &[("BLOOMGATE_CACHE__BLOOM_ENABLED", "maybe")],
            "cache.bloom_enabled",
        ),
        (&[("BLOOMGATE_LISTEN", "not-an-address")], "listen"),
        (&[("BLOOMGATE_DATABASE_URL", "oracle://x")], "database_url"),
        (&[("BLOOMGATE_REDIS_URL", "http://x")], "redis_url"),
        (
            &[("BLOOMGATE_CACHE__L1_TTL_SECS", "0")],
            "cache.l1_ttl_secs",
        ),
        (&[("BLOOMGATE_CACHE__BLOOM_TYPO", "1")], "cache"),
        (
            &[("BLOOMGATE_CACHE__WATCH_COLUMN", "id; DROP TABLE skus")],
            "cache.watch_column",
        ),
        (
            &[("BLOOMGATE_CACHE__WATCH_EVERY_MS", "5")],
            "cache.watch_every_ms",
        ),
        (
            &[("BLOOMGATE_CACHE__BLOOM_SEGMENT_BYTES", "1000")],
            "cache.bloom_segment_bytes",
        ),
        (
            &[("BLOOMGATE_CACHE__BLOOM_SEGMENT_BYTES", "1073741824")],
            "cache.bloom_segment_bytes",
        ),
        (
            &[
                ("BLOOMGATE_REDIS_URL", "redis://127.0.0.1/"),
                ("BLOOMGATE_CACHE__BLOOM_MODE", "strict"),
                ("BLOOMGATE_CACHE__REDIS_PREFIX", "{app}:"),
            ],
            "cache.redis_prefix",
        ),
        (&[("BLOOMGATE_LISTEN", "0.0.0.0:8080")], "admin_token"),
        (
            &[
                ("BLOOMGATE_REDIS_URL", "redis://127.0.0.1/"),
                ("BLOOMGATE_REDIS_CLUSTER", "redis://127.0.0.1:7001"),
            ],
            "redis_cluster",
        ),
        (
            &[(
                "BLOOMGATE_REDIS_CLUSTER",
                "redis://127.0.0.1:7001,127.0.0.1:7002",
            )],
            "redis_cluster",
        ),
    ];
    for (vars, key) in cases {
        let e = Config::load_from(None, env(vars)).unwrap_err();
        let msg = e.to_string();
        assert!(key_of(e).starts_with(key), "{vars:?}: {msg}");
        assert!(
            msg.contains(key),
            "{vars:?}: message {msg:?} does not name {key}"
        );
    }
    // A non-loopback address is fine with a token.
    assert!(Config::load_from(
        None,
        env(&[
            ("BLOOMGATE_LISTEN", "0.0.0.0:8080"),
            ("BLOOMGATE_ADMIN_TOKEN", "t")
        ])
    )
    .is_ok());
    let bad = toml_file("[cache]\nbloom_fpp = \"high\"\n");
    assert!(Config::load_from(Some(bad.path()), env(&[]))
        .unwrap_err()
        .to_string()
        .contains("cache.bloom_fpp"));
    let broken = toml_file("[cache\n");
    assert!(Config::load_from(Some(broken.path()), env(&[])).is_err());
    assert!(matches!(
        Config::load_from(Some(std::path::Path::new("/no/such/file.toml")), env(&[])),
        Err(ConfigError::Read { .. })
    ));
}

#[test]
fn redis_cluster_nodes_come_from_a_list_or_a_comma_separated_variable() {
    use bloomgate_service::redis_link::RedisTarget;
    let nodes: Vec<String> = (7001..=7003)
        .map(|p| format!("redis://127.0.0.1:{p}"))
        .collect();
    let from_env =
        Config::load_from(None, env(&[("BLOOMGATE_REDIS_CLUSTER", &nodes.join(", "))])).unwrap();
    assert_eq!(
        RedisTarget::of(&from_env),
        Some(RedisTarget::cluster(nodes.clone()))
    );
    let file = toml_file(&format!(
        "redis_cluster = [{}]\n[cache]\nbloom_mode = \"strict\"\n",
        nodes
            .iter()
            .map(|n| format!("{n:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let from_file = Config::load_from(Some(file.path()), env(&[])).unwrap();
    assert_eq!(
        RedisTarget::of(&from_file),
        Some(RedisTarget::cluster(nodes))
    );
    // One server as before; nothing without either.
    let single = Config::load_from(None, env(&[("REDIS_URL", "redis://127.0.0.1/")])).unwrap();
    assert_eq!(
        RedisTarget::of(&single),
        Some(RedisTarget::server("redis://127.0.0.1/"))
    );
    assert_eq!(
        RedisTarget::of(&Config::load_from(None, env(&[])).unwrap()),
        None
    );
}

#[test]
fn rates_and_sizes_the_filter_cannot_serve_are_refused_with_the_range() {
    for (pairs, key, needle) in [
        (
            vec![("BLOOMGATE_CACHE__BLOOM_FPP", "1e-12")],
            "cache.bloom_fpp",
            "between 1e-9 and 0.5",
        ),
        (
            vec![("BLOOMGATE_CACHE__BLOOM_FPP", "0.75")],
            "cache.bloom_fpp",
            "between 1e-9 and 0.5",
        ),
        (
            vec![("BLOOMGATE_CACHE__BLOOM_EXPECTED", "100000000000")],
            "cache.bloom_expected",
            "limit is",
        ),
        (
            vec![
                ("BLOOMGATE_CACHE__BLOOM_RETRY_MIN_MS", "500"),
                ("BLOOMGATE_CACHE__BLOOM_RETRY_MAX_MS", "100"),
            ],
            "cache.bloom_retry_max_ms",
            "at least",
        ),
        (
            vec![("BLOOMGATE_CACHE__BLOOM_LAYOUT", "cuckoo")],
            "cache.bloom_layout",
            "unknown variant",
        ),
    ] {
        match Config::load_from(None, env(&pairs)) {
            Err(ConfigError::Invalid { key: k, message }) => {
                assert_eq!(k, key, "{message}");
                assert!(message.contains(needle), "{message}");
            }
            other => panic!("{pairs:?}: {other:?}"),
        }
    }
    // The edges of the range are served, in both layouts.
    for layout in ["blocked", "classic"] {
        for fpp in ["1e-9", "0.5"] {
            let c = Config::load_from(
                None,
                env(&[
                    ("BLOOMGATE_CACHE__BLOOM_FPP", fpp),
                    ("BLOOMGATE_CACHE__BLOOM_LAYOUT", layout),
                ]),
            );
            assert!(c.is_ok(), "{layout} {fpp}: {c:?}");
        }
    }
}

#[test]
fn urls_are_read_from_files_as_mounted_secrets_are() {
    let db = toml_file("postgres://app:pw@db:5432/shop?sslmode=verify-full\n");
    let redis = toml_file("  rediss://app:pw@redis:6380/  ");
    let replica = toml_file("postgres://reader:pw@replica:5432/shop\n");
    let path = |f: &tempfile::NamedTempFile| f.path().display().to_string();
    // From the environment; the file wins over the conventional variable.
    let c = Config::load_from(
        None,
        env(&[
            ("BLOOMGATE_DATABASE_URL_FILE", &path(&db)),
            ("BLOOMGATE_REDIS_URL_FILE", &path(&redis)),
            ("BLOOMGATE_SCAN_DATABASE_URL_FILE", &path(&replica)),
            ("DATABASE_URL", "mysql://other@host/db"),
        ]),
    )
    .unwrap();
    assert_eq!(
        c.scan_database_url.as_deref(),
        Some("postgres://reader:pw@replica:5432/shop")
    );
    assert!(!format!("{c:?}").contains("reader:pw"), "redacted");
    assert_eq!(
        c.database_url,
        "postgres://app:pw@db:5432/shop?sslmode=verify-full"
    );
    assert_eq!(c.redis_url.as_deref(), Some("rediss://app:pw@redis:6380/"));
    // From the file.
    let f = toml_file(&format!("database_url_file = {:?}\n", path(&db)));
    let c = Config::load_from(Some(f.path()), env(&[])).unwrap();
    assert!(c.database_url.starts_with("postgres://app:pw@db"));

    // Both the URL and its file: refused, naming the file key.
    let both = toml_file(&format!(
        "database_url = \"sqlite://x.db\"\ndatabase_url_file = {:?}\n",
        path(&db)
    ));
    let e = Config::load_from(Some(both.path()), env(&[])).unwrap_err();
    assert_eq!(key_of(e), "database_url_file");
    // A file that is missing or empty.
    let e = Config::load_from(
        None,
        env(&[("BLOOMGATE_REDIS_URL_FILE", "/nonexistent/bloomgate-secret")]),
    )
    .unwrap_err();
    assert!(e.to_string().contains("cannot read"), "{e}");
    assert_eq!(key_of(e), "redis_url_file");
    let empty = toml_file("\n");
    let e = Config::load_from(None, env(&[("BLOOMGATE_DATABASE_URL_FILE", &path(&empty))]))
        .unwrap_err();
    assert!(e.to_string().contains("is empty"), "{e}");
}

#[test]
fn redis_tls_files_go_with_rediss_and_a_certificate_with_its_key() {
    let pem = toml_file("not checked here\n");
    let pem_path = pem.path().display().to_string();
    let load = |pairs: &[(&str, &str)]| Config::load_from(None, env(pairs));
    let ok = load(&[
        ("REDIS_URL", "rediss://127.0.0.1:6380/"),
        ("BLOOMGATE_REDIS_TLS_CA", &pem_path),
        ("BLOOMGATE_REDIS_TLS_CERT", &pem_path),
        ("BLOOMGATE_REDIS_TLS_KEY", &pem_path),
    ])
    .unwrap();
    let target = bloomgate_service::redis_link::RedisTarget::of(&ok).unwrap();
    assert_eq!(target.tls.ca.as_deref(), Some(pem.path()));
    assert_eq!(target.tls.key.as_deref(), Some(pem.path()));
    // A cluster of rediss:// nodes takes them too.
    load(&[
        (
            "BLOOMGATE_REDIS_CLUSTER",
            "rediss://10.0.0.1:7001,rediss://10.0.0.2:7001",
        ),
        ("BLOOMGATE_REDIS_TLS_CA", &pem_path),
    ])
    .unwrap();
    for (pairs, key) in [
        // Not a TLS URL: the files would be ignored, so they are refused.
        (
            vec![
                ("REDIS_URL", "redis://127.0.0.1:6379/"),
                ("BLOOMGATE_REDIS_TLS_CA", pem_path.as_str()),
            ],
            "redis_tls_ca",
        ),
        (
            vec![
                ("REDIS_URL", "rediss://127.0.0.1:6380/"),
                ("BLOOMGATE_REDIS_TLS_CERT", pem_path.as_str()),
            ],
            "redis_tls_key",
        ),
        (
            vec![
                ("REDIS_URL", "rediss://127.0.0.1:6380/"),
                ("BLOOMGATE_REDIS_TLS_KEY", pem_path.as_str()),
            ],
            "redis_tls_cert",
        ),
        (
            vec![
                ("REDIS_URL", "rediss://127.0.0.1:6380/"),
                ("BLOOMGATE_REDIS_TLS_CA", "/nonexistent/ca.pem"),
            ],
            "redis_tls_ca",
        ),
    ] {
        let e = load(&pairs).unwrap_err();
        assert_eq!(key_of(e), key, "{pairs:?}");
    }
}

#[test]
fn each_filter_has_a_snapshot_file_of_its_own() {
    let table = |name: &str, extra: &str| {
        format!("[[resources]]\nname = \"{name}\"\ntable = \"{name}\"\nkey = \"id\"\nkey_type = \"text\"\n{extra}")
    };
    let redis = "redis_url = \"redis://127.0.0.1:6379/\"\n";
    // Derived from [cache]: `<path>.<name>`; a resource's own path wins.
    let f = toml_file(&format!(
        "{redis}[cache]\nbloom_snapshot_path = \"data/f.bgf\"\n{}{}",
        table("users", ""),
        table("orders", "bloom_snapshot_path = \"data/orders.bgf\"\n")
    ));
    let c = Config::load_from(Some(f.path()), env(&[])).unwrap();
    assert_eq!(c.resources[0].bloom_snapshot_path, None);
    assert_eq!(
        bloomgate_service::config::resources::derived_snapshot_path(
            c.cache.bloom_snapshot_path.as_deref().unwrap(),
            "users"
        ),
        std::path::Path::new("data/f.bgf.users")
    );
    // A resource's snapshot needs no Redis (the outbox positions it).
    let f = toml_file(&table("users", "bloom_snapshot_path = \"data/u.bgf\"\n"));
    assert!(Config::load_from(Some(f.path()), env(&[])).is_ok());
    // Two filters on one file are refused, naming the later one.
    for (text, key) in [
        (
            format!(
                "{redis}[cache]\nbloom_snapshot_path = \"data/f.bgf\"\n{}",
                table("users", "bloom_snapshot_path = \"data/f.bgf\"\n")
            ),
            "resources[0].bloom_snapshot_path",
        ),
        (
            format!(
                "{redis}[cache]\nbloom_snapshot_path = \"data/f.bgf\"\n{}{}",
                table("orders", "bloom_snapshot_path = \"data/f.bgf.users\"\n"),
                table("users", "")
            ),
            "resources[1].bloom_snapshot_path",
        ),
    ] {
        let f = toml_file(&text);
        let e = Config::load_from(Some(f.path()), env(&[])).unwrap_err();
        assert!(e.to_string().contains("also the snapshot of"), "{e}");
        assert_eq!(key_of(e), key);
    }
}

#[test]
fn a_resource_in_strict_mode_needs_redis() {
    let f = toml_file(
        "[[resources]]\nname = \"users\"\ntable = \"users\"\nkey = \"id\"\nkey_type = \"text\"\nbloom_mode = \"strict\"\n",
    );
    let e = Config::load_from(Some(f.path()), env(&[])).unwrap_err();
    assert!(e.to_string().contains("redis_url"), "{e}");
    assert_eq!(key_of(e), "resources[0].bloom_mode");
    let f = toml_file(
        "redis_url = \"redis://127.0.0.1:6379/\"\n[cache]\nbloom_mode = \"strict\"\n[[resources]]\nname = \"users\"\ntable = \"users\"\nkey = \"id\"\nkey_type = \"text\"\nbloom_mode = \"local\"\n",
    );
    let c = Config::load_from(Some(f.path()), env(&[])).unwrap();
    assert_eq!(
        c.resources[0].bloom_mode,
        Some(bloomgate_service::config::BloomMode::Local),
        "a resource may differ from [cache]"
    );
    let f = toml_file(
        "[[resources]]\nname = \"users\"\ntable = \"users\"\nkey = \"id\"\nkey_type = \"text\"\nbloom_segment_bytes = 100\n",
    );
    let e = Config::load_from(Some(f.path()), env(&[])).unwrap_err();
    assert_eq!(key_of(e), "resources[0].bloom_segment_bytes");
}

/// `[cache]` (the default resource) and each `[[resources]]` entry share
/// one filter check: the same refusals, the same words, each naming its
/// own key.
#[test]
fn a_resources_filter_is_checked_as_the_default_resources_is() {
    let resource = |line: &str| {
        toml_file(&format!(
            "[[resources]]\nname = \"users\"\ntable = \"users\"\nkey = \"id\"\nkey_type = \"text\"\n{line}\n"
        ))
    };
    let cache = |line: &str| toml_file(&format!("[cache]\n{line}\n"));
    for (line, field) in [
        ("bloom_fpp = 0.9", "bloom_fpp"),
        ("bloom_fpp = 1e-12", "bloom_fpp"),
        ("bloom_expected = 0", "bloom_expected"),
        ("bloom_expected = 4000000000000", "bloom_expected"),
        ("bloom_segment_bytes = 100", "bloom_segment_bytes"),
    ] {
        let of_resource = Config::load_from(Some(resource(line).path()), env(&[])).unwrap_err();
        let of_cache = Config::load_from(Some(cache(line).path()), env(&[])).unwrap_err();
        let (text_r, text_c) = (of_resource.to_string(), of_cache.to_string());
        assert_eq!(
            key_of(of_resource),
            format!("resources[0].{field}"),
            "{line}"
        );
        assert_eq!(key_of(of_cache), format!("cache.{field}"), "{line}");
        let words = |t: &str| t.split_once(": ").map(|(_, w)| w.to_owned());
        assert!(words(&text_r).is_some(), "{text_r}");
        assert_eq!(
            words(&text_r),
            words(&text_c),
            "{line}: {text_r} / {text_c}"
        );
    }
}

/// A database URL naming a CA but no TLS mode verifies the server against
/// it (the drivers' default would read the CA and check nothing).
#[test]
fn a_database_url_with_a_ca_and_no_mode_is_verified() {
    let c = Config::load_from(
        None,
        env(&[(
            "DATABASE_URL",
            "postgres://app@db.internal/app?sslrootcert=/etc/ca.pem",
        )]),
    )
    .unwrap();
    assert_eq!(
        c.database_url,
        "postgres://app@db.internal/app?sslrootcert=/etc/ca.pem&sslmode=verify-full"
    );
    let c = Config::load_from(
        None,
        env(&[(
            "DATABASE_URL",
            "mysql://app@db/app?ssl-ca=/etc/ca.pem&ssl-mode=REQUIRED",
        )]),
    )
    .unwrap();
    assert!(
        c.database_url.ends_with("ssl-mode=REQUIRED"),
        "an explicit mode stays"
    );
}

/// The keys `section` accepts, as the configuration types list them (every
/// table denies unknown fields; serde's error names the ones it expects).
fn accepted_keys(section: &str) -> Vec<String> {
    let f = toml_file(&format!("{section}\nzz_not_a_key = 1\n"));
    let err = Config::load_from(Some(f.path()), env(&[]))
        .expect_err("an unknown key is refused")
        .to_string();
    let list = err
        .split("expected one of ")
        .nth(1)
        .and_then(|rest| rest.lines().next())
        .unwrap_or_else(|| panic!("the error lists the keys: {err}"));
    list.split(", ")
        .map(|k| k.trim().trim_matches(|c| c == '`' || c == '.').to_string())
        .take_while(|k| {
            !k.is_empty()
                && k.chars()
                    .all(|c| c.is_ascii_lowercase() || c == '_' || c.is_ascii_digit())
        })
        .collect()
}

/// The keys docs/configuration.md shows, by section (`""` for the top
/// level): `key = …` lines, commented or not, in its TOML blocks; a
/// table's header names its key in the section above.
fn documented_keys() -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/configuration.md"
    ))
    .unwrap();
    let mut out: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        Default::default();
    let mut section = String::new();
    let mut in_toml = false;
    for line in text.lines() {
        if line.starts_with("```") {
            in_toml = line == "```toml";
            section.clear();
            continue;
        }
        if !in_toml {
            continue;
        }
        let bare = line.trim_start_matches('#').trim();
        if let Some(header) = bare.strip_prefix('[') {
            let name = header.trim_matches(|c| c == '[' || c == ']');
            let (parent, key) = name.rsplit_once('.').unwrap_or(("", name));
            out.entry(parent.to_string())
                .or_default()
                .insert(key.to_string());
            section = name.to_string();
            continue;
        }
        if let Some((key, _)) = bare.split_once('=') {
            let key = key.trim();
            if !key.is_empty()
                && key
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c == '_' || c.is_ascii_digit())
            {
                out.entry(section.clone())
                    .or_default()
                    .insert(key.to_string());
            }
        }
    }
    out
}

/// Every key the configuration types accept is in the reference: a key
/// added in code and not documented fails here.
#[test]
fn the_configuration_reference_names_every_key() {
    let documented = documented_keys();
    let mut missing = Vec::new();
    for (section, header) in [
        ("", ""),
        ("cache", "[cache]"),
        ("sql", "[sql]"),
        ("http", "[http]"),
        ("resp", "[resp]"),
        ("gate", "[gate]"),
        ("gate.routes", "[[gate.routes]]"),
        ("resources", "[[resources]]"),
    ] {
        let keys = accepted_keys(header);
        assert!(keys.len() >= 5, "{header}: {keys:?}");
        for key in keys {
            if !documented.get(section).is_some_and(|d| d.contains(&key)) {
                missing.push(format!("{header} {key}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/configuration.md lacks: {missing:?}"
    );
}

/// The project's own variables are no configuration keys: a shell that
/// exports the tests' servers, the golden files' switch, the benchmarks'
/// sizes or the filter crate's L2 size still loads, to exactly the
/// defaults; a mistyped key beside them still fails, naming it.
#[test]
fn the_projects_own_variables_are_skipped_and_a_typo_still_fails() {
    let own = [
        ("BLOOMGATE_TEST_REDIS_URL", "redis://x"),
        (
            "BLOOMGATE_TEST_MYSQL_URL",
            "mysql://root@127.0.0.1:3306/test",
        ),
        (
            "BLOOMGATE_TEST_POSTGRES_URL",
            "postgres://postgres@127.0.0.1/test",
        ),
        ("BLOOMGATE_BLESS", "1"),
        ("BLOOMGATE_BENCH_SIZES", "1000,10000"),
        ("BLOOMGATE_L2_CACHE_BYTES", "1048576"),
    ];
    let loaded = Config::load_from(None, env(&own)).expect("the project's own variables load");
    let defaults = Config::load_from(None, env(&[])).unwrap();
    assert_eq!(format!("{loaded:?}"), format!("{defaults:?}"));
    for name in own.map(|(n, _)| n) {
        assert!(bloomgate_service::config::is_reserved_env(name), "{name}");
    }
    // Only the names the project uses: a key that merely starts alike is
    // still read (and refused when it is no key).
    for name in ["BLOOMGATE_TESTS", "BLOOMGATE_BLESSED", "BLOOMGATE_L2_CACHE"] {
        assert!(!bloomgate_service::config::is_reserved_env(name), "{name}");
        let e = Config::load_from(None, env(&[(name, "1")])).unwrap_err();
        assert!(matches!(e, ConfigError::Invalid { .. }), "{name}: {e}");
    }
    let mut typo = own.to_vec();
    typo.push(("BLOOMGATE_CACHE__BLOOM_MOD", "strict"));
    let e = Config::load_from(None, env(&typo)).unwrap_err().to_string();
    assert!(e.contains("bloom_mod"), "{e}");
}
