//! The C ABI from C and C++: `examples/replay.c` built with the system C compiler against
//! `libkvtier_ffi.a` reproduces vLLM 0.33.0's replay digests (`tests/data/expected.tsv`), also
//! under valgrind and AddressSanitizer; `tests/c/misuse.c` gets the documented statuses for
//! misuse; `tests/c/cpp_smoke.cpp` uses the header from C++.
//!
//! The parts that need valgrind, the ASan runtime or a C++ compiler are `#[ignore]`d with the
//! reason (Debian packages: `valgrind`; `libasan8`, which `gcc` pulls in; `g++`); `cargo xtask
//! test` installs those and runs them, and there a missing tool fails the test.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const HOW_TO_RUN: &str = "`cargo xtask test` installs it";

fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The static library cargo built for this test: `<target>/<profile>/deps/libkvtier_ffi.a`,
/// next to the test binary (the lib is compiled with all its crate types, `staticlib` included).
fn static_lib() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let deps = exe
        .parent()
        .expect("the test binary sits in <target>/<profile>/deps");
    let lib = deps.join("libkvtier_ffi.a");
    assert!(
        lib.is_file(),
        "{} is missing: cargo builds it with the crate's staticlib type",
        lib.display()
    );
    lib
}

fn out_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kvtier-ffi-c");
    std::fs::create_dir_all(&dir).expect("create the C build directory");
    dir
}

fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

fn has(tool: &str) -> bool {
    Command::new(tool).arg("--version").output().is_ok()
}

/// Compiles `sources` against the header and the static library into `out_dir()/name`.
fn compile(
    compiler: &str,
    sources: &[&Path],
    name: &str,
    extra: &[&str],
) -> Result<PathBuf, String> {
    let exe = out_dir().join(name);
    let mut cmd = Command::new(compiler);
    cmd.args(["-Wall", "-Wextra", "-Werror", "-O1", "-g"])
        .args(extra)
        .args(sources)
        .arg("-I")
        .arg(manifest_dir().join("include"))
        .arg(static_lib())
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&exe);
    let out = run(&mut cmd);
    if out.status.success() {
        Ok(exe)
    } else {
        Err(format!(
            "{cmd:?} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn replay_c() -> PathBuf {
    manifest_dir().join("examples/replay.c")
}

fn data(name: &str) -> PathBuf {
    manifest_dir().join("../../tests/data").join(name)
}

/// One row of `expected.tsv`, as `(column, value)` pairs.
fn expected_rows() -> Vec<Vec<(String, String)>> {
    let text = std::fs::read_to_string(data("expected.tsv")).expect("expected.tsv");
    let mut lines = text.lines();
    let header: Vec<String> = lines
        .next()
        .expect("a header line")
        .split('\t')
        .map(str::to_owned)
        .collect();
    lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            header
                .iter()
                .cloned()
                .zip(l.split('\t').map(str::to_owned))
                .collect()
        })
        .collect()
}

fn col<'a>(row: &'a [(String, String)], name: &str) -> &'a str {
    row.iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("column {name}"))
}

/// What replay printed: the digest (stdout) and the `key=value` counts (stderr).
struct Replayed {
    digest: String,
    counts: Vec<(String, String)>,
}

fn replay(prefix: &[&str], exe: &Path, args: &[&str]) -> Replayed {
    let (program, pre) = match prefix.split_first() {
        Some((p, rest)) => (*p, rest),
        None => (exe.to_str().expect("a UTF-8 path"), &[][..]),
    };
    let mut cmd = Command::new(program);
    cmd.args(pre);
    if !prefix.is_empty() {
        cmd.arg(exe);
    }
    let out = run(cmd.args(args));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "{cmd:?} exited with {}:\n{stderr}",
        out.status
    );
    let counts = stderr
        .lines()
        .last()
        .unwrap_or("")
        .split(' ')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    Replayed {
        digest: String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        counts,
    }
}

