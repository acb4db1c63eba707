//! The tier's events as vLLM 0.33.0's KV-events stream, for KV-aware routers (llm-d's
//! indexer, Dynamo's KV router): the events ([`event`]), their msgpack form as msgspec writes
//! it ([`mod@encode`], [`mod@decode`]), the manager's events in that shape ([`translate`]), the
//! ZMQ publisher with its replay socket ([`publisher`], [`replay`]), a subscriber
//! ([`subscriber`]) and vLLM's endpoint rules ([`endpoint`]).
//!
//! On the wire, as vLLM's `ZmqEventPublisher` sends it: each batch is one PUB message of three
//! frames, `(topic, sequence as 8 bytes big-endian, msgpack payload)`, the sequence counting
//! batches from 0; a ROUTER socket answers a replay request with the buffered batches from a
//! start sequence on, then an end marker.
//!
//! ```
//! use kvtier::kv_events::{BlockHash, BlockStored, EventBatch, KvEvent, MEDIUM_CPU, decode, encode};
//!
//! let batch = EventBatch {
//!     ts: 1.5,
//!     events: vec![KvEvent::Stored(Box::new(BlockStored::new(
//!         vec![BlockHash::Int(5)],
//!         16,
//!         Some(MEDIUM_CPU.into()),
//!     )))],
//!     data_parallel_rank: Some(0),
//! };
//! let bytes = encode(&batch);
//! assert_eq!(bytes[0], 0x93); // [ts, events, data_parallel_rank]
//! assert_eq!(decode(&bytes)?, batch);
//! # Ok::<(), kvtier::kv_events::DecodeError>(())
//! ```

pub mod decode;
pub mod encode;
pub mod endpoint;
pub mod event;
pub mod publisher;
pub mod replay;
pub mod subscriber;
pub mod translate;

pub use decode::{DecodeError, decode};
pub use encode::encode;
pub use endpoint::{EndpointError, EndpointProblem, is_bind_endpoint, offset_endpoint};
pub use event::{
    BlockHash, BlockRemoved, BlockStored, EventBatch, HashForm, Int, KvEvent, MEDIUM_CPU,
    MEDIUM_GPU, MEDIUM_STORAGE,
};
pub use publisher::{Overflow, PublishError, Publisher, PublisherConfig, PublisherStats};
pub use replay::{END_SEQ, ReplayBuffer, end_marker, start_sequence};
pub use subscriber::{Message, RecvError, Subscriber};
pub use translate::{
    CHUNKED_LOCAL_ATTENTION, FULL_ATTENTION, LOCAL, MAMBA, SLIDING_WINDOW, TierEvents, UNKNOWN,
    spec_kind,
};
