// attn_decode_sm80.cuh -- split-KV ("flash-decoding") attention forward for
// few query rows per KV head and long Sk (sm80, sm86, sm89, sm90).
//
// Algorithm. The Hq/Hkv query heads that share one KV head, times the Sq
// query rows, are packed into the M dimension: packed row r of KV head hk is
// query row i = r / G of query head hk * G + r % G (G = Hq/Hkv). One CTA owns
// FC_DECODE_ROWS (16) packed rows -- one m16 mma tile -- of one (batch, KV
// head) and one range of whole key tiles (a "split"), so for decode (G * Sq
// <= 16) every K/V byte is read from HBM once per split and the splits spread
// Sk over the SMs. K/V tiles of BC keys stream through a STAGES-deep cp.async
// ring with one block barrier per tile. Inside a tile each of the WARPS warps
// takes its own 16 keys against all 16 rows (Q's mma fragments are read once
// from global memory and kept in registers, or at DP = 256, where registers
// run out, in shared memory): S = Q K^T and O += P V with mma.sync
// m16n8k16, online softmax in exp2 per warp. At the end the warps' partial
// (m, l, O) are merged through shared memory. With one split the CTA writes O
// (input dtype) and LSE directly; with more it writes an fp32 partial O,
// normalized by its own sum, and a partial LSE to the caller's workspace, and
// attn_combine.cu merges the splits by their LSEs.
//
// Limits. D any multiple of 8 up to DP (64, 128 or 256), zero-padded. Any
// Sq, Sk >= 1, both causal alignments and sliding windows: each packed row
// has its own first and last visible key. G * Sq > 16 works (more row blocks, each re-reading K/V, mostly
// from L2) but is what the tile kernel is for; dispatch only picks this kernel
// for <= 64 packed rows unless num_splits > 1 forces it. Rows that see no key
// (in a split or at all) give O = 0 and LSE = -inf, even where v holds NaN.
#pragma once

#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>

#include "../common/launch.cuh"
#include "../common/ptx.cuh"
#include "../common/tile.cuh"
#include "../flashcore.h"
#include "../kernels.h"

// ---------------------------------------------------------------------------
// Tile table (per padded head dim DP). Each warp takes 16 keys of a tile, so
// WARPS = BC / 16. A stage is BC keys of K and V.
//
//  DP  | BC | WARPS | STAGES | smem (ring) | CTAs/SM on H100 | why
//  64  | 64 |   4   |   4    |   64 KB     |  3  | 16 KB stages; 4 deep keeps >= 48 KB in flight per CTA
//  128 | 64 |   4   |   3    |   96 KB     |  2  | 32 KB stages, 2 in flight per CTA; fits sm86's 99 KB
//  256 | 32 |   2   |   3    |   96 KB     |  2  | O is 128 fp32 regs/thread: 2 warps, same 32 KB stages;
//      |    |       |        |   + 8 KB Q  |     | Q fragments in smem (in registers they spill)
// D <= 128 fits the 99 KB per-block limit of sm86/sm89; at D = 256 (104 KB)
// those GPUs run the tile kernel instead (dispatch asks the occupancy API).
// Little's law: 3 TB/s x ~1.5 us of loaded latency is ~35 KB in flight per SM;
// every row above keeps >= 96 KB per SM in flight.
template <int DP>
struct DecodeTile {
    static constexpr int ROWS = FC_DECODE_ROWS;     // packed query rows per CTA
    static constexpr int BC = FC_DECODE_BC(DP);     // keys per K/V tile
    static constexpr int KEYS_PER_WARP = 16;        // one k16 step of P V
    static constexpr int WARPS = BC / KEYS_PER_WARP;
    static constexpr int THREADS = WARPS * 32;
    static constexpr int STAGES = DP <= 64 ? 4 : 3;
    static constexpr int CHUNKS = DP / 8;           // 16-byte chunks per row
    static constexpr bool Q_IN_SMEM = DP > 128;     // Q fragments in smem rather than registers
    static constexpr size_t RING_BYTES = (size_t)STAGES * 2 * BC * DP * 2;
    static constexpr size_t Q_BYTES = Q_IN_SMEM ? (size_t)ROWS * DP * 2 : 0;
    static constexpr size_t SMEM_BYTES = RING_BYTES + Q_BYTES;
    static constexpr int O_STRIDE = DP + 4;         // fp32 row stride of the merge scratch (float4-aligned)
    static constexpr size_t MERGE_BYTES = (size_t)WARPS * ROWS * (O_STRIDE + 2) * 4;
    static_assert(MERGE_BYTES <= RING_BYTES, "merge scratch reuses the K/V ring");
};

