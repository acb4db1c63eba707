//! [`Publisher`]: vLLM's `ZmqEventPublisher` in Rust. Batches handed to
//! [`Publisher::publish`] go through a bounded queue to the publisher's own thread, which
//! numbers them from 0, encodes them ([`super::encode()`]) and sends each as the frames
//! `(topic, sequence as 8 bytes big-endian, payload)` on a PUB socket, keeping the last
//! `buffer_steps` for the ROUTER replay socket ([`super::replay`]).
//!
//! What is bounded, and by what: the queue holds at most `max_queue_size` batches (a full
//! queue blocks [`publish`](Publisher::publish) as vLLM's does, or drops and counts the batch
//! under [`Overflow::Drop`]); the replay buffer `buffer_steps` payloads; each subscriber's
//! pipe `hwm` messages, past which libzmq drops that subscriber's messages (as it does under
//! vLLM: the subscriber sees the gap in the sequence and asks the replay socket). libzmq does
//! not tell a PUB socket what it dropped for a subscriber; `dropped` counts what kvtier sees:
//! batches refused by a full queue, batches whose send failed, and what the caller reports
//! through [`Publisher::record_dropped`] (the manager's own event-queue overflow).

use std::fmt;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus::{IntCounter, Registry};

use super::encode::encode;
use super::endpoint::{EndpointError, is_bind_endpoint, offset_endpoint};
use super::event::{EventBatch, Int, KvEvent};
use super::replay::{ReplayBuffer, end_marker, start_sequence};

/// How long the thread waits for a batch before it looks at the replay socket again, and
/// how long a closed socket keeps trying to deliver what it holds (vLLM's 0.1 s and 1 s).
const POLL: Duration = Duration::from_millis(100);
const LINGER_MS: i32 = 1_000;

/// What a full queue does to [`Publisher::publish`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Overflow {
    /// Wait for room, as vLLM's publisher does (nothing is lost before the socket).
    #[default]
    Block,
    /// Drop the batch and count its events in `dropped` (the caller never waits).
    Drop,
}

/// The publisher's settings: vLLM's `KVEventsConfig` fields, the data-parallel rank and
/// [`Overflow`]. `Default` is vLLM's defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublisherConfig {
    /// The PUB endpoint: bound when [`is_bind_endpoint`] says so, else connected to.
    pub endpoint: String,
    /// The ROUTER replay endpoint (always bound), if any.
    pub replay_endpoint: Option<String>,
    /// Batches kept for replay.
    pub buffer_steps: usize,
    /// The PUB socket's send and receive high-water marks, in messages.
    pub hwm: i32,
    /// Batches the queue to the publisher thread holds.
    pub max_queue_size: usize,
    /// The first frame of every message.
    pub topic: String,
    /// The data-parallel rank: offsets both endpoints ([`offset_endpoint`]) and fills a
    /// batch's `data_parallel_rank` when it has none.
    pub data_parallel_rank: u32,
    /// What a full queue does.
    pub overflow: Overflow,
}

impl Default for PublisherConfig {
    fn default() -> Self {
        PublisherConfig {
            endpoint: "tcp://*:5557".to_owned(),
            replay_endpoint: None,
            buffer_steps: 10_000,
            hwm: 100_000,
            max_queue_size: 100_000,
            topic: String::new(),
            data_parallel_rank: 0,
            overflow: Overflow::Block,
        }
    }
}

/// Why a [`Publisher`] could not start or take a batch.
#[derive(Debug)]
#[non_exhaustive]
pub enum PublishError {
    /// An endpoint cannot be offset for the data-parallel rank.
    Endpoint(EndpointError),
    /// ZMQ refused to bind or connect a socket to an endpoint.
    Socket {
        /// `"PUB"` or `"replay"`.
        socket: &'static str,
        /// The endpoint (after the rank's offset).
        endpoint: String,
        /// ZMQ's error.
        error: zmq::Error,
    },
    /// ZMQ could not make a socket or set its options.
    Setup(zmq::Error),
    /// The counters could not be made or registered.
    Metrics(prometheus::Error),
    /// `max_queue_size` is 0.
    ZeroQueue,
    /// The publisher thread cannot be spawned.
    Spawn(std::io::Error),
    /// The publisher thread is gone.
    Closed,
}

