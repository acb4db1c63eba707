//! The typed error of every command operation, from a real input: the variant, the message the
//! command prints (naming the value at fault), and its conversion into `kvtier_cli::Error`.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use std::error::Error as _;
use std::path::PathBuf;

use kvtier::export::EncodeError;
use kvtier::http::{MetricsServer, ServerConfig};
use kvtier_cli::convert::{ConvertError, ConvertOptions, FromArg, convert};
use kvtier_cli::input::{
    FormatArgs, FormatError, OpenError, ReaderError, TraceFormat, TraceInputError, detect_format,
};
use kvtier_cli::replay::ReplayError;
use kvtier_cli::replay::{ManagerError, ReplayOptions, RunError, replay};
use kvtier_cli::replay::{TransferError, TransferModelError};
use kvtier_cli::serve::{ServeError, start};
use kvtier_cli::sizing::{ReportError, SizeError, parse_dtype, parse_size_floor, report};
use kvtier_cli::sweep::{GridError, SweepOptions, SweepRunError, sweep};
use kvtier_cli::sweep::{RangeError, SweepError};
use kvtier_cli::trace::CompactError;
use kvtier_cli::{Cli, Error, OutputError};
use kvtier_tests::expected::data;

fn parse(argv: &[&str]) -> Result<Cli, clap::Error> {
    let mut full = vec!["kvtier"];
    full.extend_from_slice(argv);
    Cli::try_parse_from(full)
}

fn replay_options(argv: &[&str]) -> ReplayOptions {
    let mut full = vec!["replay"];
    full.extend_from_slice(argv);
    parse(&full).unwrap().replay_options().unwrap()
}

fn sweep_options(argv: &[&str]) -> SweepOptions {
    let mut full = vec!["sweep"];
    full.extend_from_slice(argv);
    parse(&full).unwrap().sweep_options().unwrap().clone()
}

/// The error of `kvtier sweep --trace TRACE EXTRA…`.
fn sweep_err(trace: &str, extra: &[&str]) -> SweepRunError {
    let mut argv = vec!["--trace", trace];
    argv.extend_from_slice(extra);
    sweep(&sweep_options(&argv), false).unwrap_err()
}

fn small_a() -> String {
    data("small-a.kvtrace").display().to_string()
}

/// A fresh directory of this process for the test `test`; the test removes it.
fn tmp_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kvtier-errors-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn an_unknown_dtype_is_a_dtype_error_naming_it() {
    let e = parse_dtype("fp7").unwrap_err();
    assert_eq!(e.name, "fp7");
    let e = Error::from(parse_dtype("fp7").unwrap_err());
    assert_eq!(
        e.to_string(),
        "unknown dtype \"fp7\" (fp32, bf16, fp16, fp8)"
    );
    assert!(matches!(e, Error::Dtype(_)));
    // `kvtier capacity --dtype fp7`: clap reports the parser's message.
    let e = parse(&["capacity", "--model", "llama-3-8b", "--dtype", "fp7"]).unwrap_err();
    assert!(
        e.to_string()
            .contains("unknown dtype \"fp7\" (fp32, bf16, fp16, fp8)"),
        "{e}"
    );
}

#[test]
fn a_bad_size_is_a_size_error_quoting_it() {
    let e = parse_size_floor("70XB").unwrap_err();
    assert_eq!(
        e,
        SizeError::UnknownUnit {
            unit: "xb".into(),
            text: "70XB".into()
        }
    );
    assert_eq!(e.to_string(), "unknown unit \"xb\" in \"70XB\"");
    assert_eq!(
        parse_size_floor("-5"),
        Err(SizeError::Negative("-5".into()))
    );
    let e = parse(&["capacity", "--model", "llama-3-8b", "--memory", "1.2.3G"]).unwrap_err();
    assert!(e.to_string().contains("\"1.2.3G\" is not a size"), "{e}");
}

