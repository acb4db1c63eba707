//! The offloaders behind the GPU, shared by `kvtier replay`, `serve` and `sweep`.
//!
//! [`Offloader`] is the one seam: each command matches on it once and hands the run to its
//! child module for that offloader (`replay::simple`, `serve::simple`, `sweep::simple` for
//! [`Offloader::Simple`]; the command's own module for [`Offloader::Offloading`]). What the
//! offloaders share lives here: the flags that choose one ([`OffloaderArgs`]), the simple
//! offloader's options ([`SimpleOptions`]), each offloader as the engine's connector
//! ([`TierConnector`] for the offload manager, [`SimpleTier`] for the simple offloader) and the
//! publishing of a tier's events as vLLM's KV-events stream ([`EventStream`]).

mod events;
mod offloading;
mod simple;

pub use events::{EventStream, KvEventsArgs, STEP_REQUESTS};
pub use offloading::TierConnector;
pub use simple::{SimpleTier, SimpleTierError};

/// Which CPU offloader runs behind the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Offloader {
    /// vLLM's OffloadingConnector (`CPUOffloadingManager`).
    Offloading,
    /// vLLM's SimpleCPUOffloadConnector (`SimpleCPUOffloadScheduler`).
    Simple,
}

/// Which offloader `kvtier replay`, `serve` and `sweep` run, and the simple offloader's mode:
/// the flags the three commands share.
#[derive(Clone, Copy, Debug, clap::Args)]
pub struct OffloaderArgs {
    /// The CPU offloader: `offloading` (vLLM's OffloadingConnector, the default) or `simple`
    /// (vLLM's SimpleCPUOffloadConnector, behind --gpu-blocks; the capacities are then its
    /// CPU blocks).
    #[arg(long, value_enum, default_value_t = Offloader::Offloading)]
    pub offloader: Offloader,
    /// With --offloader simple: lazy offload (stores taken from the GPU free queue).
    #[arg(long)]
    pub lazy: bool,
    /// With --offloader simple: workers that report each store (vLLM's world_size; in
    /// replay and serve a --cpu-bytes budget is split over them).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub world_size: u32,
}

impl OffloaderArgs {
    /// Whether the simple offloader runs.
    #[must_use]
    pub fn simple(&self) -> bool {
        self.offloader == Offloader::Simple
    }

    /// The simple offloader's options, with the CPU budget `cpu_bytes`.
    #[must_use]
    pub const fn options(&self, cpu_bytes: Option<u64>) -> SimpleOptions {
        SimpleOptions {
            lazy: self.lazy,
            world_size: self.world_size,
            cpu_bytes,
        }
    }
}

/// The simple offloader's options of `kvtier replay` and `kvtier serve`.
#[derive(Clone, Copy, Debug)]
pub struct SimpleOptions {
    /// Lazy offload (vLLM's `lazy_offload`); eager otherwise.
    pub lazy: bool,
    /// Workers that report each store (`world_size`).
    pub world_size: u32,
    /// The server-wide CPU budget in bytes (vLLM's `cpu_bytes_to_use`): the pool is sized
    /// from it when given (as [`crate::replay::pool_sizing`] sizes it).
    pub cpu_bytes: Option<u64>,
}