impl fmt::Display for PublishError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PublishError::Endpoint(e) => e.fmt(f),
            PublishError::Socket {
                socket,
                endpoint,
                error,
            } => {
                let verb = if *socket == "PUB" && !is_bind_endpoint(endpoint) {
                    "connect"
                } else {
                    "bind"
                };
                write!(
                    f,
                    "cannot {verb} the kv-events {socket} socket to {endpoint}: {error}"
                )
            }
            PublishError::Setup(e) => write!(f, "cannot set up the kv-events sockets: {e}"),
            PublishError::Metrics(e) => write!(f, "kv-events counters: {e}"),
            PublishError::ZeroQueue => f.write_str("the kv-events queue needs room for a batch"),
            PublishError::Spawn(e) => write!(f, "cannot spawn the kv-events publisher: {e}"),
            PublishError::Closed => f.write_str("the kv-events publisher has stopped"),
        }
    }
}

impl std::error::Error for PublishError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PublishError::Endpoint(e) => Some(e),
            PublishError::Socket { error, .. } | PublishError::Setup(error) => Some(error),
            PublishError::Metrics(e) => Some(e),
            PublishError::Spawn(e) => Some(e),
            PublishError::ZeroQueue | PublishError::Closed => None,
        }
    }
}

impl From<EndpointError> for PublishError {
    fn from(e: EndpointError) -> Self {
        PublishError::Endpoint(e)
    }
}

/// The publisher's counters (also its `/metrics` families, see
/// [`Publisher::register_metrics`]).
#[derive(Clone, Debug)]
struct Counters {
    batches: IntCounter,
    events: IntCounter,
    dropped: IntCounter,
    replays: IntCounter,
}

impl Counters {
    fn new() -> Result<Self, prometheus::Error> {
        Ok(Counters {
            batches: IntCounter::new(
                "kvtier_kv_events_published_batches_total",
                "KV-event batches sent on the PUB socket.",
            )?,
            events: IntCounter::new(
                "kvtier_kv_events_published_events_total",
                "KV events sent on the PUB socket.",
            )?,
            dropped: IntCounter::new(
                "kvtier_kv_events_dropped_total",
                "KV events that never reached the PUB socket (full queue, failed send, or the \
                 tier's own event-queue overflow).",
            )?,
            replays: IntCounter::new(
                "kvtier_kv_events_replay_requests_total",
                "Replay requests answered by the ROUTER socket.",
            )?,
        })
    }
}

/// What a [`Publisher`] has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PublisherStats {
    /// Batches sent (also the next sequence number, when no send failed).
    pub batches: u64,
    /// Events in those batches.
    pub events: u64,
    /// Events that never reached the socket.
    pub dropped: u64,
    /// Replay requests answered.
    pub replay_requests: u64,
}

/// A running publisher: the queue's sending end, the thread and the counters.
#[derive(Debug)]
pub struct Publisher {
    queue: Option<SyncSender<EventBatch>>,
    thread: Option<JoinHandle<()>>,
    counters: Counters,
    overflow: Overflow,
    rank: Int,
    endpoint: String,
    replay_endpoint: Option<String>,
}

fn socket(ctx: &zmq::Context, kind: zmq::SocketType) -> Result<zmq::Socket, PublishError> {
    let s = ctx.socket(kind).map_err(PublishError::Setup)?;
    s.set_linger(LINGER_MS).map_err(PublishError::Setup)?;
    Ok(s)
}

/// Binds `s` to `endpoint` and answers the endpoint it is bound to (the port the OS chose
/// for a port of 0).
fn bind(s: &zmq::Socket, name: &'static str, endpoint: &str) -> Result<String, PublishError> {
    let fail = |error| PublishError::Socket {
        socket: name,
        endpoint: endpoint.to_owned(),
        error,
    };
    s.bind(endpoint).map_err(fail)?;
    Ok(match s.get_last_endpoint() {
        Ok(Ok(bound)) => bound,
        _ => endpoint.to_owned(),
    })
}

