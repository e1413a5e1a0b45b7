//! Docs that stay true (rust-analyzer's `tidy` idea): ARCHITECTURE.md's
//! code map names every module, every module opens with a `//!` line, the
//! places that hold `unsafe` are the ones the docs name, each `unsafe`
//! block has a `SAFETY` comment, and `rust-version` is the oldest Rust the
//! locked dependencies allow.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out.sort();
    out
}

fn crates() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root().join("crates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("Cargo.toml").exists())
        .collect();
    dirs.sort();
    dirs
}

fn stem(path: &Path) -> String {
    path.file_stem().unwrap().to_string_lossy().into_owned()
}

/// The text of ARCHITECTURE.md's section for `crates/<name>`.
fn map_section<'a>(architecture: &'a str, name: &str) -> &'a str {
    let heading = format!("### `crates/{name}`");
    let start = architecture
        .find(&heading)
        .unwrap_or_else(|| panic!("ARCHITECTURE.md has no code map heading {heading}"));
    let rest = &architecture[start + heading.len()..];
    let end = rest
        .find("\n## ")
        .or_else(|| rest.find("\n### "))
        .unwrap_or(rest.len());
    &rest[..end]
}

/// Whether a code map section names `module`: a top-level module as
/// `` `name` ``; a child `parent::child` as `` `parent::child` ``, in
/// the parent's list in the layer diagram (`parent (…, child, …)`), or as
/// `` `child` (a child of `parent` ``. A child named only by a top-level
/// module of the same name (`sql::limits` and `limits`) is not named.
fn map_names(section: &str, module: &str) -> bool {
    let Some((parent, child)) = module.rsplit_once("::") else {
        return section.contains(&format!("`{module}`"));
    };
    let parent_name = parent.rsplit("::").next().unwrap_or(parent);
    if section.contains(&format!("`{module}`"))
        || section.contains(&format!("`{child}` (a child of `{parent_name}`"))
    {
        return true;
    }
    let opening = format!("{parent_name} (");
    section.match_indices(&opening).any(|(at, _)| {
        let before = section[..at].chars().next_back();
        let list = &section[at + opening.len()..];
        let list = &list[..list.find(')').unwrap_or(list.len())];
        before.is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
            && list.split(',').any(|m| m.trim() == child)
    })
}

#[test]
fn the_code_map_names_every_module_and_every_module_says_what_it_is_for() {
    let architecture = read(&root().join("ARCHITECTURE.md"));
    for dir in crates() {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let section = map_section(&architecture, &name);
        for file in rust_files(&dir.join("src")) {
            let text = read(&file);
            assert!(
                text.trim_start().starts_with("//!"),
                "{} does not open with a `//!` line saying what it is for",
                file.display()
            );
            let module = module_of(&dir.join("src"), &file);
            if module == "lib" || module == "main" {
                continue;
            }
            assert!(
                map_names(section, &module),
                "ARCHITECTURE.md's section for {name} does not name module `{module}`"
            );
        }
    }
}

/// Modules with `unsafe` blocks, functions or impls, as `crate::module`.
fn modules_with_unsafe() -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for dir in crates() {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        for file in rust_files(&dir.join("src")) {
            let text = read(&file);
            let lines: Vec<&str> = text.lines().collect();
            let mut any = false;
            for (i, line) in lines.iter().enumerate() {
                let code = line.split("//").next().unwrap_or_default();
                let block = code.contains("unsafe {");
                if block || code.contains("unsafe fn") || code.contains("unsafe impl") {
                    any = true;
                }
                if block || code.contains("unsafe impl") {
                    // The comment lines directly above (or the line itself).
                    let above = lines[..i]
                        .iter()
                        .rev()
                        .take_while(|l| l.trim_start().starts_with("//"));
                    let mut said = above.chain([line]);
                    assert!(
                        said.any(|l| l.contains("SAFETY")),
                        "{}:{}: `unsafe` without a SAFETY comment just above",
                        file.display(),
                        i + 1
                    );
                }
            }
            if any {
                found.insert(format!("{name}::{}", stem(&file)));
            }
        }
    }
    found
}

/// The backticked names in the first line of `text` containing `marker`,
/// and the lines after it up to a blank line.
fn named_after(text: &str, marker: &str) -> BTreeSet<String> {
    let start = text
        .find(marker)
        .unwrap_or_else(|| panic!("no line with {marker:?}"));
    let rest = &text[start..];
    // The paragraph ends at a blank line (in Markdown or in `//!` docs).
    let end = ["\n\n", "\n//!\n"]
        .iter()
        .filter_map(|p| rest.find(p))
        .min()
        .unwrap_or(rest.len());
    rest[..end]
        .split('`')
        .skip(1)
        .step_by(2)
        .map(String::from)
        .collect()
}

