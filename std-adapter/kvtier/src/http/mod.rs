//! A small HTTP/1.1 endpoint that serves `/metrics` (std `TcpListener`, one short-lived thread
//! per connection).
//!
//! - `GET /metrics` (a query string is ignored) answers 200 with the text exposition and
//!   `Content-Type: text/plain; version=0.0.4`; `HEAD` answers with the same status and headers
//!   (`Content-Length` is the length of the body `GET` would send) and no body. Any other path
//!   is 404, any other method 405 (with `Allow: GET, HEAD`), a request that is not HTTP 400, a
//!   head longer than [`MAX_REQUEST_HEAD`] 431, a head not complete by its deadline 408. Every
//!   response closes the connection.
//! - Idle, slow or malicious clients cannot blank the scrapes:
//!   - the whole request head must arrive within [`ServerConfig::head_deadline`] of the
//!     accept: one deadline for the request, not a timeout per read, so trickling bytes does
//!     not extend it; the whole response must be written within [`ServerConfig::io_timeout`];
//!   - at most [`ServerConfig::max_connections`] connections are held at once. When all are
//!     held, a new connection is not refused: the held connection that has gone longest without
//!     receiving or sending a byte is closed to make room (an idle or trickling socket, not a
//!     scrape, which sends its request at once and is answered at once). Only when no held
//!     connection can be closed (its socket could not be duplicated) is the new one answered
//!     503;
//!   - when `accept` fails (out of file descriptors, `EMFILE`/`ENFILE`, or any error other
//!     than a connection aborted by its peer), the accept thread sleeps before it tries again,
//!     [`ACCEPT_BACKOFF_MIN`] doubling up to [`ACCEPT_BACKOFF_MAX`], instead of spinning;
//!   - [`MetricsServer::stats`] counts connections shed, heads timed out and accept back-offs.
//! - It binds where it is told; the command's default is `127.0.0.1`.
//!
//! ```no_run
//! use kvtier::http::{MetricsServer, ServerConfig};
//!
//! let server = MetricsServer::bind(
//!     "127.0.0.1:0",
//!     ServerConfig::default(),
//!     || Ok("# nothing yet\n".to_owned()),
//! )?;
//! println!("http://{}/metrics", server.local_addr());
//! server.stop();
//! # Ok::<(), std::io::Error>(())
//! ```

mod exchange;

use std::fmt;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::export::EncodeError;
use exchange::{HeadError, Response, deadline_in, read_head, route};
// Real sockets and OS threads: never modelled by loom, so std's primitives, not the facade.
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// The longest request head (request line and headers) read, in bytes.
pub const MAX_REQUEST_HEAD: usize = 8192;

/// The first pause after a failed `accept`; each further failure in a row doubles it.
pub const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);

/// The longest pause after a failed `accept`.
pub const ACCEPT_BACKOFF_MAX: Duration = Duration::from_millis(200);

/// The longest the accept thread spends writing a 503.
const REFUSE_WRITE: Duration = Duration::from_millis(100);

/// How a [`MetricsServer`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerConfig {
    /// The longest writing one whole response may take (default 5 s; a duration too long
    /// for an [`Instant`] means no limit).
    pub io_timeout: Duration,
    /// The longest the whole request head may take to arrive, from the accept (default 5 s;
    /// a duration too long for an [`Instant`] means no limit).
    pub head_deadline: Duration,
    /// Connections held at once (default 64); past it the one that has gone longest without
    /// progress is closed to make room for the new one.
    pub max_connections: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            io_timeout: Duration::from_secs(5),
            head_deadline: Duration::from_secs(5),
            max_connections: 64,
        }
    }
}

/// What a [`MetricsServer`] has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerStats {
    /// Connections accepted.
    pub accepted: u64,
    /// Held connections closed to make room for a new one.
    pub shed: u64,
    /// Connections closed because their request head was not complete by its deadline.
    pub head_timeouts: u64,
    /// Connections answered 503 because no held connection could be closed for them.
    pub refused: u64,
    /// Failed accepts followed by a pause (e.g. out of file descriptors).
    pub accept_backoffs: u64,
}

