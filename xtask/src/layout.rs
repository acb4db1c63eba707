//! `cargo xtask layout`: the house rules of the source tree that no compiler checks.
//!
//! - No Rust source file under `core/` or `std-adapter/` passes [`MAX_LINES`] lines.
//! - No import circle of more than two files in any of their crates: a file's imports are the
//!   `crate::…` and `super::…` paths it names (in `use` items or inline), each resolved to the
//!   longest module path that is a file of the crate; the strongly connected components of
//!   that graph must have at most two files (a parent and its child may name each other).
//! - The std adapter stays thin: `cargo tree -p kvtier -e normal` names none of
//!   [`NOT_IN_ADAPTER`].

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The longest source file allowed.
pub(crate) const MAX_LINES: usize = 600;

/// Crates a service embedding `kvtier` must not pay for (they belong to the command).
pub(crate) const NOT_IN_ADAPTER: &[&str] =
    &["clap", "plotters", "dejavu", "indicatif", "serde_json"];

/// The trees whose files and crates are checked.
const TREES: &[&str] = &["core", "std-adapter"];

/// Runs every check from the workspace root; the findings, one line each, on failure.
pub(crate) fn check(root: &Path) -> Result<(), String> {
    let mut findings = Vec::new();
    let mut crates = Vec::new();
    for tree in TREES {
        let mut files = Vec::new();
        rust_files(&root.join(tree), &mut files);
        for f in &files {
            let lines = fs::read_to_string(f).map_or(0, |t| t.lines().count());
            if lines > MAX_LINES {
                findings.push(format!(
                    "{}: {lines} lines (at most {MAX_LINES})",
                    rel(root, f)
                ));
            }
            if f.file_name().is_some_and(|n| n == "lib.rs")
                && f.parent().is_some_and(|p| p.ends_with("src"))
            {
                crates.push(f.parent().map(Path::to_path_buf).unwrap_or_default());
            }
        }
    }
    for src in &crates {
        for circle in circles(src) {
            findings.push(format!(
                "{}: an import circle of {} files: {}",
                rel(root, src),
                circle.len(),
                circle.join(" → ")
            ));
        }
    }
    findings.extend(adapter_findings(root));
    if findings.is_empty() {
        println!(
            "layout: {} crates, no file over {MAX_LINES} lines, no import circle of more than \
             two files, the adapter's tree free of {}",
            crates.len(),
            NOT_IN_ADAPTER.join(", ")
        );
        Ok(())
    } else {
        Err(format!("layout:\n  {}", findings.join("\n  ")))
    }
}

fn rel(root: &Path, p: &Path) -> String {
    p.strip_prefix(root).unwrap_or(p).display().to_string()
}

/// Every `.rs` file below `dir`, skipping build output.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            if !p.ends_with("target") {
                rust_files(&p, out);
            }
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// A module path (`["shared", "collector"]`; the crate root is empty).
type ModPath = Vec<String>;

/// The modules of the crate whose root is `src/lib.rs`, each with its file.
fn modules(src: &Path) -> BTreeMap<ModPath, PathBuf> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut out = BTreeMap::new();
    for f in files {
        let Ok(rel) = f.strip_prefix(src) else {
            continue;
        };
        let mut parts: ModPath = rel
            .with_extension("")
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if parts
            .last()
            .is_some_and(|l| l == "mod" || l == "lib" || l == "main")
        {
            parts.pop();
        }
        out.insert(parts, f);
    }
    out
}

/// The longest prefix of `path` that is a module of the crate.
fn resolve<'m>(mods: &'m BTreeMap<ModPath, PathBuf>, path: &[String]) -> Option<&'m ModPath> {
    (0..=path.len())
        .rev()
        .find_map(|n| mods.get_key_value(path.get(..n)?).map(|(k, _)| k))
}

