// attn_bwd_sm80.cuh -- portable tensor-core attention backward (sm80, sm86,
// sm89, sm90), FlashAttention-2 style: three kernels on one stream.
//
// Algorithm.
//  1. attn_bwd_prep_kernel (csrc/common/bwd_rows.cuh): Delta_i = dO_i . O_i
//     (minus dlse_i) per query row, and the fp32 dQ accumulator zeroed.
//  2. attn_bwd_sm80_kernel: one CTA owns BC keys of one (batch, KV head) and
//     keeps their K and V tiles in swizzled shared memory; each of its key
//     warps (four per column group, two at DP = 256; the tile table in
//     attn_bwd_sm80_tile.cuh) owns KPW = 16 or 32 of the keys (one or two m16 tiles) and their dK, dV
//     accumulators (fp32, in registers). The CTA walks the Hq/Hkv query heads that read the KV head
//     and, for each, the query blocks of BR rows that see any of its keys
//     (causal: from the first block at or past the CTA's first key's diagonal).
//     Per block, Q_i and dO_i are cp.async'ed into shared memory with the
//     rows' LSE and Delta, and each warp computes, for its keys x BR rows,
//       S^T = K Q^T,  P^T = exp2(S^T * scale*log2e - LSE*log2e) (masked),
//       dV += P^T dO,  dP^T = V dO^T,  dS^T = P^T (dP^T - Delta),  dK += dS^T Q
//     with mma.sync m16n8k16 (the C fragments of P^T and dS^T are the A
//     fragments of the next mma; with 32 keys each B fragment of Q or dO
//     serves both key tiles). dS^T goes through shared memory; after a
//     barrier each warp computes a tile of dQ_i += dS K over all BC keys
//     (16 rows x its column group with 16-key warps; with 32-key warps 32 rows
//     x half of its group at DP <= 128, 16 rows x 128 columns at DP = 256)
//     and adds it to the fp32 accumulator with global
//     reductions (unscaled): the accumulator's 64 x 64 pieces keep each C
//     fragment half's 8 rows x 8 columns in 256 contiguous bytes (bwd_piece),
//     one reduction each, at a fixed offset from one address per lane (rows
//     past Sq and columns past D add into padding that nothing reads). The epilogue
//     writes dK * scale and dV, staged through the K/V tiles.
//  3. attn_bwd_post_kernel (bwd_rows.cuh): dQ = scale * accumulator, in dtype.
// dK and dV are reduced inside one CTA in a fixed order, so they are
// bit-reproducible; dQ's atomic adds are not (their order varies), unless
// the call is deterministic: then the CTAs adding into one query block take
// turns, the last key block first (bwd_wait_turn, csrc/common/bwd_rows.cuh),
// each waiting before its dQ phase for the CTAs of the key blocks after it.
// Column groups (GROUPS = 2: DP = 128 with 32-key warps; 4: DP = 256): a
// warp's dK and dV over all columns would not fit its registers beside S^T
// and dP^T (dK and dV take at most 64 fp32 registers each: KPW x DV <= 2048),
// so the columns are split into GROUPS groups of DV and the CTA has a group
// of KEY_WARPS warps per column group: warp w owns keys KPW (w % KEY_WARPS)
// .. +KPW-1 and columns DV (w / KEY_WARPS) .. +DV-1 of dK, dV and (DP <= 128)
// of the dQ rows it adds; at DP = 256 the dQ tiles span the groups (DQ_ALL).
// The GROUPS warps that own the same keys split the block's rows for S^T and
// dP^T (warp w takes the BR / GROUPS rows from (w / KEY_WARPS) BR / GROUPS,
// over all DP columns) and pass P^T and dS^T through shared memory, so that
// each can add all 64 rows into its column group of dV and dK.
//
// Limits. D any multiple of 8 up to DP (64, 128 or 256); the padding columns are
// zero-filled on load and never stored. Any Sq, Sk >= 1: tail rows and keys
// are zero-filled and masked. Rows with LSE = -inf (they see no key) get
// P = 0, so dQ = 0 and they add nothing; keys that no row sees get dK = dV = 0.
// Strides and pointers as the forward (16-byte aligned, checked by dispatch).
// The workspace (bwd_rows.cuh) holds the fp32 dQ accumulator (B, Hq, sq_pad, DP)
// in pieces, then Delta and LSE * log2(e) (B, Hq, sq_pad); the prep kernel fills them.
#pragma once

#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>

