#!/usr/bin/env bash
# The Python test suite: creates or reuses the test venv (setup_env.sh), builds and installs
# the kvtier package into it, and runs pytest against vLLM 0.33.0's real modules.
#
#   std-adapter/python/tests/run.sh              # everything
#   std-adapter/python/tests/run.sh -k plugin    # pytest arguments pass through
#
# Exits non-zero when a test fails, and also when pytest collected no test (its exit code 5).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv=$("$here/setup_env.sh" | tail -n 1)
# The build reuses cargo's target directory; maturin comes from the venv (no build isolation).
export PATH="$venv/bin:$PATH"
"$venv/bin/python" -m pip --disable-pip-version-check -q install --no-build-isolation \
    --force-reinstall --no-deps "$here/.."
cd "$here"
set +e
OPENBLAS_NUM_THREADS=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    echo "run.sh: pytest collected no tests" >&2
    exit 1
fi
exit "$rc"
