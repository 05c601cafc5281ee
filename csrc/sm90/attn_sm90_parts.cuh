// attn_sm90_parts.cuh -- the pieces of the Hopper attention kernel
// (attn_fwd_sm90.cuh): its tile table (Sm90Tile) and the per-K/V-tile steps a
// consumer warpgroup runs: S = Q K^T and O += P V as wgmma groups, masking,
// the online softmax, and P packed as the A operand. The kernel arguments and
// the persistent tile order are in attn_sm90_order.cuh. Device code for
// sm_90a; the structs are shared with the host launcher.
#pragma once

#include <cuda.h>
#include <limits.h>
#include <math.h>

#include <type_traits>

#include "../flashcore.h"
#include "hopper.cuh"

// ---------------------------------------------------------------------------
// Tile table, per padded head dim DP.
//
//  DP  | BR  | BC  | STAGES | Q bufs | smem (Q + K,V ring) | registers per consumer thread
//  64  | 128 | 128 |   3    |   2    | 32 + 96  = 128 KB   | S 64 + O 32 + P 32
//      |     |     | 4 (key-split mode: an even ring, see SPLIT_STAGES) | 32 + 128 = 160 KB |
//  64  | 192 | 128 |   3    |   2    | 48 + 96  = 144 KB   | the same, in 160 (CONS = 3, see below)
//  64  | 192 | 192 |   3    |   2    | 48 + 144 = 192 KB   | S 96 + O 32, P 48 once S is done (LONG)
//  128 | 128 | 128 |   2    |   2    | 64 + 128 = 192 KB   | S 64 + O 64 + P 32
//  128 | 192 | 128 |   2    |   2    | 96 + 128 = 224 KB   | the same, in 160: in order (CONS = 3)
//  256 | 128 |  64 |   2    |   1    | 64 + 128 + 32 (O) = 224 KB | S 32 + O 128 + P 16
//
// CTA pairs (D = 128 and 256, long rows; sm90_cluster_min_sk): the same tile and
// ring per CTA, two CTAs of a cluster on adjacent query blocks sharing each K/V
// tile by multicast (attn_fwd_sm90.cuh).
//
// CONS = 3: three consumer warpgroups, 192-row tiles. At D = 64 the softmax
// (one exp2 per score) takes about as long as the two matmuls, and a third
// warpgroup's instruction stream fills the gaps of the other two: +11-23 % at
// S >= 2k non-causal and +3-18 % causal S >= 4k, but 11-16 % slower at causal
// S <= 1k, where 192-row tiles waste more keys past the diagonal (perf notes,
// session 10). At D = 128 the 160 registers hold S and O (64 each) but not P
// besides, so the consumers run S and P V in order (no OVERLAP): 2-7 % slower
// than two pipelined consumers on non-causal rows, 2-3 % faster on causal rows
// from 2k keys, where WG_SKIP gives the three different K/V counts per tile
// (perf notes, session 27). Dispatch: sm90_use_cons3.
// Whether the kernel at padded head dim dp with `cons` consumers finds its
// tiles by multiply and shift (Sm90Tile::MAGIC_DIV; the launcher then fills
// Sm90Args::sched).
__host__ __device__ constexpr bool sm90_magic_div(int dp, int cons) { return cons == 2 && dp != 128; }
// Whether a kernel of the static order (dyn false), or of the dynamic order with
// `cons` consumers, merges its last two causal windows (sm90_last_window; the
// LONG kernel, whose consumers find their tiles themselves, never reads it).
__host__ __device__ constexpr bool sm90_merge_windows(bool dyn, int cons) { return !dyn || cons == 3; }
// Whether a kernel of the dynamic order (dyn) with `cons` consumers keeps its
// causal windows within the L2 (sm90_causal_window's cap; the host's plan does
// too): the three-consumer one (causal long rows: D = 128, and D = 64 where
// the static order's windows would not fit, fc_sm90_d64_dynamic). The two-consumer
// one (short rows) keeps its windows: capped, D = 256 causal 1k measured 1.2 %
// slower (perf notes, session 33), and at D = 128 its code stays as measured.
__host__ __device__ constexpr bool sm90_window_cap(bool dyn, int cons) { return dyn && cons == 3; }

