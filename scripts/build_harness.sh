#!/usr/bin/env bash
# build_harness.sh -- builds build/harness: the C core, the CUDA kernels and the CPU
# reference linked with no torch, so a kernel compiled on the CPU machine can be carried
# to the GPU machine and checked against the CPU path in seconds.
#
#   scripts/build_harness.sh            # -> build/harness
#   NVCC=/usr/local/cuda/bin/nvcc NVCC_FLAGS="-lineinfo" scripts/build_harness.sh
#
# Sources: csrc/tools/harness.cu, csrc/dispatch.c[u], csrc/cpu/*.c, csrc/sm80/*.cu for
# sm_80 + sm_90a, and csrc/sm90/*.cu (if any) for sm_90a alone (wgmma/TMA need it).
# Each file compiles to build/obj/ in parallel, then nvcc links with the static cudart.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
NVCC=${NVCC:-nvcc}
BUILD=${BUILD_DIR:-build}
read -r -a EXTRA <<< "${NVCC_FLAGS:-}"
# The device-code flags of setup.py (-Xptxas=-warn-spills -lineinfo), so the harness
# times the SASS the extension ships: nvcc 13.0 emits different SASS for the same
# source without them, and again with -Xptxas -v added (read registers from
# scripts/ptxas_report.py rather than from NVCC_FLAGS="-Xptxas -v" builds).
COMMON=(-O3 -std=c++17 -Icsrc -DFC_HAVE_SM90 -Xcompiler -fopenmp -Xptxas=-warn-spills -lineinfo "${EXTRA[@]}")
GENCODE_ALL=(-gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90a,code=sm_90a)
GENCODE_SM90=(-gencode=arch=compute_90a,code=sm_90a)

shopt -s nullglob
harness=(csrc/tools/harness.cu)
dispatch=()
for f in csrc/dispatch.c csrc/dispatch.cu; do
    if [ -f "$f" ]; then dispatch+=("$f"); fi
done
cpu=(csrc/cpu/*.c)
sm80=(csrc/sm80/*.cu)
sm90=(csrc/sm90/*.cu)
[ -f "${harness[0]}" ] || { echo "build_harness: missing ${harness[0]}" >&2; exit 1; }
[ ${#dispatch[@]} -gt 0 ] || { echo "build_harness: missing csrc/dispatch.c or csrc/dispatch.cu" >&2; exit 1; }
[ ${#cpu[@]} -gt 0 ] || { echo "build_harness: no csrc/cpu/*.c" >&2; exit 1; }

mkdir -p "$BUILD/obj"
pids=() objs=() srcs=()
compile() {  # compile SRC GENCODE...: SRC -> $BUILD/obj/<path with / as _>.o, in the background
    local src=$1; shift
    local obj="$BUILD/obj/$(echo "$src" | tr '/' '_').o"
    objs+=("$obj"); srcs+=("$src")
    "$NVCC" "${COMMON[@]}" "$@" -c "$src" -o "$obj" &
    pids+=($!)
}
for f in "${harness[@]}" "${dispatch[@]}" "${cpu[@]}" "${sm80[@]}"; do compile "$f" "${GENCODE_ALL[@]}"; done
for f in "${sm90[@]}"; do compile "$f" "${GENCODE_SM90[@]}"; done

failed=0
for i in "${!pids[@]}"; do
    if ! wait "${pids[$i]}"; then
        echo "build_harness: compiling ${srcs[$i]} failed" >&2
        failed=1
    fi
done
[ "$failed" -eq 0 ] || exit 1

"$NVCC" "${GENCODE_ALL[@]}" -cudart static -Xcompiler -fopenmp "${objs[@]}" -o "$BUILD/harness" -lgomp
echo "built $BUILD/harness from ${#srcs[@]} files: ${srcs[*]}"
