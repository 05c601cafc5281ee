// attn_sm90_tail.cuh -- the split tail of a non-causal Hopper call
// (attn_fwd_sm90.cuh): the pieces of the last, partial stripe of tiles, and
// the merge of a tile's pieces. Device code for sm_90a; Sm90Tail is shared
// with the host launcher (sm90_tail in attn_fwd_sm90_launch.cuh).
//
// Non-causal tiles are all alike, so a persistent grid of G clusters runs them
// in stripes of G, and the last stripe holds r = n_tiles mod G tiles: on the
// grid's D = 128 and 256 shapes r / G is 0.52 and 0.76, and the clusters
// without a tile there wait a whole tile for the others (3 % of a call in the
// model, perf notes, session 29). With a split tail the whole stripes run as
// before, and the last stripe's r x N K/V steps (N per tile, in tile order)
// are dealt out in equal ranges of W = ceil(r N / G) steps, one per cluster
// (W >= N / 2, so a tile has at most three pieces, and W <= N, so a cluster
// has at most two: the end of one tile and the start of the next).
//
// Each consumer warpgroup of a piece writes its unnormalized O, row maxima and
// lane row sums (the accumulator layout, as float4s across the warpgroup's 128
// threads) to the workspace, and each warp counts itself on its 16 rows'
// counter; the warp that arrives last merges the pieces of its rows in piece
// order (so that reruns are bit-identical whichever piece ends last) and
// writes their O and LSE. Positions: cluster u runs u, u + G, ... below
// `main`, then main + u (its first piece) and main + G + u (its second, if any).
// Limits: non-causal calls only (causal tiles differ in length; the host plans
// and the dynamic order balance those); K/V steps of the tail below 2^30.
#pragma once

#include <math.h>

#include "../common/ptx.cuh"
#include "../flashcore.h"
#include "hopper.cuh"

// The kernel that splits its tail: D = 128's CTA pairs (the LONG kernel, from
// FC_SM90_TAIL_MIN_SK keys, kernels.h). Measured on an H100 (perf notes,
// session 32): there +0.6-1.2 % at S = 4k, +1.1-2.1 % at 8k, +2.3-2.7 % at 16k. The
// single-CTA LONG kernel (S = 2k, where the tail gains at most 3 of 18 steps)
// lost 2-4 % to the code alone, and the D = 256 pairs were 5 % slower at 2k
// and within +-4 % (noise) at 4k-16k.
__host__ __device__ constexpr bool sm90_tail_kernel(int dp, int cons, int cl, bool kv_split, bool dyn, bool lng) {
    return dp == 128 && cons == 2 && cl > 1 && lng && !kv_split && !dyn;
}

// The split tail of one launch (main = 0: none), set by the launcher.
struct Sm90Tail {
    int main;         // tiles of the whole stripes, run as before; 0: no split tail
    int n_kv;         // K/V tiles per tile (N)
    int steps;        // K/V tiles per cluster in the tail (W)
    int total;        // K/V tiles of the last stripe (r x N)
    Sm90Div by_kv;    // n_kv
    Sm90Div by_steps; // steps
    float4* part;     // partials: [slot][CTA of the cluster][consumer][vector][128 threads]
    unsigned* count;  // arrivals: [tail tile][CTA of the cluster][consumer][warp], zeroed before the launch
};
static constexpr int SM90_TAIL_MAX_PIECES = 3;  // pieces of one tile (W >= N / 2)

// One piece: a tile of the last stripe and a range of its K/V tiles.
struct Sm90Piece {
    int tile;        // tile number (main + q)
    int q;           // the tile's place in the last stripe
    int kv0;         // first K/V tile
    int kv_end;      // one past the last K/V tile
    int first_unit;  // the cluster that holds the tile's first piece
    int n;           // pieces of the tile
    int mine;        // this piece's index among them
};

