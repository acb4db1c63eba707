//! `kvtier serve`: parses the options, starts [`crate::serve::start`] and serves until the
//! process is interrupted.

use std::thread;

use crate::serve::ServeOptions;
use crate::tier::Offloader;

use super::replay::ReplayArgs;
use crate::serve::start;
use crate::sizing::{CapacityOptions, PoolLayoutArg, parse_size_floor};

/// Options of `kvtier serve`: every `replay` option, plus where to listen and how fast to go.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ServeArgs {
    /// The replay.
    #[command(flatten)]
    pub replay: ReplayArgs,
    /// Where `/metrics` listens (loopback unless told otherwise).
    #[arg(long, default_value = "127.0.0.1:8000", value_name = "ADDR")]
    pub listen: String,
    /// Requests per second of the replay (default: as fast as it goes).
    #[arg(long, value_name = "R")]
    pub rate: Option<f64>,
    /// Milliseconds between two exports of the collected stats.
    #[arg(long, default_value_t = 200, value_name = "MS")]
    pub export_interval_ms: u64,
    /// GPU memory for the KV cache per worker (as `kvtier capacity --memory`): with the
    /// model (`--model`, `--layout` or `--hf-config`), `vllm:cache_config_info` is served with
    /// the GPU blocks, `kv_cache_size_tokens` and `kv_cache_max_concurrency` that `kvtier
    /// capacity` prints for them.
    #[arg(long, value_name = "SIZE", value_parser = parse_size_floor, allow_hyphen_values = true)]
    pub gpu_memory: Option<u64>,
    /// Tokens per GPU block, for `vllm:cache_config_info` (as `kvtier capacity --block-size`).
    #[arg(long, default_value_t = 16, value_name = "N")]
    pub gpu_block_size: u32,
    /// Longest request in tokens, for `vllm:cache_config_info` (as `kvtier capacity
    /// --max-model-len`; default: the layout's).
    #[arg(long, value_name = "N")]
    pub max_model_len: Option<u64>,
}

impl ServeArgs {
    /// What these options ask to serve.
    #[must_use]
    pub(crate) fn options(&self) -> ServeOptions {
        let offloader = self.replay.tier.offloader;
        let simple = offloader == Offloader::Simple;
        let gpu = self.gpu_options();
        let mut replay = self.replay.replay_options();
        if simple && replay.gpu.is_none() {
            // `--gpu-memory` with a model: the engine gets the GPU blocks `kvtier capacity`
            // prints (a sizing error is reported when serving starts).
            let blocks = gpu
                .as_ref()
                .and_then(|g| crate::sizing::report(g).ok())
                .and_then(|r| r.num_blocks)
                .and_then(|n| u32::try_from(n).ok());
            replay.gpu = blocks.map(|num_gpu_blocks| crate::replay::GpuFront {
                num_gpu_blocks,
                engine: self.replay.engine,
            });
        }
        ServeOptions {
            replay,
            model_name: self.replay.model_name.clone(),
            listen: self.listen.clone(),
            rate: self.rate,
            export_interval_ms: self.export_interval_ms,
            gpu,
            offloader,
            simple: self.replay.simple_options(),
        }
    }
}

impl ServeArgs {
    /// The GPU to size `vllm:cache_config_info` with, when `--gpu-memory`, or `--gpu-blocks`
    /// with a model, is given: the replay's model and these options, as `kvtier capacity`
    /// takes them.
    fn gpu_options(&self) -> Option<CapacityOptions> {
        let gpu_blocks = self.replay.gpu_blocks.map(u64::from);
        // `--gpu-blocks` alone (no model) is the replay's GPU front only.
        let model = self.replay.options.transfer.source.is_given();
        if self.gpu_memory.is_none() && (gpu_blocks.is_none() || !model) {
            return None;
        }
        Some(CapacityOptions {
            source: self.replay.options.transfer.source.clone(),
            memory: self.gpu_memory,
            num_gpu_blocks_override: gpu_blocks,
            block_size: self.gpu_block_size,
            max_model_len: self.max_model_len,
            // `kvtier capacity`'s defaults for the rest.
            max_num_batched_tokens: None,
            max_concurrent_batches: None,
            disable_hybrid_kv_cache_manager: false,
            workers: 1,
            pool_layout: PoolLayoutArg::LayerOutermost,
            cpu_bytes: None,
            blocks_per_chunk: 1,
            world_size: 1,
        })
    }
}

/// Runs `kvtier serve`: serves until the process is interrupted.
///
/// # Errors
/// Any error of starting or of the replay.
pub(crate) fn run(args: &ServeArgs) -> Result<(), crate::Error> {
    let mut serving = start(&args.options())?;
    eprintln!(
        "kvtier serve: metrics at http://{}/metrics",
        serving.local_addr()
    );
    if let Some(p) = serving.kv_events() {
        eprintln!(
            "kvtier serve: kv events on {} (replay {})",
            p.endpoint(),
            p.replay_endpoint().unwrap_or("none")
        );
    }
    let summary = serving.wait_replay()?;
    if let Some(s) = summary.simple {
        eprintln!(
            "kvtier serve: replay done ({} engine steps, {} requests finished, {} blocks \
             loaded, {} CPU blocks cached of {}); serving until interrupted",
            s.engine.steps, s.engine.finished, s.load_blocks, s.cached_blocks, summary.capacity
        );
        loop {
            thread::park();
        }
    }
    let c = summary.counts;
    eprintln!(
        "kvtier serve: replay done ({} requests, {} hit blocks of {}, {} stored, {} evicted); \
         serving until interrupted",
        c.requests, c.hit_blocks, c.request_blocks, c.stored_blocks, c.evicted_blocks
    );
    loop {
        thread::park();
    }
}
