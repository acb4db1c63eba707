#!/usr/bin/env bash
# The Python test suite: creates or reuses the test venv (setup_env.sh), builds and installs
# the kvtier package into it, runs pytest against vLLM 0.33.0's real modules, then vLLM
# 0.33.0's own offloading tests against kvtier's manager (vllm_tests/: fetch.py puts them in
# target/vllm-0.33.0-tests, unchanged; the kvtier_in_vllm plugin runs them), and vLLM's own
# simple-offloader scheduler tests against vLLM's class and then kvtier's (simple_in_vllm).
#
#   std-adapter/python/tests/run.sh              # everything
#   std-adapter/python/tests/run.sh -k plugin    # pytest arguments pass through (kvtier's
#                                                # suite only)
#   KVTIER_VLLM_TESTS=only run.sh                # vLLM's tests only
#
# Exits non-zero when a test fails, and also when pytest collected no test (its exit code 5).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
venv=$("$here/setup_env.sh" | tail -n 1)
# The build reuses cargo's target directory; maturin comes from the venv (no build isolation).
export PATH="$venv/bin:$PATH"
"$venv/bin/python" -m pip --disable-pip-version-check -q install --no-build-isolation \
    --force-reinstall --no-deps "$here/.."
cd "$here"
export OPENBLAS_NUM_THREADS=1

check() {
    if [ "$1" -eq 5 ]; then
        echo "run.sh: pytest collected no tests" >&2
        exit 1
    fi
    if [ "$1" -ne 0 ]; then
        exit "$1"
    fi
}

if [ "${KVTIER_VLLM_TESTS:-}" != "only" ]; then
    set +e
    # Two workers (pytest-xdist): the tests share no state (their sockets bind port 0), and one
    # worker would leave a core idle. KVTIER_PYTEST_WORKERS=0 runs them in this process.
    "$venv/bin/python" -m pytest -q -p no:cacheprovider -n "${KVTIER_PYTEST_WORKERS:-2}" "$@"
    rc=$?
    set -e
    check "$rc"
fi

if [ $# -eq 0 ] && [ "${KVTIER_VLLM_TESTS:-}" != "0" ]; then
    vt=$("$venv/bin/python" "$here/vllm_tests/fetch.py" "$root/target/vllm-0.33.0-tests")
    suite="$vt/tests/v1/kv_offload"
    set +e
    PYTHONPATH="$here:$here/vllm_tests" "$venv/bin/python" -m pytest -q -p no:cacheprovider \
        -p kvtier_in_vllm --rootdir="$vt" --confcutdir="$suite" \
        "$suite/cpu/test_manager.py" "$suite/cpu/policies/test_factory.py" \
        "$suite/test_factory.py"
    rc=$?
    set -e
    check "$rc"
    # vLLM's own simple-offloader scheduler tests: first against vLLM's class (the torch-free
    # harness must let all of them pass), then against kvtier's (simple_in_vllm.py).
    simple="$vt/tests/v1/simple_kv_offload"
    for mode in vllm kvtier; do
        set +e
        KVTIER_SIMPLE=$mode PYTHONPATH="$here:$here/vllm_tests" "$venv/bin/python" -m pytest \
            -q -p no:cacheprovider -p simple_in_vllm --rootdir="$vt" --confcutdir="$simple" \
            "$simple/test_scheduler.py"
        rc=$?
        set -e
        check "$rc"
    done
fi