// One past cluster u's last position (of `units` clusters). (Divisions by
// multiply and shift: K/V steps stay below 2^30.)
__device__ __forceinline__ int sm90_tail_end(const Sm90Tail& tl, int u, int units) {
    const int start = u * tl.steps;
    if (start >= tl.total) return tl.main;  // no tail work
    const int stop = min(start + tl.steps, tl.total);
    const int next_tile = (sm90_quot(start, tl.by_kv) + 1) * tl.n_kv;  // where the next tile's K/V steps start
    return tl.main + u + 1 + (next_tile < stop ? units : 0);
}

// The piece at position pos >= main.
__device__ __forceinline__ Sm90Piece sm90_piece(const Sm90Tail& tl, int pos, int units) {
    const int second = pos - tl.main >= units;
    const int u = pos - tl.main - (second ? units : 0);
    const int start = u * tl.steps, stop = min(start + tl.steps, tl.total);
    Sm90Piece pc;
    pc.q = sm90_quot(start, tl.by_kv) + second;
    const int t0 = pc.q * tl.n_kv;  // the tile's first step
    pc.tile = tl.main + pc.q;
    pc.kv0 = max(start, t0) - t0;
    pc.kv_end = min(stop, t0 + tl.n_kv) - t0;
    pc.first_unit = sm90_quot(t0, tl.by_steps);
    pc.n = sm90_quot(t0 + tl.n_kv - 1, tl.by_steps) - pc.first_unit + 1;
    pc.mine = u - pc.first_unit;
    return pc;
}

// A consumer warpgroup's end of piece pc of a split tile: writes its partial
// (o, m, l), and each warp counts itself on its 16 rows' counter; the warp
// that arrives last merges the pieces of its rows and writes their O and LSE
// (the warpgroup's rows start at wrow0) itself, straight from registers (a
// loop over float4s: holding the merged tile in registers, as the ordinary
// epilogue needs it, spilled the D = 256 consumers).
template <typename T, int CL, int CONS, int PARTS, int HALF>
__device__ __forceinline__ void sm90_tail_piece_end(const float (&o)[PARTS][HALF], const float (&m)[2],
                                                    const float (&l)[2], const Sm90Tail& tl, const Sm90Piece& pc,
                                                    const fc_attn_params& p, int b, int h, int wrow0, int crank,
                                                    int cw, int t128) {
    static_assert(HALF % 4 == 0, "float4s of the accumulator layout: two columns of each of two rows");
    constexpr int VECS = PARTS * HALF / 4;  // O float4s per thread; one more holds m and l
    // Cluster u's partial of tail tile q sits in slot u + q: pieces in step
    // order raise u, q or both, so no two share a slot (fewer than G + r slots).
    auto slot = [&](int u) {
        return tl.part + ((size_t)((u + pc.q) * CL + crank) * CONS + cw) * (VECS + 1) * 128 + t128;
    };
    float4* own = slot(pc.first_unit + pc.mine);
#pragma unroll
    for (int pp = 0; pp < PARTS; ++pp)
#pragma unroll
        for (int v = 0; v < HALF / 4; ++v)
            own[(pp * (HALF / 4) + v) * 128] = make_float4(o[pp][4 * v], o[pp][4 * v + 1], o[pp][4 * v + 2],
                                                           o[pp][4 * v + 3]);
    own[VECS * 128] = make_float4(m[0], m[1], l[0], l[1]);
    __threadfence();  // this thread's partial is visible on the GPU before the count below
    __syncwarp();     // every lane's partial and fence precede the warp's count
    const int warp = t128 / 32, lane = t128 % 32;
    unsigned arrived = 0;
    if (lane == 0) arrived = atomicAdd(&tl.count[((pc.q * CL + crank) * CONS + cw) * 4 + warp], 1u);
    // (A broadcast by shuffle: a barrier reduction over the warpgroup here took
    // the uniform datapath from the whole tile loop, 12-14 % slower.)
    if (__shfl_sync(0xffffffffu, arrived, 0) != (unsigned)pc.n - 1) return;  // not the last of its rows' pieces
    __threadfence();  // the other pieces' partials, counted before ours, are read after the count ...
    __syncwarp();     // ... by every lane (lane 0's count and fence precede the lanes' reads)

    // Every piece's partial, ours included, in piece order from the workspace.
    // Piece k's factor is 2^(m_k - M) per row, M the row's maximum over the
    // pieces; the sums go in piece order, so that every rerun rounds alike.
    const float4* pk[SM90_TAIL_MAX_PIECES];
#pragma unroll
    for (int k = 0; k < SM90_TAIL_MAX_PIECES; ++k) pk[k] = slot(pc.first_unit + min(k, pc.n - 1));
    float c[SM90_TAIL_MAX_PIECES][2], mx[2], inv[2], lsum[2];
    {
        float4 ml[SM90_TAIL_MAX_PIECES];
#pragma unroll
        for (int k = 0; k < SM90_TAIL_MAX_PIECES; ++k)
            ml[k] = k < pc.n ? __ldcg(pk[k] + VECS * 128) : make_float4(-INFINITY, -INFINITY, 0.f, 0.f);
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const float mk[SM90_TAIL_MAX_PIECES] = {hr ? ml[0].y : ml[0].x, hr ? ml[1].y : ml[1].x,
                                                    hr ? ml[2].y : ml[2].x};
            const float lk[SM90_TAIL_MAX_PIECES] = {hr ? ml[0].w : ml[0].z, hr ? ml[1].w : ml[1].z,
                                                    hr ? ml[2].w : ml[2].z};
            mx[hr] = fmaxf(fmaxf(mk[0], mk[1]), mk[2]);
#pragma unroll
            for (int k = 0; k < SM90_TAIL_MAX_PIECES; ++k)
                c[k][hr] = mk[k] == -INFINITY ? 0.f : exp2f(mk[k] - mx[hr]);
            lsum[hr] = quad_sum(fmaf(lk[2], c[2][hr], fmaf(lk[1], c[1][hr], lk[0] * c[0][hr])));
            inv[hr] = lsum[hr] > 0.f ? 1.f / lsum[hr] : 0.f;  // (a NaN piece's O: NaN * 0 stays NaN)
        }
    }
    // O: this thread's two columns of each of its two rows per float4, as the
    // ordinary epilogue rounds them (a missing third piece reads the second's
    // values with factor 0).
    // TAIL_UNROLL float4s of every piece in flight: one at a time, a D = 256 merge
    // waited 32 L2 round trips (about 13 us, perf notes, session 32).
    constexpr int TAIL_UNROLL = 8;
    T* o_bh = static_cast<T*>(p.o) + b * p.o_batch_stride + h * p.o_head_stride;
