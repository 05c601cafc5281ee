// bwd_rows.cuh -- what the portable (csrc/sm80/attn_bwd_sm80.cuh) and the
// Hopper (csrc/sm90/attn_bwd_sm90.cuh) backward share: the per-row kernels
// (DP / 8 threads per row, each 8 columns, 16 bytes of T), the workspace and
// its dQ accumulator's layout, and the blocks a main kernel's item walks.
//
//  attn_bwd_prep_kernel: Delta_i = sum_d dO_id O_id (fp32, over Dv) per query row,
//    minus dlse_i when the caller passes an LSE gradient, LSE_i * log2(e)
//    (+inf for rows that see no key; the Hopper kernel reads it), and the fp32
//    dQ accumulator, the Hopper kernel's item counter and a deterministic
//    call's turn counters zeroed. The per-row vectors hold (B, Hq, sq_pad)
//    rows, sq_pad = Sq rounded up to FC_BWD_ROW_PAD (bwd_sq_pad); padding rows
//    get Delta = 0 and LSE * log2(e) = +inf (so their P is 0).
//  attn_bwd_post_kernel: dQ = scale * accumulator, converted to T, strided.
//
// Workspace layout (kernels.h), the same for both main kernels: the fp32
// accumulator (B, Hq, sq_pad, DP) in 64 x 64 pieces (bwd_piece), then Delta
// and LSE * log2(e), (B, Hq, sq_pad) each, then the Hopper kernel's int32 item
// counter, then a deterministic call's int32 turn counters, one per piece.
#pragma once

#include <cuda_runtime.h>
#include <math.h>

#include "../flashcore.h"
#include "../kernels.h"
#include "ptx.cuh"

static constexpr int BWD_ROW_THREADS = 128;
static constexpr int BWD_ROW_MAX_GRID = 1 << 20;  // CTAs of the row kernels; more rows loop

// The dQ accumulator, (B, Hq, sq_pad, DP) fp32, is kept in pieces of
// BWD_PIECE_ROWS x BWD_PIECE_COLS (a Hopper warpgroup's 64 x 64 wgmma
// accumulator), each contiguous in the fragment order the warpgroup stages it;
// in that order the C fragment of an m16n8 mma tile of a piece (rows from a
// multiple of 16, columns from a multiple of 8) is 256 contiguous bytes per
// 8-row half, 8 per lane (bwd_piece_offset), which the portable kernel adds
// with one 2-float reduction each.
static constexpr int BWD_PIECE_ROWS = FC_BWD_PIECE_DIM;
static constexpr int BWD_PIECE_COLS = FC_BWD_PIECE_DIM;
static constexpr int BWD_PIECE = BWD_PIECE_ROWS * BWD_PIECE_COLS;  // floats of a piece
static constexpr int BWD_PIECE_THREADS = 128;                      // the warpgroup that stages a piece

// Index of piece (64-row block m, counted over all (batch, head) pairs; 64-column slab): its
// first float is at index * BWD_PIECE (bwd_piece), its turn counter at index (bwd_piece_turns).
template <int DP>
FC_DEVICE int64_t bwd_piece_index(int64_t m, int slab) {
    return m * (DP / BWD_PIECE_COLS) + slab;
}
// First float of piece (m, slab).
template <int DP>
FC_DEVICE int64_t bwd_piece(int64_t m, int slab) {
    return bwd_piece_index<DP>(m, slab) * BWD_PIECE;
}

// Float offset of row r, column c inside a piece: thread t = 32 (r / 16) +
// 4 (r % 8) + (c % 8) / 2 of the warpgroup holds it in its register pair
// jj = 2 (c / 8) + (r % 16) / 8, stored at 2 (128 jj + t) + c % 2, so that
// consecutive threads write consecutive 8 bytes (and 8 columns of a row from
// a multiple of 8 are 8 consecutive floats).
static constexpr __host__ __device__ int bwd_piece_offset(int r, int c) {
    const int t = 32 * (r / 16) + 4 * (r % 8) + (c % 8) / 2, jj = 2 * (c / 8) + (r % 16) / 8;
    return 2 * (BWD_PIECE_THREADS * jj + t) + c % 2;
}

// Rows per (batch, head) of the accumulator and the per-row vectors: Sq rounded up to FC_BWD_ROW_PAD.
static inline __host__ __device__ int bwd_sq_pad(int Sq) {
    return (Sq + FC_BWD_ROW_PAD - 1) / FC_BWD_ROW_PAD * FC_BWD_ROW_PAD;
}