/// Renders the body of `/metrics`, or the [`EncodeError`] whose message is answered with a 500.
pub trait Render: Fn() -> Result<String, EncodeError> + Send + Sync + 'static {}
impl<F: Fn() -> Result<String, EncodeError> + Send + Sync + 'static> Render for F {}

#[derive(Debug, Default)]
struct Counters {
    accepted: AtomicU64,
    shed: AtomicU64,
    head_timeouts: AtomicU64,
    refused: AtomicU64,
    accept_backoffs: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// One held connection, as the accept thread sees it.
#[derive(Debug)]
struct Conn {
    /// When it was accepted.
    accepted: Instant,
    /// Nanoseconds from the server's epoch to the last byte received or sent.
    progress: AtomicU64,
    /// A second handle to the socket, to shut it down when it is shed (`None` when the socket
    /// could not be duplicated: such a connection ends only by its own deadlines).
    handle: Option<TcpStream>,
}

/// What the accept thread and the connection threads share.
struct Shared {
    config: ServerConfig,
    render: Box<dyn Render>,
    epoch: Instant,
    conns: Mutex<Vec<Arc<Conn>>>,
    counters: Counters,
    stopping: AtomicBool,
}

impl Shared {
    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn touch(&self, conn: &Conn) {
        conn.progress.store(self.now(), Ordering::Relaxed);
    }

    /// The held connections (a panic never strikes while the list is locked; a poisoned lock
    /// still holds a consistent list).
    fn conns(&self) -> MutexGuard<'_, Vec<Arc<Conn>>> {
        self.conns.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A running `/metrics` endpoint; [`stop`](Self::stop) (or dropping it) ends it.
pub struct MetricsServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for MetricsServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MetricsServer")
            .field("addr", &self.addr)
            .field("config", &self.shared.config)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

fn serve_one(mut stream: TcpStream, conn: &Conn, shared: &Shared) {
    let progress = || shared.touch(conn);
    let config = shared.config;
    let refusal = match read_head(
        &mut stream,
        conn.accepted.checked_add(config.head_deadline),
        &progress,
    ) {
        Ok(head) => Ok(head),
        Err(HeadError::Closed | HeadError::Io) => return,
        Err(HeadError::Timeout) => {
            bump(&shared.counters.head_timeouts);
            Err(Response::text(
                "408 Request Timeout",
                "request head too slow\n",
            ))
        }
        Err(HeadError::TooLarge) => Err(Response::text(
            "431 Request Header Fields Too Large",
            "head too long\n",
        )),
    };
    let head = match refusal {
        Ok(head) => head,
        Err(r) => {
            r.send(
                &mut stream,
                false,
                deadline_in(config.io_timeout),
                &progress,
            );
            return;
        }
    };
    progress();
    let (response, head_only) = route(&head, &*shared.render);
    response.send(
        &mut stream,
        head_only,
        deadline_in(config.io_timeout),
        &progress,
    );
}

/// Removes its connection from the held list when the connection's thread ends (also on
/// panic, and when the thread could not be spawned).
struct Slot {
    shared: Arc<Shared>,
    conn: Arc<Conn>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut conns = self.shared.conns();
        if let Some(i) = conns.iter().position(|c| Arc::ptr_eq(c, &self.conn)) {
            conns.swap_remove(i);
        }
    }
}

/// Makes room for a new connection if all slots are held: closes the held connection with the
/// oldest progress. False when none can be closed.
fn make_room(shared: &Shared, conns: &mut Vec<Arc<Conn>>) -> bool {
    if conns.len() < shared.config.max_connections {
        return true;
    }
    let victim = conns
        .iter()
        .enumerate()
        .filter(|(_, c)| c.handle.is_some())
        .min_by_key(|(_, c)| c.progress.load(Ordering::Relaxed))
        .map(|(i, _)| i);
    let Some(i) = victim else { return false };
    let shed = conns.swap_remove(i);
    if let Some(h) = &shed.handle {
        // Its thread's blocked read or write returns at once; it then closes the socket.
        let _ = h.shutdown(Shutdown::Both);
    }
    bump(&shared.counters.shed);
    true
}

fn admit(shared: &Arc<Shared>, mut stream: TcpStream) {
    bump(&shared.counters.accepted);
    let conn = Arc::new(Conn {
        accepted: Instant::now(),
        progress: AtomicU64::new(shared.now()),
        handle: stream.try_clone().ok(),
    });
    {
        let mut conns = shared.conns();
        if !make_room(shared, &mut conns) {
            drop(conns);
            bump(&shared.counters.refused);
            let r = Response::text("503 Service Unavailable", "busy\n");
            // A fresh socket's send buffer takes the short answer at once.
            r.send(&mut stream, false, deadline_in(REFUSE_WRITE), &|| {});
            return;
        }
        conns.push(Arc::clone(&conn));
    }
    let slot = Slot {
        shared: Arc::clone(shared),
        conn,
    };
    let spawned = thread::Builder::new()
        .name("kvtier-http-conn".into())
        .spawn(move || {
            let slot = slot;
            serve_one(stream, &slot.conn, &slot.shared);
        });
    // If no thread can be had, the closure is dropped: the connection closes and its slot
    // is freed.
    drop(spawned);
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    let mut backoff = ACCEPT_BACKOFF_MIN;
    loop {
        let accepted = listener.accept();
        if shared.stopping.load(Ordering::Acquire) {
            break;
        }
        match accepted {
            Ok((stream, _)) => {
                backoff = ACCEPT_BACKOFF_MIN;
                admit(shared, stream);
            }
            // Per-connection failures: the pending connection is consumed, no spin.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted
                        | io::ErrorKind::ConnectionAborted
                        | io::ErrorKind::ConnectionReset
                ) => {}
            // Out of file descriptors (EMFILE, ENFILE) or memory: accept fails at once, again
            // and again, until something is closed. Pause instead of spinning.
            Err(_) => {
                bump(&shared.counters.accept_backoffs);
                thread::sleep(backoff);
                backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
            }
        }
    }
}