// ---------------------------------------------------------------------------
// Kernel

template <int DP, typename T>
__global__ void __launch_bounds__(DecodeTile<DP>::THREADS)
attn_decode_sm80_kernel(const __grid_constant__ fc_attn_params p, const fc_split_plan sp) {
    using Tile = DecodeTile<DP>;
    constexpr int ROWS = Tile::ROWS, BC = Tile::BC, WARPS = Tile::WARPS, THREADS = Tile::THREADS;
    constexpr int STAGES = Tile::STAGES, CHUNKS = Tile::CHUNKS;
    constexpr int D_TILES = DP / 8;   // 8-wide column tiles of O
    constexpr int K_STEPS = DP / 16;  // k16 steps of Q K^T
    constexpr int ROW_BYTES = DP * 2;

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    T* sK = reinterpret_cast<T*>(smem_raw);  // (STAGES, BC, DP) swizzled
    T* sV = sK + STAGES * BC * DP;           // (STAGES, BC, DP) swizzled

    // The combine kernel may start launching now (sp.pdl: it exists and runs as
    // a programmatic dependent): it waits in griddep_wait for this grid to
    // finish, so only its launch overlaps.
    if (sp.pdl) griddep_launch_dependents();

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    // 1-D grid: ((b * Hkv + hk) * splits + split) * row_blocks + rb; the row
    // blocks of one key range are adjacent, so their K/V re-reads hit L2.
    int idx = (int)blockIdx.x;
    const int rb = idx % sp.row_blocks;
    idx /= sp.row_blocks;
    const int split = idx % sp.splits;
    idx /= sp.splits;
    const int hk = idx % p.Hkv, b = idx / p.Hkv;
    const int G = p.Hq / p.Hkv, n_rows = G * p.Sq;  // packed rows of this KV head
    const int r0 = rb * ROWS;

    // Key j is visible to query i iff j < Sk, j <= i + hi (causal, or a window's right edge) and
    // j >= i + lo (a window's left edge; kernels.h's fc_band).
    const fc_band band = FC_BAND(p);

    // This lane's two fragment rows (lane/4 and lane/4 + 8): last visible key
    // (-1: padding row or no key), first visible key, and Q fragments, read once from global.
    int lim[2], lim_lo[2];
    bool row_ok[2];
    const T* q_lane[2];  // this lane's first Q element of each fragment row
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const int r = r0 + lane / 4 + hr * 8;
        row_ok[hr] = r < n_rows;
        const int i = row_ok[hr] ? r / G : 0, h = hk * G + (row_ok[hr] ? r % G : 0);
        lim[hr] = !row_ok[hr] ? -1 : band.has_hi ? min(p.Sk - 1, i + band.hi) : p.Sk - 1;
        lim_lo[hr] = band.has_lo ? i + band.lo : INT_MIN;
        q_lane[hr] = static_cast<const T*>(p.q) + b * p.q_batch_stride + h * p.q_head_stride +
                     (int64_t)i * p.q_row_stride + (lane % 4) * 2;
    }
    uint4* sQf = reinterpret_cast<uint4*>(smem_raw + Tile::RING_BYTES);  // (K_STEPS, 32 lanes), Q_IN_SMEM only
    uint32_t qf[Tile::Q_IN_SMEM ? 1 : K_STEPS][4];                       // A fragments of Q per k-step
