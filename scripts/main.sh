#!/usr/bin/env bash
# main.sh -- the main job: build, then benchmark on a GPU (or a CPU demo without one).
source "$(dirname "$0")/env.sh"
build_ext
exec "$PY" benchmarks/bench.py "$@"
