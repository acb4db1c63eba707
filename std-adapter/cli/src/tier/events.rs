//! Publishing a replay's tier events as vLLM's KV-events stream: the options `kvtier replay`
//! and `kvtier serve` share ([`KvEventsArgs`]) and the per-step drain of the manager's (or the
//! simple offloader's) events into the publisher ([`EventStream`]).

use std::sync::Arc;

use kvtier::kv_events::{
    HashForm, KvEvent, PublishError, Publisher, PublisherConfig, PublisherStats, TierEvents,
};
use kvtier_core::BlockKey;
use kvtier_core::manager::OffloadManager;
use kvtier_core::simple::SimpleScheduler;

/// Requests between two published batches of `kvtier replay` (a replay's "step").
pub const STEP_REQUESTS: u64 = 256;

/// Where and how to publish the tier's events (vLLM's `KVEventsConfig`).
#[derive(Debug, Clone, clap::Args)]
pub struct KvEventsArgs {
    /// Publish the tier's events as vLLM's KV-events stream on this ZMQ endpoint. As in vLLM,
    /// `tcp://*:PORT`, `ipc://` and `inproc://` endpoints are bound; `tcp://HOST:PORT` is
    /// connected to (a subscriber binds it).
    #[arg(long, value_name = "ENDPOINT")]
    pub kv_events_endpoint: Option<String>,
    /// The ROUTER endpoint that replays buffered batches (always bound; port 0: the OS
    /// chooses, and the bound endpoint is printed).
    #[arg(long, value_name = "ENDPOINT", requires = "kv_events_endpoint")]
    pub kv_events_replay_endpoint: Option<String>,
    /// The topic frame of every message.
    #[arg(long, default_value = "", value_name = "T")]
    pub kv_events_topic: String,
    /// Batches kept for the replay endpoint.
    #[arg(long, default_value_t = 10_000, value_name = "N")]
    pub kv_events_buffer_steps: usize,
    /// The PUB socket's high-water mark, in messages: past it a slow subscriber's messages
    /// are dropped (it sees the gap and can replay).
    #[arg(long, default_value_t = 100_000, value_name = "N")]
    pub kv_events_hwm: i32,
    /// Batches waiting for the publisher thread (a full queue makes the replay wait).
    #[arg(long, default_value_t = 100_000, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub kv_events_max_queue_size: u64,
    /// The data-parallel rank: offsets the endpoints' ports as vLLM does and is sent in
    /// every batch.
    #[arg(long, default_value_t = 0, value_name = "R")]
    pub kv_events_data_parallel_rank: u32,
    /// Send block hashes as their 8 big-endian bytes, as vLLM does under
    /// `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0` (default: as integers).
    #[arg(long)]
    pub kv_events_bytes_hashes: bool,
}

impl KvEventsArgs {
    /// Whether these options ask for publishing.
    #[must_use]
    pub fn enabled(&self) -> bool {
        self.kv_events_endpoint.is_some()
    }

    /// The publisher these options ask for (`None` without `--kv-events-endpoint`), its
    /// sockets open.
    ///
    /// # Errors
    /// [`PublishError`] naming an endpoint that cannot be offset, bound or connected.
    pub fn publisher(&self) -> Result<Option<Publisher>, PublishError> {
        let Some(endpoint) = &self.kv_events_endpoint else {
            return Ok(None);
        };
        let config = PublisherConfig {
            endpoint: endpoint.clone(),
            replay_endpoint: self.kv_events_replay_endpoint.clone(),
            buffer_steps: self.kv_events_buffer_steps,
            hwm: self.kv_events_hwm,
            max_queue_size: usize::try_from(self.kv_events_max_queue_size).unwrap_or(usize::MAX),
            topic: self.kv_events_topic.clone(),
            data_parallel_rank: self.kv_events_data_parallel_rank,
            ..PublisherConfig::default()
        };
        Publisher::start(&config).map(Some)
    }

    /// How hashes are sent.
    #[must_use]
    pub fn hash_form(&self) -> HashForm {
        if self.kv_events_bytes_hashes {
            HashForm::Bytes
        } else {
            HashForm::Int
        }
    }
}

/// One replay's events on their way to a publisher: each [`step`](Self::step) drains the
/// manager's queued events into one batch.
#[derive(Debug)]
pub struct EventStream {
    publisher: Arc<Publisher>,
    tier: TierEvents,
    /// The manager's dropped-event count already reported.
    dropped_seen: u64,
}

impl EventStream {
    /// A stream of the CPU tier's events, `block_tokens` tokens a block, to `publisher`.
    #[must_use]
    pub fn new(publisher: Arc<Publisher>, block_tokens: u32, hash_form: HashForm) -> Self {
        EventStream {
            publisher,
            tier: TierEvents::cpu(u64::from(block_tokens), hash_form),
            dropped_seen: 0,
        }
    }

    /// Publishes the events `manager` queued since the last step as one batch (none when
    /// there are none); events the manager's own queue dropped are counted as dropped.
    ///
    /// # Errors
    /// [`PublishError::Closed`] when the publisher has stopped.
    pub fn step(&mut self, manager: &mut OffloadManager<BlockKey>) -> Result<(), PublishError> {
        let mut events: Vec<KvEvent> = Vec::new();
        manager.drain_events(|e| self.tier.push(e, &mut events));
        let (dropped, _) = manager.events_dropped();
        self.publish(events, dropped)
    }

    /// Publishes the simple offloader's events queued since the last step as one batch (none
    /// when there are none); events its own queue dropped are counted as dropped.
    ///
    /// # Errors
    /// [`PublishError::Closed`] when the publisher has stopped.
    pub fn step_simple(&mut self, offloader: &mut SimpleScheduler) -> Result<(), PublishError> {
        let mut events: Vec<KvEvent> = Vec::new();
        let layout = offloader.config().layout;
        for e in offloader.take_events() {
            self.tier.push_simple(&e, &layout, &mut events);
        }
        self.publish(events, offloader.dropped_events())
    }

    /// One batch of `events` (none when empty), with the source's dropped-event total
    /// `dropped` (the increase since the last batch is counted as dropped).
    fn publish(&mut self, events: Vec<KvEvent>, dropped: u64) -> Result<(), PublishError> {
        self.publisher
            .record_dropped(dropped.saturating_sub(self.dropped_seen));
        self.dropped_seen = dropped;
        self.publisher.publish_events(events).map(|_| ())
    }

    /// The publisher.
    #[must_use]
    pub fn publisher(&self) -> &Publisher {
        &self.publisher
    }

    /// Stops the publisher once it has sent what is queued (unless another owner holds it)
    /// and answers what it sent.
    #[must_use]
    pub fn finish(self) -> PublisherStats {
        match Arc::try_unwrap(self.publisher) {
            Ok(p) => p.shutdown(),
            Err(p) => p.stats(),
        }
    }
}
