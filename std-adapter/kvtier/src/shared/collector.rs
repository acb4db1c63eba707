//! [`StatsCollector`]: a thread that drains managers on an interval, aggregates payloads sent by
//! other threads or processes (as wire bytes), and feeds an [`OffloadExporter`].
//!
//! Other processes write length-prefixed frames ([`write_frame`](super::write_frame): a `u32`
//! little-endian length, then [`wire`] bytes) to a pipe or socket; the collector reads them
//! with [`StatsCollector::ingest`].
//!
//! Per engine, payloads are aggregated (counters sum, gauges keep the latest, histograms merge)
//! and handed to the exporter once per interval, on [`flush`](StatsCollector::flush), and at
//! [`shutdown`](StatsCollector::shutdown). Shutdown loses nothing that was sent before it: the
//! queue is first-in first-out, so everything queued before the stop message is applied, then
//! the managers are drained one last time.
//!
//! # Bad payloads
//!
//! Each payload is checked against the catalogue on its own, before it joins its engine's sum:
//! one that does not fit (an unknown name, e.g. from a newer engine; another kind; another
//! label count; other histogram bounds) or bytes that do not decode are rejected alone, counted
//! in `kvtier_collector_rejected_payloads_total{reason}` ([`RejectReason`]), and the rest of
//! the interval is exported. So is a payload whose new series the engine's totals could not
//! hold next to the sum (more than a payload's [`MAX_SERIES`]). What only the exporter can
//! refuse (an unknown engine index, too many info series) is refused when the sum is exported
//! and counted the same way; a sum refused only for its info is exported without it.
//!
//! # Bounded queue, back-pressure
//!
//! Payloads wait in a queue of at most [`CollectorConfig::max_queue_bytes`] (wire bytes as
//! sent, or a value's encoded length) and [`CollectorConfig::max_queue_frames`] payloads. When
//! it is full, [`PayloadSender::send`], [`PayloadSender::send_bytes`] and the
//! [`ingest`](StatsCollector::ingest) threads **wait** for room instead of dropping: a payload
//! holds counter increments, and a dropped increment would leave the exported totals short
//! forever, while a wait only delays it. For `ingest` the wait reaches the writing process
//! through the socket or pipe (it blocks in `write` once the kernel buffer is full), so a
//! process that floods the collector is slowed to the collector's pace; memory stays within
//! the bound plus one frame per waiting sender. Nothing is dropped for a full queue, so
//! [`RejectReason`] has no `queue_full`. Managers given to [`StatsCollector::spawn`] as
//! sources are drained by the collector itself and never wait in the queue.
//!
//! The interval export runs on time however busy the queue is: the deadline is checked before
//! every message.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, Read};
use std::sync::mpsc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use kvtier_core::OffloadKey;
use kvtier_core::stats::catalogue;
use kvtier_core::stats::payload::MAX_SERIES;
use kvtier_core::stats::{Payload, wire};
use prometheus::{PullingGauge, Registry};

use super::SharedManager;
use super::frame::{FrameError, read_frame};
use super::health::{Exposed, Metrics, MetricsRegisterError, RejectReason};
use super::queue::{Closed, Inbox};
use crate::export::{ObserveError, OffloadExporter};
use crate::sync::Arc;

/// [`CollectorConfig::max_queue_bytes`] by default: 64 MiB.
pub const DEFAULT_MAX_QUEUE_BYTES: usize = 64 << 20;

/// [`CollectorConfig::max_queue_frames`] by default.
pub const DEFAULT_MAX_QUEUE_FRAMES: usize = 65_536;

/// How a [`StatsCollector`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CollectorConfig {
    /// How often the managers are drained and the aggregated payloads exported (vLLM's
    /// scheduler step is far shorter; a scrape interval is plenty). At least 1 ms; one too
    /// long for an [`Instant`] means exports only on [`StatsCollector::flush`] and shutdown.
    pub interval: Duration,
    /// The most payload bytes queued at once (default [`DEFAULT_MAX_QUEUE_BYTES`]); a value
    /// below [`wire::MAX_ENCODED_LEN`] is raised to it, so that every payload fits.
    pub max_queue_bytes: usize,
    /// The most payloads queued at once (default [`DEFAULT_MAX_QUEUE_FRAMES`], at least 1).
    pub max_queue_frames: usize,
}

impl CollectorConfig {
    /// Drains and exports every `interval`; the default queue bounds.
    #[must_use]
    pub const fn new(interval: Duration) -> Self {
        CollectorConfig {
            interval,
            max_queue_bytes: DEFAULT_MAX_QUEUE_BYTES,
            max_queue_frames: DEFAULT_MAX_QUEUE_FRAMES,
        }
    }
}

