// attn_sm90_order.cuh -- the persistent tile order of the Hopper attention
// kernel (attn_fwd_sm90.cuh) and its arguments: division by launch constants
// (Sm90Div), the order's host-computed part (Sm90Sched), the causal CTA pairs'
// host plan (Sm90Plan), a CTA's positions in the order (Sm90Pos), the kernel
// parameters (Sm90Args), and where each tile lies (sm90_tile, sm90_tile_magic)
// with the causal windows of heads that keep a head's K/V in L2
// (sm90_causal_window, sm90_last_window). Shared by the kernel and the host
// launcher (attn_fwd_sm90_launch.cuh).
#pragma once

#include <cuda.h>
#include <stdint.h>

#include <type_traits>

#include "../flashcore.h"
#include "../kernels.h"

// ---------------------------------------------------------------------------
// Tile order

// Division by a number fixed for a launch, as a multiply and a shift:
// n / d == (umulhi(n, mul) + n) >> shift for 0 <= n < 2^31 and 1 <= d < 2^31,
// with shift = ceil(log2 d) and mul = floor(2^32 (2^shift - d) / d) + 1
// (Granlund and Montgomery's method for invariant divisors; n < 2^31 keeps the
// add within 32 bits). A runtime `/` costs a float reciprocal and a dozen
// dependent instructions; the persistent tile loop did five per tile.
struct Sm90Div {
    uint32_t mul;    // magic multiplier
    uint32_t shift;  // ceil(log2 d)
};
static inline Sm90Div sm90_div(int d) {
    uint32_t shift = 0;
    while ((1ull << shift) < (unsigned long long)d) ++shift;
    const unsigned long long mul = ((1ull << 32) * ((1ull << shift) - (unsigned long long)d)) / (unsigned long long)d + 1;
    return {(uint32_t)mul, shift};
}
__device__ __forceinline__ int sm90_quot(int n, Sm90Div v) {
    return (int)((__umulhi((uint32_t)n, v.mul) + (uint32_t)n) >> v.shift);
}

#include "attn_sm90_tail.cuh"  // (after Sm90Div, which it uses)

// The persistent tile order of one launch (sm90_tile), computed on the host.
struct Sm90Sched {
    int br;              // query rows per tile
    int n_mblocks;       // query blocks per (batch, head)
    int n_tiles;         // n_mblocks x B x Hq
    int window;          // causal: heads per window (sm90_causal_window)
    int last_window;     // causal: index of the last window (sm90_last_window; every kernel reads it)
    int last_heads;      // causal: heads in the last window
    Sm90Div by_grid;     // CTAs
    Sm90Div by_mblocks;  // n_mblocks
    Sm90Div by_hq;       // Hq
    Sm90Div by_group;    // Hq / Hkv
    Sm90Div by_wtiles;   // causal: tiles per full window, window x n_mblocks
    Sm90Div by_window;   // causal: window
    Sm90Div by_last;     // causal: last_heads
};

