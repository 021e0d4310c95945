#!/usr/bin/env bash
# The GPU test suite (tests/gpu, marked gpu) in one command, with a per-test pass/fail summary.
#
#   benchmarks/gpu_suite.sh --prepare   # once, here (pip reaches PyPI): yacs's wheel into .whl/
#   benchmarks/gpu_suite.sh             # on the GPU machine: the whole suite, a few minutes
#
# The device call: run(command="benchmarks/gpu_suite.sh", carry=[".whl"], timeout_s=600).
# Writes $OUT/gpu_suite.xml (junit) and $OUT/gpu_suite.txt (the log, ending with one PASSED / FAILED / SKIPPED /
# XFAIL line per test and each test's time); OUT defaults to a new temporary folder. PYTEST_ARGS adds options
# (e.g. PYTEST_ARGS="-k compile"). Without CUDA every test skips; RUNNER_GPU_TESTS_ON_CPU=1 dry-runs them on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == "--prepare" ]]; then
    PY=${PYTHON:-python}
    version=$("$PY" -c "from importlib.metadata import version; print(version('yacs'))")
    "$PY" -m pip download -q --no-deps --only-binary=:all: -d .whl "yacs==$version"
    ls -l .whl
    exit 0
fi
. benchmarks/gpu_env.sh
OUT=${OUT:-$(mktemp -d -t gpu-suite-XXXXXX)}
mkdir -p "$OUT"
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn',
torch.backends.cudnn.version(), 'device', torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)" \
    | tee "$OUT/gpu_suite.txt"
set -o pipefail
# shellcheck disable=SC2086
"$PY" -m pytest tests/gpu -p no:cacheprovider -p no:benchmark -o addopts="" -rA --durations=0 --junitxml "$OUT/gpu_suite.xml" \
    ${PYTEST_ARGS:-} 2>&1 | tee -a "$OUT/gpu_suite.txt"
