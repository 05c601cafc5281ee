// attn_fwd_sm80.cuh -- portable tensor-core attention forward (sm80, sm86,
// sm89, sm90), one FlashAttention-2-style pass.
//
// Algorithm. One CTA owns BR query rows of one (batch, head); its WARPS warps
// each own M_TILES x 16 of those rows. The CTA loads its Q tile once, then
// streams K/V tiles of BC keys through a KV_STAGES-deep cp.async ring. For
// every tile each warp computes S = Q K^T with mma.sync m16n8k16 (Q and K
// fragments by ldmatrix from swizzled shared memory), applies the causal/tail
// mask, updates the running row max m_i and row sum l_i (online softmax in
// exp2 with log2(e) folded into the scale), rescales its O accumulator, and
// adds P V with P taken straight from the S accumulator registers (the C
// fragment of one mma is the A fragment of the next). All accumulation is
// fp32. The epilogue divides by l_i, writes O through shared memory with
// 16-byte coalesced stores, and writes LSE = m_i + ln(l_i).
//
// Limits. D is any multiple of 8 up to DP (the instantiated padded head dim:
// 64, 128 or 256); the extra columns are zero-filled on load and never stored.
// Any Sq, Sk >= 1: tail rows are zero-filled and tail keys masked. Pointers
// must be 16-byte aligned and row/head/batch strides multiples of 8 elements
// (checked by dispatch). Rows that see no key give O = 0 and LSE = -inf.
// Sliding windows (fc_band): a CTA starts at the key block of its first row's
// first key and masks the blocks its rows' left edges cross.
// Causal CTAs launch in windows of a few heads, longest-first inside each.
#pragma once

#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>

#include <type_traits>

#include "../common/launch.cuh"
#include "../common/ptx.cuh"
#include "../common/tile.cuh"
#include "../flashcore.h"
#include "../kernels.h"

// ---------------------------------------------------------------------------
// Tile table: every tile choice in one place, per padded head dim DP.
//
//  DP  | WARPS | M_TILES | BR  | BC | smem (Q + K/V)    | why
//  64  |   4   |    2    | 128 | 64 |  16 + 64 = 80 KB  | 2 m-tiles/warp reuse each K/V fragment twice;
//      |       |         |     |    |                   | 4-stage pipelined ring (see PIPE)
//  128 |   4   |    2    | 128 | 64 |  32 + 32 = 64 KB  | staggered K and V slots (see STAGGER); on the sm_80
//      |       |         |     |    |                   | target BC = 32 and two K/V stages (same 64 KB):
//      |       |         |     |    |                   | there BC = 64 spills (O 128 + S 64 fp32 regs/thread)
//  256 |   4   |    1    |  64 | 64 |  32 + 64 = 96 KB  | O alone is 128 fp32 regs/thread, so one m-tile/warp;
//      |       |         |     |    |                   | staggered K and V slots
// Every config fits the 99 KB per-block limit of sm86/sm89.
// Small grids at DP = 64 (fewer 128-row CTAs than SMs, e.g. B=2 H=8 S=512)
// use M_TILES = 1 (BR = 64, 40 KB): twice the CTAs, each half as long.
//
// The smallest DP that staggers. On the sm_80 target (sm80/86/89 run it) ptxas
// spills 12 bytes at DP = 128 with the stagger, so there only DP = 256 does.
// The host pass sees the sm_90 value; both DP = 128 variants use 64 KB and 128
// rows per CTA, so the host's launch shape holds for either (asserted below).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define FC_SM80_STAGGER_MIN_DP 256
#else
#define FC_SM80_STAGGER_MIN_DP 128
#endif
// Causal launch order: windows of about SM80_CAUSAL_WINDOW_CTAS CTAs (whole
// heads), longest-first inside a window, so the query blocks of a few heads run
// together and share their K/V in L2. Measured on an H100 with L2 flushed before
// each call: D = 128 causal S = 1k +15 %, D = 256 +11 %, S >= 4k flat; 512 reads
// the same, 1024 less, and one head per window is 7-10 % slower at S >= 2k.
static constexpr int SM80_CAUSAL_WINDOW_CTAS = 256;