// LONG: the instantiation for long key rows, at D = 128 (two consumers) the
// softmax pinned ahead of the P V wait (PIN_SOFTMAX), at D = 64 (three
// consumers) 192-key K/V tiles (WIDE_KV; which calls: sm90_wide_kv).
// DP = 192 is MLA's tile: q and k of D in 129..192 (three slabs), v and O of
// Dv <= 128 (DV; flashcore.h's Dv), otherwise D = 256's (dispatch: kernels.h's
// fc_sm90_d192).
template <int DP, int CONS = 2, bool LONG = false>
struct Sm90Tile {
    static_assert(CONS == 2 || (CONS == 3 && DP <= 128), "three consumers fit their registers only at D <= 128");
    static_assert(!LONG || (DP == 128 && CONS == 2) || (DP == 64 && CONS == 3),
                  "the long-row instantiations: D = 128 on two consumers, D = 64 on three");
    static_assert(DP == 64 || DP == 128 || DP == 192 || DP == 256, "padded head dims 64, 128, 192 (MLA), 256");
    static constexpr int DV = DP == 192 ? 128 : DP;   // v's and O's columns (DP = 192: v at most 128 wide)
    static constexpr int CONSUMERS = CONS;            // consumer warpgroups
    static constexpr int WG_ROWS = 64;                // query rows per consumer (wgmma M)
    static constexpr int BR = CONSUMERS * WG_ROWS;    // query rows per tile
    // WIDE_KV: 192-key K/V tiles, so that each consumer's fixed cost per K/V
    // step (barriers, the row maxima's shuffles, the O rescale, the wgmma
    // waits) spreads over 1.5x the keys. In order (no OVERLAP) S and P are not
    // live at once: S 96 + O 32 registers fit the 160 of three consumers.
    static constexpr bool WIDE_KV = LONG && DP == 64;
    static constexpr int BC = WIDE_KV ? 192 : DP <= 128 ? 128 : 64;  // keys per K/V tile
    // LEAD_TILE (WIDE_KV, static order, non-causal calls): the K/V tiles end at
    // the row's last key, so the partial one is tile 0, which starts
    // sm90_lead(Sk, BC) keys before key 0 (TMA zero-fills them). Its S (an
    // n128 or n64 wgmma on the K tile's last rows) and softmax skip the lead's
    // whole 64-key groups (sm90_lead_softmax), so a row's softmax works on at
    // most 63 masked keys, where with a partial last tile it took up to 191
    // (192-key tiles pad 2k and 4k by 3 %). Its first P V still runs on the
    // skipped groups' zero P (inside the loop).
    static constexpr bool LEAD_TILE = WIDE_KV;
    // The lead's skipped unit: whole 64-key groups (at most two with BC = 192),
    // one softmax instantiation per count, where 16-key steps would take twelve.
    static constexpr int LEAD_GROUP = 64;
    // K/V tiles in flight (ordinary mode). DP = 192's tiles are 40 KB (D = 256's
    // 64): three fit beside its Q and O buffers (200 KB).
    static constexpr int STAGES = DP <= 64 || DP == 192 ? 3 : 2;
    // Key-split mode: warpgroup c takes the ring positions of one parity. With an
    // even ring every slot then has one owner within a tile, which waits on every
    // phase of the slot's barriers; with an odd one a warpgroup skips the other's
    // phases, and its parity wait could pass on a phase two back while a load is in
    // flight. (A tile with an odd K/V count hands each parity to the other warpgroup
    // for the next tile; the merge's barriers order all of a tile's waits before it.)
    static constexpr int SPLIT_STAGES = DP <= 64 ? 4 : 2;
    static constexpr int Q_BUFS = DP <= 128 ? 2 : 1;  // Q tiles: the next tile's Q loads during this one
    // EARLY_Q (one Q buffer): the consumers release Q as soon as the tile's last
    // S = Q K^T is done, so the next tile's Q (and its first K/V tile, which the
    // producer issues after Q) load during the last P V and the epilogue. O then
    // cannot be staged in the Q rows: each consumer has its own buffer of
    // WG_ROWS x PV_N, and the epilogue stores O in PV_PARTS passes through it.
    static constexpr bool EARLY_Q = Q_BUFS == 1;
    // Q_HALVES (one Q buffer): each consumer's 64 rows of Q load, land and are
    // released on a barrier pair of their own, so a consumer that finishes its
    // tile's last S early (the first one in causal tiles, WG_SKIP) gets its next
    // rows without waiting for the other's. The producer issues half 0 before
    // the tile's K/V tiles and half 1 after its first one, whose slot frees
    // before the other consumer releases its half. Measured on an H100 (perf
    // notes, session 24): causal S512 +4.6 %, 1k +1.8 %, non-causal S <= 1k
    // +1.5 %, flat from 2k.
    static constexpr bool Q_HALVES = EARLY_Q;
    static constexpr int Q_BARS = Q_HALVES ? CONS : Q_BUFS;  // q_full/q_empty pairs
    // Q_AHEAD (D = 128; static order, ordinary mode): the producer issues the
    // next tile's Q after this tile's second K/V tile instead of after its last,
    // so it has landed when the consumers reach that tile (the timeline had them
    // wait 470 cycles per tile for it at S = 2k). Measured on an H100 (perf
    // notes, session 23): D = 128 +3 % at S512, +1-1.6 % at 2k; D = 64 1-9 %
    // slower (ptxas rescheduled its consumers), so it stays off there.
    static constexpr bool Q_AHEAD = Q_BUFS == 2 && DP == 128;
    // Software-pipeline S(j+1) with P(j)V inside a warpgroup. Measured (perf
    // notes, sm90 v3 and session 10): +3-12 % at D = 128; at D = 256 +4-6 % once
    // K is released as soon as S is done (sm90 v5); 10-17 % slower at D = 64, where
    // the in-order schedule of the two warpgroups overlaps better. Three D = 128
    // consumers lack the registers (P of one tile with S of the next).
    static constexpr bool OVERLAP = DP >= 128 && CONS == 2;
    // ptxas schedules the P V wait (and V's release) of a loop step ahead of
    // the softmax, so without help the softmax never runs under its own P V.
    // PIN_SOFTMAX: a shared-memory store of the row sums, which depend on every
    // exponential, sits between them and keeps the softmax first. Measured on an
    // H100 (perf notes, session 18): D = 256 +3-4.5 % at S >= 1k (sustained too).
    // At D = 128 it helps long rows and costs short ones (session 19), so it is
    // on in the LONG instantiation only, which dispatch picks from
    // SM90_LONG_MIN_SK keys.
    static constexpr bool PIN_SOFTMAX = DP > 128 || (LONG && DP == 128);
    // Tile coordinates by multiply and shift (sm90_tile_magic, the order
    // computed on the host by sm90_sched): measured on an H100 (perf notes,
    // session 18) +4-9 % on causal D = 64 at S <= 1k and +1-1.5 % at D = 256;
    // D = 128 +2 % at S = 512 but 1.4 % slower at 2k, and 3-7 % slower in the
    // three-consumer kernel. Those two keep sm90_tile and `/`.
    static constexpr bool MAGIC_DIV = sm90_magic_div(DP, CONS);
    // The O rescale is voted per 8-row half of a warp (softmax_tile), except
    // in the two-consumer D = 64 kernel. Measured on an H100 (perf notes,
    // session 15): +2-5 % with three consumers, +1-2 % at D = 128 and 256;
    // 4-7 % slower in the two-consumer D = 64 kernel, which keeps one vote.
    static constexpr bool HALF_VOTES = !(DP == 64 && CONS == 2);
    // wgmma descriptors as one base per operand and tile plus a constant per k
    // step (wgmma_desc_add), in place of building each from its address (five
    // uniform instructions per wgmma). Measured on an H100 (perf notes, session
    // 19): D = 256 +3.5-5 %, D = 128 +0.5-1.7 %, three consumers +0.5-1 %; the
    // two-consumer D = 64 kernel lost 2-2.5 % at causal S <= 1k and keeps the old way.
    static constexpr bool DESC_ADD = !(DP == 64 && CONS == 2);
    // UNIFORM_CW: the consumer index is broadcast from lane 0 (__shfl_sync), so
    // ptxas knows it is warp-uniform and builds the Q descriptors in uniform
    // registers (no R2UR per wgmma). Measured on an H100 (perf notes, session
    // 19): D = 256 +1.5-3 %; D = 128 0.5-1 % and D = 64 2-5 % slower.
    static constexpr bool UNIFORM_CW = DP > 128;
    // PAD_FIRST: causal query blocks are aligned to the last row, so when BR does
    // not divide Sq the padding rows (negative row numbers: Q loads as zeros, O
    // and LSE are not written) fall in the head's shortest tile, not its longest.
    // With 192-row tiles the grid's causal shapes leave 64-128 padding rows per
    // head. Measured on an H100 (perf notes, session 19): three consumers +2 %
    // at causal S2k, +4.5 % at 4k; applied to the 128-row kernels (no padding on
    // the grid) ptxas's new schedule cost 1.5-3.5 %, so they keep the old blocks.
    static constexpr bool PAD_FIRST = CONS == 3;
    // PAD_SKIP (non-causal): when BR does not divide Sq, a consumer whose 64 rows
    // all lie past Sq (S = 512: 192 + 192 + 128 rows, one consumer of the last
    // block) runs none of the tile's K/V tiles and releases them unread, as
    // WG_SKIP does; and sm90_tile rotates the blocks of each head by stripe
    // (ROTATE), so that the short tiles do not all go to the same CTAs. Measured
    // on an H100 (perf notes, session 29): S512 +4.6 %, 1k +4.2 %, 2k +1.3 %
    // sustained; the skip without the rotation changed nothing. (Three D = 128
    // consumers run causal calls only, whose padding PAD_FIRST handles.)
    static constexpr bool PAD_SKIP = CONS == 3 && DP == 64;
    static_assert(!(PAD_FIRST && MAGIC_DIV), "sm90_tile_magic does not shift causal blocks");
    // WG_SKIP: in causal tiles each consumer runs only the K/V tiles its own rows
    // see, and releases the rest unread. At D = 256 (64-key tiles) the first
    // consumer's rows see none of a 128-row tile's last K/V tile; with three
    // consumers (192-row tiles, 128-key tiles) the first two often skip one.
    // Measured on an H100 (perf notes, session 21): three consumers causal
    // +4-5 % at S2k, +1 % at 4k, +2-4 % at 8k; D = 256 causal +0.5-1.2 %.
    static constexpr bool WG_SKIP = DP > 128 || CONS == 3;
    static constexpr int THREADS = 128 * (1 + CONSUMERS);
    static constexpr int SLABS = DP / FC_SLAB_COLS;   // 128-byte swizzle slabs across a row of Q or K
    static constexpr int V_SLABS = DV / FC_SLAB_COLS;  // ... of V (and O)
    static constexpr uint32_t Q_BYTES = BR * DP * 2;
    static constexpr uint32_t K_BYTES = BC * DP * 2;   // one K tile
    static constexpr uint32_t V_BYTES = BC * DV * 2;   // one V tile
    static constexpr int PV_N = DV < 128 ? DV : 128;   // N of one P V wgmma
    static constexpr int PV_PARTS = DV / PV_N;         // P V wgmmas per 16-key step
    static constexpr uint32_t O_STAGE_BYTES = EARLY_Q ? WG_ROWS * PV_N * 2 : 0;  // one consumer's O buffer
    // Registers after setmaxnreg: 40*128 + 232*256, 24*128 + 240*256 or
    // 32*128 + 160*384 <= 64K. D = 256 takes 240 (O alone is 128 per thread):
    // +2-6 % there; at D = 64 and 128 the same split measured flat to 8 % slower
    // (perf notes, session 12).
    static constexpr int PRODUCER_REGS = CONS == 3 ? 32 : DP > 128 ? 24 : 40;
    static constexpr int CONSUMER_REGS = CONS == 3 ? 160 : DP > 128 ? 240 : 232;
    // Key-split mode: consumer 2's O partials fill the upper 64 rows of every
    // slab of every Q buffer (16 fp32 registers x 128 threads per 8 KB), so
    // it needs DP / 2 <= 16 * Q_BUFS * SLABS, true for DP <= 128.
    static constexpr bool KV_SPLIT_OK = DP <= 128 && CONS == 2;
    static constexpr uint32_t ML_BYTES = 4 * 128 * 4;  // key-split: consumer 2's m and l, 4 floats per thread
    static constexpr uint32_t SINK_BYTES = PIN_SOFTMAX ? 4 * 4 * CONS : 0;  // one word per consumer warp
    // TILE_INFO: the producer, which finds each tile's coordinates anyway, stores
    // them next to the tile's Q, and the consumers read them once Q has landed,
    // in place of their own divisions between two tiles. Measured on an H100
    // (perf notes, session 22): +1-4 % at S <= 1k and causal D = 64; the D = 128
    // LONG kernel lost 1-2 % (ptxas rescheduled its loop) and keeps sm90_tile.
    static constexpr bool TILE_INFO = !(LONG && DP == 128);
    static constexpr uint32_t INFO_BYTES = TILE_INFO ? 16 * Q_BARS : 0;  // per Q barrier pair, its tile's b, h, row0, n_blocks
    __host__ __device__ static constexpr int stages(bool kv_split) { return kv_split ? SPLIT_STAGES : STAGES; }
    // q_full[], q_empty[], k_full[], v_full[], k_empty[], v_empty[]
    static constexpr int n_barriers(bool kv_split) { return 2 * Q_BARS + 4 * stages(kv_split); }
    // Dynamic smem; key-split mode adds ML_BYTES for its merge.
    static constexpr size_t smem_bytes(bool kv_split) {
        return FC_SWZ_GROUP_BYTES /* alignment slack */ + Q_BUFS * Q_BYTES + stages(kv_split) * (size_t)(K_BYTES + V_BYTES) +
               CONSUMERS * O_STAGE_BYTES + 8 * n_barriers(kv_split) + (kv_split ? ML_BYTES : 0) + SINK_BYTES +
               INFO_BYTES;
    }
    static_assert(SPLIT_STAGES % 2 == 0, "key-split mode needs an even K/V ring");
    static_assert(!KV_SPLIT_OK || DP / 2 <= 16 * Q_BUFS * SLABS, "key-split partials must fit the Q buffers");
    static_assert(DP % FC_SLAB_COLS == 0, "DP must be a whole number of 64-column slabs");
    static_assert(!Q_HALVES || (CONS == 2 && !KV_SPLIT_OK), "Q halves: two consumers, each with its own rows");
};

