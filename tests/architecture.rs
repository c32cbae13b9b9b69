//! The house's two rules, read from the sources themselves.
//!
//! The modules of every crate depend on each other one way only: no module reaches
//! into a sibling that reaches back (a newcomer reads them top-down, and changes one
//! without pulling the other along). Read from the sources themselves: every
//! `crate::…` and `super::…` path outside comments and test modules is an edge from
//! the file's module to the deepest module the path names; edges between a module and
//! its own ancestors (`use super::*` in a child, `mod child` in a parent) do not count.
//! A cycle among siblings anywhere in the tree (two that use each other, or a ring
//! through others) fails the test, naming a file on each edge of it.
//!
//! And no file holds more than [`MAX_CODE_LINES`] lines of code before its test module:
//! one behaviour per file, read in one sitting.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

/// Every `.rs` file under `root`, by module path (`a/b/mod.rs` and `a/b.rs` are `a::b`).
fn modules(root: &Path) -> BTreeMap<Module, PathBuf> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(root).unwrap().with_extension("");
                let mut module: Module = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
                if matches!(module.last().map(String::as_str), Some("mod" | "lib" | "main")) {
                    module.pop();
                }
                out.insert(module, path);
            }
        }
    }
    out
}

/// The source a module's dependencies are read from: comments and the test module out.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let text = text.split("#[cfg(test)]").next().unwrap_or("");
    text.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n")
}

/// The paths written after `crate::` and `super::` (groups `{a, b::c}` expanded), each
/// as the module path it starts from plus its segments.
fn paths(module: &Module, code: &str) -> Vec<Module> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let rest = &bytes[i..];
        let boundary = i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
        let start = if !boundary {
            None
        } else if rest.starts_with(b"crate::") {
            Some((Vec::new(), "crate::".len()))
        } else if rest.starts_with(b"super::") {
            let mut base = module.clone();
            let mut len = 0;
            while bytes[i + len..].starts_with(b"super::") {
                base.pop();
                len += "super::".len();
            }
            Some((base, len))
        } else {
            None
        };
        match start {
            Some((base, len)) => {
                i += len;
                i = tree(code, i, base, &mut out);
            }
            None => i += 1,
        }
    }
    out
}

/// Reads one use tree at `i` (`a::b`, `a::{b, c::d}`), pushing each full path; returns
/// where it ends.
fn tree(code: &str, mut i: usize, mut prefix: Module, out: &mut Vec<Module>) -> usize {
    let bytes = code.as_bytes();
    loop {
        let start = i;
        while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
            i += 1;
        }
        if i > start {
            prefix.push(code[start..i].to_string());
        }
        let group = if bytes[i..].starts_with(b"::{") {
            Some(3)
        } else if i == start && bytes[i..].starts_with(b"{") {
            Some(1)
        } else {
            None
        };
        if let Some(open) = group {
            i += open;
            loop {
                while i < bytes.len() && (bytes[i] == b' ' || bytes[i] == b'\n' || bytes[i] == b',') {
                    i += 1;
                }
                if i >= bytes.len() || bytes[i] == b'}' {
                    return i + 1;
                }
                i = tree(code, i, prefix.clone(), out);
            }
        } else if bytes[i..].starts_with(b"::") {
            i += 2;
        } else {
            out.push(prefix);
            return i;
        }
    }
}

fn is_ancestor_or_same(a: &Module, b: &Module) -> bool {
    a.len() <= b.len() && b[..a.len()] == a[..]
}