impl Publisher {
    /// Opens the sockets as `config` says and starts the publisher thread.
    ///
    /// # Errors
    /// [`PublishError`] naming the endpoint that cannot be offset, bound or connected, or a
    /// socket, counter or thread that cannot be made. Nothing is left running on error.
    pub fn start(config: &PublisherConfig) -> Result<Self, PublishError> {
        if config.max_queue_size == 0 {
            return Err(PublishError::ZeroQueue);
        }
        let rank = config.data_parallel_rank;
        let endpoint = offset_endpoint(&config.endpoint, rank)?;
        let replay_endpoint = config
            .replay_endpoint
            .as_deref()
            .map(|e| offset_endpoint(e, rank))
            .transpose()?;
        let counters = Counters::new().map_err(PublishError::Metrics)?;
        let ctx = zmq::Context::new();
        let pub_socket = socket(&ctx, zmq::PUB)?;
        pub_socket
            .set_sndhwm(config.hwm)
            .map_err(PublishError::Setup)?;
        pub_socket
            .set_rcvhwm(config.hwm)
            .map_err(PublishError::Setup)?;
        let endpoint = if is_bind_endpoint(&endpoint) {
            bind(&pub_socket, "PUB", &endpoint)?
        } else {
            pub_socket
                .connect(&endpoint)
                .map_err(|error| PublishError::Socket {
                    socket: "PUB",
                    endpoint: endpoint.clone(),
                    error,
                })?;
            endpoint
        };
        let (replay, replay_endpoint) = match replay_endpoint {
            Some(e) => {
                let r = socket(&ctx, zmq::ROUTER)?;
                // A whole replay plus its end marker fits the send queue, with room for the
                // half-HWM of reads ZMQ acknowledges late (vLLM's 2 * (buffer_steps + 1)).
                let hwm = config.buffer_steps.saturating_add(1).saturating_mul(2);
                r.set_sndhwm(i32::try_from(hwm).unwrap_or(i32::MAX))
                    .map_err(PublishError::Setup)?;
                let bound = bind(&r, "replay", &e)?;
                (Some(r), Some(bound))
            }
            None => (None, None),
        };
        let (tx, rx) = mpsc::sync_channel(config.max_queue_size);
        let worker = Worker {
            socket: pub_socket,
            replay,
            topic: config.topic.as_bytes().to_vec(),
            buffer: ReplayBuffer::new(config.buffer_steps),
            next_seq: 0,
            counters: counters.clone(),
        };
        let thread = thread::Builder::new()
            .name("kvtier-kv-events".into())
            .spawn(move || worker.run(&rx))
            .map_err(PublishError::Spawn)?;
        Ok(Publisher {
            queue: Some(tx),
            thread: Some(thread),
            counters,
            overflow: config.overflow,
            rank: Int::from(rank),
            endpoint,
            replay_endpoint,
        })
    }

    /// The PUB endpoint (for a bound one, as bound: the OS's port for a port of 0).
    #[must_use]
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The replay endpoint as bound, if there is one.
    #[must_use]
    pub fn replay_endpoint(&self) -> Option<&str> {
        self.replay_endpoint.as_deref()
    }

    /// Queues `batch` for the thread (its rank filled in when `None`); an empty batch is not
    /// sent (vLLM publishes a step only when it has events). Answers whether the batch was
    /// queued: `false` for an empty batch, or one dropped under [`Overflow::Drop`].
    ///
    /// # Errors
    /// [`PublishError::Closed`] when the thread is gone.
    pub fn publish(&self, mut batch: EventBatch) -> Result<bool, PublishError> {
        if batch.events.is_empty() {
            return Ok(false);
        }
        batch.data_parallel_rank.get_or_insert(self.rank);
        let queue = self.queue.as_ref().ok_or(PublishError::Closed)?;
        match self.overflow {
            Overflow::Block => queue.send(batch).map_err(|_| PublishError::Closed)?,
            Overflow::Drop => match queue.try_send(batch) {
                Ok(()) => {}
                Err(TrySendError::Full(b)) => {
                    self.record_dropped(b.events.len() as u64);
                    return Ok(false);
                }
                Err(TrySendError::Disconnected(_)) => return Err(PublishError::Closed),
            },
        }
        Ok(true)
    }