// The blocks a main kernel walks for one item: items are (key block of bc
// keys, KV head, batch), key blocks fastest (a deterministic call: the last one
// first), so that the items of one KV head run together and share its Q and dO
// in L2. The portable kernel's CTA takes item blockIdx.x; the Hopper kernel's
// persistent CTAs take their first there and the next ones from a counter. An item
// walks the G = Hq / Hkv query heads of its KV head and, per head, the br-row
// query blocks that see any of its keys:
// key j is visible to row i iff j < Sk, j <= i + diag (causal, or a window's
// right edge) and j >= i + lo (a window's left edge; kernels.h's fc_band), so
// the first row that sees key k0 is k0 - diag, the last that sees key
// k0 + bc - 1 is k0 + bc - 1 - lo, and the blocks outside are skipped.
struct BwdWalk {
    int hk, b;     // KV head and batch
    int G;         // query heads per KV head
    int k0;        // first key of the CTA
    bool causal;   // an upper bound: key j visible to row i only if j <= i + diag
    int diag;
    bool windowed; // a lower bound: key j visible to row i only if j >= i + lo
    int lo;
    int m_first;   // first query block (of br rows) a head's walk visits
    int per_head;  // query blocks per head
    int n_iter;    // (head, query block) pairs, head-major
};
// The band of p (kernels.h's fc_band) as a main kernel reads it: WIN, every
// field; otherwise (an instantiation for calls without a window) the causal
// mode's alone, has_lo a compile-time 0, so that its code is the one it had
// before windows.
template <bool WIN>
FC_DEVICE fc_band bwd_band(const fc_attn_bwd_params& p) {
    return WIN ? FC_BAND(p) : FC_CAUSAL_BAND(p);
}
// The first query block (of br rows) that sees key k0 (the number of blocks if none does).
template <bool WIN>
FC_DEVICE int bwd_m_first(const fc_attn_bwd_params& p, int k0, int br) {
    const fc_band band = bwd_band<WIN>(p);
    return !band.has_hi || k0 - band.hi <= 0 ? 0 : min((p.Sq + br - 1) / br, (k0 - band.hi) / br);
}
// One past the last query block (of br rows) that sees a key before k0 + bc.
template <bool WIN>
FC_DEVICE int bwd_m_end(const fc_attn_bwd_params& p, int k0, int bc, int br) {
    const fc_band band = bwd_band<WIN>(p);
    const int n_mblocks = (p.Sq + br - 1) / br, last_row = k0 + bc - 1 - band.lo;
    return !band.has_lo ? n_mblocks : last_row < 0 ? 0 : min(n_mblocks, last_row / br + 1);
}
// WIN: p may have a window (bwd_band).
template <bool WIN>
FC_DEVICE BwdWalk bwd_walk(const fc_attn_bwd_params& p, int bc, int br, unsigned item) {
    BwdWalk w;
    const int n_kblocks = (p.Sk + bc - 1) / bc;
    const int kb_i = (int)(item % n_kblocks), bhk = (int)(item / n_kblocks);
    const int kb = p.deterministic ? n_kblocks - 1 - kb_i : kb_i;  // deterministic: last key block first
    w.hk = bhk % p.Hkv;
    w.b = bhk / p.Hkv;
    w.G = p.Hq / p.Hkv;
    w.k0 = kb * bc;
    const fc_band band = bwd_band<WIN>(p);
    w.causal = band.has_hi;
    w.diag = band.hi;
    w.windowed = band.has_lo;
    w.lo = band.lo;
    w.m_first = bwd_m_first<WIN>(p, w.k0, br);
    w.per_head = WIN ? max(0, bwd_m_end<WIN>(p, w.k0, bc, br) - w.m_first) : (p.Sq + br - 1) / br - w.m_first;
    w.n_iter = w.per_head * w.G;
    return w;
}

// Deterministic dQ: the CTAs that add into one query block's dQ rows take
// turns, the last key block first (one counter per 64 x 64 piece; the portable
// kernel, which adds all of a 64-row block's columns in one turn, uses its
// first piece's). A counter holds how
// many have added; the CTA of key block kb waits for last - kb, adds, then
// counts itself. The CTAs that visit block m are those of key blocks 0 .. last
// (m_first grows with the key block), so every turn comes. Last first: a
// causal CTA's first block is its diagonal one, where it is the last key block,
// so no CTA waits on work that comes later in another CTA's walk (first first,
// the CTA of key block kb would wait for kb blocks of key block 0's walk).
// An item waits only on items of lower index (a deterministic call's items
// run the key blocks of a KV head last first, bwd_walk), and a deterministic
// call runs one CTA per item in both kernels, so a CTA waits only on CTAs of
// lower index, started no later than itself: a full GPU cannot hold a waiter
// whose turn never comes.
static constexpr int BWD_TURN_SLEEP_NS = 64;  // back-off between polls of a turn counter

