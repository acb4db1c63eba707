//! Endpoints as vLLM's `ZmqEventPublisher` treats them: which ones the PUB socket binds
//! ([`is_bind_endpoint`]) and the per-data-parallel-rank offset ([`offset_endpoint`]).

use std::fmt;

/// Why an endpoint cannot be offset for a data-parallel rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointError {
    /// The endpoint as given.
    pub endpoint: String,
    /// What is wrong with it.
    pub reason: EndpointProblem,
}

/// What is wrong with an [`EndpointError`]'s endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EndpointProblem {
    /// A rank above 0 needs an `inproc` or `tcp` endpoint (vLLM refuses the others too).
    Transport,
    /// The text after the last `:` of a `tcp` endpoint is not a port number.
    Port,
    /// The port plus the rank is past 65,535.
    PortOverflow,
}

impl fmt::Display for EndpointError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e = &self.endpoint;
        match self.reason {
            EndpointProblem::Transport => write!(
                f,
                "kv-events endpoint {e}: a data-parallel rank above 0 needs an inproc or tcp \
                 endpoint"
            ),
            EndpointProblem::Port => {
                write!(f, "kv-events endpoint {e}: no port after the last ':'")
            }
            EndpointProblem::PortOverflow => write!(
                f,
                "kv-events endpoint {e}: its port plus the data-parallel rank is past 65535"
            ),
        }
    }
}

impl std::error::Error for EndpointError {}

/// Whether the PUB socket binds `endpoint` (a wildcard host, `::`, `ipc://` or `inproc://`)
/// rather than connecting to it, as in vLLM: `tcp://*:5557` binds, `tcp://127.0.0.1:5557`
/// connects to a subscriber that bound it. The replay socket always binds.
#[must_use]
pub fn is_bind_endpoint(endpoint: &str) -> bool {
    endpoint.contains('*')
        || endpoint.contains("::")
        || endpoint.starts_with("ipc://")
        || endpoint.starts_with("inproc://")
}

/// `endpoint` for data-parallel rank `rank`, as vLLM offsets it: unchanged for rank 0;
/// `inproc` endpoints get `_dp{rank}` appended; `tcp` ones get `rank` added to the port after
/// the last `:` (a port of 0 is left to the OS).
///
/// ```
/// use kvtier::kv_events::offset_endpoint;
/// assert_eq!(offset_endpoint("tcp://*:5557", 2).unwrap(), "tcp://*:5559");
/// assert_eq!(offset_endpoint("inproc://cache", 1).unwrap(), "inproc://cache_dp1");
/// assert_eq!(offset_endpoint("tcp://*:0", 3).unwrap(), "tcp://*:0");
/// assert!(offset_endpoint("ipc:///tmp/kv", 1).is_err());
/// ```
///
/// # Errors
/// [`EndpointError`] for a rank above 0 with another transport, a `tcp` endpoint whose last
/// `:` is followed by no port number, or a port that the offset takes past 65,535.
pub fn offset_endpoint(endpoint: &str, rank: u32) -> Result<String, EndpointError> {
    let fail = |reason| EndpointError {
        endpoint: endpoint.to_owned(),
        reason,
    };
    if endpoint.is_empty() || rank == 0 {
        return Ok(endpoint.to_owned());
    }
    if endpoint.contains("inproc") {
        return Ok(format!("{endpoint}_dp{rank}"));
    }
    if !endpoint.contains("tcp") {
        return Err(fail(EndpointProblem::Transport));
    }
    let Some(colon) = endpoint.rfind(':') else {
        return Ok(endpoint.to_owned());
    };
    let (base, port) = (&endpoint[..colon], &endpoint[colon + 1..]);
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(fail(EndpointProblem::Port));
    }
    let port: u64 = port
        .parse()
        .map_err(|_| fail(EndpointProblem::PortOverflow))?;
    if port == 0 {
        return Ok(endpoint.to_owned());
    }
    let shifted = port + u64::from(rank);
    if shifted > u64::from(u16::MAX) {
        return Err(fail(EndpointProblem::PortOverflow));
    }
    Ok(format!("{base}:{shifted}"))
}
