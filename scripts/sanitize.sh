#!/usr/bin/env bash
# sanitize.sh -- the compute-sanitizer gate: runs the harness's `small` cases (scripts/build_harness.sh)
# under racecheck, synccheck and memcheck, and fails on any hazard, error, failed case or timeout.
#
#   scripts/sanitize.sh                       # every tool over every run below, build/harness
#   HARNESS=build/h/harness FC_SANITIZE_TOOLS="racecheck memcheck" FC_SANITIZE_RUNS="fwd-sm90 bwd-sm90" \
#       scripts/sanitize.sh
#   FC_CHECK_D=192 scripts/sanitize.sh        # one head dim's cases (the harness reads it)
#
# Runs: fwd-sm90, fwd-sm80 (`check KERNEL small`), bwd-sm90, bwd-sm80 (`check-bwd KERNEL small`) and
# bwd-sm90-det, bwd-sm80-det (the same with FC_DETERMINISTIC=1). The sm90 runs need an sm_90 GPU.
# A `-paths` suffix (fwd-sm90-paths, bwd-sm90-paths, bwd-sm90-det-paths) takes the harness's `paths`
# cases instead: larger ones that reach the schedules the small cases do not (several tiles or items
# per CTA, CTA pairs, row plans; `harness cases check sm90 paths` lists them). They are in the default
# set: on an H100 (session 81) the three -paths runs took 157 s under memcheck, 159 s under synccheck
# and 254 s under racecheck with FC_SANITIZE_JOBS=3.
# Each run is logged to $OUT/sanitize/<tool>-<run>.log (OUT default /tmp/flashcore-out) and cut
# off after FC_SANITIZE_TIMEOUT seconds (default 300). FC_SANITIZE_JOBS (default 1) runs that many
# at once, each verdict printed as its run ends: on an H100 (session 80) six at once took 230 s for
# racecheck over fwd-sm80 and memcheck over the sm80 runs, racecheck's backward runs needed 230-350 s
# each with four at once, and the 27 runs together more than one 10-minute device call (split them
# with FC_SANITIZE_RUNS / FC_SANITIZE_TOOLS). Why every run: a kernel path that only one
# head dim takes (D = 136..192 on the D = 256 backward tile, MLA's forward tile) can be racy where
# the others are clean (perf notes, session 79), so the gate covers the harness's whole small grid.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
HARNESS=${HARNESS:-build/harness}
TOOLS=${FC_SANITIZE_TOOLS:-racecheck synccheck memcheck}
RUNS=${FC_SANITIZE_RUNS:-fwd-sm90 fwd-sm80 bwd-sm90 bwd-sm80 bwd-sm90-det bwd-sm80-det fwd-sm90-paths bwd-sm90-paths bwd-sm90-det-paths}
LIMIT=${FC_SANITIZE_TIMEOUT:-300}
JOBS=${FC_SANITIZE_JOBS:-1}
LOGS=${OUT:-/tmp/flashcore-out}/sanitize
mkdir -p "$LOGS"
if ! [[ "$JOBS" =~ ^[1-9][0-9]*$ ]]; then
    echo "sanitize.sh: FC_SANITIZE_JOBS=$JOBS: give a whole number >= 1 (runs at once)" >&2
    exit 2
fi
if [ ! -x "$HARNESS" ]; then
    echo "sanitize.sh: no harness at $HARNESS; build it with scripts/build_harness.sh" >&2
    exit 2
fi
if ! command -v compute-sanitizer >/dev/null; then
    echo "sanitize.sh: compute-sanitizer is not on PATH (it ships with the CUDA toolkit)" >&2
    exit 2
fi

# verdict LOG TOOL RC: one line for the run; returns 1 unless it ran clean.
verdict() {
    local log=$1 tool=$2 rc=$3 cases summary
    cases=$(grep -E '^check(-bwd)?: [0-9]+ cases' "$log" | tail -n 1)
    summary=$(grep -E '(RACECHECK|ERROR) SUMMARY' "$log" | tail -n 1 | sed 's/^=* *//')
    if [ "$rc" -eq 124 ]; then
        echo "TIMEOUT after ${LIMIT} s; ${cases:-no summary}"
        return 1
    fi
    echo "${cases:-no case summary}; ${summary:-no sanitizer summary} (rc $rc)"
    [ "$rc" -eq 0 ] || return 1
    [[ "$cases" =~ ,\ 0\ failed$ ]] || return 1
    if [ "$tool" = racecheck ]; then
        [[ "$summary" =~ ^RACECHECK\ SUMMARY:\ 0\ hazards ]] || return 1
    else
        [[ "$summary" =~ ^ERROR\ SUMMARY:\ 0\ errors ]] || return 1
    fi
}

# one TOOL RUN: the run under the tool; prints its verdict and leaves it in $LOGS/<tool>-<run>.verdict.
one() {
    local tool=$1 run=$2 pass kernel rest mode detv sel log rc line
    IFS=- read -r pass kernel rest <<< "$run"
    mode=check; [ "$pass" = bwd ] && mode=check-bwd
    detv=0; [[ "-$rest-" == *-det-* ]] && detv=1
    sel=small; [[ "-$rest-" == *-paths-* ]] && sel=paths
    log="$LOGS/$tool-$run.log"
    # timeout runs in a process group of its own: its pid file lets the trap below stop it
    FC_DETERMINISTIC=$detv timeout "$LIMIT" compute-sanitizer --tool "$tool" --error-exitcode 3 \
        "$HARNESS" "$mode" "$kernel" "$sel" > "$log" 2>&1 &
    echo $! > "$LOGS/$tool-$run.pid"
    wait $!
    rc=$?
    rm -f "$LOGS/$tool-$run.pid"
    if line=$(verdict "$log" "$tool" "$rc"); then
        line="clean  $tool $run: $line"
    else
        line="FAILED $tool $run: $line (log $log)"
    fi
    echo "$line" > "$LOGS/$tool-$run.verdict"
    echo "$line"
}

# Stopped (Ctrl-C, a caller's timeout): stop the runs still going too. (A SIGKILL cannot be caught:
# their own timeouts end them.)
stop_runs() {
    local f
    for f in "$LOGS"/*.pid; do [ -f "$f" ] && kill -TERM "$(cat "$f")" 2>/dev/null; done
    exit 130
}
trap stop_runs INT TERM

for tool in $TOOLS; do
    for run in $RUNS; do
        rm -f "$LOGS/$tool-$run.verdict" "$LOGS/$tool-$run.pid"
        while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
        one "$tool" "$run" &
    done
done
wait
bad=0
for tool in $TOOLS; do
    for run in $RUNS; do
        f="$LOGS/$tool-$run.verdict"
        [ -f "$f" ] || echo "FAILED $tool $run: no verdict (log $LOGS/$tool-$run.log)"
        grep -q '^clean ' "$f" 2>/dev/null || bad=1
    done
done
if [ "$bad" -ne 0 ]; then echo "sanitize.sh: not clean" >&2; exit 1; fi
echo "sanitize.sh: every run clean"
