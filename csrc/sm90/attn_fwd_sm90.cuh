// attn_fwd_sm90.cuh -- Hopper attention forward (sm90a): TMA loads, wgmma,
// warp specialization, persistent grid.
//
// Algorithm. A tile is BR = 128 query rows of one (batch, head). A CTA has three warpgroups
// (four with a third consumer, below): warpgroup 0 is the producer (one thread issues every TMA
// load; setmaxnreg gives its registers away), consumers 1 and 2 own rows 0-63 and 64-127. At
// D = 64, and at D = 128 for causal long rows, a third consumer makes the tile 192 rows
// (Sm90Tile<DP, 3>; the tile table and the per-tile steps are in attn_sm90_parts.cuh); D = 64
// calls with long rows (non-causal, or causal in the dynamic order) take 192-key K/V tiles
// (Sm90Tile::WIDE_KV, sm90_wide_kv; non-causal ones with the partial K/V tile first,
// LEAD_TILE). The producer loads Q into one of Q_BUFS buffers (the next tile's Q arrives during
// this one; at D = 128 issued after the tile's second K/V tile, Q_AHEAD; at D = 256 one buffer,
// each consumer's rows on barriers of their own, Q_HALVES) and streams K and V tiles of BC keys
// through a STAGES-deep ring. Each load completes on an mbarrier (q_full, k_full, v_full);
// consumers release a buffer on q_empty, k_empty (as soon as S = Q K^T is done, so the slot's
// next K loads during this P V) or v_empty.
// Per K/V tile j a consumer computes S = Q K^T with wgmma (both operands in shared memory,
// 128-byte swizzle) and P_j V with P from registers (the S accumulator layout is the A-operand
// layout) and V (N-major) from shared memory. At D = 128 and 256 the two are
// software-pipelined: S_{j+1} and P_j V_j are issued back to back, and tile j+1's masking and
// online softmax (exp2, log2(e) folded into the scale) run while P_j V_j is on the tensor cores
// (with PIN_SOFTMAX: D = 256 and D = 128's LONG; elsewhere ptxas puts the P V wait first); the
// O rescale waits for it. At D = 64 and with three consumers they run in order, and the
// consumers overlap each other instead. In causal tiles at D = 256 and with three consumers, a
// consumer runs only the K/V tiles its rows see and releases the rest unread (WG_SKIP); at
// D = 64 one whose rows are all past Sq runs none (PAD_SKIP). The epilogue divides by the row
// sum, stages O in the warpgroup's own Q rows (at D = 256, whose one Q buffer is released after
// the tile's last S, in an O buffer), writes it with coalesced 16-byte stores, and LSE.
//
// Tile order. CTAs are persistent (grid = SM count, tile t to CTA t % grid); causal tiles are
// numbered longest first inside windows of a few heads, so a head's query blocks run close in
// time and share its K/V in L2 (odd stripes in reverse, see sm90_tile). The dynamic order (DYN,
// fc_sm90_dynamic_order in kernels.h; causal D > 64 short rows, causal D = 128 on three
// consumers, causal D = 64 whose windows would not fit the L2): a CTA takes its next tile from
// a counter. Host plans: causal D = 256 CTA pairs (Sm90Plan, sm90_plan: each tile to the
// cluster with the least work) and non-causal 192-key D = 64 calls whose last query block is
// short (Sm90RowPlan). Non-causal D = 128 pairs split their last, partial stripe by key ranges
// across all clusters (attn_sm90_tail.cuh). The host side is in attn_fwd_sm90_launch.cuh, the
// producer's loop in attn_sm90_producer.cuh; -DFC_SM90_TRACE records where a tile's cycles go
// (trace.cuh).
//
// CTA pairs (CL = 2; long rows at D = 128 and 256, sm90_cluster_min_sk). Two CTAs on
// neighbouring SMs take a tile of 2 x BR rows, one half each, and share its K/V stream: each
// producer loads half of every K/V tile's 64-column slabs by multicast TMA into both CTAs' ring
// slot, completing on both CTAs' barrier, so every K/V byte leaves L2 once per pair. A slot
// refills when both CTAs' consumers have released it; causal pairs run the lower half's K/V
// tile count, and the upper half's consumers release the tiles past their rows unread.
//
// Key-split mode (small grids: 64-row tiles no more than the SMs, e.g. B=2, H=8, S=512, and
// DP <= 128). A tile is 64 query rows; the two consumers share its Q and take alternate K/V
// tiles (c, c+2, ...), so twice as many SMs work. Consumer 2 leaves its (m, l, O) partials in
// the unused upper halves of the Q buffers and consumer 1 merges them by their maxima and
// writes the tile.
//
// Limits. D is any multiple of 8 up to DP (64, 128, 192 or 256): TMA zero-fills the columns past D
// and the rows past Sq or Sk (and, with LEAD_TILE, the K/V rows before key 0), and those
// rows/keys are masked or never stored. v's head dim Dv (fc_attn_params) is D's, or below D
// at D > 128: DP = 192 (MLA's q and k of 129..192 columns in three slabs, v and O of Dv <= 128
// in two, Sm90Tile::DV) or DP = 256 (the extra columns of v zero, of O not stored). Any Sq,
// Sk >= 1; both causal alignments; sliding windows (WIN, below); strided inputs whose strides
// are multiples of 8 elements (a TMA rule, checked by dispatch); GQA reads KV head
// h / (Hq / Hkv) in place. Rows that see no key give
// O = 0 and LSE = -inf. Needs sm_90a (H100, H200); the body is empty in other passes.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>

