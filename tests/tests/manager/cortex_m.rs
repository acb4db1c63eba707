//! The core on a microcontroller: builds `tests/firmware` for `thumbv7em-none-eabihf`, boots it
//! on QEMU's Cortex-M4 board (`mps2-an386`, semihosting) and checks its exit status and every
//! line it prints against the same shared functions run here on the host: each scenario port,
//! the allocator models' fixed sequence, the capacity check, and the 1,024-chunk workload's
//! counts and digest under LRU and ARC.
//!
//! `#[ignore]`d: it needs `qemu-system-arm` (Debian package `qemu-system-arm`) and the
//! `thumbv7em-none-eabihf` target, which `cargo xtask test` installs before it runs it (a
//! missing one fails the test there).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kvtier_core::manager::PolicyKind;
use kvtier_tests::{allocator_model, scenarios};

const TARGET: &str = "thumbv7em-none-eabihf";
const HOW_TO_RUN: &str = "`cargo xtask test` installs it";

fn firmware_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("firmware")
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned())
}

fn target_installed() -> bool {
    let out = Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .ok();
    let Some(out) = out.filter(|o| o.status.success()) else {
        return false;
    };
    let sysroot = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    Path::new(&sysroot)
        .join("lib/rustlib")
        .join(TARGET)
        .is_dir()
}

/// Builds the firmware images (release) and returns the directory holding them.
fn build() -> PathBuf {
    let dir = firmware_dir();
    let out = Command::new(cargo())
        .args(["build", "--release", "--target", TARGET])
        .current_dir(&dir)
        .output()
        .expect("run cargo build for the firmware");
    assert!(
        out.status.success(),
        "the firmware does not build:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| dir.join("target"));
    target_dir.join(TARGET).join("release")
}

/// Boots `image` under QEMU; returns its exit code and output. A run that does not finish in
/// five minutes (a hang) is killed and fails the test.
fn boot(image: &Path) -> (Option<i32>, String) {
    let mut child = Command::new("qemu-system-arm")
        .args(["-machine", "mps2-an386", "-cpu", "cortex-m4", "-nographic"])
        .args(["-semihosting-config", "enable=on,target=native", "-kernel"])
        .arg(image)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start qemu-system-arm");
    let deadline = Instant::now() + Duration::from_secs(300);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for qemu") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the firmware did not exit within 300 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = child.wait_with_output().expect("qemu's output");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (status.code(), text)
}

/// The workload line the firmware prints, from the host's run of the same function (the heap
/// figures, which depend on the pointer width, excluded).
fn workload_line(policy: PolicyKind) -> String {
    let (r, _) = scenarios::workload(policy, 1024, 3_000);
    format!(
        "workload {policy} chunks=1024 requests={} hit_blocks={} stored_blocks={} \
         evicted_blocks={} store_failures={} stopped_at_pending={} resident={} digest={:016x}",
        r.requests,
        r.hit_blocks,
        r.stored_blocks,
        r.evicted_blocks,
        r.store_failures,
        r.stopped_at_pending,
        r.resident,
        r.digest
    )
}

#[test]
#[ignore = "needs qemu-system-arm (Debian package) and the thumbv7em-none-eabihf target; run via `cargo xtask test`"]
fn firmware_runs_the_shared_checks_on_a_cortex_m4() {
    assert!(
        Command::new("qemu-system-arm")
            .arg("--version")
            .output()
            .is_ok(),
        "qemu-system-arm not found (Debian package qemu-system-arm); {HOW_TO_RUN}"
    );
    assert!(
        target_installed(),
        "the {TARGET} target is not installed (rustup target add {TARGET}); {HOW_TO_RUN}"
    );
    let images = build();
    let (code, out) = boot(&images.join("kvtier-firmware"));
    assert_eq!(code, Some(0), "the firmware failed:\n{out}");
    let lines: Vec<&str> = out.lines().map(str::trim_end).collect();
    let has = |want: &str| lines.contains(&want);

    for (name, _) in scenarios::ALL {
        let ok = format!("scenario {name} ok peak_heap=");
        assert!(
            lines.iter().any(|l| l.starts_with(&ok)),
            "scenario {name}:\n{out}"
        );
    }
    let seq = allocator_model::run_fixed_sequence(7, 24, 4_000).expect("the host run");
    let want = format!(
        "allocator_model steps={} slot_ok={} queue_ok={} checksum={:016x}",
        seq.steps, seq.slot_ok, seq.queue_ok, seq.checksum
    );
    assert!(has(&want), "want {want:?}:\n{out}");
    assert!(
        has("capacity llama-3-8b bytes_per_block=2097152 ok"),
        "{out}"
    );
    for policy in [PolicyKind::Lru, PolicyKind::Arc] {
        let want = workload_line(policy);
        let line = lines
            .iter()
            .find(|l| l.starts_with(&format!("workload {policy} ")))
            .unwrap_or_else(|| panic!("no {policy} workload line:\n{out}"));
        assert!(
            line.starts_with(&format!("{want} manager_heap=")),
            "firmware: {line}\nhost:     {want}"
        );
        println!("{line}");
    }
    assert_eq!(
        lines.last().copied(),
        Some("kvtier firmware: all checks passed"),
        "{out}"
    );

    // The minimal image: one 1,024-chunk LRU manager in a 96 KiB heap.
    let (code, out) = boot(&images.join("manager-1024"));
    assert_eq!(code, Some(0), "manager-1024 failed:\n{out}");
    let (r, _) = scenarios::workload(PolicyKind::Lru, 1024, 3_000);
    let want = format!(
        "manager_1024 lru digest={:016x} resident={} manager_heap=",
        r.digest, r.resident
    );
    assert!(out.trim_start().starts_with(&want), "want {want:?}:\n{out}");
    println!("{}", out.trim());
}
