//! The simple offloader's replay of `small-a` driven call by call through the engine model,
//! for the tests that compare a command (`replay`, `serve`, the KV-events stream) with the
//! same steps taken by hand: the engine of `--gpu-blocks 300 --max-num-seqs 32
//! --decode-tokens 8`, the offloader of `--offloader simple`, and the trace read here, apart
//! from kvtier's parser.

#![allow(
    clippy::unwrap_used,
    clippy::cast_possible_truncation,
    reason = "test fixture: a failed unwrap is a failed test; small numbers"
)]

use kvtier_cli::engine::{Connector, Engine, EngineConfig};
use kvtier_cli::trace::Record;
use kvtier_core::simple::SimpleConfig;

/// The shared trace these runs replay.
pub const SMALL_A: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/data/small-a.kvtrace");
/// GPU blocks of the engine (`--gpu-blocks 300`).
pub const GPU_BLOCKS: u32 = 300;
/// Tokens per block (the command's default).
pub const BLOCK_TOKENS: u32 = 16;

/// `SMALL_A`'s requests, one hash list per `L` record (hex hashes after the record's kind,
/// request id and block count).
#[must_use]
pub fn small_a_requests() -> Vec<Vec<u64>> {
    std::fs::read_to_string(SMALL_A)
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("L "))
        .map(|l| {
            l.split(' ')
                .skip(3)
                .map(|h| u64::from_str_radix(h, 16).unwrap())
                .collect()
        })
        .collect()
}

/// The engine of `--gpu-blocks 300 --max-num-seqs 32 --decode-tokens 8`.
#[must_use]
pub fn engine() -> Engine {
    let mut cfg = EngineConfig::new(GPU_BLOCKS, BLOCK_TOKENS);
    cfg.max_num_seqs = 32;
    cfg.decode_tokens = 8;
    Engine::new(cfg).unwrap()
}

/// The offloader of `--offloader simple` with `cpu_blocks` CPU blocks (`--lazy` when `lazy`)
/// in front of [`engine`]'s GPU.
#[must_use]
pub fn offloader_config(cpu_blocks: u32, lazy: bool) -> SimpleConfig {
    let mut sc = SimpleConfig::with_cpu_blocks(BLOCK_TOKENS, GPU_BLOCKS, cpu_blocks);
    sc.lazy_offload = lazy;
    sc.max_num_batched_tokens = 8192;
    sc
}

/// Every request of `requests` through `engine` and the connector `tier`, in order, then the
/// engine's end (its last requests finish; an offloader may still hold transfers).
pub fn feed<C: Connector>(engine: &mut Engine, tier: &mut C, requests: &[Vec<u64>])
where
    C::Error: core::fmt::Debug,
{
    for (rid, hashes) in requests.iter().enumerate() {
        let rec = Record::Load {
            rid: rid as u64,
            hashes,
        };
        engine.apply(rec, tier).unwrap();
    }
    engine.finish(tier).unwrap();
}
