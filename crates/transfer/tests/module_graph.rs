//! The layering rules, checked on the source: no two modules of a crate (`wire`, `transfer`,
//! `node`, `grid`, `meta`, `catalog`, `netlab`, `harness`, the command line) import each
//! other through any chain, the command line uses only
//! library APIs, the client never imports the endpoint (the
//! server side), and the engine names no storage-node concept. A change that breaks one fails
//! here with the cycle or the import it made.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Modules of `crate_src` (a file `name.rs`, and a directory `name/` of submodules, count as
/// the one module `name`) and the modules of the same crate each one's code (not its comments,
/// not its `#[cfg(test)] mod tests`) refers to as `crate::name`.
fn graph(crate_src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files: BTreeMap<String, String> = BTreeMap::new();
    for e in std::fs::read_dir(crate_src).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_stem().unwrap().to_string_lossy().into_owned();
        if name == "lib" {
            continue;
        }
        if p.extension().is_some_and(|x| x == "rs") {
            files
                .entry(name)
                .or_default()
                .push_str(&code_of(&std::fs::read_to_string(&p).unwrap()));
        } else if p.is_dir() {
            for f in rust_files(&p) {
                files
                    .entry(name.clone())
                    .or_default()
                    .push_str(&code_of(&std::fs::read_to_string(&f).unwrap()));
            }
        }
    }
    let names: BTreeSet<String> = files.keys().cloned().collect();
    files
        .iter()
        .map(|(m, code)| {
            let mut deps = BTreeSet::new();
            for (i, _) in code.match_indices("crate::") {
                let rest = &code[i + "crate::".len()..];
                if let Some(rest) = rest.strip_prefix('{') {
                    // `use crate::{a, b::c}`
                    let group = &rest[..rest.find('}').unwrap_or(rest.len())];
                    deps.extend(group.split(',').map(|s| ident(s.trim())));
                } else {
                    deps.insert(ident(rest));
                }
            }
            deps.retain(|d| d != m && names.contains(d));
            (m.clone(), deps)
        })
        .collect()
}

/// Every `.rs` file below `dir`.
fn rust_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(rust_files(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out
}

fn ident(s: &str) -> String {
    s.chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// The source without line comments and without its unit-test module.
fn code_of(src: &str) -> String {
    let src = match src.find("#[cfg(test)]\nmod tests") {
        Some(i) => &src[..i],
        None => src,
    };
    src.lines()
        .map(|l| match l.trim_start().starts_with("//") {
            true => "",
            false => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A chain of imports that leads from a module back to itself, if there is one.
fn cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        g: &BTreeMap<String, BTreeSet<String>>,
        m: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == m) {
            let mut c = path[i..].to_vec();
            c.push(m.to_string());
            return Some(c);
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_string());
        for d in &g[m] {
            if let Some(c) = visit(g, d, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_string());
        None
    }
    let mut done = BTreeSet::new();
    g.keys()
        .find_map(|m| visit(g, m, &mut Vec::new(), &mut done))
}

fn src(krate: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(krate)
        .join("src")
}

#[test]
fn modules_import_each_other_in_no_circle() {
    for krate in [
        "wire", "transfer", "node", "grid", "meta", "catalog", "netlab", "harness", "cli",
    ] {
        let g = graph(&src(krate));
        assert!(g.len() >= 3, "{krate}: no modules found");
        if let Some(c) = cycle(&g) {
            panic!(
                "{krate}: modules import each other in a circle: {}",
                c.join(" -> ")
            );
        }
    }
}

#[test]
fn the_client_does_not_import_the_server_and_the_engine_knows_no_storage_node() {
    let g = graph(&src("transfer"));
    assert!(
        !g["client"].contains("endpoint"),
        "client imports endpoint: {:?}",
        g["client"]
    );
    // Every source file, also those of modules kept in directories (`translog/tests.rs`).
    let mut files = Vec::new();
    let mut dirs = vec![src("transfer")];
    while let Some(d) = dirs.pop() {
        for p in std::fs::read_dir(d).unwrap().map(|e| e.unwrap().path()) {
            if p.is_dir() {
                dirs.push(p);
            } else {
                files.push(p);
            }
        }
    }
    for (m, code) in files
        .into_iter()
        .map(|p| (p.clone(), code_of(&std::fs::read_to_string(&p).unwrap())))
    {
        for node_only in [
            "wire::node",
            "Operation::Run",
            "Operation::Verify",
            "spool_path",
        ] {
            assert!(
                !code.contains(node_only),
                "{}: the engine uses the storage node's {node_only}",
                m.display()
            );
        }
    }
}

/// The command line talks to library APIs only (`grid`, `meta`, `node`, `transfer`, ...): it
/// neither speaks gRPC messages of `api` directly nor opens the `catalog`.
#[test]
fn the_command_line_uses_library_apis_only() {
    for e in std::fs::read_dir(src("cli")).unwrap() {
        let p = e.unwrap().path();
        let code = code_of(&std::fs::read_to_string(&p).unwrap());
        for crate_name in ["api", "catalog"] {
            let used = code
                .match_indices(&format!("{crate_name}::"))
                .any(|(i, _)| {
                    i == 0
                        || !code[..i]
                            .ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':')
                });
            assert!(!used, "{}: uses {crate_name} directly", p.display());
        }
    }
}

#[test]
fn the_checker_sees_a_planted_cycle() {
    let dir = tempfile::tempdir().unwrap();
    for (m, body) in [
        ("a", "use crate::b::X;\n"),
        (
            "b",
            "use crate::{c, d};\n// crate::a in a comment is no import\n",
        ),
        ("c", "fn f() { crate::a::g() }\n"),
        ("d", "#[cfg(test)]\nmod tests { use crate::a; }\n"),
    ] {
        std::fs::write(dir.path().join(format!("{m}.rs")), body).unwrap();
    }
    let g = graph(dir.path());
    assert_eq!(g["b"], ["c", "d"].map(String::from).into());
    assert!(g["d"].is_empty());
    assert_eq!(cycle(&g).unwrap(), ["a", "b", "c", "a"].map(String::from));
}