#include "attn_sm90_order.cuh"  // (the tile order, Sm90Args)

template <int N, typename T>
__device__ __forceinline__ void wgmma_qk(float (&d)[N / 2], uint64_t da, uint64_t db, int scale_d) {
    if constexpr (N == 192) wgmma_ss_n192<T>(d, da, db, scale_d);
    else if constexpr (N == 128) wgmma_ss_n128<T>(d, da, db, scale_d);
    else wgmma_ss_n64<T>(d, da, db, scale_d);
}
template <int N, typename T>
__device__ __forceinline__ void wgmma_pv(float (&d)[N / 2], const uint32_t a[4], uint64_t db) {
    if constexpr (N == 136) wgmma_rs_n136<T>(d, a, db, 1);  // (loop_sched's P V with 8 columns of ones)
    else if constexpr (N == 128) wgmma_rs_n128<T>(d, a, db, 1);
    else wgmma_rs_n64<T>(d, a, db, 1);
}

// ---------------------------------------------------------------------------
// Consumer helpers. S fragments: s[4*nt + e] holds row lane/4 + 8*(e/2) of the
// warp's 16 rows and key nt*8 + (lane%4)*2 + e%2 of the tile.

// Issues S = Q K^T for one K tile (DP/16 k steps; a step inside a slab moves
// 32 bytes) as one wgmma group. q_rows: this warpgroup's rows of slab 0.
// DESC_ADD: see Sm90Tile::DESC_ADD. KROWS: the K tile's rows (its slab
// stride), when S covers only its last BC of them (k_tile then points there).
template <int DP, int BR, int BC, typename T, bool DESC_ADD, int KROWS = BC>
__device__ __forceinline__ void issue_qk(float (&s)[BC / 2], uint32_t q_rows, uint32_t k_tile) {
    wgmma_fence();  // orders earlier register use of s before the async writes
    if constexpr (DESC_ADD) {
        const uint64_t qd = wgmma_desc(q_rows, 16, FC_SWZ_GROUP_BYTES), kd = wgmma_desc(k_tile, 16, FC_SWZ_GROUP_BYTES);
#pragma unroll
        for (int kk = 0; kk < DP / 16; ++kk)
            wgmma_qk<BC, T>(s, wgmma_desc_add(qd, (kk / 4) * BR * FC_SWZ_ROW_BYTES + (kk % 4) * 32),
                            wgmma_desc_add(kd, (kk / 4) * KROWS * FC_SWZ_ROW_BYTES + (kk % 4) * 32), kk > 0);
    } else {
#pragma unroll
        for (int kk = 0; kk < DP / 16; ++kk) {
            const uint32_t qa = q_rows + (kk / 4) * BR * FC_SWZ_ROW_BYTES + (kk % 4) * 32;
            const uint32_t kb = k_tile + (kk / 4) * KROWS * FC_SWZ_ROW_BYTES + (kk % 4) * 32;
            wgmma_qk<BC, T>(s, wgmma_desc(qa, 16, FC_SWZ_GROUP_BYTES), wgmma_desc(kb, 16, FC_SWZ_GROUP_BYTES), kk > 0);
        }
    }
    wgmma_commit();
}

