//! The simple offloader's KV events on the wire: a replay through `SimpleRun` publishing to a
//! real socket delivers, batch by batch, exactly the events the same steps record when driven
//! by hand (translated as vLLM's `SimpleCPUOffloadScheduler.take_events` shapes them), one
//! batch per engine step that had events.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use std::sync::Arc;

use kvtier::kv_events::{
    FULL_ATTENTION, HashForm, KvEvent, LOCAL, MEDIUM_CPU, Publisher, PublisherConfig, TierEvents,
};
use kvtier_cli::Cli;
use kvtier_cli::replay::SimpleRun;
use kvtier_cli::tier::EventStream;
use kvtier_cli::tier::SimpleTier;
use kvtier_cli::trace::Record;
use kvtier_core::simple::{SimpleConfig, SimpleScheduler};
use kvtier_tests::kv_events::{ipc, read, subscribed};
use kvtier_tests::simple_drive::{
    BLOCK_TOKENS, SMALL_A, engine, feed, offloader_config, small_a_requests,
};

const CPU_BLOCKS: u32 = 64;

/// The events of the same steps driven by hand, every one kept to the end.
fn by_hand(lazy: bool) -> Vec<KvEvent> {
    let mut engine = engine();
    let mut sc = offloader_config(CPU_BLOCKS, lazy);
    sc.max_requests = 32 * 4 + 64;
    sc.enable_events = true;
    sc.event_capacity = 1 << 20;
    let mut tier = SimpleTier::new(SimpleScheduler::new(sc).unwrap(), BLOCK_TOKENS, 1);
    feed(&mut engine, &mut tier, &small_a_requests());
    let t = engine.counts().steps;
    tier.drain(engine.gpu_mut().pool_mut(), t).unwrap();
    let s = tier.scheduler();
    assert_eq!(s.dropped_events(), 0);
    let form = TierEvents::cpu(16, HashForm::Int);
    let mut out = Vec::new();
    for e in s.take_events() {
        form.push_simple(&e, &kvtier_core::simple::Layout::dense(), &mut out);
    }
    out
}

#[test]
fn a_simple_replay_publishes_the_events_its_steps_record() {
    for lazy in [false, true] {
        let endpoint = ipc(if lazy { "simple-lazy" } else { "simple-eager" });
        let p = Arc::new(
            Publisher::start(&PublisherConfig {
                endpoint: endpoint.clone(),
                ..PublisherConfig::default()
            })
            .unwrap(),
        );
        let sub = subscribed(&p, &endpoint);
        let mut argv = vec![
            "kvtier",
            "replay",
            "--trace",
            SMALL_A,
            "--offloader",
            "simple",
            "--gpu-blocks",
            "300",
            "--max-num-seqs",
            "32",
            "--decode-tokens",
            "8",
        ];
        if lazy {
            argv.push("--lazy");
        }
        let args = Cli::try_parse_from(argv).unwrap();
        let front = args.replay_options().unwrap().gpu.unwrap();
        let sizing = SimpleConfig::with_cpu_blocks(16, 300, CPU_BLOCKS).sizing;
        let stream = EventStream::new(Arc::clone(&p), 16, HashForm::Int);
        let mut run = SimpleRun::with_events(
            front,
            16,
            sizing,
            args.simple_options().unwrap(),
            Some(stream),
        )
        .unwrap();
        for (rid, hashes) in small_a_requests().iter().enumerate() {
            let rec = Record::Load {
                rid: rid as u64,
                hashes,
            };
            run.apply(rec).unwrap();
        }
        run.finish().unwrap();
        let steps = run.engine().counts().steps;
        // The publisher is the test's: this only stops the run's use of it.
        let _ = run.finish_events();

        let want = by_hand(lazy);
        let stored = want
            .iter()
            .filter(|e| matches!(e, KvEvent::Stored(_)))
            .count();
        let removed = want
            .iter()
            .filter(|e| matches!(e, KvEvent::Removed(_)))
            .count();
        assert!(
            stored > 100 && removed > 10,
            "lazy {lazy}: {stored} stored, {removed} removed"
        );
        // Everything queued arrives; then 2 s of silence ends the read.
        let batches = read(&sub, usize::MAX);
        assert_eq!(p.stats().dropped, 0);
        assert!(
            batches.len() as u64 <= steps + 2,
            "{} batches in {steps} steps",
            batches.len()
        );
        let got: Vec<KvEvent> = batches
            .iter()
            .flat_map(|m| m.batch().unwrap().events)
            .collect();
        assert_eq!(got, want, "lazy {lazy}");
        for e in &got {
            match e {
                KvEvent::Stored(s) => {
                    assert_eq!(s.medium.as_deref(), Some(MEDIUM_CPU));
                    assert_eq!(s.locality.as_deref(), Some(LOCAL));
                    assert_eq!(s.kv_cache_spec_kind.as_deref(), Some(FULL_ATTENTION));
                    assert_eq!((s.group_idx, s.block_size), (Some(0), 16));
                    assert!(s.token_ids.is_empty());
                }
                KvEvent::Removed(r) => {
                    assert_eq!(r.medium.as_deref(), Some(MEDIUM_CPU));
                    assert_eq!(r.locality.as_deref(), Some(LOCAL));
                }
                KvEvent::AllCleared => panic!("no reset in a replay"),
            }
        }
        // Eager stores are positional: all but a request's first block carry their parent.
        if !lazy {
            assert!(
                got.iter()
                    .any(|e| matches!(e, KvEvent::Stored(s) if s.parent_block_hash.is_some()))
            );
        }
    }
}