#[test]
fn unsafe_lives_where_the_docs_say() {
    let found = modules_with_unsafe();
    assert!(
        found.iter().all(|m| m.starts_with("bloomgate-filter::")),
        "unsafe outside the filter crate: {found:?}"
    );
    let modules: BTreeSet<String> = found
        .iter()
        .map(|m| m.trim_start_matches("bloomgate-filter::").to_string())
        .collect();
    let architecture = read(&root().join("ARCHITECTURE.md"));
    let mut documented = named_after(&architecture, "`unsafe` is confined to");
    documented.retain(|n| n != "unsafe" && n != "bloomgate-filter");
    assert_eq!(documented, modules, "ARCHITECTURE.md's unsafe invariant");
    let lib = read(&root().join("crates/bloomgate-filter/src/lib.rs"));
    let mut in_lib = named_after(&lib, "`unsafe` code lives in");
    in_lib.retain(|n| n != "unsafe");
    assert_eq!(in_lib, modules, "bloomgate-filter's crate docs");
}

fn version(v: &str) -> Vec<u64> {
    let mut parts: Vec<u64> = v.split('.').map(|p| p.parse().unwrap_or(0)).collect();
    parts.resize(3, 0);
    parts
}

#[test]
fn rust_version_is_the_oldest_that_the_locked_dependencies_allow() {
    let manifest = read(&root().join("Cargo.toml"));
    let declared = manifest
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = "))
        .expect("workspace rust-version")
        .trim_matches('"')
        .to_string();
    let out = std::process::Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--locked"])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let needed = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| Some((p["rust_version"].as_str()?, p["name"].as_str()?)))
        .max_by_key(|(v, _)| version(v))
        .unwrap();
    // Our own code is held to the declared version by clippy's
    // `incompatible_msrv` lint (CI runs clippy); the dependencies by this.
    assert_eq!(
        version(&declared),
        version(needed.0),
        "rust-version {declared}: the newest requirement among locked dependencies is {} ({})",
        needed.0,
        needed.1
    );
}

