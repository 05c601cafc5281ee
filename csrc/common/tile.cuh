// tile.cuh -- shared-memory tile helpers used by the sm80-family kernels:
// cp.async loads of a (rows, D) tile into swizzled smem, and the per-lane
// ldmatrix address walk over 16-byte chunk pairs (see swz in ptx.cuh).
#pragma once

#include "ptx.cuh"

// Copies rows [0, ROWS) of a (rows, D) tile into swizzled smem; rows >= n_rows
// and columns >= D are zero-filled so no garbage (or NaN) enters the mma.
// `g_thr` points at this thread's first element (row tid / CHUNKS, chunk
// tid % CHUNKS) and `fallback` at any valid address; walking one running
// pointer keeps the per-row addresses out of the register file.
template <int DP, int ROWS, int THREADS, typename T>
__device__ __forceinline__ void load_tile(T* smem, const T* g_thr, const T* fallback, int64_t row_stride,
                                          int n_rows, int D, int tid) {
    constexpr int CHUNKS = DP / 8;
    constexpr int ROW_STEP = THREADS / CHUNKS;  // rows covered by one pass of the CTA
    static_assert(THREADS % CHUNKS == 0 && ROWS % ROW_STEP == 0, "tile must split evenly over the CTA");
    const int c = tid % CHUNKS, r0 = tid / CHUNKS;  // this thread's chunk column and first row
    const bool col_ok = c * 8 < D;
#pragma unroll
    for (int i = 0; i < ROWS / ROW_STEP; ++i) {
        const int r = r0 + i * ROW_STEP;
        const bool valid = col_ok && r < n_rows;
        cp_async_16(smem + swz<DP>(r, c), valid ? g_thr : fallback, valid);
        g_thr += ROW_STEP * row_stride;
    }
}

// Byte address of the 16x16 block `step` chunk-pairs to the right of the
// per-lane ldmatrix address `lane_addr` (taken at chunk 0 or 1 of a swizzled
// row). Steps 0-3 flip the XOR-ed chunk bits 1-2; bit 3 and up lie outside the
// 8-chunk swizzle, so step 4+ is a plain add. Only four distinct bases exist
// per lane, and the adds fold into ldmatrix's immediate offset.
__device__ __forceinline__ uint32_t chunk_step(uint32_t lane_addr, int step) {
    return (lane_addr ^ ((step & 3) << 5)) + ((step >> 2) << 7);
}
