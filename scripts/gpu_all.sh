#!/usr/bin/env bash
# gpu_all.sh -- build, test and benchmark flashcore on a GPU machine, in one command.
#
#   scripts/gpu_all.sh                 # build, pytest, bench (grid + seed)
#   scripts/gpu_all.sh --quick         # arguments go to benchmarks/bench.py
#   OUT=/tmp/run1 MAX_JOBS=8 scripts/gpu_all.sh --suite seed
#   FLASHCORE_PYTHON=/path/to/python scripts/gpu_all.sh
#
# Steps, each logged to $OUT/<step>.log (default OUT=/tmp/flashcore-out):
#   env    GPU, driver, nvcc and torch versions
#   build  python setup.py build_ext --inplace (FLASHCORE_BUILD=pip: pip install --no-build-isolation -v .)
#   ptxas  register/spill report parsed from the build log, when it holds ptxas -v lines (never fatal)
#   test   python -m pytest -q tests
#   bench  python benchmarks/bench.py "$@"; the newest results .json/.md/.png go to $OUT/results/
# The first step that fails stops the run with its name, exit code and log path.
# The in-place build is the default because pytest, run from the repo root, imports
# the source tree's flashcore/ rather than an installed copy.
export MAX_JOBS=${MAX_JOBS:-16}
export PYTHONUNBUFFERED=1
# env.sh picks the Python (FLASHCORE_PYTHON, else a python3 with torch, else .venv),
# sets CUDA_HOME for torch's extension builder and defines build_ext.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
set +e -uo pipefail   # step() below handles failures itself
OUT=${OUT:-/tmp/flashcore-out}
mkdir -p "$OUT"

# step NAME CMD...: runs CMD, tees its output to $OUT/NAME.log, stops the script on failure.
step() {
    local name=$1; shift
    local t0=$SECONDS
    echo "=== [$name] $*"
    "$@" 2>&1 | tee "$OUT/$name.log"
    local rc=${PIPESTATUS[0]}
    if [ "$rc" -ne 0 ]; then
        echo "=== FAILED: step '$name' exited with $rc after $((SECONDS - t0)) s; log: $OUT/$name.log" >&2
        exit "$rc"
    fi
    echo "=== [$name] ok ($((SECONDS - t0)) s)"
}

env_report() {
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || true
    command -v nvcc >/dev/null && nvcc --version | tail -n 2
    "$PY" -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda,
"cudnn", torch.backends.cudnn.version(), "triton", triton.__version__,
"gpu", torch.cuda.get_device_name() if torch.cuda.is_available() else None)'
    echo "CUDA_HOME=${CUDA_HOME:-unset} MAX_JOBS=$MAX_JOBS"
    git rev-parse HEAD 2>/dev/null || true
    git status --short 2>/dev/null | head -n 20 || true
}

build() {
    if [ "${FLASHCORE_BUILD:-inplace}" = "pip" ]; then
        "$PY" -m pip install --no-build-isolation -v .
    else
        build_ext   # env.sh: python setup.py build_ext --inplace
    fi
}

copy_results() {  # the newest results file of each kind (the run tool brings back 8 files at most)
    mkdir -p "$OUT/results"
    local ext f
    for ext in json md png; do
        f=$(ls -t benchmarks/results/*."$ext" 2>/dev/null | head -n 1)
        if [ -n "$f" ]; then cp -f "$f" "$OUT/results/"; fi
    done
}

step env env_report
step build build
if grep -q "ptxas info" "$OUT/build.log"; then
    "$PY" scripts/ptxas_report.py --log "$OUT/build.log" 2>&1 | tee "$OUT/ptxas.log" || true
fi
step test "$PY" -m pytest -q tests
trap copy_results EXIT   # keep partial results too if the benchmark dies part-way
step bench "$PY" benchmarks/bench.py "$@"
echo "=== all steps passed; logs and results in $OUT"