/// The published crates (bloomgate-filter, bloomgate-redis) show an
/// example on every public type: each `pub struct`, `pub enum`, `pub trait`
/// and `pub type` has a code block in its doc comment, which `cargo test`
/// runs as a doctest.
#[test]
fn every_public_type_of_the_published_crates_has_an_example() {
    let mut missing = Vec::new();
    for name in ["bloomgate-filter", "bloomgate-redis"] {
        for path in rust_files(&root().join("crates").join(name).join("src")) {
            let text = read(&path);
            let lines: Vec<&str> = text.lines().collect();
            for (i, line) in lines.iter().enumerate() {
                let t = line.trim_start();
                let Some(rest) = ["pub struct ", "pub enum ", "pub trait ", "pub type "]
                    .iter()
                    .find_map(|p| t.strip_prefix(p))
                else {
                    continue;
                };
                let ident: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if ident == "ReadmeDoctests" {
                    continue;
                }
                let doc = lines[..i]
                    .iter()
                    .rev()
                    .take_while(|l| {
                        let l = l.trim_start();
                        l.starts_with("///") || l.starts_with("#[")
                    })
                    .any(|l| l.contains("```"));
                if !doc {
                    missing.push(format!("{}:{}: {ident}", path.display(), i + 1));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "public types without an example:\n{}",
        missing.join("\n")
    );
}

/// The module of `file` under `src`: its path without `.rs`, `::`-joined
/// (`mod.rs` names its folder).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts.join("::")
}

/// The paths under `{`…`}` of a `use` tree: `a::b`, `a::{b, c::{d, e}}`,
/// each member in full; stops at the first character no path has.
fn use_tree(s: &str) -> (Vec<String>, &str) {
    let mut prefix = String::new();
    let mut rest = s;
    loop {
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        prefix.push_str(&rest[..end]);
        rest = &rest[end..];
        if let Some(after) = rest.strip_prefix("::") {
            prefix.push_str("::");
            rest = after;
            if let Some(group) = rest.strip_prefix('{') {
                let mut out = Vec::new();
                rest = group;
                loop {
                    rest = rest.trim_start();
                    if let Some(after) = rest.strip_prefix('}') {
                        return (out, after);
                    }
                    if rest.is_empty() {
                        return (out, rest);
                    }
                    let (members, after) = use_tree(rest);
                    out.extend(members.into_iter().map(|m| format!("{prefix}{m}")));
                    // A member that is no path (`*`, `self`): step over it.
                    let after = if after.len() == rest.len() {
                        after.char_indices().nth(1).map_or("", |(i, _)| &after[i..])
                    } else {
                        after
                    };
                    rest = after.trim_start();
                    // `as name` and the separator.
                    if let Some(after) = rest.strip_prefix("as ") {
                        rest = after.trim_start_matches(|c: char| c.is_alphanumeric() || c == '_');
                    }
                    rest = rest.trim_start().strip_prefix(',').unwrap_or(rest);
                }
            }
            continue;
        }
        let path = prefix.trim_end_matches("::").to_string();
        return (
            if path.is_empty() {
                Vec::new()
            } else {
                vec![path]
            },
            rest,
        );
    }
}

/// The crate paths `module`'s `text` names, line comments removed:
/// `crate::…`, and (outside its `#[cfg(test)]` part, whose `super` is the
/// module itself) `super::…` and `self::…` resolved against `module`; a
/// group `crate::{a, b::{c, d}}` names each member in full.
fn crate_paths(text: &str, module: &str) -> Vec<String> {
    let code: String = text
        .lines()
        .map(|l| l.find("//").map_or(l, |i| &l[..i]))
        .collect::<Vec<_>>()
        .join("\n");
    let main = code.split("#[cfg(test)]").next().unwrap_or_default();
    let parts: Vec<&str> = if module.is_empty() {
        Vec::new()
    } else {
        module.split("::").collect()
    };
    let mut out = Vec::new();
    for (text, roots) in [
        (code.as_str(), &["crate::"][..]),
        (main, &["super::", "self::"][..]),
    ] {
        for root in roots {
            for (at, _) in text.match_indices(root) {
                let boundary = text[..at]
                    .chars()
                    .next_back()
                    .is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == ':'));
                if !boundary {
                    continue;
                }
                let mut after = &text[at + root.len()..];
                let mut base: Vec<&str> = match *root {
                    "crate::" => Vec::new(),
                    "self::" => parts.clone(),
                    _ => parts[..parts.len().saturating_sub(1)].to_vec(),
                };
                while let Some(more) = after.strip_prefix("super::") {
                    base.pop();
                    after = more;
                }
                let prefix = base.join("::");
                let grouped = after.strip_prefix('{').map(|g| format!("x::{{{g}"));
                let (paths, _) = use_tree(grouped.as_deref().unwrap_or(after));
                for p in paths {
                    // Only the group's stand-in root is dropped.
                    let p = match &grouped {
                        Some(_) => p.strip_prefix("x::").unwrap_or(&p).to_string(),
                        None => p,
                    };
                    out.push(if prefix.is_empty() {
                        p
                    } else {
                        format!("{prefix}::{p}")
                    });
                }
            }
        }
    }
    out
}

/// `module → the modules it names`, by the rule of
/// `shared/tools/module_cycles.py`: the longest module path named, and
/// no edge between a module and its own parent or child.
fn module_graph(src: &Path) -> std::collections::BTreeMap<String, BTreeSet<String>> {
    let files: Vec<(String, String)> = rust_files(src)
        .into_iter()
        .map(|f| (module_of(src, &f), read(&f)))
        .filter(|(m, _)| m != "lib" && m != "main")
        .collect();
    let names: BTreeSet<String> = files.iter().map(|(m, _)| m.clone()).collect();
    let mut graph = std::collections::BTreeMap::new();
    for (m, text) in &files {
        let mut to = BTreeSet::new();
        for path in crate_paths(text, m) {
            let parts: Vec<&str> = path.split("::").collect();
            for i in (1..=parts.len()).rev() {
                let cand = parts[..i].join("::");
                if names.contains(&cand) {
                    let related = &cand == m
                        || m.starts_with(&format!("{cand}::"))
                        || cand.starts_with(&format!("{m}::"));
                    if !related {
                        to.insert(cand);
                    }
                    break;
                }
            }
        }
        graph.insert(m.clone(), to);
    }
    graph
}

