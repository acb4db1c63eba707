#!/usr/bin/env bash
# Creates (or reuses) the test virtualenv: vLLM 0.33.0's Python package without its
# dependencies (the tests import only its pure-Python offloading modules; see conftest.py),
# plus numpy, msgspec (imported by vLLM's offloading types), pytest (with pytest-xdist: run.sh
# runs kvtier's own suite on two workers), hypothesis and maturin, and
# the few pure-Python packages the simple offloader's engine types import (see below).
#
#   std-adapter/python/tests/setup_env.sh            # the venv in <repo>/target/pyenv
#   KVTIER_PYENV=/some/dir setup_env.sh               # elsewhere
#   VLLM_WHEEL=/path/to/vllm-0.33.0-*.whl setup_env.sh  # a local copy of vLLM's wheel
#
# vLLM comes from PyPI through pip's cache (the wheel is large: the first run downloads it
# once). Prints the venv's path on its last line.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
venv=${KVTIER_PYENV:-$root/target/pyenv}
python=${PYTHON:-python3}

if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
if ! "$venv/bin/python" -c "import importlib.metadata as m; assert m.version('vllm') == '0.33.0'" 2>/dev/null; then
    "${pip[@]}" install --no-deps "${VLLM_WHEEL:-vllm==0.33.0}"
fi
# (pip then warns that vLLM's own dependencies are missing: they are, on purpose.)
"${pip[@]}" install "numpy>=1.26" "msgspec>=0.18" "typing_extensions>=4.10" \
    "pytest>=8" "pytest-xdist>=3" "hypothesis>=6.100" "maturin>=1.5,<2"
"${pip[@]}" install "pyzmq>=25" "psutil>=5" "urllib3>=2" # vllm.distributed.kv_events's imports
# Imported by the engine types the simple offloader's scheduler uses (vllm_stubs.py): pydantic
# (vLLM's config classes, SamplingParams), cbor2 (vllm.utils.hashing), regex (the KV cache
# specs' module), cloudpickle (vllm.v1.serial_utils).
"${pip[@]}" install "pydantic>=2.12" "cbor2>=5" "regex>=2024" "cloudpickle>=3"
echo "$venv"
