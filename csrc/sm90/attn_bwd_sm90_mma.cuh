// attn_bwd_sm90_mma.cuh -- the Hopper backward's (attn_bwd_sm90.cuh) wgmma groups: one
// helper per operand form, each a fence, the k16 steps of one 64-row tile and a commit.
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
    wgmma_fence();  // orders earlier register use of acc before the async writes
    const uint64_t ad = wgmma_desc(a_rows, 16, FC_SWZ_GROUP_BYTES), bd = wgmma_desc(b_rows, 16, FC_SWZ_GROUP_BYTES);
#pragma unroll
    for (int kk = 0; kk < DP / 16; ++kk) {
        const uint64_t a = wgmma_desc_add(ad, (kk / 4) * A_ROWS * FC_SWZ_ROW_BYTES + (kk % 4) * 32);
        const uint64_t b = wgmma_desc_add(bd, (kk / 4) * B_SLAB + (kk % 4) * 32);
        if constexpr (N == 64) wgmma_ss_n64<T>(acc, a, b, kk > 0);
        else if constexpr (N == 32) wgmma_ss_n32<T>(acc, a, b, kk > 0);
        else wgmma_ss_n128<T>(acc, a, b, kk > 0);
    }
    wgmma_commit();
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
