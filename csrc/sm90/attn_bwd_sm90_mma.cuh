// attn_bwd_sm90_mma.cuh -- the Hopper backward's (attn_bwd_sm90.cuh) wgmma groups: one
// helper per operand form, each a fence, the k16 steps of one 64-row tile and a commit;
// and, at DP = 256, the exchange of S^T and dP^T columns between the two warpgroups.
// Operands in shared memory are 16-bit tiles in 128-byte swizzle slabs of 64 columns.
#pragma once

#include <stdint.h>

#include "hopper.cuh"
#include "wgmma_ops.cuh"

// Issues acc = A B^T over DP as one wgmma group: A = 64 rows at a_rows of a
// tile with A_ROWS rows per slab, B = N rows at b_rows of a tile whose slabs
// are B_SLAB bytes apart, both K-major (a k16 step moves 32 bytes inside a slab).
template <int DP, int A_ROWS, int N, uint32_t B_SLAB, typename T>
FC_DEVICE void bwd_issue_kmajor(float (&acc)[N / 2], uint32_t a_rows, uint32_t b_rows) {
    static_assert(N == 64 || N == 128, "S^T and dP^T tiles are 64 or 128 query rows wide");
    wgmma_fence();  // orders earlier register use of acc before the async writes
    const uint64_t ad = wgmma_desc(a_rows, 16, FC_SWZ_GROUP_BYTES), bd = wgmma_desc(b_rows, 16, FC_SWZ_GROUP_BYTES);
#pragma unroll
    for (int kk = 0; kk < DP / 16; ++kk) {
        const uint64_t a = wgmma_desc_add(ad, (kk / 4) * A_ROWS * FC_SWZ_ROW_BYTES + (kk % 4) * 32);
        const uint64_t b = wgmma_desc_add(bd, (kk / 4) * B_SLAB + (kk % 4) * 32);
        if constexpr (N == 64) wgmma_ss_n64<T>(acc, a, b, kk > 0);
        else wgmma_ss_n128<T>(acc, a, b, kk > 0);
    }
    wgmma_commit();
}

// bwd_issue_kmajor over the first `slabs` (>= 1) of DP's 64-column slabs, where the tiles' columns past
// them are zeros (TMA's fill past D or Dv), whose products add nothing: slab 0, then each further slab
// as a wgmma group of its own under its own branch (a branch between wgmmas of one group makes ptxas
// serialize the group, C7519). acc is complete after wgmma_wait<0>.
template <int DP, int A_ROWS, int N, uint32_t B_SLAB, typename T>
FC_DEVICE void bwd_issue_kmajor_slabs(float (&acc)[N / 2], uint32_t a_rows, uint32_t b_rows, int slabs) {
    static_assert(N == 64, "DP = 256's S^T and dP^T: 64 query rows");
    const uint64_t ad = wgmma_desc(a_rows, 16, FC_SWZ_GROUP_BYTES), bd = wgmma_desc(b_rows, 16, FC_SWZ_GROUP_BYTES);
#pragma unroll
    for (int sl = 0; sl < DP / FC_SLAB_COLS; ++sl) {
        if (sl > 0 && sl >= slabs) break;
        wgmma_fence();  // orders earlier register use of acc before the async writes
#pragma unroll
        for (int kk = 0; kk < FC_SLAB_COLS / 16; ++kk)
            wgmma_ss_n64<T>(acc, wgmma_desc_add(ad, sl * A_ROWS * FC_SWZ_ROW_BYTES + kk * 32),
                            wgmma_desc_add(bd, sl * B_SLAB + kk * 32), sl > 0 || kk > 0);
        wgmma_commit();
    }
}

// Issues acc (64 x DP) += A B as one wgmma group: A = 64 x BR in registers
// (BR / 16 k16 fragments), B = BR rows x DP columns at b_tile, N-major (BR
// rows per slab, slabs B_SLAB bytes apart; a k16 step moves 16 rows).
template <int DP, int BR, uint32_t B_SLAB, typename T>
FC_DEVICE void bwd_issue_acc(float (&acc)[DP / 2], const uint32_t (&a)[BR / 16][4], uint32_t b_tile) {
    wgmma_fence();  // orders the register writes of a (and acc) before the async reads
    const uint64_t bd = wgmma_desc(b_tile, B_SLAB, FC_SWZ_GROUP_BYTES);
#pragma unroll
    for (int kk = 0; kk < BR / 16; ++kk) {
        const uint64_t b = wgmma_desc_add(bd, kk * 16 * FC_SWZ_ROW_BYTES);
        if constexpr (DP == 64) wgmma_rs_n64<T>(acc, a[kk], b, 1);
        else wgmma_rs_n128<T>(acc, a[kk], b, 1);
    }
    wgmma_commit();
}