// Issues O += P V for one V tile as one wgmma group. V is N-major: a 16-key
// step moves 16 rows, a part (PV_N = 128 columns) moves 2 slabs.
template <int BC, int PV_N, int PV_PARTS, typename T, bool DESC_ADD>
__device__ __forceinline__ void issue_pv(float (&o)[PV_PARTS][PV_N / 2], const uint32_t (&pa)[BC / 16][4],
                                         uint32_t v_tile) {
    wgmma_fence();  // orders earlier register writes of o and pa before the async accumulation
    const uint64_t vd = wgmma_desc(v_tile, BC * FC_SWZ_ROW_BYTES, FC_SWZ_GROUP_BYTES);
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk)
#pragma unroll
        for (int pp = 0; pp < PV_PARTS; ++pp) {
            const uint32_t off = pp * 2 * BC * FC_SWZ_ROW_BYTES + kk * 16 * FC_SWZ_ROW_BYTES;
            wgmma_pv<PV_N, T>(o[pp], pa[kk],
                              DESC_ADD ? wgmma_desc_add(vd, off)
                                       : wgmma_desc(v_tile + off, BC * FC_SWZ_ROW_BYTES, FC_SWZ_GROUP_BYTES));
        }
    wgmma_commit();
}

// Sets keys >= Sk, and (causal) keys > row + diag, of the tile at key0 to -inf.
// row: this thread's first fragment row (the second is row + 8). WIN (the
// windowed instantiation): keys < row + lo too, the row's first visible key
// (kernels.h's fc_band; lo = INT_MIN / 2: no left edge).
template <int BC, bool WIN = false>
__device__ __forceinline__ void mask_tile(float (&s)[BC / 2], int key0, int row, const fc_attn_params& p,
                                          bool causal, int diag, int lane, int lo = 0) {
    const int key_lim = p.Sk - key0 - (lane % 4) * 2;
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const int diag_lim = causal ? row + hr * 8 + diag - key0 - (lane % 4) * 2 : INT_MAX;
        const int lo_lim = row + hr * 8 + lo - key0 - (lane % 4) * 2;
#pragma unroll
        for (int nt = 0; nt < BC / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int c = nt * 8 + e;
                if (c >= key_lim || c > diag_lim || (WIN && c < lo_lim)) s[4 * nt + 2 * hr + e] = -INFINITY;
            }
    }
}

