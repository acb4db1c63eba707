//! [`encode()`]: an [`EventBatch`] as the msgpack bytes msgspec writes for vLLM's
//! `KVEventBatch`, byte for byte.
//!
//! What msgspec does, and so this encoder:
//! - the batch is `array_like`: an array of its three fields `[ts, events,
//!   data_parallel_rank]`, the rank `nil` when `None` (msgspec keeps the trailing default in the
//!   array);
//! - `ts` is always a float64; integers take their shortest form (unsigned markers for
//!   non-negative values); strings and bytes their shortest header;
//! - each event is a map whose first key is `type` (the tag), then its fields in declaration
//!   order; the required ones always (`nil` for `None`), the defaulted ones only when set
//!   (`omit_defaults`);
//! - a struct with more than 15 possible keys (the tag counted), here `BlockStored` with 18,
//!   gets a map16 header even when fewer keys are written, as msgspec reserves the wide header
//!   before it knows how many defaults it leaves out.

use rmp::Marker;
use rmp::encode::{self, ByteBuf, RmpWrite, ValueWriteError};

use super::event::{BlockHash, BlockRemoved, BlockStored, EventBatch, Int, KvEvent};

/// Keys `BlockStored` can have, its tag included: past 15, msgspec writes a map16 header.
const STORED_KEYS: usize = 18;
/// The widest map a fixmap header holds.
const FIXMAP_MAX: usize = 15;

/// The msgpack bytes of `batch`, as msgspec encodes vLLM's `KVEventBatch`.
#[must_use]
pub fn encode(batch: &EventBatch) -> Vec<u8> {
    let mut w = Writer(ByteBuf::with_capacity(64 + 24 * batch.events.len()));
    w.array(3);
    w.f64(batch.ts);
    w.array(batch.events.len());
    for e in &batch.events {
        match e {
            KvEvent::Stored(s) => w.stored(s),
            KvEvent::Removed(r) => w.removed(r),
            KvEvent::AllCleared => {
                w.map(1, 1);
                w.str("type");
                w.str(e.tag());
            }
        }
    }
    w.opt_int(batch.data_parallel_rank);
    w.0.into_vec()
}

/// The writer: every rmp call on a [`ByteBuf`] is infallible (its error type is empty).
struct Writer(ByteBuf);

/// The value of an rmp write whose error type is empty.
fn done<T>(r: Result<T, ValueWriteError<core::convert::Infallible>>) -> T {
    match r {
        Ok(t) => t,
        Err(ValueWriteError::InvalidMarkerWrite(e) | ValueWriteError::InvalidDataWrite(e)) => {
            match e {}
        }
    }
}

