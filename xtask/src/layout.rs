//! `cargo xtask layout`: the house rules of the source tree that no compiler checks.
//!
//! - No Rust source file under `core/` or `std-adapter/` has more than [`MAX_CODE_LINES`] lines
//!   of code. A line of code holds something besides comments (`//`, `///`, `//!`, `/* … */`)
//!   and whitespace; the lines of a `#[cfg(test)] mod name { … }` block are not code, and a file
//!   reached through a `#[cfg(test)] mod name;` declaration (with every file below it) is a test
//!   file and not counted at all. Files are split by concept, never to meet the count.
//! - No import circle except between a module and its parent: a file's imports are the
//!   `crate::…`, `self::…` and `super::…` paths it names (in `use` items or inline; comments and
//!   literals do not count), each resolved to the longest module path that is a file of the
//!   crate (the crate root, a facade of re-exports, is left out). Every strongly connected
//!   component of that graph of two files or more is a finding, unless it is two files of which
//!   one is the other's module parent (`foo/mod.rs` or `foo.rs` and `foo/bar.rs`).
//! - The std adapter stays thin: `cargo tree -p kvtier -e normal` names none of
//!   [`NOT_IN_ADAPTER`].

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The most lines of code a source file may have.
pub(crate) const MAX_CODE_LINES: usize = 600;

/// Crates a service embedding `kvtier` must not pay for (they belong to the command).
pub(crate) const NOT_IN_ADAPTER: &[&str] =
    &["clap", "plotters", "dejavu", "indicatif", "serde_json"];

/// The trees whose files and crates are checked.
const TREES: &[&str] = &["core", "std-adapter"];

