//! Shared helpers for kvtier's black-box tests: scenario ports of vLLM 0.33.0, trace replays
//! against `expected.tsv`, and proptest reference models.