// A tile order planned on the host (sm90_plan), for the causal CTA pairs at
// D = 256, passed as a second kernel parameter: cluster c takes the tiles
// numbered tile[first[c]] .. tile[first[c + 1] - 1] (sm90_tile_magic's
// numbering, snake included), in that order. The static order gives each
// cluster every grid-th tile, which leaves the clusters' causal work 3-6 %
// apart (perf notes, sessions 28 and 30); the plan gives each tile, longest
// first within its window of heads, to the cluster with the least work so far.
static constexpr int SM90_PLAN_TILES = 1024;  // most tiles a plan holds (the grid's D = 256 pair calls: 512)
static constexpr int SM90_PLAN_GRID = 192;    // most clusters a plan holds
struct Sm90Plan {
    static constexpr bool PLAN = true, PERM = false;
    int n;                                  // tiles planned; 0: the static order
    uint16_t first[SM90_PLAN_GRID + 1];     // cluster c's tiles start at tile[first[c]]
    uint16_t tile[SM90_PLAN_TILES];         // tile numbers, cluster by cluster
};
// The static order's positions with other tiles at them (sm90_row_plan), for
// non-causal calls on 192-key K/V tiles (three D = 64 consumers) whose last
// query block is short:
// a CTA runs as many tiles as in the static order, so only the producer, which
// hands each tile's coordinates to the consumers (TILE_INFO), reads the plan.
static constexpr int SM90_ROW_PLAN_TILES = 4096;  // the grid's D = 64 calls: 2752-3072 (8 KB of kernel parameters)
struct Sm90RowPlan {
    static constexpr bool PLAN = false, PERM = true;
    int n;                               // tiles planned; 0: the static order
    uint16_t tile[SM90_ROW_PLAN_TILES];  // the tile at static position x (sm90_tile's numbering, rotation included)
};
struct Sm90NoPlan {  // the second kernel parameter of every other instantiation
    static constexpr bool PLAN = false, PERM = false;
};
// Which plan an instantiation takes: the D = 256 pairs a Sm90Plan, the static
// order's 192-key D = 64 kernel (Sm90Tile::WIDE_KV) a Sm90RowPlan. (With one,
// the 128-key three-consumer kernel's consumers compiled differently and
// S = 512-1k gained nothing; perf notes, session 38.)
template <int DP, int CONS, bool LONG, int CL, bool DYN, bool KV_SPLIT>
using Sm90PlanOf = std::conditional_t<
    DP == 256 && CL == 2, Sm90Plan,
    std::conditional_t<DP == 64 && CONS == 3 && LONG && CL == 1 && !DYN && !KV_SPLIT, Sm90RowPlan, Sm90NoPlan>>;

// A CTA's (cluster's) positions in the tile order: first(), then next(pos), ...
// below end(), and the tile at each, at(pos). The static order takes every
// (gridDim.x / CL)-th position, a tile each; a host plan hands each cluster its
// own run of the plan's list; a row plan (Sm90RowPlan) only puts other tiles at
// the static order's positions. (Without a plan these are the expressions the
// kernel always had: ptxas keeps those kernels' code as measured.) TAIL: the
// kernel may split its last stripe (Sm90Tail): the positions past tail.main are
// the cluster's tail pieces (sm90_piece), and end() follows them.
template <int CL, typename Plan, bool TAIL = false>
struct Sm90Pos {
    static constexpr bool PLAN = Plan::PLAN;
    const Plan& plan;      // the kernel's plan parameter
    int n_tiles;           // tiles in the static order
    const Sm90Tail& tail;  // the launch's split tail (TAIL kernels read it)
    __device__ __forceinline__ int first() const {
        if constexpr (PLAN) {
            if (plan.n > 0) return plan.first[blockIdx.x / CL];
        }
        return blockIdx.x / CL;
    }
    __device__ __forceinline__ int end() const {
        if constexpr (PLAN) {
            if (plan.n > 0) return plan.first[blockIdx.x / CL + 1];
        }
        if constexpr (TAIL) {
            if (tail.main > 0) return sm90_tail_end(tail, blockIdx.x / CL, gridDim.x / CL);
        }
        return n_tiles;
    }
    __device__ __forceinline__ int next(int pos) const {
        if constexpr (PLAN) {
            if (plan.n > 0) return pos + 1;
        }
        return (int)(pos + gridDim.x / CL);  // (unsigned, as it always was)
    }
    __device__ __forceinline__ int at(int pos) const {
        if constexpr (PLAN || Plan::PERM) {
            if (plan.n > 0) return plan.tile[pos];
        }
        return pos;
    }
};

// Kernel parameters: the three TMA maps plus the call's params.
struct Sm90Args {
    CUtensorMap q_map;  // Q as (D, Sq, Hq, B), box (64, tile rows: BR, or WG_ROWS in key-split mode and Q_HALVES)
    CUtensorMap k_map;  // K as (D, Sk, Hkv, B), box (64, BC)
    CUtensorMap v_map;  // V as (D, Sk, Hkv, B), box (64, BC)
    fc_attn_params p;   // shapes, strides, O/LSE pointers, scale, causal mode
    Sm90Sched sched;    // tile order
    unsigned int* tile_counter;  // dynamic order: tickets drawn, zero before the launch (and after it)
    Sm90Tail tail;      // non-causal: the last stripe split by key ranges (attn_sm90_tail.cuh); main = 0: not
#ifdef FC_SM90_TRACE
    unsigned long long* trace;  // timeline records (trace.cuh), or null
#endif
};

