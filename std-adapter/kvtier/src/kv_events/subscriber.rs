//! [`Subscriber`]: the other end of the stream, a SUB socket that reads the messages of a
//! vLLM or kvtier publisher as [`Message`]s (for tests and `kvtier events`).

use std::fmt;
use std::time::Duration;

use super::decode::{DecodeError, decode};
use super::event::EventBatch;
use super::publisher::PublishError;

/// One message of the stream: `(topic, sequence, payload)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// The topic frame.
    pub topic: Vec<u8>,
    /// The batch's sequence number.
    pub seq: u64,
    /// The msgpack payload.
    pub payload: Vec<u8>,
}

impl Message {
    /// The payload decoded.
    ///
    /// # Errors
    /// [`DecodeError`] when it is not a `KVEventBatch`.
    pub fn batch(&self) -> Result<EventBatch, DecodeError> {
        decode(&self.payload)
    }
}

/// Why no message could be read.
#[derive(Debug)]
#[non_exhaustive]
pub enum RecvError {
    /// ZMQ failed.
    Zmq(zmq::Error),
    /// A message did not have three frames with an 8-byte sequence (its frame count).
    Frames(usize),
}

impl fmt::Display for RecvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecvError::Zmq(e) => write!(f, "cannot read the kv-events stream: {e}"),
            RecvError::Frames(n) => write!(
                f,
                "a kv-events message has {n} frames, not (topic, 8-byte sequence, payload)"
            ),
        }
    }
}

impl std::error::Error for RecvError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RecvError::Zmq(e) => Some(e),
            RecvError::Frames(_) => None,
        }
    }
}

/// A SUB socket on one endpoint and topic prefix.
pub struct Subscriber {
    socket: zmq::Socket,
    _context: zmq::Context,
}

impl fmt::Debug for Subscriber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscriber").finish_non_exhaustive()
    }
}

impl Subscriber {
    /// Subscribes to `topic` (a prefix; empty: everything) on `endpoint`: binds it when
    /// `bind` (for a publisher that connects, as vLLM's does to a `tcp://HOST:PORT`
    /// endpoint), else connects to it.
    ///
    /// # Errors
    /// [`PublishError::Socket`] naming the endpoint, or [`PublishError::Setup`].
    pub fn open(endpoint: &str, topic: &str, bind: bool) -> Result<Self, PublishError> {
        let context = zmq::Context::new();
        let socket = context.socket(zmq::SUB).map_err(PublishError::Setup)?;
        socket
            .set_subscribe(topic.as_bytes())
            .map_err(PublishError::Setup)?;
        socket.set_linger(0).map_err(PublishError::Setup)?;
        let done = if bind {
            socket.bind(endpoint)
        } else {
            socket.connect(endpoint)
        };
        done.map_err(|error| PublishError::Socket {
            socket: "SUB",
            endpoint: endpoint.to_owned(),
            error,
        })?;
        Ok(Subscriber {
            socket,
            _context: context,
        })
    }

    /// The endpoint the socket is bound to (the OS's port for a port of 0), when bound.
    #[must_use]
    pub fn bound_endpoint(&self) -> Option<String> {
        self.socket.get_last_endpoint().ok().and_then(Result::ok)
    }

    /// The next message, waiting at most `timeout` (`None`: nothing came).
    ///
    /// # Errors
    /// [`RecvError`] for a ZMQ failure or a message not of the stream's shape.
    pub fn recv(&self, timeout: Duration) -> Result<Option<Message>, RecvError> {
        let ms = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX);
        if self.socket.poll(zmq::POLLIN, ms).map_err(RecvError::Zmq)? == 0 {
            return Ok(None);
        }
        let frames = self
            .socket
            .recv_multipart(zmq::DONTWAIT)
            .map_err(RecvError::Zmq)?;
        let n = frames.len();
        let Ok([topic, seq, payload]) = <[Vec<u8>; 3]>::try_from(frames) else {
            return Err(RecvError::Frames(n));
        };
        let seq = <[u8; 8]>::try_from(seq.as_slice()).map_err(|_| RecvError::Frames(n))?;
        Ok(Some(Message {
            topic,
            seq: u64::from_be_bytes(seq),
            payload,
        }))
    }
}
