# env.sh -- sourced by the top-level scripts: finds or makes a Python with torch,
# and points torch's extension builder at the CUDA toolkit.
#   - If the current python3 already imports torch (the GPU machine), use it.
#   - Otherwise make .venv and install torch 2.14.1 (CUDA build), pytest, numpy.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [ -n "${FLASHCORE_PYTHON:-}" ]; then
  PY="$FLASHCORE_PYTHON"
elif python3 -c "import torch" >/dev/null 2>&1; then
  PY=python3
else
  if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
  fi
  PY="$ROOT/.venv/bin/python"
  # Installs once: .ci/run sources this file twice (itself and through test.sh).
  # --no-cache-dir: the CUDA wheels take about 5 GB installed; a cached copy
  # would double that on a small disk.
  if ! "$PY" -c "import torch, numpy, pytest, pybind11, ninja, matplotlib" >/dev/null 2>&1; then
    df -h . | tail -1 | awk '{print "flashcore: " $4 " free on " $6 " before installing torch"}'
    "$PY" -m pip install -q --no-cache-dir --upgrade pip >/dev/null
    "$PY" -m pip install -q --no-cache-dir torch==2.14.1 numpy pytest pybind11 ninja setuptools wheel matplotlib
  fi
fi
if [ -z "${CUDA_HOME:-}" ]; then
  for d in /usr/local/cuda "$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /x/x)")")"; do
    if [ -f "$d/include/cuda_runtime_api.h" ]; then export CUDA_HOME="$d"; break; fi
  done
fi
# No CUDA toolkit on the machine: install nvcc from pip (NVIDIA's cuda-toolkit
# wheels, the version torch itself pins) into the Python that has torch, and
# build with it. Its lib/ holds libcudart.so.13 only; the link needs the
# unversioned name (the extension still loads the .so.13 that torch loads).
if [ -z "${CUDA_HOME:-}" ]; then
  pin="$("$PY" - <<'PYEOF'
import importlib.metadata as md, re
for r in md.requires("torch") or []:
    m = re.match(r"cuda-toolkit\[[^]]*\]\s*(==\s*[0-9.]+)", r)
    if m:
        print("cuda-toolkit[nvcc,cccl]" + m.group(1).replace(" ", ""))
PYEOF
)"
  if [ -z "$pin" ]; then
    echo "flashcore: no CUDA toolkit found (set CUDA_HOME, or put nvcc on PATH), and this torch pins no" \
         "cuda-toolkit wheel to install one from" >&2
    return 1 2>/dev/null || exit 1
  fi
  echo "flashcore: no CUDA toolkit found; installing $pin from pip"
  "$PY" -m pip install -q --no-cache-dir "$pin"
  major="${pin##*==}"; major="${major%%.*}"
  CUDA_HOME="$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/nvidia/cu$major"
  export CUDA_HOME
  ln -sf "libcudart.so.$major" "$CUDA_HOME/lib/libcudart.so"
fi
export PATH="${CUDA_HOME:+$CUDA_HOME/bin:}$PATH"
export MAX_JOBS="${MAX_JOBS:-$(nproc)}"

# Builds flashcore/_C in place (ninja, parallel; incremental on reruns).
build_ext() {
  local t0=$SECONDS
  "$PY" setup.py -q build_ext --inplace || return $?   # (a caller under set +e still sees the failure)
  echo "flashcore: extension built in $((SECONDS - t0)) s (MAX_JOBS=$MAX_JOBS)"
}
