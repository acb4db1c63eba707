//! The link and path check of `cargo xtask layout`: documentation that names a file the
//! repository does not hold fails here, not in a reader's hands.
//!
//! - Every relative link of a tracked Markdown file (`[text](path)`, `![alt](path)`, outside
//!   code blocks and code spans) resolves, from the file's folder, to a file or folder that
//!   exists.
//! - Every `docs/…` or `spec/…` path named anywhere in a tracked text file (code comments,
//!   scripts, Markdown, data headers) exists, from the repository root or from the naming
//!   file's folder.
//! - Every Markdown file under `docs/` with a Rust code block is included as a doctest by
//!   `tests/src/lib.rs`, so its blocks run like the README's.
//!
//! The files are those `git ls-files` lists (the whole tree outside `target/` and `.git/`
//! when git is not there).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Files larger than this are data, not documentation, and are not read.
const MAX_BYTES: u64 = 1 << 20;

/// The prefixes of the repository paths checked wherever they are named.
const NAMED_ROOTS: &[&str] = &["docs/", "spec/"];

/// The file that includes the `docs/` pages as doctests.
const DOCTESTS: &str = "tests/src/lib.rs";

/// Runs the checks from the repository root; the findings, one line each, on failure.
pub(crate) fn check(root: &Path) -> Result<(), String> {
    let findings = findings(root);
    if findings.is_empty() {
        println!(
            "links: every relative link and every named docs/ or spec/ path resolves; every \
             docs/ page with Rust blocks runs as a doctest"
        );
        Ok(())
    } else {
        Err(format!(
            "{} missing link target(s) or path(s):\n{}",
            findings.len(),
            findings.join("\n")
        ))
    }
}

/// Every finding, as `file:line: what`.
fn findings(root: &Path) -> Vec<String> {
    let doctests = fs::read_to_string(root.join(DOCTESTS)).unwrap_or_default();
    let mut findings = Vec::new();
    for rel in tracked_files(root) {
        let path = root.join(&rel);
        let Ok(meta) = fs::metadata(&path) else {
            continue;
        };
        if !meta.is_file() || meta.len() > MAX_BYTES {
            continue;
        }
        let Ok(text) = fs::read_to_string(&path) else {
            continue; // not text
        };
        let name = rel.to_string_lossy().replace('\\', "/");
        let dir = path.parent().unwrap_or(root);
        if name.ends_with(".md") {
            for (line, target) in markdown_links(&text) {
                if !dir.join(&target).exists() {
                    findings.push(format!("{name}:{line}: link to missing `{target}`"));
                }
            }
            if name.starts_with("docs/")
                && has_rust_block(&text)
                && !doctests.contains(&format!("../../{name}"))
            {
                findings.push(format!(
                    "{name}: has Rust code blocks but {DOCTESTS} does not include it as a doctest"
                ));
            }
        }
        for (line, named) in named_paths(&text) {
            let from_root = !named.starts_with("../") && root.join(&named).exists();
            if !from_root && !dir.join(&named).exists() {
                findings.push(format!("{name}:{line}: names missing `{named}`"));
            }
        }
    }
    findings.dedup(); // a path named twice on one line is one finding
    findings
}

/// The repository's files, relative to `root`.
fn tracked_files(root: &Path) -> Vec<PathBuf> {
    let out = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["ls-files", "-z"])
        .output();
    match out {
        Ok(out) if out.status.success() => out
            .stdout
            .split(|&b| b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| PathBuf::from(String::from_utf8_lossy(s).into_owned()))
            .collect(),
        _ => {
            let mut files = Vec::new();
            walk(root, root, &mut files);
            files
        }
    }
}

/// Every file under `dir` but `target/` and `.git/`, relative to `root`.
fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if name == "target" || name == ".git" {
            continue;
        }
        if path.is_dir() {
            walk(root, &path, out);
        } else if let Ok(rel) = path.strip_prefix(root) {
            out.push(rel.to_path_buf());
        }
    }
}

/// Whether a Markdown text has a code block rustdoc would run as Rust: a fence opened with
/// `rust` (with or without attributes) or with no language at all.
fn has_rust_block(text: &str) -> bool {
    let mut open = false;
    for line in text.lines() {
        let Some(info) = line.trim_start().strip_prefix("```") else {
            continue;
        };
        if !open {
            let lang = info.split([',', ' ']).next().unwrap_or("").trim();
            if lang.is_empty() || lang == "rust" {
                return true;
            }
        }
        open = !open;
    }
    false
}

