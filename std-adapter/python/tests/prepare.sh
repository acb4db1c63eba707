#!/usr/bin/env bash
# Prepares what run.sh needs that is slow to fetch: the test venv (setup_env.sh) and vLLM
# 0.33.0's own tests (vllm_tests/fetch.py). Both steps are idempotent and run.sh takes them
# again at no cost once they are done; `cargo xtask test` runs this in the background while the
# Rust tests build, so the downloads overlap the compiling.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
venv=$("$here/setup_env.sh" | tail -n 1)
"$venv/bin/python" "$here/vllm_tests/fetch.py" "$root/target/vllm-0.33.0-tests" >/dev/null
echo "$venv"
