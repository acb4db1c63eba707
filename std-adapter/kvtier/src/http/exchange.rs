//! One exchange on a connection: the request head read by its deadline, the route it takes
//! and the response written by its deadline.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::{MAX_REQUEST_HEAD, Render};
use crate::export::CONTENT_TYPE;

/// A socket call that ran into its timeout (or a signal): the caller checks its deadline and
/// tries again.
pub(super) fn timed_out_or_interrupted(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// A deadline `after` from now; `None` (no deadline) when it is too far for an `Instant`.
pub(super) fn deadline_in(after: Duration) -> Option<Instant> {
    Instant::now().checked_add(after)
}

/// The time left before `deadline` (`None`: no deadline), or `Err` once it has passed.
pub(super) fn time_left(deadline: Option<Instant>) -> Result<Option<Duration>, ()> {
    match deadline.map(|d| d.saturating_duration_since(Instant::now())) {
        Some(left) if left.is_zero() => Err(()),
        left => Ok(left),
    }
}

/// Writes all of `bytes` by `deadline` (one deadline for the whole write, not per call).
pub(super) fn write_by(
    stream: &mut TcpStream,
    mut bytes: &[u8],
    deadline: Option<Instant>,
    progress: &dyn Fn(),
) -> io::Result<()> {
    while !bytes.is_empty() {
        let left = time_left(deadline).map_err(|()| io::Error::from(io::ErrorKind::TimedOut))?;
        stream.set_write_timeout(left)?;
        match stream.write(bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                bytes = bytes.get(n..).unwrap_or_default();
                progress();
            }
            Err(e) if timed_out_or_interrupted(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// One response: status line, headers, body.
pub(super) struct Response {
    status: &'static str,
    content_type: &'static str,
    body: String,
    /// Adds `Allow: GET, HEAD` (for 405).
    allow: bool,
}

const TEXT: &str = "text/plain; charset=utf-8";

impl Response {
    pub(super) fn text(status: &'static str, body: &str) -> Self {
        Response {
            status,
            content_type: TEXT,
            body: body.to_owned(),
            allow: false,
        }
    }

    /// The status line and headers; `Content-Length` is the body's length also when the body
    /// is not sent (HEAD).
    fn head(&self) -> String {
        let allow = if self.allow {
            "Allow: GET, HEAD\r\n"
        } else {
            ""
        };
        format!(
            "HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{allow}\
             Connection: close\r\n\r\n",
            self.status,
            self.content_type,
            self.body.len()
        )
    }

    /// Sends the head and, unless `head_only`, the body, by `deadline`; errors are the
    /// client's problem and end the connection.
    pub(super) fn send(
        &self,
        stream: &mut TcpStream,
        head_only: bool,
        deadline: Option<Instant>,
        progress: &dyn Fn(),
    ) {
        let _ = write_by(stream, self.head().as_bytes(), deadline, progress)
            .and_then(|()| {
                if head_only {
                    Ok(())
                } else {
                    write_by(stream, self.body.as_bytes(), deadline, progress)
                }
            })
            .and_then(|()| stream.flush());
    }
}

/// Why no request head was read.
pub(super) enum HeadError {
    /// The client closed before sending anything.
    Closed,
    /// The head was not complete by its deadline.
    Timeout,
    /// The head passed [`MAX_REQUEST_HEAD`].
    TooLarge,
    /// The socket failed (or was shut down to shed the connection).
    Io,
}

pub(super) fn ends_head(tail: &[u8]) -> bool {
    tail.windows(4).any(|w| w == b"\r\n\r\n") || tail.windows(2).any(|w| w == b"\n\n")
}

/// Reads the request head (up to the blank line), at most [`MAX_REQUEST_HEAD`] bytes, all of
/// it by `deadline`.
pub(super) fn read_head(
    stream: &mut TcpStream,
    deadline: Option<Instant>,
    progress: &dyn Fn(),
) -> Result<Vec<u8>, HeadError> {
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        let left = time_left(deadline).map_err(|()| HeadError::Timeout)?;
        stream.set_read_timeout(left).map_err(|_| HeadError::Io)?;
        let n = match stream.read(&mut chunk) {
            Ok(n) => n,
            // The deadline is checked at the top of the loop.
            Err(e) if timed_out_or_interrupted(&e) => continue,
            Err(_) => return Err(HeadError::Io),
        };
        if n == 0 {
            // A client that half-closes after a partial head gets it parsed as it is.
            return if head.is_empty() {
                Err(HeadError::Closed)
            } else {
                Ok(head)
            };
        }
        progress();
        let from = head.len().saturating_sub(3);
        head.extend_from_slice(chunk.get(..n).unwrap_or_default());
        if ends_head(head.get(from..).unwrap_or_default()) {
            return Ok(head);
        }
        if head.len() > MAX_REQUEST_HEAD {
            return Err(HeadError::TooLarge);
        }
    }
}

/// The response to a request head, and whether it is a HEAD request (no body sent).
pub(super) fn route(head: &[u8], render: &dyn Render) -> (Response, bool) {
    let bad = || (Response::text("400 Bad Request", "bad request\n"), false);
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.trim_end().split(' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return bad();
    };
    if !version.starts_with("HTTP/1.") {
        return bad();
    }
    let head_only = method == "HEAD";
    let path = target.split('?').next().unwrap_or("");
    let response = if path != "/metrics" {
        Response::text("404 Not Found", "not found; try /metrics\n")
    } else if method != "GET" && !head_only {
        Response {
            allow: true,
            ..Response::text("405 Method Not Allowed", "only GET and HEAD\n")
        }
    } else {
        match render() {
            Ok(body) => Response {
                status: "200 OK",
                content_type: CONTENT_TYPE,
                body,
                allow: false,
            },
            Err(e) => Response::text("500 Internal Server Error", &e.to_string()),
        }
    };
    (response, head_only)
}