/// A circle in `graph`, if there is one, as the modules along it.
fn find_cycle(graph: &std::collections::BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        m: &str,
        graph: &std::collections::BTreeMap<String, BTreeSet<String>>,
        state: &mut std::collections::BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(m.to_string(), 1);
        stack.push(m.to_string());
        for next in graph.get(m).into_iter().flatten() {
            match state.get(next.as_str()).copied().unwrap_or(0) {
                1 => {
                    let from = stack.iter().position(|s| s == next).unwrap();
                    let mut circle = stack[from..].to_vec();
                    circle.push(next.clone());
                    return Some(circle);
                }
                0 => {
                    if let Some(c) = visit(next, graph, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(m.to_string(), 2);
        None
    }
    let mut state = std::collections::BTreeMap::new();
    for m in graph.keys() {
        if state.get(m.as_str()).copied().unwrap_or(0) == 0 {
            if let Some(c) = visit(m, graph, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

/// The service crate in layers (issue 19): every `use crate::…` points
/// down, so no modules import each other in a circle.
#[test]
fn the_service_crate_has_no_import_circle() {
    let src = root().join("crates/bloomgate-service/src");
    let graph = module_graph(&src);
    assert!(graph.len() > 20, "the graph was read: {graph:?}");
    assert!(
        graph["http::router"].contains("http::routes")
            && graph["resource::reader"].contains("shield"),
        "edges are found: {graph:?}"
    );
    if let Some(circle) = find_cycle(&graph) {
        panic!(
            "modules import each other in a circle: {}",
            circle.join(" → ")
        );
    }
}

/// A child module is named as a child, not by a top-level namesake.
#[test]
fn a_child_module_is_named_as_a_child() {
    let map =
        "store (limits, migrations) · `limits` · outbox (follow)\n* `simd` (a child of `block`) …";
    assert!(map_names(map, "store::limits"));
    assert!(map_names(map, "limits"));
    assert!(map_names(map, "outbox::follow"));
    assert!(map_names(map, "block::simd"));
    assert!(!map_names(map, "changes::follow"), "named for outbox only");
    assert!(!map_names(map, "gate::limits"), "a namesake is not a child");
    assert!(!map_names(map, "store::recorded"));
    assert!(
        !map_names("restore (limits)", "store::limits"),
        "whole words"
    );
}

/// The finder finds a circle where there is one.
#[test]
fn a_circle_is_found() {
    let mut g = std::collections::BTreeMap::new();
    g.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    g.insert("b".to_string(), BTreeSet::from(["c".to_string()]));
    g.insert("c".to_string(), BTreeSet::from(["a".to_string()]));
    g.insert("d".to_string(), BTreeSet::from(["a".to_string()]));
    assert_eq!(find_cycle(&g).unwrap(), ["a", "b", "c", "a"]);
    g.get_mut("c").unwrap().clear();
    assert_eq!(find_cycle(&g), None);
    assert_eq!(
        crate_paths(
            "use crate::{a::B, c};\n// crate::zz\nlet x = crate::d::e(1);",
            "m"
        ),
        ["a::B", "c", "d::e"]
    );
    // A nested group names every member (it ended at the first `}`).
    assert_eq!(
        crate_paths("use crate::{a::{b, c::D}, e as f, g};", "m"),
        ["a::b", "a::c::D", "e", "g"]
    );
    // A glob in a group is stepped over, not read forever.
    assert_eq!(crate_paths("use crate::x::{a, *};", "m"), ["x::a"]);
    // `super::` and `self::` name modules relative to the file's own;
    // inside its `#[cfg(test)]` part `super` is the module itself.
    assert_eq!(
        crate_paths(
            "use super::{limits::X, sibling};\nuse super::super::top;\nuse self::child::Y;\n#[cfg(test)]\nmod tests { use super::Z; }",
            "store::recorded"
        ),
        ["store::limits::X", "store::sibling", "top", "store::recorded::child::Y"]
    );
    // A sibling reached by `super::` closes a circle the finder sees.
    let files = [
        ("a::x", "use super::y::F;"),
        ("a::y", "use crate::a::x::G;"),
    ];
    let mut g = std::collections::BTreeMap::new();
    for (m, text) in files {
        let to: BTreeSet<String> = crate_paths(text, m)
            .into_iter()
            .map(|p| {
                p.rsplit_once("::")
                    .map_or(p.clone(), |(m, _)| m.to_string())
            })
            .collect();
        g.insert(m.to_string(), to);
    }
    assert!(find_cycle(&g).is_some(), "{g:?}");
}

/// Config is a leaf: no module of `config` imports a module of the crate
/// outside `config`, but `text` (which quotes input in its refusals).
#[test]
fn config_is_a_leaf() {
    let src = root().join("crates/bloomgate-service/src");
    let graph = module_graph(&src);
    let outside: Vec<(String, String)> = graph
        .iter()
        .filter(|(m, _)| *m == "config" || m.starts_with("config::"))
        .flat_map(|(m, to)| {
            to.iter()
                .filter(|t| !(*t == "config" || t.starts_with("config::") || *t == "text"))
                .map(move |t| (m.clone(), t.clone()))
        })
        .collect();
    assert!(graph.contains_key("config::validate"), "the graph was read");
    assert!(outside.is_empty(), "config imports: {outside:?}");
}

/// The service crate's leaves (ARCHITECTURE.md): the vocabulary every
/// layer may use. A leaf names only leaves.
const LEAVES: &[&str] = &[
    "config",
    "filter",
    "key",
    "listen",
    "metrics",
    "model",
    "paths",
    "pause",
    "redis_link",
    "sync",
    "tasks",
    "text",
    "wire",
];

/// Fewer than this many non-leaf top-level modules named by one
/// top-level module (with its children).
const MAX_FAN_OUT: usize = 10;

/// `top-level module → the other top-level modules it (or a child) names`.
fn top_level_graph(
    graph: &std::collections::BTreeMap<String, BTreeSet<String>>,
) -> std::collections::BTreeMap<String, BTreeSet<String>> {
    let top = |m: &str| m.split("::").next().unwrap_or(m).to_string();
    let mut out: std::collections::BTreeMap<String, BTreeSet<String>> = Default::default();
    for (m, to) in graph {
        let from = top(m);
        let names = out.entry(from.clone()).or_default();
        names.extend(to.iter().map(|t| top(t)).filter(|t| *t != from));
    }
    out
}

/// No import runs from a lower module back up to a higher one: the
/// top-level modules, each with its children, import each other in no
/// circle, so they stand in layers (ARCHITECTURE.md's diagram). The file
/// graph can be free of circles while its folders are not (`proxy::serve`
/// borrowing `http::serve`'s accept loop while `http::check` used
/// `proxy::check`).
#[test]
fn no_import_runs_back_up() {
    let src = root().join("crates/bloomgate-service/src");
    let top = top_level_graph(&module_graph(&src));
    assert!(
        top["http"].contains("listen") && top["proxy"].contains("listen"),
        "edges are found: {top:?}"
    );
    if let Some(circle) = find_cycle(&top) {
        panic!(
            "top-level modules import each other in a circle: {}",
            circle.join(" → ")
        );
    }
}

#[test]
fn a_circle_between_folders_is_found() {
    let mut g = std::collections::BTreeMap::new();
    g.insert(
        "proxy::serve".to_string(),
        BTreeSet::from(["http::serve".to_string()]),
    );
    g.insert(
        "http::check".to_string(),
        BTreeSet::from(["proxy::check".to_string()]),
    );
    assert!(find_cycle(&g).is_none(), "no circle between files");
    let circle = find_cycle(&top_level_graph(&g)).expect("a circle between folders");
    assert_eq!(circle.first(), circle.last(), "{circle:?}");
    assert!(circle.contains(&"http".to_string()) && circle.contains(&"proxy".to_string()));
}

/// The top-level modules that name `MAX_FAN_OUT` or more non-leaf
/// siblings, and the leaves that name a non-leaf, as sentences.
fn fan_out_faults(top: &std::collections::BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut faults = Vec::new();
    for (m, to) in top {
        let heavy: Vec<&String> = to
            .iter()
            .filter(|t| !LEAVES.contains(&t.as_str()))
            .collect();
        if LEAVES.contains(&m.as_str()) && !heavy.is_empty() {
            faults.push(format!("the leaf `{m}` names {heavy:?}"));
        } else if heavy.len() >= MAX_FAN_OUT {
            faults.push(format!("`{m}` names {} siblings: {heavy:?}", heavy.len()));
        }
    }
    faults
}

/// No module imports ten siblings (issue 30): each top-level module of the
/// service names fewer than ten that are not leaves, and the leaves name
/// only leaves.
#[test]
fn no_module_names_ten_siblings() {
    let src = root().join("crates/bloomgate-service/src");
    let top = top_level_graph(&module_graph(&src));
    assert!(top.len() > 15, "the graph was read: {top:?}");
    for leaf in LEAVES {
        assert!(top.contains_key(*leaf), "`{leaf}` is a module");
    }
    let faults = fan_out_faults(&top);
    assert!(faults.is_empty(), "{faults:?}");
}

#[test]
fn a_wide_module_and_a_leaf_that_is_not_are_found() {
    let mut g = std::collections::BTreeMap::new();
    let wide: BTreeSet<String> = (0..MAX_FAN_OUT).map(|i| format!("m{i}::x")).collect();
    g.insert("hub::child".to_string(), wide);
    g.insert("key".to_string(), BTreeSet::from(["shield".to_string()]));
    g.insert(
        "narrow".to_string(),
        LEAVES.iter().map(|l| (*l).to_string()).collect(),
    );
    let faults = fan_out_faults(&top_level_graph(&g));
    assert_eq!(faults.len(), 2, "{faults:?}");
    assert!(faults[0].starts_with("`hub` names 10"), "{faults:?}");
    assert!(faults[1].starts_with("the leaf `key`"), "{faults:?}");
}

/// The files (of every crate) that import all of their parent with a
/// top-level `use super::*;`: a type's methods spread over files that
/// share one header of imports. Test files (`tests.rs`) and the indented
/// glob of a `mod tests` are fine.
fn parent_globs(files: &[PathBuf]) -> Vec<String> {
    files
        .iter()
        .filter(|f| f.file_name().is_some_and(|n| n != "tests.rs"))
        .filter(|f| read(f).lines().any(|l| l.trim_end() == "use super::*;"))
        .map(|f| f.display().to_string())
        .collect()
}

#[test]
fn no_file_imports_all_of_its_parent() {
    let files: Vec<PathBuf> = crates()
        .iter()
        .flat_map(|dir| rust_files(&dir.join("src")))
        .collect();
    assert!(files.len() > 100, "the files were read");
    let globs = parent_globs(&files);
    assert!(
        globs.is_empty(),
        "name what you use from the parent instead of `use super::*;`: {globs:?}"
    );
}

#[test]
fn a_parent_glob_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let files = [
        write("a.rs", "//! x\nuse super::*;\n"),
        write(
            "b.rs",
            "//! x\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n",
        ),
        write("tests.rs", "//! x\nuse super::*;\n"),
    ];
    let found = parent_globs(&files);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].ends_with("a.rs"), "{found:?}");
}

/// Past this many lines a file says, in its opening `//!` doc, why it is
/// one concept (`One concept: …`). Files are split by concept, not by a
/// line cap: a type's methods are not spread over files to stay under one
/// (`no_file_imports_all_of_its_parent`).
const LONG_FILE: usize = 800;

/// The files over [`LONG_FILE`] lines whose opening doc does not say why
/// they are one concept.
fn long_without_a_reason(files: &[PathBuf]) -> Vec<String> {
    files
        .iter()
        .map(|f| (read(f), f))
        .filter(|(text, _)| text.lines().count() > LONG_FILE)
        .filter(|(text, _)| {
            !text
                .lines()
                .take_while(|l| l.starts_with("//!"))
                .any(|l| l.to_ascii_lowercase().contains("one concept:"))
        })
        .map(|(text, f)| format!("{} ({} lines)", f.display(), text.lines().count()))
        .collect()
}

#[test]
fn a_long_file_says_why_it_is_one_concept() {
    let files: Vec<PathBuf> = crates()
        .iter()
        .flat_map(|dir| rust_files(&dir.join("src")))
        .collect();
    let long = long_without_a_reason(&files);
    assert!(
        long.is_empty(),
        "over {LONG_FILE} lines without `//! One concept: …` in the opening doc: {long:?}"
    );
}

#[test]
fn a_long_file_without_a_reason_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let body = "fn f() {}\n".repeat(LONG_FILE);
    let write = |name: &str, head: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, format!("{head}{body}")).unwrap();
        p
    };
    let files = [
        write("bare.rs", "//! A file.\n"),
        write(
            "said.rs",
            "//! A file.\n//! One concept: the parser's states.\n",
        ),
        write("short.rs", ""),
    ];
    std::fs::write(&files[2], "//! x\n").unwrap();
    let found = long_without_a_reason(&files);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("bare.rs"), "{found:?}");
}