/// What a collector did, returned by [`StatsCollector::shutdown`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CollectorReport {
    /// Payloads received (as values or as bytes) and decoded.
    pub payloads: u64,
    /// Payloads rejected: bytes that do not decode, payloads that do not fit the catalogue,
    /// and sums the exporter refused (each counted once), as in
    /// [`StatsCollector::rejected`].
    pub rejected: u64,
    /// Manager drains.
    pub drains: u64,
    /// Times the aggregated payloads were handed to the exporter.
    pub flushes: u64,
}

/// How full the collector's queue is (see [`StatsCollector::queue_levels`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueLevels {
    /// Payload bytes queued now.
    pub bytes: usize,
    /// Payloads queued now.
    pub frames: usize,
    /// The most payload bytes ever queued at once (never above the bound).
    pub peak_bytes: usize,
    /// The bound on bytes in force ([`CollectorConfig::max_queue_bytes`], raised to
    /// [`wire::MAX_ENCODED_LEN`] if lower).
    pub max_bytes: usize,
}

/// The collector has stopped; the payload was not taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CollectorClosed;

impl fmt::Display for CollectorClosed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the stats collector has stopped")
    }
}

impl std::error::Error for CollectorClosed {}

enum Msg {
    Payload(usize, Payload),
    Bytes(usize, Vec<u8>),
    /// Bytes longer than any payload, left out of the queue (they cannot decode).
    Undecodable,
    Flush(mpsc::Sender<()>),
    Stop,
}

impl fmt::Debug for Msg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Msg::Payload(e, _) => write!(f, "Payload({e})"),
            Msg::Bytes(e, b) => write!(f, "Bytes({e}, {} bytes)", b.len()),
            Msg::Undecodable => f.write_str("Undecodable"),
            Msg::Flush(_) => f.write_str("Flush"),
            Msg::Stop => f.write_str("Stop"),
        }
    }
}

/// A clonable handle that sends payloads to a [`StatsCollector`] from any thread.
#[derive(Clone, Debug)]
pub struct PayloadSender {
    inbox: Arc<Inbox<Msg>>,
}

impl PayloadSender {
    /// Sends engine `engine`'s drained payload, waiting while the queue is full (see the
    /// [module docs](self)).
    ///
    /// # Errors
    /// [`CollectorClosed`] when the collector has stopped.
    pub fn send(&self, engine: usize, payload: Payload) -> Result<(), CollectorClosed> {
        let bytes = wire::encoded_len(&payload);
        self.inbox
            .push(Msg::Payload(engine, payload), bytes)
            .map_err(|Closed(_)| CollectorClosed)
    }

    /// Sends engine `engine`'s payload as [`wire`] bytes (decoded by the collector; bytes that
    /// do not decode are counted in [`CollectorReport::rejected`]), waiting while the queue is
    /// full.
    ///
    /// # Errors
    /// [`CollectorClosed`] when the collector has stopped.
    pub fn send_bytes(&self, engine: usize, bytes: Vec<u8>) -> Result<(), CollectorClosed> {
        let msg = if bytes.len() > wire::MAX_ENCODED_LEN {
            // No payload is this long: count it without queueing its bytes.
            Msg::Undecodable
        } else {
            Msg::Bytes(engine, bytes)
        };
        let len = match &msg {
            Msg::Bytes(_, b) => b.len(),
            _ => 0,
        };
        self.inbox
            .push(msg, len)
            .map_err(|Closed(_)| CollectorClosed)
    }
}

/// A manager the collector drains: the engine index and the shared manager.
type Source<K> = (usize, Arc<SharedManager<K>>);

/// The collector thread (see the [module docs](self)).
#[derive(Debug)]
pub struct StatsCollector {
    sender: PayloadSender,
    metrics: Metrics,
    thread: Option<JoinHandle<CollectorReport>>,
}

struct Worker<K: OffloadKey> {
    exporter: OffloadExporter,
    sources: Vec<Source<K>>,
    pending: BTreeMap<usize, Payload>,
    /// Per engine, the exporter's totals as of the last export: the series the sum may add
    /// to them are counted against the limit of a payload.
    exported: BTreeMap<usize, Payload>,
    report: CollectorReport,
    metrics: Metrics,
}

impl<K: OffloadKey> Worker<K> {
    fn reject(&mut self, reason: RejectReason) {
        self.report.rejected += 1;
        self.metrics.reject(reason);
    }

