# env.sh -- sourced by the top-level scripts: finds or makes a Python with torch,
# and points torch's extension builder at the CUDA toolkit.
#   - If the current python3 already imports a CUDA build of torch (the GPU machine), use it.
#   - Otherwise make .venv and install torch 2.14.1 (CUDA build), pytest, numpy.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [ -n "${FLASHCORE_PYTHON:-}" ]; then
  PY="$FLASHCORE_PYTHON"
elif python3 -c "import torch, sys; sys.exit(torch.version.cuda is None)" >/dev/null 2>&1; then
  PY=python3
else
  if python3 -c "import torch" >/dev/null 2>&1; then
    echo "flashcore: python3's torch is a CPU-only build, which cannot host the extension; using .venv"
  fi
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
# No CUDA toolkit on the machine: use, or install, nvcc from pip (NVIDIA's
# cuda-toolkit wheels at the version torch itself pins) in the Python that has
# torch (scripts/pip_toolkit.py). The wheel's lib/ holds libcudart.so.<major>
# only; the link needs the unversioned name (the extension still loads the
# versioned one torch loads).
if [ -z "${CUDA_HOME:-}" ]; then
  if ! CUDA_HOME="$("$PY" "$ROOT/scripts/pip_toolkit.py" home)"; then
    if ! _fc_pin="$("$PY" "$ROOT/scripts/pip_toolkit.py" pin)"; then
      echo "flashcore: no CUDA toolkit found (set CUDA_HOME, or put nvcc on PATH), and this torch pins no" \
           "cuda-toolkit wheel to install one from" >&2
      return 1 2>/dev/null || exit 1
    fi
    echo "flashcore: no CUDA toolkit found; installing $_fc_pin from pip"
    "$PY" -m pip install -q --no-cache-dir "$_fc_pin"
    if ! CUDA_HOME="$("$PY" "$ROOT/scripts/pip_toolkit.py" home)"; then
      echo "flashcore: installed $_fc_pin, but its nvcc is not where the wheel lists it" >&2
      return 1 2>/dev/null || exit 1
    fi
    unset _fc_pin
  fi
  export CUDA_HOME
  for _fc_rt in "$CUDA_HOME"/lib/libcudart.so.[0-9]*; do
    if [ -e "$_fc_rt" ] && [ ! -e "$CUDA_HOME/lib/libcudart.so" ]; then
      ln -s "$(basename "$_fc_rt")" "$CUDA_HOME/lib/libcudart.so"
    fi
  done
  unset _fc_rt
fi
export PATH="${CUDA_HOME:+$CUDA_HOME/bin:}$PATH"
export MAX_JOBS="${MAX_JOBS:-$(nproc)}"

# Builds flashcore/_C in place (ninja, parallel; incremental on reruns).
build_ext() {
  local t0=$SECONDS
  "$PY" setup.py -q build_ext --inplace || return $?   # (a caller under set +e still sees the failure)
  echo "flashcore: extension built in $((SECONDS - t0)) s (MAX_JOBS=$MAX_JOBS)"
}