#pragma unroll
    for (int kk = 0; kk < K_STEPS; ++kk) {
        uint32_t f[4];
#pragma unroll
        for (int hr = 0; hr < 2; ++hr)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int col = kk * 16 + half * 8 + (lane % 4) * 2;
                f[hr + 2 * half] = row_ok[hr] && col < p.D
                                       ? *reinterpret_cast<const uint32_t*>(q_lane[hr] + kk * 16 + half * 8) : 0u;
            }
        if constexpr (Tile::Q_IN_SMEM) {
            sQf[kk * 32 + lane] = make_uint4(f[0], f[1], f[2], f[3]);  // read back only by this lane
        } else {
#pragma unroll
            for (int e = 0; e < 4; ++e) qf[kk][e] = f[e];
        }
    }

    // This CTA's key tiles: its split's range (splits count from the tile of row 0's first key,
    // fc_decode_first_tile), cut at the last key any of its rows sees and started at the first.
    const int tiles_all = (p.Sk + BC - 1) / BC;
    const int t_split = fc_decode_first_tile(band, BC) + split * sp.tiles_per_split;
    int t_end = min(t_split + sp.tiles_per_split, tiles_all);
    {
        const int last_row = min(n_rows, r0 + ROWS) - 1;
        const int last_key = band.has_hi ? min(p.Sk - 1, last_row / G + band.hi) : p.Sk - 1;
        t_end = last_key < 0 ? 0 : min(t_end, last_key / BC + 1);
    }
    const int first_key = band.has_lo ? r0 / G + band.lo : 0;  // the first key of this CTA's first row
    const int t_begin = first_key > t_split * BC ? first_key / BC : t_split;
    const int n_tiles = max(0, t_end - t_begin);

    const T* k = static_cast<const T*>(p.k) + b * p.k_batch_stride + hk * p.k_head_stride;
    const T* v = static_cast<const T*>(p.v) + b * p.v_batch_stride + hk * p.v_head_stride;
    const int64_t thr_col = (tid % CHUNKS) * 8, thr_row = tid / CHUNKS;  // see load_tile
    const T* k_thr = k + ((int64_t)t_begin * BC + thr_row) * p.k_row_stride + thr_col;
    const T* v_thr = v + ((int64_t)t_begin * BC + thr_row) * p.v_row_stride + thr_col;
    const int64_t k_tile_stride = BC * p.k_row_stride, v_tile_stride = BC * p.v_row_stride;
    const int keys_left = p.Sk - t_begin * BC;  // keys from this split's first tile to the end

    // Prologue: the first STAGES-1 tiles, one commit group each.
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < n_tiles) {
            const int keys = min(BC, keys_left - s * BC);
            load_tile<DP, BC, THREADS>(sK + s * BC * DP, k_thr + s * k_tile_stride, k, p.k_row_stride, keys, p.D, tid);
            load_tile<DP, BC, THREADS>(sV + s * BC * DP, v_thr + s * v_tile_stride, v, p.v_row_stride, keys, p.D, tid);
        }
        cp_async_commit();
    }

    const float scale_log2 = p.scale * FC_LOG2E;
    float acc_o[D_TILES][4];  // this warp's O for its keys, C-fragment layout
    float m_i[2] = {-INFINITY, -INFINITY};  // running row max of scale_log2 * S
    float l_i[2] = {0.f, 0.f};              // running row sum, this lane's columns only