/// The comment lines in `text` that name an issue by number (`issue 43`,
/// `(issue 20)`, `issues 33 and 34`): history, which goes stale; what a
/// comment says is what the code does and why.
fn issue_numbers(text: &str) -> Vec<String> {
    text.lines()
        // A comment's `//`, not a URL's `://`.
        .filter_map(|line| {
            let at = line
                .match_indices("//")
                .find(|(i, _)| !line[..*i].ends_with(':'))?
                .0;
            Some(&line[at..])
        })
        .filter(|comment| {
            let lower = comment.to_lowercase();
            let words: Vec<&str> = lower
                .split(|c: char| !c.is_alphanumeric())
                .filter(|w| !w.is_empty())
                .collect();
            words.windows(2).any(|w| {
                (w[0] == "issue" || w[0] == "issues") && w[1].bytes().all(|b| b.is_ascii_digit())
            })
        })
        .map(str::to_owned)
        .collect()
}

/// Source comments carry no issue numbers (the git log does).
#[test]
fn no_source_comment_names_an_issue() {
    let found: Vec<String> = crates()
        .iter()
        .flat_map(|dir| rust_files(&dir.join("src")))
        .flat_map(|f| {
            issue_numbers(&read(&f))
                .into_iter()
                .map(move |c| format!("{}: {c}", f.display()))
        })
        .collect();
    assert!(found.is_empty(), "comments naming issues: {found:#?}");
}