template <int DP, int MT = (DP <= 128 ? 2 : 1)>
struct Sm80Tile {
    static constexpr int WARPS = 4;
    static constexpr int M_TILES = MT;                 // 16-row mma tiles per warp
    static constexpr int BR = WARPS * M_TILES * 16;    // query rows per CTA
    // STAGGER: one K slot and one V slot instead of a ring of K/V pairs; V_j
    // loads while S_j and its softmax run (issued before S_j), K_{j+1} while
    // P_j V_j runs. Twice the keys per tile (BC = 64) in the same shared memory.
    // Measured on an H100: +8-10 % at D = 256, +7-13 % at D = 128 (perf notes).
    static constexpr bool STAGGER = DP >= FC_SM80_STAGGER_MIN_DP;
    // PIPE: P_{j-1} V_{j-1} overlaps the softmax of S_j (see the main loop), in a
    // 4-stage ring (80 KB). Measured on an H100: +3-5 % at D = 64. At D = 128/256
    // the extra slots would cost the second CTA per SM.
    static constexpr bool PIPE = DP == 64 && MT == 2;
    // S_PREFETCH: in S = Q K^T the Q and K fragments of a k-step are loaded two
    // steps before its mma. At DP = 256 ptxas otherwise issues each ldmatrix one
    // to three instructions before its mma, and those mma led the short-scoreboard
    // stalls (ncu source view). Measured on an H100: +1-3 % at S <= 4k, flat to
    // +2 % above (perf notes); at DP = 64 +1-3 %; at DP = 128 1-4 % slower, so off.
    static constexpr bool S_PREFETCH = DP == 256 || DP == 64;
    // ROW_VOTES: the O rescale is voted per 8 rows instead of per warp, so it
    // is skipped more often (see the softmax). Measured on an H100: +2-3 % at
    // D = 64, flat at D = 128, 1-1.5 % slower at D = 256, where ptxas, at 252
    // registers, schedules the split rescale worse than the one loop.
    static constexpr bool ROW_VOTES = DP <= 128;
    static constexpr int BC = DP <= 64 || STAGGER ? 64 : 32;  // keys per K/V tile
    static constexpr int KV_STAGES = STAGGER ? 1 : PIPE ? 4 : 2;  // K/V tiles in flight
    static constexpr int THREADS = WARPS * 32;
    static constexpr int CHUNKS = DP / 8;              // 16-byte chunks per row
    static constexpr size_t SMEM_BYTES = (size_t)(BR + 2 * KV_STAGES * BC) * DP * 2;
    static_assert(DP != 128 || (BR == 128 && SMEM_BYTES == 64 * 1024),
                  "the host sizes DP = 128 launches without knowing the target's BC");
};

// ---------------------------------------------------------------------------
// Kernel