// Where tile `tile` lies and how many K/V tiles it visits. Producer and
// consumers call this with the same arguments and get the same answer.
struct Sm90TileCoord {
    int b, h, hk;   // batch, query head, KV head
    int row0;       // first query row (negative in a PAD_FIRST kernel's first causal block)
    int n_blocks;   // K/V tiles with at least one visible key (a tail piece: one past its last)
    int kv0;        // the first K/V tile: 0, or a tail piece's (set by the kernel's coord_at, TAIL only)
};

// The K/V tiles of `bc` keys that a tile of `br` query rows from row0 visits:
// all of them, or with a causal mask those up to its last row's last key.
// (sm90_plan on the host counts a tile's work with the same function.)
__host__ __device__ __forceinline__ int sm90_kv_tiles(const fc_attn_params& p, int row0, int br, int bc) {
    int n = (p.Sk + bc - 1) / bc;
    if (p.causal != FC_CAUSAL_NONE) {
        const int diag = p.causal == FC_CAUSAL_BOTTOM_RIGHT ? p.Sk - p.Sq : 0;
        const int last_key = min(row0 + br, p.Sq) - 1 + diag;
        n = last_key < 0 ? 0 : min(n, last_key / bc + 1);
    }
    return n;
}

// A windowed tile's K/V tiles (the WIN instantiation): kv0 .. n - 1, from the
// tile of its first row's first key (kernels.h's fc_band, left edge) to that
// of its last row's last key (right edge, or the causal diagonal), kv0 <= n.
// (n repeats sm90_kv_tiles with the band's bound: both calling one helper
// changed the SASS of the kernels without a window, checked in session 73.)
struct Sm90WinRange {
    int kv0, n;
};
__device__ __forceinline__ Sm90WinRange sm90_win_range(const fc_attn_params& p, int row0, int br, int bc) {
    const fc_band band = FC_BAND(p);
    Sm90WinRange r;
    r.n = (p.Sk + bc - 1) / bc;
    if (band.has_hi) {
        const int last_key = min(row0 + br, p.Sq) - 1 + band.hi;
        r.n = last_key < 0 ? 0 : min(r.n, last_key / bc + 1);
    }
    r.kv0 = fc_band_first_block(band, row0, bc, r.n);
    return r;
}