/// Sibling pairs that depend on each other, with one file-level edge each way.
fn sibling_cycles(root: &Path) -> Vec<String> {
    let mods = modules(root);
    let mut edges: BTreeSet<(Module, Module)> = BTreeSet::new();
    for (module, path) in &mods {
        for mut target in paths(module, &code(path)) {
            while !target.is_empty() && !mods.contains_key(&target) {
                target.pop();
            }
            if !target.is_empty() && !is_ancestor_or_same(module, &target) && !is_ancestor_or_same(&target, module) {
                edges.insert((module.clone(), target));
            }
        }
    }
    // Lift each edge to the two siblings under the modules' deepest common ancestor.
    let mut between: BTreeMap<(Module, Module), (Module, Module)> = BTreeMap::new();
    for (from, to) in &edges {
        let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
        let key = (from[..=common].to_vec(), to[..=common].to_vec());
        between.entry(key).or_insert_with(|| (from.clone(), to.clone()));
    }
    // A sibling that reaches back, directly or through other siblings.
    let reaches = |from: &Module, goal: &Module| {
        let (mut seen, mut todo) = (BTreeSet::new(), vec![from.clone()]);
        while let Some(m) = todo.pop() {
            if &m == goal {
                return true;
            }
            if seen.insert(m.clone()) {
                todo.extend(between.keys().filter(|(x, _)| *x == m).map(|(_, y)| y.clone()));
            }
        }
        false
    };
    let mut found = Vec::new();
    for ((a, b), (from, to)) in &between {
        if reaches(b, a) {
            found.push(format!("{} -> {} and back: {} uses {}", a.join("::"), b.join("::"), from.join("::"), to.join("::")));
        }
    }
    found
}

#[test]
fn no_module_depends_on_a_sibling_that_depends_on_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut cycles = Vec::new();
    for krate in ["src", "core/src", "actors/src", "testbed/src"] {
        let dir = root.join(krate);
        assert!(dir.is_dir(), "{} is not a directory", dir.display());
        cycles.extend(sibling_cycles(&dir).into_iter().map(|c| format!("{krate}: {c}")));
    }
    assert!(cycles.is_empty(), "import cycles between modules:\n{}", cycles.join("\n"));
}

#[test]
fn a_cycle_planted_between_two_siblings_is_found() {
    let dir = std::env::temp_dir().join(format!("shepherd-architecture-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("a")).unwrap();
    std::fs::write(dir.join("lib.rs"), "mod a;\nmod b;\n").unwrap();
    std::fs::write(dir.join("a/mod.rs"), "mod inner;\nuse super::*;\n").unwrap();
    std::fs::write(dir.join("a/inner.rs"), "use crate::{b::Thing, a::Other};\n// use crate::c;\n").unwrap();
    std::fs::write(dir.join("b.rs"), "fn f() { super::a::inner::g() }\n#[cfg(test)]\nuse crate::c;\n").unwrap();
    let found = sibling_cycles(&dir);
    std::fs::write(dir.join("b.rs"), "fn f() {}\n").unwrap();
    let after = sibling_cycles(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        found,
        vec!["a -> b and back: a::inner uses b".to_string(), "b -> a and back: b uses a::inner".to_string()]
    );
    assert!(after.is_empty(), "{after:?}");
}

#[test]
fn a_ring_through_three_siblings_is_found() {
    let dir = std::env::temp_dir().join(format!("shepherd-architecture-ring-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("lib.rs"), "mod a;\nmod b;\nmod c;\n").unwrap();
    std::fs::write(dir.join("a.rs"), "use crate::b::X;\n").unwrap();
    std::fs::write(dir.join("b.rs"), "use crate::c::Y;\n").unwrap();
    std::fs::write(dir.join("c.rs"), "use crate::a::Z;\n").unwrap();
    let found = sibling_cycles(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(found.len(), 3, "{found:?}");
}

/// The most lines a source file may hold before its test module.
const MAX_CODE_LINES: usize = 600;

#[test]
fn no_source_file_holds_more_than_600_lines_of_code_before_its_tests() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut long = Vec::new();
    for krate in ["src", "core/src", "actors/src", "testbed/src"] {
        for path in modules(&root.join(krate)).into_values() {
            let text = std::fs::read_to_string(&path).unwrap();
            let lines = text.lines().take_while(|l| l.trim() != "#[cfg(test)]").count();
            if lines > MAX_CODE_LINES {
                long.push(format!("{} ({lines} lines)", path.strip_prefix(root).unwrap().display()));
            }
        }
    }
    assert!(long.is_empty(), "files over {MAX_CODE_LINES} lines of code:\n{}", long.join("\n"));
}
