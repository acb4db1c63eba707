//! `kvtier sweep --method stack|sample`: stack rows carry the replay's hit blocks, hit
//! requests and digest (the rest of the rows are the replays themselves); sampled rows are
//! marked, with exact checkpoints beside them and the plot saying so.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use kvtier_cli::Cli;
use kvtier_cli::sweep::SweepReport;
use kvtier_tests::expected::data;

fn sweep(extra: &[&str]) -> SweepReport {
    let trace = data("small-a.kvtrace");
    let mut argv = vec![
        "kvtier",
        "sweep",
        "--trace",
        trace.to_str().unwrap(),
        "--jobs",
        "2",
    ];
    argv.extend_from_slice(extra);
    let a = Cli::try_parse_from(argv).unwrap();
    kvtier_cli::sweep::sweep(a.sweep_options().unwrap(), false).unwrap()
}

const GRID: [&str; 4] = [
    "--capacities",
    "64,1024,4500,6000,8000",
    "--policies",
    "lru,arc",
];

/// Every stack row has the exact sweep's hit blocks, hit requests and digest; every other row
/// is the exact sweep's row; the certified large capacities come from the stack.
#[test]
fn stack_rows_equal_the_replays() {
    let exact = sweep(&GRID);
    let mut args = GRID.to_vec();
    args.extend_from_slice(&["--method", "stack"]);
    let stack = sweep(&args);
    assert_eq!(exact.rows.len(), stack.rows.len());
    let mut from_stack = 0;
    for (e, s) in exact.rows.iter().zip(&stack.rows) {
        assert_eq!((e.capacity, e.policy), (s.capacity, s.policy));
        match s.source {
            "stack" => {
                from_stack += 1;
                assert_eq!(s.policy, "lru");
                assert_eq!(
                    (s.hit_blocks, s.hit_requests, &s.digest, s.block_hit_rate),
                    (e.hit_blocks, e.hit_requests, &e.digest, e.block_hit_rate)
                );
                assert_eq!((s.evicted_blocks, s.stored_blocks), (None, None));
            }
            "replay" => assert_eq!(s, e),
            other => panic!("source {other}"),
        }
    }
    assert!(
        stack
            .rows
            .iter()
            .any(|r| r.source == "stack" && r.capacity == 8000)
    );
    assert_eq!(stack.replayed, stack.rows.len() - from_stack);
}

/// Sampled rows are marked; the checkpoints are the exact sweep's rows at spread capacities,
/// each error the difference, the largest reported; the plot labels the curves sampled.
#[test]
fn sampled_rows_are_marked_with_exact_checkpoints() {
    let exact = sweep(&GRID);
    let svg = std::env::temp_dir().join(format!("kvtier-sweep-sample-{}.svg", std::process::id()));
    let mut args = GRID.to_vec();
    let svg_arg = svg.to_str().unwrap().to_owned();
    args.extend_from_slice(&[
        "--method", "sample", "--sample", "0.5", "--verify", "2", "--plot",
    ]);
    args.push(&svg_arg);
    let r = sweep(&args);
    assert!(
        r.rows
            .iter()
            .all(|row| row.source == "sample" && row.digest.is_none())
    );
    assert_eq!(r.sample_rate, Some(0.5));
    // Two checkpoints (4500 and 8000 of five capacities) for each policy.
    assert_eq!(r.checkpoints.len(), 4);
    let mut worst = 0f64;
    for c in &r.checkpoints {
        assert!(c.capacity == 4500 || c.capacity == 8000);
        let e = exact
            .rows
            .iter()
            .find(|row| row.capacity == c.capacity && row.policy == c.policy)
            .unwrap();
        assert_eq!(c.exact_block_hit_rate, e.block_hit_rate);
        let s = r
            .rows
            .iter()
            .find(|row| row.capacity == c.capacity && row.policy == c.policy)
            .unwrap();
        assert_eq!(c.sampled_block_hit_rate, s.block_hit_rate);
        assert!((c.error_points - 100.0 * (s.block_hit_rate - e.block_hit_rate)).abs() < 1e-9);
        worst = worst.max(c.error_points.abs());
    }
    assert_eq!(r.max_checkpoint_error, Some(worst));
    let text = std::fs::read_to_string(&svg).unwrap();
    let _ = std::fs::remove_file(&svg);
    assert!(
        text.contains("sampled, R = 0.5"),
        "the legend marks sampled curves"
    );
    assert!(text.contains("exact replays at checkpoints"));
    for policy in ["LRU", "ARC"] {
        assert!(
            text.contains(&format!("{policy} (exact replays)")),
            "the checkpoints' replays of {policy} are drawn as a line beside its sampled curve"
        );
    }
}

/// `--sample-seed` samples other keys: the default seed's rows are those of no flag, another
/// seed moves the estimates, and the checkpoints' exact column does not move.
#[test]
fn the_sample_seed_moves_only_the_estimates() {
    fn run(seed: Option<&str>) -> SweepReport {
        let mut a = GRID.to_vec();
        a.extend_from_slice(&["--method", "sample", "--sample", "0.1", "--verify", "2"]);
        if let Some(s) = seed {
            a.extend_from_slice(&["--sample-seed", s]);
        }
        sweep(&a)
    }
    let plain = run(None);
    let same = run(Some(&kvtier_core::curve::DEFAULT_SEED.to_string()));
    let other = run(Some("7"));
    let rates = |r: &SweepReport| r.rows.iter().map(|x| x.block_hit_rate).collect::<Vec<_>>();
    assert_eq!(rates(&plain), rates(&same));
    assert_ne!(rates(&plain), rates(&other));
    let exact = |r: &SweepReport| {
        r.checkpoints
            .iter()
            .map(|c| c.exact_block_hit_rate)
            .collect::<Vec<_>>()
    };
    assert_eq!(exact(&plain), exact(&other));
    assert_eq!(exact(&plain).len(), 4);
}

/// A rate outside (0, 1] is refused with a message naming the option.
#[test]
fn a_bad_rate_is_refused() {
    let trace = data("small-a.kvtrace");
    let argv = [
        "kvtier",
        "sweep",
        "--trace",
        trace.to_str().unwrap(),
        "--capacities",
        "64",
        "--method",
        "sample",
        "--sample",
        "0",
    ];
    let a = Cli::try_parse_from(argv).unwrap();
    let e = kvtier_cli::sweep::sweep(a.sweep_options().unwrap(), false).unwrap_err();
    assert!(e.to_string().contains("--sample 0"), "{e}");
}

#[test]
fn a_gpu_front_is_refused_outside_exact_sweeps() {
    let trace = data("small-a.kvtrace");
    for method in ["stack", "sample"] {
        let argv = [
            "kvtier",
            "sweep",
            "--trace",
            trace.to_str().unwrap(),
            "--capacities",
            "64",
            "--method",
            method,
            "--gpu-blocks",
            "4096",
        ];
        let a = Cli::try_parse_from(argv).unwrap();
        let e = kvtier_cli::sweep::sweep(a.sweep_options().unwrap(), false).unwrap_err();
        assert!(
            e.to_string()
                .contains("--gpu-blocks works with --method exact only"),
            "{e}"
        );
    }
}