// The keys before key 0 in K/V tile 0 with LEAD_TILE: tiles of bc keys end at key sk - 1.
__host__ __device__ constexpr int sm90_lead(int sk, int bc) { return (bc - sk % bc) % bc; }

// Row half hr's new running max (m_i[hr]) from one tile's S, with corr[hr] =
// exp2(old max - new max). Returns the max the exponentials subtract (0 while no
// key is visible, so that exp2 gives 0, not NaN); changed: whether this
// thread's rows of the half got a new max (for the rescale vote).
template <int BC>
__device__ __forceinline__ float softmax_row_max(const float (&s)[BC / 2], int hr, float (&m_i)[2], float (&corr)[2],
                                                 float scale_log2, bool& changed) {
    float mx = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < BC / 8; ++nt) mx = fmaxf(mx, fmaxf(s[4 * nt + 2 * hr], s[4 * nt + 2 * hr + 1]));
    const float m_new = fmaxf(m_i[hr], quad_max(mx) * scale_log2);
    const float m_use = m_new == -INFINITY ? 0.f : m_new;
    corr[hr] = fast_exp2(m_i[hr] - m_use);
    changed = m_new != m_i[hr];
    m_i[hr] = m_new;
    return m_use;
}

// Online softmax of one tile: new row max m, s <- P = exp2(s*scale_log2 - m),
// l <- l*corr + rowsum(P). Returns a mask: bit hr is set when any of the
// warp's rows hr*8 .. hr*8+7 has a new max (then O's registers of those rows,
// (i / 2) % 2 == hr, must be multiplied by corr[hr]: rescale_o). One vote per
// half skips more of the rescale than one per warp: 8 rows settle sooner than
// 16. With !HALF_VOTES one vote covers the warp: the mask is 3 or 0.
// SUMS false: no row sums (l_i is left as it is; loop_sched's row-sum modes).
template <int BC, bool HALF_VOTES, bool SUMS = true>
__device__ __forceinline__ unsigned softmax_tile(float (&s)[BC / 2], float (&m_i)[2], float (&l_i)[2],
                                                 float (&corr)[2], float scale_log2) {
    unsigned rescale = 0;
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        bool changed;
        const float m_use = softmax_row_max<BC>(s, hr, m_i, corr, scale_log2, changed);
        if constexpr (HALF_VOTES) rescale |= (unsigned)__any_sync(0xffffffffu, changed) << hr;
        else rescale |= changed;
        float rs = 0.f;
#pragma unroll
        for (int nt = 0; nt < BC / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const float pe = fast_exp2(fmaf(s[4 * nt + 2 * hr + e], scale_log2, -m_use));
                s[4 * nt + 2 * hr + e] = pe;
                if constexpr (SUMS) rs += pe;
            }
        if constexpr (SUMS) l_i[hr] = l_i[hr] * corr[hr] + rs;
    }
    if constexpr (HALF_VOTES) return rescale;
    else return __any_sync(0xffffffffu, rescale) ? 3u : 0u;
}

