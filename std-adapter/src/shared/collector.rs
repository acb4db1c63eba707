//! [`StatsCollector`]: a thread that drains managers on an interval, aggregates payloads sent by
//! other threads or processes (as wire bytes), and feeds an [`OffloadExporter`].
//!
//! Other processes write length-prefixed frames ([`write_frame`]: a `u32` little-endian length,
//! then [`wire`] bytes) to a pipe or socket; the collector reads them
//! with [`StatsCollector::ingest`].
//!
//! Per engine, payloads are aggregated (counters sum, gauges keep the latest, histograms merge)
//! and handed to the exporter once per interval, on [`flush`](StatsCollector::flush), and at
//! [`shutdown`](StatsCollector::shutdown). Shutdown loses nothing that was sent before it: the
//! channel is first-in first-out, so everything queued before the stop message is applied, then
//! the managers are drained one last time.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, Read, Write};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use kvtier_core::OffloadKey;
use kvtier_core::stats::{Payload, wire};

use super::SharedManager;
use super::sync::Arc;
use crate::export::OffloadExporter;

/// How a [`StatsCollector`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CollectorConfig {
    /// How often the managers are drained and the aggregated payloads exported (vLLM's
    /// scheduler step is far shorter; a scrape interval is plenty).
    pub interval: Duration,
}

impl CollectorConfig {
    /// Drains and exports every `interval`.
    #[must_use]
    pub const fn new(interval: Duration) -> Self {
        CollectorConfig { interval }
    }
}

/// What a collector did, returned by [`StatsCollector::shutdown`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CollectorReport {
    /// Payloads received (as values or as bytes) and decoded.
    pub payloads: u64,
    /// Payloads that could not be decoded or that the exporter rejected.
    pub rejected: u64,
    /// Manager drains.
    pub drains: u64,
    /// Times the aggregated payloads were handed to the exporter.
    pub flushes: u64,
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

/// Why a frame could not be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// The stream failed.
    Io(io::ErrorKind),
    /// The length prefix is larger than any payload encoding ([`wire::MAX_ENCODED_LEN`]).
    TooLong(u32),
    /// The stream ended inside a frame.
    Truncated,
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Io(k) => write!(f, "reading a stats frame failed: {k}"),
            FrameError::TooLong(n) => write!(
                f,
                "a stats frame of {n} bytes is longer than any payload ({} bytes)",
                wire::MAX_ENCODED_LEN
            ),
            FrameError::Truncated => f.write_str("the stream ended inside a stats frame"),
        }
    }
}

impl std::error::Error for FrameError {}

/// Writes `payload` as one frame: its encoded length (`u32`, little-endian), then its
/// [`wire`] encoding.
///
/// # Errors
/// The writer's error.
pub fn write_frame(w: &mut impl Write, payload: &Payload) -> io::Result<()> {
    let bytes = wire::encode_to_vec(payload);
    let len = u32::try_from(bytes.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "payload too large"))?;
    w.write_all(&len.to_le_bytes())?;
    w.write_all(&bytes)
}

/// Reads one frame's bytes into `buf`; `Ok(false)` at a clean end of stream.
///
/// # Errors
/// [`FrameError`] on a failing stream, an oversized length or a frame cut short.
pub fn read_frame(r: &mut impl Read, buf: &mut Vec<u8>) -> Result<bool, FrameError> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < len.len() {
        match r.read(len.get_mut(got..).unwrap_or(&mut [])) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(FrameError::Truncated),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FrameError::Io(e.kind())),
        }
    }
    let n = u32::from_le_bytes(len);
    let size = usize::try_from(n).map_err(|_| FrameError::TooLong(n))?;
    if size > wire::MAX_ENCODED_LEN {
        return Err(FrameError::TooLong(n));
    }
    buf.clear();
    buf.resize(size, 0);
    r.read_exact(buf).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => FrameError::Truncated,
        k => FrameError::Io(k),
    })?;
    Ok(true)
}

enum Msg {
    Payload(usize, Payload),
    Bytes(usize, Vec<u8>),
    Flush(Sender<()>),
    Stop,
}

/// A clonable handle that sends payloads to a [`StatsCollector`] from any thread.
#[derive(Clone, Debug)]
pub struct PayloadSender {
    tx: Sender<Msg>,
}

impl fmt::Debug for Msg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Msg::Payload(e, _) => write!(f, "Payload({e})"),
            Msg::Bytes(e, b) => write!(f, "Bytes({e}, {} bytes)", b.len()),
            Msg::Flush(_) => f.write_str("Flush"),
            Msg::Stop => f.write_str("Stop"),
        }
    }
}

