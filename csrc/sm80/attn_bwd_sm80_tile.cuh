// attn_bwd_sm80_tile.cuh -- the portable backward's tile table (BwdTile, every
// tile choice of attn_bwd_sm80_kernel in one place) and its small device
// helpers. The algorithm is described at the top of attn_bwd_sm80.cuh.
#pragma once

#include <cuda_runtime.h>

#include "../common/bwd_rows.cuh"
#include "../common/ptx.cuh"
#include "../common/tile.cuh"

// ---------------------------------------------------------------------------
// Tile table, per padded head dim DP and keys per warp KPW (main kernel).
//
//  DP  | KPW | WARPS | BC  | BR | Q/dO stages | smem                       | why
//  64  | 32  |   4   | 128 | 64 |      2      | K,V 32 + Q,dO 32 + dS 16   | where the grid fills the SMs (dispatch
//      |     |       |     |    |             | + LSE/Delta 1 = 81 KB      | picks): dK, dV 128 fp32 regs/thread,
//      |     |       |     |    |             |                            | two CTAs per SM (sm80, sm90; one on
//      |     |       |     |    |             |                            | sm86/89)
//  64  | 16  |   4   | 64  | 64 |      2      | K,V 16 + Q,dO 32 + dS 8    | small grids: dK, dV 64 fp32 regs/thread;
//      |     |       |     |    |             | + LSE/Delta 1 = 57 KB      | two CTAs per SM (229-236 registers)
//  128 | 32  |   8   | 128 | 64 |      2      | K,V 64 + Q,dO 64 + dS 16   | GPUs with 161 KB per block (sm80, sm90)
//      |     |       |     |    |             | + LSE/Delta 1 + P 16       | where the grid fills the SMs (dispatch
//      |     |       |     |    |             | = 161 KB                   | picks): dK, dV 128 fp32 regs/thread per
//      |     |       |     |    |             |                            | column half, one CTA per SM
//  128 | 16  |   4   | 64  | 64 |      1      | K,V 32 + Q,dO 32 + dS 8    | the others (sm86/89: 99 KB): dK, dV 128
//      |     |       |     |    |             | + LSE/Delta 0.5 = 72.5 KB  | fp32 regs/thread + S^T, dP^T 16 each; a
//      |     |       |     |    |             |                            | second Q/dO slot would not fit, so block
//      |     |       |     |    |             |                            | i+1 loads during i's dQ phase only
//  256 | 32  |   8   | 64  | 64 |      1      | K,V 64 + Q,dO 64 + dS 8    | dK, dV 128 fp32 regs/thread per 64-column
//      |     |       |     |    |             | + LSE/Delta 0.5 + P 8      | group; one CTA per SM (sm80, sm90; sm86/89
//      |     |       |     |    |             | = 144.5 KB                 | allow 99 KB: dispatch refuses)
// BR = 64 makes the dS^T tile rows 128 bytes, as the swizzle needs. 32-key warps (FlashAttention-2's
// backward tiling) load each Q and dO B fragment once for two key tiles; their 128-key CTAs (DP <= 128)
// halve, per FLOP, the dQ reductions and the Q/dO loads, but are slower on small grids, so dispatch keeps
// those on 64-key CTAs (sm80_bwd_wide in dispatch.c). DP = 256 has no room for 128 keys: its 64-key CTAs
// are two key groups x four column groups (FA2's layout there), with about a fifth fewer shared-memory
// reads than 16-key warps in two halves. PARTS (DP >= 128, and 32-key warps): S^T and dP^T are computed
// for BR / PARTS of the 64 rows at a time (all 64 at once spilled). The k loop of S^T and dP^T is unrolled
// fully. Measurements, register caps and history: perf notes, sessions 59-60, 68-69 and 71.
template <int DP, int KPW>
struct BwdTile {
    static constexpr int MAX_ACC = 2048;              // KPW x DV at most: dK, dV 2 x 2048 / 32 = 128 fp32 registers
    static constexpr int MT = KPW / 16;               // m16 tiles of keys per warp (KPW = 16 or 32)
    // columns of dK, dV (and dQ at DP <= 128) a warp computes: its dK and dV (2 x KPW x DV fp32) take at
    // most 128 registers
    static constexpr int DV = DP * KPW <= MAX_ACC ? DP : MAX_ACC / KPW;
    static constexpr int GROUPS = DP / DV;            // column groups of dK, dV (a warp group each): see the header
    static constexpr int KEY_WARPS = GROUPS > 2 ? 2 : 4;  // warps of a group (at most 8 warps)
    static constexpr int WARPS = KEY_WARPS * GROUPS;
    static constexpr int THREADS = WARPS * 32;
    static constexpr int BC = KEY_WARPS * KPW;        // keys per CTA
    static constexpr int BR = 64;                     // query rows per block
    static constexpr int STAGES = (DP <= 64 || KPW == 32) && DP <= 128 ? 2 : 1;  // Q/dO (and LSE/Delta) slots
    // S^T, dP^T computed in parts of BR / PARTS rows (with column groups, group g takes part g)
    static constexpr int PARTS = GROUPS > 1 ? GROUPS : DP <= 64 && KPW == 16 ? 1 : 2;
    static constexpr int CHUNKS = DP / 8;             // 16-byte chunks per row
    // dQ = dS K: dQ groups of DQG_WARPS warps tile the block's BR rows x DQG_COLS columns each, DQ_WR warps
    // down the rows (DQ_RT m16 tiles each) and DQ_WC across the columns (DQ_COLS each). A dQ group is a
    // column group's warps and columns, but with DQ_ALL (DP = 256) all eight warps and columns: 16-row tiles,
    // whose dS fragments a warp loads once (with 32-row tiles in its 64 columns it reloaded them per column
    // pair). DQ_ALL also drops the dQ adds' row guard and re-reads the lane in the epilogue (kernel).
    static constexpr bool DQ_ALL = DP > 128;
    static constexpr int DQG_WARPS = DQ_ALL ? WARPS : KEY_WARPS;
    static constexpr int DQG_COLS = DQ_ALL ? DP : DV;
    static constexpr int DQ_WR = KPW == 32 && !DQ_ALL ? 2 : 4;
    static constexpr int DQ_WC = DQG_WARPS / DQ_WR;
    static constexpr int DQ_RT = BR / 16 / DQ_WR;
    static constexpr int DQ_COLS = DQG_COLS / DQ_WC;
    static constexpr size_t KV_BYTES = (size_t)2 * BC * DP * 2;
    static constexpr size_t QDO_BYTES = (size_t)STAGES * 2 * BR * DP * 2;
    static constexpr size_t DS_BYTES = (size_t)BC * BR * 2;
    static constexpr size_t VEC_BYTES = (size_t)STAGES * 2 * BR * 4;  // LSE and Delta of the rows
    static constexpr size_t P_BYTES = GROUPS > 1 ? (size_t)BC * BR * 2 : 0;  // P^T, passed between the groups
    static constexpr size_t SMEM_BYTES = KV_BYTES + QDO_BYTES + DS_BYTES + VEC_BYTES + P_BYTES;
    // Float offset of thread t's first dQ pair from its block's first piece (the dQ phase, bwd_piece_offset,
    // which runs on across a 64-row block's pieces: column c of slab s is column 64 s + c of the block):
    // its lane, its row group's first m16 tile and its dQ group's and column group's first column.
    // Derived from t again rather than from the kernel's dq_w, dq_rg, dq_cg: that form compiles to other
    // SASS (no spills either) whose speed is unmeasured; this one is sessions 70-71's measured code.
    static FC_DEVICE int dq_lane_offset(int t) {
        const int w = t / 32, qw = w % DQG_WARPS, grp = w / DQG_WARPS;  // qw: the warp in its dQ group
        const int rg = DQ_WC == 1 ? qw : qw % DQ_WR, cg = DQ_WC == 1 ? 0 : qw / DQ_WR;
        static_assert(bwd_piece_offset(0, BWD_PIECE_COLS) == BWD_PIECE, "a block's pieces continue its columns");
        return BWD_PIECE * (grp * DQG_COLS / BWD_PIECE_COLS) + 2 * (t % 32) + bwd_piece_offset(16, 0) * rg * DQ_RT +
               bwd_piece_offset(0, 8) * (cg * DQ_COLS / 8);
    }
    static_assert(KPW == 16 || KPW == 32, "16 or 32 keys per warp");
    static_assert(THREADS >= 2 * BR, "one thread copies each row's LSE or Delta");
    static_assert(BR * 2 == 128, "the dS^T tile's rows must be 8 chunks for swz");
    static_assert(BC % FC_BWD_KEYS_PER_CTA == 0, "dispatch bounds the grid with FC_BWD_KEYS_PER_CTA");
    static_assert(KPW == 16 || DP > 128 || BC == FC_SM80_BWD_WIDE_KEYS,
                  "dispatch counts the 32-key kernels' CTAs (DP = 256 has one kernel)");
    static_assert(BR == BWD_PIECE_ROWS && FC_BWD_ROW_PAD % BR == 0,
                  "a block's dQ rows are one row of pieces, inside the padded rows (and one turn counter)");
    static_assert(DV % 64 == 0, "a group starts at a multiple of 8 chunks, outside the swizzle");
    static_assert(DQ_COLS % 16 == 0 && DQ_RT >= 1, "a dQ warp tile is whole m16 x 16-column pieces");
    static_assert(GROUPS == 1 || PARTS == GROUPS, "with column groups, part g of the rows is group g's");
    static_assert((KV_BYTES + QDO_BYTES + DS_BYTES + VEC_BYTES) % 128 == 0,
                  "sP's rows start at multiples of 128 bytes (stash's XOR on the chunk bits)");
};

// ---------------------------------------------------------------------------
// Device helpers

// 4-byte cp.async (through L1).
FC_DEVICE void bwd_cp_async_4(void* smem_dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_u32(smem_dst)), "l"(src));
}

// threadIdx.x, read with a volatile instruction that the compiler neither hoists nor merges.
FC_DEVICE int bwd_tid_fresh() {
    int t;
    asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(t));
    return t;
}

// *addr += x, addr[1] += y in global memory, no return value (one vector
// reduction on sm90, two scalar ones before). addr is 8-byte aligned. The
// generic address is passed as is (a global allocation's generic and global
// addresses coincide); converting it cost a register and spilled at DP = 64.
FC_DEVICE void bwd_red_add2(float* addr, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(addr), "f"(x), "f"(y) : "memory");
#else
    atomicAdd(addr, x);
    atomicAdd(addr + 1, y);
#endif
}
