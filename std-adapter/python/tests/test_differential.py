"""vLLM 0.33.0's CPUOffloadingManager and kvtier's, side by side (see differential.py)."""

import os

import pytest

from differential import Config, Mismatch, run_sequence

SEQUENCES = int(os.environ.get("KVTIER_DIFF_SEQUENCES", "1000"))

CONFIGS = {
    "lru": Config("lru", store_threshold=1),
    "arc": Config("arc", store_threshold=1),
    "lru-threshold": Config("lru", store_threshold=2, max_tracker_size=6),
    "arc-threshold": Config("arc", store_threshold=2, max_tracker_size=6),
    "lru-no-events": Config("lru", store_threshold=0, enable_events=False),
    "arc-threshold3-no-events": Config(
        "arc", store_threshold=3, enable_events=False, max_tracker_size=64_000
    ),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_sequences_agree(name):
    cfg = CONFIGS[name]
    calls = 0
    for seed in range(SEQUENCES):
        try:
            pair = run_sequence(seed, cfg)
        except Mismatch as e:
            raise AssertionError(f"{name}, seed {seed}: {e}") from None
        calls += pair.calls
    # Every sequence made calls; the total is reported for the record.
    assert calls >= SEQUENCES * 10
    print(f"{name}: {SEQUENCES} sequences, {calls} compared calls")