// CTA c runs tiles c, c + grid, c + 2 grid, ... (`tile`). Causal tiles are
// numbered longest first, and the tiles of every odd full stripe of `grid` are
// taken in reverse order (a snake): the CTA that gets the longest tile of one
// stripe gets the shortest of the next, so CTAs' total work differs by about
// one tile's length instead of growing with the number of stripes. Non-causal
// tiles are alike (but for padding, see ROTATE) and take no snake (it measured
// 1-4 % slower there, perf notes "sm90 v5").
//
// Causal tiles go in windows of `window` heads (sm90_causal_window): inside a
// window, longest first across its heads. Numbered longest first across all
// heads instead, the CTAs running at one time work on as many heads as there
// are CTAs, one query block each, and a head's K/V is fetched from HBM once
// per query block; in a window, several query blocks of a head run together
// and share its K/V in L2 (measured: causal S = 1k +12-52 %, perf notes).
// CL: CTAs per cluster; a cluster takes the tiles (of CL x br rows) that one CTA would.
// SNAKE: false for the dynamic order (Sm90Args::tile_counter), where CTAs take
// tiles as they finish and there are no stripes to balance. (A template flag: as
// a runtime argument, even a constant one, it changed the D = 128 kernels' SASS.)
// MERGE: the last window is number last_w and holds the heads left over (see
// sm90_last_window); otherwise last_w is not read (a template flag, so that the
// kernels that do not merge keep their code).
// ROTATE (non-causal; Sm90Tile::PAD_SKIP): the query blocks of one head keep
// their adjacent tiles, but block (i + s) % n_mblocks takes the i-th of them,
// s being the stripe of the head's first tile. When n_mblocks divides the grid
// CTA c would otherwise always get block c % n_mblocks, and the CTAs that get
// the short last block (padding rows skipped) would always get it.
template <int BC, bool PAD_FIRST, bool SNAKE = true, int CL = 1, bool MERGE = false, bool ROTATE = false>
__device__ __forceinline__ Sm90TileCoord sm90_tile(const fc_attn_params& p, int tile, int n_tiles, int n_mblocks,
                                                   int br, int window, int last_w) {
    const int grid = gridDim.x / CL, stripe = tile / grid;
    if (SNAKE && p.causal != FC_CAUSAL_NONE && (stripe & 1) && (stripe + 1) * grid <= n_tiles)
        tile = stripe * grid + grid - 1 - (tile - stripe * grid);
    const int n_bh = p.B * p.Hq;
    int mblock, bh;
    if (p.causal != FC_CAUSAL_NONE) {  // longest tiles (last query blocks) first, per window of heads
        const int per_window = window * n_mblocks;
        const int w = MERGE ? min(tile / per_window, last_w) : tile / per_window, i = tile - w * per_window;
        // (merged, the last window holds every head left)
        const int heads = MERGE && w == last_w ? n_bh - w * window : min(window, n_bh - w * window);
        mblock = n_mblocks - 1 - i / heads;
        bh = w * window + i % heads;
    } else {  // query blocks of one head adjacent: they share K/V in L2
        mblock = tile % n_mblocks;
        bh = tile / n_mblocks;
        if (ROTATE) mblock = (mblock + bh * n_mblocks / grid) % n_mblocks;
    }
    Sm90TileCoord t;
    t.h = bh % p.Hq;
    t.b = bh / p.Hq;
    t.hk = t.h / (p.Hq / p.Hkv);
    t.row0 = mblock * br - (PAD_FIRST && p.causal != FC_CAUSAL_NONE ? n_mblocks * br - p.Sq : 0);  // Sm90Tile::PAD_FIRST
    t.n_blocks = sm90_kv_tiles(p, t.row0, br, BC);
    return t;
}

// The same order with Sm90Sched's multipliers in place of `/` (see Sm90Div).
// Both versions stay: with this one ptxas scheduled the D = 128 and the
// three-consumer kernels worse (see Sm90Tile::MAGIC_DIV). The last lines
// repeat sm90_kv_tiles on purpose: calling it changed the measured SASS
// (checked again in session 31).
template <int BC, bool SNAKE = true, int CL = 1>
__device__ __forceinline__ Sm90TileCoord sm90_tile_magic(const fc_attn_params& p, const Sm90Sched& o, int tile) {
    const int grid = gridDim.x / CL, stripe = sm90_quot(tile, o.by_grid);
    if (SNAKE && p.causal != FC_CAUSAL_NONE && (stripe & 1) && (stripe + 1) * grid <= o.n_tiles)
        tile = stripe * grid + grid - 1 - (tile - stripe * grid);
    int mblock, bh;
    if (p.causal != FC_CAUSAL_NONE) {
        const int w = min(sm90_quot(tile, o.by_wtiles), o.last_window), i = tile - w * o.window * o.n_mblocks;
        const bool last = w == o.last_window;
        const int q = sm90_quot(i, last ? o.by_last : o.by_window);
        mblock = o.n_mblocks - 1 - q;
        bh = w * o.window + i - q * (last ? o.last_heads : o.window);
    } else {
        bh = sm90_quot(tile, o.by_mblocks);
        mblock = tile - bh * o.n_mblocks;
    }
    Sm90TileCoord t;
    t.b = sm90_quot(bh, o.by_hq);
    t.h = bh - t.b * p.Hq;
    t.hk = sm90_quot(t.h, o.by_group);
    t.row0 = mblock * o.br;
    t.n_blocks = (p.Sk + BC - 1) / BC;
    if (p.causal != FC_CAUSAL_NONE) {
        const int diag = p.causal == FC_CAUSAL_BOTTOM_RIGHT ? p.Sk - p.Sq : 0;
        const int last_key = min(t.row0 + o.br, p.Sq) - 1 + diag;
        t.n_blocks = last_key < 0 ? 0 : min(t.n_blocks, last_key / BC + 1);
    }
    return t;
}

