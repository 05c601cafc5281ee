#!/usr/bin/env bash
# test.sh -- build, then run the test suite (GPU tests skip without a GPU).
source "$(dirname "$0")/env.sh"
build_ext
exec "$PY" -m pytest -q tests "$@"