// Issues acc (64 x 128) += A B as one wgmma group, both in shared memory: A = 64
// rows x BR columns at a_tile, K-major (a 16-bit tile of A_ROWS rows per slab:
// P^T or dS^T as stored), B = BR rows x 128 columns at b_tile, N-major (BR rows
// per slab, slabs B_SLAB bytes apart).
template <int BR, int A_ROWS, uint32_t B_SLAB, typename T>
FC_DEVICE void bwd_issue_acc_ss(float (&acc)[64], uint32_t a_tile, uint32_t b_tile) {
    wgmma_fence();  // orders earlier register use of acc before the async writes
    const uint64_t ad = wgmma_desc(a_tile, 16, FC_SWZ_GROUP_BYTES), bd = wgmma_desc(b_tile, B_SLAB, FC_SWZ_GROUP_BYTES);
#pragma unroll
    for (int kk = 0; kk < BR / 16; ++kk)
        wgmma_ss_tb_n128<T>(acc, wgmma_desc_add(ad, (kk / 4) * A_ROWS * FC_SWZ_ROW_BYTES + (kk % 4) * 32),
                            wgmma_desc_add(bd, kk * 16 * FC_SWZ_ROW_BYTES), 1);
    wgmma_commit();
}

// Named barrier of the exchange below (the kernel's: 1, 2 and 3).
static constexpr int BWD_BAR_XCHG = 4;

// Bytes of shared memory the exchange below takes at xchg for BR query rows: a warpgroup's part,
// BR / 4 fp32 per thread, for each of the two warpgroups.
template <int BR>
constexpr uint32_t BWD_XCHG_BYTES = 2 * (BR / 4) * 4 * FC_WG_THREADS;

// DP = 256: warpgroup 0 holds S^T and warpgroup 1 dP^T, 64 keys x BR query rows each in x (an
// accumulator's fragment layout); each owns BR / 2 of the rows for the elementwise work
// (warpgroup w from row w * BR / 2). Each passes the other, through 2 x 8 KB of fp32 at xchg (its
// half at w * 8 KB, fragment order: 16-byte stores, a warp's 512 contiguous bytes), the columns
// of the other's rows, and ends with s (S^T) and dp (dP^T) at its own rows. Its barrier, over
// both warpgroups, orders the stores before the reads, and (it comes after each warpgroup's last
// wgmma wait of the block before) that block's reads of P^T and dS^T before this block's stores.
template <int BR>
FC_DEVICE void bwd_exchange_cols(const float (&x)[BR / 2], float (&s)[BR / 4], float (&dp)[BR / 4], uint32_t xchg,
                                 int wg, int t) {
    constexpr int HALF = BR / 4;  // accumulator floats of a warpgroup's rows
    static_assert(HALF % 4 == 0, "columns pass as float4");
    constexpr uint32_t PART = BWD_XCHG_BYTES<BR> / 2;  // bytes one warpgroup passes
    const uint32_t mine = xchg + wg * PART, theirs = xchg + (1 - wg) * PART;
#pragma unroll
    for (int j = 0; j < HALF / 4; ++j) {  // warpgroup 0 passes S^T's columns from BR / 2, 1 dP^T's below
        int o[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) o[e] = __float_as_int(wg ? x[4 * j + e] : x[HALF + 4 * j + e]);
        st_shared_v4_s32(mine + (j * FC_WG_THREADS + t) * 16, o[0], o[1], o[2], o[3]);
    }
    named_barrier_sync(BWD_BAR_XCHG, 2 * FC_WG_THREADS);  // orders both warpgroups' stores above (and, before
                                                           // them, their last wgmma waits) before the reads below
#pragma unroll
    for (int j = 0; j < HALF / 4; ++j) {
        const int4 v = ld_shared_v4_s32(theirs + (j * FC_WG_THREADS + t) * 16);
        const float o[4] = {__int_as_float(v.x), __int_as_float(v.y), __int_as_float(v.z), __int_as_float(v.w)};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            s[4 * j + e] = wg ? o[e] : x[4 * j + e];
            dp[4 * j + e] = wg ? x[HALF + 4 * j + e] : o[e];
        }
    }
}