/// The relative link targets of a Markdown text, with their 1-based lines: no URLs, no pure
/// anchors, the `#anchor` and any `"title"` cut off; code blocks and code spans skipped.
fn markdown_links(text: &str) -> Vec<(usize, String)> {
    let mut links = Vec::new();
    let mut in_fence = false;
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        let prose = without_code_spans(line);
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let Some(end) = rest.find(')') else {
                break;
            };
            let target = rest[..end].split_whitespace().next().unwrap_or("");
            let target = target.trim_start_matches('<').trim_end_matches('>');
            let target = target.split('#').next().unwrap_or("");
            let external = target.contains("://") || target.starts_with("mailto:");
            if !target.is_empty() && !external {
                links.push((i + 1, target.to_string()));
            }
            rest = &rest[end..];
        }
    }
    links
}

/// A line with its `code spans` blanked out.
fn without_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
            out.push(' ');
        } else if in_code {
            out.push(' ');
        } else {
            out.push(c);
        }
    }
    out
}

/// The `docs/…` and `spec/…` paths a text names, with their 1-based lines. A path starts
/// where the text is not already inside a word or a longer path (`kv_spec/`, `a/docs/` and
/// `https://…/docs/` are not named paths; one after `../` is, from the naming file's folder)
/// and runs over the characters of a file name; a trailing `.`, `,` or `:` is punctuation. A
/// bare folder is not a named path.
fn named_paths(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (i, line) in text.lines().enumerate() {
        for prefix in NAMED_ROOTS {
            let mut from = 0;
            while let Some(at) = line[from..].find(prefix) {
                let start = from + at;
                from = start + prefix.len();
                // A path after `../` is named from the file's folder: take the `../`s with it.
                let mut start = start;
                while line[..start].ends_with("../") {
                    start -= 3;
                }
                let before = line[..start].chars().next_back();
                if before.is_some_and(|c| c.is_alphanumeric() || "_-./\\".contains(c)) {
                    continue;
                }
                let len = line[start..]
                    .find(|c: char| !(c.is_alphanumeric() || "_-./".contains(c)))
                    .unwrap_or(line.len() - start);
                let path = line[start..start + len].trim_end_matches(['.', ',', ':']);
                if path.ends_with('/') || path.contains("...") {
                    continue; // a folder named as such (`docs/`), or an elided path
                }
                found.push((i + 1, path.to_string()));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_repository_names_only_files_it_holds() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("the workspace root");
        if let Err(findings) = check(root) {
            panic!("{findings}");
        }
    }

    // The paths below are built from `D` and `S`, so that this file names no missing path.
    const D: &str = "docs";
    const S: &str = "spec";

    #[test]
    fn links_are_found_outside_code_only() {
        let md = format!(
            "see [a]({D}/a.md#x) and [b](https://x/y) `[c](d.md)`\n```\n[e](f.md)\n```\n![g](h.png \"t\")"
        );
        let links: Vec<String> = markdown_links(&md).into_iter().map(|(_, l)| l).collect();
        assert_eq!(links, [format!("{D}/a.md"), "h.png".to_string()]);
    }

    #[test]
    fn named_paths_start_at_a_word_boundary() {
        let text = format!("see `{D}/e.md`, {S}/x.md: kv_{S}/y a/{D}/z https://h/{D}/w {D}/");
        let paths: Vec<String> = named_paths(&text).into_iter().map(|(_, p)| p).collect();
        assert_eq!(paths, [format!("{D}/e.md"), format!("{S}/x.md")]);
        let relative = format!("the conversion of ../{S}/m.md (defaults");
        let relative: Vec<String> = named_paths(&relative).into_iter().map(|(_, p)| p).collect();
        assert_eq!(relative, [format!("../{S}/m.md")]);
    }

    #[test]
    fn rust_blocks_are_fenced_rust_or_bare() {
        assert!(has_rust_block("```rust\nfn f() {}\n```"));
        assert!(has_rust_block("```\nfn f() {}\n```"));
        assert!(has_rust_block("```rust,no_run\nfn f() {}\n```"));
        assert!(!has_rust_block("```sh\nls\n```\n```text\nout\n```"));
    }
}