#include <type_traits>

#include "../common/bwd_rows.cuh"
#include "../common/launch.cuh"
#include "../common/ptx.cuh"
#include "../common/tile.cuh"
#include "../flashcore.h"
#include "../kernels.h"
#include "attn_bwd_sm80_tile.cuh"

// ---------------------------------------------------------------------------
// Kernel 2: dK, dV and the dQ accumulator.

template <int DP, int KPW, typename T>
__global__ void __launch_bounds__(BwdTile<DP, KPW>::THREADS)
attn_bwd_sm80_kernel(const __grid_constant__ fc_attn_bwd_params p) {
    using Tile = BwdTile<DP, KPW>;
    constexpr int BR = Tile::BR, BC = Tile::BC, THREADS = Tile::THREADS, STAGES = Tile::STAGES, MT = Tile::MT;
    constexpr int CHUNKS = Tile::CHUNKS;
    constexpr int D_TILES = Tile::DV / 8;  // 8-wide column tiles of this warp's dK, dV group
    constexpr int ROW_BYTES = DP * 2;
    constexpr int DS_ROW_BYTES = BR * 2;

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    T* sK = reinterpret_cast<T*>(smem_raw);  // (BC, DP) swizzled
    T* sV = sK + BC * DP;                    // (BC, DP) swizzled
    T* sQ = sV + BC * DP;                    // (STAGES, BR, DP) swizzled
    T* sdO = sQ + STAGES * BR * DP;          // (STAGES, BR, DP) swizzled
    T* sdS = sdO + STAGES * BR * DP;         // (BC, BR) swizzled: dS^T, key rows
    float* sLse = reinterpret_cast<float*>(sdS + BC * BR);  // (STAGES, BR): LSE * log2(e)
    float* sDelta = sLse + STAGES * BR;                     // (STAGES, BR)
    T* sP = reinterpret_cast<T*>(sDelta + STAGES * BR);     // (BC, BR) swizzled: P^T, key rows (GROUPS > 1)

    const int tid = threadIdx.x, lane = tid % 32;
    // This warp's keys (kw: KPW keys from kw * KPW) and the first column of its dK, dV column group (and of its
    // dQ columns' group without DQ_ALL; constants with one group).
    const int kw = Tile::GROUPS == 1 ? tid / 32 : (tid / 32) % Tile::KEY_WARPS;
    const int grp = Tile::GROUPS == 1 ? 0 : tid / 32 / Tile::KEY_WARPS;
    const int c_base = grp * Tile::DV;
    const BwdWalk w = bwd_walk<true>(p, BC, BR, blockIdx.x);  // the grid and the query blocks this CTA visits
    const int hk = w.hk, b = w.b, G = w.G, k0 = w.k0, diag = w.diag, lo = w.lo;
    const bool causal = w.causal, windowed = w.windowed;
    const int m_first = w.m_first, per_head = w.per_head, n_iter = w.n_iter;

    // The workspace: the dQ accumulator (B, Hq, sq_pad, DP) in pieces, then Delta and LSE * log2(e), (B, Hq,
    // sq_pad) each; sq_pad (bwd_sq_pad) and the addresses derived from it are computed where used.
    float* dq_acc = static_cast<float*>(p.workspace);

    // K and V once (their own commit group with the first Q/dO block).
    const int64_t thr_col = (tid % CHUNKS) * 8, thr_row = tid / CHUNKS;  // see load_tile
    {
        const T* k = static_cast<const T*>(p.k) + b * p.k_batch_stride + hk * p.k_head_stride +
                     (int64_t)k0 * p.k_row_stride;
        const T* v = static_cast<const T*>(p.v) + b * p.v_batch_stride + hk * p.v_head_stride +
                     (int64_t)k0 * p.v_row_stride;
        const int keys = min(BC, p.Sk - k0);
        load_tile<DP, BC, THREADS>(sK, k + thr_row * p.k_row_stride + thr_col, k, p.k_row_stride, keys, p.D, tid);
        load_tile<DP, BC, THREADS>(sV, v + thr_row * p.v_row_stride + thr_col, v, p.v_row_stride, keys, p.D, tid);
    }
    // Q, dO, LSE and Delta of iteration it into slot `slot`.
    // The 32-key kernels read the thread index anew (bwd_tid_fresh): the addresses derived from it are
    // recomputed per block rather than held across the loop in registers it needs (ptxas spilled one).
    auto load_block = [&](int h, int row0, int slot) {
        const int t = KPW == 32 ? bwd_tid_fresh() : tid;
        const int64_t t_col = (t % CHUNKS) * 8, t_row = t / CHUNKS;  // see load_tile
        const int rows = min(BR, p.Sq - row0);
        const T* q = static_cast<const T*>(p.q) + b * p.q_batch_stride + h * p.q_head_stride +
                     (int64_t)row0 * p.q_row_stride;
        const T* dout = static_cast<const T*>(p.dout) + b * p.do_batch_stride + h * p.do_head_stride +
                        (int64_t)row0 * p.do_row_stride;
        load_tile<DP, BR, THREADS>(sQ + slot * BR * DP, q + t_row * p.q_row_stride + t_col, q, p.q_row_stride, rows,
                                   p.D, t);
        load_tile<DP, BR, THREADS>(sdO + slot * BR * DP, dout + t_row * p.do_row_stride + t_col, dout,
                                   p.do_row_stride, rows, p.D, t);
        const int sq_pad = bwd_sq_pad(p.Sq), r = t % BR;  // padding rows (Delta 0, LSE * log2(e) +inf) to sq_pad
        const int64_t n_vec = (int64_t)p.B * p.Hq * sq_pad, vec0 = ((int64_t)b * p.Hq + h) * sq_pad + row0;
        if (THREADS == 2 * BR || t < 2 * BR)  // the first 2 BR threads: Delta, LSE * log2(e)
            bwd_cp_async_4((t < BR ? sLse : sDelta) + slot * BR + r,
                           dq_acc + n_vec * (t < BR ? DP + 1 : DP) + vec0 + r);
    };
    // The query head and block of iteration it, carried across the loop (the next: h_nxt, m_nxt).
    int h_cur = hk * G, m_cur = m_first;
    if (n_iter > 0) load_block(h_cur, m_cur * BR, 0);
    cp_async_commit();

    const float scale_log2 = p.scale * FC_LOG2E;
    float acc_dk[MT][D_TILES][4], acc_dv[MT][D_TILES][4];  // this warp's keys, C-fragment layout (unscaled dK)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int dt = 0; dt < D_TILES; ++dt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_dk[mt][dt][e] = acc_dv[mt][dt][e] = 0.f;

    // Per-lane ldmatrix byte addresses at chunk step 0 (see swz and chunk_step).
    //  k_a, v_a: A = this warp's first 16 K (V) rows, row-major (S^T = K Q^T, dP^T = V dO^T); key tile mt
    //            is mt * 16 rows further (outside the swizzle's 8 rows: a plain add), as in pt_a and dst_a.
    //  q_b:      B = Q (dO) rows as n, d as k, for S^T (dP^T); dO is at +QDO_OFF.
    //  q_t:      B = Q (dO) with rows as k (.trans), for dK += dS^T Q (dV += P^T dO), at the group.
    //  k_t:      B = K with keys as k (.trans), for dQ = dS K, at the group.
    //  ds_a:     A = dS (query rows, key k) read transposed from the dS^T tile, at the warp's first dQ row.
    // The group's column offset (a multiple of 128 bytes) lies outside the swizzle: a plain add.
    const uint32_t k_a = smem_u32(sK + swz<DP>(kw * KPW + lane % 16, lane / 16));
    const uint32_t v_a = k_a + BC * ROW_BYTES;
    const uint32_t q_b = smem_u32(sQ + swz<DP>((lane / 16) * 8 + lane % 8, (lane / 8) % 2));
    const uint32_t q_t = smem_u32(sQ + swz<DP>(((lane / 8) % 2) * 8 + lane % 8, lane / 16) + c_base);
    // This warp's dQ tile: its row group and column group in its dQ group (dq_rg = dq_w, dq_cg = 0 where a
    // group's warps split rows only), from the dQ group's first column dq_c0.
    const int dq_w = Tile::DQ_ALL ? tid / 32 : kw;
    const int dq_c0 = Tile::DQ_ALL ? 0 : c_base;
    const int dq_rg = Tile::DQ_WC == 1 ? dq_w : dq_w % Tile::DQ_WR, dq_cg = Tile::DQ_WC == 1 ? 0 : dq_w / Tile::DQ_WR;
    const uint32_t k_t = smem_u32(sK + swz<DP>(((lane / 8) % 2) * 8 + lane % 8, lane / 16) + dq_c0);
    // k_t at this warp's first dQ column pair: chunk_step composes here, as the pair count per warp is 1, 2 or a
    // multiple of 4 (the steps' XOR-ed bits do not overlap).
    static_assert(Tile::DQ_COLS / 16 <= 2 || Tile::DQ_COLS / 16 % 4 == 0, "chunk_step(k_tw, pair) must compose");
    const uint32_t k_tw = chunk_step(k_t, dq_cg * (Tile::DQ_COLS / 16));
    // ds_a at the warp's first dQ row tile; chunk_step(ds_a, rt) reaches tile rt (rt < DQ_RT <= 2, and the
    // first tile's chunk pair is a multiple of DQ_RT, so the XOR adds).
    static_assert(Tile::DQ_RT <= 2, "chunk_step(ds_a, rt) must compose");
    const uint32_t ds_a =
        smem_u32(sdS + swz<BR>((lane / 16) * 8 + lane % 8, dq_rg * Tile::DQ_RT * 2 + (lane / 8) % 2));
    //  pt_a, dst_a: A = this warp's first 16 rows of P^T (dS^T), row-major (GROUPS > 1: dV, dK from shared
    //  memory).
    const uint32_t pt_a = smem_u32(sP + swz<BR>(kw * KPW + lane % 16, lane / 16));
    const uint32_t dst_a = smem_u32(sdS + swz<BR>(kw * KPW + lane % 16, lane / 16));
    constexpr uint32_t QDO_OFF = STAGES * BR * ROW_BYTES;  // sdO - sQ, bytes
    constexpr uint32_t SLOT_BYTES = BR * ROW_BYTES;
    constexpr int PART_ROWS = BR / Tile::PARTS;  // query rows per part
    constexpr int NP = PART_ROWS / 8;              // 8-row column tiles of S^T per part
    using Frag = float[MT][NP][4];                 // the warp's keys x PART_ROWS rows, C-fragment layout
    using Pack = uint32_t[MT][NP / 2][4];          // the same as packed 16-bit A fragments

    // acc = A B^T over DP: A = the warp's MT x 16 rows at a_lane, B = PART_ROWS rows at b_lane (each B
    // fragment serves all MT key tiles).
    auto gemm_rows = [&](Frag& acc, uint32_t a_lane, uint32_t b_lane) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NP; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < DP / 16; ++kk) {
            uint32_t a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) ldmatrix_x4(a[mt], chunk_step(a_lane, kk) + mt * 16 * ROW_BYTES);