// Heads per causal window (fc_sm90_window_heads, kernels.h, and the cap):
// 2 grid / gcd(2 grid, n_mblocks), so that a window
// is a whole number of stripe pairs and the snake keeps CTAs' work even
// (33 heads on 132 SMs for 8 or 16 query blocks per head), at most all heads.
// When a head's query blocks divide the grid and that window's K and V
// (kv_head_bytes per head) exceed FC_SM90_WINDOW_KV_BYTES, a window is one stripe
// instead (half the heads): consecutive stripes hold the same mix of tile
// lengths, so the snake still pairs them, and fewer heads share the L2
// (S = 512: 33 heads, not 66; D = 256 DRAM reads 265 -> 206 MB, perf notes).
// Below the threshold the stripe pairs stay: there one-stripe windows measured
// 5 % slower (D = 64 causal S4k, 6-head windows), probably because the last,
// partial window still holds the longest tiles and runs them last.
// `cap` (the orders that balance any window: the three-consumer dynamic one,
// sm90_window_cap, and the host's plan) also keeps a window's K and V within
// FC_SM90_WINDOW_CAP_BYTES, about half the 50 MB L2: otherwise long causal rows
// make a window of every head (S8k D = 128: 32 heads of 4 MB), whose K/V come
// from HBM again and again (D = 256 causal 8k: 681 MB of HBM reads, 255 MB
// capped). Measured on an H100 (perf notes, session 33, REPS = 600): D = 256
// causal 2k +6.6 %, 4k +8.6 %, 8k +3.7 %, 16k +4.5 %; D = 128 causal 8k +4.3 %,
// 16k +1.6 %. The static order (D = 64) keeps its windows, which its snake
// needs (capped: 1 % slower at 16k, and DRAM reads 1.53 GB -> 0.36 GB at 8k
// with no gain); where they would not fit under the cap, D = 64 takes the
// dynamic order instead (fc_sm90_d64_dynamic, kernels.h; session 34).
__host__ __device__ inline int sm90_causal_window(int grid, int n_mblocks, int n_bh, long long kv_head_bytes,
                                                  bool cap) {
    int heads = fc_sm90_window_heads(grid, n_mblocks, n_bh, kv_head_bytes);
    if (cap && heads * kv_head_bytes > FC_SM90_WINDOW_CAP_BYTES)
        heads = kv_head_bytes < FC_SM90_WINDOW_CAP_BYTES ? (int)FC_SM90_WINDOW_CAP_BYTES / (int)kv_head_bytes : 1;
    return heads < n_bh ? heads : n_bh;
}

// The index of the last causal window of n_bh heads. With `merge` (the static
// order, and the three-consumer dynamic one) the heads left over after the
// full windows join the last full window instead of forming a short window of
// their own, as long as that window's K and V stay within SM90_MERGE_KV_BYTES
// of L2. A short last window holds long tiles (its heads' last query blocks)
// that start near the end of the launch, and then only some CTAs have work:
// the CTAs' ends were measured up to 12 % apart (perf notes, session 27).
// Merged, those tiles start while the last full window's short ones run.
// Measured on an H100 (perf notes, session 28): causal D128 2k +1.4 % and 4k
// +2 % in the static order, +4-5 % in the dynamic one, D64 4k +1.8 %; D256
// causal 2k (CTA pairs, 33-head windows of 2 MB heads) 9 % slower with its two
// windows merged into 128 MB, hence the bound.
static constexpr long long SM90_MERGE_KV_BYTES = 32ll << 20;
static inline int sm90_last_window(int n_bh, int window, long long kv_head_bytes, bool merge) {
    const int full = n_bh / window;
    if (merge && (long long)(n_bh - (full - 1) * window) * kv_head_bytes <= SM90_MERGE_KV_BYTES) return full - 1;
    return (n_bh - 1) / window;
}