// O *= corr for the row halves whose bit is set in rescale (softmax_tile's mask).
template <int PV_PARTS, int PV_N>
__device__ __forceinline__ void rescale_o(float (&o)[PV_PARTS][PV_N / 2], unsigned rescale, const float (&corr)[2]) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        if (rescale & (1u << hr)) {  // skipped once the maxima of these 8 rows settle
#pragma unroll
            for (int pp = 0; pp < PV_PARTS; ++pp)
#pragma unroll
                for (int i = 2 * hr; i < PV_N / 2; i += 4) {
                    o[pp][i] *= corr[hr];
                    o[pp][i + 1] *= corr[hr];
                }
        }
    }
}

// P as the wgmma A operand: keys 16kk.. are S column tiles 2kk and 2kk+1.
template <int BC, typename T>
__device__ __forceinline__ void pack_p(uint32_t (&pa)[BC / 16][4], const float (&s)[BC / 2]) {
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) pa[kk][r] = pack2<T>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
}

// LEAD_TILE's softmax of K/V tile 0 (O is still 0: no rescale). sub: S of the
// tile's keys from SKIP groups of GROUP keys on (Sm90Tile::LEAD_GROUP; the
// skipped ones are not computed), the first `lo` of them masked; P of the
// skipped keys is 0.
template <int BC, int GROUP, int SKIP, typename T, bool HALF_VOTES>
__device__ __forceinline__ void sm90_lead_softmax(float (&sub)[(BC - GROUP * SKIP) / 2], uint32_t (&pa)[BC / 16][4],
                                                  float (&m_i)[2], float (&l_i)[2], int lo, float scale_log2,
                                                  int lane) {
    constexpr int N = BC - GROUP * SKIP;  // keys left
    const int lim = lo - (lane % 4) * 2;
#pragma unroll
    for (int nt = 0; nt < N / 8; ++nt)  // (only nt < GROUP / 8 can mask; that bound changed the SASS throughout)
#pragma unroll
        for (int i = 0; i < 4; ++i)
            if (nt * 8 + i % 2 < lim) sub[4 * nt + i] = -INFINITY;
    float corr[2];
    softmax_tile<N, HALF_VOTES>(sub, m_i, l_i, corr, scale_log2);
    uint32_t(&pa_sub)[N / 16][4] = *reinterpret_cast<uint32_t(*)[N / 16][4]>(&pa[GROUP / 16 * SKIP][0]);
    pack_p<N, T>(pa_sub, sub);
#pragma unroll
    for (int kk = 0; kk < GROUP / 16 * SKIP; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) pa[kk][r] = 0u;
}

