// attn_bwd_sm90.cuh -- Hopper attention backward (sm_90a): wgmma + TMA.
//
// Algorithm. Three kernels on one stream, as the portable backward
// (csrc/sm80/attn_bwd_sm80.cuh), with a Hopper main kernel:
//  1. attn_bwd_prep_kernel (csrc/common/bwd_rows.cuh): Delta_i = dO_i . O_i
//     (minus dlse_i) and LSE_i * log2(e) per query row, padded to
//     FC_BWD_ROW_PAD rows per head (padding rows: Delta 0, LSE +inf, so P = 0),
//     and the fp32 dQ accumulator zeroed.
//  2. attn_bwd_sm90_kernel: an item is BC keys of one (batch, KV head); a
//     persistent grid of one CTA per SM takes the items in order from a
//     counter, each CTA its next one in the block before the last of the one
//     before, or at its start if it walks one block or none (a deterministic
//     call: one CTA per item, as its instantiation at DP = 64 spills with the
//     loop over items). K and V arrive once per item by TMA, V with the item's
//     first Q / dO block, which the last block of the CTA's previous item loads
//     as it would its own next block; K then too at DP = 64, into the other of
//     two K buffers (at DP >= 128 once the previous item has ended: two K
//     buffers cost DP = 128 5-10 % at S >= 4k on an H100, perf notes, session
//     63, and DP = 256 has no room). Up to DP = 128, BC = 128 and two warpgroups
//     own 64 keys each with all DP columns of their dK, dV accumulators (fp32)
//     in registers; at DP = 256, BC = 64 and both warpgroups work on the same
//     64 keys, each owning 128 of the columns of dK and dV (the tile table in
//     attn_bwd_sm90_tile.cuh). An item walks the Hq / Hkv query heads of the
//     KV head and, per head, the query blocks of BR rows that see any of its
//     keys (causal: from the block of the first key's diagonal on; a window:
//     to the block of the last key's left edge). Thread 0 loads each block's Q, dO (TMA, 128-byte swizzle)
//     and its rows' LSE and Delta (bulk copies) into a ring of STAGES slots,
//     completing on one mbarrier per slot, one block ahead (DP = 64: as soon as
//     both warpgroups have arrived on the slot's empty mbarrier, up to two blocks
//     ahead). Per block,
//     each warpgroup runs, for its 64 keys x BR rows,
//       S^T = K Q^T, dP^T = V dO^T        wgmma, both operands in shared memory
//       P^T = exp2(S^T scale log2e - LSE log2e)   (masked: keys >= Sk, causal, window)
//       dV += P^T dO                      wgmma, P^T from registers
//       dS^T = P^T (dP^T - Delta)
//       dK += dS^T Q                      wgmma, dS^T from registers
//     and stores dS^T (16-bit) into shared memory. After a CTA barrier each
//     warpgroup computes a 64 x 64 tile of dQ_i = dS K over all 128 keys (wgmma
//     with both operands MN-major: dS^T as stored, K as loaded), stages it in
//     shared memory in fragment order and adds it (unscaled) to the fp32
//     accumulator with one bulk reduction (cp.reduce.async.bulk) of 16 KB:
//     the accumulator is kept in that tiled order (pieces of 64 x 64 floats,
//     bwd_rows.cuh), where per-row reductions from registers cost 30 % of the time.
//     The epilogue stages dK * scale and dV (16-bit) in shared memory the item
//     has done with and writes them with TMA stores, which run under the next item.
//     DP = 256 (SPLIT_D): 256 columns of dK and dV for 64 keys are 256 fp32
//     registers per thread of a warpgroup, so each warpgroup keeps 128 of them.
//     The block's elementwise work is split by query rows instead: warpgroup 0
//     computes S^T and warpgroup 1 dP^T (wgmma N = 64: N = 32, 32 rows of both,
//     runs at 2/3 of the tensor rate, bound by shared-memory reads), they pass
//     each other half of the columns (fp32, through shared memory), and each
//     stores the P^T and dS^T of its 32 rows (16-bit) into shared memory; after the
//     CTA barrier dV += P^T dO and dK += dS^T Q read both operands from shared
//     memory (its 128 columns of dO and Q), and its dQ is two 64 x 64 pieces
//     (its 128 columns; see MLA's below), staged in the block's own Q / dO slot: there Q's and
//     dO's 64-column slabs alternate, and the slabs a piece overwrites (one of
//     Q, one of dO: 16 KB) are read only by this warpgroup's dK, dV wgmmas,
//     retired by then, and by both warpgroups' S^T and dP^T, retired before
//     the CTA barrier. The ring then needs the reductions' reads done before a
//     slot is refilled, which the staging of DP <= 128 needs before its own
//     reuse: the same wait. Where warpgroup 1 has no dV and one piece of its
//     own (D <= 192, Dv <= 128: MLA), it takes warpgroup 0's second piece and
//     stages it over slab 3 (Q's slab 3 only its own dK wgmma reads; dO's none).
//  3. attn_bwd_post_kernel (bwd_rows.cuh): dQ = scale * accumulator (pieces), in dtype.
// dK and dV are bit-reproducible (a fixed order inside one CTA); dQ's
// reductions across key blocks are too when the call is deterministic: then
// the CTAs that reduce into one piece take turns, the last key block first
// (csrc/common/bwd_rows.cuh). The warpgroup's thread that issues a piece's
// reduction waits for its turn just before it, and counts it at the next
// block's CTA barrier (or after the loop), once the reduction has completed.
//
// Limits. sm_90a only. D any multiple of 8 up to DP (64, 128 or 256): TMA
// zero-fills the padding columns, which are never stored. At DP = 256, v's own
// head dim Dv (a multiple of 8 up to D; dispatch passes it nowhere else): the
// maps of dO, V and dV are Dv wide, so their columns past Dv load as zeros and
// are never stored, and Delta is summed over Dv. Any Sq, Sk >= 1:
// TMA zero-fills tail rows and keys; tail keys are masked and tail rows have
// LSE +inf. Rows with LSE = -inf get P = 0. Tensor strides as the forward's
// Hopper kernel (TMA: 16-byte aligned). Workspace (kernels.h): the dQ
// accumulator (B, Hq, Sq_pad, DP) in pieces, then Delta and LSE * log2(e),
// (B, Hq, Sq_pad) each, then the int32 item counter, then a deterministic
// call's turn counters (one int32 per piece).
#pragma once

