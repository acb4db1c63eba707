//! A subscriber's side of the KV-events tests: socket paths, a probe batch, subscribing until
//! the publisher sees it, and reading what arrives.

use std::time::{Duration, Instant};

use kvtier::kv_events::{
    BlockHash, BlockRemoved, EventBatch, KvEvent, MEDIUM_CPU, Message, Publisher, Subscriber,
};

/// An `ipc://` endpoint of this process named `name`.
#[must_use]
pub fn ipc(name: &str) -> String {
    let dir = std::env::temp_dir().join(format!("kvtier-kv-events-{}-{name}", std::process::id()));
    format!("ipc://{}", dir.display())
}

/// A batch of one `BlockRemoved` of hash `n` (a probe when `n` is `u64::MAX`).
#[must_use]
pub fn batch(n: u64) -> EventBatch {
    EventBatch {
        ts: 1.0,
        events: vec![KvEvent::Removed(BlockRemoved {
            block_hashes: vec![BlockHash::Int(n.into())],
            medium: Some(MEDIUM_CPU.into()),
            group_idx: None,
            locality: None,
            ownership: None,
        })],
        data_parallel_rank: None,
    }
}

/// Reads until `n` messages came or nothing came for 2 s.
///
/// # Panics
/// When the socket fails.
#[must_use]
pub fn read(sub: &Subscriber, n: usize) -> Vec<Message> {
    let mut got = Vec::new();
    while got.len() < n {
        match sub.recv(Duration::from_secs(2)).expect("recv") {
            Some(m) => got.push(m),
            None => break,
        }
    }
    got
}

/// Subscribes and waits until the publisher sees the subscription (a probe batch arrives),
/// then drains the other probes.
///
/// # Panics
/// When the socket fails or the subscription never reaches the publisher (10 s).
#[must_use]
pub fn subscribed(p: &Publisher, endpoint: &str) -> Subscriber {
    let sub = Subscriber::open(endpoint, "", false).expect("sub");
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        p.publish(batch(u64::MAX)).expect("probe");
        if sub.recv(Duration::from_millis(50)).expect("recv").is_some() {
            while sub
                .recv(Duration::from_millis(200))
                .expect("recv")
                .is_some()
            {}
            return sub;
        }
    }
    panic!("the subscription never reached the publisher");
}