template <int DP, int MT, typename T>
__global__ void __launch_bounds__(Sm80Tile<DP, MT>::THREADS)
attn_fwd_sm80_kernel(const __grid_constant__ fc_attn_params p, const fc_band band) {
    using Tile = Sm80Tile<DP, MT>;
    constexpr int BR = Tile::BR, BC = Tile::BC, M_TILES = Tile::M_TILES, THREADS = Tile::THREADS;
    constexpr int STAGES = Tile::KV_STAGES;
    constexpr int N_TILES = BC / 8;   // 8-key column tiles of S
    constexpr int D_TILES = DP / 8;   // 8-wide column tiles of O

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    T* sQ = reinterpret_cast<T*>(smem_raw);  // (BR, DP) swizzled
    T* sK = sQ + BR * DP;                    // (STAGES, BC, DP) swizzled
    T* sV = sK + STAGES * BC * DP;           // (STAGES, BC, DP) swizzled

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    // 1-D grid over (query block, head, batch), so B * Hq is not capped at 65535.
    // Non-causal: query blocks of one head are adjacent (they share K/V in L2).
    // Causal: windows of W whole heads (about SM80_CAUSAL_WINDOW_CTAS CTAs)
    // share K/V in L2; inside a window the last query blocks, which see the
    // most keys, launch first (longest-first).
    const int n_mblocks = (p.Sq + BR - 1) / BR, n_bh = p.B * p.Hq;
    int mblock, bh;
    if (p.causal != FC_CAUSAL_NONE) {
        const int W = max(1, SM80_CAUSAL_WINDOW_CTAS / n_mblocks);  // heads per window
        const unsigned span = (unsigned)(W * n_mblocks);  // CTAs per full window
        const int win = (int)(blockIdx.x / span), r = (int)(blockIdx.x % span);
        const int wc = min(W, n_bh - win * W);  // heads in this window (the last may be short)
        mblock = n_mblocks - 1 - r / wc;
        bh = win * W + r % wc;
    } else {
        mblock = (int)(blockIdx.x % n_mblocks);
        bh = (int)(blockIdx.x / n_mblocks);
    }
    const int h = bh % p.Hq, b = bh / p.Hq;
    const int hk = h / (p.Hq / p.Hkv);
    const int row0 = mblock * BR;  // first query row of this CTA

    const T* q = static_cast<const T*>(p.q) + b * p.q_batch_stride + h * p.q_head_stride + (int64_t)row0 * p.q_row_stride;
    const T* k_head = static_cast<const T*>(p.k) + b * p.k_batch_stride + hk * p.k_head_stride;
    const T* v_head = static_cast<const T*>(p.v) + b * p.v_batch_stride + hk * p.v_head_stride;
    // O and LSE rows of this CTA. At DP = 256 ptxas uses all 255 registers and
    // its spills depend on where these two pointers are formed: after the main
    // loop is spill-free on sm_80 but spills on sm_90a, before it the reverse
    // (nvcc 13.0), so each target forms them where it stays spill-free. At
    // DP <= 128 (registers to spare) they are formed early.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    constexpr bool LATE_OUT_PTRS = DP == 256;
#else
    constexpr bool LATE_OUT_PTRS = false;
#endif
    auto out_ptr = [&]() {
        return static_cast<T*>(p.o) + b * p.o_batch_stride + h * p.o_head_stride + (int64_t)row0 * p.o_row_stride;
    };
    auto lse_ptr = [&]() { return p.lse ? p.lse + ((int64_t)b * p.Hq + h) * p.Sq + row0 : nullptr; };
    T* o = LATE_OUT_PTRS ? nullptr : out_ptr();
    float* lse = LATE_OUT_PTRS ? nullptr : lse_ptr();
    const int q_rows = min(BR, p.Sq - row0);

    // Key j is visible to query i iff j < Sk, j <= i + hi (causal, or a window's right edge) and
    // j >= i + lo (a window's left edge): `band`, FC_BAND(p) from the launcher (a kernel parameter, so
    // its fields are read from the constant bank, not held in registers).
    const bool causal = band.has_hi, windowed = band.has_lo;
    int n_blocks = (p.Sk + BC - 1) / BC;
    if (causal) {
        const int last_key = row0 + q_rows - 1 + band.hi;
        n_blocks = last_key < 0 ? 0 : min(n_blocks, last_key / BC + 1);
    }
    // A window skips the key blocks before its first row's first key: the loop below counts blocks
    // from kb (k and v start there; key0 below is relative to it).
    const int j0 = fc_band_first_block(band, row0, BC, n_blocks);
    n_blocks -= j0;
    const int kb = j0 * BC;

    if (n_blocks <= 0) {  // every row of this CTA sees no key: O = 0, LSE = -inf
        if (LATE_OUT_PTRS) { o = out_ptr(); lse = lse_ptr(); }
        for (int idx = tid; idx < q_rows * Tile::CHUNKS; idx += THREADS) {
            const int r = idx / Tile::CHUNKS, c = idx % Tile::CHUNKS;
            if (c * 8 < p.D) *reinterpret_cast<uint4*>(o + r * p.o_row_stride + c * 8) = make_uint4(0, 0, 0, 0);
        }
        if (lse)
            for (int r = tid; r < q_rows; r += THREADS) lse[r] = -INFINITY;
        return;
    }

    // Prologue: Q and the first STAGES-1 K/V tiles, one commit group per tile
    // (Q rides in the first group).
    // This thread's first element of each tile (see load_tile); K/V advance by BC rows per tile.
    const int64_t thr_col = (tid % Tile::CHUNKS) * 8, thr_row = tid / Tile::CHUNKS;
    const T* k = k_head + (int64_t)kb * p.k_row_stride;  // key block j0, the loop's block 0
    const T* v = v_head + (int64_t)kb * p.v_row_stride;
    const T* k_thr = k + thr_row * p.k_row_stride + thr_col;
    const T* v_thr = v + thr_row * p.v_row_stride + thr_col;
    const int64_t k_tile_stride = BC * p.k_row_stride, v_tile_stride = BC * p.v_row_stride;
    load_tile<DP, BR, THREADS>(sQ, q + thr_row * p.q_row_stride + thr_col, q, p.q_row_stride, q_rows, p.D, tid);
    if constexpr (Tile::STAGGER) {  // K of tile 0 rides in Q's group; V of tile j loads inside iteration j
        load_tile<DP, BC, THREADS>(sK, k_thr, k, p.k_row_stride, min(BC, p.Sk - kb), p.D, tid);
        cp_async_commit();
    }
    // K and V of tile t into ring slot t % STAGES (the ring variants).
    auto load_kv = [&](int t) {
        const int slot = t % STAGES, keys = min(BC, p.Sk - kb - t * BC);
        load_tile<DP, BC, THREADS>(sK + slot * BC * DP, k_thr + t * k_tile_stride, k, p.k_row_stride, keys, p.D, tid);
        load_tile<DP, BC, THREADS>(sV + slot * BC * DP, v_thr + t * v_tile_stride, v, p.v_row_stride, keys, p.D, tid);
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < n_blocks) load_kv(s);
        cp_async_commit();
    }

    const float scale_log2 = p.scale * FC_LOG2E;
    float acc_o[M_TILES][D_TILES][4];  // O accumulator, C-fragment layout
    float m_i[M_TILES][2];             // running row max of scale_log2 * S (rows lane/4 and lane/4 + 8)
    float l_i[M_TILES][2];             // running row sum, this lane's columns only
#pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt) {
#pragma unroll
        for (int dt = 0; dt < D_TILES; ++dt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_o[mt][dt][e] = 0.f;
        m_i[mt][0] = m_i[mt][1] = -INFINITY;
        l_i[mt][0] = l_i[mt][1] = 0.f;
    }
    const int wrow = warp * M_TILES * 16;  // first CTA row of this warp
    // Per-lane ldmatrix byte addresses at chunk step 0 (see swz); later steps XOR an immediate.
    constexpr int ROW_BYTES = DP * 2;
    const uint32_t q_lane = smem_u32(sQ + swz<DP>(wrow + lane % 16, lane / 16));
    const uint32_t k_lane = smem_u32(sK + swz<DP>((lane / 16) * 8 + lane % 8, (lane / 8) % 2));
    const uint32_t v_lane = smem_u32(sV + swz<DP>(((lane / 8) % 2) * 8 + lane % 8, lane / 16));
    using STile = float[M_TILES][N_TILES][4];      // S of one K/V tile, C-fragment layout
    using PTile = uint32_t[M_TILES][BC / 16][4];   // P of one K/V tile, A-fragment layout

    // S = Q K^T for the K tile at byte offset k_slot (per warp: M_TILES*16 rows x BC keys).
    auto qk = [&](STile& acc_s, uint32_t k_slot) {
#pragma unroll
        for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
            for (int nt = 0; nt < N_TILES; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc_s[mt][nt][e] = 0.f;
        if constexpr (Tile::S_PREFETCH) {
            // Fragments of k-step kk+S_AHEAD load while the mma of step kk run, in a
            // ring of S_AHEAD+1 buffers. One step ahead left the mma at S >= 8k about
            // 1 % behind no prefetch; two recovered it (three compile to the same SASS).
            constexpr int S_AHEAD = 2, NB = S_AHEAD + 1;
            uint32_t a[NB][M_TILES][4], bk[NB][N_TILES / 2][4];
            auto load_frags = [&](int kk, int buf) {
#pragma unroll
                for (int mt = 0; mt < M_TILES; ++mt)
                    ldmatrix_x4(a[buf][mt], chunk_step(q_lane, kk) + mt * 16 * ROW_BYTES);
#pragma unroll
                for (int nt2 = 0; nt2 < N_TILES / 2; ++nt2)
                    ldmatrix_x4(bk[buf][nt2], chunk_step(k_lane, kk) + k_slot + nt2 * 16 * ROW_BYTES);
            };
#pragma unroll
            for (int kk = 0; kk < S_AHEAD; ++kk) load_frags(kk, kk);
#pragma unroll
            for (int kk = 0; kk < DP / 16; ++kk) {
                if (kk + S_AHEAD < DP / 16) load_frags(kk + S_AHEAD, (kk + S_AHEAD) % NB);
                const int b = kk % NB;
#pragma unroll
                for (int nt2 = 0; nt2 < N_TILES / 2; ++nt2)
#pragma unroll
                    for (int mt = 0; mt < M_TILES; ++mt) {
                        mma_16816<T>(acc_s[mt][2 * nt2], a[b][mt], bk[b][nt2][0], bk[b][nt2][1]);
                        mma_16816<T>(acc_s[mt][2 * nt2 + 1], a[b][mt], bk[b][nt2][2], bk[b][nt2][3]);
                    }
            }
        } else {
#pragma unroll
            for (int kk = 0; kk < DP / 16; ++kk) {
                uint32_t a[M_TILES][4];
#pragma unroll
                for (int mt = 0; mt < M_TILES; ++mt)
                    ldmatrix_x4(a[mt], chunk_step(q_lane, kk) + mt * 16 * ROW_BYTES);
#pragma unroll
                for (int nt2 = 0; nt2 < N_TILES / 2; ++nt2) {
                    uint32_t bk[4];  // K rows nt2*16.. : {n 0-7 k 0-7, n 0-7 k 8-15, n 8-15 k 0-7, n 8-15 k 8-15}
                    ldmatrix_x4(bk, chunk_step(k_lane, kk) + k_slot + nt2 * 16 * ROW_BYTES);
#pragma unroll
                    for (int mt = 0; mt < M_TILES; ++mt) {
                        mma_16816<T>(acc_s[mt][2 * nt2], a[mt], bk[0], bk[1]);
                        mma_16816<T>(acc_s[mt][2 * nt2 + 1], a[mt], bk[2], bk[3]);
                    }
                }
            }
        }
    };

    // Masks the key tile that starts at key0 (relative to kb, as every key below; callers skip the tiles
    // that need no mask: all but the key tail, the causal diagonal and a window's left edge, needs_mask).
    // Column c = nt*8 + (lane%4)*2 + e of the tile is masked iff c >= key_lim, c > diag_lim (causal) or
    // c < lo_lim (WIN: a window's left edge; a compile-time flag, so that calls without a window run
    // the two compares they always did). Row mt*16 + hr*8 of this lane's (relative to its first) has its
    // limits at diag_base and lo_base plus that offset: one register each, the offsets compile-time.
    auto mask_win = [&](STile& acc_s, int key0, auto win) {
        constexpr bool WIN = decltype(win)::value;
        const int key_lim = p.Sk - kb - key0 - (lane % 4) * 2;
        const int base = row0 + wrow + lane / 4 - kb - key0 - (lane % 4) * 2;
        const int diag_base = causal ? base + band.hi : INT_MAX / 2;
        const int lo_base = base + band.lo;
#pragma unroll
        for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
#pragma unroll
                for (int nt = 0; nt < N_TILES; ++nt)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int c = nt * 8 + e, c_row = c - mt * 16 - hr * 8;  // c against this row's limits
                        if (c >= key_lim || c_row > diag_base || (WIN && c_row < lo_base))
                            acc_s[mt][nt][2 * hr + e] = -INFINITY;
                    }
            }
    };
    auto mask = [&](STile& acc_s, int key0) {
        if (windowed) mask_win(acc_s, key0, std::true_type{});
        else mask_win(acc_s, key0, std::false_type{});
    };
    auto needs_mask = [&](int key0) {
        const int key = kb + key0;
        return key + BC > p.Sk || (causal && key + BC - 1 > row0 + band.hi) ||
               (windowed && key < row0 + BR - 1 + band.lo);
    };

    // Online softmax: new row max, P = exp2(S*scale_log2 - m) in place, rescale l and O.
    auto softmax = [&](STile& acc_s) {
        float corr[M_TILES][2];
        bool rescale = false;    // does any row of this lane's fragments have a new max?
        bool voted[M_TILES][2];  // ROW_VOTES: has any of the warp's 8 rows (mt, hr) a new max?
#pragma unroll
        for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
                float mx = -INFINITY;
#pragma unroll
                for (int nt = 0; nt < N_TILES; ++nt)
                    mx = fmaxf(mx, fmaxf(acc_s[mt][nt][2 * hr], acc_s[mt][nt][2 * hr + 1]));
                const float m_new = fmaxf(m_i[mt][hr], quad_max(mx) * scale_log2);
                // A row with no visible key yet keeps m = -inf; use 0 so exp2 gives 0, not NaN.
                const float m_use = m_new == -INFINITY ? 0.f : m_new;
                corr[mt][hr] = fast_exp2(m_i[mt][hr] - m_use);
                if constexpr (Tile::ROW_VOTES) voted[mt][hr] = __any_sync(0xffffffffu, m_new != m_i[mt][hr]);
                else rescale |= m_new != m_i[mt][hr];
                m_i[mt][hr] = m_new;
                float rs = 0.f;
#pragma unroll
                for (int nt = 0; nt < N_TILES; ++nt)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const float pe = fast_exp2(fmaf(acc_s[mt][nt][2 * hr + e], scale_log2, -m_use));
                        acc_s[mt][nt][2 * hr + e] = pe;
                        rs += pe;
                    }
                l_i[mt][hr] = l_i[mt][hr] * corr[mt][hr] + rs;
            }
        // Once the row maxima settle (most tiles of a long row), corr == 1 and
        // the O rescale is skipped; votes keep the branches warp-uniform. With
        // ROW_VOTES one vote per 8 rows (registers e / 2 == hr of m-tile mt
        // hold rows hr*8 .. hr*8+7 of it), which settle sooner than a warp's.
        if constexpr (Tile::ROW_VOTES) {
#pragma unroll
            for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
                for (int hr = 0; hr < 2; ++hr)
                    if (voted[mt][hr]) {
#pragma unroll
                        for (int dt = 0; dt < D_TILES; ++dt) {
                            acc_o[mt][dt][2 * hr] *= corr[mt][hr];
                            acc_o[mt][dt][2 * hr + 1] *= corr[mt][hr];
                        }
                    }
        } else {
            if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
                for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
                    for (int dt = 0; dt < D_TILES; ++dt)
#pragma unroll
                        for (int e = 0; e < 4; ++e) acc_o[mt][dt][e] *= corr[mt][e / 2];
            }
        }
    };

    // P packed to 16 bits in the A-fragment layout of P V: key tiles 2kk, 2kk+1 form fragment kk.
    auto pack_tile = [&](PTile& p_frag, const STile& acc_s) {
#pragma unroll
        for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
            for (int kk = 0; kk < BC / 16; ++kk)
                pack_a_from_c<T>(p_frag[mt][kk], acc_s[mt][2 * kk], acc_s[mt][2 * kk + 1]);
    };

    // O += P V for the V tile at byte offset v_slot; P is p_frag when packed early,
    // else packed here from the probabilities in acc_s.
    auto pv = [&](const STile& acc_s, const PTile& p_frag, bool packed, uint32_t v_slot) {
#pragma unroll
        for (int kk = 0; kk < BC / 16; ++kk) {
            uint32_t a[M_TILES][4];
#pragma unroll
            for (int mt = 0; mt < M_TILES; ++mt) {
                if (packed) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) a[mt][e] = p_frag[mt][kk][e];
                } else {
                    pack_a_from_c<T>(a[mt], acc_s[mt][2 * kk], acc_s[mt][2 * kk + 1]);
                }
            }