#include <cuda.h>
#include <limits.h>
#include <math.h>

#include <type_traits>

#include "../common/bwd_rows.cuh"
#include "../common/launch.cuh"
#include "../flashcore.h"
#include "../kernels.h"
#include "attn_bwd_sm90_mma.cuh"
#include "hopper.cuh"
#include "tensor_map.h"
#include "attn_bwd_sm90_tile.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FC_SM90_BWD_BODY 1  // device code for sm_90a (the extension also compiles this file for sm_80)
#endif

// ---------------------------------------------------------------------------
// Kernel: dK, dV and the dQ accumulator. Fragment layout of an accumulator
// acc[4 * nt + 2 * hr + e] of a warpgroup: row warp * 16 + lane / 4 + 8 * hr,
// column nt * 8 + (lane % 4) * 2 + e.

// DET: the call is deterministic (its own instantiation, so that the default
// one carries none of the turns' code or registers). WIN: the call has a
// sliding window (bwd_band; its own instantiation too: with the window's
// walk and masks in the one kernel, D = 128 ran 3-5 % slower without a window).
template <int DP, typename T, bool DET, bool WIN>
__global__ void __launch_bounds__(BwdSm90Tile<DP>::THREADS, 1)
attn_bwd_sm90_kernel(const __grid_constant__ BwdSm90Args args) {
#ifdef FC_SM90_BWD_BODY
    using Tile = BwdSm90Tile<DP>;
    constexpr int BR = Tile::BR, BC = Tile::BC, STAGES = Tile::STAGES, SLABS = Tile::SLABS, DH = Tile::DH;
    constexpr int QW = Tile::QW;
    constexpr bool SPLIT_D = Tile::SPLIT_D;
    constexpr uint32_t ROWB = Tile::ROWB, QDO_SLAB_STEP = Tile::QDO_SLAB_STEP;
    const fc_attn_bwd_params& p = args.p;

    extern __shared__ unsigned char smem_raw[];
    const uint32_t raw = smem_u32(smem_raw);
    const uint32_t base = (raw + FC_SWZ_GROUP_BYTES - 1) & ~(FC_SWZ_GROUP_BYTES - 1);  // swizzle atoms: 1 KB aligned
    const uint32_t sK = base + Tile::OFF_K, sV = base + Tile::OFF_V;   // (KBUF, BC, DP), (BC, DP), slabs of BC rows
    const uint32_t sQ = base + Tile::OFF_Q, sdO = base + Tile::OFF_DO;  // STAGES slots of (BR, DP), slabs of BR rows
    const uint32_t sdS = base + Tile::OFF_DS;                           // (DS_BUFS, BC, BR) dS^T, slabs of BC rows
    const uint32_t sPT = base + Tile::OFF_PT;                           // SPLIT_D: (BC, BR) P^T, as dS^T
    const uint32_t sX = base + Tile::OFF_X;  // SPLIT_D: (WGS, 64 x QW) fp32, fragment order (each the sender's)
    const uint32_t sDQ = base + Tile::OFF_DQ;  // (WGS, BWD_PIECE) fp32, fragment order (SPLIT_D: in the slot)
    const uint32_t sLse = base + Tile::OFF_LSE, sDelta = base + Tile::OFF_DELTA;  // (STAGES, BR) fp32
    const float* lse_s = reinterpret_cast<const float*>(smem_raw + (sLse - raw));
    const float* delta_s = reinterpret_cast<const float*>(smem_raw + (sDelta - raw));
    auto k_bar = [&](int kb) { return base + Tile::OFF_BAR + FC_MBAR_BYTES * kb; };
    auto full_bar = [&](int slot) { return base + Tile::OFF_BAR + FC_MBAR_BYTES * (Tile::KBUF + slot); };
    auto empty_bar = [&](int slot) { return base + Tile::OFF_BAR + FC_MBAR_BYTES * (Tile::KBUF + STAGES + slot); };
    // Not in a deterministic call: there it cost 0.6-6 % at DP = 64 (its CTAs wait their dQ turns; perf
    // notes, session 66), so DET refills at the CTA barrier.
    constexpr bool EARLY_REFILL = Tile::EARLY_REFILL && !DET;

    const int tid = threadIdx.x, wg = tid / FC_WG_THREADS, t = tid % FC_WG_THREADS, warp = t / 32, lane = tid % 32;
    const unsigned n_items = (unsigned)((p.Sk + BC - 1) / BC) * (unsigned)(p.B * p.Hkv);  // bwd_walk's items

    float* dq_acc = static_cast<float*>(p.workspace);  // (B, Hq, sq_pad, DP) in pieces, see bwd_piece
    const float* delta_g = dq_acc + (int64_t)p.B * p.Hq * args.sq_pad * DP;
    const float* lse2_g = delta_g + (int64_t)p.B * p.Hq * args.sq_pad;

    if (tid == 0) {
        for (int kb = 0; kb < Tile::KBUF; ++kb) mbar_init(k_bar(kb), 1);
        for (int s = 0; s < STAGES; ++s) mbar_init(full_bar(s), 1);
        for (int s = 0; s < (EARLY_REFILL ? Tile::EMPTY_BARS : 0); ++s)
            mbar_init(empty_bar(s), Tile::WGS);  // one arrival per warpgroup
        mbar_init_fence();
    }
    __syncthreads();  // the initialized barriers before any wait on them or TMA completion

    // The loads (thread 0). The ring holds the CTA's blocks in the order it walks them, over all its
    // items: block j of an item whose first block is the CTA's block n0 is the CTA's block n0 + j,
    // in slot (n0 + j) % STAGES. The ring loads one block ahead (EARLY_REFILL: up to two within an
    // item, see the block's end), across items too: an item's first block loads with its V in the
    // last block of the item before (V's last reader, dP^T, has retired by that block's CTA barrier),
    // and with its K into the other K buffer (KBUF = 2; with one, K loads once the item before has
    // ended). After items that walk no block all of them load at that item's end; the CTA's first
    // item's in the prologue.
    // Q, dO, LSE and Delta of block j of walk v, the CTA's block n, into slot n % STAGES (and V if j = 0).
    auto load_block = [&](const BwdWalk& v, int j, unsigned n) {
        const int slot = n % STAGES, h = v.hk * v.G + j / v.per_head, row0 = (v.m_first + j % v.per_head) * BR;
        const uint32_t bar = full_bar(slot);
        // EARLY_REFILL: both warpgroups released the slot's block before (n - STAGES). Every caller knows they
        // did (the early refill's test, or a CTA barrier after both arrivals), so this returns at once; it
        // makes each phase of the empty barrier one that a thread waited on before the next arrival, which
        // compute-sanitizer's synccheck requires ("Missing wait" without it: perf notes, session 80).
        if (EARLY_REFILL && n >= STAGES) mbar_wait(empty_bar(slot), (n / STAGES + 1) & 1);
        mbar_expect_tx(bar, 2 * Tile::QDO_TILE + 2 * Tile::VEC + (j == 0 ? Tile::KV_TILE : 0));
#pragma unroll
        for (int s = 0; s < SLABS; ++s) {
            const uint32_t at = slot * Tile::SLOT_STEP + s * QDO_SLAB_STEP;
            tma_load_4d(sQ + at, &args.q_map, bar, s * FC_SLAB_COLS, row0, h, v.b);
            tma_load_4d(sdO + at, &args.do_map, bar, s * FC_SLAB_COLS, row0, h, v.b);
            if (j == 0) tma_load_4d(sV + s * BC * ROWB, &args.v_map, bar, s * FC_SLAB_COLS, v.k0, v.hk, v.b);
        }
        const int64_t vec0 = ((int64_t)v.b * p.Hq + h) * args.sq_pad + row0;
        bulk_load(sLse + slot * Tile::VEC, lse2_g + vec0, Tile::VEC, bar);
        bulk_load(sDelta + slot * Tile::VEC, delta_g + vec0, Tile::VEC, bar);
    };
    // K of walk v into buffer kb, completing on k_bar(kb).
    auto load_k = [&](const BwdWalk& v, int kb) {
        mbar_expect_tx(k_bar(kb), Tile::KV_TILE);
#pragma unroll
        for (int s = 0; s < SLABS; ++s)
            tma_load_4d(sK + kb * Tile::KV_TILE + s * BC * ROWB, &args.k_map, k_bar(kb), s * FC_SLAB_COLS, v.k0,
                        v.hk, v.b);
    };
    // Items: the first is blockIdx.x, the next from the counter (CTAs that finish early take more;
    // the protocol over items is modelled in scripts/bwd_barrier_model.py: change both together).
    // Thread 0 leaves it in next_s[k % NEXT_SLOTS] for the k-th item's end (two words: the CTA reads
    // one after the item's end barrier, while thread 0 may already write the other).
    unsigned* item_counter = bwd_item_counter<DP>(p, args.sq_pad);
    volatile unsigned* next_s = reinterpret_cast<volatile unsigned*>(smem_raw + (base + Tile::OFF_NEXT - raw));
    if (tid == 0) {  // the first item's K, V and first block
        const BwdWalk v = bwd_walk<WIN>(p, BC, BR, blockIdx.x);
        if (v.n_iter > 0) {
            load_k(v, 0);
            load_block(v, 0, 0);
        }
    }

    const float scale_log2 = p.scale * FC_LOG2E;
    const int wg_key = SPLIT_D ? 0 : wg * Tile::WG_KEYS;  // this warpgroup's first key in the CTA's
    const uint32_t v_rows = sV + wg_key * ROWB;
    const int dh_slab = SPLIT_D ? wg * (DH / FC_SLAB_COLS) : 0;  // first slab of this warpgroup's dK, dV columns
    const int q_off = SPLIT_D ? wg * QW : 0;  // first query row (of a block) of this warpgroup's S^T columns
    // SPLIT_D: v's own head dim Dv <= D (dO, V and dV have Dv columns; TMA loads those past it as zeros). The
    // slabs of S^T's (warpgroup 0: D's) or dP^T's (warpgroup 1: Dv's) products that hold any column; this
    // warpgroup's dV columns hold none where its first is past Dv, its dQ piece's where its first is past D
    // (or, dq_moved below, where the other warpgroup computes it).
    const int dv_cols = FC_DV(p);
    const int k_slabs = ((wg ? dv_cols : p.D) + FC_SLAB_COLS - 1) / FC_SLAB_COLS;
    const bool dv_live = !SPLIT_D || dh_slab * FC_SLAB_COLS < dv_cols;
    // A 16-bit tile held as a (64 key rows x QW columns) accumulator's A fragments f into a (BC, BR) buffer at
    // buf, columns from q_off: key row r, query column c at slab c / 64, chunk (c % 64) / 8 ^ r % 8.
    // f[kk][2 * half + hr] holds row lane/4 + 8*hr, columns 16 kk + 8 half + (lane % 4) * 2 + 0/1.
    auto store_t = [&](uint32_t buf, const uint32_t (&f)[QW / 16][4]) {
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const int r = wg_key + warp * 16 + lane / 4 + 8 * hr;
#pragma unroll
            for (int kk = 0; kk < QW / 16; ++kk)
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    const int ci = q_off / 8 + 2 * kk + half, chunk = ci % 8, slab = ci / 8;
                    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(buf + slab * BC * ROWB + r * ROWB +
                                                                    ((chunk ^ (r & 7)) << 4) + (lane % 4) * 4),
                                 "r"(f[kk][2 * half + hr])
                                 : "memory");
                }
        }
    };
    // dQ piece c of this warpgroup: dS^T's column slab (query rows) and K's column slab (head-dim columns).
    // SPLIT_D with D <= 192 and Dv <= 128 (MLA's 192 / 128): warpgroup 1 has no dV and one live piece of its
    // own, so it takes warpgroup 0's second (columns 64-127) and stages it over slab 3, whose Q only its
    // own dK wgmma reads (retired by its first piece's wait) and whose dO nothing: after the CTA barrier,
    // per block and 64 keys, the warpgroups issue dV 2 + dK 2 + dQ 1 and dK 2 + dQ 2 slabs of wgmma,
    // where they issued 6 and 3 (before it, S^T's 3 and dP^T's 2 stay).
    const bool dq_moved = SPLIT_D && p.D <= 3 * FC_SLAB_COLS && dv_cols <= 2 * FC_SLAB_COLS;
    const int dq_row_slab = BR == 128 ? wg : 0;
    auto dq_col_slab = [&](int c) {
        return SPLIT_D ? (dq_moved && wg == 1 && c == 1 ? 1 : wg * Tile::DQ_PIECES + c) : DP == 128 ? wg : 0;
    };
    auto dq_stage_slab = [&](int c) { return dq_moved && wg == 1 && c == 1 ? 3 : dq_col_slab(c); };
    // (c = 0 always: at DP = 256 D > 128, so each warpgroup's first piece holds columns of D)
    auto dq_live = [&](int c) {
        return !SPLIT_D || c == 0 || (dq_moved ? wg == 1 : dq_col_slab(c) * FC_SLAB_COLS < p.D);
    };

    unsigned n0 = 0;        // the CTA's blocks before this item's
    unsigned busy = 0;      // the CTA's items before this one that walk any block (K buffer and k_bar parity)
    unsigned item = blockIdx.x;
    for (int k = 0; item < n_items; ++k) {  // the CTA's k-th item
        const BwdWalk w = bwd_walk<WIN>(p, BC, BR, item);  // the query blocks this item visits
        const int hk = w.hk, b = w.b, G = w.G, k0 = w.k0, diag = w.diag, lo = w.lo;
        const bool causal = w.causal, windowed = WIN && w.windowed;
        const int m_first = w.m_first, per_head = w.per_head, n_iter = w.n_iter;
        // Index of this warpgroup's dQ piece c of iteration j (bwd_piece_index), and (deterministic) its turn counter.
        auto piece_index = [&](int j, int c) {
            const int h = hk * G + j / per_head, row0 = (m_first + j % per_head) * BR;
            const int64_t m =
                ((int64_t)b * p.Hq + h) * (args.sq_pad / Tile::DQ_ROWS) + row0 / Tile::DQ_ROWS + dq_row_slab;
            return bwd_piece_index<DP>(m, dq_col_slab(c));
        };
        auto piece_turn = [&](int j, int c) { return bwd_piece_turns<DP>(p, args.sq_pad) + piece_index(j, c); };
        // Deterministic, the warpgroup's thread t = 0: counts its adds into iteration j's pieces.
        auto count_turns = [&](int j) {
            bulk_wait<0>();              // the reductions have read their staging and added their sums;
            fence_proxy_async_global();  // their adds (async proxy) before the counts
#pragma unroll
            for (int c = 0; c < Tile::DQ_PIECES; ++c)
                if (dq_live(c)) bwd_count_turn(piece_turn(j, c));
        };

        float dk[DH / 2], dv[DH / 2];  // this warpgroup's 64 keys x DH columns (dK unscaled)
#pragma unroll
        for (int i = 0; i < DH / 2; ++i) dk[i] = dv[i] = 0.f;
        const int key_w0 = k0 + wg_key;
        const int kb = busy % Tile::KBUF;  // this item's K buffer
        const uint32_t sKi = sK + kb * Tile::KV_TILE, k_rows = sKi + wg_key * ROWB;
        // Thread 0 takes the next item one block before this item's last, after its CTA barrier (the
        // add's latency hides under a block, and the last block's refill loads the next item's first
        // block), at the item's start if it walks one block or none.
        unsigned ticket = 0;  // thread 0: the counter before its add
        if (!DET && tid == 0 && n_iter <= 1) ticket = atomicAdd(item_counter, 1);
        if (n_iter > 0) mbar_wait(k_bar(kb), (busy / Tile::KBUF) & 1);  // this item's K has landed (V: with block 0)

        bool ahead = false;  // thread 0, EARLY_REFILL: block it + 1 is loading already (see the block's end)
        for (int it = 0; it < n_iter; ++it) {
            const unsigned n = n0 + it;  // the CTA's block: ring slot and phase, dS^T (P^T) buffer
            const int slot = n % STAGES;
            const int row0 = (m_first + it % per_head) * BR;
            const uint32_t q_s = sQ + slot * Tile::SLOT_STEP, do_s = sdO + slot * Tile::SLOT_STEP;
            mbar_wait(full_bar(slot), (n / STAGES) & 1);  // block it's Q, dO, LSE and Delta (block 0: V) have landed
            // DP = 128 (EARLY): this thread's columns' LSE is read before the wgmmas below queue their shared-
            // memory reads (behind them, after S^T's wait, its latency was the softmax's largest stall: perf
            // notes, session 65), Delta under the exponentials; DP = 64 lacks the registers, DP = 256 gained nothing.
            constexpr bool EARLY = DP == 128;
            constexpr int NV = EARLY ? QW / 8 : 1;
            const float* lse_r = lse_s + slot * BR + q_off + (lane % 4) * 2;
            const float* delta_r = delta_s + slot * BR + q_off + (lane % 4) * 2;
            auto ld2 = [](const float* r, int nt) { return *reinterpret_cast<const float2*>(r + nt * 8); };
            float2 lse_v[NV], delta_v[NV];
#pragma unroll
            for (int nt = 0; nt < (EARLY ? NV : 0); ++nt) lse_v[nt] = ld2(lse_r, nt);
            float s[QW / 2], dp[QW / 2];  // this warpgroup's 64 keys x QW query rows from q_off
            if constexpr (SPLIT_D) {
                // Warpgroup 0 computes S^T = K Q^T and warpgroup 1 dP^T = V dO^T, each over all BR rows (wgmma
                // N = 64 at the full rate: N = 32, the QW rows of both, is bound by shared-memory reads to 2/3 of
                // it; perf notes, session 67), then each passes the other its columns of the other's rows
                // (warpgroup 0 S^T's from QW, warpgroup 1 dP^T's below QW), so each holds both at its QW rows.
                float x[BR / 2];
                bwd_issue_kmajor_slabs<DP, BC, BR, QDO_SLAB_STEP, T>(x, wg ? v_rows : k_rows, wg ? do_s : q_s, k_slabs);
                wgmma_wait<0>();
                fence_regs(x);
                bwd_exchange_cols<BR>(x, s, dp, sX, wg, t);  // (its barrier: BWD_BAR_XCHG, see the helper)
            } else {
                bwd_issue_kmajor<DP, BC, QW, QDO_SLAB_STEP, T>(s, k_rows, q_s);    // S^T = K Q^T
                bwd_issue_kmajor<DP, BC, QW, QDO_SLAB_STEP, T>(dp, v_rows, do_s);  // dP^T = V dO^T
                wgmma_wait<1>();  // S^T has landed (dP^T may still run)
                fence_regs(s);
            }
#pragma unroll
            for (int nt = 0; nt < (EARLY ? NV : 0); ++nt) delta_v[nt] = ld2(delta_r, nt);

            // P^T in place; columns are query rows (padding rows have LSE +inf: P = 0).
#pragma unroll
            for (int nt = 0; nt < QW / 8; ++nt) {
                const float2 l = EARLY ? lse_v[EARLY ? nt : 0] : ld2(lse_r, nt);
#pragma unroll
                for (int hr = 0; hr < 2; ++hr) {
                    s[4 * nt + 2 * hr] = fast_exp2(fmaf(s[4 * nt + 2 * hr], scale_log2, -l.x));
                    s[4 * nt + 2 * hr + 1] = fast_exp2(fmaf(s[4 * nt + 2 * hr + 1], scale_log2, -l.y));
                }
            }
            if (key_w0 + Tile::WG_KEYS > p.Sk || (causal && key_w0 + Tile::WG_KEYS - 1 > row0 + q_off + diag) ||
                (windowed && key_w0 < row0 + q_off + QW - 1 + lo)) {
                const int q_first = row0 + q_off + (lane % 4) * 2;
#pragma unroll
                for (int hr = 0; hr < 2; ++hr) {
                    const int key = key_w0 + warp * 16 + lane / 4 + 8 * hr;
                    const int c_lim = causal ? key - diag - q_first : INT_MIN;  // masked iff column c < c_lim
                    // (WIN: a window's left edge, masked iff column c > c_top; the other instantiation
                    // keeps the compares it always had)
                    const int c_top = windowed ? key - lo - q_first : INT_MAX;
                    const bool key_bad = key >= p.Sk;
#pragma unroll
                    for (int nt = 0; nt < QW / 8; ++nt)
#pragma unroll
                        for (int e = 0; e < 2; ++e)
                            if (key_bad || nt * 8 + e < c_lim || (WIN && nt * 8 + e > c_top))
                                s[4 * nt + 2 * hr + e] = 0.f;
                }
            }

            uint32_t pa[QW / 16][4];
#pragma unroll
            for (int kk = 0; kk < QW / 16; ++kk)
                pack_a_from_c<T>(pa[kk], *reinterpret_cast<const float(*)[4]>(&s[8 * kk]),
                                 *reinterpret_cast<const float(*)[4]>(&s[8 * kk + 4]));
            const uint32_t ds_buf = sdS + (n % Tile::DS_BUFS) * Tile::DS_TILE;
            const uint32_t pt_buf = sPT + (n % Tile::DS_BUFS) * Tile::DS_TILE;
            if constexpr (SPLIT_D) {
                store_t(pt_buf, pa);  // (dV after the CTA barrier, from shared memory)
            } else {
                bwd_issue_acc<DH, BR, QDO_SLAB_STEP, T>(dv, pa, do_s);  // dV += P^T dO
                wgmma_wait<1>();                                          // dP^T has landed (dV may still run)
            }
            fence_regs(dp);

#pragma unroll
            for (int nt = 0; nt < QW / 8; ++nt) {
                const float2 d = EARLY ? delta_v[EARLY ? nt : 0] : ld2(delta_r, nt);
#pragma unroll
                for (int hr = 0; hr < 2; ++hr) {
                    dp[4 * nt + 2 * hr] = s[4 * nt + 2 * hr] * (dp[4 * nt + 2 * hr] - d.x);
                    dp[4 * nt + 2 * hr + 1] = s[4 * nt + 2 * hr + 1] * (dp[4 * nt + 2 * hr + 1] - d.y);
                }
            }
            uint32_t dsa[QW / 16][4];
#pragma unroll
            for (int kk = 0; kk < QW / 16; ++kk)
                pack_a_from_c<T>(dsa[kk], *reinterpret_cast<const float(*)[4]>(&dp[8 * kk]),
                                 *reinterpret_cast<const float(*)[4]>(&dp[8 * kk + 4]));
            if constexpr (!SPLIT_D) bwd_issue_acc<DH, BR, QDO_SLAB_STEP, T>(dk, dsa, q_s);  // dK += dS^T Q

            store_t(ds_buf, dsa);  // dS^T into buffer n % 2 (for dQ; SPLIT_D: for dK too)
            fence_proxy_async();  // this thread's dS^T (and P^T) stores before the wgmma (async proxy) reads below
            if constexpr (!DET) {
                if (t == 0) bulk_wait_read<0>();  // this warpgroup's last dQ reductions have read their staging
                                                  // (at an item's first block also the item before's epilogue
                                                  // TMA stores, from the slot the refill below may load)
            } else if (t == 0 && it > 0) {
                count_turns(it - 1);  // the last block's (before the barrier below)
            }
            named_barrier_sync(BWD_BAR_CTA, Tile::THREADS);  // orders both warpgroups' dS^T (and P^T) stores before
                                                   // either's dQ (dV, dK) wgmmas, both warpgroups' block it-1
                                                   // reads (all retired; it = 0: the item before's, and its
                                                   // epilogue's, waited above) before the refill of its slot below,
                                                   // their dP^T reads of V (retired) before the next item's V
                                                   // there, and the staging reads (SPLIT_D: from that slot)
                                                   // before the stores to it
            if (tid == 0) {
                if (it + 1 < n_iter) {
                    if (!ahead) load_block(w, it + 1, n + 1);
                    if (!DET && it + 2 == n_iter) ticket = atomicAdd(item_counter, 1);
                } else if (!DET && gridDim.x + ticket < n_items) {  // the next item's first block (and K)
                    const BwdWalk v = bwd_walk<WIN>(p, BC, BR, gridDim.x + ticket);
                    if (v.n_iter > 0) {
                        if (Tile::KBUF > 1) load_k(v, kb ^ 1);
                        load_block(v, 0, n + 1);
                    }
                }
            }
            __syncwarp();  // warp 0 reconverged before the warpgroup-wide wgmma instructions below
            ahead = false;
            if constexpr (SPLIT_D) {
                if (dv_live)  // dV += P^T dO
                    bwd_issue_acc_ss<BR, BC, QDO_SLAB_STEP, T>(dv, pt_buf, do_s + dh_slab * QDO_SLAB_STEP);
                bwd_issue_acc_ss<BR, BC, QDO_SLAB_STEP, T>(dk, ds_buf, q_s + dh_slab * QDO_SLAB_STEP);   // dK += dS^T Q
            }

            // dQ pieces (64 x 64) = dS[rows of the slab, all BC keys] K[all keys, columns of the slab].
#pragma unroll
            for (int c = 0; c < Tile::DQ_PIECES; ++c) {
                if (!dq_live(c)) {  // (its columns are past D, or warpgroup 1 took it: dq_moved)
                    // No work; the barrier keeps the two warpgroups' counts of their own barriers per block equal:
                    // with them unequal compute-sanitizer's racecheck reported hazards across the exchange's and
                    // the CTA's barriers (perf notes, session 79). It orders nothing.
                    named_barrier_sync(BWD_BAR_WG0 + wg, FC_WG_THREADS);
                    continue;
                }
                if (SPLIT_D && c > 0) __syncwarp();  // thread 0's reduction below reconverged before the next wgmma
                float dq[Tile::DQ_COLS / 2];
                {
                    wgmma_fence();  // orders earlier register use of dq before the async writes
                    const uint64_t ad = wgmma_desc(ds_buf + dq_row_slab * BC * ROWB, BC * ROWB, FC_SWZ_GROUP_BYTES);
                    const uint64_t bd = wgmma_desc(sKi + dq_col_slab(c) * BC * ROWB, BC * ROWB, FC_SWZ_GROUP_BYTES);
#pragma unroll
                    for (int kk = 0; kk < BC / 16; ++kk)
                        wgmma_ss_tt_n64<T>(dq, wgmma_desc_add(ad, kk * 16 * ROWB), wgmma_desc_add(bd, kk * 16 * ROWB),
                                           kk > 0);
                    wgmma_commit();
                }
                wgmma_wait<0>();  // dQ, and this block's dV and dK (their operands' registers or shared memory
                                  // and the slot are free)
                fence_regs(dq);
                fence_regs(dk);
                fence_regs(dv);
                // dq[2 j + e] (j = 2 nt + hr) at float 2 (128 j + t) + e of the piece (bwd_piece_offset).
                // SPLIT_D: in the slot, over Q's slab dq_stage_slab (the piece's columns' own, but slab 3 for
                // warpgroup 1's moved piece) and the dO slab after it.
                const uint32_t stage = SPLIT_D ? q_s + dq_stage_slab(c) * QDO_SLAB_STEP : sDQ + wg * Tile::DQ_STAGE;
#pragma unroll
                for (int j = 0; j < Tile::DQ_COLS / 4; ++j)
                    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(stage + (j * FC_WG_THREADS + t) * 8),
                                 "f"(dq[2 * j]), "f"(dq[2 * j + 1])
                                 : "memory");
                fence_proxy_async();  // this thread's staging stores before the bulk reduction (async proxy) reads them
                named_barrier_sync(BWD_BAR_WG0 + wg, FC_WG_THREADS);  // orders the warpgroup's staging stores before
                                                                       // the reduction below, and every warp's
                                                                       // wgmma wait above and LSE / Delta reads
                                                                       // of the slot before the arrival
                if (t == 0) {
                    if constexpr (EARLY_REFILL) mbar_arrive(empty_bar(slot));  // this warpgroup is done with the slot
                    const int64_t piece = piece_index(it, c);
                    if constexpr (DET) {
                        // Wait until the key blocks after this one have added into the piece. (No __syncwarp
                        // after it at the block's end: the next wgmma.fence's .sync waits for the warp's
                        // threads, and one cost 5-10 %, perf notes session 60; SPLIT_D's between its pieces
                        // makes warp 0 wait for this poll before the second piece's wgmma.)
                        bwd_poll_turn(piece_turn(it, c), bwd_turn_rank<WIN>(p, w, it, BC, BR));
                        fence_proxy_async_global();  // the acquire above before the reduction (async proxy) below
                    }
                    bulk_reduce_add_f32(dq_acc + piece * BWD_PIECE, stage, Tile::DQ_STAGE);
                    bulk_commit();
                }
            }
            if constexpr (EARLY_REFILL) {
                // Block it + 2 into this block's slot if the other warpgroup is done with it too (else at block
                // it + 1's CTA barrier). The phase cannot be two ahead (the next arrivals need that load) nor
                // one behind (the other warpgroup arrived for block it - 2 before block it - 1's CTA barrier).
                if (tid == 0 && it + 2 < n_iter && mbar_test(empty_bar(slot), (n / STAGES) & 1)) {
                    load_block(w, it + 2, n + 2);
                    ahead = true;
                }
                __syncwarp();  // warp 0 reconverged before the next block's wgmma instructions
            }
        }
        if (!DET && tid == 0) next_s[k % Tile::NEXT_SLOTS] = gridDim.x + ticket;
        named_barrier_sync(BWD_BAR_CTA, Tile::THREADS);  // orders thread 0's store of the next item before the
                                                   // reads below, and both warpgroups' last wgmmas of this item
                                                   // (each waited for its last dQ: the last reads of K and of
                                                   // the last block's slot) before the next item's K load over
                                                   // it (KBUF = 1) and the epilogue's stores over the slot
        if constexpr (DET) {
            item = n_items;  // one item per CTA (see the launcher)
        } else {
            item = next_s[k % Tile::NEXT_SLOTS];
            if (tid == 0 && item < n_items && (n_iter == 0 || Tile::KBUF == 1)) {  // what the last block did not load
                const BwdWalk v = bwd_walk<WIN>(p, BC, BR, item);
                if (v.n_iter > 0) {
                    load_k(v, (busy + (n_iter > 0)) % Tile::KBUF);
                    if (n_iter == 0) load_block(v, 0, n0);
                }
            }
            __syncwarp();  // warp 0 reconverged before the next item's wgmma instructions
        }
        if (n_iter > 0) {
            ++busy;
            if (DET && t == 0) count_turns(n_iter - 1);  // this item's last block's
        }
        n0 += n_iter;

        // Epilogue: dK * scale and dV (16-bit) into shared memory, then TMA stores, which write keys < Sk
        // and columns < D (dV: < Dv) only. A warpgroup's areas (slabs of its 64 keys x 64 columns, swizzled as TMA
        // loads them): in the last block's slot (the next item's first block loads into the other), its
        // Q (warpgroup 0) or dO tile, or (SPLIT_D) its half, where its dQ was staged; at DP = 128 dK in
        // its dQ staging. Its next stores to either follow a bulk_wait_read (the next block's, or here).
        if (t == 0) bulk_wait_read<0>();  // this warpgroup's dQ reductions and last TMA stores have read their areas
        named_barrier_sync(BWD_BAR_WG0 + wg, FC_WG_THREADS);  // orders that wait before the warpgroup's stores below
        const uint32_t own = sQ + ((n0 + STAGES - 1) % STAGES) * Tile::SLOT_STEP +
                             (SPLIT_D ? wg * (Tile::SLOT_STEP / Tile::WGS) : wg * Tile::DO_FROM_Q);
        const uint32_t ek = DP == 128 ? sDQ + wg * Tile::DQ_STAGE : own;
        const uint32_t ev = DP == 128 ? own : own + Tile::EPI_TILE;
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const int r = warp * 16 + lane / 4 + 8 * hr;  // key row in the warpgroup's 64
#pragma unroll
            for (int nt = 0; nt < DH / 8; ++nt) {
                const uint32_t at = (nt / 8) * Tile::EPI_SLAB + r * ROWB + (((nt % 8) ^ (r & 7)) << 4) + (lane % 4) * 4;
                asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(ek + at),
                             "r"(pack2<T>(dk[4 * nt + 2 * hr] * p.scale, dk[4 * nt + 2 * hr + 1] * p.scale))
                             : "memory");
                asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(ev + at),
                             "r"(pack2<T>(dv[4 * nt + 2 * hr], dv[4 * nt + 2 * hr + 1]))
                             : "memory");
            }
        }
        fence_proxy_async();  // this thread's stores before the TMA stores (async proxy) read them
        named_barrier_sync(BWD_BAR_WG0 + wg, FC_WG_THREADS);  // orders the warpgroup's stores before its TMA stores
        if (t == 0 && key_w0 < p.Sk) {
#pragma unroll
            for (int sl = 0; sl < DH / FC_SLAB_COLS; ++sl) {
                const int col = (dh_slab + sl) * FC_SLAB_COLS;  // (SPLIT_D: slabs past D or Dv are left out)
                if (!SPLIT_D || col < p.D) tma_store_4d(&args.dk_map, ek + sl * Tile::EPI_SLAB, col, key_w0, hk, b);
                if (!SPLIT_D || col < dv_cols) tma_store_4d(&args.dv_map, ev + sl * Tile::EPI_SLAB, col, key_w0, hk, b);
            }
            bulk_commit();
        }
        __syncwarp();  // the warp reconverged before the next item's wgmma instructions
    }
    if (t == 0) bulk_wait<0>();  // the dQ reductions and the TMA stores are done (their areas read) before the CTA exits
#else
    __trap();  // built without sm_90a; dispatch never launches this
#endif
}