#include "../common/launch.cuh"
#include "../flashcore.h"
#include "../kernels.h"
#include "attn_sm90_parts.cuh"
#include "attn_sm90_producer.cuh"
#include "hopper.cuh"
#include "tensor_map.h"
#include "trace.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FC_SM90_BODY 1
#endif

// ---------------------------------------------------------------------------
// Kernel

// KV_SPLIT: key-split mode, at compile time (as a runtime flag its paths cost the ordinary
// mode 13 % at D = 64; perf notes, sm90 v4). LONG: the long-row instantiation (D = 128:
// Sm90Tile::PIN_SOFTMAX; D = 64, three consumers: WIDE_KV). DYN: the dynamic order; after
// tile blockIdx.x the producer takes gridDim.x + atomicAdd(args.tile_counter, 1), hands the
// consumers a sentinel (K/V tile count -1) through TILE_INFO when none is left, and the one
// that draws the last ticket zeroes the counter (next_tile); its own instantiation, as the
// sentinel loop measured 1-5 % slower (session 22). CL: CTAs per cluster, 1 or 2; a pair's
// empty barriers take one arrival per consumer warp of either CTA. WIN: a sliding window
// (kernels.h's fc_band): a tile's K/V tiles start at its first row's first key
// (sm90_win_range; with WG_SKIP each consumer at its own rows'), the masks take the left
// edge; two consumers (three at D = 64 where the grid favours them, as without a window),
// the static order; its own
// instantiation, so the others' code stays as measured.
template <int DP, int CONS, typename T, bool KV_SPLIT, bool LONG = false, bool DYN = false, int CL = 1,
          bool WIN = false>