/// The check finds what it looks for, and not an ordinary sentence.
#[test]
fn an_issue_number_in_a_comment_is_found() {
    assert_eq!(issue_numbers("let x = 1; // see issue 43").len(), 1);
    assert_eq!(issue_numbers("//! (issues 33 and 34)").len(), 1);
    assert!(issue_numbers("// an issue with the lock").is_empty());
    assert!(issue_numbers("let issue = 43; // none").is_empty());
    assert_eq!(issue_numbers("// Issue 18's fix").len(), 1);
    assert!(issue_numbers(r#"let u = "https://x/issues/43";"#).is_empty());
}

/// The files under `src` that `within` picks (by their path relative to
/// `src`) whose code (not comments) has one of `words` as a whole word.
fn naming(src: &Path, within: impl Fn(&Path) -> bool, words: &[&str]) -> Vec<String> {
    rust_files(src)
        .into_iter()
        .filter(|f| within(f.strip_prefix(src).unwrap()))
        .filter(|f| {
            read(f).lines().any(|line| {
                let code = line.split("//").next().unwrap_or_default();
                code.split(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .any(|word| words.contains(&word))
            })
        })
        .map(|f| f.strip_prefix(src).unwrap().display().to_string())
        .collect()
}

/// The files under `src` outside `src/http.rs` and `src/http/` whose code
/// (not comments) names axum.
fn axum_outside_http(src: &Path) -> Vec<String> {
    naming(
        src,
        |rel| !(rel.starts_with("http") || rel == Path::new("http.rs")),
        &["axum"],
    )
}

/// What naming a SQL dialect looks like: the driver, its pools and
/// dialects, and statements.
const SQL_WORDS: &[&str] = &[
    "sqlx",
    "Dialect",
    "MySql",
    "MySqlPool",
    "Postgres",
    "PgPool",
    "Sqlite",
    "SqlitePool",
    "SELECT",
    "INSERT",
];

/// The files of `src/resource.rs` and `src/resource/` whose code names a
/// SQL dialect, a driver or a statement.
fn sql_in_resource(src: &Path) -> Vec<String> {
    naming(
        src,
        |rel| rel.starts_with("resource") || rel == Path::new("resource.rs"),
        SQL_WORDS,
    )
}

#[test]
fn resource_knows_no_sql_dialect() {
    let src = root().join("crates/bloomgate-service/src");
    let found = sql_in_resource(&src);
    assert!(
        found.is_empty(),
        "`resource` knows no SQL dialect (ARCHITECTURE.md's invariant): SQL lives in `sql`; these name it: {found:?}"
    );
}

#[test]
fn sql_in_resource_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("resource")).unwrap();
    let write = |name: &str, text: &str| std::fs::write(src.join(name), text).unwrap();
    write("resource.rs", "//! x\n// SELECT in a comment is fine\n");
    write("resource/read.rs", "//! x\nuse sqlx::Row;\n");
    write(
        "resource/write.rs",
        "//! x\nconst Q: &str = \"INSERT INTO t VALUES (1)\";\n",
    );
    write("resource/calls.rs", "//! x\npub fn selected() {}\n");
    write("store.rs", "//! x\nuse sqlx::MySqlPool;\n");
    let mut found = sql_in_resource(src);
    found.sort();
    assert_eq!(found, ["resource/read.rs", "resource/write.rs"]);
}

/// The files under `src` outside `src/sql.rs` and `src/sql/` whose code
/// names the SQL driver.
fn sqlx_outside_sql(src: &Path) -> Vec<String> {
    naming(
        src,
        |rel| !(rel.starts_with("sql") || rel == Path::new("sql.rs")),
        &["sqlx"],
    )
}

#[test]
fn only_sql_knows_sqlx() {
    let src = root().join("crates/bloomgate-service/src");
    let outside = sqlx_outside_sql(&src);
    assert!(
        outside.is_empty(),
        "only `sql` may name sqlx (ARCHITECTURE.md's invariant); these do: {outside:?}"
    );
}

#[test]
fn sqlx_outside_sql_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("sql")).unwrap();
    std::fs::create_dir_all(src.join("feed")).unwrap();
    let write = |name: &str, text: &str| std::fs::write(src.join(name), text).unwrap();
    write("sql.rs", "//! x\nuse sqlx::AnyPool;\n");
    write("sql/outbox.rs", "//! x\nuse sqlx::Row;\n");
    write("feed.rs", "//! x\n// sqlx in a comment is fine\n");
    write("feed/outbox.rs", "//! x\nuse sqlx::Row;\n");
    write("sqlish.rs", "//! x\nfn f(e: &sqlx::Error) {}\n");
    let mut found = sqlx_outside_sql(src);
    found.sort();
    assert_eq!(found, ["feed/outbox.rs", "sqlish.rs"]);
}

