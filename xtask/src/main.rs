//! kvtier's task runner (`cargo xtask …`, an alias in `.cargo/config.toml`).
//!
//! `cargo xtask test` is the README's test command. It first provisions what the tests need
//! beyond cargo — external programs such as Prometheus and QEMU (Debian packages), extra rustup
//! targets — then runs every test of the workspace, the ones `#[ignore]`d for lack of such a
//! program included, and the suites that are not cargo tests. Plain `cargo test --workspace`
//! stays green on a machine without those programs: it reports each of those tests as
//! `ignored, needs …`.
//!
//! Why an xtask and not a shell script: it is the convention Rust users look for (`cargo xtask`),
//! it needs nothing but cargo to start, and it keeps the list of external needs in one typed
//! table ([`NEEDS`]) next to the code that checks them.

use std::env;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

mod layout;
mod links;

/// How a need is checked.
#[derive(Clone, Copy, Debug)]
#[allow(
    dead_code,
    reason = "each kind of check is used as soon as a need of that kind is listed"
)]
enum Check {
    /// A program on `PATH`.
    Program(&'static str),
    /// An installed Debian package (for libraries, which have no program to look for).
    DebPackage(&'static str),
    /// A rustup target of the active toolchain.
    RustTarget(&'static str),
}

/// Something a test needs that cargo does not fetch.
#[derive(Clone, Copy, Debug)]
struct Need {
    /// How to tell whether it is there.
    check: Check,
    /// The Debian package that provides it (none for rustup targets).
    deb: Option<&'static str>,
    /// Which tests need it.
    used_by: &'static str,
}

/// Everything the tests need beyond cargo, in one place.
const NEEDS: &[Need] = &[
    Need {
        check: Check::Program("promtool"),
        deb: Some("prometheus"),
        used_by: "tests/tests/stats/export.rs (promtool check metrics)",
    },
    Need {
        check: Check::Program("prometheus"),
        deb: Some("prometheus"),
        used_by: "tests/tests/serve/serve.rs, dashboard.rs (a real Prometheus scrapes kvtier serve)",
    },
    Need {
        check: Check::Program("valgrind"),
        deb: Some("valgrind"),
        used_by: "std-adapter/ffi/tests/c_example.rs (the C example and misuse under valgrind)",
    },
    Need {
        check: Check::DebPackage("libasan8"),
        deb: Some("libasan8"),
        used_by: "std-adapter/ffi/tests/c_example.rs (the C example under AddressSanitizer)",
    },
    Need {
        check: Check::Program("c++"),
        deb: Some("g++"),
        used_by: "std-adapter/ffi/tests/c_example.rs (the header from C++)",
    },
    Need {
        check: Check::Program("qemu-system-arm"),
        deb: Some("qemu-system-arm"),
        used_by: "tests/tests/manager/cortex_m.rs (the firmware on an emulated Cortex-M4)",
    },
    Need {
        check: Check::RustTarget("thumbv7em-none-eabihf"),
        deb: None,
        used_by: "tests/tests/manager/cortex_m.rs (the firmware's target)",
    },
    Need {
        check: Check::RustTarget("i686-unknown-linux-gnu"),
        deb: None,
        used_by: "the 32-bit suite (cargo test --target i686-unknown-linux-gnu)",
    },
    Need {
        check: Check::Program("python3"),
        deb: Some("python3-venv"),
        used_by: "std-adapter/python/tests/run.sh (the vLLM plugin's tests, in a venv)",
    },
    Need {
        check: Check::DebPackage("gcc-multilib"),
        deb: Some("gcc-multilib"),
        used_by: "the 32-bit suite (linking i686 test binaries)",
    },
    Need {
        check: Check::Program("c++"),
        deb: Some("g++"),
        used_by: "the kvtier package's zmq dependency (zmq-sys builds libzmq from source)",
    },
    Need {
        check: Check::DebPackage("g++-multilib"),
        deb: Some("g++-multilib"),
        used_by: "the 32-bit suite (zmq-sys builds libzmq for i686)",
    },
];

/// The suites run after `cargo test --workspace`: a name and the command (`cargo` means the
/// cargo that runs this task), run from the workspace root. Each exits non-zero on failure.
const SUITES: &[(&str, &[&str])] = &[
    (
        "32-bit host: the core's tests at i686 (every usize-width path at 32 bits)",
        &["cargo", "test", "-p", "kvtier-core", "--target", I686],
    ),
    (
        "32-bit host: the scenario, model and replay tests at i686",
        &[
            "cargo",
            "test",
            "-p",
            "kvtier-tests",
            "--target",
            I686,
            "--test",
            "manager",
            "--test",
            "capacity",
            "--test",
            "stats",
            "--test",
            "replay",
            "--",
            // The modules of the 32-bit suite (their binaries hold others, run on the host).
            "manager_scenarios::",
            "manager_model::",
            "manager_errors::",
            "allocator_model::",
            "free_queue::",
            "block_pool::",
            "capacity::",
            "capacity_props::",
            "stats_scenarios::",
            "stats_props::",
            "wire_props::",
            "replay_expected::",
        ],
    ),
    (
        "32-bit host: the manager's memory budget at i686 (its own counting allocator)",
        &[
            "cargo",
            "test",
            "-p",
            "kvtier-tests",
            "--target",
            I686,
            "--test",
            "manager_memory",
        ],
    ),
    (
        "the vLLM plugin: the Python suite against vLLM 0.33.0's own modules (a venv in target/pyenv; the differential test included)",
        &[PYTHON_SUITE],
    ),
];

const I686: &str = "i686-unknown-linux-gnu";

fn main() -> ExitCode {
    let args: Vec<OsString> = env::args_os().skip(1).collect();
    let (command, rest) = match args.split_first() {
        Some((c, rest)) => (c.to_string_lossy().into_owned(), rest.to_vec()),
        None => (String::from("help"), Vec::new()),
    };
    let result = match command.as_str() {
        "test" => test(&rest),
        "provision" => provision(rest.iter().any(|a| a == "--check")),
        "layout" => layout::check(&root()).and(links::check(&root())),
        "help" | "--help" | "-h" => {
            print_help();
            Ok(())
        }
        other => Err(format!(
            "unknown task `{other}`; `cargo xtask help` lists the tasks"
        )),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask: {message}");
            ExitCode::FAILURE
        }
    }
}

fn print_help() {
    println!(
        "cargo xtask test [--no-provision] [-- ARGS]
    Provision what the tests need beyond cargo (Debian packages via apt-get when run as
    root, rustup targets), then run `cargo test --workspace -- --include-ignored ARGS` and the
    suites that are not cargo tests. --no-provision only checks and fails on what is missing.
cargo xtask provision [--check]
    Install (or with --check only list) what the tests need beyond cargo.
cargo xtask layout
    Check the house rules no compiler checks: no source file under core/ or std-adapter/ over
    600 lines of code (comments, blank lines and #[cfg(test)] modules not counted), no import
    circle but a module and its parent, the std adapter `kvtier` free of the command's crates
    (clap, plotters, dejavu, indicatif, serde_json); every relative Markdown link and every
    docs/ or spec/ path named in the tree resolves.

What the tests need beyond cargo:"
    );
    for need in NEEDS {
        println!("    {:<32} {}", describe(need.check), need.used_by);
    }
}

/// The workspace root (this crate's parent folder).
fn root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .map_or_else(|| manifest.to_path_buf(), Path::to_path_buf)
}

fn cargo() -> OsString {
    env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"))
}

fn test(args: &[OsString]) -> Result<(), String> {
    START.get_or_init(std::time::Instant::now);
    let no_provision = args.iter().any(|a| a == "--no-provision");
    let passthrough: Vec<&OsString> = args.iter().skip_while(|a| *a != "--").skip(1).collect();
    provision(no_provision)?;

    let mut failed = Vec::new();
    let mut prepare = Prepare::start();
    step("cargo test --workspace -- --include-ignored");
    let status = Command::new(cargo())
        .current_dir(root())
        .args(["test", "--workspace", "--", "--include-ignored"])
        .args(passthrough)
        .status()
        .map_err(|e| format!("could not run cargo: {e}"))?;
    if !status.success() {
        failed.push(String::from("cargo test"));
    }
    for (name, argv) in SUITES {
        step(name);
        let Some((program, program_args)) = argv.split_first() else {
            continue;
        };
        if *program == PYTHON_SUITE {
            prepare.wait();
        }
        let program = if *program == "cargo" {
            cargo()
        } else {
            root().join(program).into_os_string()
        };
        let status = Command::new(&program)
            .current_dir(root())
            .args(program_args.iter())
            .status()
            .map_err(|e| format!("could not run {}: {e}", program.to_string_lossy()))?;
        if !status.success() {
            failed.push((*name).to_string());
        }
    }
    if failed.is_empty() {
        println!("\nxtask: every suite passed");
        Ok(())
    } else {
        Err(format!("failed: {}", failed.join(", ")))
    }
}

/// The Python suite's runner, and what it needs fetched first (the venv, vLLM's tests).
const PYTHON_SUITE: &str = "std-adapter/python/tests/run.sh";
const PYTHON_PREPARE: &str = "std-adapter/python/tests/prepare.sh";

/// The Python suite's downloads (a venv with vLLM's wheel, vLLM's source distribution), run in
/// the background from the first step so that they overlap the Rust tests' compiling instead
/// of following it. The suite's own runner takes the same idempotent steps again, so a failed
/// or skipped preparation only costs the overlap: the runner then fails with its own message.
struct Prepare {
    child: Option<std::process::Child>,
    log: PathBuf,
}

impl Prepare {
    fn start() -> Self {
        let log = root().join("target").join("python-prepare.log");
        let child = std::fs::create_dir_all(root().join("target"))
            .and_then(|()| std::fs::File::create(&log))
            .and_then(|out| {
                let err = out.try_clone()?;
                Command::new(root().join(PYTHON_PREPARE))
                    .current_dir(root())
                    .stdin(std::process::Stdio::null())
                    .stdout(out)
                    .stderr(err)
                    .spawn()
            });
        match child {
            Ok(child) => {
                println!(
                    "    preparing the Python suite in the background (log: {})",
                    log.display()
                );
                Self {
                    child: Some(child),
                    log,
                }
            }
            Err(e) => {
                println!("    could not start {PYTHON_PREPARE} in the background: {e}");
                Self { child: None, log }
            }
        }
    }

    /// Waits for the preparation; says so when it failed (the suite's runner retries).
    fn wait(&mut self) {
        if let Some(mut child) = self.child.take() {
            match child.wait() {
                Ok(status) if status.success() => {}
                Ok(status) => println!(
                    "    the background preparation failed ({status}; log: {}): the suite \
                     prepares again",
                    self.log.display()
                ),
                Err(e) => println!("    could not wait for the background preparation: {e}"),
            }
        }
    }
}

impl Drop for Prepare {
    fn drop(&mut self) {
        self.wait();
    }
}

/// When the first step began: each step prints the seconds since, so a slow run shows where
/// its time went.
static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

fn step(what: &str) {
    let seconds = START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_secs();
    println!("\n==> [{seconds} s] {what}");
}

fn describe(check: Check) -> String {
    match check {
        Check::Program(p) => format!("program `{p}`"),
        Check::DebPackage(p) => format!("Debian package `{p}`"),
        Check::RustTarget(t) => format!("rustup target `{t}`"),
    }
}

fn is_present(check: Check) -> bool {
    match check {
        Check::Program(p) => program_on_path(p),
        Check::DebPackage(p) => Command::new("dpkg-query")
            .args(["-W", "-f=${Status}", p])
            .output()
            .is_ok_and(|o| o.status.success() && o.stdout.ends_with(b"install ok installed")),
        Check::RustTarget(t) => installed_rust_targets().iter().any(|x| x == t),
    }
}

fn program_on_path(program: &str) -> bool {
    env::var_os("PATH").is_some_and(|paths| {
        env::split_paths(&paths).any(|dir| {
            let candidate = dir.join(program);
            candidate.is_file()
                && std::fs::metadata(&candidate).is_ok_and(|m| {
                    use std::os::unix::fs::PermissionsExt;
                    m.permissions().mode() & 0o111 != 0
                })
        })
    })
}

fn installed_rust_targets() -> Vec<String> {
    Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// Checks every need and installs what is missing (unless `check_only`).
fn provision(check_only: bool) -> Result<(), String> {
    step("provision: what the tests need beyond cargo");
    let missing: Vec<&Need> = NEEDS.iter().filter(|n| !is_present(n.check)).collect();
    for need in NEEDS {
        let state = if missing.iter().any(|m| std::ptr::eq(*m, need)) {
            "missing"
        } else {
            "ok"
        };
        println!(
            "    {:<8} {:<32} {}",
            state,
            describe(need.check),
            need.used_by
        );
    }
    if missing.is_empty() {
        return Ok(());
    }
    let targets: Vec<&str> = missing
        .iter()
        .filter_map(|n| match n.check {
            Check::RustTarget(t) => Some(t),
            _ => None,
        })
        .collect();
    let mut debs: Vec<&str> = missing.iter().filter_map(|n| n.deb).collect();
    debs.sort_unstable();
    debs.dedup();
    if check_only {
        return Err(format!(
            "missing: {}; `cargo xtask provision` installs them{}",
            missing
                .iter()
                .map(|n| describe(n.check))
                .collect::<Vec<_>>()
                .join(", "),
            apt_hint(&debs)
        ));
    }
    if !targets.is_empty() {
        run("rustup", &[&["target", "add"], targets.as_slice()].concat())?;
    }
    if !debs.is_empty() {
        install_debs(&debs)?;
    }
    let still: Vec<String> = NEEDS
        .iter()
        .filter(|n| !is_present(n.check))
        .map(|n| describe(n.check))
        .collect();
    if still.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "still missing after provisioning: {}",
            still.join(", ")
        ))
    }
}