#pragma unroll
            for (int dt2 = 0; dt2 < D_TILES / 2; ++dt2) {
                uint32_t bv[4];  // V keys kk*16.. (transposed): {d 0-7 k 0-7, d 0-7 k 8-15, d 8-15 k 0-7, d 8-15 k 8-15}
                ldmatrix_x4_trans(bv, chunk_step(v_lane, dt2) + v_slot + kk * 16 * ROW_BYTES);
#pragma unroll
                for (int mt = 0; mt < M_TILES; ++mt) {
                    mma_16816<T>(acc_o[mt][2 * dt2], a[mt], bv[0], bv[1]);
                    mma_16816<T>(acc_o[mt][2 * dt2 + 1], a[mt], bv[2], bv[3]);
                }
            }
        }
    };
    constexpr uint32_t SLOT_BYTES = BC * ROW_BYTES;  // one K (or V) slot

    if constexpr (Tile::PIPE) {
        // Software-pipelined ring: O += P_{j-1} V_{j-1} is issued in the same
        // straight-line block as the softmax of S_j, so one warp's mma.sync
        // (tensor pipe) and exp2 (MUFU) overlap; the O rescale by corr_j follows
        // both. Tile j-1's V stays resident during iteration j, so the ring has
        // STAGES >= 3 slots: j-1 (V), j (K, V) and the refills ahead of j.
        cp_async_wait<STAGES - 2>();  // this thread's copies of Q and tile 0 have landed
        __syncthreads();              // orders every thread's Q and tile-0 copies before any warp reads them
        STile acc_s;
        PTile p_prev;  // P of the previous tile, waiting for its P V
        qk(acc_s, 0);
        if (needs_mask(0)) mask(acc_s, 0);
        softmax(acc_s);
        pack_tile(p_prev, acc_s);
        for (int j = 1; j < n_blocks; ++j) {
            cp_async_wait<STAGES - 3>();  // this thread's copies of tile j have landed
            __syncthreads();  // orders every thread's tile-j copies before any warp reads them, and every
                              // warp's reads of tile j-2 (S_{j-2}, P_{j-2} V_{j-2}) before the refill below
            const int jn = j + STAGES - 2;  // refills tile j-2's slot
            if (jn < n_blocks) load_kv(jn);
            cp_async_commit();
            qk(acc_s, (j % STAGES) * SLOT_BYTES);
            const int key0 = j * BC;
            if (needs_mask(key0)) mask(acc_s, key0);
            pv(acc_s, p_prev, true, ((j - 1) % STAGES) * SLOT_BYTES);
            softmax(acc_s);
            pack_tile(p_prev, acc_s);
        }
        pv(acc_s, p_prev, true, ((n_blocks - 1) % STAGES) * SLOT_BYTES);
    } else {
        for (int j = 0; j < n_blocks; ++j) {
            // Refill the slot that iteration j-1 finished with (the barrier at the
            // end of j-1 guarantees no warp still reads it).
            const int jn = j + STAGES - 1;
            if constexpr (Tile::STAGGER) {
                cp_async_wait<0>();  // this thread's copies of K_j (and Q) have landed
                __syncthreads();     // orders every thread's K_j copies before any warp reads them, and every
                                     // warp's reads of V_{j-1} (P V) before V_j overwrites the V slot
                // V_j, in its own group, lands during S_j and the softmax (issued after S_j, it
                // waited on the tail of it: perf notes, session 17, +3-5 % at D = 256).
                load_tile<DP, BC, THREADS>(sV, v + (j * BC + thr_row) * p.v_row_stride + thr_col, v, p.v_row_stride,
                                           min(BC, p.Sk - kb - j * BC), p.D, tid);
                cp_async_commit();
            } else if (jn < n_blocks) {
                load_kv(jn);
            }
            if constexpr (!Tile::STAGGER) {
                cp_async_commit();
                cp_async_wait<STAGES - 1>();  // this thread's copies of tile j (and Q) have landed
                __syncthreads();              // orders every thread's tile-j copies before any warp reads them
            }

            const uint32_t slot_off = (j % STAGES) * SLOT_BYTES;  // byte offset of this tile's K and V slots
            STile acc_s;
            qk(acc_s, slot_off);

            const int key0 = j * BC;
            if (needs_mask(key0)) mask(acc_s, key0);
            softmax(acc_s);

            // With the stagger at DP = 128, P is packed to 16 bits before the V
            // wait, so the fp32 scores die early: without it that kernel spills.
            constexpr bool EARLY_P = Tile::STAGGER && DP == 128;
            PTile p_frag;
            if constexpr (EARLY_P) pack_tile(p_frag, acc_s);

            if constexpr (Tile::STAGGER) {
                cp_async_wait<0>();  // this thread's copies of V_j have landed
                __syncthreads();     // orders every thread's V_j copies before any warp reads them, and every
                                     // warp's reads of K_j (S) before K_{j+1} overwrites the K slot
                if (j + 1 < n_blocks) {
                    load_tile<DP, BC, THREADS>(sK, k_thr + (j + 1) * k_tile_stride, k, p.k_row_stride,
                                               min(BC, p.Sk - kb - (j + 1) * BC), p.D, tid);
                    cp_async_commit();
                }
            }
            pv(acc_s, p_frag, EARLY_P, slot_off);
            if constexpr (!Tile::STAGGER)
                __syncthreads();  // every warp is done reading slot j % STAGES before iteration j+1 refills it
        }
    }
    cp_async_wait<0>();  // drain the (empty) trailing groups before smem is reused

    // Epilogue: O /= l, staged through this warp's own Q rows (no other warp
    // reads them), then 16-byte coalesced stores; LSE = (m + log2 l) * ln 2.
    if (LATE_OUT_PTRS) { o = out_ptr(); lse = lse_ptr(); }
#pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const float l = quad_sum(l_i[mt][hr]);
            const float inv = l > 0.f ? 1.f / l : 0.f;  // (a NaN row: acc is NaN, and NaN * 0 stays NaN)
            const int r = wrow + mt * 16 + lane / 4 + hr * 8;
#pragma unroll
            for (int dt = 0; dt < D_TILES; ++dt) {
                const uint32_t packed = pack2<T>(acc_o[mt][dt][2 * hr] * inv, acc_o[mt][dt][2 * hr + 1] * inv);
                *reinterpret_cast<uint32_t*>(sQ + swz<DP>(r, dt) + (lane % 4) * 2) = packed;
            }
            if (lse && lane % 4 == 0 && r < q_rows)
                lse[r] = l != 0.f ? (m_i[mt][hr] + log2f(l)) * FC_LN2 : -INFINITY;
        }
    __syncwarp();  // this warp's O rows in smem are complete before its lanes read them back
    // Lane l stores chunk l % CHUNKS of rows l / CHUNKS + i * ROW_STEP (a running pointer).
    constexpr int ROW_STEP = 32 / Tile::CHUNKS > 0 ? 32 / Tile::CHUNKS : 1;
    constexpr int LANES_PER_ROW = Tile::CHUNKS < 32 ? Tile::CHUNKS : 32;
    const int c_first = lane % LANES_PER_ROW, r_first = lane / LANES_PER_ROW;
    static_assert(Tile::CHUNKS <= 32, "one row must fit in one warp pass");
    T* o_thr = o + (wrow + r_first) * p.o_row_stride + c_first * 8;
    const bool col_ok = c_first * 8 < p.D;
