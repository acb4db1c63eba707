//! `include/kvtier.h` is what cbindgen generates from this crate today: a stale header fails
//! here. `KVTIER_BLESS=1 cargo test -p kvtier-ffi --test header` rewrites it.

use std::path::Path;

#[test]
fn committed_header_is_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header");
    let mut generated = Vec::new();
    bindings.write(&mut generated);
    let generated = String::from_utf8(generated).expect("the header is UTF-8");
    let path = dir.join("include/kvtier.h");
    if std::env::var_os("KVTIER_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write include/kvtier.h");
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "include/kvtier.h is stale: run `KVTIER_BLESS=1 cargo test -p kvtier-ffi --test header` \
         and commit the result"
    );
}