#pragma unroll
    for (int dt = 0; dt < D_TILES; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_o[dt][e] = 0.f;
    // Per-lane ldmatrix byte addresses of this warp's 16 keys at chunk step 0.
    const uint32_t k_lane = smem_u32(sK + swz<DP>(warp * 16 + (lane / 16) * 8 + lane % 8, (lane / 8) % 2));
    const uint32_t v_lane = smem_u32(sV + swz<DP>(warp * 16 + ((lane / 8) % 2) * 8 + lane % 8, lane / 16));

    for (int j = 0; j < n_tiles; ++j) {
        cp_async_wait<STAGES - 2>();  // this thread's copies of tile j have landed
        __syncthreads();  // orders every thread's tile-j copies before any warp reads them, and every
                          // warp's reads of tile j-1 before its slot is refilled just below
        const int jn = j + STAGES - 1;
        if (jn < n_tiles) {
            const int slot = jn % STAGES, keys = min(BC, keys_left - jn * BC);
            load_tile<DP, BC, THREADS>(sK + slot * BC * DP, k_thr + jn * k_tile_stride, k, p.k_row_stride, keys, p.D, tid);
            load_tile<DP, BC, THREADS>(sV + slot * BC * DP, v_thr + jn * v_tile_stride, v, p.v_row_stride, keys, p.D, tid);
        }
        cp_async_commit();

        const uint32_t slot_off = (j % STAGES) * BC * ROW_BYTES;  // K and V slots share offsets

        // S = Q K^T for this warp's 16 keys: two 8-key n-tiles.
        float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
        for (int kk = 0; kk < K_STEPS; ++kk) {
            uint32_t a[4];
            if constexpr (Tile::Q_IN_SMEM) {
                const uint4 x = sQf[kk * 32 + lane];
                a[0] = x.x; a[1] = x.y; a[2] = x.z; a[3] = x.w;
            } else {
#pragma unroll
                for (int e = 0; e < 4; ++e) a[e] = qf[Tile::Q_IN_SMEM ? 0 : kk][e];
            }
            uint32_t bk[4];  // {n 0-7 k 0-7, n 0-7 k 8-15, n 8-15 k 0-7, n 8-15 k 8-15}
            ldmatrix_x4(bk, chunk_step(k_lane, kk) + slot_off);
            mma_16816<T>(s[0], a, bk[0], bk[1]);
            mma_16816<T>(s[1], a, bk[2], bk[3]);
        }

        // Mask keys past each row's last visible key (split tail, Sk tail, causal) and before its first.
        const int key_lane = (t_begin + j) * BC + warp * 16 + (lane % 4) * 2;
#pragma unroll
        for (int hr = 0; hr < 2; ++hr)
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    if (key_lane + nt * 8 + e > lim[hr] || key_lane + nt * 8 + e < lim_lo[hr])
                        s[nt][2 * hr + e] = -INFINITY;

        // Online softmax per row; P overwrites S.
        float corr[2];
        bool rescale = false;
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const float mx = quad_max(fmaxf(fmaxf(s[0][2 * hr], s[0][2 * hr + 1]), fmaxf(s[1][2 * hr], s[1][2 * hr + 1])));
            const float m_new = fmaxf(m_i[hr], mx * scale_log2);
            const float m_use = m_new == -INFINITY ? 0.f : m_new;  // no key yet: exp2 gives 0, not NaN
            corr[hr] = fast_exp2(m_i[hr] - m_use);
            rescale |= m_new != m_i[hr];
            m_i[hr] = m_new;
            float rs = 0.f;
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float pe = fast_exp2(fmaf(s[nt][2 * hr + e], scale_log2, -m_use));
                    s[nt][2 * hr + e] = pe;
                    rs += pe;
                }
            l_i[hr] = l_i[hr] * corr[hr] + rs;
        }
        if (__any_sync(0xffffffffu, rescale)) {  // warp-uniform skip once the maxima settle
#pragma unroll
            for (int dt = 0; dt < D_TILES; ++dt)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc_o[dt][e] *= corr[e / 2];
        }

        // O += P V: the S accumulator (16 rows x 16 keys) is the A fragment.
        uint32_t a[4];
        a[0] = pack2<T>(s[0][0], s[0][1]);
        a[1] = pack2<T>(s[0][2], s[0][3]);
        a[2] = pack2<T>(s[1][0], s[1][1]);
        a[3] = pack2<T>(s[1][2], s[1][3]);