#pragma unroll
    for (int i = 0; i < M_TILES * 16 / ROW_STEP; ++i) {
        const int r = wrow + r_first + i * ROW_STEP;
        if (col_ok && r < q_rows)
            *reinterpret_cast<uint4*>(o_thr) = *reinterpret_cast<const uint4*>(sQ + swz<DP>(r, c_first));
        o_thr += ROW_STEP * p.o_row_stride;
    }
}

// ---------------------------------------------------------------------------
// Launcher and the C entry points of one padded head dim (see kernels.h)

template <int DP, int MT, typename T>
static fc_status attn_fwd_sm80_launch(const fc_attn_params* p, cudaStream_t stream) {
    using Tile = Sm80Tile<DP, MT>;
    const size_t smem = Tile::SMEM_BYTES;
    if (fc_smem_limit_once<attn_fwd_sm80_kernel<DP, MT, T>>((int)smem) != cudaSuccess) return FC_ERR_CUDA;
    const unsigned grid = (unsigned)((p->Sq + Tile::BR - 1) / Tile::BR) * (unsigned)(p->B * p->Hq);
    attn_fwd_sm80_kernel<DP, MT, T><<<grid, Tile::THREADS, smem, stream>>>(*p, FC_BAND(*p));
    return cudaGetLastError() == cudaSuccess ? FC_OK : FC_ERR_CUDA;
}