impl PayloadSender {
    /// Sends engine `engine`'s drained payload.
    ///
    /// # Errors
    /// [`CollectorClosed`] when the collector has stopped.
    pub fn send(&self, engine: usize, payload: Payload) -> Result<(), CollectorClosed> {
        self.tx
            .send(Msg::Payload(engine, payload))
            .map_err(|_| CollectorClosed)
    }

    /// Sends engine `engine`'s payload as [`wire`] bytes (decoded by the collector; bytes that
    /// do not decode are counted in [`CollectorReport::rejected`]).
    ///
    /// # Errors
    /// [`CollectorClosed`] when the collector has stopped.
    pub fn send_bytes(&self, engine: usize, bytes: Vec<u8>) -> Result<(), CollectorClosed> {
        self.tx
            .send(Msg::Bytes(engine, bytes))
            .map_err(|_| CollectorClosed)
    }
}

/// A manager the collector drains: the engine index and the shared manager.
type Source<K> = (usize, Arc<SharedManager<K>>);

/// The collector thread (see the [module docs](self)).
#[derive(Debug)]
pub struct StatsCollector {
    sender: PayloadSender,
    thread: Option<JoinHandle<CollectorReport>>,
}

struct Worker<K: OffloadKey> {
    exporter: OffloadExporter,
    sources: Vec<Source<K>>,
    pending: BTreeMap<usize, Payload>,
    report: CollectorReport,
}

impl<K: OffloadKey> Worker<K> {
    fn add(&mut self, engine: usize, payload: &Payload) {
        let slot = self.pending.entry(engine).or_default();
        if slot.aggregate(payload).is_ok() {
            return;
        }
        // It does not fit the aggregate: hand over what is pending, then this payload alone.
        let earlier = std::mem::take(slot);
        self.observe(engine, &earlier);
        self.observe(engine, payload);
    }

    fn observe(&mut self, engine: usize, payload: &Payload) {
        if self.exporter.observe(payload, engine).is_err() {
            self.report.rejected += 1;
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
        for (engine, payload) in &pending {
            self.observe(*engine, payload);
        }
        self.report.flushes += 1;
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
                Err(_) => self.report.rejected += 1,
            },
            Msg::Flush(ack) => {
                self.tick();
                let _ = ack.send(());
            }
            Msg::Stop => return false,
        }
        true
    }

    fn run(mut self, rx: &Receiver<Msg>, interval: Duration) -> CollectorReport {
        let mut next = Instant::now() + interval;
        loop {
            let wait = next.saturating_duration_since(Instant::now());
            match rx.recv_timeout(wait) {
                Ok(msg) => {
                    if !self.handle(msg) {
                        break;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    self.tick();
                    next = Instant::now() + interval;
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        // Whatever was queued behind the stop message (sent concurrently with it) is applied
        // too, then the managers are drained one last time.
        while let Ok(msg) = rx.try_recv() {
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
        let (tx, rx) = mpsc::channel();
        let worker = Worker {
            exporter,
            sources,
            pending: BTreeMap::new(),
            report: CollectorReport::default(),
        };
        let interval = config.interval.max(Duration::from_millis(1));
        let thread = thread::Builder::new()
            .name("kvtier-stats".into())
            .spawn(move || worker.run(&rx, interval))?;
        Ok(StatsCollector {
            sender: PayloadSender { tx },
            thread: Some(thread),
        })
    }

    /// A handle for sending payloads from other threads.
    #[must_use]
    pub fn sender(&self) -> PayloadSender {
        self.sender.clone()
    }

    /// Reads frames from `reader` (a pipe or socket of another process) on a new thread and
    /// sends them as engine `engine`'s payloads, until the stream ends. Join the returned
    /// handle (it gives the number of frames) before [`shutdown`](Self::shutdown) so that
    /// nothing the other process wrote is left unread.
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
                    if sender.send_bytes(engine, buf.clone()).is_err() {
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
            .tx
            .send(Msg::Flush(ack))
            .map_err(|_| CollectorClosed)?;
        done.recv().map_err(|_| CollectorClosed)
    }

    /// Stops the thread after applying everything sent before this call and draining the
    /// managers a last time.
    #[must_use = "the report says how many payloads were rejected"]
    pub fn shutdown(mut self) -> CollectorReport {
        self.stop()
    }

    fn stop(&mut self) -> CollectorReport {
        let _ = self.sender.tx.send(Msg::Stop);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for StatsCollector {
    fn drop(&mut self) {
        if self.thread.is_some() {
            let _ = self.stop();
        }
    }
}
