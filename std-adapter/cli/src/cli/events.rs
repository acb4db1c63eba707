//! `kvtier events`: subscribes to a KV-events stream (vLLM's or kvtier's) and prints each
//! message as one JSON line: its topic, sequence, the batch as msgspec's `to_builtins` shows
//! a `KVEventBatch` (an array `[ts, events, data_parallel_rank]`, each event a map tagged
//! `type` without its unset optional fields; bytes as hex), and whether kvtier's encoder gives
//! back the payload's exact bytes.

use std::io::Write;
use std::time::Duration;

use kvtier::kv_events::{BlockHash, EventBatch, KvEvent, Subscriber, encode};
use serde_json::{Map, Value, json};

use super::OutputError;

/// Options of `kvtier events`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct EventsArgs {
    /// The publisher's endpoint (connected to, unless --bind).
    #[arg(long, value_name = "ENDPOINT")]
    pub endpoint: String,
    /// Bind the endpoint, for a publisher that connects (vLLM's does to `tcp://HOST:PORT`);
    /// the bound endpoint is printed on stderr.
    #[arg(long)]
    pub bind: bool,
    /// The topic prefix to subscribe to (default: every topic).
    #[arg(long, default_value = "", value_name = "T")]
    pub topic: String,
    /// Stop after this many messages (default: never).
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
    /// Stop when no message came for this many milliseconds (default: never).
    #[arg(long, value_name = "MS")]
    pub idle_ms: Option<u64>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn hash(h: &BlockHash) -> Value {
    match h {
        BlockHash::Int(v) => json!(v),
        BlockHash::Bytes(b) => json!(hex(b)),
    }
}

fn hashes(hs: &[BlockHash]) -> Value {
    Value::Array(hs.iter().map(hash).collect())
}

/// A msgpack value of `extra_keys` as JSON (bytes as hex, maps by their keys' text).
fn msgpack(v: &rmpv::Value) -> Value {
    match v {
        rmpv::Value::Nil => Value::Null,
        rmpv::Value::Boolean(b) => json!(b),
        rmpv::Value::Integer(i) => i
            .as_u64()
            .map(Value::from)
            .or_else(|| i.as_i64().map(Value::from))
            .unwrap_or(Value::Null),
        rmpv::Value::F32(f) => json!(f),
        rmpv::Value::F64(f) => json!(f),
        rmpv::Value::String(s) => json!(s.as_str().unwrap_or_default()),
        rmpv::Value::Binary(b) | rmpv::Value::Ext(_, b) => json!(hex(b)),
        rmpv::Value::Array(a) => Value::Array(a.iter().map(msgpack).collect()),
        rmpv::Value::Map(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    (
                        k.as_str().map_or_else(|| k.to_string(), str::to_owned),
                        msgpack(v),
                    )
                })
                .collect(),
        ),
    }
}

fn event(e: &KvEvent) -> Value {
    let mut o = Map::new();
    o.insert("type".into(), json!(e.tag()));
    let opt = |o: &mut Map<String, Value>, k: &str, v: Option<Value>| {
        if let Some(v) = v {
            o.insert(k.into(), v);
        }
    };
    match e {
        KvEvent::Stored(s) => {
            o.insert("block_hashes".into(), hashes(&s.block_hashes));
            o.insert(
                "parent_block_hash".into(),
                s.parent_block_hash.as_ref().map_or(Value::Null, hash),
            );
            o.insert("token_ids".into(), json!(s.token_ids));
            o.insert("block_size".into(), json!(s.block_size));
            o.insert("lora_id".into(), json!(s.lora_id));
            o.insert("medium".into(), json!(s.medium));
            o.insert("lora_name".into(), json!(s.lora_name));
            opt(&mut o, "extra_keys", s.extra_keys.as_ref().map(msgpack));
            opt(&mut o, "group_idx", s.group_idx.map(|v| json!(v)));
            opt(
                &mut o,
                "kv_cache_spec_kind",
                s.kv_cache_spec_kind.clone().map(Value::from),
            );
            opt(
                &mut o,
                "kv_cache_spec_sliding_window",
                s.kv_cache_spec_sliding_window.map(|v| json!(v)),
            );
            opt(&mut o, "locality", s.locality.clone().map(Value::from));
            opt(&mut o, "ownership", s.ownership.clone().map(Value::from));
            opt(&mut o, "session_id", s.session_id.clone().map(Value::from));
            opt(
                &mut o,
                "lookahead_token_ids",
                s.lookahead_token_ids.as_ref().map(|l| json!(l)),
            );
        }
        KvEvent::Removed(r) => {
            o.insert("block_hashes".into(), hashes(&r.block_hashes));
            o.insert("medium".into(), json!(r.medium));
            opt(&mut o, "group_idx", r.group_idx.map(|v| json!(v)));
            opt(&mut o, "locality", r.locality.clone().map(Value::from));
            opt(&mut o, "ownership", r.ownership.clone().map(Value::from));
        }
        KvEvent::AllCleared => {}
    }
    Value::Object(o)
}

/// A batch as msgspec's `to_builtins` shows it (bytes as hex).
#[must_use]
pub(crate) fn batch_json(b: &EventBatch) -> Value {
    json!([
        b.ts,
        b.events.iter().map(event).collect::<Vec<_>>(),
        b.data_parallel_rank
    ])
}

/// Runs `kvtier events`.
///
/// # Errors
/// A socket that cannot be opened, a message that cannot be read or decoded, or stdout.
pub(crate) fn run(args: &EventsArgs, out: &mut dyn Write) -> Result<(), crate::Error> {
    let sub = Subscriber::open(&args.endpoint, &args.topic, args.bind)?;
    if let Some(e) = sub.bound_endpoint().filter(|_| args.bind) {
        eprintln!("kvtier events: bound {e}");
    }
    let idle = args.idle_ms.map_or(Duration::MAX, Duration::from_millis);
    let wait = idle.min(Duration::from_secs(3600));
    let mut n = 0u64;
    while args.count.is_none_or(|c| n < c) {
        let Some(m) = sub.recv(wait).map_err(kvtier::Error::from)? else {
            if args.idle_ms.is_some() {
                break;
            }
            continue;
        };
        let batch = m.batch().map_err(kvtier::Error::from)?;
        let line = json!({
            "topic": String::from_utf8_lossy(&m.topic),
            "seq": m.seq,
            "batch": batch_json(&batch),
            "reencodes": encode(&batch) == m.payload,
        });
        writeln!(out, "{line}").map_err(OutputError::Write)?;
        out.flush().map_err(OutputError::Write)?;
        n += 1;
    }
    Ok(())
}