fn apt_hint(debs: &[&str]) -> String {
    if debs.is_empty() {
        String::new()
    } else {
        format!(" (Debian: apt-get install -y {})", debs.join(" "))
    }
}

fn install_debs(debs: &[&str]) -> Result<(), String> {
    if !program_on_path("apt-get") {
        return Err(format!(
            "these Debian packages are missing and this machine has no apt-get: {}; install \
             their programs by hand, or run `cargo test --workspace`, which skips (and names) \
             the tests that need them",
            debs.join(", ")
        ));
    }
    let uid = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    if uid != "0" {
        return Err(format!(
            "missing Debian packages and not root: run `sudo apt-get install -y {}` once, then \
             `cargo xtask test` again",
            debs.join(" ")
        ));
    }
    println!("    installing: {}", debs.join(" "));
    let quiet_env = [("DEBIAN_FRONTEND", "noninteractive")];
    run_env("apt-get", &["update", "-qq"], &quiet_env)
        .map_err(|e| format!("{e}; is a Debian package mirror reachable from this machine?"))?;
    let mut args = vec!["install", "-y", "-qq", "--no-install-recommends"];
    args.extend_from_slice(debs);
    run_env("apt-get", &args, &quiet_env)
}

fn run(program: &str, args: &[&str]) -> Result<(), String> {
    run_env(program, args, &[])
}

fn run_env(program: &str, args: &[&str], envs: &[(&str, &str)]) -> Result<(), String> {
    let status = Command::new(program)
        .args(args)
        .envs(envs.iter().copied())
        .status()
        .map_err(|e| format!("could not run `{program}`: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`{program} {}` failed ({status})", args.join(" ")))
    }
}
