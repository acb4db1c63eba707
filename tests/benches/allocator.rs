//! Benchmarks (divan). Run with `cargo bench -p kvtier-tests --bench NAME`.

fn main() {
    divan::main();
}
