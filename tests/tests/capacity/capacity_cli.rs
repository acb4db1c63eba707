//! `kvtier capacity` as a library: options → report value → table / JSON, with the sample
//! layouts and config.json files in `tests/data/capacity/`.

use kvtier_cli::Cli;
use kvtier_cli::sizing::{CapacityReport, ReportError, report};

/// A size as `--memory` reads it, its error as the message the command prints.
fn parse_size_floor(text: &str) -> Result<u64, String> {
    kvtier_cli::sizing::parse_size_floor(text).map_err(|e| e.to_string())
}

fn data(name: &str) -> String {
    format!("{}/data/capacity/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// `kvtier capacity` with `args`, parsed.
fn cli(args: &[&str]) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(["kvtier", "capacity"].iter().chain(args))
}

fn run(args: &[&str]) -> Result<CapacityReport, ReportError> {
    report(
        cli(args)
            .expect("options parse")
            .capacity_options()
            .expect("a capacity command"),
    )
}

fn err(args: &[&str]) -> String {
    match cli(args) {
        Ok(a) => report(a.capacity_options().expect("a capacity command"))
            .map_or_else(|e| e.to_string(), |_| String::from("no error")),
        Err(e) => e.to_string(),
    }
}

/// What `kvtier capacity` prints with `args`.
fn output(args: &[&str]) -> String {
    let mut out = Vec::new();
    cli(args)
        .expect("options parse")
        .run_to(&mut out)
        .expect("capacity runs");
    String::from_utf8(out).expect("the output is UTF-8")
}

#[test]
fn sizes_with_units() {
    assert_eq!(parse_size_floor("70GiB"), Ok(70 << 30));
    assert_eq!(parse_size_floor("1.5GiB"), Ok(3 << 29));
    assert_eq!(parse_size_floor("500MB"), Ok(500_000_000));
    assert_eq!(parse_size_floor("4096"), Ok(4096));
    assert_eq!(parse_size_floor("0.0001KiB"), Ok(0));
    assert!(
        parse_size_floor("70XB")
            .unwrap_err()
            .contains("unknown unit")
    );
    assert!(
        parse_size_floor("99999999999TiB")
            .unwrap_err()
            .contains("64 bits")
    );
    assert!(parse_size_floor("1.2.3G").is_err());
    assert!(parse_size_floor("").is_err());
}

#[test]
fn llama3_8b_preset_70gib() {
    let args = [
        "--model",
        "llama-3-8b",
        "--memory",
        "70GiB",
        "--cpu-bytes",
        "100GiB",
    ];
    let r = run(&args).unwrap();
    // page = 8 heads · 16 · (128 + 128) · 2 = 65 536; × 32 layers = 2 MiB per block.
    assert_eq!(r.bytes_per_block, 2_097_152);
    assert_eq!(r.num_blocks, Some(35_840));
    assert_eq!(r.blocks_per_request, 512);
    assert_eq!(r.max_concurrency_exact.as_deref(), Some("70/1"));
    assert_eq!(r.kv_cache_size_tokens, Some(573_440));
    let cpu = r.cpu.as_ref().unwrap();
    assert_eq!(
        (cpu.num_chunks, cpu.aligned_chunk_bytes),
        (51_200, 2_097_152)
    );
    assert_eq!(cpu.kv_cache_size_tokens, Some(819_200));
    let json = output(&[&args[..], &["--json"]].concat());
    assert!(json.contains("\"max_concurrency\": 70.0,"), "{json}");
    assert!(
        json.contains("\"max_concurrency_exact\": \"70/1\","),
        "{json}"
    );
    assert!(json.contains("\"kv_cache_size_tokens\": 819200"), "{json}");
    let table = output(&args);
    assert!(table.contains("GPU KV cache size: 573,440 tokens, Maximum concurrency for 8,192 tokens per request: 70.00x"));
    assert!(table.contains("CPU KV cache size: 819,200 tokens"));
}

#[test]
fn hf_config_matches_preset() {
    let a = run(&[
        "--hf-config",
        &data("llama3-8b.config.json"),
        "--memory",
        "70GiB",
    ])
    .unwrap();
    let b = run(&["--model", "llama-3-8b", "--memory", "70GiB"]).unwrap();
    assert_eq!(
        (a.bytes_per_block, a.num_blocks, a.kv_cache_size_tokens),
        (b.bytes_per_block, b.num_blocks, b.kv_cache_size_tokens)
    );
    // --dtype fp8 halves the page and doubles the blocks.
    let c = run(&[
        "--hf-config",
        &data("llama3-8b.config.json"),
        "--memory",
        "70GiB",
        "--dtype",
        "fp8",
    ])
    .unwrap();
    assert_eq!(c.num_blocks, Some(71_680));
}

#[test]
fn gemma2_alternating_and_layer_types() {
    let r = run(&[
        "--hf-config",
        &data("gemma2-9b.config.json"),
        "--memory",
        "8GiB",
        "--max-num-batched-tokens",
        "2048",
    ])
    .unwrap();
    // 21 sliding + 21 full → two groups of 21. The config says float32, but vLLM 0.33.0's
    // `dtype=auto` downcasts float32 to bfloat16 (`_resolve_auto_dtype`, vllm/config/model.py)
    // and `kv_cache_dtype=auto` takes the model dtype: page 8 · 16 · 512 · 2 = 131 072.
    assert_eq!(r.groups.len(), 2);
    assert_eq!(r.bytes_per_block, 21 * 131_072);
    // full 8192/16 = 512; sliding cdiv(4095 + 2048, 16) + 1 = 385.
    assert_eq!(r.blocks_per_request, 512 + 385);
    let r = run(&[
        "--hf-config",
        &data("layer-types.config.json"),
        "--num-gpu-blocks-override",
        "1000",
        "--max-model-len",
        "4096",
    ])
    .unwrap();
    assert_eq!(r.groups.len(), 2);
    assert_eq!(r.bytes_per_block, 2 * 32_768);
    // full 256 + sliding cdiv(min(127 + 8192, 4096), 16) + 1 = 257.
    assert_eq!(r.blocks_per_request, 513);
    assert_eq!(r.num_blocks, Some(1000));
}

#[test]
fn deepseek_mla_config() {
    let r = run(&[
        "--hf-config",
        &data("deepseek-v3.config.json"),
        "--memory",
        "60GiB",
        "--max-model-len",
        "32768",
    ])
    .unwrap();
    assert_eq!(r.bytes_per_block, 61 * 18_432);
    assert_eq!(r.blocks_per_request, 2048);
    // ⌊60 GiB / 1 124 352⌋ = 57 299
    assert_eq!(r.num_blocks, Some(57_299));
}

#[test]
fn layout_file_hybrid() {
    let r = run(&["--layout", &data("hybrid.layout.json"), "--memory", "1GiB"]).unwrap();
    assert_eq!(r.groups.len(), 3);
    assert_eq!(r.bytes_per_block, 32_768);
    assert_eq!(r.blocks_per_request, 1024 + 2 * 129);
    assert_eq!(r.num_blocks, Some(32_768));
    assert_eq!(r.max_concurrency_exact.as_deref(), Some("16384/641"));
    assert_eq!(r.kv_cache_size_tokens, Some(418_776));
    assert_eq!(r.max_num_batched_tokens, 1024);
}

#[test]
fn layout_file_explicit_groups() {
    let r = run(&[
        "--layout",
        &data("groups.layout.json"),
        "--num-gpu-blocks-override",
        "650",
        "--cpu-bytes",
        "1GiB",
    ])
    .unwrap();
    assert_eq!(r.bytes_per_block, 3 * 73_728);
    assert_eq!(r.blocks_per_request, 64 + 1);
    assert_eq!(r.max_concurrency_exact.as_deref(), Some("10/1"));
    let cpu = r.cpu.unwrap();
    // 221 184 rounded up to 4096 is 221 184 (54 pages); ⌊2^30 / 221 184⌋ = 4854.
    assert_eq!((cpu.aligned_chunk_bytes, cpu.num_chunks), (221_184, 4854));
    // chunks per request: MLA 64 + Mamba cap 1 = 65 → ⌊4854 · 4096 / 65⌋.
    assert_eq!(cpu.kv_cache_size_tokens, Some(4854 * 4096 / 65));
}

#[test]
fn cpu_only_and_json_fields() {
    let args = [
        "--model",
        "qwen2.5-7b",
        "--cpu-bytes",
        "16GiB",
        "--blocks-per-chunk",
        "4",
        "--world-size",
        "2",
    ];
    let r = run(&args).unwrap();
    assert_eq!(r.num_blocks, None);
    assert_eq!(r.max_concurrency, None);
    let json = output(&[&args[..], &["--json"]].concat());
    for key in [
        "\"bytes_per_block\"",
        "\"num_blocks\"",
        "\"blocks_per_request\"",
        "\"max_concurrency\"",
        "\"max_concurrency_exact\"",
        "\"kv_cache_size_tokens\"",
        "\"groups\"",
        "\"cpu\"",
        "\"num_chunks\"",
        "\"aligned_chunk_bytes\"",
        "\"kv_cache_size_bytes\"",
    ] {
        assert!(json.contains(key), "{key} missing in {json}");
    }
    assert!(json.contains("\"num_blocks\": null"), "{json}");
    assert!(json.contains("\"max_concurrency_exact\": null"), "{json}");
    let cpu = r.cpu.unwrap();
    // 28 layers · 4 heads · 16 · 256 · 2 = 917 504 per block; × 2 ranks × 4 blocks.
    assert_eq!(cpu.kv_bytes_per_chunk, 917_504 * 8);
    assert_eq!(cpu.num_chunks, (16u64 << 30) / (917_504 * 8));
}

#[test]
fn admission_error_names_the_length() {
    let e = err(&["--model", "llama-3.1-70b", "--memory", "10GiB"]);
    assert!(e.contains("max_model_len 131072"), "{e}");
    assert!(e.contains("estimated maximum model length is"), "{e}");
}

#[test]
fn errors_name_the_option_or_field() {
    assert!(err(&["--memory", "1GiB"]).starts_with("--model"));
    assert!(err(&["--model", "llama-3-8b"]).starts_with("--memory"));
    assert!(err(&["--model", "nope", "--memory", "1GiB"]).contains("unknown preset"));
    assert!(
        err(&[
            "--model",
            "llama-3-8b",
            "--layout",
            "x.json",
            "--memory",
            "1G"
        ])
        .contains("only one")
    );
    assert!(err(&["--model", "llama-3-8b", "--memory", "70QB"]).contains("--memory"));
    assert!(
        err(&[
            "--model",
            "llama-3-8b",
            "--memory",
            "1GiB",
            "--dtype",
            "fp7"
        ])
        .contains("--dtype")
    );
    assert!(
        err(&[
            "--model",
            "llama-3-8b",
            "--memory",
            "1GiB",
            "--max-model-len",
            "0"
        ])
        .starts_with("--max-model-len")
    );
    assert!(
        err(&[
            "--model",
            "llama-3-8b",
            "--cpu-bytes",
            "1GiB",
            "--blocks-per-chunk",
            "0"
        ])
        .starts_with("--blocks-per-chunk")
    );
    assert!(
        err(&[
            "--model",
            "llama-3-8b",
            "--memory",
            "1GiB",
            "--workers",
            "0"
        ])
        .starts_with("--workers")
    );
    let e = err(&[
        "--layout",
        &data("unknown-field.layout.json"),
        "--memory",
        "1GiB",
    ]);
    assert!(e.contains("unknown field `windw`"), "{e}");
    let e = err(&[
        "--layout",
        &data("window-on-full.layout.json"),
        "--memory",
        "1GiB",
    ]);
    assert!(
        e.contains("layers[1].window: does not apply to kind \"full\""),
        "{e}"
    );
    let e = err(&["--layout", "/nonexistent/x.json", "--memory", "1GiB"]);
    assert!(e.starts_with("/nonexistent/x.json"), "{e}");
}

#[test]
fn layout_json_errors() {
    use kvtier_cli::layout::parse_layout_json;
    let e = parse_layout_json(r#"{"layers": []}"#).unwrap_err();
    assert_eq!(e.field, "max_model_len");
    let e = parse_layout_json(r#"{"max_model_len": 8, "layers": [{"kind": "sliding_window", "block_size": 16, "num_kv_heads": 1, "head_size": 8, "dtype_bytes": 2}]}"#).unwrap_err();
    assert_eq!(e.field, "layers[0].window");
    let e = parse_layout_json(
        r#"{"max_model_len": 8, "layers": [{"kind": "lstm", "block_size": 16}]}"#,
    )
    .unwrap_err();
    assert_eq!(e.field, "layers[0].kind");
    let e = parse_layout_json(r#"{"max_model_len": 8, "layers": [{"kind": "full", "block_size": 16, "num_kv_heads": 1, "head_size": 8, "dtype_bytes": 2, "page_size_padded": 3}]}"#).unwrap_err();
    assert_eq!(e.field, "layers[0]");
    assert!(e.problem.contains("smaller than the unpadded page 512"));
    let e = parse_layout_json(r#"{"max_model_len": 8, "layers": [{"kind": "full", "block_size": 16, "num_kv_heads": 1, "head_size": 8, "dtype_bytes": 2, "layers": 100000}]}"#).unwrap_err();
    assert_eq!(e.field, "layers[0].layers");
}

#[test]
fn workers_take_the_minimum() {
    // 80 layers over 3 stages: [27, 27, 26] → the widest stage's block is 27 pages.
    let one = run(&[
        "--model",
        "llama-3.1-70b",
        "--memory",
        "70GiB",
        "--max-model-len",
        "8192",
    ])
    .unwrap();
    let three = run(&[
        "--model",
        "llama-3.1-70b",
        "--memory",
        "70GiB",
        "--max-model-len",
        "8192",
        "--workers",
        "3",
    ])
    .unwrap();
    assert_eq!(one.bytes_per_block, 80 * 65_536);
    assert_eq!(three.bytes_per_block, 27 * 65_536);
    assert_eq!(three.num_blocks, Some((70u64 << 30) / (27 * 65_536)));
}

/// Writes `contents` to a fresh file named for the calling test and returns its path.
fn temp_file(name: &str, contents: &[u8]) -> String {
    let dir = std::env::temp_dir().join(format!("kvtier-capacity-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(name);
    std::fs::write(&path, contents).expect("temp file");
    path.to_string_lossy().into_owned()
}

const LLAMA_LAYOUT: &str = r#"{ "max_model_len": 1024, "layers": [ { "kind": "full", "block_size": 16, "num_kv_heads": 2, "head_size": 64, "dtype_bytes": 2, "layers": 4 } ] }"#;

#[test]
fn dev_zero_is_refused_after_4_mib() {
    // A device that never ends is refused after 4 MiB + 1 bytes, naming the file and the limit.
    for option in ["--hf-config", "--layout"] {
        let e = err(&[option, "/dev/zero", "--memory", "1GiB"]);
        assert_eq!(
            e,
            format!("/dev/zero: larger than 4 MiB (4,194,304 bytes), the limit for {option} files")
        );
    }
}

#[test]
fn input_files_are_capped_at_4_mib() {
    const CAP: usize = 4 << 20;
    // Valid JSON padded with spaces: exactly 4 MiB is read, one byte more is refused.
    let mut text = LLAMA_LAYOUT.as_bytes().to_vec();
    text.resize(CAP, b' ');
    let at_cap = temp_file("at-cap.layout.json", &text);
    let r = run(&["--layout", &at_cap, "--num-gpu-blocks-override", "100"]).unwrap();
    assert_eq!(r.bytes_per_block, 4 * 8192);
    text.push(b' ');
    let over = temp_file("over-cap.layout.json", &text);
    let e = err(&["--layout", &over, "--memory", "1GiB"]);
    assert_eq!(
        e,
        format!("{over}: larger than 4 MiB (4,194,304 bytes), the limit for --layout files")
    );
    let e = err(&["--hf-config", &over, "--memory", "1GiB"]);
    assert!(e.ends_with("the limit for --hf-config files"), "{e}");
}

#[test]
fn gemma2_float32_config_is_a_bfloat16_cache() {
    // vLLM 0.33.0, dtype=auto: float32 → bfloat16 (`_resolve_auto_dtype`); kv_cache_dtype=auto
    // takes it. Page 8 · 16 · (256 + 256) · 2 = 131 072; 21 layers per group.
    let r = run(&[
        "--hf-config",
        &data("gemma2-9b.config.json"),
        "--memory",
        "70GiB",
    ])
    .unwrap();
    assert_eq!(r.groups[0].page_bytes, 131_072);
    assert_eq!(r.bytes_per_block, 2_752_512);
    // ⌊70 GiB / 2 752 512⌋ = 27 306 (a 4-byte cache would give 13 653).
    assert_eq!(r.num_blocks, Some(27_306));
    // An explicit --dtype still wins.
    let r = run(&[
        "--hf-config",
        &data("gemma2-9b.config.json"),
        "--memory",
        "70GiB",
        "--dtype",
        "fp32",
    ])
    .unwrap();
    assert_eq!(r.num_blocks, Some(13_653));
}

#[test]
fn state_layer_models_are_refused_naming_field_and_type() {
    let e = err(&[
        "--hf-config",
        &data("jamba-v0.1.config.json"),
        "--memory",
        "70GiB",
    ]);
    let path = data("jamba-v0.1.config.json");
    assert!(
        e.starts_with(&format!(
            "{path}: attn_layer_period: is a state-layer field (model type \"jamba\")"
        )),
        "{e}"
    );
    assert!(e.contains("--layout file with \"mamba\" entries"), "{e}");
    let e = err(&[
        "--hf-config",
        &data("qwen3-next-80b-a3b.config.json"),
        "--memory",
        "70GiB",
    ]);
    assert!(
        e.contains("full_attention_interval: is a state-layer field (model type \"qwen3_next\")"),
        "{e}"
    );
    // Without any state-layer field: the architecture, then the model type, then layer_types.
    let bare = |extra: &str| {
        format!(
            r#"{{ {extra} "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 64 }}"#
        )
    };
    let f = temp_file(
        "arch.config.json",
        bare(r#""model_type": "x", "architectures": ["MambaForCausalLM"],"#).as_bytes(),
    );
    let e = err(&["--hf-config", &f, "--memory", "1GiB"]);
    assert!(
        e.starts_with(&format!(
            "{f}: architectures: \"MambaForCausalLM\" has state layers (model type \"x\")"
        )),
        "{e}"
    );
    let f = temp_file(
        "type.config.json",
        bare(r#""model_type": "nemotron_h","#).as_bytes(),
    );
    let e = err(&["--hf-config", &f, "--memory", "1GiB"]);
    assert!(
        e.starts_with(&format!(
            "{f}: model_type: has state layers (model type \"nemotron_h\")"
        )),
        "{e}"
    );
    let f = temp_file(
        "types.config.json",
        bare(r#""model_type": "y", "layer_types": ["full_attention", "linear_attention", "full_attention", "full_attention"],"#).as_bytes(),
    );
    let e = err(&["--hf-config", &f, "--memory", "1GiB"]);
    assert!(
        e.starts_with(&format!(
            "{f}: layer_types[1]: \"linear_attention\" is a state layer (model type \"y\")"
        )),
        "{e}"
    );
}

#[test]
fn llama4_chunked_layers_follow_vllm() {
    let scout = data("llama4-scout.config.json");
    // NoPE layers 3, 7, ..., 47 (no_rope_layer_interval 4) are full attention, the other 36
    // chunked local attention over 8192 tokens: buckets of 36 and 12 → group size 12 →
    // 3 chunked groups and 1 full group of 12 layers.
    let args = [
        "--hf-config",
        &scout,
        "--memory",
        "70GiB",
        "--max-model-len",
        "131072",
    ];
    let r = run(&args).unwrap();
    assert_eq!(r.model, "llama4_text");
    let kinds: Vec<&str> = r.groups.iter().map(|g| g.kind.as_str()).collect();
    assert_eq!(
        kinds,
        ["chunked_local", "chunked_local", "chunked_local", "full"]
    );
    assert!(r.groups.iter().all(|g| g.layers == 12));
    // page 8 · 16 · 256 · 2 = 65 536; 12 layers per group.
    assert_eq!(r.bytes_per_block, 12 * 65_536);
    // full 131072/16 = 8192; chunked cdiv(min(8192 + 8192, 131072), 16) = 1024, three groups.
    assert_eq!(r.blocks_per_request, 8192 + 3 * 1024);
    assert_eq!(r.num_blocks, Some(95_573));
    // With vLLM's --disable-hybrid-kv-cache-manager every layer is allocated as full attention.
    let mut off = args.to_vec();
    off.push("--disable-hybrid-kv-cache-manager");
    let r = run(&off).unwrap();
    assert_eq!(r.groups.len(), 1);
    assert_eq!(r.groups[0].kind, "full");
    assert_eq!(r.bytes_per_block, 48 * 65_536);
    assert_eq!(r.num_blocks, Some(23_893));
    assert_eq!(r.blocks_per_request, 8192);
    // An explicit no_rope_layers list is read; a wrong one is an error naming it.
    let with_list = |list: &str| {
        format!(
            r#"{{"model_type": "llama4_text", "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64, "attention_chunk_size": 32, "no_rope_layers": {list}, "max_position_embeddings": 1024}}"#
        )
    };
    let f = temp_file("nope.config.json", with_list("[0, 1, 1, 0]").as_bytes());
    let r = run(&["--hf-config", &f, "--num-gpu-blocks-override", "1000"]).unwrap();
    let kinds: Vec<&str> = r.groups.iter().map(|g| g.kind.as_str()).collect();
    assert_eq!(kinds, ["full", "chunked_local"]);
    assert_eq!(r.groups[0].layers, 2);
    let f = temp_file("bad-nope.config.json", with_list("[0, 1, 2, 0]").as_bytes());
    let e = err(&["--hf-config", &f, "--num-gpu-blocks-override", "100"]);
    assert_eq!(
        e,
        format!("{f}: no_rope_layers[2]: must be 0 (NoPE layer) or 1 (RoPE layer)")
    );
    let f = temp_file("short-nope.config.json", with_list("[0, 1]").as_bytes());
    let e = err(&["--hf-config", &f, "--num-gpu-blocks-override", "100"]);
    assert_eq!(
        e,
        format!("{f}: no_rope_layers: has 2 entries for 4 layers")
    );
}

#[test]
fn attention_chunk_size_on_an_unknown_pattern_is_refused() {
    let f = temp_file(
        "chunk.config.json",
        br#"{"model_type": "mystery", "num_hidden_layers": 4, "num_attention_heads": 8, "head_dim": 64, "attention_chunk_size": 128}"#,
    );
    let e = err(&[
        "--hf-config",
        &f,
        "--memory",
        "1GiB",
        "--max-model-len",
        "1024",
    ]);
    assert!(
        e.starts_with(&format!(
            "{f}: attention_chunk_size: which layers use chunked local attention is not known for model type \"mystery\""
        )),
        "{e}"
    );
    // With layer_types the pattern is known: 3 chunked + 1 full, group size 1 → 3 chunked
    // groups and 1 full group; chunked: cdiv(min(128 + 8192, 1024), 16) = 64 each.
    let f = temp_file(
        "chunk-types.config.json",
        br#"{"model_type": "mystery", "num_hidden_layers": 4, "num_attention_heads": 8, "head_dim": 64, "attention_chunk_size": 128, "layer_types": ["chunked_attention", "chunked_attention", "chunked_attention", "full_attention"]}"#,
    );
    let args = [
        "--hf-config",
        &f,
        "--num-gpu-blocks-override",
        "1000",
        "--max-model-len",
        "1024",
    ];
    let r = run(&args).unwrap();
    assert_eq!(r.groups.len(), 4);
    assert_eq!(r.blocks_per_request, 4 * 64);
    let mut off = args.to_vec();
    off.push("--disable-hybrid-kv-cache-manager");
    let r = run(&off).unwrap();
    assert_eq!(r.groups.len(), 1);
    assert_eq!(r.blocks_per_request, 64);
    // Explicit groups and Mamba layers cannot be promoted.
    let e = err(&[
        "--layout",
        &data("groups.layout.json"),
        "--num-gpu-blocks-override",
        "650",
        "--disable-hybrid-kv-cache-manager",
    ]);
    assert_eq!(
        e,
        "--disable-hybrid-kv-cache-manager: does not apply to a layout file's explicit groups (give layers)"
    );
    let f = temp_file(
        "mamba.layout.json",
        br#"{ "max_model_len": 1024, "layers": [ { "kind": "full", "block_size": 16, "num_kv_heads": 2, "head_size": 64, "dtype_bytes": 2 }, { "kind": "mamba", "block_size": 16, "state_bytes": 4096 } ] }"#,
    );
    assert_eq!(
        err(&[
            "--layout",
            &f,
            "--memory",
            "1GiB",
            "--disable-hybrid-kv-cache-manager"
        ]),
        "--disable-hybrid-kv-cache-manager: layer 1 is a Mamba layer, which needs the hybrid KV-cache manager"
    );
}

#[test]
fn zero_budgets_and_string_bools_are_errors() {
    let base = ["--model", "llama-3-8b", "--memory", "70GiB"];
    let with = |extra: &[&'static str]| {
        let mut a = base.to_vec();
        a.extend_from_slice(extra);
        err(&a)
    };
    assert_eq!(
        with(&["--max-num-batched-tokens", "0"]),
        "--max-num-batched-tokens: must be at least 1"
    );
    assert_eq!(
        with(&["--max-concurrent-batches", "0"]),
        "--max-concurrent-batches: must be at least 1"
    );
    assert_eq!(
        with(&["--cpu-bytes", "1GiB", "--world-size", "0"]),
        "--world-size: must be at least 1"
    );
    for (field, value) in [("max_num_batched_tokens", 0), ("max_concurrent_batches", 0)] {
        let f = temp_file(
            &format!("{field}.layout.json"),
            format!(
                r#"{{ "max_model_len": 1024, "{field}": {value}, "layers": [ {{ "kind": "full", "block_size": 16, "num_kv_heads": 2, "head_size": 64, "dtype_bytes": 2 }} ] }}"#
            )
            .as_bytes(),
        );
        assert_eq!(
            err(&["--layout", &f, "--memory", "1GiB"]),
            format!("{f}: {field}: must be at least 1")
        );
    }
    let f = temp_file(
        "string-bool.config.json",
        br#"{"model_type": "qwen2", "num_hidden_layers": 4, "num_attention_heads": 8, "head_dim": 64, "use_sliding_window": "true", "sliding_window": 128, "max_window_layers": 2}"#,
    );
    assert_eq!(
        err(&[
            "--hf-config",
            &f,
            "--memory",
            "1GiB",
            "--max-model-len",
            "1024"
        ]),
        format!("{f}: use_sliding_window: must be true or false (a JSON bool), not \"true\"")
    );
    // `sliding_window: 0` is vLLM's "no sliding window": every layer is full attention.
    let f = temp_file(
        "window-zero.config.json",
        br#"{"model_type": "mistral", "num_hidden_layers": 4, "num_attention_heads": 8, "head_dim": 64, "sliding_window": 0}"#,
    );
    let r = run(&[
        "--hf-config",
        &f,
        "--num-gpu-blocks-override",
        "1000",
        "--max-model-len",
        "1024",
    ])
    .unwrap();
    assert_eq!(r.groups.len(), 1);
    assert_eq!(r.groups[0].kind, "full");
}

#[test]
fn size_messages_say_what_is_wrong() {
    assert_eq!(
        parse_size_floor("-1"),
        Err("\"-1\" is negative: a size is a byte count of 0 or more".to_owned())
    );
    assert_eq!(
        parse_size_floor("1e30"),
        Err("\"1e30\" is too large: exceeds 2^64 bytes (sizes are 64 bits)".to_owned())
    );
    assert!(
        parse_size_floor("1e3")
            .unwrap_err()
            .contains("is not an integer byte count"),
    );
    assert_eq!(
        parse_size_floor("99999999999TiB"),
        Err("\"99999999999TiB\" is too large: exceeds 2^64 bytes (sizes are 64 bits)".to_owned())
    );
    let e = err(&["--model", "llama-3-8b", "--memory", "-1"]);
    assert!(e.contains("--memory") && e.contains("is negative"), "{e}");
    // A CPU chunk too large for 64 bits names the option that made it so.
    let e = err(&[
        "--model",
        "llama-3-8b",
        "--cpu-bytes",
        "1GiB",
        "--blocks-per-chunk",
        "18446744073709551615",
    ]);
    assert!(
        e.starts_with("--blocks-per-chunk: CPU tier size overflows u64: a chunk of 18446744073709551615 GPU block(s) of 2097152 bytes for 1 rank(s) is too large"),
        "{e}"
    );
    let e = err(&["--model", "llama-3-8b", "--memory", "1e30"]);
    assert!(
        e.contains("--memory") && e.contains("exceeds 2^64 bytes"),
        "{e}"
    );
}

#[test]
fn layout_messages_name_file_and_field() {
    for field in ["layers", "groups"] {
        let f = temp_file(
            &format!("empty-{field}.layout.json"),
            format!(r#"{{ "max_model_len": 1024, "{field}": [] }}"#).as_bytes(),
        );
        assert_eq!(
            err(&["--layout", &f, "--memory", "1GiB"]),
            format!("{f}: {field}: is empty: a layout needs at least one layer")
        );
    }
    // Only encoder-only layers: no request needs a block.
    let f = temp_file(
        "encoder-only.layout.json",
        br#"{ "max_model_len": 1024, "layers": [ { "kind": "encoder_only", "block_size": 16, "num_kv_heads": 2, "head_size": 64, "dtype_bytes": 2 } ] }"#,
    );
    let e = err(&["--layout", &f, "--memory", "1GiB"]);
    assert!(
        e.starts_with(&format!("{f}: layers: no layer keeps KV cache per request")),
        "{e}"
    );
    // A JSON syntax error: one separator between the file and the message.
    let f = temp_file("broken.layout.json", b"{ \"max_model_len\": ");
    let e = err(&["--layout", &f, "--memory", "1GiB"]);
    assert!(e.starts_with(&format!("{f}: layout file: EOF")), "{e}");
    assert!(!e.contains(": : "), "{e}");
    let f = temp_file("broken.config.json", b"[1, 2");
    let e = err(&["--hf-config", &f, "--memory", "1GiB"]);
    assert!(e.starts_with(&format!("{f}: config.json: EOF")), "{e}");
    assert!(!e.contains(": : "), "{e}");
    // A zero length from config.json names the file and its key, not an option not given.
    let f = temp_file(
        "zero-len.config.json",
        br#"{"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 8, "head_dim": 64, "max_position_embeddings": 0}"#,
    );
    assert_eq!(
        err(&["--hf-config", &f, "--memory", "1GiB"]),
        format!(
            "{f}: max_position_embeddings: max_model_len must be at least 1 (give --max-model-len)"
        )
    );
    // More workers than layers.
    assert_eq!(
        err(&[
            "--model",
            "llama-3-8b",
            "--memory",
            "70GiB",
            "--workers",
            "1024"
        ]),
        "--workers: 1024 pipeline workers for 32 layers: every worker needs at least one layer"
    );
}