/// Runs every check from the workspace root; the findings, one line each, on failure.
pub(crate) fn check(root: &Path) -> Result<(), String> {
    let mut findings = Vec::new();
    let mut crates = Vec::new();
    let mut counted = 0;
    for tree in TREES {
        let mut files = Vec::new();
        rust_files(&root.join(tree), &mut files);
        let tests = test_files(&files);
        for f in &files {
            if f.file_name().is_some_and(|n| n == "lib.rs")
                && f.parent().is_some_and(|p| p.ends_with("src"))
            {
                crates.push(f.parent().map(Path::to_path_buf).unwrap_or_default());
            }
            if tests.contains(f) {
                continue;
            }
            counted += 1;
            let code = fs::read_to_string(f).map_or(0, |t| code_lines(&t));
            if code > MAX_CODE_LINES {
                findings.push(format!(
                    "{}: {code} lines of code (at most {MAX_CODE_LINES})",
                    rel(root, f)
                ));
            }
        }
    }
    for src in &crates {
        for circle in circles(src) {
            findings.push(format!(
                "{}: an import circle of {} files that are not a module and its parent: {}",
                rel(root, src),
                circle.len(),
                circle.join(", ")
            ));
        }
    }
    findings.extend(adapter_findings(root));
    if findings.is_empty() {
        println!(
            "layout: {counted} files (test files not counted) in {} crates, none over \
             {MAX_CODE_LINES} lines of code, no import circle but a module and its parent, the \
             adapter's tree free of {}",
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

/// A source file with its comments and literals told apart from its code.
#[derive(Debug)]
struct Scan {
    /// The text with each comment character a space and each literal character (quotes and
    /// prefixes included) an `_`; newlines kept, so lines and columns stay where they were.
    bare: String,
    /// For each line, whether it holds anything besides comments and whitespace (a line inside
    /// a multi-line literal holds code).
    code: Vec<bool>,
}

/// Splits `text` into code, comments and literals: `//` and nested `/* */` comments, strings
/// with escapes, raw strings (`r#"…"#`, `br"…"`, `cr"…"`), and character literals told from
/// lifetimes.
fn scan(text: &str) -> Scan {
    let s: Vec<char> = text.chars().collect();
    let mut bare = String::with_capacity(text.len());
    let mut code = vec![false];
    let mut i = 0;
    while let Some(&c) = s.get(i) {
        let next = s.get(i + 1).copied();
        let span = if c == '/' && next == Some('/') {
            let end = s[i..]
                .iter()
                .position(|&x| x == '\n')
                .map_or(s.len(), |p| i + p);
            Some((end, false))
        } else if c == '/' && next == Some('*') {
            Some((block_comment_end(&s, i), false))
        } else {
            literal_end(&s, i).map(|end| (end, true))
        };
        let Some((end, literal)) = span else {
            if c == '\n' {
                code.push(false);
            } else if !c.is_whitespace()
                && let Some(line) = code.last_mut()
            {
                *line = true;
            }
            bare.push(c);
            i += 1;
            continue;
        };
        for &x in s.get(i..end).unwrap_or_default() {
            if x == '\n' {
                bare.push('\n');
                code.push(literal);
            } else {
                bare.push(if literal { '_' } else { ' ' });
                if literal && let Some(line) = code.last_mut() {
                    *line = true;
                }
            }
        }
        i = end;
    }
    Scan { bare, code }
}

/// Where the (nested) block comment opening at `i` ends.
fn block_comment_end(s: &[char], mut i: usize) -> usize {
    let mut depth = 0usize;
    while let Some(&c) = s.get(i) {
        match (c, s.get(i + 1)) {
            ('/', Some('*')) => {
                depth += 1;
                i += 2;
            }
            ('*', Some('/')) => {
                depth -= 1;
                i += 2;
                if depth == 0 {
                    return i;
                }
            }
            _ => i += 1,
        }
    }
    s.len()
}

/// Where the string, raw string or character literal starting at `i` ends; `None` when none
/// starts there (a lifetime `'a` is not a literal).
fn literal_end(s: &[char], i: usize) -> Option<usize> {
    let at = |k: usize| s.get(k).copied();
    match at(i)? {
        '"' => {
            let mut j = i + 1;
            while let Some(c) = at(j) {
                match c {
                    '\\' => j += 2,
                    '"' => return Some(j + 1),
                    _ => j += 1,
                }
            }
            return Some(s.len());
        }
        '\'' => {
            return match (at(i + 1), at(i + 2)) {
                // An escape: the escaped character, then up to the closing quote.
                (Some('\\'), _) => {
                    let from = i + 3;
                    Some(
                        s.get(from..)?
                            .iter()
                            .position(|&x| x == '\'')
                            .map_or(s.len(), |p| from + p + 1),
                    )
                }
                (Some(c), Some('\'')) if c != '\'' => Some(i + 3),
                _ => None,
            };
        }
        _ => {}
    }
    // A raw string starts a word: `r`, `br` or `cr`, then hashes, then a quote.
    if i > 0 && s.get(i - 1).is_some_and(|&c| is_ident(c)) {
        return None;
    }
    let mut k = i;
    if matches!(at(k), Some('b' | 'c')) {
        k += 1;
    }
    if at(k) != Some('r') {
        return None;
    }
    k += 1;
    let hashes = s.get(k..)?.iter().take_while(|&&c| c == '#').count();
    k += hashes;
    if at(k) != Some('"') {
        return None;
    }
    let mut j = k + 1;
    while let Some(c) = at(j) {
        if c == '"' && (1..=hashes).all(|h| at(j + h) == Some('#')) {
            return Some(j + 1 + hashes);
        }
        j += 1;
    }
    Some(s.len())
}

/// A word or a punctuation character of bare code, with its line (from 0).
#[derive(Debug)]
struct Token {
    text: String,
    line: usize,
}

/// The tokens of bare code (see [`Scan::bare`]).
fn tokens(bare: &str) -> Vec<Token> {
    let mut out = Vec::new();
    let mut word = String::new();
    let (mut line, mut word_line) = (0, 0);
    for c in bare.chars() {
        if is_ident(c) {
            if word.is_empty() {
                word_line = line;
            }
            word.push(c);
            continue;
        }
        if !word.is_empty() {
            out.push(Token {
                text: std::mem::take(&mut word),
                line: word_line,
            });
        }
        if c == '\n' {
            line += 1;
        } else if !c.is_whitespace() {
            out.push(Token {
                text: c.to_string(),
                line,
            });
        }
    }
    if !word.is_empty() {
        out.push(Token {
            text: word,
            line: word_line,
        });
    }
    out
}

/// A `#[cfg(test)]` module: its first and last lines (from 0), and its name when it is a file
/// module (`mod name;`) rather than an inline block.
#[derive(Debug, PartialEq)]
struct TestModule {
    first: usize,
    last: usize,
    file: Option<String>,
}

/// The `#[cfg(test)]` modules of a file's tokens (other attributes and a visibility may stand
/// between the attribute and `mod`).
fn test_modules(toks: &[Token]) -> Vec<TestModule> {
    let text = |i: usize| toks.get(i).map_or("", |t| t.text.as_str());
    let line = |i: usize| toks.get(i).or(toks.last()).map_or(0, |t| t.line);
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let attribute = ["#", "[", "cfg", "(", "test", ")", "]"]
            .iter()
            .enumerate()
            .all(|(k, w)| text(i + k) == *w);
        if !attribute {
            i += 1;
            continue;
        }
        let mut j = i + 7;
        while text(j) == "#" && text(j + 1) == "[" {
            j = closing(toks, j + 1, "[", "]") + 1;
        }
        if text(j) == "pub" {
            j += 1;
            if text(j) == "(" {
                j = closing(toks, j, "(", ")") + 1;
            }
        }
        let name = text(j + 1);
        if text(j) != "mod" || !name.starts_with(|c: char| c.is_alphabetic() || c == '_') {
            i += 1;
            continue;
        }
        match text(j + 2) {
            ";" => {
                out.push(TestModule {
                    first: line(i),
                    last: line(j + 2),
                    file: Some(name.to_owned()),
                });
                i = j + 3;
            }
            "{" => {
                let end = closing(toks, j + 2, "{", "}");
                out.push(TestModule {
                    first: line(i),
                    last: line(end),
                    file: None,
                });
                i = end + 1;
            }
            _ => i += 1,
        }
    }
    out
}

/// The index of the token that closes the group `open` opens at `at` (the last token when
/// the group is never closed).
fn closing(toks: &[Token], at: usize, open: &str, close: &str) -> usize {
    let mut depth = 0usize;
    for (k, t) in toks.iter().enumerate().skip(at) {
        if t.text == open {
            depth += 1;
        } else if t.text == close {
            depth = depth.saturating_sub(1);
            if depth == 0 {
                return k;
            }
        }
    }
    toks.len().saturating_sub(1)
}

/// The lines of code of a source file: lines holding something besides comments and
/// whitespace, outside `#[cfg(test)]` modules.
fn code_lines(text: &str) -> usize {
    let scan = scan(text);
    let mut code = scan.code;
    for m in test_modules(&tokens(&scan.bare)) {
        for line in code.iter_mut().take(m.last + 1).skip(m.first) {
            *line = false;
        }
    }
    code.iter().filter(|&&c| c).count()
}

/// Bare code (see [`Scan::bare`]) with the lines of its `#[cfg(test)]` modules emptied: a
/// test module's `super` is the file's own module, and tests are no layer of the crate.
fn outside_tests(bare: &str) -> String {
    let tests = test_modules(&tokens(bare));
    bare.lines()
        .enumerate()
        .map(|(n, l)| {
            if tests.iter().any(|m| (m.first..=m.last).contains(&n)) {
                ""
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The folder in which the `mod name;` declarations of file `f` find their files.
fn module_dir(f: &Path) -> PathBuf {
    let parent = f.parent().unwrap_or(Path::new(""));
    match f.file_stem().and_then(|s| s.to_str()) {
        Some("mod" | "lib" | "main") | None => parent.to_path_buf(),
        Some(stem) => parent.join(stem),
    }
}

/// The test files among `files`: those a `#[cfg(test)] mod name;` declaration reaches
/// (`name.rs`, `name/mod.rs`) and every file below them.
fn test_files(files: &[PathBuf]) -> BTreeSet<PathBuf> {
    let mut roots = Vec::new();
    for f in files {
        let Ok(text) = fs::read_to_string(f) else {
            continue;
        };
        let dir = module_dir(f);
        for m in test_modules(&tokens(&scan(&text).bare)) {
            roots.extend(m.file.map(|name| dir.join(name)));
        }
    }
    files
        .iter()
        .filter(|f| {
            let module = f.with_extension("");
            roots.iter().any(|r| module == *r || f.starts_with(r))
        })
        .cloned()
        .collect()
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

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every path `text` names from `crate`, `self` or `super`, as module paths of the crate: a
/// braced group (`crate::a::{b, c::d}`) yields each member. A keyword not followed by `::`
/// (`pub(super)`, `self.x`) names nothing.
fn named_paths(text: &str, module: &[String]) -> Vec<ModPath> {
    let mut out = Vec::new();
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let starts_word = i == 0 || chars.get(i - 1).is_some_and(|&c| !is_ident(c));
        let word_end = chars
            .get(i..)
            .map_or(0, |r| r.iter().take_while(|&&c| is_ident(c)).count());
        let word: String = chars
            .get(i..i + word_end)
            .unwrap_or_default()
            .iter()
            .collect();
        let base = match word.as_str() {
            _ if !starts_word || word_end == 0 => None,
            "crate" => Some(Vec::new()),
            "self" => Some(module.to_vec()),
            // `super` of module `a` (`a.rs` or `a/mod.rs`) is the parent of `a`.
            "super" => Some(
                module
                    .get(..module.len().saturating_sub(1))
                    .unwrap_or_default()
                    .to_vec(),
            ),
            _ => None,
        };
        let Some(base) = base else {
            i += word_end.max(1);
            continue;
        };
        let (paths, end) = parse_tail(&chars, i + word_end, base);
        out.extend(paths);
        i = end.max(i + word_end);
    }
    out
}

/// Parses `::seg::seg…` (and `::{…}` groups) from `at`; the paths and where parsing stopped
/// (no path when `at` holds no `::`).
fn parse_tail(s: &[char], mut at: usize, mut base: ModPath) -> (Vec<ModPath>, usize) {
    let mut out = Vec::new();
    if s.get(at) != Some(&':') || s.get(at + 1) != Some(&':') {
        return (out, at);
    }
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
            while let Some(&c) = s.get(j) {
                match c {
                    '{' => depth += 1,
                    '}' | ',' if depth == 1 => {
                        let member: String =
                            s.get(member_start..j).unwrap_or_default().iter().collect();
                        out.extend(group_member(member.trim(), &base));
                        member_start = j + 1;
                        if c == '}' {
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
        while s.get(at).is_some_and(|&c| is_ident(c)) {
            at += 1;
        }
        if at == start {
            break;
        }
        let seg: String = s.get(start..at).unwrap_or_default().iter().collect();
        if seg == "super" {
            base.pop();
        } else if seg != "self" {
            base.push(seg);
        }
    }
    out.push(base);
    (out, at)
}

/// One member of a braced group, as a path under `base` (nested groups included).
fn group_member(member: &str, base: &ModPath) -> Vec<ModPath> {
    if member.is_empty() {
        return Vec::new();
    }
    let chars: Vec<char> = format!("::{member}").chars().collect();
    let (paths, _) = parse_tail(&chars, 0, base.clone());
    paths
}

/// Whether module `parent` is the module parent of `child` (`a` of `a::b`).
fn is_parent(parent: &[String], child: &[String]) -> bool {
    parent.len() + 1 == child.len() && child.starts_with(parent)
}

/// The import circles of the crate at `src` other than a module and its parent, each as its
/// files.
pub(crate) fn circles(src: &Path) -> Vec<Vec<String>> {
    let mods = modules(src);
    let mut edges: BTreeMap<&ModPath, BTreeSet<&ModPath>> = BTreeMap::new();
    for (m, file) in &mods {
        let text = outside_tests(&scan(&fs::read_to_string(file).unwrap_or_default()).bare);
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
        .filter(|c| match c.as_slice() {
            [_] => false,
            [a, b] => !is_parent(a, b) && !is_parent(b, a),
            _ => true,
        })
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
        fs::create_dir_all(p.parent().unwrap_or(dir)).unwrap();
        fs::write(p, text).unwrap();
    }

    fn temp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("xtask-layout-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    fn paths(list: &[&[&str]]) -> Vec<ModPath> {
        list.iter()
            .map(|p| p.iter().map(|s| (*s).to_owned()).collect())
            .collect()
    }

    #[test]
    fn comments_blank_lines_and_docs_are_not_code() {
        let text = "//! The crate.\n\n/// A function.\nfn f() {} // trailing\n/* one\n   two */\n\
                    /* outer /* nested */ still a comment */\n    \n    let x = 1; /* c */\n";
        assert_eq!(code_lines(text), 2);
    }

    #[test]
    fn literals_that_look_like_comments_or_braces_are_code() {
        let text = "let a = \"// not a comment\";\nlet b = \"/* nor this\";\nlet c = '{';\n\
                    let d = '\\'';\nlet e = r#\"a \" quote, a } brace\n// and a line\"#;\n\
                    fn g<'a>(x: &'a str) -> char { '}' }\nlet h = br\"}\"; let i = b'\"';\n";
        assert_eq!(code_lines(text), 8);
        let bare = scan(text).bare;
        assert!(
            !bare.contains("not a comment") && !bare.contains("brace"),
            "{bare}"
        );
        assert!(bare.contains("fn g<'a>(x: &'a str)"), "{bare}");
    }

    #[test]
    fn an_inline_test_module_is_not_code_and_a_file_module_is_a_test_file() {
        let text = "fn a() {}\n\n#[cfg(test)]\n#[allow(clippy::unwrap_used)]\npub(crate) mod tests {\n\
                    use super::*;\n    const S: &str = r#\"}}}\"#;\n    #[test]\n    fn t() { a(); }\n}\n\
                    fn b() {}\n#[cfg(test)]\nmod more_tests;\n#[cfg(not(test))]\nmod real {}\n";
        assert_eq!(
            code_lines(text),
            4,
            "a, b, and the cfg(not(test)) module's two lines"
        );
        let found = test_modules(&tokens(&scan(text).bare));
        let names: Vec<_> = found.iter().map(|m| m.file.as_deref()).collect();
        assert_eq!(names, [None, Some("more_tests")]);
        assert_eq!((found[0].first, found[0].last), (2, 9));
    }

    #[test]
    fn files_below_a_test_module_declaration_are_test_files() {
        let d = temp("tests");
        write(
            &d,
            "src/lib.rs",
            "mod a;\nmod b;\n#[cfg(test)]\nmod tests;\n",
        );
        write(&d, "src/a.rs", "#[cfg(test)]\nmod a_tests;\n");
        write(&d, "src/a/a_tests.rs", "");
        write(&d, "src/b/mod.rs", "mod tests_b;\n");
        write(&d, "src/b/tests_b.rs", "");
        write(&d, "src/tests/mod.rs", "mod one;\n");
        write(&d, "src/tests/one.rs", "");
        let mut files = Vec::new();
        rust_files(&d, &mut files);
        let found: Vec<String> = test_files(&files).iter().map(|f| rel(&d, f)).collect();
        assert_eq!(
            found,
            ["src/a/a_tests.rs", "src/tests/mod.rs", "src/tests/one.rs"]
        );
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn a_module_and_its_parent_may_import_each_other_and_nothing_else_may() {
        let d = temp("circle");
        write(
            &d,
            "lib.rs",
            "pub mod a;\npub mod c;\npub mod foo;\npub mod p;\n",
        );
        // Siblings: a finding.
        write(
            &d,
            "a/mod.rs",
            "mod lru;\nmod request;\nmod tests_only;\nuse self::tests_only::T;\n",
        );
        write(&d, "a/lru.rs", "use super::request::Rank;\n");
        write(
            &d,
            "a/request.rs",
            "pub struct Rank;\nfn f() { super::lru::g(); }\n",
        );
        // `foo.rs` and its child, `p/mod.rs` and its child: allowed.
        write(&d, "foo.rs", "mod bar;\nuse self::bar::Y;\npub struct Z;\n");
        write(&d, "foo/bar.rs", "pub struct Y;\nuse super::Z;\n");
        write(
            &d,
            "p/mod.rs",
            "mod q;\nuse crate::p::q::r::W;\npub struct Z;\n",
        );
        write(&d, "p/q/mod.rs", "mod r;\nuse crate::p::Z;\n");
        // A grandchild and its grandparent: a finding.
        write(&d, "p/q/r.rs", "pub struct W;\nuse super::super::Z;\n");
        // A test module's `super::*` is its own file.
        write(
            &d,
            "a/tests_only.rs",
            "#[cfg(test)]\nmod tests {\n    use super::*;\n    use crate::a::lru::*;\n}\n",
        );
        // Comments, literals and visibilities name nothing.
        write(
            &d,
            "c.rs",
            "// crate::a::lru\nconst S: &str = \"crate::a::lru\";\npub(super) fn g() {}\n",
        );
        let found = circles(&d);
        assert_eq!(
            found,
            [
                vec!["a/lru.rs", "a/request.rs"],
                vec!["p/mod.rs", "p/q/r.rs"]
            ],
            "{found:?}"
        );
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn a_three_file_circle_is_found_even_through_a_parent() {
        let d = temp("three");
        write(&d, "lib.rs", "pub mod a;\npub mod b;\n");
        write(&d, "a/mod.rs", "mod x;\nuse crate::b::B;\npub struct A;\n");
        write(&d, "a/x.rs", "use super::A;\n");
        write(&d, "b.rs", "pub struct B;\nuse crate::a::x::X;\n");
        let found = circles(&d);
        assert_eq!(found, [vec!["a/mod.rs", "a/x.rs", "b.rs"]], "{found:?}");
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn groups_and_nested_groups_name_each_member() {
        let m: ModPath = vec!["x".into()];
        let got = named_paths("use crate::{a::{b, c}, d, self};", &m);
        assert_eq!(got, paths(&[&["a", "b"], &["a", "c"], &["d"], &[]]));
        let up = named_paths("super::super::y::Z", &["a".into(), "b".into()]);
        assert_eq!(up, paths(&[&["y", "Z"]]));
        let none = named_paths("pub(super) fn f(&self) { self.x; supervise(); }", &m);
        assert!(none.is_empty(), "{none:?}");
        let own = named_paths("self::child::T", &m);
        assert_eq!(own, paths(&[&["x", "child", "T"]]));
    }
}