#[test]
fn replay_c_matches_every_expected_row() {
    let exe =
        compile("cc", &[&replay_c()], "replay", &["-std=c11"]).unwrap_or_else(|e| panic!("{e}"));
    let rows = expected_rows();
    assert_eq!(rows.len(), 9, "expected.tsv has nine rows");
    for row in &rows {
        let trace = data(col(row, "trace"));
        let threshold = match col(row, "store_threshold") {
            "-" => "0",
            t => t,
        };
        let args = [
            trace.to_str().expect("a UTF-8 path"),
            col(row, "capacity"),
            col(row, "policy"),
            threshold,
        ];
        let got = replay(&[], &exe, &args);
        assert_eq!(got.digest, col(row, "digest"), "digest of {args:?}");
        for name in [
            "requests",
            "request_blocks",
            "hit_blocks",
            "hit_requests",
            "stored_blocks",
            "evicted_blocks",
            "store_failures",
            "stopped_at_pending",
            "resident_blocks",
        ] {
            assert_eq!(col(&got.counts, name), col(row, name), "{name} of {args:?}");
        }
    }
}

#[test]
fn replay_c_defaults_to_the_header_capacity_and_lru() {
    let exe = compile("cc", &[&replay_c()], "replay-defaults", &["-std=c11"])
        .unwrap_or_else(|e| panic!("{e}"));
    // small-a's header says capacity=1024, small-b's 4096: the LRU rows at those capacities.
    for (trace, digest) in [
        ("small-a.kvtrace", "bcfa623160a0a602"),
        ("small-b.kvtrace", "4c8ee1ba563a8b5a"),
    ] {
        let path = data(trace);
        let got = replay(&[], &exe, &[path.to_str().expect("a UTF-8 path")]);
        assert_eq!(got.digest, digest, "{trace} with the defaults");
    }
}