/// A length as msgpack takes it (a batch never holds 2^32 items: saturating is the bound).
fn len32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl Writer {
    fn array(&mut self, n: usize) {
        done(encode::write_array_len(&mut self.0, len32(n)));
    }

    /// A map header for `n` keys of a struct with `possible` keys.
    fn map(&mut self, n: usize, possible: usize) {
        if possible > FIXMAP_MAX && n <= FIXMAP_MAX {
            let n = u16::try_from(n).unwrap_or(u16::MAX).to_be_bytes();
            let Ok(()) = self.0.write_u8(Marker::Map16.to_u8());
            let Ok(()) = self.0.write_bytes(&n);
        } else {
            done(encode::write_map_len(&mut self.0, len32(n)));
        }
    }

    fn f64(&mut self, v: f64) {
        done(encode::write_f64(&mut self.0, v));
    }

    /// An integer as msgspec writes one: unsigned markers when non-negative, signed ones
    /// below zero, the shortest form either way (saturated to msgpack's range).
    fn int(&mut self, v: Int) {
        if v < 0 {
            let i = i64::try_from(v).unwrap_or(i64::MIN);
            done(encode::write_sint(&mut self.0, i));
        } else {
            let u = u64::try_from(v).unwrap_or(u64::MAX);
            done(encode::write_uint(&mut self.0, u));
        }
    }

    fn nil(&mut self) {
        let Ok(()) = encode::write_nil(&mut self.0);
    }

    fn str(&mut self, s: &str) {
        done(encode::write_str(&mut self.0, s));
    }

    fn opt_int(&mut self, v: Option<Int>) {
        match v {
            Some(v) => self.int(v),
            None => self.nil(),
        }
    }

    fn opt_str(&mut self, v: Option<&str>) {
        match v {
            Some(v) => self.str(v),
            None => self.nil(),
        }
    }

    fn hash(&mut self, h: &BlockHash) {
        match h {
            BlockHash::Int(v) => self.int(*v),
            BlockHash::Bytes(b) => done(encode::write_bin(&mut self.0, b)),
        }
    }

    fn hashes(&mut self, hs: &[BlockHash]) {
        self.array(hs.len());
        for h in hs {
            self.hash(h);
        }
    }

    fn ints(&mut self, vs: &[Int]) {
        self.array(vs.len());
        for v in vs {
            self.int(*v);
        }
    }

    fn key_str(&mut self, key: &str, v: Option<&str>) {
        if let Some(v) = v {
            self.str(key);
            self.str(v);
        }
    }

    fn key_int(&mut self, key: &str, v: Option<Int>) {
        if let Some(v) = v {
            self.str(key);
            self.int(v);
        }
    }

    fn stored(&mut self, s: &BlockStored) {
        let set = [
            s.extra_keys.is_some(),
            s.group_idx.is_some(),
            s.kv_cache_spec_kind.is_some(),
            s.kv_cache_spec_sliding_window.is_some(),
            s.locality.is_some(),
            s.ownership.is_some(),
            s.session_id.is_some(),
            s.lookahead_token_ids.is_some(),
        ];
        self.map(8 + set.iter().filter(|b| **b).count(), STORED_KEYS);
        self.str("type");
        self.str("BlockStored");
        self.str("block_hashes");
        self.hashes(&s.block_hashes);
        self.str("parent_block_hash");
        match &s.parent_block_hash {
            Some(h) => self.hash(h),
            None => self.nil(),
        }
        self.str("token_ids");
        self.ints(&s.token_ids);
        self.str("block_size");
        self.int(s.block_size);
        self.str("lora_id");
        self.opt_int(s.lora_id);
        self.str("medium");
        self.opt_str(s.medium.as_deref());
        self.str("lora_name");
        self.opt_str(s.lora_name.as_deref());
        if let Some(v) = &s.extra_keys {
            self.str("extra_keys");
            let mut bytes = Vec::new();
            // Writing into a Vec cannot fail (its io::Write never errs).
            if rmpv::encode::write_value(&mut bytes, v).is_ok() {
                let Ok(()) = self.0.write_bytes(&bytes);
            }
        }
        self.key_int("group_idx", s.group_idx);
        self.key_str("kv_cache_spec_kind", s.kv_cache_spec_kind.as_deref());
        self.key_int(
            "kv_cache_spec_sliding_window",
            s.kv_cache_spec_sliding_window,
        );
        self.key_str("locality", s.locality.as_deref());
        self.key_str("ownership", s.ownership.as_deref());
        self.key_str("session_id", s.session_id.as_deref());
        if let Some(ls) = &s.lookahead_token_ids {
            self.str("lookahead_token_ids");
            self.array(ls.len());
            for l in ls {
                self.ints(l);
            }
        }
    }

    fn removed(&mut self, r: &BlockRemoved) {
        let n = 3
            + usize::from(r.group_idx.is_some())
            + usize::from(r.locality.is_some())
            + usize::from(r.ownership.is_some());
        self.map(n, 6);
        self.str("type");
        self.str("BlockRemoved");
        self.str("block_hashes");
        self.hashes(&r.block_hashes);
        self.str("medium");
        self.opt_str(r.medium.as_deref());
        self.key_int("group_idx", r.group_idx);
        self.key_str("locality", r.locality.as_deref());
        self.key_str("ownership", r.ownership.as_deref());
    }
}