#pragma unroll
            for (int nt2 = 0; nt2 < NP / 2; ++nt2) {
                uint32_t bf[4];  // rows nt2*16..: {n 0-7 k 0-7, n 0-7 k 8-15, n 8-15 k 0-7, n 8-15 k 8-15}
                ldmatrix_x4(bf, chunk_step(b_lane, kk) + nt2 * 16 * ROW_BYTES);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma_16816<T>(acc[mt][2 * nt2], a[mt], bf[0], bf[1]);
                    mma_16816<T>(acc[mt][2 * nt2 + 1], a[mt], bf[2], bf[3]);
                }
            }
        }
    };
    // acc (the warp's keys x DV) += A B: A = packed MT x 16 x PART_ROWS fragments, B = PART_ROWS rows
    // (.trans) at b_lane.
    auto gemm_acc = [&](float (&acc)[MT][D_TILES][4], const Pack& a, uint32_t b_lane) {
#pragma unroll
        for (int kk = 0; kk < NP / 2; ++kk)
#pragma unroll
            for (int dt2 = 0; dt2 < D_TILES / 2; ++dt2) {
                uint32_t bf[4];  // rows kk*16..: {d 0-7 k 0-7, d 0-7 k 8-15, d 8-15 k 0-7, d 8-15 k 8-15}
                ldmatrix_x4_trans(bf, chunk_step(b_lane, dt2) + kk * 16 * ROW_BYTES);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma_16816<T>(acc[mt][2 * dt2], a[mt][kk], bf[0], bf[1]);
                    mma_16816<T>(acc[mt][2 * dt2 + 1], a[mt][kk], bf[2], bf[3]);
                }
            }
    };

    // Stores packed A fragments (the warp's keys x PART_ROWS rows from row col0) into a (BC, BR)
    // swizzled key-row tile: a[mt][kk][2 * hf + hr] holds key row mt*16 + lane/4 + 8*hr of the warp's,
    // query chunk col0/8 + 2*kk + hf, columns (lane%4)*2 + 0/1. One base address per lane: the rows
    // differ by multiples of 8 (the same swizzle, an immediate add) and the chunks by 2*kk + hf < NP,
    // bits that col0/8 (a multiple of NP) does not have (an XOR, see swz).
    auto stash = [&](T* tile, const Pack& a, int col0) {
        const uint32_t base = static_cast<uint32_t>(
            reinterpret_cast<unsigned char*>(tile + swz<BR>(kw * KPW + lane / 4, col0 / 8) +
                                             (lane % 4) * 2) -
            smem_raw);  // byte offset in smem_raw (1024-aligned; the tile's rows start at multiples of 128)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int kk = 0; kk < NP / 2; ++kk)
#pragma unroll
                for (int hf = 0; hf < 2; ++hf)
#pragma unroll
                    for (int hr = 0; hr < 2; ++hr)
                        *reinterpret_cast<uint32_t*>(smem_raw + ((base ^ ((2 * kk + hf) << 4)) +
                                                                 (mt * 16 + hr * 8) * DS_ROW_BYTES)) =
                            a[mt][kk][2 * hf + hr];
    };

    for (int it = 0; it < n_iter; ++it) {
        const int slot = STAGES == 2 ? it % 2 : 0;
        const bool wrap = m_cur + 1 == m_first + per_head;  // the next iteration is the next head's first block
        const int h_nxt = wrap ? h_cur + 1 : h_cur, m_nxt = wrap ? m_first : m_cur + 1;
        cp_async_wait<0>();  // this thread's copies of block it (and K, V) have landed
        __syncthreads();     // orders every thread's block-it copies before any warp reads them, every
                             // warp's dQ-phase reads of sdS (block it-1) before the dS^T stores below,
                             // (two slots) the reads of slot it+1 in block it-1 before its refill,
                             // (column groups, two slots) every warp's dV / dK-phase reads of sP and sdS
                             // (block it-1) before the stores below, and (deterministic) every warp's
                             // dQ adds of block it-1 before they are counted
        if (p.deterministic && it > 0 && tid == 0) bwd_pass_turn<DP>(p, w, it - 1, bwd_sq_pad(p.Sq));
        if constexpr (STAGES == 2) {
            if (it + 1 < n_iter) load_block(h_nxt, m_nxt * BR, slot ^ 1);
            cp_async_commit();
        }
        const int h = h_cur, row0 = m_cur * BR;
        const bool need_mask = row0 + BR > p.Sq || k0 + BC > p.Sk || (causal && k0 + BC - 1 > row0 + diag) ||
                               (windowed && k0 < row0 + BR - 1 + lo);

        // The block's rows in PARTS parts of PART_ROWS (not unrolled: one part's S^T and dP^T live at a
        // time); with column groups, group g takes part g only.
        const int part_first = Tile::GROUPS == 1 ? 0 : grp, part_end = Tile::GROUPS == 1 ? Tile::PARTS : grp + 1;
#pragma unroll 1
        for (int part = part_first; part < part_end; ++part) {
            const int col0 = part * PART_ROWS;  // first row of the part inside the block
            const uint32_t rows_off = slot * SLOT_BYTES + col0 * ROW_BYTES;
            const float* lse_s = sLse + slot * BR + col0 + (lane % 4) * 2;  // this lane's columns nt*8 + 0/1
            const float* delta_s = sDelta + slot * BR + col0 + (lane % 4) * 2;

            // S^T = K Q^T, then P^T in place.
            Frag s;
            gemm_rows(s, k_a, q_b + rows_off);
#pragma unroll
            for (int nt = 0; nt < NP; ++nt) {
                // LSE * log2(e): +inf for a row that sees no key (P = 2^-inf = 0; its scores are finite or
                // -inf, NaN only at keys it does not see, masked below) and for padding rows.
                const float2 m2 = *reinterpret_cast<const float2*>(lse_s + nt * 8);
#pragma unroll
                for (int e = 0; e < 2; ++e)
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                        for (int hr = 0; hr < 2; ++hr)
                            s[mt][nt][2 * hr + e] =
                                fast_exp2(fmaf(s[mt][nt][2 * hr + e], scale_log2, e ? -m2.y : -m2.x));
            }
            // Mask: query rows past Sq, keys past Sk, causal (query i < key - diag), window (i > key - lo).
            // Column c = nt*8 + e of this lane is query row0 + col0 + (lane%4)*2 + c.
            if (need_mask) {
                const int q_first = row0 + col0 + (lane % 4) * 2;
                const int q_lim = p.Sq - q_first;  // masked iff c >= q_lim
                // This lane's key of (mt, hr) is key_first + off, off = mt*16 + hr*8 (compile-time), so one
                // register per bound: masked iff off >= key_room, c - off < c_lim (causal) or c - off > c_top
                // (WIN: a window; a compile-time flag, so that calls without one skip its compares).
                const int key_first = k0 + kw * KPW + lane / 4, key_room = p.Sk - key_first;
                const int c_lim = causal ? key_first - diag - q_first : INT_MIN / 2;
                const int c_top = windowed ? key_first - lo - q_first : INT_MAX / 2;
                auto mask = [&](auto win) {
                    constexpr bool WIN = decltype(win)::value;
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                        for (int hr = 0; hr < 2; ++hr) {
                            const int off = mt * 16 + hr * 8;
                            const bool key_bad = off >= key_room;
#pragma unroll
                            for (int nt = 0; nt < NP; ++nt)
#pragma unroll
                                for (int e = 0; e < 2; ++e) {
                                    const int c = nt * 8 + e;
                                    if (key_bad || c >= q_lim || c - off < c_lim || (WIN && c - off > c_top))
                                        s[mt][nt][2 * hr + e] = 0.f;
                                }
                        }
                };
                // (At DP = 64 one variant, the bound held in c_top either way: two spilled on the sm_90a target.)
                if (DP > 64 && !windowed) mask(std::false_type{});
                else mask(std::true_type{});
            }

            // dV += P^T dO (column groups: P^T into shared memory, for the GROUPS warps of the key group).
            {
                Pack pa;
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int kk = 0; kk < NP / 2; ++kk) pack_a_from_c<T>(pa[mt][kk], s[mt][2 * kk], s[mt][2 * kk + 1]);
                if constexpr (Tile::GROUPS == 1) gemm_acc(acc_dv, pa, q_t + QDO_OFF + rows_off);
                else stash(sP, pa, col0);
            }

            // dP^T = V dO^T, then dS^T = P^T (dP^T - Delta) in place.
            Frag dp;
            gemm_rows(dp, v_a, q_b + QDO_OFF + rows_off);
#pragma unroll
            for (int nt = 0; nt < NP; ++nt) {
                const float2 d2 = *reinterpret_cast<const float2*>(delta_s + nt * 8);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int hr = 0; hr < 2; ++hr) {
                        dp[mt][nt][2 * hr] = s[mt][nt][2 * hr] * (dp[mt][nt][2 * hr] - d2.x);
                        dp[mt][nt][2 * hr + 1] = s[mt][nt][2 * hr + 1] * (dp[mt][nt][2 * hr + 1] - d2.y);
                    }
            }

            // dK += dS^T Q (one group), and dS^T (16-bit) into the shared tile for dQ (and dK).
            Pack dsa;
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int kk = 0; kk < NP / 2; ++kk) pack_a_from_c<T>(dsa[mt][kk], dp[mt][2 * kk], dp[mt][2 * kk + 1]);
            if constexpr (Tile::GROUPS == 1) gemm_acc(acc_dk, dsa, q_t + rows_off);
            stash(sdS, dsa, col0);
        }
        if (p.deterministic && tid == 0) bwd_wait_turn<DP>(p, w, it, BC, bwd_sq_pad(p.Sq));  // this CTA's dQ turn
        __syncthreads();  // orders the P^T and dS^T stores before the reads below, (one slot, one group)
                          // every warp's reads of the Q/dO slot and LSE/Delta before the refill below, and
                          // (deterministic) the turn's wait before every warp's dQ adds
        if constexpr (Tile::GROUPS > 1) {
            // dV += P^T dO and dK += dS^T Q over all BR rows, this warp's column group, A from shared memory.
#pragma unroll 1
            for (int part = 0; part < Tile::PARTS; ++part) {
                Pack pa, dsa;
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int kk = 0; kk < NP / 2; ++kk) {
                        ldmatrix_x4(pa[mt][kk], chunk_step(pt_a, part * (NP / 2) + kk) + mt * 16 * DS_ROW_BYTES);
                        ldmatrix_x4(dsa[mt][kk], chunk_step(dst_a, part * (NP / 2) + kk) + mt * 16 * DS_ROW_BYTES);
                    }
                const uint32_t rows_off = slot * SLOT_BYTES + part * PART_ROWS * ROW_BYTES;
                gemm_acc(acc_dv, pa, q_t + QDO_OFF + rows_off);
                gemm_acc(acc_dk, dsa, q_t + rows_off);
            }
            if constexpr (STAGES == 1)
                __syncthreads();  // every warp's reads of the Q/dO slot (above) before the refill below (with
                                  // two slots the next block's first barrier orders them before slot reuse)
        }
        if constexpr (STAGES == 1) {
            if (it + 1 < n_iter) load_block(h_nxt, m_nxt * BR, 0);
            cp_async_commit();
        }

        // dQ rows row0 + dq_rg*16*DQ_RT .. (DQ_RT m16 tiles), DQ_COLS columns of this warp's dQ group from
        // dq_cg*DQ_COLS, += dS K (all BC keys), unscaled, into the accumulator (deterministic: in this CTA's
        // turn, waited for above). With one row tile, dS's fragments for all BC keys are loaded once and the
        // column pairs run two at a time (one: 2-7 % slower on small grids); with
        // more, the keys run outermost, each key step's dS fragments used by all of the warp's pairs (64
        // registers of fragments would spill at 128 keys).
        {
            constexpr int DQ_RT = Tile::DQ_RT, DQ_PAIRS = Tile::DQ_COLS / 16;
            constexpr bool A_ALL = DQ_RT == 1;             // dS fragments of all keys loaded up front
            constexpr int PG = A_ALL ? 2 : DQ_PAIRS;       // column pairs accumulated at a time
            uint32_t a_all[A_ALL ? BC / 16 : 1][4];
            if constexpr (A_ALL)
#pragma unroll
                for (int kk = 0; kk < BC / 16; ++kk) ldmatrix_x4_trans(a_all[kk], ds_a + kk * 16 * DS_ROW_BYTES);
#pragma unroll 1  // one pass with PG = DQ_PAIRS; unrolled (one row tile), the passes' adds overlapped, spilling
            for (int pg = 0; pg < DQ_PAIRS; pg += PG) {
                float acc[PG][DQ_RT][2][4];
#pragma unroll
                for (int pp = 0; pp < PG; ++pp)
#pragma unroll
                    for (int rt = 0; rt < DQ_RT; ++rt)
#pragma unroll
                        for (int e = 0; e < 4; ++e) acc[pp][rt][0][e] = acc[pp][rt][1][e] = 0.f;
#pragma unroll
                for (int kk = 0; kk < BC / 16; ++kk) {
                    uint32_t a_k[A_ALL ? 1 : DQ_RT][4];
                    if constexpr (!A_ALL)
#pragma unroll
                        for (int rt = 0; rt < DQ_RT; ++rt)
                            ldmatrix_x4_trans(a_k[rt], chunk_step(ds_a, rt) + kk * 16 * DS_ROW_BYTES);
#pragma unroll
                    for (int pp = 0; pp < PG; ++pp) {
                        uint32_t bf[4];  // K keys kk*16..: {d 0-7 k 0-7, d 0-7 k 8-15, d 8-15 k 0-7, d 8-15 k 8-15}
                        ldmatrix_x4_trans(bf, chunk_step(k_tw, pg + pp) + kk * 16 * ROW_BYTES);
#pragma unroll
                        for (int rt = 0; rt < DQ_RT; ++rt) {
                            const uint32_t(&a)[4] = A_ALL ? a_all[kk] : a_k[rt];
                            mma_16816<T>(acc[pp][rt][0], a, bf[0], bf[1]);
                            mma_16816<T>(acc[pp][rt][1], a, bf[2], bf[3]);
                        }
                    }
                }
                // A lane's pair of each C fragment half (8 x 8 from multiples of 8) is at bwd_piece_offset(first
                // row, first column) + 2 * lane from the block's first piece: one address per lane, fixed offsets.
                // Rows past Sq and columns past D add into padding nothing reads; without DQ_ALL an m16 tile
                // wholly past Sq skips its adds (a warp-uniform branch; without it the DP = 64 32-key kernel
                // spilled). With DQ_ALL (DP = 256) the adds are unguarded: around the branches ptxas rebuilt one 64-bit
                // address per pair of adds, each rebuild waiting for the previous add to read it (8-10 % of
                // the kernel's stall samples in ncu, H100).
                constexpr int M16 = bwd_piece_offset(16, 0), HALF8 = bwd_piece_offset(8, 0);
                constexpr int N8 = bwd_piece_offset(0, 8);
                const int64_t block = ((int64_t)b * p.Hq + h) * (bwd_sq_pad(p.Sq) / BWD_PIECE_ROWS) + row0 / BR;
                float* lane_dq = dq_acc + bwd_piece<DP>(block, 0) + Tile::dq_lane_offset(tid);
#pragma unroll
                for (int pp = 0; pp < PG; ++pp)
#pragma unroll
                    for (int j = 0; j < 2; ++j) {
                        const int c = 2 * (pg + pp) + j;  // 8-column tile from the warp's first
#pragma unroll
                        for (int rt = 0; rt < DQ_RT; ++rt) {
                            if (!Tile::DQ_ALL && row0 + (dq_rg * DQ_RT + rt) * 16 >= p.Sq) continue;
#pragma unroll
                            for (int hr = 0; hr < 2; ++hr)
                                bwd_red_add2(lane_dq + N8 * c + HALF8 * hr + M16 * rt, acc[pp][rt][j][2 * hr],
                                             acc[pp][rt][j][2 * hr + 1]);
                        }
                    }
            }
        }
        h_cur = h_nxt;
        m_cur = m_nxt;
    }
    cp_async_wait<0>();  // drain the (empty) trailing group; with no block, K and V have landed
    __syncthreads();     // every warp is done reading sK and sV (dQ reads all keys) before they are restaged,
                         // and (deterministic) every warp's dQ adds of the last block before they are counted
    if (p.deterministic && n_iter > 0 && tid == 0) bwd_pass_turn<DP>(p, w, n_iter - 1, bwd_sq_pad(p.Sq));

    // Epilogue: dK * scale and dV through this warp's own K and V rows (the
    // group's columns), then 16-byte coalesced stores of keys < Sk.
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const int r = kw * KPW + mt * 16 + lane / 4 + hr * 8;
#pragma unroll
            for (int dt = 0; dt < D_TILES; ++dt) {
                *reinterpret_cast<uint32_t*>(sK + swz<DP>(r, c_base / 8 + dt) + (lane % 4) * 2) =
                    pack2<T>(acc_dk[mt][dt][2 * hr] * p.scale, acc_dk[mt][dt][2 * hr + 1] * p.scale);
                *reinterpret_cast<uint32_t*>(sV + swz<DP>(r, c_base / 8 + dt) + (lane % 4) * 2) =
                    pack2<T>(acc_dv[mt][dt][2 * hr], acc_dv[mt][dt][2 * hr + 1]);
            }
        }
    __syncwarp();  // this warp's staged rows are complete before its lanes read them back
    constexpr int OUT_CHUNKS = Tile::DV / 8;   // 16-byte chunks of a row's group
    constexpr int ROW_STEP = 32 / OUT_CHUNKS;  // rows per warp pass (OUT_CHUNKS <= 16)
    static_assert(32 % OUT_CHUNKS == 0 && KPW % ROW_STEP == 0, "a warp's rows split evenly into passes");
    // The lane read anew with DQ_ALL (bwd_tid_fresh): its offsets below, hoisted across the loop, spilled on sm_80.
    const int lane_o = Tile::DQ_ALL ? bwd_tid_fresh() % 32 : lane;
    const int c_first = c_base / 8 + lane_o % OUT_CHUNKS, r_first = lane_o / OUT_CHUNKS;
    const bool col_ok = c_first * 8 < p.D;
    const int64_t key_first = (int64_t)k0 + kw * KPW + r_first;
    T* dk = static_cast<T*>(p.dk) + b * p.dk_batch_stride + hk * p.dk_head_stride + key_first * p.dk_row_stride +
            c_first * 8;
    T* dv = static_cast<T*>(p.dv) + b * p.dv_batch_stride + hk * p.dv_head_stride + key_first * p.dv_row_stride +
            c_first * 8;
#pragma unroll
    for (int i = 0; i < KPW / ROW_STEP; ++i) {
        const int r = kw * KPW + r_first + i * ROW_STEP;
        if (col_ok && k0 + r < p.Sk) {
            *reinterpret_cast<uint4*>(dk) = *reinterpret_cast<const uint4*>(sK + swz<DP>(r, c_first));
            *reinterpret_cast<uint4*>(dv) = *reinterpret_cast<const uint4*>(sV + swz<DP>(r, c_first));
        }
        dk += ROW_STEP * p.dk_row_stride;
        dv += ROW_STEP * p.dv_row_stride;
    }
}
