//! The layer rule of the module map in `lib.rs`, held: every source file of the crate belongs to
//! one row of the table there, and names (through `crate::`/`super::` paths) nothing of a row
//! above its own. The table is read from `lib.rs`, so it is written once.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

/// `(module path, layer)` from the rows `//! | N name | `a`, `b::c` |` of lib.rs's module map.
fn table(lib_rs: &str) -> Vec<(Vec<String>, u32)> {
    let mut rows = Vec::new();
    for line in lib_rs.lines() {
        let Some(row) = line.strip_prefix("//! | ") else {
            continue;
        };
        let mut cells = row.split('|');
        let (Some(layer), Some(modules)) = (cells.next(), cells.next()) else {
            continue;
        };
        let Some(Ok(n)) = layer.split_whitespace().next().map(str::parse::<u32>) else {
            continue;
        };
        for m in modules.split(',') {
            let m = m.trim().trim_matches('`');
            rows.push((m.split("::").map(str::to_owned).collect(), n));
        }
    }
    rows
}

/// The layer of `path`: the row of its longest listed prefix.
fn layer_of(rows: &[(Vec<String>, u32)], path: &[String]) -> Option<u32> {
    rows.iter()
        .filter(|(m, _)| path.starts_with(m))
        .max_by_key(|(m, _)| m.len())
        .map(|(_, n)| *n)
}

/// The module a source file is, from its path below `src/`.
fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .with_extension("")
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// The paths a file of module `here` names through `crate::` and `super::`, resolved from the
/// crate root (`crate::{a, b::c}` groups give each of their paths). Comments and the file's
/// `#[cfg(test)]` module are not read.
fn imports(text: &str, here: &[String]) -> Vec<Vec<String>> {
    let code: String = text
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let code = match code.find("#[cfg(test)]\nmod ") {
        Some(at) => &code[..at],
        None => &code[..],
    };
    let word = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = Vec::new();
    for (at, _) in code.match_indices("::") {
        let head_start = code[..at].rfind(|c: char| !word(c)).map_or(0, |i| i + 1);
        let head = &code[head_start..at];
        if head != "crate" && head != "super" {
            continue;
        }
        if code[..head_start].ends_with("::") {
            continue; // `super::super::x` is read from its first `super`
        }
        let mut base: Vec<String> = Vec::new();
        let mut rest = &code[head_start..];
        if head == "super" {
            base = here.to_vec();
            while let Some(r) = rest.strip_prefix("super::") {
                base.pop();
                rest = r;
            }
        } else {
            rest = &rest["crate::".len()..];
        }
        let group = rest.starts_with('{');
        let end = if group {
            rest.find('}').unwrap_or(rest.len())
        } else {
            rest.find(|c: char| !(word(c) || c == ':'))
                .unwrap_or(rest.len())
        };
        let items = rest[..end].trim_start_matches('{');
        for item in items.split(|c: char| !(word(c) || c == ':')) {
            let segments: Vec<String> = item
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
            if !segments.is_empty() {
                out.push([base.clone(), segments].concat());
            }
        }
    }
    out
}

/// Each import of a layer above the importing file's: `file: names path (layer n > m)`.
fn violations(rows: &[(Vec<String>, u32)], file: &str, here: &[String], text: &str) -> Vec<String> {
    let Some(own) = layer_of(rows, here) else {
        return vec![format!(
            "{file}: module {} is in no row of the module map",
            here.join("::")
        )];
    };
    imports(text, here)
        .into_iter()
        .filter_map(|p| {
            let theirs = layer_of(rows, &p)?;
            (theirs > own).then(|| {
                format!(
                    "{file}: names {} (layer {theirs}) from layer {own}",
                    p.join("::")
                )
            })
        })
        .collect()
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_module_imports_from_a_layer_above_its_own() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let rows = table(&std::fs::read_to_string(src.join("lib.rs")).unwrap());
    assert!(
        rows.len() > 10,
        "the module map of lib.rs was not read: {rows:?}"
    );
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut wrong = Vec::new();
    for file in files {
        let rel = file.strip_prefix(&src).unwrap();
        if rel == Path::new("lib.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        wrong.extend(violations(
            &rows,
            &rel.display().to_string(),
            &module_of(rel),
            &text,
        ));
    }
    // Every row names a module that exists.
    for (m, _) in &rows {
        let file = src.join(m.join("/"));
        assert!(
            file.with_extension("rs").is_file() || file.join("mod.rs").is_file(),
            "the module map lists `{}`, which is no file",
            m.join("::")
        );
    }
    assert!(wrong.is_empty(), "layer rule broken:\n{}", wrong.join("\n"));
}

#[test]
fn the_rule_catches_an_import_from_above_in_each_form() {
    let rows = table(
        "//! | 0 leaves | `rls`, `units` |\n//! | 3 runtime | `state` |\n//! | 4 surfaces | `rls::grpc` |\n",
    );
    let leaf = ["rls".to_owned(), "tree".to_owned()];
    for bad in [
        "use crate::state::Shared;",
        "use crate::{units::PositiveDuration, state::Shared};",
        "fn f() { let _ = crate::state::now(); }",
        "use super::grpc::RlsService;",
    ] {
        assert_eq!(violations(&rows, "f.rs", &leaf, bad).len(), 1, "{bad}");
    }
    for fine in [
        "use sluice_spec::units::PositiveDuration;",
        "use super::{Rule, Unit};",
        "// crate::state::Shared in a comment",
        "#[cfg(test)]\nmod tests {\n    use crate::state::Shared;\n}",
    ] {
        assert!(violations(&rows, "f.rs", &leaf, fine).is_empty(), "{fine}");
    }
    assert_eq!(violations(&rows, "f.rs", &["app".to_owned()], "").len(), 1);
}