/// `text` without `//` comments (doc comments name paths that are not imports).
fn strip_comments(text: &str) -> String {
    text.lines()
        .map(|l| l.find("//").map_or(l, |i| l.get(..i).unwrap_or(l)))
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every path `text` names from `crate` or `super`, as module paths of the crate: a braced
/// group (`crate::a::{b, c::d}`) yields each member.
fn named_paths(text: &str, module: &[String]) -> Vec<ModPath> {
    let mut out = Vec::new();
    let bytes: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < bytes.len() {
        let starts_word = i == 0 || !is_ident(bytes[i - 1]);
        let rest: String = bytes[i..bytes.len().min(i + 6)].iter().collect();
        let (base, skip) = if starts_word && rest.starts_with("crate") {
            (Vec::new(), 5)
        } else if starts_word && rest.starts_with("super") {
            // `super` of module `a` (`a.rs` or `a/mod.rs`) is the parent of `a`.
            let mut base = module.to_vec();
            base.pop();
            (base, 5)
        } else {
            i += 1;
            continue;
        };
        let (paths, end) = parse_tail(&bytes, i + skip, base);
        out.extend(paths);
        i = end.max(i + 1);
    }
    out
}

/// Parses `::seg::seg…` (and `::{…}` groups) from `at`; the paths and where parsing stopped.
fn parse_tail(s: &[char], mut at: usize, mut base: ModPath) -> (Vec<ModPath>, usize) {
    let mut out = Vec::new();
    loop {
        if s.get(at) != Some(&':') || s.get(at + 1) != Some(&':') {
            break;
        }
        at += 2;
        if s.get(at) == Some(&'{') {
            // A group: each comma-separated member at depth one is a tail of `base`.
            let mut depth = 0;
            let mut member_start = at + 1;
            let mut j = at;
            while j < s.len() {
                match s[j] {
                    '{' => depth += 1,
                    '}' | ',' if depth == 1 => {
                        let member: String = s[member_start..j].iter().collect();
                        out.extend(group_member(member.trim(), &base));
                        member_start = j + 1;
                        if s[j] == '}' {
                            return (out, j + 1);
                        }
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
                j += 1;
            }
            return (out, j);
        }
        let start = at;
        while at < s.len() && is_ident(s[at]) {
            at += 1;
        }
        if at == start {
            break;
        }
        let seg: String = s[start..at].iter().collect();
        if seg == "super" {
            base.pop();
        } else {
            base.push(seg);
        }
    }
    out.push(base);
    (out, at)
}

/// One member of a braced group, as a path under `base` (nested groups included).
fn group_member(member: &str, base: &ModPath) -> Vec<ModPath> {
    let chars: Vec<char> = format!("::{member}").chars().collect();
    let (paths, _) = parse_tail(&chars, 0, base.clone());
    paths
}

/// The import circles of more than two files in the crate at `src`, each as its files.
pub(crate) fn circles(src: &Path) -> Vec<Vec<String>> {
    let mods = modules(src);
    let mut edges: BTreeMap<&ModPath, BTreeSet<&ModPath>> = BTreeMap::new();
    for (m, file) in &mods {
        let text = strip_comments(&fs::read_to_string(file).unwrap_or_default());
        let targets = edges.entry(m).or_default();
        for path in named_paths(&text, m) {
            if let Some(t) = resolve(&mods, &path)
                && t != m
                && !t.is_empty()
            {
                targets.insert(t);
            }
        }
    }
    strongly_connected(&edges)
        .into_iter()
        .filter(|c| c.len() > 2)
        .map(|c| {
            let mut names: Vec<String> = c
                .iter()
                .map(|m| rel(src, mods.get(*m).map_or(src, PathBuf::as_path)))
                .collect();
            names.sort();
            names
        })
        .collect()
}

/// Tarjan's strongly connected components, iteratively (no recursion depth to exhaust).
fn strongly_connected<'a>(
    edges: &BTreeMap<&'a ModPath, BTreeSet<&'a ModPath>>,
) -> Vec<Vec<&'a ModPath>> {
    let nodes: Vec<&ModPath> = edges.keys().copied().collect();
    let id: BTreeMap<&ModPath, usize> = nodes.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let adj: Vec<Vec<usize>> = nodes
        .iter()
        .map(|n| {
            edges
                .get(n)
                .map(|t| t.iter().filter_map(|x| id.get(x).copied()).collect())
                .unwrap_or_default()
        })
        .collect();
    let n = nodes.len();
    let (mut index, mut low, mut on) = (vec![usize::MAX; n], vec![0; n], vec![false; n]);
    let (mut stack, mut out, mut next) = (Vec::new(), Vec::new(), 0);
    for root in 0..n {
        if index[root] != usize::MAX {
            continue;
        }
        let mut work = vec![(root, 0usize)];
        while let Some(&mut (v, ref mut k)) = work.last_mut() {
            if *k == 0 && index[v] == usize::MAX {
                index[v] = next;
                low[v] = next;
                next += 1;
                stack.push(v);
                on[v] = true;
            }
            if let Some(&w) = adj[v].get(*k) {
                *k += 1;
                if index[w] == usize::MAX {
                    work.push((w, 0));
                } else if on[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut comp = Vec::new();
                while let Some(w) = stack.pop() {
                    on[w] = false;
                    comp.push(nodes[w]);
                    if w == v {
                        break;
                    }
                }
                out.push(comp);
            }
        }
    }
    out
}

/// The crates of [`NOT_IN_ADAPTER`] that `cargo tree -p kvtier -e normal` lists.
fn adapter_findings(root: &Path) -> Vec<String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(root)
        .args(["tree", "-p", "kvtier", "-e", "normal", "--prefix", "none"])
        .output();
    let text = match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        Ok(o) => {
            return vec![format!(
                "cargo tree -p kvtier failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            )];
        }
        Err(e) => return vec![format!("cargo tree could not run: {e}")],
    };
    let names: BTreeSet<&str> = text.lines().filter_map(|l| l.split(' ').next()).collect();
    NOT_IN_ADAPTER
        .iter()
        .filter(|c| names.contains(**c))
        .map(|c| format!("the std adapter `kvtier` depends on `{c}` (a crate of the command)"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, rel: &str, text: &str) {
        let p = dir.join(rel);
        fs::create_dir_all(p.parent().unwrap_or(dir)).unwrap_or_default();
        fs::write(p, text).unwrap_or_default();
    }

    fn temp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("xtask-layout-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_three_file_circle_is_found_and_a_parent_child_pair_is_not() {
        let d = temp("circle");
        write(
            &d,
            "lib.rs",
            "pub mod a;\npub mod b;\npub mod c;\npub mod p;\n",
        );
        write(&d, "a.rs", "use crate::b::X;\n");
        write(&d, "b.rs", "pub struct X;\nfn f() { crate::c::g(); }\n");
        write(&d, "c.rs", "use crate::{a, p::q::Y};\npub fn g() {}\n");
        write(&d, "p/mod.rs", "mod q;\nuse q::Y;\npub struct Z;\n");
        write(
            &d,
            "p/q.rs",
            "pub struct Y;\nuse super::Z; // crate::b in a comment\n",
        );
        let found = circles(&d);
        assert_eq!(found, vec![vec!["a.rs", "b.rs", "c.rs"]], "{found:?}");
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn groups_and_nested_groups_name_each_member() {
        let m: ModPath = vec!["x".into()];
        let got = named_paths("use crate::{a::{b, c}, d};", &m);
        let want: Vec<ModPath> = [["a", "b"].as_slice(), &["a", "c"], &["d"]]
            .iter()
            .map(|p| p.iter().map(|s| (*s).to_owned()).collect())
            .collect();
        assert_eq!(got, want);
        let up = named_paths("super::super::y::Z", &["a".into(), "b".into()]);
        assert_eq!(up, vec![vec!["y".to_owned(), "Z".to_owned()]]);
    }
}