#[test]
fn only_http_knows_axum() {
    let src = root().join("crates/bloomgate-service/src");
    let outside = axum_outside_http(&src);
    assert!(
        outside.is_empty(),
        "only `http` may import axum (ARCHITECTURE.md's invariant); these do: {outside:?}"
    );
}

#[test]
fn axum_outside_http_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("http")).unwrap();
    std::fs::create_dir_all(src.join("cache")).unwrap();
    let write = |name: &str, text: &str| std::fs::write(src.join(name), text).unwrap();
    write("http.rs", "//! x\nuse axum::Router;\n");
    write("http/edge.rs", "//! x\nuse axum::body::Body;\n");
    write(
        "cache.rs",
        "//! x\n// axum in a comment is fine\npub fn f() {}\n",
    );
    write("cache/l1.rs", "//! x\npub type B = axum::body::Bytes;\n");
    write("httpish.rs", "//! x\nuse axum::Json;\n");
    write(
        "model.rs",
        "//! x\nuse serde::Serialize; // not axum::Json\n",
    );
    let mut found = axum_outside_http(src);
    found.sort();
    assert_eq!(found, ["cache/l1.rs", "httpish.rs"]);
}

/// The Markdown files a reader follows links through.
fn markdown_files() -> Vec<PathBuf> {
    let root = root();
    let mut files: Vec<PathBuf> = [
        "README.md",
        "ARCHITECTURE.md",
        "BENCHMARKS.md",
        "RELIABILITY.md",
    ]
    .iter()
    .map(|f| root.join(f))
    .collect();
    for dir in ["docs", "crates/bloomgate-filter", "crates/bloomgate-redis"] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    files
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces
/// as hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings (outside code blocks).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut fence = false;
    for line in text.lines() {
        if line.starts_with("```") {
            fence = !fence;
        } else if !fence && line.starts_with('#') {
            out.insert(slug(line.trim_start_matches('#')));
        }
    }
    out
}