// LEAD_TILE's lead of a call, the producer's and the consumers': K/V tile j
// starts at key j BC - lead. 0 in every other kernel and in causal calls, which
// the launcher never gives the static-order 192-key kernel.
template <typename Tile, bool DYN>
__device__ __forceinline__ int sm90_kv_lead(const fc_attn_params& p) {
    return Tile::LEAD_TILE && !DYN && p.causal == FC_CAUSAL_NONE ? sm90_lead(p.Sk, Tile::BC) : 0;
}

// Key-split mode's end of a tile (attn_fwd_sm90.cuh): consumer 2 (cw = 1) leaves its
// O, m and l partials in shared memory and consumer 1 merges them into its own by
// their maxima. Thread t128 of both warpgroups holds the same rows and columns, so
// the partials go as [register][thread]: register f of O in 8 KB chunk f / 16 (Q
// buffer c % Q_BUFS, slab c / Q_BUFS, rows 64-127, unused with 64-row tiles; sq:
// the Q buffers), m and l in mlp (ML_BYTES).
template <typename Tile>
__device__ __forceinline__ void sm90_split_merge(float (&o)[Tile::PV_PARTS][Tile::PV_N / 2], float (&m_i)[2],
                                                 float (&l_i)[2], int cw, int t128, unsigned char* sq, float* mlp) {
    constexpr int PV_N = Tile::PV_N, PV_PARTS = Tile::PV_PARTS;
    auto part = [&](int f) {
        const int c = f / 16;
        return reinterpret_cast<float*>(sq + (c % Tile::Q_BUFS) * Tile::Q_BYTES +
                                        (c / Tile::Q_BUFS) * Tile::BR * FC_SWZ_ROW_BYTES +
                                        Tile::WG_ROWS * FC_SWZ_ROW_BYTES) +
               (f % 16) * 128 + t128;
    };
    if (cw == 1) {
#pragma unroll
        for (int pp = 0; pp < PV_PARTS; ++pp)
#pragma unroll
            for (int i = 0; i < PV_N / 2; ++i) *part(pp * (PV_N / 2) + i) = o[pp][i];
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            mlp[hr * 128 + t128] = m_i[hr];
            mlp[(2 + hr) * 128 + t128] = l_i[hr];
        }
        named_barrier_arrive(3, 256);  // the partials are in smem before warpgroup 1 reads them
        named_barrier_sync(4, 256);    // warpgroup 1 has read them: the next tile may overwrite
    } else {
        named_barrier_sync(3, 256);    // warpgroup 2's partials are in smem
        float c0[2], c1[2];
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const float m1 = mlp[hr * 128 + t128], l1 = mlp[(2 + hr) * 128 + t128];
            const float m = fmaxf(m_i[hr], m1);
            const float m_use = m == -INFINITY ? 0.f : m;  // no key in either half: both factors 0
            c0[hr] = fast_exp2(m_i[hr] - m_use);
            c1[hr] = fast_exp2(m1 - m_use);
            m_i[hr] = m;
            l_i[hr] = l_i[hr] * c0[hr] + l1 * c1[hr];
        }
#pragma unroll
        for (int pp = 0; pp < PV_PARTS; ++pp)
#pragma unroll
            for (int i = 0; i < PV_N / 2; ++i)
                o[pp][i] = o[pp][i] * c0[(i / 2) % 2] + *part(pp * (PV_N / 2) + i) * c1[(i / 2) % 2];
        named_barrier_arrive(4, 256);  // the partials are read: warpgroup 2 may go on
    }
}