    /// [`publish`](Self::publish)es `events` as one batch stamped now.
    ///
    /// # Errors
    /// As [`publish`](Self::publish).
    pub fn publish_events(&self, events: Vec<KvEvent>) -> Result<bool, PublishError> {
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        self.publish(EventBatch {
            ts,
            events,
            data_parallel_rank: None,
        })
    }

    /// Counts `events` lost before they reached the publisher (the manager's event queue
    /// overflowing, say) in `dropped`.
    pub fn record_dropped(&self, events: u64) {
        self.counters.dropped.inc_by(events);
    }

    /// The counters so far.
    #[must_use]
    pub fn stats(&self) -> PublisherStats {
        PublisherStats {
            batches: self.counters.batches.get(),
            events: self.counters.events.get(),
            dropped: self.counters.dropped.get(),
            replay_requests: self.counters.replays.get(),
        }
    }

    /// Adds the counters to `registry` (`kvtier_kv_events_published_batches_total`,
    /// `kvtier_kv_events_published_events_total`, `kvtier_kv_events_dropped_total`,
    /// `kvtier_kv_events_replay_requests_total`), for [`crate::export::encode_text`].
    ///
    /// # Errors
    /// A name already registered there.
    pub fn register_metrics(&self, registry: &Registry) -> Result<(), PublishError> {
        let c = &self.counters;
        for m in [&c.batches, &c.events, &c.dropped, &c.replays] {
            registry
                .register(Box::new(m.clone()))
                .map_err(PublishError::Metrics)?;
        }
        Ok(())
    }

    /// Sends what is queued, then stops the thread and closes the sockets (each keeps up to
    /// 1 s to deliver what it holds); answers the final counters.
    pub fn shutdown(mut self) -> PublisherStats {
        self.stop();
        self.stats()
    }

    fn stop(&mut self) {
        drop(self.queue.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The publisher thread's state.
struct Worker {
    socket: zmq::Socket,
    replay: Option<zmq::Socket>,
    topic: Vec<u8>,
    buffer: ReplayBuffer,
    next_seq: u64,
    counters: Counters,
}

impl Worker {
    fn run(mut self, rx: &Receiver<EventBatch>) {
        loop {
            self.serve_replay();
            match rx.recv_timeout(POLL) {
                Ok(batch) => self.send(&batch),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
    }

    fn send(&mut self, batch: &EventBatch) {
        // The number is taken even when the send fails, as in vLLM: subscribers see the gap.
        let seq = self.next_seq;
        self.next_seq += 1;
        let payload = encode(batch);
        let frames: [&[u8]; 3] = [&self.topic, &seq.to_be_bytes(), &payload];
        let n = batch.events.len() as u64;
        if self.socket.send_multipart(frames, 0).is_ok() {
            self.counters.batches.inc();
            self.counters.events.inc_by(n);
            self.buffer.push(seq, payload);
        } else {
            self.counters.dropped.inc_by(n);
            thread::sleep(POLL);
        }
    }

    /// Answers one waiting replay request, if any, as vLLM does: a request of three frames
    /// `(identity, "", start)` gets every buffered batch from `start` on, then the end marker;
    /// any other request is ignored.
    fn serve_replay(&mut self) {
        let Some(r) = &self.replay else { return };
        if !matches!(r.poll(zmq::POLLIN, 0), Ok(n) if n > 0) {
            return;
        }
        let Ok(frames) = r.recv_multipart(zmq::DONTWAIT) else {
            return;
        };
        let [id, _, start] = frames.as_slice() else {
            return;
        };
        let start = start_sequence(start);
        for (seq, payload) in self.buffer.from(start) {
            let reply: [&[u8]; 5] = [id, b"", &self.topic, &seq.to_be_bytes(), payload];
            let _ = r.send_multipart(reply, 0);
        }
        let _ = r.send_multipart(end_marker(id), 0);
        self.counters.replays.inc();
    }
}