    /// Adds one payload to its engine's sum, after checking it alone: against the catalogue,
    /// and that the exporter's totals can still hold the sum's series.
    fn add(&mut self, engine: usize, payload: &Payload) {
        if let Err(e) = payload
            .series()
            .iter()
            .try_for_each(|s| catalogue::check_series(s).map(|_| ()))
        {
            self.reject((&e).into());
            return;
        }
        let exporter = &self.exporter;
        let known = self
            .exported
            .entry(engine)
            .or_insert_with(|| exporter.totals(engine).unwrap_or_default());
        let slot = self.pending.entry(engine).or_default();
        if known.len() + slot.len() + payload.len() <= MAX_SERIES {
            // Cannot pass the limit: the catalogue check leaves nothing else to refuse.
            let _ = slot.aggregate(payload);
            return;
        }
        let mut trial = slot.clone();
        let fits = trial.aggregate(payload).is_ok() && {
            let new = trial
                .series()
                .iter()
                .filter(|s| {
                    let labels: Vec<&str> = s.labels().iter().collect();
                    known.get(s.name(), &labels).is_none()
                })
                .count();
            known.len() + new <= MAX_SERIES
        };
        if fits {
            *slot = trial;
        } else {
            // The totals could never take it: refuse it alone, keep the sum.
            self.reject(RejectReason::TooManySeries);
        }
    }

    fn observe(&mut self, engine: usize, mut payload: Payload) {
        let Err(e) = self.exporter.observe(&payload, engine) else {
            return;
        };
        self.reject((&e).into());
        if e == ObserveError::TooManyInfoSeries {
            // Only the info is refused: export the rest without it.
            let _ = payload.set_info(Vec::new());
            if let Err(e) = self.exporter.observe(&payload, engine) {
                self.reject((&e).into());
            }
        }
    }

    fn tick(&mut self) {
        for i in 0..self.sources.len() {
            let Some((engine, manager)) = self.sources.get(i).map(|(e, m)| (*e, Arc::clone(m)))
            else {
                continue;
            };
            let mut payload = manager.with(|m| m.take_stats().to_step_payload());
            self.report.drains += 1;
            self.add(engine, &std::mem::take(&mut payload));
        }
        let pending = std::mem::take(&mut self.pending);
        for (engine, payload) in pending {
            self.observe(engine, payload);
        }
        // The totals have changed: read them again when the next payload comes.
        self.exported.clear();
        self.report.flushes += 1;
        self.metrics.exports.inc();
    }

    fn handle(&mut self, msg: Msg) -> bool {
        match msg {
            Msg::Payload(engine, p) => {
                self.report.payloads += 1;
                self.add(engine, &p);
            }
            Msg::Bytes(engine, bytes) => match wire::decode(&bytes) {
                Ok(p) => {
                    self.report.payloads += 1;
                    self.add(engine, &p);
                }
                Err(_) => self.reject(RejectReason::Decode),
            },
            Msg::Undecodable => self.reject(RejectReason::Decode),
            Msg::Flush(ack) => {
                self.tick();
                let _ = ack.send(());
            }
            Msg::Stop => return false,
        }
        true
    }

    fn run(mut self, inbox: &Inbox<Msg>, interval: Duration) -> CollectorReport {
        // An interval too long for an `Instant` means no interval exports.
        let mut next = Instant::now().checked_add(interval);
        loop {
            // Checked before every message, so a queue that is never empty cannot hold the
            // export back.
            if next.is_some_and(|n| Instant::now() >= n) {
                self.tick();
                next = Instant::now().checked_add(interval);
            }
            if let Some(msg) = inbox.pop_by(next)
                && !self.handle(msg)
            {
                break;
            }
        }
        // Whatever was queued behind the stop message (sent concurrently with it) is applied
        // too, then the managers are drained one last time; senders still waiting for room
        // get `CollectorClosed`.
        inbox.close();
        while let Some(msg) = inbox.try_pop() {
            if let Msg::Flush(ack) = msg {
                let _ = ack.send(());
            } else {
                self.handle(msg);
            }
        }
        self.tick();
        self.report
    }
}

