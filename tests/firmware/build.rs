//! Puts `memory.x` where cortex-m-rt's `link.x` finds it, and links with `link.x` (here rather
//! than in `.cargo/config.toml`, so a `RUSTFLAGS` from the environment cannot drop it).

use std::path::PathBuf;

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::copy("memory.x", out.join("memory.x")).expect("copy memory.x");
    println!("cargo:rustc-link-search={}", out.display());
    println!("cargo:rustc-link-arg=-Tlink.x");
    println!("cargo:rerun-if-changed=memory.x");
}