#pragma unroll TAIL_UNROLL
    for (int e = 0; e < VECS; ++e) {
        const float4 a0 = __ldcg(pk[0] + e * 128), a1 = __ldcg(pk[1] + e * 128), a2 = __ldcg(pk[2] + e * 128);
        const int col = (e / (HALF / 4)) * 2 * HALF + (e % (HALF / 4)) * 8 + (lane % 4) * 2;
        const float v[4] = {fmaf(a2.x, c[2][0], fmaf(a1.x, c[1][0], a0.x * c[0][0])),
                            fmaf(a2.y, c[2][0], fmaf(a1.y, c[1][0], a0.y * c[0][0])),
                            fmaf(a2.z, c[2][1], fmaf(a1.z, c[1][1], a0.z * c[0][1])),
                            fmaf(a2.w, c[2][1], fmaf(a1.w, c[1][1], a0.w * c[0][1]))};
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const int row = wrow0 + warp * 16 + lane / 4 + hr * 8;
            if (row < p.Sq && col < p.D)
                *reinterpret_cast<uint32_t*>(o_bh + (int64_t)row * p.o_row_stride + col) =
                    pack2<T>(v[2 * hr] * inv[hr], v[2 * hr + 1] * inv[hr]);
        }
    }
    if (p.lse && lane % 4 == 0) {
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const int row = wrow0 + warp * 16 + lane / 4 + hr * 8;
            if (row < p.Sq)
                p.lse[((int64_t)b * p.Hq + h) * p.Sq + row] = lsum[hr] != 0.f ? (mx[hr] + log2f(lsum[hr])) * FC_LN2 : -INFINITY;
        }
    }
}