#[test]
fn replay_c_rejects_malformed_traces_naming_the_line() {
    let exe = compile("cc", &[&replay_c()], "replay-errors", &["-std=c11"])
        .unwrap_or_else(|e| panic!("{e}"));
    let cases: [(&str, &str); 6] = [
        ("# format=kvtrace v1\nL 0 2 00000000000000aa\n", "line 2:"),
        (
            "# format=kvtrace v1\nL 0 1 00000000000000AA\n",
            "line 2: bad hash 0",
        ),
        (
            "# format=kvtrace v1\nS 4\n",
            "line 2: request 4 is not open",
        ),
        (
            "# format=kvtrace v1\nL 0 1 00000000000000aa\nC 0\n",
            "line 3: request 0: records out of order",
        ),
        (
            "# format=kvtrace v1\nL 0 1 00000000000000aa\n",
            "left open at the end",
        ),
        ("# format=kvtrace v2\n", "line 1: not a kvtrace v1 file"),
    ];
    for (i, (text, want)) in cases.iter().enumerate() {
        let path = out_dir().join(format!("bad-{i}.kvtrace"));
        std::fs::write(&path, text).expect("write the trace");
        let out = run(Command::new(&exe).arg(&path).arg("8"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{text:?}: {stderr}");
        assert!(stderr.contains(want), "{text:?}: {stderr}");
    }
}

#[test]
#[ignore = "needs valgrind (Debian package valgrind); run via `cargo xtask test`"]
fn replay_c_is_clean_under_valgrind() {
    assert!(
        has("valgrind"),
        "valgrind not found (Debian package valgrind); {HOW_TO_RUN}"
    );
    let exe =
        compile("cc", &[&replay_c()], "replay-vg", &["-std=c11"]).unwrap_or_else(|e| panic!("{e}"));
    let vg = ["valgrind", "--leak-check=full", "--error-exitcode=1", "-q"];
    let trace = data("small-a.kvtrace");
    let trace = trace.to_str().expect("a UTF-8 path");
    let lru = replay(&vg, &exe, &[trace]);
    assert_eq!(lru.digest, "bcfa623160a0a602");
    let arc = replay(&vg, &exe, &[trace, "1024", "arc"]);
    assert_eq!(arc.digest, "ed0627a5d61e3ddc");
}

/// Whether the compiler links an ASan program (the runtime, libasan, is present).
fn has_asan() -> bool {
    let src = out_dir().join("asan-probe.c");
    std::fs::write(&src, "int main(void) { return 0; }\n").expect("write the probe");
    let exe = out_dir().join("asan-probe");
    run(Command::new("cc")
        .arg("-fsanitize=address")
        .arg(&src)
        .arg("-o")
        .arg(&exe))
    .status
    .success()
        && run(&mut Command::new(&exe)).status.success()
}

#[test]
#[ignore = "needs the ASan runtime (Debian package libasan8); run via `cargo xtask test`"]
fn replay_c_is_clean_under_address_sanitizer() {
    assert!(
        has_asan(),
        "the ASan runtime not found (Debian package libasan8, from gcc); {HOW_TO_RUN}"
    );
    let exe = compile(
        "cc",
        &[&replay_c()],
        "replay-asan",
        &["-std=c11", "-fsanitize=address", "-fno-omit-frame-pointer"],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let trace = data("small-a.kvtrace");
    let trace = trace.to_str().expect("a UTF-8 path");
    // Leak checking is on by default; any report exits non-zero.
    let lru = replay(&[], &exe, &[trace]);
    assert_eq!(lru.digest, "bcfa623160a0a602");
    let arc = replay(&[], &exe, &[trace, "1024", "arc"]);
    assert_eq!(arc.digest, "ed0627a5d61e3ddc");
}

/// `tests/c/misuse.c` run by `cmd` (the program itself, or under valgrind) passes its checks.
fn misuse_passes(how: &str, mut cmd: Command) {
    let out = run(&mut cmd);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "misuse ({how}) failed:\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("checks passed"), "{how}: {stdout}");
}

/// `tests/c/misuse.c` compiled under its own name (tests run in parallel).
fn misuse_exe(name: &str) -> PathBuf {
    let src = manifest_dir().join("tests/c/misuse.c");
    compile("cc", &[&src], name, &["-std=c11"]).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn misuse_from_c_returns_the_documented_statuses() {
    misuse_passes("plain", Command::new(misuse_exe("misuse")));
}

#[test]
#[ignore = "needs valgrind (Debian package valgrind); run via `cargo xtask test`"]
fn misuse_from_c_is_clean_under_valgrind() {
    assert!(
        has("valgrind"),
        "valgrind not found (Debian package valgrind); {HOW_TO_RUN}"
    );
    let mut vg = Command::new("valgrind");
    vg.args(["--leak-check=full", "--error-exitcode=1", "-q"])
        .arg(misuse_exe("misuse-vg"));
    misuse_passes("valgrind", vg);
}

#[test]
#[ignore = "needs a C++ compiler (Debian package g++); run via `cargo xtask test`"]
fn the_header_works_from_cpp() {
    assert!(
        has("c++"),
        "c++ not found (Debian package g++); {HOW_TO_RUN}"
    );
    let src = manifest_dir().join("tests/c/cpp_smoke.cpp");
    let exe =
        compile("c++", &[&src], "cpp-smoke", &["-std=c++17"]).unwrap_or_else(|e| panic!("{e}"));
    let out = run(&mut Command::new(&exe));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout.trim(), "c++: stored 2 in slots 0,1; lookup hit");
}

/// The README's "Use from C" snippet compiles, links with the README's line and runs.
#[test]
fn the_readme_c_snippet_compiles_and_runs() {
    let readme = std::fs::read_to_string(manifest_dir().join("../../README.md")).expect("README");
    let section = readme
        .split("## Use from C")
        .nth(1)
        .expect("a \"Use from C\" section");
    let snippet = section
        .split("```c\n")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .expect("a C block");
    let (includes, body): (Vec<&str>, Vec<&str>) =
        snippet.lines().partition(|l| l.starts_with("#include"));
    let program = format!(
        "#include <stdio.h>\n{}\nint main(void) {{\n{}\n    return rc == KVTIER_OK ? 0 : 1;\n}}\n",
        includes.join("\n"),
        body.join("\n")
    );
    let src = out_dir().join("readme.c");
    std::fs::write(&src, program).expect("write readme.c");
    let exe = compile("cc", &[&src], "readme", &["-std=c11"]).unwrap_or_else(|e| panic!("{e}"));
    let out = run(&mut Command::new(&exe));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
