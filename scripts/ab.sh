#!/usr/bin/env bash
# ab.sh -- A/B timing of several harness binaries (kernel variants) in one GPU run.
#
#   scripts/ab.sh KERNEL BIN1 BIN2 [BIN...]        # e.g. scripts/ab.sh sm90 build/harness build/v2/harness
#   SHAPES="128:1024:1 64:16384:0" REPS=30 scripts/ab.sh sm80 build/harness build/v2/harness
#
# For every shape of the standard grid (B = 16384 / S, H = 2048 / D, fp16) it runs
# `BIN shape KERNEL B H H S S D causal REPS` for each binary in turn, then again in
# reverse order, so a drift of the GPU over the run shows up as a difference between
# a binary's two readings rather than as a difference between binaries. Prints one
# line per shape: "D S causal" then TFLOP/s of BIN1..BINn, then of BINn..BIN1.
#
# SHAPES: "D:S:causal" items (default: D 64/128/256 x S 512/1k/4k/16k x causal 0/1).
# REPS: timed launches per reading (default 20: a burst of ~10 ms, near the boost clock).
# REPS=600 reads at the GPU's power limit, as bench.py's do_bench does (perf notes, session 16).
# FC_WINDOW=left,right: every shape with that sliding window (the harness reads it; causal 1 or 2 names the
# diagonal, and the TFLOP/s count the window's visible pairs).
# FLUSH: the harness's L2 flush before each rep (0 none, the default; 1 zero-fill, as
# bench.py's do_bench does; 2 read).
# Build the variants on the CPU machine with
#   BUILD_DIR=build/<name> scripts/build_harness.sh   (from a worktree of the variant)
# and carry them to the GPU machine.
set -euo pipefail

if [ $# -lt 3 ]; then
    sed -n '2,22p' "$0" >&2
    exit 2
fi
kernel=$1; shift
bins=("$@")
for b in "${bins[@]}"; do
    [ -x "$b" ] || { echo "ab.sh: $b is not an executable" >&2; exit 2; }
done
REPS=${REPS:-20}
FLUSH=${FLUSH:-0}
if [ -z "${SHAPES:-}" ]; then
    SHAPES=""
    for D in 64 128 256; do for S in 512 1024 4096 16384; do for c in 0 1; do
        SHAPES="$SHAPES $D:$S:$c"
    done; done; done
fi

# time_one BIN D S causal: TFLOP/s of one run (the last field of the harness line), or "fail".
time_one() {
    local out
    if out=$(timeout 60 "$1" shape "$kernel" $((16384 / $3)) $((2048 / $2)) $((2048 / $2)) "$3" "$3" "$2" "$4" \
             "$REPS" "$FLUSH" 2>&1); then
        echo "$out" | tail -1 | awk '{print $NF}'
    else
        echo fail
    fi
}

reversed=()
for ((i = ${#bins[@]} - 1; i >= 0; --i)); do reversed+=("${bins[$i]}"); done
echo "# kernel=$kernel reps=$REPS flush=$FLUSH; columns: ${bins[*]} | reversed"
for item in $SHAPES; do
    IFS=: read -r D S c <<< "$item"
    line="D$D S$S c$c"
    for b in "${bins[@]}"; do line="$line $(time_one "$b" "$D" "$S" "$c")"; done
    line="$line |"
    for b in "${reversed[@]}"; do line="$line $(time_one "$b" "$D" "$S" "$c")"; done
    echo "$line"
done
