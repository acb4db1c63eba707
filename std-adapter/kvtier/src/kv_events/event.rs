//! The events of vLLM's KV-events stream as plain data: [`EventBatch`] holds [`KvEvent`]s,
//! each a [`BlockStored`], a [`BlockRemoved`] or `AllBlocksCleared`, with their block hashes
//! as [`BlockHash`]es.

/// The `medium` of an event about the GPU's prefix cache.
pub const MEDIUM_GPU: &str = "GPU";
/// The `medium` of an event about the CPU offloading tier (what kvtier's manager holds).
pub const MEDIUM_CPU: &str = "CPU";
/// The `medium` of an event about a storage tier.
pub const MEDIUM_STORAGE: &str = "STORAGE";

/// An integer field as msgspec's `int` reads one from msgpack: any msgpack integer, so
/// −2^63 ..= 2^64−1 (vLLM's publisher writes non-negative values only; a decoder must still
/// take the rest). The encoder saturates a value outside that range to its nearest end.
pub type Int = i128;

/// One block hash as the stream carries it: an integer (vLLM's default,
/// `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`: the hash's bytes read big-endian, masked to 64
/// bits; any msgpack integer when decoded) or the hash's bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BlockHash {
    /// An integer hash.
    Int(Int),
    /// A hash as bytes.
    Bytes(Vec<u8>),
}

/// How a 64-bit block hash of a trace or of the manager is sent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HashForm {
    /// As the integer itself (vLLM's default).
    #[default]
    Int,
    /// As its 8 bytes, big-endian (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`); vLLM's integer
    /// form of these bytes is the hash itself.
    Bytes,
}

impl HashForm {
    /// `hash` in this form.
    #[must_use]
    pub fn hash(self, hash: u64) -> BlockHash {
        match self {
            HashForm::Int => BlockHash::Int(Int::from(hash)),
            HashForm::Bytes => BlockHash::Bytes(hash.to_be_bytes().to_vec()),
        }
    }
}

/// Blocks became resident (vLLM's `BlockStored`). The `Option` fields after `lora_name` are
/// the optional ones: left out of the encoding when `None`.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockStored {
    /// The stored blocks' hashes, in chain order.
    pub block_hashes: Vec<BlockHash>,
    /// The hash of the block before the first one (`None`: none, or unknown).
    pub parent_block_hash: Option<BlockHash>,
    /// The blocks' token ids (empty when the publisher does not know them).
    pub token_ids: Vec<Int>,
    /// Tokens per block.
    pub block_size: Int,
    /// The LoRA adapter's id (deprecated in vLLM in favour of `lora_name`).
    pub lora_id: Option<Int>,
    /// Where the blocks live ([`MEDIUM_CPU`] for kvtier's tier).
    pub medium: Option<String>,
    /// The LoRA adapter's name.
    pub lora_name: Option<String>,
    /// The extra keys of each block's hash, kept as the msgpack value vLLM sends.
    pub extra_keys: Option<rmpv::Value>,
    /// The KV-cache group.
    pub group_idx: Option<Int>,
    /// The group's cache-spec kind.
    pub kv_cache_spec_kind: Option<String>,
    /// The group's sliding window.
    pub kv_cache_spec_sliding_window: Option<Int>,
    /// `LOCAL` or `REMOTE` relative to the publisher.
    pub locality: Option<String>,
    /// The secondary offloading tier that generated the event.
    pub ownership: Option<String>,
    /// The session that triggered the store.
    pub session_id: Option<String>,
    /// The lookahead tokens of each block's hash.
    pub lookahead_token_ids: Option<Vec<Vec<Int>>>,
}

impl BlockStored {
    /// A store of `block_hashes` with every optional field `None`, no parent and no tokens.
    #[must_use]
    pub fn new(block_hashes: Vec<BlockHash>, block_size: u64, medium: Option<String>) -> Self {
        BlockStored {
            block_hashes,
            parent_block_hash: None,
            token_ids: Vec::new(),
            block_size: Int::from(block_size),
            lora_id: None,
            medium,
            lora_name: None,
            extra_keys: None,
            group_idx: None,
            kv_cache_spec_kind: None,
            kv_cache_spec_sliding_window: None,
            locality: None,
            ownership: None,
            session_id: None,
            lookahead_token_ids: None,
        }
    }
}

/// Blocks were evicted (vLLM's `BlockRemoved`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockRemoved {
    /// The removed blocks' hashes.
    pub block_hashes: Vec<BlockHash>,
    /// Where they lived.
    pub medium: Option<String>,
    /// The KV-cache group (optional).
    pub group_idx: Option<Int>,
    /// `LOCAL` or `REMOTE` (optional).
    pub locality: Option<String>,
    /// The secondary offloading tier (optional).
    pub ownership: Option<String>,
}

/// One event of a batch.
#[derive(Clone, Debug, PartialEq)]
pub enum KvEvent {
    /// `BlockStored`.
    Stored(Box<BlockStored>),
    /// `BlockRemoved`.
    Removed(BlockRemoved),
    /// `AllBlocksCleared`: every block of the publisher is gone.
    AllCleared,
}

impl KvEvent {
    /// The msgspec tag of this event (the value of its `type` key).
    #[must_use]
    pub fn tag(&self) -> &'static str {
        match self {
            KvEvent::Stored(_) => "BlockStored",
            KvEvent::Removed(_) => "BlockRemoved",
            KvEvent::AllCleared => "AllBlocksCleared",
        }
    }
}

/// One published batch (vLLM's `KVEventBatch`): one scheduler step's events.
#[derive(Clone, Debug, PartialEq)]
pub struct EventBatch {
    /// Seconds since the Unix epoch when the batch was made.
    pub ts: f64,
    /// The events, in order.
    pub events: Vec<KvEvent>,
    /// The data-parallel rank of the publisher (a publisher always fills it).
    pub data_parallel_rank: Option<Int>,
}