#define FC_SM80_DEFINE(DP)                                                                    \
    extern "C" fc_status fc_sm80_fwd_d##DP(const fc_attn_params* p, fc_stream_t stream) {    \
        return p->dtype == FC_DTYPE_BF16                                                      \
                   ? attn_fwd_sm80_launch<DP, Sm80Tile<DP>::M_TILES, __nv_bfloat16>(p, (cudaStream_t)stream) \
                   : attn_fwd_sm80_launch<DP, Sm80Tile<DP>::M_TILES, __half>(p, (cudaStream_t)stream); \
    }                                                                                         \
    extern "C" size_t fc_sm80_smem_d##DP(void) { return Sm80Tile<DP>::SMEM_BYTES; }

// The BR = 64 variant for small grids (see the tile table).
#define FC_SM80_DEFINE_SMALL(DP)                                                              \
    extern "C" fc_status fc_sm80_fwd_small_d##DP(const fc_attn_params* p, fc_stream_t stream) { \
        return p->dtype == FC_DTYPE_BF16                                                      \
                   ? attn_fwd_sm80_launch<DP, 1, __nv_bfloat16>(p, (cudaStream_t)stream)      \
                   : attn_fwd_sm80_launch<DP, 1, __half>(p, (cudaStream_t)stream);            \
    }
