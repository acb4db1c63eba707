//! `kvtier capacity` as a library: options → report value → table / JSON, with the sample
//! layouts and config.json files in `tests/data/capacity/`.

use kvtier::cli::capacity::{
    CapacityArgs, CapacityCliError, parse_size_floor, render_table, report, report_json, thousands,
};

fn data(name: &str) -> String {
    format!("{}/data/capacity/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn run(args: &[&str]) -> Result<kvtier::cli::capacity::CapacityReport, CapacityCliError> {
    report(&CapacityArgs::parse_from_args(args).expect("options parse"))
}

fn err(args: &[&str]) -> String {
    match CapacityArgs::parse_from_args(args) {
        Ok(a) => report(&a).map_or_else(|e| e.to_string(), |_| String::from("no error")),
        Err(e) => e,
    }
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
    assert_eq!(thousands(1_234_567), "1,234,567");
    assert_eq!(thousands(999), "999");
}

#[test]
fn llama3_8b_preset_70gib() {
    let r = run(&[
        "--model",
        "llama-3-8b",
        "--memory",
        "70GiB",
        "--cpu-bytes",
        "100GiB",
    ])
    .unwrap();
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
    let json = report_json(&r).unwrap();
    assert!(json.contains("\"max_concurrency\": 70.0,"), "{json}");
    assert!(
        json.contains("\"max_concurrency_exact\": \"70/1\","),
        "{json}"
    );
    assert!(json.contains("\"kv_cache_size_tokens\": 819200"), "{json}");
    let table = render_table(&r);
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
    // 21 sliding + 21 full → two groups of 21; fp32 page 8 · 16 · 512 · 4 = 262 144.
    assert_eq!(r.groups.len(), 2);
    assert_eq!(r.bytes_per_block, 21 * 262_144);
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
    let r = run(&[
        "--model",
        "qwen2.5-7b",
        "--cpu-bytes",
        "16GiB",
        "--blocks-per-chunk",
        "4",
        "--world-size",
        "2",
    ])
    .unwrap();
    assert_eq!(r.num_blocks, None);
    assert_eq!(r.max_concurrency, None);
    let json = report_json(&r).unwrap();
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
    use kvtier::layout::parse_layout_json;
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