#pragma unroll
        for (int dt2 = 0; dt2 < D_TILES / 2; ++dt2) {
            uint32_t bv[4];  // V (transposed): {d 0-7 k 0-7, d 0-7 k 8-15, d 8-15 k 0-7, d 8-15 k 8-15}
            ldmatrix_x4_trans(bv, chunk_step(v_lane, dt2) + slot_off);
            mma_16816<T>(acc_o[2 * dt2], a, bv[0], bv[1]);
            mma_16816<T>(acc_o[2 * dt2 + 1], a, bv[2], bv[3]);
        }
    }
    cp_async_wait<0>();  // drain the (empty) trailing groups
    __syncthreads();     // every warp is done reading the K/V ring before it becomes merge scratch

    // Merge the warps: each writes its (m, l, O) rows to smem.
    float* sO = reinterpret_cast<float*>(smem_raw);  // (WARPS, ROWS, O_STRIDE) unnormalized partial O
    float* sM = sO + WARPS * ROWS * Tile::O_STRIDE;  // (WARPS, ROWS) row max, log2 domain
    float* sL = sM + WARPS * ROWS;                   // (WARPS, ROWS) row sum
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const int row = lane / 4 + hr * 8;
        const float l = quad_sum(l_i[hr]);
        if (lane % 4 == 0) {
            sM[warp * ROWS + row] = m_i[hr];
            sL[warp * ROWS + row] = l;
        }
        float* dst = sO + (warp * ROWS + row) * Tile::O_STRIDE + (lane % 4) * 2;
#pragma unroll
        for (int dt = 0; dt < D_TILES; ++dt)
            *reinterpret_cast<float2*>(dst + dt * 8) = make_float2(acc_o[dt][2 * hr], acc_o[dt][2 * hr + 1]);
    }
    __syncthreads();  // every warp's partial rows are in smem before any thread merges them

    // Each thread merges 8 columns of one row at a time and stores them.
    const int64_t total_rows = (int64_t)p.B * p.Hq * p.Sq;
    for (int e = tid; e < ROWS * CHUNKS; e += THREADS) {
        const int row = e / CHUNKS, c = e % CHUNKS, r = r0 + row;
        if (r >= n_rows || c * 8 >= p.D) continue;
        float mx = -INFINITY, l_any = 0.f;  // l_any: 0 if no warp saw a key, NaN if one's scores were NaN
#pragma unroll
        for (int w = 0; w < WARPS; ++w) {
            mx = fmaxf(mx, sM[w * ROWS + row]);
            l_any += sL[w * ROWS + row];
        }
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        float l = 0.f;
        // A row without a visible key is skipped (its O stays 0, whatever 0 * NaN
        // a warp's O holds from a NaN value it masked). A warp whose scores were
        // all NaN has m = -inf and l NaN: weight 0, and 0 * NaN keeps the NaN.
        if (mx != -INFINITY || l_any != 0.f) {
            const float m_use = mx == -INFINITY ? 0.f : mx;
#pragma unroll
            for (int w = 0; w < WARPS; ++w) {
                const float wt = fast_exp2(sM[w * ROWS + row] - m_use);
                l += wt * sL[w * ROWS + row];
                const float4* src = reinterpret_cast<const float4*>(sO + (w * ROWS + row) * Tile::O_STRIDE + c * 8);
                const float4 x0 = src[0], x1 = src[1];
                acc[0] += wt * x0.x; acc[1] += wt * x0.y; acc[2] += wt * x0.z; acc[3] += wt * x0.w;
                acc[4] += wt * x1.x; acc[5] += wt * x1.y; acc[6] += wt * x1.z; acc[7] += wt * x1.w;
            }
        }
        const float inv = l != 0.f ? 1.f / l : 0.f;  // 0: no visible key (a NaN sum stays NaN)
        const float lse = l != 0.f ? (mx + log2f(l)) * FC_LN2 : -INFINITY;
        const int i = r / G, h = hk * G + r % G;
        const int64_t grow = ((int64_t)b * p.Hq + h) * p.Sq + i;  // row of (B, Hq, Sq)
        if (sp.splits == 1) {
            T* o = static_cast<T*>(p.o) + b * p.o_batch_stride + h * p.o_head_stride + (int64_t)i * p.o_row_stride + c * 8;
            uint4 packed;
            packed.x = pack2<T>(acc[0] * inv, acc[1] * inv);
            packed.y = pack2<T>(acc[2] * inv, acc[3] * inv);
            packed.z = pack2<T>(acc[4] * inv, acc[5] * inv);
            packed.w = pack2<T>(acc[6] * inv, acc[7] * inv);
            *reinterpret_cast<uint4*>(o) = packed;
            if (p.lse && c == 0) p.lse[grow] = lse;
        } else {
            float4* o = reinterpret_cast<float4*>(sp.o_part + ((int64_t)split * total_rows + grow) * p.D + c * 8);
            o[0] = make_float4(acc[0] * inv, acc[1] * inv, acc[2] * inv, acc[3] * inv);
            o[1] = make_float4(acc[4] * inv, acc[5] * inv, acc[6] * inv, acc[7] * inv);
            if (c == 0) sp.lse_part[split * total_rows + grow] = lse;
        }
    }
}