__global__ void __launch_bounds__(Sm90Tile<DP, CONS>::THREADS, 1)
attn_fwd_sm90_kernel(const __grid_constant__ Sm90Args args,
                     const __grid_constant__ Sm90PlanOf<DP, CONS, LONG, CL, DYN, KV_SPLIT> plan) {
#ifdef FC_SM90_BODY
    using Tile = Sm90Tile<DP, CONS, LONG>;
    static_assert(CL == 1 || (CL == 2 && !KV_SPLIT && !DYN && Tile::SLABS % CL == 0),
                  "clusters: the static order, ordinary mode, K/V slabs split evenly");
    constexpr int BR = Tile::BR, BC = Tile::BC, STAGES = Tile::stages(KV_SPLIT);
    constexpr int Q_BUFS = Tile::Q_BUFS;
    constexpr int PV_N = Tile::PV_N, PV_PARTS = Tile::PV_PARTS;
    constexpr uint32_t ROWB = FC_SWZ_ROW_BYTES;
    const fc_attn_params& p = args.p;

    extern __shared__ unsigned char smem_raw[];
    const uint32_t raw = smem_u32(smem_raw);
    const uint32_t sQ = (raw + FC_SWZ_GROUP_BYTES - 1) & ~(FC_SWZ_GROUP_BYTES - 1);  // 128B-swizzle atoms need 1 KB alignment
    const uint32_t sK = sQ + Q_BUFS * Tile::Q_BYTES;   // STAGES K tiles
    const uint32_t sV = sK + STAGES * Tile::K_BYTES;   // STAGES V tiles
    const uint32_t sO = sV + STAGES * Tile::V_BYTES;   // EARLY_Q: one O buffer per consumer
    const uint32_t bar0 = sO + Tile::CONSUMERS * Tile::O_STAGE_BYTES;
    constexpr int Q_BARS = Tile::Q_BARS;
    const uint32_t q_full = bar0, q_empty = q_full + 8 * Q_BARS;  // one per Q buffer (Q_HALVES: per consumer's rows)
    const uint32_t k_full = q_empty + 8 * Q_BARS, v_full = k_full + 8 * STAGES;
    const uint32_t k_empty = v_full + 8 * STAGES, v_empty = k_empty + 8 * STAGES;
    const uint32_t ml = v_empty + 8 * STAGES;  // key-split: consumer 2's m and l (ML_BYTES past the ordinary smem)
    const uint32_t sink = ml + (KV_SPLIT ? Tile::ML_BYTES : 0);  // PIN_SOFTMAX: SINK_BYTES
    const uint32_t info = sink + Tile::SINK_BYTES;  // tile coordinates, 16 bytes per Q barrier pair (16-byte aligned)
    static_assert(!KV_SPLIT || Tile::KV_SPLIT_OK, "key-split mode needs DP <= 128");
    constexpr bool split = KV_SPLIT;
    // WARP_REL: a K/V slot is released once per consumer warp (after its wgmma wait), not per
    // thread: with clusters (on each CTA's barrier) and in the single-CTA two-consumer D = 128
    // kernels (H100, sessions 44-45: LONG +0.4-0.5 %, causal 1k +1.3 %, 512 and non-causal 1k
    // flat); D = 64 lost 0.5-1 %, D = 256 was flat, three D = 128 consumers spilled.
    constexpr bool WARP_REL = CL > 1 || (DP == 128 && CONS == 2 && !KV_SPLIT);
    constexpr int br = split ? Tile::WG_ROWS : BR;  // query rows per tile

    const int tid = threadIdx.x;
    if (tid == 0) {
        for (int i = 0; i < Q_BARS; ++i) {
            mbar_init(q_full + 8 * i, 1);
            mbar_init(q_empty + 8 * i, (Tile::Q_HALVES ? 1 : Tile::CONSUMERS) * 128);
        }
        for (int i = 0; i < STAGES; ++i) {
            mbar_init(k_full + 8 * i, 1);
            mbar_init(v_full + 8 * i, 1);
            // WARP_REL: every consumer warp of every CTA of the cluster; otherwise
            // every consumer thread (key-split: of the one consumer per K/V tile)
            const int releases = WARP_REL ? CL * Tile::CONSUMERS * 4 : (split ? 1 : Tile::CONSUMERS) * 128;
            mbar_init(k_empty + 8 * i, releases);
            mbar_init(v_empty + 8 * i, releases);
        }
        mbar_init_fence();
    }
    // The barriers are initialized before any thread waits on or arrives at them
    // (with clusters: the other CTA's threads and loads too).
    if constexpr (CL > 1) cluster_sync();
    else __syncthreads();
    const int crank = CL > 1 ? (int)cluster_ctarank() : 0;  // which half of the cluster's tile is ours

    constexpr bool MAGIC_DIV = Tile::MAGIC_DIV;  // see the tile table
    // Tiles (with clusters: of CL x br rows; cluster c takes tiles c, c + gridDim.x / CL, ...).
    const int n_mblocks = (p.Sq + CL * br - 1) / (CL * br);
    const int n_tiles = n_mblocks * p.B * p.Hq;
    // The causal tile order's windows (sm90_tile): with three consumers in the dynamic order as
    // the host found them (capped to the L2, sm90_causal_window; sm90_window_cap), else here.
    const int window = MAGIC_DIV                    ? 0
                       : sm90_window_cap(DYN, CONS) ? args.sched.window
                                                    : sm90_causal_window(gridDim.x / CL, n_mblocks, p.B * p.Hq,
                                                                         (long long)p.Sk * DP * 4, false);
    // Causal windows: the static order and the three-consumer dynamic one may merge the last two
    // (sm90_last_window; the host decides, in args.sched.last_window), except in the D = 128 LONG
    // kernel, whose consumers find their tiles themselves (no TILE_INFO; its code as measured).
    constexpr bool MERGE = sm90_merge_windows(DYN, CONS) && Tile::TILE_INFO;
    static_assert(!DYN || (Tile::TILE_INFO && !KV_SPLIT), "the dynamic order hands out tiles through TILE_INFO");
    // (With clusters: our half of the cluster's tile, and the K/V tile count of the whole.)
    auto tile_at = [&](int tile) {
        Sm90TileCoord t;
        if constexpr (MAGIC_DIV) t = sm90_tile_magic<BC, !DYN, CL>(p, args.sched, tile);
        else
            t = sm90_tile<BC, Tile::PAD_FIRST, !DYN, CL, MERGE, Tile::PAD_SKIP>(p, tile, n_tiles, n_mblocks, CL * br,
                                                                                 window, args.sched.last_window);
        if constexpr (CL > 1) t.row0 += crank * br;
        return t;
    };
    // The split tail (attn_sm90_tail.cuh), in non-causal calls (the launcher decides, in args.tail).
    constexpr bool TAIL = sm90_tail_kernel(DP, CONS, CL, KV_SPLIT, DYN, LONG);
    static_assert(!TAIL || !Tile::TILE_INFO, "tail pieces: the consumers find their K/V range themselves");
    // This CTA's (cluster's) positions in the tile order (Sm90Pos).
    const Sm90Pos<CL, Sm90PlanOf<DP, CONS, LONG, CL, DYN, KV_SPLIT>, TAIL> pos{plan, n_tiles, args.tail};
    // The tile at position x with its K/V tiles kv0 .. n_blocks - 1: all of them,
    // or a tail piece's.
    auto coord_at = [&](int x) {
        if constexpr (TAIL) {
            if (args.tail.main > 0 && x >= args.tail.main) {
                const Sm90Piece pc = sm90_piece(args.tail, x, gridDim.x / CL);
                Sm90TileCoord t = tile_at(pc.tile);
                t.kv0 = pc.kv0;
                t.n_blocks = pc.kv_end;
                return t;
            }
        }
        Sm90TileCoord t = tile_at(pos.at(x));
        t.kv0 = 0;
        if constexpr (WIN) {
            const Sm90WinRange w = sm90_win_range(p, t.row0, br, BC);
            t.kv0 = w.kv0;
            t.n_blocks = w.n;
        }
        return t;
    };
    // The producer's next position after `tile`. The dynamic order's producers
    // draw n_tiles tickets in all (one per tile past the first grid, then one
    // past the end each), so the one that draws the last knows every other
    // draw is done and puts the counter back to zero for the next launch.
    auto next_tile = [&](int tile) {
        if constexpr (DYN) {
            const unsigned ticket = atomicAdd(args.tile_counter, 1u);
            if (ticket == (unsigned)n_tiles - 1u) atomicExch(args.tile_counter, 0u);
            return (int)gridDim.x + (int)ticket;
        } else {
            return pos.next(tile);
        }
    };
    const int wg = tid / 128;

    if (wg == 0) {
        // ---------------- producer warpgroup ----------------
        setmaxnreg_dec<Tile::PRODUCER_REGS>();
        if (tid != 0) return;
        const Sm90Smem sm{sQ, sK, sV, q_full, q_empty, k_full, v_full, k_empty, v_empty, info};
        sm90_producer<DP, CONS, KV_SPLIT, LONG, DYN, CL, TAIL, WIN>(args, sm, pos, crank, coord_at, next_tile);
        return;
    }

    // ---------------- consumer warpgroups ----------------
    setmaxnreg_inc<Tile::CONSUMER_REGS>();
    // rows cw*64 .. cw*64+63 of the tile (key-split: all 64 rows, K/V tiles cw, cw+2, ...)
    // UNIFORM_CW, and in the dynamic order's 192-key kernel: there the vector
    // registers the consumer index's arithmetic took made ptxas spill 52 bytes.
    constexpr bool uniform_cw = Tile::UNIFORM_CW || (DYN && Tile::WIDE_KV);
    const int cw = (uniform_cw ? __shfl_sync(0xffffffffu, wg, 0) : wg) - 1;
    const int t128 = tid % 128, warp = t128 / 32, lane = tid % 32;
    const float scale_log2 = p.scale * FC_LOG2E;
    // Key j visible to query i iff j < Sk, j <= i + diag (causal) and, WIN, j >= i + lo (fc_band).
    const fc_band band = WIN ? FC_BAND(p) : FC_CAUSAL_BAND(p);
    const bool causal = band.has_hi;
    const int diag = band.hi, lo = band.lo;  // (lo: WIN only)
    static_assert(!WIN || ((CONS == 2 || DP == 64) && !KV_SPLIT && !LONG && !DYN && CL == 1),
                  "WIN: two consumers (three at D = 64), the static order, ordinary mode, no clusters");
    // LEAD_TILE: K/V tile j starts at key j BC - lead (sm90_kv_lead). The static-order
    // 192-key kernel runs non-causal calls only (the launcher sends causal ones to the
    // dynamic order's): its first tile's softmax has no causal mask.
    constexpr bool lead_tile = Tile::LEAD_TILE && !DYN;
    static_assert(!lead_tile || (BC == 3 * Tile::LEAD_GROUP && !KV_SPLIT && !TAIL && CL == 1),
                  "LEAD_TILE: at most two skipped groups, tile 0 first for every consumer, no multicast");
    const int lead = sm90_kv_lead<Tile, DYN>(p);
    const int step = split ? 2 : 1;      // K/V tiles from one of this warpgroup's to the next
    const int row_off = split ? 0 : cw * Tile::WG_ROWS;
    // Key-split mode runs in order: the pipelined order deadlocked there while K and V shared
    // one release barrier (perf notes, sm90 v4); with separate releases, not measured yet.
    constexpr bool overlap = Tile::OVERLAP && !split;
    constexpr bool wg_skip = Tile::WG_SKIP || CL > 1;

    int it = 0;    // ordinary mode: ring position of the current K/V tile
    int base = 0;  // key-split mode: ring position of the current tile's K/V tile 0
    int local = 0;
    // A consumer's release of a K or V slot: its thread's arrival, or with WARP_REL one per warp
    // (clusters: on each CTA's barrier, lane r: CTA r), after the wgmma wait that retires its reads.
    auto release = [&](uint32_t bar) {
        if constexpr (CL > 1) {
            if (lane < CL) mbar_arrive_cluster(cluster_map(bar, lane));
        } else if constexpr (WARP_REL) {
            if (lane == 0) mbar_arrive(bar);
        } else {
            mbar_arrive(bar);
        }
    };
    for (int tile = pos.first(); DYN || tile < pos.end(); tile = pos.next(tile), ++local) {  // DYN: to the sentinel
        const int qb = local % Q_BUFS;
        const int qbar = Tile::Q_HALVES ? cw : qb;  // our Q barrier pair (and coordinate slot)
        Sm90TileCoord t;
        if constexpr (Tile::TILE_INFO) {
            // The tile's coordinates, as the producer found them, once they have landed
            // with Q. Broadcast from lane 0 so that ptxas knows them warp-uniform (see
            // nb below). (A trace counts this wait in the gap before the tile's start.)
            mbar_wait(q_full + 8 * qbar, (local / Q_BUFS) & 1);  // this tile's Q (TMA) and coordinates have landed
            const int4 ti = ld_shared_v4_s32(info + 16 * qbar);
            t.b = __shfl_sync(0xffffffffu, ti.x, 0);
            t.h = __shfl_sync(0xffffffffu, ti.y, 0);
            t.row0 = __shfl_sync(0xffffffffu, ti.z, 0);
            t.n_blocks = __shfl_sync(0xffffffffu, ti.w, 0);
            t.hk = 0;  // (the producer's)
            t.kv0 = 0;
            if constexpr (DYN) {
                if (t.n_blocks < 0) break;  // the producer's sentinel: no tile left
            }
        } else {
            t = coord_at(tile);
        }
        if constexpr (TAIL) {  // the K/V range, broadcast from lane 0 so that ptxas takes it for warp-uniform
            t.kv0 = __shfl_sync(0xffffffffu, t.kv0, 0);
            t.n_blocks = __shfl_sync(0xffffffffu, t.n_blocks, 0);
        }
        // this warpgroup's first K/V tile (WIN: the tile's, found again from its rows as the producer did)
        int first = split ? cw : TAIL ? t.kv0 : WIN ? sm90_win_range(p, t.row0, br, BC).kv0 : 0;
        const uint32_t q_rows = sQ + qb * Tile::Q_BYTES + row_off * ROWB;  // our rows of slab 0
        const int wrow0 = t.row0 + row_off;             // first query row of this warpgroup
        const int frow = wrow0 + warp * 16 + lane / 4;  // this thread's first fragment row
        // Masking is needed on the key tail, on tiles reaching past the diagonal and (WIN, band.has_lo)
        // on tiles that start before our last row's first key.
        auto needs_mask = [&](int k0) {
            return k0 + BC > p.Sk || (causal && k0 + BC - 1 > wrow0 + diag) ||
                   (WIN && band.has_lo && k0 < wrow0 + Tile::WG_ROWS - 1 + lo);
        };

        float o[PV_PARTS][PV_N / 2];
#pragma unroll
        for (int pp = 0; pp < PV_PARTS; ++pp)
#pragma unroll
            for (int i = 0; i < PV_N / 2; ++i) o[pp][i] = 0.f;
        float m_i[2] = {-INFINITY, -INFINITY};  // running max of scale_log2 * S, rows frow and frow + 8
        float l_i[2] = {0.f, 0.f};              // running row sum, this lane's columns only
        float s[BC / 2];                        // S, then P, of the next tile
        auto mask = [&](int k0) {  // the masks of needs_mask on s, K/V tile from key k0
            mask_tile<BC, WIN>(s, k0, frow, p, causal, diag, lane, band.has_lo ? lo : INT_MIN / 2);
        };
        uint32_t pa[BC / 16][4];                // P of the current tile, as A fragments

        TR_DECL(args, local, wg, t128 == 0)
        TR_SET(TR_START);
        TR_GTIME();
        if constexpr (!Tile::TILE_INFO) mbar_wait(q_full + 8 * qbar, (local / Q_BUFS) & 1);  // this tile's Q has landed (TMA)
        TR_SET(TR_Q);
        // Ring position g of K/V tile j: a running counter in ordinary mode (base + j there
        // ran 15 % slower at D = 64, perf notes "D = 64 regression"), base + j in key-split
        // mode. WG_SKIP (causal): our own K/V tile count, the tiles our rows see (clusters:
        // always, the cluster's count being the lower half's). PAD_SKIP (non-causal too): none
        // when all our rows are padding (computed and broadcast always: under a branch on our
        // rows ptxas took the count for non-uniform and moved the ring arithmetic, as below).
        int nb = t.n_blocks;
        if constexpr (wg_skip) {
            if (causal || Tile::PAD_SKIP) {
                const int last_row = min(wrow0 + Tile::WG_ROWS, p.Sq) - 1;
                int last_key = last_row + diag;  // the last key our rows see
                if constexpr (Tile::PAD_SKIP) last_key = last_row < wrow0 ? -1 : causal ? last_key : p.Sk - 1;
                nb = last_key < 0 ? 0 : min(nb, (last_key + lead) / BC + 1);
                // Without UNIFORM_CW ptxas cannot tell nb is warp-uniform, and such a loop bound moves
                // the ring arithmetic out of the uniform datapath (~40 vector instructions per step).
                if constexpr (!uniform_cw) nb = __shfl_sync(0xffffffffu, nb, 0);
            }
        }
        // WIN: rows that end before the tile's first K/V tile (the producer's first) run and release none.
        if constexpr (WIN) nb = max(nb, first);
        // WIN with WG_SKIP: a later consumer's rows start at a later K/V tile (the window's left
        // edge): it runs from there and releases the tile's earlier ones unread, as those past nb.
        if constexpr (WIN && wg_skip) {
            int own = band.has_lo ? min(max(sm90_win_range(p, wrow0, Tile::WG_ROWS, BC).kv0, first), nb) : first;
            if constexpr (!uniform_cw) own = __shfl_sync(0xffffffffu, own, 0);  // (warp-uniform, as nb)
#pragma unroll 1
            for (; first < own; ++first, ++it) {
                mbar_wait(k_full + 8 * (it % STAGES), (it / STAGES) & 1);  // K of tile `first` has landed
                release(k_empty + 8 * (it % STAGES));
                mbar_wait(v_full + 8 * (it % STAGES), (it / STAGES) & 1);  // V of tile `first` has landed
                release(v_empty + 8 * (it % STAGES));
            }
        }
        const bool any = first < nb;  // this warpgroup has a K/V tile
        // O += P V for the V tile at ring position g, waited for, then its slot released.
        auto pv_tile = [&](int g) {
            const int st = g % STAGES;
            TR_TIME(TR_W_V, mbar_wait(v_full + 8 * st, (g / STAGES) & 1));  // V of tile g has landed
            issue_pv<BC, PV_N, PV_PARTS, T, Tile::DESC_ADD>(o, pa, sV + st * Tile::V_BYTES);
            TR_TIME(TR_W_PV, wgmma_wait<0>());
#pragma unroll
            for (int pp = 0; pp < PV_PARTS; ++pp) fence_regs(o[pp]);
            release(v_empty + 8 * st);  // this thread is done with V slot st
        };
        if (any) {  // prologue: P of tile `first`
            const int g = split ? base + first : it;
            mbar_wait(k_full + 8 * (g % STAGES), (g / STAGES) & 1);  // K of tile `first` has landed
            if constexpr (lead_tile) {
                // S and the softmax without the lead's whole 64-key groups: S of the
                // tile's last BC - SKIP G keys, into registers of its own.
                constexpr int G = Tile::LEAD_GROUP;
                auto lead_prologue = [&](auto skip) {
                    constexpr int SKIP = decltype(skip)::value, N = BC - G * SKIP;
                    float sl[N / 2];
                    issue_qk<DP, BR, N, T, Tile::DESC_ADD, BC>(sl, q_rows,
                                                               sK + (g % STAGES) * Tile::K_BYTES + SKIP * G * ROWB);
                    wgmma_wait<0>();
                    fence_regs(sl);
                    release(k_empty + 8 * (g % STAGES));  // this thread is done with K slot g % STAGES
                    sm90_lead_softmax<BC, G, SKIP, T, Tile::HALF_VOTES>(sl, pa, m_i, l_i, lead - SKIP * G, scale_log2,
                                                                        lane);
                };
                if (lead >= 2 * G) lead_prologue(std::integral_constant<int, 2>{});
                else if (lead >= G) lead_prologue(std::integral_constant<int, 1>{});
                else lead_prologue(std::integral_constant<int, 0>{});
            } else {
                issue_qk<DP, BR, BC, T, Tile::DESC_ADD>(s, q_rows, sK + (g % STAGES) * Tile::K_BYTES);
                wgmma_wait<0>();
                fence_regs(s);
                release(k_empty + 8 * (g % STAGES));  // this thread is done with K slot g % STAGES
                if (needs_mask(first * BC)) mask(first * BC);
                float corr[2];
                softmax_tile<BC, Tile::HALF_VOTES>(s, m_i, l_i, corr, scale_log2);  // O is still 0: nothing to rescale
                pack_p<BC, T>(pa, s);
            }
        }
        TR_SET(TR_PRO);
        // Steady state (OVERLAP): S of tile j+step and P_j V_j run on the tensor cores during
        // the softmax of tile j+step. The last tile is peeled off so every wgmma group in the
        // loop is unconditional (ptxas must see that wait<1> retires the S group, or it serializes).
        int j = first;
        for (; j + step < nb; j += step, it += step) {
            const int g = split ? base + j : it, gn = g + step, st = g % STAGES, sn = gn % STAGES;
            // The O rescale (ordinary register writes) precedes both wgmma groups.
#pragma unroll
            for (int pp = 0; pp < PV_PARTS; ++pp) fence_regs(o[pp]);
            float corr[2];
            unsigned rescale;
            if constexpr (overlap) {
                TR_TIME(TR_W_K, mbar_wait(k_full + 8 * sn, (gn / STAGES) & 1));  // K of the next tile has landed
                TR_TIME(TR_ISSUE, issue_qk<DP, BR, BC, T, Tile::DESC_ADD>(s, q_rows, sK + sn * Tile::K_BYTES));
                TR_TIME(TR_W_V, mbar_wait(v_full + 8 * st, (g / STAGES) & 1));  // V of tile j has landed
                TR_TIME(TR_ISSUE, issue_pv<BC, PV_N, PV_PARTS, T, Tile::DESC_ADD>(o, pa, sV + st * Tile::V_BYTES));
                TR_TIME(TR_W_S, wgmma_wait<1>());  // S of the next tile is done; P_j V_j may still run
                fence_regs(s);
                release(k_empty + 8 * sn);  // this thread is done with K slot sn
                TR_MARK(tr_soft);
                if (needs_mask((j + step) * BC - lead)) mask((j + step) * BC - lead);
                rescale = softmax_tile<BC, Tile::HALF_VOTES>(s, m_i, l_i, corr, scale_log2);
                TR_SINCE(TR_SOFT, tr_soft);
                if constexpr (Tile::PIN_SOFTMAX) {  // keeps the softmax ahead of the P V wait
                    if (lane == 0) st_shared_f32(sink + 4 * (cw * 4 + warp), l_i[0] + l_i[1]);
                }
                TR_TIME(TR_W_PV, wgmma_wait<0>());
#pragma unroll
                for (int pp = 0; pp < PV_PARTS; ++pp) fence_regs(o[pp]);
                release(v_empty + 8 * st);  // this thread is done with V slot st
            } else {  // in order: P_j V_j, then S of the next tile and its softmax
                pv_tile(g);
                TR_TIME(TR_W_K, mbar_wait(k_full + 8 * sn, (gn / STAGES) & 1));  // K of the next tile has landed
                issue_qk<DP, BR, BC, T, Tile::DESC_ADD>(s, q_rows, sK + sn * Tile::K_BYTES);
                TR_TIME(TR_W_S, wgmma_wait<0>());
                fence_regs(s);
                release(k_empty + 8 * sn);  // this thread is done with K slot sn
                TR_MARK(tr_soft);
                if (needs_mask((j + step) * BC - lead)) mask((j + step) * BC - lead);
                rescale = softmax_tile<BC, Tile::HALF_VOTES>(s, m_i, l_i, corr, scale_log2);
                TR_SINCE(TR_SOFT, tr_soft);
            }
            TR_MARK(tr_tail);
            rescale_o<PV_PARTS, PV_N>(o, rescale, corr);
            pack_p<BC, T>(pa, s);
            TR_SINCE(TR_TAIL, tr_tail);
        }
        TR_SET(TR_LOOP);
        if (any) {  // last tile: P V only
            // Every S of this tile is done (waited for above): Q may be overwritten.
            if constexpr (Tile::EARLY_Q) mbar_arrive(q_empty + 8 * qbar);
#pragma unroll
            for (int pp = 0; pp < PV_PARTS; ++pp) fence_regs(o[pp]);
            pv_tile(split ? base + j : it);
            if constexpr (!split) ++it;
        }
        if constexpr (wg_skip) {
            // The tiles past nb are masked for every row of ours: release them unread,
            // each once it has landed (an arrival before the load would count toward
            // the slot's previous phase).
#pragma unroll 1
            for (int jj = nb; jj < t.n_blocks; ++jj, ++it) {
                const int st = it % STAGES;
                const uint32_t ph = (it / STAGES) & 1;
                mbar_wait(k_full + 8 * st, ph);  // K of tile jj has landed
                release(k_empty + 8 * st);
                mbar_wait(v_full + 8 * st, ph);  // V of tile jj has landed
                release(v_empty + 8 * st);
            }
        }
        TR_SET(TR_LASTPV);
        if constexpr (split) base += t.n_blocks;  // both warpgroups: past this tile's K/V tiles

        if constexpr (split)  // merge the two warpgroups' partials; warpgroup 1 (cw = 0) writes the tile
            sm90_split_merge<Tile>(o, m_i, l_i, cw, t128, smem_raw + (sQ - raw),
                                   reinterpret_cast<float*>(smem_raw + (ml - raw)));

        // A split tile's piece: the warp that ends its rows' pieces last merges and writes
        // them (the piece is found again here: kept from the tile's start, it spilled).
        bool write = true;
        if constexpr (TAIL) {
            if (args.tail.main > 0 && tile >= args.tail.main) {
                const Sm90Piece pc = sm90_piece(args.tail, tile, gridDim.x / CL);
                if (pc.n > 1) {
                    sm90_tail_piece_end<T, CL, CONS>(o, m_i, l_i, args.tail, pc, p, t.b, t.h, t.row0 + row_off,
                                                     crank, cw, t128);
                    write = false;
                }
            }
        }
        if ((!split || cw == 0) && write) {
            // Epilogue: O /= l into smem (TMA's swizzle, conflict-free), then 16-byte coalesced
            // stores; LSE = (m + log2 l) ln 2. O goes through this warpgroup's own Q rows, or
            // with EARLY_Q through its O buffer, PV_N columns per pass.
            constexpr bool EARLY_Q = Tile::EARLY_Q;
            constexpr int PASSES = EARLY_Q ? PV_PARTS : 1, PASS_PARTS = PV_PARTS / PASSES;
            constexpr int PASS_COLS = Tile::DV / PASSES;
            constexpr uint32_t SLAB_STRIDE = (EARLY_Q ? Tile::WG_ROWS : BR) * ROWB;  // bytes from one 64-column slab to the next
            const uint32_t stage = EARLY_Q ? sO + cw * Tile::O_STAGE_BYTES : q_rows;
            unsigned char* stage_p = smem_raw + (stage - raw);  // generic pointer to our staging rows
            T* o_bh = static_cast<T*>(p.o) + t.b * p.o_batch_stride + t.h * p.o_head_stride;
            constexpr int CH = PASS_COLS / 8;  // 16-byte chunks per row and pass
            constexpr int ROWS_PER_PASS = 128 / CH;
            // Thread t128 reads chunk c of rows r0, r0 + ROWS_PER_PASS, ... The
            // swizzle term (c % 8) ^ (r & 7) is sw ^ ((i * ROWS_PER_PASS) & 7): a
            // power-of-two pass height keeps r0's bits and the step's apart. So one
            // base offset and one running pointer serve every pass, and ptxas does
            // not hoist a register per pass out of the tile loop.
            static_assert((ROWS_PER_PASS & (ROWS_PER_PASS - 1)) == 0, "rows per pass must be a power of two");
            const int c = t128 % CH, r0 = t128 / CH;
            // Both rows' sums and reciprocals first, the LSE after the O writes (one chain per
            // row half made ptxas run the halves one after the other).
            float l[2], inv[2];
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) l[hr] = quad_sum(l_i[hr]);
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) inv[hr] = l[hr] > 0.f ? 1.f / l[hr] : 0.f;  // (NaN O * 0 stays NaN)
#pragma unroll
            for (int pass = 0; pass < PASSES; ++pass) {
                // (ids 1-3; key-split mode's merge uses 3 and 4, but has only consumers 1-2)
                if constexpr (EARLY_Q)
                    named_barrier_sync(1 + cw, 128);  // the last pass's (or tile's) reads of the O buffer are done
#pragma unroll
                for (int hr = 0; hr < 2; ++hr) {
                    const int r = warp * 16 + lane / 4 + hr * 8;  // row within the warpgroup
#pragma unroll
                    for (int q = 0; q < PASS_PARTS; ++q)
#pragma unroll
                        for (int nt = 0; nt < PV_N / 8; ++nt) {
                            const int pp = pass * PASS_PARTS + q;
                            const int col = q * PV_N + nt * 8;  // first column of this 8-column tile in the pass
                            const uint32_t off = (col / FC_SLAB_COLS) * SLAB_STRIDE + r * ROWB +
                                                 ((((col % FC_SLAB_COLS) / 8) ^ (r & 7)) << 4) + (lane % 4) * 4;
                            *reinterpret_cast<uint32_t*>(stage_p + off) =
                                pack2<T>(o[pp][4 * nt + 2 * hr] * inv[hr], o[pp][4 * nt + 2 * hr + 1] * inv[hr]);
                        }
                }
                // A later Q (a TMA write) may overwrite the staging rows: the proxy fence orders
                // these writes before it, here, ahead of the tile's global stores (after them,
                // ptxas's MEMBAR for it waited behind them; perf notes, session 25).
                if constexpr (!EARLY_Q) fence_proxy_async();
                if (pass == 0 && p.lse && lane % 4 == 0) {
#pragma unroll
                    for (int hr = 0; hr < 2; ++hr) {
                        const int r = warp * 16 + lane / 4 + hr * 8;
                        if ((!Tile::PAD_FIRST || wrow0 + r >= 0) && wrow0 + r < p.Sq)
                            p.lse[((int64_t)t.b * p.Hq + t.h) * p.Sq + wrow0 + r] =
                                l[hr] != 0.f ? (m_i[hr] + log2f(l[hr])) * FC_LN2 : -INFINITY;
                    }
                }
                named_barrier_sync(1 + cw, 128);  // this warpgroup's O rows are in smem before its threads read them back
                if (pass * PASS_COLS + c * 8 < p.Dv) {  // (v's head dim: the launcher sets it)
                    const uint32_t base = (c / 8) * SLAB_STRIDE + r0 * ROWB;
                    const int sw = (c % 8) ^ (r0 & 7);
                    T* o_thr = o_bh + (int64_t)(wrow0 + r0) * p.o_row_stride + pass * PASS_COLS + c * 8;
                    const int64_t o_step = (int64_t)ROWS_PER_PASS * p.o_row_stride;
#pragma unroll
                    for (int i = 0; i < Tile::WG_ROWS / ROWS_PER_PASS; ++i) {
                        if ((!Tile::PAD_FIRST || wrow0 + r0 + i * ROWS_PER_PASS >= 0) &&
                            wrow0 + r0 + i * ROWS_PER_PASS < p.Sq) {
                            const uint32_t off = base + i * ROWS_PER_PASS * ROWB + ((sw ^ ((i * ROWS_PER_PASS) & 7)) << 4);
                            *reinterpret_cast<uint4*>(o_thr) = *reinterpret_cast<const uint4*>(stage_p + off);
                        }
                        o_thr += o_step;
                    }
                }
            }
        }
        if constexpr (Tile::EARLY_Q) {
            if (!any) mbar_arrive(q_empty + 8 * qbar);  // no S ran: Q is released here
        } else {
            // A later Q (a TMA write) may overwrite these rows once every consumer thread is done:
            // their writes were fenced above (key-split: consumer 2's partials, here), their reads
            // returned before the stores that use them.
            if constexpr (split) {
                if (cw == 1) fence_proxy_async();
            }
            mbar_arrive(q_empty + 8 * qbar);
        }
        TR_SET(TR_END);
        TR_VAL(TR_BLOCKS, any ? (nb - first + step - 1) / step : 0);
        TR_FLUSH();
    }
#else
    __trap();  // built without sm_90a; dispatch never launches this
#endif
}