impl MetricsServer {
    /// Binds `addr` and serves `render`'s text at `/metrics` on a background thread.
    ///
    /// # Errors
    /// The error of resolving or binding `addr`, or of spawning the thread.
    pub fn bind(
        addr: impl ToSocketAddrs,
        config: ServerConfig,
        render: impl Render,
    ) -> io::Result<Self> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            config,
            render: Box::new(render),
            epoch: Instant::now(),
            conns: Mutex::new(Vec::new()),
            counters: Counters::default(),
            stopping: AtomicBool::new(false),
        });
        let accept = Arc::clone(&shared);
        let thread = thread::Builder::new()
            .name("kvtier-http".into())
            .spawn(move || accept_loop(&listener, &accept))?;
        Ok(MetricsServer {
            addr,
            shared,
            thread: Some(thread),
        })
    }

    /// The address actually bound (useful after binding port 0).
    #[must_use]
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// What the server has done so far.
    #[must_use]
    pub fn stats(&self) -> ServerStats {
        let c = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ServerStats {
            accepted: get(&c.accepted),
            shed: get(&c.shed),
            head_timeouts: get(&c.head_timeouts),
            refused: get(&c.refused),
            accept_backoffs: get(&c.accept_backoffs),
        }
    }

    /// Connections held right now.
    #[must_use]
    pub fn connections(&self) -> usize {
        self.shared.conns().len()
    }

    /// Stops accepting and waits for the accept thread (connections in flight finish on
    /// their own threads, within their deadlines).
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.shared.stopping.store(true, Ordering::Release);
        let Some(thread) = self.thread.take() else {
            return;
        };
        // Wake the blocking accept with a connection to ourselves (loopback when bound to an
        // unspecified address), again until the thread ends: a connect can fail while file
        // descriptors are short, and the thread may be pausing after a failed accept.
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(match wake {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        for _ in 0..20 {
            let _ = TcpStream::connect_timeout(&wake, Duration::from_millis(500));
            let waited = Instant::now();
            while !thread.is_finished() && waited.elapsed() < ACCEPT_BACKOFF_MAX * 2 {
                thread::sleep(Duration::from_millis(1));
            }
            if thread.is_finished() {
                let _ = thread.join();
                return;
            }
        }
        // Still not woken: leave the thread; it ends at its next accept.
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}