impl StatsCollector {
    /// Starts the collector thread: it drains `sources` (engine index, manager) every
    /// `config.interval` (attaching each manager's `config_info` to its first drain, as vLLM's
    /// scheduler does) and exports through `exporter`.
    ///
    /// # Errors
    /// The error of spawning the thread.
    pub fn spawn<K: OffloadKey + Send + 'static>(
        exporter: OffloadExporter,
        sources: Vec<Source<K>>,
        config: CollectorConfig,
    ) -> io::Result<Self> {
        let metrics = Metrics::new().map_err(io::Error::other)?;
        let inbox = Arc::new(Inbox::new(
            config.max_queue_bytes.max(wire::MAX_ENCODED_LEN),
            config.max_queue_frames,
        ));
        let worker = Worker {
            exporter,
            sources,
            pending: BTreeMap::new(),
            exported: BTreeMap::new(),
            report: CollectorReport::default(),
            metrics: metrics.clone(),
        };
        let interval = config.interval.max(Duration::from_millis(1));
        let queue = Arc::clone(&inbox);
        let thread = thread::Builder::new()
            .name("kvtier-stats".into())
            .spawn(move || worker.run(&queue, interval))?;
        Ok(StatsCollector {
            sender: PayloadSender { inbox },
            metrics,
            thread: Some(thread),
        })
    }

    /// A handle for sending payloads from other threads.
    #[must_use]
    pub fn sender(&self) -> PayloadSender {
        self.sender.clone()
    }

    /// Registers the collector's own metrics in `registry`:
    /// `kvtier_collector_rejected_payloads_total{reason}` (every [`RejectReason`], from 0),
    /// `kvtier_collector_exports_total`, and the gauges `kvtier_collector_queue_bytes` and
    /// `kvtier_collector_queue_frames` (read at scrape time).
    ///
    /// # Errors
    /// [`MetricsRegisterError`] when the registry refuses them (e.g. registered twice).
    pub fn register_metrics(&self, registry: &Registry) -> Result<(), MetricsRegisterError> {
        let err = |e: prometheus::Error| MetricsRegisterError(e.to_string());
        let level = |name: &str, help: &str, pick: fn(&QueueLevels) -> usize| {
            let inbox = Arc::clone(&self.sender.inbox);
            #[expect(clippy::cast_precision_loss, reason = "a gauge holds a float")]
            PullingGauge::new(name, help, Box::new(move || pick(&levels(&inbox)) as f64))
                .map_err(err)
        };
        let bytes = level(
            "kvtier_collector_queue_bytes",
            "Stats payload bytes waiting in the collector's queue.",
            |l| l.bytes,
        )?;
        let frames = level(
            "kvtier_collector_queue_frames",
            "Stats payloads waiting in the collector's queue.",
            |l| l.frames,
        )?;
        registry
            .register(Box::new(Exposed {
                rejected: self.metrics.rejected.clone(),
                exports: self.metrics.exports.clone(),
                queue: [bytes, frames],
            }))
            .map_err(err)
    }

    /// Payloads rejected so far for `reason`.
    #[must_use]
    pub fn rejected(&self, reason: RejectReason) -> u64 {
        self.metrics
            .rejected
            .get_metric_with_label_values(&[reason.as_str()])
            .map_or(0, |c| c.get())
    }

    /// Times the aggregated payloads were handed to the exporter so far.
    #[must_use]
    pub fn exports(&self) -> u64 {
        self.metrics.exports.get()
    }

    /// How full the queue is now, and the most it ever held.
    #[must_use]
    pub fn queue_levels(&self) -> QueueLevels {
        levels(&self.sender.inbox)
    }

    /// Reads frames from `reader` (a pipe or socket of another process) on a new thread and
    /// sends them as engine `engine`'s payloads, until the stream ends; while the queue is
    /// full it stops reading, so the writer is slowed (see the [module docs](self)). Join the
    /// returned handle (it gives the number of frames) before [`shutdown`](Self::shutdown) so
    /// that nothing the other process wrote is left unread.
    ///
    /// # Errors
    /// The error of spawning the thread.
    pub fn ingest<R: Read + Send + 'static>(
        &self,
        mut reader: R,
        engine: usize,
    ) -> io::Result<JoinHandle<Result<u64, FrameError>>> {
        let sender = self.sender();
        thread::Builder::new()
            .name("kvtier-ingest".into())
            .spawn(move || {
                let mut frames = 0u64;
                let mut buf = Vec::new();
                while read_frame(&mut reader, &mut buf)? {
                    if sender.send_bytes(engine, std::mem::take(&mut buf)).is_err() {
                        break;
                    }
                    frames += 1;
                }
                Ok(frames)
            })
    }

    /// Drains the managers and exports everything received so far; returns when done.
    ///
    /// # Errors
    /// [`CollectorClosed`] when the collector thread has stopped.
    pub fn flush(&self) -> Result<(), CollectorClosed> {
        let (ack, done) = mpsc::channel();
        self.sender
            .inbox
            .push_control(Msg::Flush(ack))
            .map_err(|Closed(_)| CollectorClosed)?;
        done.recv().map_err(|_| CollectorClosed)
    }

    /// Stops the thread after applying everything sent before this call and draining the
    /// managers a last time.
    #[must_use = "the report says how many payloads were rejected"]
    pub fn shutdown(mut self) -> CollectorReport {
        self.stop()
    }

    fn stop(&mut self) -> CollectorReport {
        let _ = self.sender.inbox.push_control(Msg::Stop);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

fn levels(inbox: &Inbox<Msg>) -> QueueLevels {
    let (bytes, frames, peak_bytes) = inbox.levels();
    QueueLevels {
        bytes,
        frames,
        peak_bytes,
        max_bytes: inbox.max_bytes(),
    }
}

impl Drop for StatsCollector {
    fn drop(&mut self) {
        if self.thread.is_some() {
            let _ = self.stop();
        }
    }
}