// ---------------------------------------------------------------------------
// Launcher and the C entry points of one padded head dim (see kernels.h)

template <int DP, typename T>
static fc_status attn_decode_sm80_launch(const fc_attn_params* p, const fc_split_plan* sp, cudaStream_t stream) {
    using Tile = DecodeTile<DP>;
    if (fc_smem_limit_once<attn_decode_sm80_kernel<DP, T>>((int)Tile::SMEM_BYTES) != cudaSuccess)
        return FC_ERR_CUDA;
    // dispatch keeps row_blocks * splits * B * Hkv <= 2^31 - 1
    const unsigned grid = (unsigned)sp->row_blocks * (unsigned)sp->splits * (unsigned)(p->B * p->Hkv);
    attn_decode_sm80_kernel<DP, T><<<grid, Tile::THREADS, Tile::SMEM_BYTES, stream>>>(*p, *sp);
    if (cudaGetLastError() != cudaSuccess) return FC_ERR_CUDA;
    return sp->splits > 1 ? fc_split_combine(p, sp, (fc_stream_t)stream) : FC_OK;
}

// Resident CTAs per SM of the fp16 instance (the bf16 one has the same
// resources); 0 when the kernel cannot launch on this device at all.
template <int DP>
static int attn_decode_sm80_ctas_per_sm() {
    using Tile = DecodeTile<DP>;
    const void* fn = (const void*)attn_decode_sm80_kernel<DP, __half>;
    if (cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)Tile::SMEM_BYTES) != cudaSuccess) {
        (void)cudaGetLastError();  // clear the (non-sticky) error: too much smem for this GPU
        return 0;
    }
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fn, Tile::THREADS, Tile::SMEM_BYTES) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

#define FC_SM80_DECODE_DEFINE(DP)                                                                          \
    extern "C" fc_status fc_sm80_decode_d##DP(const fc_attn_params* p, const fc_split_plan* sp,            \
                                              fc_stream_t stream) {                                        \
        return p->dtype == FC_DTYPE_BF16                                                                   \
                   ? attn_decode_sm80_launch<DP, __nv_bfloat16>(p, sp, (cudaStream_t)stream)               \
                   : attn_decode_sm80_launch<DP, __half>(p, sp, (cudaStream_t)stream);                     \
    }                                                                                                      \
    extern "C" int fc_sm80_decode_ctas_per_sm_d##DP(void) { return attn_decode_sm80_ctas_per_sm<DP>(); }
