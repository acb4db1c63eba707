//! A small HTTP/1.1 endpoint that serves `/metrics` (std `TcpListener`, one short-lived thread
//! per connection).
//!
//! - `GET /metrics` (a query string is ignored) answers 200 with the text exposition and
//!   `Content-Type: text/plain; version=0.0.4`; any other path is 404, any other method 405,
//!   a request that is not HTTP is 400. Every response closes the connection.
//! - A slow or malformed client cannot stall other scrapes: each connection has its own thread,
//!   reads and writes time out ([`ServerConfig::io_timeout`]), the request head is capped at
//!   [`MAX_REQUEST_HEAD`] bytes, and at most [`ServerConfig::max_connections`] are served at
//!   once (more get 503 at once).
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

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use crate::export::CONTENT_TYPE;
// Real sockets and OS threads: never modelled by loom, so std's Arc, not the facade.
use std::sync::Arc;

/// The longest request head (request line and headers) read, in bytes.
pub const MAX_REQUEST_HEAD: usize = 8192;

/// How a [`MetricsServer`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerConfig {
    /// Read and write timeout of each connection (default 5 s).
    pub io_timeout: Duration,
    /// Connections served at once (default 64); more are answered 503 and closed.
    pub max_connections: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            io_timeout: Duration::from_secs(5),
            max_connections: 64,
        }
    }
}

/// Renders the body of `/metrics`, or an error text (answered 500).
pub trait Render: Fn() -> Result<String, String> + Send + Sync + 'static {}
impl<F: Fn() -> Result<String, String> + Send + Sync + 'static> Render for F {}

/// A running `/metrics` endpoint; [`stop`](Self::stop) (or dropping it) ends it.
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

fn respond(stream: &mut TcpStream, status: &str, content_type: &str, body: &str) {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    let _ = stream
        .write_all(head.as_bytes())
        .and_then(|()| stream.write_all(body.as_bytes()))
        .and_then(|()| stream.flush());
}

/// Reads the request head (up to the blank line), bounded in size and time.
fn read_head(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).ok()?;
        if n == 0 {
            return (!head.is_empty()).then_some(head);
        }
        head.extend_from_slice(chunk.get(..n)?);
        if head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n") {
            return Some(head);
        }
        if head.len() > MAX_REQUEST_HEAD {
            return None;
        }
    }
}

fn serve_one(mut stream: TcpStream, config: ServerConfig, render: &dyn Render) {
    let _ = stream.set_read_timeout(Some(config.io_timeout));
    let _ = stream.set_write_timeout(Some(config.io_timeout));
    let text = "text/plain; charset=utf-8";
    let Some(head) = read_head(&mut stream) else {
        respond(&mut stream, "400 Bad Request", text, "bad request\n");
        return;
    };
    let line = head.split(|b| *b == b'\n').next().unwrap_or(&[]);
    let line = String::from_utf8_lossy(line);
    let mut parts = line.trim_end().split(' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        respond(&mut stream, "400 Bad Request", text, "bad request\n");
        return;
    };
    if !version.starts_with("HTTP/1.") {
        respond(&mut stream, "400 Bad Request", text, "bad request\n");
        return;
    }
    let path = target.split('?').next().unwrap_or("");
    if path != "/metrics" {
        respond(
            &mut stream,
            "404 Not Found",
            text,
            "not found; try /metrics\n",
        );
    } else if method != "GET" {
        respond(&mut stream, "405 Method Not Allowed", text, "only GET\n");
    } else {
        match render() {
            Ok(body) => respond(&mut stream, "200 OK", CONTENT_TYPE, &body),
            Err(e) => respond(&mut stream, "500 Internal Server Error", text, &e),
        }
    }
}

/// Decrements the live-connection count when a connection thread ends (also on panic).
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
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
        let stopping = Arc::new(AtomicBool::new(false));
        let stop = Arc::clone(&stopping);
        let render: Arc<dyn Render> = Arc::new(render);
        let live = Arc::new(AtomicUsize::new(0));
        let thread = thread::Builder::new()
            .name("kvtier-http".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::Acquire) {
                        break;
                    }
                    let Ok(mut stream) = conn else { continue };
                    if live.fetch_add(1, Ordering::AcqRel) >= config.max_connections {
                        live.fetch_sub(1, Ordering::AcqRel);
                        let _ = stream.set_write_timeout(Some(config.io_timeout));
                        respond(
                            &mut stream,
                            "503 Service Unavailable",
                            "text/plain",
                            "busy\n",
                        );
                        continue;
                    }
                    let slot = Slot(Arc::clone(&live));
                    let render = Arc::clone(&render);
                    let spawned = thread::Builder::new()
                        .name("kvtier-http-conn".into())
                        .spawn(move || {
                            let _slot = slot;
                            serve_one(stream, config, &*render);
                        });
                    // If no thread can be had, the connection is dropped (and its slot freed).
                    drop(spawned);
                }
            })?;
        Ok(MetricsServer {
            addr,
            stopping,
            thread: Some(thread),
        })
    }

    /// The address actually bound (useful after binding port 0).
    #[must_use]
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting and waits for the accept thread (connections in flight finish on
    /// their own threads).
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stopping.store(true, Ordering::Release);
        // Wake the blocking accept with one connection to ourselves (loopback when bound to
        // an unspecified address).
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(match wake {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.shutdown();
        }
    }
}