#[test]
fn a_bad_model_is_a_report_error_naming_the_option() {
    let a = parse(&[
        "capacity",
        "--model",
        "llama-3-8b",
        "--layout",
        "x.json",
        "--memory",
        "1GiB",
    ])
    .unwrap();
    let e = report(a.capacity_options().unwrap()).unwrap_err();
    assert!(
        matches!(
            e,
            ReportError::Option {
                option: "--model",
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "--model: give only one of --model, --layout and --hf-config"
    );
    let missing = "/nonexistent/layout.json";
    let a = parse(&["capacity", "--layout", missing, "--memory", "1GiB"]).unwrap();
    let e = report(a.capacity_options().unwrap()).unwrap_err();
    assert!(matches!(&e, ReportError::Io { path, .. } if path == missing));
    assert!(
        e.to_string().starts_with("/nonexistent/layout.json: "),
        "{e}"
    );
    assert!(e.source().is_some());
    assert!(matches!(Error::from(e), Error::Report(_)));
}

#[test]
fn format_detection_errors_name_both_formats() {
    let e = detect_format(&b"  \n"[..]).unwrap_err();
    assert!(matches!(e, FormatError::Empty));
    assert_eq!(
        e.to_string(),
        "empty trace: expected a kvtrace (`# format=kvtrace v1` first) or a Mooncake JSONL \
         trace (one `{...}` request per line)"
    );
    let e = detect_format(&b"L 0 1 00"[..]).unwrap_err();
    assert!(matches!(e, FormatError::Unknown));
    assert_eq!(
        e.to_string(),
        "unknown trace format: a kvtrace starts with `# format=kvtrace v1`, a Mooncake JSONL \
         trace with `{` (give --format to choose)"
    );
}

#[test]
fn opening_errors_start_with_the_path() {
    let args = FormatArgs::default();
    let e = args
        .open_path(
            std::path::Path::new("/nonexistent/t.kvtrace"),
            None,
            false,
            |f| f,
        )
        .unwrap_err();
    assert!(matches!(e, OpenError::Io { .. }));
    assert!(e.to_string().starts_with("/nonexistent/t.kvtrace: "), "{e}");
    let jsonl = data("mooncake-synthetic.jsonl");
    let e = args.open_path(&jsonl, None, false, |f| f).unwrap_err();
    assert!(matches!(e, OpenError::NoCapacity { .. }));
    assert_eq!(
        e.to_string(),
        format!(
            "{}: a Mooncake trace has no capacity of its own: give --capacity (in chunks of \
             --block-tokens tokens, default 512)",
            jsonl.display()
        )
    );
    // A Mooncake timing model with 0 tokens per block.
    let e = args
        .open_reader(TraceFormat::Mooncake, &b""[..], Some(0))
        .unwrap_err();
    assert!(matches!(e, ReaderError::Timing(_)));
    assert!(
        e.to_string()
            .starts_with("--block-tokens / --prefill-tokens-per-s: "),
        "{e}"
    );
    let e = args
        .open_reader(TraceFormat::Kvtrace, &b"L 0 1 00\n"[..], None)
        .unwrap_err();
    assert!(matches!(e, ReaderError::Header(_)));
}

#[test]
fn conversion_errors_name_the_file_or_the_option() {
    let dir = tmp_dir("convert");
    let options = |input: PathBuf, block_tokens: u32| ConvertOptions {
        from: FromArg::Mooncake,
        input,
        output: dir.join("out.kvtrace"),
        block_tokens,
        timing: kvtier_cli::input::TimingArgs::default(),
    };
    let e = convert(&options("/nonexistent/in.jsonl".into(), 512)).unwrap_err();
    assert!(matches!(e, ConvertError::Open { .. }));
    assert!(e.to_string().starts_with("/nonexistent/in.jsonl: "), "{e}");
    let e = convert(&options(data("mooncake-synthetic.jsonl"), 0)).unwrap_err();
    assert!(matches!(e, ConvertError::Timing(_)));
    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, "{\"timestamp\": 1}\n").unwrap();
    let e = convert(&options(bad.clone(), 512)).unwrap_err();
    assert!(matches!(e, ConvertError::Read { .. }));
    assert_eq!(
        e.to_string(),
        format!("{}: line 1: missing field `input_length`", bad.display())
    );
    assert!(matches!(Error::from(e), Error::Convert(_)));
    // Nothing was written.
    assert!(!dir.join("out.kvtrace").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn manager_errors_name_the_options() {
    let o = replay_options(&["--max-requests", "0"]);
    assert_eq!(o.manager(None).unwrap_err(), ManagerError::ZeroMaxRequests);
    let o = replay_options(&[]);
    let e = o.manager(Some(u64::MAX)).unwrap_err();
    assert_eq!(e, ManagerError::HeaderCapacity(u64::MAX));
    assert_eq!(
        e.to_string(),
        "trace header capacity 18446744073709551615 does not fit in u32"
    );
    let o = replay_options(&["--policy", "arc", "--capacity", "3000000000"]);
    assert_eq!(
        o.manager(None).unwrap_err(),
        ManagerError::ArcTooLarge {
            capacity: 3_000_000_000
        }
    );
}

#[test]
fn replay_errors_name_the_file_the_line_and_the_option() {
    let trace = small_a();
    let e = replay(
        &replay_options(&["--trace", &trace, "--max-requests", "8"]),
        false,
    )
    .unwrap_err();
    let RunError::Trace { path, error } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(path.display().to_string(), trace);
    assert!(
        matches!(
            **error,
            RunError::Record {
                line: Some(25),
                error: ReplayError::TooManyRequests { .. },
                ..
            }
        ),
        "{error:?}"
    );
    assert!(
        e.to_string()
            .starts_with(&format!("{trace}: line 25: request 8 arrives")),
        "{e}"
    );
    assert!(e.source().is_some());
    // A malformed record: the reader's error, with its line.
    let dir = tmp_dir("replay");
    let bad = dir.join("bad.kvtrace");
    std::fs::write(&bad, "# format=kvtrace v1\nL 0 1 00000000000000zz\n").unwrap();
    let e = replay(&replay_options(&["--trace", bad.to_str().unwrap()]), false).unwrap_err();
    std::fs::remove_dir_all(&dir).unwrap();
    let RunError::Trace { error, .. } = &e else {
        panic!("{e:?}")
    };
    assert!(
        matches!(
            **error,
            RunError::Read(CompactError::Source(TraceInputError::Kvtrace(_)))
        ),
        "{error:?}"
    );
    assert!(
        e.to_string()
            .starts_with(&format!("{}: line 2: ", bad.display())),
        "{e}"
    );
    // A bad transfer bandwidth, before anything is replayed.
    let e = replay(
        &replay_options(&["--requests", "10", "--transfer-gbps=-3"]),
        false,
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            RunError::Transfer(TransferError::Bandwidth(TransferModelError::Bandwidth(_)))
        ),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "--transfer-gbps must be a positive number, not -3"
    );
    let e = Error::from(e);
    assert!(matches!(e, Error::Run(_)));
}

#[test]
fn sweep_errors_name_the_option_at_fault() {
    let trace = small_a();
    let e = sweep_err(&trace, &[]);
    assert!(matches!(e, SweepRunError::Grid(GridError::NoCapacities)));
    let e = sweep_err(&trace, &["--from", "10", "--to", "5", "--steps", "3"]);
    assert!(matches!(
        e,
        SweepRunError::Grid(GridError::Range(RangeError::Bounds {
            from: 10,
            to: 5,
            steps: 3
        }))
    ));
    assert_eq!(
        e.to_string(),
        "--from/--to/--steps: need 1 <= from <= to and steps >= 1 (from 10, to 5, steps 3)"
    );
    // One LRU case of 64 chunks under `--max-requests N`.
    let one_case = |max_requests: &str| {
        sweep_err(
            &trace,
            &[
                "--capacities",
                "64",
                "--policies",
                "lru",
                "--max-requests",
                max_requests,
            ],
        )
    };
    // A case whose manager is refused names the case.
    let e = one_case("0");
    let SweepRunError::Sweep {
        error: SweepError::Manager { error, .. },
        ..
    } = &e
    else {
        panic!("{e:?}")
    };
    assert_eq!(
        error.downcast_ref::<ManagerError>(),
        Some(&ManagerError::ZeroMaxRequests)
    );
    assert_eq!(
        e.to_string(),
        format!("{trace}: lru capacity 64 threshold 1: --max-requests must be at least 1")
    );
    // A case whose replay fails names the record.
    let e = one_case("8");
    assert!(
        matches!(
            &e,
            SweepRunError::Sweep {
                error: SweepError::Replay {
                    error: ReplayError::TooManyRequests { .. },
                    ..
                },
                ..
            }
        ),
        "{e:?}"
    );
    let e = sweep_err(&trace, &["--capacities", "64", "--plot", "/tmp/x.jpg"]);
    assert!(matches!(e, SweepRunError::Plot(_)));
    assert!(matches!(Error::from(e), Error::SweepRun(_)));
    // `--plot-size` is parsed by clap with the plot's own error.
    let e = parse(&["sweep", "--trace", &trace, "--plot-size", "12"]).unwrap_err();
    assert!(
        e.to_string()
            .contains("\"12\" is not WIDTHxHEIGHT in pixels (e.g. 1200x750)"),
        "{e}"
    );
}

#[test]
fn serve_errors_are_typed() {
    let a = parse(&["serve", "--listen", "127.0.0.1:0", "--rate", "0"]).unwrap();
    let e = start(&a.serve_options().unwrap())
        .map(|s| s.stop())
        .unwrap_err();
    assert!(matches!(e, ServeError::Rate(_)), "{e:?}");
    assert!(matches!(
        Error::from(
            start(&a.serve_options().unwrap())
                .map(|s| s.stop())
                .unwrap_err()
        ),
        Error::Serve(ServeError::Rate(_))
    ));
    assert!(e.to_string().ends_with("up, not 0"), "{e}");
    let a = parse(&["serve", "--listen", "127.0.0.1:0", "--requests", "10"]).unwrap();
    let mut serving = start(&a.serve_options().unwrap()).unwrap();
    assert_eq!(serving.wait_replay().unwrap().counts.requests, 10);
    let e = serving.wait_replay().unwrap_err();
    assert!(matches!(e, ServeError::AlreadyWaited), "{e:?}");
    assert_eq!(e.to_string(), "the replay was already waited for");
    serving.stop();
    // The replay thread's error, with the path, through `wait_replay`.
    let trace = small_a();
    let a = parse(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--trace",
        &trace,
        "--max-requests",
        "8",
    ])
    .unwrap();
    let mut serving = start(&a.serve_options().unwrap()).unwrap();
    let e = serving.wait_replay().unwrap_err();
    serving.stop();
    assert!(
        matches!(e, ServeError::Run(RunError::Trace { .. })),
        "{e:?}"
    );
    let text = e.to_string();
    assert!(text.starts_with(&format!("{trace}: record ")), "{text}");
    assert!(
        text.contains(": request 8 arrives while 8 requests are in flight"),
        "{text}"
    );
}

#[test]
fn a_bad_family_name_is_an_encode_error_answered_500() {
    let mut family = prometheus::proto::MetricFamily::default();
    family.set_name("bad name".into());
    let e = kvtier::export::encode_families(&[family]).unwrap_err();
    assert_eq!(e, EncodeError::MetricName("bad name".into()));
    assert_eq!(
        e.to_string(),
        "encoding the metrics failed: \"bad name\" is not a metric name"
    );
    assert!(matches!(
        Error::from(e.clone()),
        Error::Adapter(kvtier::Error::Encode(_))
    ));
    // The endpoint answers a render's error with a 500 carrying its message.
    let server = MetricsServer::bind("127.0.0.1:0", ServerConfig::default(), move || {
        Err(e.clone())
    })
    .unwrap();
    let (status, _, body) =
        kvtier_tests::prometheus_server::http_get(server.local_addr(), "/metrics").unwrap();
    server.stop();
    assert_eq!(status, "HTTP/1.1 500 Internal Server Error");
    assert!(
        body.contains("encoding the metrics failed: \"bad name\" is not a metric name"),
        "{body}"
    );
}

#[test]
fn an_unknown_config_dtype_names_it() {
    let e = kvtier_cli::layout::auto_kv_dtype("llama", Some("float31")).unwrap_err();
    assert_eq!(e.name, "float31");
    assert_eq!(e.to_string(), "unknown dtype \"float31\"");
}

#[test]
fn output_errors_say_what_was_being_printed() {
    let e = OutputError::Write(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
    assert_eq!(e.to_string(), "writing the report: broken pipe");
    assert!(e.source().is_some());
    assert!(matches!(Error::from(e), Error::Output(_)));
}