// How many key blocks add into iteration it's query block (of br rows) before
// this CTA (of bc keys): those after it, up to the last one that visits the block.
// (With a window the blocks that visit m are still one run: m_first and
// bwd_m_end both grow with the key block.)
template <bool WIN>
FC_DEVICE int bwd_turn_rank(const fc_attn_bwd_params& p, const BwdWalk& w, int it, int bc, int br) {
    const int m = w.m_first + it % w.per_head;
    int lo = w.k0 / bc, hi = (p.Sk + bc - 1) / bc - 1;  // the last key block that visits m is in [lo, hi]
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (bwd_m_first<WIN>(p, mid * bc, br) <= m) lo = mid; else hi = mid - 1;
    }
    return lo - w.k0 / bc;
}

// Waits until *turn (a turn counter) reads mine; acquire: the counted adds are visible after it.
FC_DEVICE void bwd_poll_turn(const int* turn, int mine) {
    for (;;) {
        int seen;
        asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(turn) : "memory");
        if (seen == mine) return;
        __nanosleep(BWD_TURN_SLEEP_NS);
    }
}

// Adds 1 to a turn counter; release: this thread's earlier writes (and those it has observed) come first.
FC_DEVICE void bwd_count_turn(int* turn) {
    asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(turn) : "memory");
}

// The Hopper kernel's item counter (items handed out past the grid's first), after LSE * log2(e).
template <int DP>
FC_DEVICE unsigned* bwd_item_counter(const fc_attn_bwd_params& p, int sq_pad) {
    const int64_t n_vec = (int64_t)p.B * p.Hq * sq_pad;
    return reinterpret_cast<unsigned*>(static_cast<float*>(p.workspace) + n_vec * (DP + 2));
}
// The turn counters, one per piece (bwd_piece_index), after the item counter.
template <int DP>
FC_DEVICE int* bwd_piece_turns(const fc_attn_bwd_params& p, int sq_pad) {
    return reinterpret_cast<int*>(bwd_item_counter<DP>(p, sq_pad) + 1);
}

// The portable kernel's counter of iteration it's query block (of BWD_PIECE_ROWS rows): its first piece's.
template <int DP>
FC_DEVICE int* bwd_turn_at(const fc_attn_bwd_params& p, const BwdWalk& w, int it, int sq_pad) {
    const int64_t bh = (int64_t)w.b * p.Hq + w.hk * w.G + it / w.per_head;
    return bwd_piece_turns<DP>(p, sq_pad) +
           bwd_piece_index<DP>(bh * (sq_pad / BWD_PIECE_ROWS) + w.m_first + it % w.per_head, 0);
}

// Waits until the key blocks after this CTA's (of bc keys) have added into iteration it's query block.
template <int DP>
FC_DEVICE void bwd_wait_turn(const fc_attn_bwd_params& p, const BwdWalk& w, int it, int bc, int sq_pad) {
    const int mine = bwd_turn_rank<true>(p, w, it, bc, BWD_PIECE_ROWS);
    bwd_poll_turn(bwd_turn_at<DP>(p, w, it, sq_pad), mine);
}

// Counts this CTA's adds into iteration it's query block (after a barrier that orders them).
template <int DP>
FC_DEVICE void bwd_pass_turn(const fc_attn_bwd_params& p, const BwdWalk& w, int it, int sq_pad) {
    bwd_count_turn(bwd_turn_at<DP>(p, w, it, sq_pad));
}

// Two T (one 32-bit word, low half first) as floats.
template <typename T> FC_DEVICE float2 bwd_unpack2(uint32_t w);
template <> FC_DEVICE float2 bwd_unpack2<__half>(uint32_t w) {
    return __half22float2(*reinterpret_cast<const __half2*>(&w));
}
template <> FC_DEVICE float2 bwd_unpack2<__nv_bfloat16>(uint32_t w) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
}