/// `[text](target)` links outside code blocks and code spans.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fence = false;
    for line in text.lines() {
        if line.starts_with("```") {
            fence = !fence;
            continue;
        }
        if fence {
            continue;
        }
        // Code spans hold no links.
        let prose: String = line
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 0)
            .map(|(_, s)| s)
            .collect::<Vec<_>>()
            .join(" ");
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            out.push(after[..end].to_string());
            rest = &after[end..];
        }
    }
    out
}

/// Every relative link and anchor in the Markdown resolves.
#[test]
fn every_relative_link_and_anchor_in_the_markdown_resolves() {
    let files = markdown_files();
    assert!(files.len() >= 8, "the docs were found: {files:?}");
    let mut broken = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = link.split_once('#').unwrap_or((&link, ""));
            let target = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            if !target.exists() {
                broken.push(format!("{}: {link} (no such file)", file.display()));
                continue;
            }
            if !anchor.is_empty() {
                let target_text = std::fs::read_to_string(&target).unwrap_or_default();
                if !anchors(&target_text).contains(anchor) {
                    broken.push(format!("{}: {link} (no such heading)", file.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The link checker finds links and anchors as GitHub makes them.
#[test]
fn the_link_checker_reads_links_and_headings() {
    assert_eq!(slug(" Local, strict or redis"), "local-strict-or-redis");
    assert_eq!(
        slug(" `[resp]`: the Redis protocol"),
        "resp-the-redis-protocol"
    );
    assert_eq!(
        links("see [a](docs/a.md#x) and `[b](c)` ![i](p.svg)\n```\n[no](z)\n```"),
        ["docs/a.md#x", "p.svg"]
    );
    assert!(anchors("# Top\n```\n# not a heading\n```\n## Watch it").contains("watch-it"));
}