// Rows loop CTA-uniformly so the shuffles below see whole warps.
template <int DP, typename T>
__global__ void __launch_bounds__(BWD_ROW_THREADS)
attn_bwd_prep_kernel(const __grid_constant__ fc_attn_bwd_params p, int sq_pad) {
    constexpr int LANES = DP / 8, ROWS = BWD_ROW_THREADS / LANES;
    const int64_t n_vec = (int64_t)p.B * p.Hq * sq_pad;
    float* dq_acc = static_cast<float*>(p.workspace);
    float* delta = dq_acc + n_vec * DP;  // (B, Hq, sq_pad)
    float* lse2 = delta + n_vec;         // (B, Hq, sq_pad)
    const int c = threadIdx.x % LANES;
    const bool col_ok = c * 8 < FC_DV(p);  // o's and dO's columns
    for (int64_t base = (int64_t)blockIdx.x * ROWS; base < n_vec; base += (int64_t)gridDim.x * ROWS) {
        const int64_t vrow = base + threadIdx.x / LANES;  // row of the per-row vectors
        const int64_t bh = vrow / sq_pad;
        const int i = (int)(vrow % sq_pad);
        const bool real = vrow < n_vec && i < p.Sq;
        const int64_t row = bh * p.Sq + i;  // row of (B, Hq, Sq)
        float sum = 0.f;
        if (real && col_ok) {
            const int h = (int)(bh % p.Hq), b = (int)(bh / p.Hq);
            const uint4 o = *reinterpret_cast<const uint4*>(static_cast<const T*>(p.o) + b * p.o_batch_stride +
                                                            h * p.o_head_stride + i * p.o_row_stride + c * 8);
            const uint4 d = *reinterpret_cast<const uint4*>(static_cast<const T*>(p.dout) + b * p.do_batch_stride +
                                                            h * p.do_head_stride + i * p.do_row_stride + c * 8);
            const uint32_t ow[4] = {o.x, o.y, o.z, o.w}, dw[4] = {d.x, d.y, d.z, d.w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float2 of = bwd_unpack2<T>(ow[e]), df = bwd_unpack2<T>(dw[e]);
                sum = fmaf(of.x, df.x, fmaf(of.y, df.y, sum));
            }
        }
        if (vrow < n_vec) {  // DP floats per row of the accumulator (8 per thread), padding rows too
            float4* acc = reinterpret_cast<float4*>(dq_acc + vrow * DP + c * 8);
            acc[0] = make_float4(0.f, 0.f, 0.f, 0.f);
            acc[1] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int off = LANES / 2; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
        if (vrow < n_vec && c == 0) {
            // With dlse: dS = P (dP - Delta + dlse), so Delta - dlse is stored (rows with
            // LSE = -inf have P = 0 and keep Delta, whatever dlse holds there).
            const float lse = real ? p.lse[row] : -INFINITY;
            delta[vrow] = !real ? 0.f : p.dlse && lse != -INFINITY ? sum - p.dlse[row] : sum;
            lse2[vrow] = lse == -INFINITY ? INFINITY : lse * FC_LOG2E;
        }
        if (vrow == 0 && c == 0) *bwd_item_counter<DP>(p, sq_pad) = 0;  // no item handed out yet
        if (p.deterministic && vrow < n_vec && i % BWD_PIECE_ROWS == 0 && c < DP / BWD_PIECE_COLS)
            bwd_piece_turns<DP>(p, sq_pad)[bwd_piece_index<DP>(vrow / BWD_PIECE_ROWS, c)] = 0;  // none added yet
    }
}

// The accumulator's pieces hold sq_pad rows per (batch, head).
template <int DP, typename T>
__global__ void __launch_bounds__(BWD_ROW_THREADS)
attn_bwd_post_kernel(const __grid_constant__ fc_attn_bwd_params p, int sq_pad) {
    constexpr int LANES = DP / 8, ROWS = BWD_ROW_THREADS / LANES;
    const int64_t n_rows = (int64_t)p.B * p.Hq * p.Sq;
    const float* dq_acc = static_cast<const float*>(p.workspace);
    const int c = threadIdx.x % LANES;
    if (c * 8 >= p.D) return;
    for (int64_t row = (int64_t)blockIdx.x * ROWS + threadIdx.x / LANES; row < n_rows;
         row += (int64_t)gridDim.x * ROWS) {
        const int i = (int)(row % p.Sq), col = c * 8;
        const int64_t bh = row / p.Sq;
        const int h = (int)(bh % p.Hq), b = (int)(bh / p.Hq);
        const int64_t at = bwd_piece<DP>(bh * (sq_pad / BWD_PIECE_ROWS) + i / BWD_PIECE_ROWS, col / BWD_PIECE_COLS) +
                           bwd_piece_offset(i % BWD_PIECE_ROWS, col % BWD_PIECE_COLS);
        const float4* src = reinterpret_cast<const float4*>(dq_acc + at);
        const float4 x0 = src[0], x1 = src[1];
        const float s = p.scale;
        uint4 packed;
        packed.x = pack2<T>(x0.x * s, x0.y * s);
        packed.y = pack2<T>(x0.z * s, x0.w * s);
        packed.z = pack2<T>(x1.x * s, x1.y * s);
        packed.w = pack2<T>(x1.z * s, x1.w * s);
        *reinterpret_cast<uint4*>(static_cast<T*>(p.dq) + b * p.dq_batch_stride + h * p.dq_head_stride +
                                  i * p.dq_row_stride + col) = packed;
    }
}

// Grid of a row kernel over `rows` rows at padded head dim DP.
template <int DP>
static unsigned bwd_row_grid(long long rows) {
    constexpr int ROWS = BWD_ROW_THREADS / (DP / 8);  // rows per CTA
    const long long ctas = (rows + ROWS - 1) / ROWS;
    return (unsigned)(ctas < BWD_ROW_MAX_GRID ? ctas : BWD_ROW_MAX_GRID);
}
