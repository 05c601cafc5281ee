// loop_sched.cu -- microbenchmark: the D = 128 consumer loop of the Hopper
// kernel under three issue schedules and register budgets (sm90a), no torch;
// K/V barriers in its ring modes only, TMA tensor maps in its tensor mode only.
//
//   nvcc -O3 -std=c++17 -Icsrc -DFC_HAVE_SM90 -gencode=arch=compute_90a,code=sm_90a -cudart static \
//        -o build/loop_sched csrc/tools/loop_sched.cu csrc/sm90/tensor_map.cu
//   build/loop_sched          # on the GPU machine
//
// One CTA per SM, two consumer warpgroups, each running K/V steps of the
// kernel's loop on one Q, K and V tile that stay in shared memory (zeros, then
// hashed random values: operand_word), with the kernel's own pieces (issue_qk,
// issue_pv, softmax_tile, pack_p) and its sink store (PIN_SOFTMAX). What it
// leaves out: the K/V barriers (but in ring mode, below), the tile boundary, the
// rest of the kernel's live registers, and the O rescales of a row whose maximum
// still moves (the S of every step is the same; but in ringr). Schedules, per step j:
//   now    S_{j+1} and P_j V_j issued together, the softmax of S_{j+1}, the P V
//          wait, the rescale, P packed (the kernel's loop);
//   ahead  P_j V_j issued, the softmax of S_{j+1} (issued a step earlier) into
//          a second P set, S_{j+2} issued, the P V wait, the rescale;
//   split  as ahead, with S_{j+2} issued between the two row halves of the
//          softmax (two S sets as well);
//   mma    S and P V issued and waited for, no softmax: the tensor work alone.
// Registers: 255 (two warpgroups of 256 threads), or the kernel's split with an
// idle producer warpgroup (384 threads, setmaxnreg: 240, 232 or 200 per consumer).
// Keys per step: 128 (the kernel's), or 64, where every schedule fits 232.
// Stream mode (stream_rounds): the producer warpgroup lands 64 KB rounds in a
// shared-memory scratch area by bulk copies from one global buffer, one round in
// flight, every 2600 cycles or back to back, as the kernel's producer lands K and V.
// Ring mode (`loop_sched ring` runs it alone): "now" on the kernel's K/V ring, two
// slots of K and V with full and empty mbarriers, each step waiting for K_{j+1} and
// V_j and every consumer thread releasing both slots (ringw: one release per warp),
// the slots refilled by a producer thread with bulk copies (or by its arrivals
// alone: "sync only"); ringr runs the O rescale at every step.
// Row-sum mode (`loop_sched sums` runs it alone): the ring loop without the
// row sums' FADDs (nosum), and with the sums from the tensor core (ones: P V as
// m64n136k16 whose last 8 columns read a block of ones after each V slot), and
// with the sums but without the PIN_SOFTMAX store (nopin). Tensor mode (`loop_sched
// tma`): the ring filled by the kernel's TMA tensor loads, walking K and V as its
// S = 2k tiles do (ringt), and with half of each tile's bytes (ringth).
// Prints cycles per 128 keys: the CTA's span (first warpgroup start to last
// end) and each warpgroup's own time, means over the CTAs. ptxas's choices
// move between builds of this file (which schedules it serializes, C7512), so
// read a build's numbers together. Measured on an H100 (perf notes, session
// 42; zeros and random operands within 1 %, span within 1 % of the
// warpgroups'): 128 keys: mma 2048-2070 (the full tensor rate, 4096 FLOP per
// clock and SM), now 2390-2449, ahead 2188-2248 (2196-2233 at 240, 3047 at
// 200: serialized), split 2955; 64 keys: mma 2049-2057, now 2695-2706 (232),
// ahead 2533-2540, split 2750-2760. Stream mode (26-29 bytes per clock
// landing, about the kernel's rate) moves none of them by more than 0.5 %.
// Ring mode (session 43; at 240 and 232 registers alike, sync only run at 240):
// now 2430-2446, ring sync only 2460-2471, ring 2470-2482, ringw 2454-2464, ringr 2551.
// Row-sum mode (session 44, 240 and 232 alike): ring 2470-2472, nosum 2388, ones
// 2425-2426 (in both, ptxas put the P V wait ahead of the exponentials), nopin 2530-2532.
// Tensor mode (session 44): ring 2470-2471, ringt 2513-2517, ringth 2520-2522
// (at a 1 % higher clock: 756-758 TFLOP/s against 749-751).
#include <cuda_fp16.h>
#include <stdio.h>
#include <string.h>

#include <type_traits>
#include <vector>

#include "sm90/attn_sm90_parts.cuh"
#include "sm90/tensor_map.h"
#include "tools/tool_util.h"

static constexpr int MAX_SMS = 1024;   // output slots; the grid is one CTA per SM
static constexpr int STEPS = 64;       // timed steps per warpgroup (even: split and ahead run pairs)
static constexpr int WARMUP = 4;       // steps before the clock starts
static constexpr int DP = 128, BR = 128, BC_MAX = 128;  // BC, the keys per step: 128 (the kernel's) or 64
static constexpr uint32_t Q_BYTES = BR * DP * 2, KV_BYTES = BC_MAX * DP * 2;
static constexpr int STREAM_BYTES = 64 * 1024;  // stream mode: bytes a producer round lands (one D = 128 K and V tile)
static constexpr int STREAM_CHUNK = 16 * 1024;  // ... in bulk copies of this size
static constexpr int RING = 2;  // ring mode: K/V slots of each (the kernel's D = 128 STAGES)
static constexpr int SMEM_BYTES = FC_SWZ_GROUP_BYTES + Q_BYTES + 2 * RING * KV_BYTES + 64 + STREAM_BYTES;
static_assert(SMEM_BYTES + 128 <= FC_SM90_SMEM_MAX,  // (the static few bytes fit beside)
              "Q, the ring, the sink and the stream area must fit one CTA");
static constexpr int RELEASES_PER_THREAD = 256;  // ring mode's empty barriers: every thread of both consumers
static constexpr int RELEASES_PER_WARP = 8;      // ... or lane 0 of each of their warps (ringw)
static constexpr unsigned BOTH_HALVES = 3u;      // a rescale mask voting both row halves (softmax_tile's)
using T = __half;

// MODE_RING: "now" on the kernel's K/V ring (below); MODE_RING_WARP: the same
// with one release per warp (lane 0, after __syncwarp) in place of one per thread;
// MODE_RING_RESCALE: MODE_RING with the O rescale run at every step (both row
// halves voted), as a row's first steps do, where its maximum still moves.
// MODE_RING_NOSUM: MODE_RING without the row sums' FADDs (l stays 0: a bound on
// what taking them off the consumer's chain gives); MODE_RING_ONES: the same
// softmax, with the row sums from the tensor core: P V as m64n136k16, its last 8
// columns read from a 16 KB block of ones after each V slot (ONES_BYTES), so
// that O's columns 128-135 accumulate sum(P) and rescale with O; MODE_RING_NOPIN:
// MODE_RING without the PIN_SOFTMAX store (the row sums kept). MODE_RING_TMA:
// MODE_RING with the slots filled as the kernel's producer fills them (TMA
// tensor loads of 64-column slabs, 128-byte swizzle) from K and V tensors of
// TMA_HEADS heads of TMA_KEYS keys, each CTA walking them as the kernel's static
// order deals S = 2k tiles (ring_producer_tma); MODE_RING_TMA_HALF: the same
// with only the first slab of each tile loaded (half the bytes, as session 26's bound).
enum {
    MODE_NOW = 0, MODE_AHEAD = 1, MODE_SPLIT = 2, MODE_MMA = 3, MODE_RING = 4, MODE_RING_WARP = 5,
    MODE_RING_RESCALE = 6, MODE_RING_NOSUM = 7, MODE_RING_ONES = 8, MODE_RING_NOPIN = 9,
    MODE_RING_TMA = 10, MODE_RING_TMA_HALF = 11
};
static constexpr uint32_t ONES_BYTES = BC_MAX * FC_SWZ_ROW_BYTES;  // one 64-column slab of V's layout, all ones
static constexpr uint32_t FP16_ONES = 0x3C003C00u;                 // two fp16 1.0
static constexpr int ONES_SMEM = FC_SWZ_GROUP_BYTES + Q_BYTES + RING * (2 * KV_BYTES + ONES_BYTES) + 64;
static_assert(ONES_SMEM + 128 <= FC_SM90_SMEM_MAX, "Q, the ring with its ones and the sink must fit one CTA");
__host__ __device__ constexpr uint32_t v_stride(int mode) { return mode == MODE_RING_ONES ? KV_BYTES + ONES_BYTES : KV_BYTES; }
__host__ __device__ constexpr int smem_bytes(int mode) { return mode == MODE_RING_ONES ? ONES_SMEM : SMEM_BYTES; }

// The softmax of s in two parts (split): row maxima, corr and the rescale vote
// (softmax_tile's), then P of row half HR into pn's A fragments, returning that
// half's row sum.
template <int BC>
__device__ __forceinline__ unsigned soft_max(const float (&s)[BC / 2], float (&m_i)[2], float (&m_use)[2],
                                             float (&corr)[2], float scale_log2) {
    unsigned rescale = 0;
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        bool changed;
        m_use[hr] = softmax_row_max<BC>(s, hr, m_i, corr, scale_log2, changed);
        rescale |= (unsigned)__any_sync(0xffffffffu, changed) << hr;
    }
    return rescale;
}
template <int BC, int HR>
__device__ __forceinline__ float soft_half(const float (&s)[BC / 2], uint32_t (&pn)[BC / 16][4], float m_use,
                                           float scale_log2) {
    float rs = 0.f;
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int i = 8 * kk + 4 * h + 2 * HR;
            const float p0 = fast_exp2(fmaf(s[i], scale_log2, -m_use));
            const float p1 = fast_exp2(fmaf(s[i + 1], scale_log2, -m_use));
            rs += p0;
            rs += p1;
            pn[kk][2 * h + HR] = pack2<T>(p0, p1);
        }
    return rs;
}

// Two fp16 operands for the 4-byte word at a: zeros (fill 0), or with fill 1
// hashed values of random sign and magnitude in [0.5, 1) (exponent 14), so
// that S has a spread of about +-6 and the row maxima move now and then.
__host__ __device__ __forceinline__ uint32_t operand_word(uint32_t fill, uint32_t a) {
    if (fill == 0) return 0u;
    uint32_t x = a * 0x9E3779B1u;
    x ^= x >> 15;
    x *= 0x85EBCA77u;
    x ^= x >> 13;
    return (x & 0x83ff83ffu) | 0x38003800u;
}

// Lands `bytes` from src at shared address dst by bulk copies of STREAM_CHUNK,
// completing on mbarrier bar (whose arrival here expects them).
__device__ __forceinline__ void land_bytes(uint32_t dst, const unsigned char* src, int bytes, uint32_t bar) {
    mbar_expect_tx(bar, bytes);
    for (int c = 0; c < bytes / STREAM_CHUNK; ++c)
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                         dst + c * STREAM_CHUNK),
                     "l"(src + c * STREAM_CHUNK), "r"(STREAM_CHUNK), "r"(bar)
                     : "memory");
}

// Stream mode: the producer warpgroup's thread 0 lands STREAM_BYTES from src in
// shared memory (bulk copies, completing on bar) every `gap` cycles (0: back to
// back), as the kernel's producer lands K and V, until both consumers are done.
__device__ int stream_rounds(const unsigned char* src, uint32_t dst, uint32_t bar, int gap, volatile int* done) {
    uint32_t parity = 0;
    int rounds = 0;
    long long next = clock64();
    while (*done < 2) {
        land_bytes(dst, src, STREAM_BYTES, bar);
        mbar_wait(bar, parity);  // this round's bytes have landed
        parity ^= 1;
        ++rounds;
        next += gap;
        while (clock64() < next) {
        }
    }
    return rounds;
}

// Ring mode's barriers, RING of each from `bars` (8 bytes apart).
struct RingBars {
    uint32_t k_full, v_full, k_empty, v_empty;
    __device__ explicit RingBars(uint32_t bars)
        : k_full(bars), v_full(bars + 8 * RING), k_empty(bars + 16 * RING), v_empty(bars + 24 * RING) {}
};

// The ring's producer loop (thread 0 of warpgroup 0): K/V tile j into ring slot
// j % RING for j = 0 .. n (K) and 0 .. n - 1 (V), in the kernel producer's
// order (K_j, then V_j), each once its empty barrier says both consumers are
// done with the slot, by fill_k(j, st) and fill_v(j, st).
template <typename FillK, typename FillV>
__device__ void ring_fill(uint32_t bars, int n, FillK fill_k, FillV fill_v) {
    const RingBars rb(bars);
    for (int j = 0; j <= n; ++j) {
        const int st = j % RING;
        const uint32_t free_parity = ((j / RING) & 1) ^ 1;
        mbar_wait(rb.k_empty + 8 * st, free_parity);  // K slot st is free
        fill_k(j, st);
        if (j == n) break;
        mbar_wait(rb.v_empty + 8 * st, free_parity);  // V slot st is free
        fill_v(j, st);
    }
}

// Ring mode's producer: with src by bulk copies of KV_BYTES completing on the full
// barrier (K from src, V from src + KV_BYTES; V slots vstride apart), without by a
// plain arrival.
__device__ void ring_producer(const unsigned char* src, uint32_t sK, uint32_t sV, uint32_t vstride, uint32_t bars,
                              int n) {
    const RingBars rb(bars);
    auto fill = [&](uint32_t dst, const unsigned char* from, uint32_t full) {
        if (src) land_bytes(dst, from, KV_BYTES, full);
        else mbar_arrive(full);
    };
    ring_fill(
        bars, n, [&](int, int st) { fill(sK + st * KV_BYTES, src, rb.k_full + 8 * st); },
        [&](int, int st) { fill(sV + st * vstride, src + KV_BYTES, rb.v_full + 8 * st); });
}

// Tensor ring mode's K and V (B = 1, TMA_HEADS heads of TMA_KEYS keys, D = 128, fp16).
static constexpr int TMA_KEYS = 2048;                      // keys per head (the grid's S = 2k)
static constexpr int TMA_KV_TILES = TMA_KEYS / BC_MAX;    // K/V tiles per query tile (16)
static constexpr int TMA_QBLOCKS = TMA_KEYS / BR;         // query tiles per head (16)
static constexpr int TMA_HEADS = 64;                      // enough for (132 + 132 * 4) tiles of 16 per head
struct RingMaps {
    CUtensorMap k, v;
};

// Tensor ring mode's producer: as ring_producer, with
// K/V tile j of this CTA's walk loaded by TMA: the kernel's static order gives
// CTA c the tiles c, c + grid, ... of 16 per head (each tile 16 K/V tiles), so
// K/V tile j is key block j % 16 of head (c + grid (j / 16)) / 16; each slab
// is one load (the kernel's load_slabs), only the first with `half`.
__device__ void ring_producer_tma(const RingMaps& maps, uint32_t sK, uint32_t sV, uint32_t bars, int n, bool half) {
    const RingBars rb(bars);
    auto fill = [&](uint32_t dst, const CUtensorMap* map, uint32_t full, int j) {
        const int tile = (int)blockIdx.x + (int)gridDim.x * (j / TMA_KV_TILES);
        const int head = tile / TMA_QBLOCKS, row = (j % TMA_KV_TILES) * BC_MAX;
        mbar_expect_tx(full, half ? KV_BYTES / 2 : KV_BYTES);
        for (int sl = 0; sl < (half ? 1 : DP / FC_SLAB_COLS); ++sl)
            tma_load_4d(dst + sl * BC_MAX * FC_SWZ_ROW_BYTES, map, full, sl * FC_SLAB_COLS, row, head, 0);
    };
    ring_fill(
        bars, n, [&](int j, int st) { fill(sK + st * KV_BYTES, &maps.k, rb.k_full + 8 * st, j); },
        [&](int j, int st) { fill(sV + st * KV_BYTES, &maps.v, rb.v_full + 8 * st, j); });
}

// out[(cta * 2 + warpgroup) * 4 + {0, 1, 2, 3}]: the warpgroup's first and last
// timed clock64, then the same two moments' globaltimer (ns). sink_out (null
// here) would take a checksum per thread; as a runtime pointer it keeps the
// compiler from dropping any wgmma. src, gap: stream mode (null: none), its
// round count in out[MAX_SMS * 8 + cta]. maps: tensor ring mode's K and V.
template <int MODE, int REGS, int BC>
__global__ void __launch_bounds__(REGS ? 384 : 256, 1)
    loop_sched_kernel(long long* out, float* sink_out, uint32_t fill, int steps, const unsigned char* src, int gap,
                      const __grid_constant__ RingMaps maps) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ unsigned char smem[];
    const uint32_t sQ = (smem_u32(smem) + FC_SWZ_GROUP_BYTES - 1) & ~(FC_SWZ_GROUP_BYTES - 1);
    constexpr bool ones = MODE == MODE_RING_ONES;
    constexpr uint32_t VS = v_stride(MODE);
    const uint32_t sK = sQ + Q_BYTES, sV = sK + RING * KV_BYTES, sink = sV + RING * VS;
    for (uint32_t a = sQ + 16 * threadIdx.x; a < sink; a += 16 * blockDim.x) {
        const bool one = ones && a >= sV && (a - sV) % VS >= KV_BYTES;  // a ones block
        uint32_t w[4];
        for (int i = 0; i < 4; ++i) w[i] = one ? FP16_ONES : operand_word(fill, a + 4 * i);
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3])
                     : "memory");
    }
    __shared__ alignas(8) unsigned long long stream_bar;
    __shared__ int done;  // consumer warpgroups done (stream mode)
    // ring mode: k_full, v_full, k_empty, v_empty (RING of each)
    __shared__ alignas(8) unsigned long long ring_bar[4 * RING];
    constexpr bool ring = MODE >= MODE_RING;
    const uint32_t bars = smem_u32(ring_bar);
    if (threadIdx.x == 0) {
        done = 0;
        mbar_init(smem_u32(&stream_bar), 1);
        for (int i = 0; i < 2 * RING; ++i) {
            mbar_init(bars + 8 * i, 1);  // full: the producer's arrival; empty (below): the consumers'
            mbar_init(bars + 8 * (2 * RING + i), MODE == MODE_RING_WARP ? RELEASES_PER_WARP : RELEASES_PER_THREAD);
        }
        mbar_init_fence();
    }
    fence_proxy_async();  // the zeros (generic proxy) before the wgmmas read them (async proxy)
    __syncthreads();      // every thread's zeros are written before any wgmma; the barrier and done are set
    static_assert(!ring || REGS > 0, "ring mode needs the producer warpgroup");
    if constexpr (REGS > 0) {  // the kernel's register split: a producer warpgroup gives its registers away
        if (threadIdx.x < 128) {
            setmaxnreg_dec<REGS == 240 ? 24 : 40>();
            if (ring) {
                if (threadIdx.x == 0) {
                    if constexpr (MODE == MODE_RING_TMA || MODE == MODE_RING_TMA_HALF)
                        ring_producer_tma(maps, sK, sV, bars, steps + WARMUP, MODE == MODE_RING_TMA_HALF);
                    else
                        ring_producer(src, sK, sV, VS, bars, steps + WARMUP);
                }
            } else if (src && threadIdx.x == 0)
                out[MAX_SMS * 8 + blockIdx.x] = stream_rounds(src, sink + 64, smem_u32(&stream_bar), gap, &done);
            return;
        }
        setmaxnreg_inc<REGS>();
    }
    const int cw = threadIdx.x / 128 - (REGS > 0), warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
    const uint32_t q_rows = sQ + cw * 64 * FC_SWZ_ROW_BYTES;
    const float scale_log2 = 0.125f * FC_LOG2E;
    constexpr int ON = ones ? 136 : 128;  // O's columns (ones: 8 of row sums)
    float o[1][ON / 2], s[BC / 2], s2[BC / 2];
    uint32_t pa[BC / 16][4], pb[BC / 16][4];
    float m_i[2] = {-INFINITY, -INFINITY}, l_i[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < ON / 2; ++i) o[0][i] = 0.f;
#pragma unroll
    for (int k = 0; k < BC / 16; ++k)
#pragma unroll
        for (int r = 0; r < 4; ++r) pa[k][r] = pb[k][r] = operand_word(fill, threadIdx.x * 64 + k * 4 + r);
    auto pin = [&]() {  // the kernel's PIN_SOFTMAX store
        if (lane == 0) st_shared_f32(sink + 4 * (cw * 4 + warp), l_i[0] + l_i[1]);
    };
    long long t0 = 0, g0 = 0;
    if constexpr (ring) {
        // The kernel's loop (its overlap path) on the ring: K/V tile j in slot j % RING,
        // step j waits for K_{j+1} and V_j and releases each slot once its wgmmas are done.
        const RingBars rb(bars);
        auto release = [&](uint32_t bar) {
            if constexpr (MODE == MODE_RING_WARP) {
                __syncwarp();  // every lane's wgmma wait has returned before lane 0 releases for the warp
                if (lane == 0) mbar_arrive(bar);
            } else {
                mbar_arrive(bar);
            }
        };
        mbar_wait(rb.k_full, 0);  // K_0 has landed
        issue_qk<DP, BR, BC, T, true>(s, q_rows, sK);
        wgmma_wait<0>();  // S_0 is done: its reads of K slot 0 are over
        fence_regs(s);
        release(rb.k_empty);  // done with K slot 0
        for (int j = 0; j < steps + WARMUP; ++j) {
            if (j == WARMUP) t0 = clock64(), g0 = globaltimer_ns();
            const int gn = j + 1, st = j % RING, sn = gn % RING;
            fence_regs(o[0]);
            mbar_wait(rb.k_full + 8 * sn, (gn / RING) & 1);  // K_{j+1} has landed
            issue_qk<DP, BR, BC, T, true>(s, q_rows, sK + sn * KV_BYTES);
            mbar_wait(rb.v_full + 8 * st, (j / RING) & 1);  // V_j has landed
            issue_pv<BC, ON, 1, T, true>(o, pa, sV + st * VS);  // (ones: V's third slab is the ones block)
            wgmma_wait<1>();  // S_{j+1} is done
            fence_regs(s);
            release(rb.k_empty + 8 * sn);  // done with K slot sn
            float corr[2];
            unsigned rescale = softmax_tile<BC, true, !(MODE == MODE_RING_NOSUM || ones)>(s, m_i, l_i, corr, scale_log2);
            // (every step's S is the same, so that the maxima stop moving after the first)
            if constexpr (MODE == MODE_RING_RESCALE) rescale = __shfl_sync(0xffffffffu, BOTH_HALVES | rescale, 0);
            if constexpr (MODE != MODE_RING_NOPIN) pin();
            wgmma_wait<0>();  // P_j V_j is done
            fence_regs(o[0]);
            release(rb.v_empty + 8 * st);  // done with V slot st
            rescale_o<1, ON>(o, rescale, corr);
            pack_p<BC, T>(pa, s);
        }
    } else if constexpr (MODE == MODE_NOW || MODE == MODE_MMA) {
        for (int j = 0; j < steps + WARMUP; ++j) {
            if (j == WARMUP) t0 = clock64(), g0 = globaltimer_ns();
#pragma unroll
            for (int pp = 0; pp < 1; ++pp) fence_regs(o[pp]);
            issue_qk<DP, BR, BC, T, true>(s, q_rows, sK);
            issue_pv<BC, 128, 1, T, true>(o, pa, sV);
            wgmma_wait<1>();
            fence_regs(s);
            float corr[2] = {1.f, 1.f};
            unsigned rescale = 0;
            if constexpr (MODE == MODE_NOW) {
                rescale = softmax_tile<BC, true>(s, m_i, l_i, corr, scale_log2);
                pin();
            } else {
                // Reads this step's S: with no reader ptxas drops the S wgmmas of
                // every other step as dead (their S is overwritten unread).
                l_i[0] += s[0];
            }
            wgmma_wait<0>();
            fence_regs(o[0]);
            rescale_o<1, 128>(o, rescale, corr);
            if constexpr (MODE == MODE_NOW) pack_p<BC, T>(pa, s);
        }
    } else {
        // S_{j+1} in sc (issued a step earlier), P_j in pc; P_{j+1} into pn, S_{j+2} into sx.
        auto step = [&](auto& sc, auto& sx, auto& pc, auto& pn, auto issue) {
            constexpr bool ISSUE = decltype(issue)::value;
            fence_regs(o[0]);
            issue_pv<BC, 128, 1, T, true>(o, pc, sV);
            wgmma_wait<1>();  // S_{j+1} is done
            fence_regs(sc);
            float corr[2];
            unsigned rescale;
            if constexpr (MODE == MODE_SPLIT) {
                float m_use[2];
                rescale = soft_max<BC>(sc, m_i, m_use, corr, scale_log2);
                const float rs0 = soft_half<BC, 0>(sc, pn, m_use[0], scale_log2);
                if constexpr (ISSUE) issue_qk<DP, BR, BC, T, true>(sx, q_rows, sK);
                const float rs1 = soft_half<BC, 1>(sc, pn, m_use[1], scale_log2);
                l_i[0] = l_i[0] * corr[0] + rs0;
                l_i[1] = l_i[1] * corr[1] + rs1;
                pin();
            } else {
                rescale = softmax_tile<BC, true>(sc, m_i, l_i, corr, scale_log2);
                pack_p<BC, T>(pn, sc);
                pin();
                if constexpr (ISSUE) issue_qk<DP, BR, BC, T, true>(sx, q_rows, sK);
            }
            if constexpr (ISSUE) wgmma_wait<1>();  // P_j V_j is done
            else wgmma_wait<0>();
            fence_regs(o[0]);
            rescale_o<1, 128>(o, rescale, corr);
        };
        // The kernel's loop shape: two steps a turn, the register sets trading roles,
        // and the last step (no S issued) and a last P V peeled off at either exit.
        using Yes = std::integral_constant<bool, true>;
        using No = std::integral_constant<bool, false>;
        auto last_pv = [&](auto& pc) {
            fence_regs(o[0]);
            issue_pv<BC, 128, 1, T, true>(o, pc, sV);
            wgmma_wait<0>();
            fence_regs(o[0]);
        };
        issue_qk<DP, BR, BC, T, true>(s, q_rows, sK);
        t0 = clock64(), g0 = globaltimer_ns();
        for (int j = 0;;) {
            if (j + 2 >= steps) {
                step(s, s2, pa, pb, No{});
                last_pv(pb);
                break;
            }
            if (MODE == MODE_SPLIT) step(s, s2, pa, pb, Yes{});
            else step(s, s, pa, pb, Yes{});
            ++j;
            if (j + 2 >= steps) {
                if (MODE == MODE_SPLIT) step(s2, s, pb, pa, No{});
                else step(s, s, pb, pa, No{});
                last_pv(pa);
                break;
            }
            if (MODE == MODE_SPLIT) step(s2, s, pb, pa, Yes{});
            else step(s, s, pb, pa, Yes{});
            ++j;
        }
        wgmma_wait<0>();
        fence_regs(s);
    }
    const long long t1 = clock64(), g1 = globaltimer_ns();
    float sum = l_i[0] + l_i[1];
#pragma unroll
    for (int i = 0; i < ON / 2; ++i) sum += o[0][i];
#pragma unroll
    for (int i = 0; i < BC / 2; ++i) sum += s[i] + (MODE == MODE_SPLIT ? s2[i] : 0.f);
#pragma unroll
    for (int k = 0; k < BC / 16; ++k) sum += (float)(pa[k][0] ^ pb[k][3]);
    if (sink_out) sink_out[blockIdx.x * blockDim.x + threadIdx.x] = sum;  // (never: keeps every register live)
    if (threadIdx.x % 128 == 0) {  // this warpgroup's first and last timed clock (one SM clock for both)
        atomicAdd(&done, 1);
        long long* w = out + (blockIdx.x * 2 + cw) * 4;
        w[0] = t0;
        w[1] = t1;
        w[2] = g0;
        w[3] = g1;
    }
#endif
}

static int check(cudaError_t e, const char* what) { return tool_check("loop_sched", e, what); }

static RingMaps g_maps;  // tensor ring mode's maps (zeros until main builds them)

template <int MODE, int REGS, int BC = 128>
static int run(long long* dout, int grid, uint32_t fill, const unsigned char* src = nullptr, int gap = 0) {
    static long long h[MAX_SMS * 9];
    static const char* names[12] = {"now",  "ahead", "split", "mma",   "ring", "ringw",
                                    "ringr", "nosum", "ones",  "nopin", "ringt", "ringth"};
    if (check(cudaFuncSetAttribute(loop_sched_kernel<MODE, REGS, BC>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   smem_bytes(MODE)),
              "smem attribute") ||
        check(cudaMemset(dout, 0, sizeof(h)), "memset"))
        return 1;
    for (int rep = 0; rep < 2; ++rep) {  // the first launch warms the clocks
        loop_sched_kernel<MODE, REGS, BC>
            <<<grid, REGS ? 384 : 256, smem_bytes(MODE)>>>(dout, nullptr, fill, STEPS * 128 / BC, src, gap, g_maps);
        if (check(cudaGetLastError(), "launch") || check(cudaDeviceSynchronize(), "kernel")) return 1;
    }
    if (check(cudaMemcpy(h, dout, sizeof(h), cudaMemcpyDeviceToHost), "copy")) return 1;
    // span: from the CTA's first warpgroup start to its last warpgroup end; wg:
    // each warpgroup's own time (the two differ when one runs ahead of the other)
    // ns: the same span in globaltimer time, so that span / ns is the SM clock
    // and the tensor work over ns a rate (TFLOP/s over all CTAs)
    double span = 0, wg = 0, ns = 0;
    for (int c = 0; c < grid; ++c) {
        const long long* a = h + 8 * c;  // warpgroup 0: t0, t1, g0, g1
        const long long* b = a + 4;      // warpgroup 1
        span += (double)((a[1] > b[1] ? a[1] : b[1]) - (a[0] < b[0] ? a[0] : b[0]));
        ns += (double)((a[3] > b[3] ? a[3] : b[3]) - (a[2] < b[2] ? a[2] : b[2]));
        wg += (double)(a[1] - a[0]) + (double)(b[1] - b[0]);
    }
    const int steps = STEPS * 128 / BC;
    const double per = 128.0 / BC / (double)steps / grid;  // per 128 keys, mean over CTAs
    const double flop = 2.0 * 4.0 * 64 * DP * BC * steps;  // one CTA's timed S and P V work
    char what[48];
    double rounds = 0;
    for (int c = 0; c < grid; ++c) rounds += (double)h[MAX_SMS * 8 + c];
    // (rounds span the whole launch, warm-up steps included: a rate, not an exact share)
    if (MODE >= MODE_RING_TMA) snprintf(what, sizeof what, "random, tensor TMA%s", MODE == MODE_RING_TMA_HALF ? ", half" : "");
    else if (MODE >= MODE_RING) snprintf(what, sizeof what, "%s, ring %s", fill ? "random" : "zeros", src ? "TMA" : "sync only");
    else if (src) snprintf(what, sizeof what, "%s, stream gap %d: %.0f B/clk", fill ? "random" : "zeros", gap,
                      rounds * STREAM_BYTES / span);
    else snprintf(what, sizeof what, "%s", fill ? "random" : "zeros");
    printf("%-6s %3d registers  BC %3d  %-34s span %6.0f  warpgroup %6.0f cycles per 128 keys, %4.0f MHz, "
           "%4.0f TFLOP/s\n",
           names[MODE], REGS ? REGS : 255, BC, what, span * per, wg * per / 2, span / ns * 1e3,
           flop * grid / (ns / grid) * 1e-3);
    return 0;
}

int main(int argc, char** argv) {
    if (argc > 2 || (argc == 2 && strcmp(argv[1], "ring") != 0 && strcmp(argv[1], "sums") != 0 &&
                     strcmp(argv[1], "tma") != 0)) {
        fprintf(stderr, "usage: loop_sched [ring|sums|tma]   (that section alone: the K/V ring, the row sums, "
                        "the ring filled by TMA tensor loads)\n");
        return 2;
    }
    long long* dout = nullptr;
    int grid = 0;
    if (tool_sm_grid("loop_sched", MAX_SMS, &grid)) return 1;
    if (check(cudaMalloc(&dout, MAX_SMS * 9 * sizeof(long long)), "malloc")) return 1;
    int bad = 0;
    const bool ring_only = argc == 2;  // `loop_sched ring`, `sums` or `tma`: that section alone
    const bool sums = argc == 2 && strcmp(argv[1], "sums") == 0;
    const bool tma = argc == 2 && strcmp(argv[1], "tma") == 0;
    for (uint32_t fill = 0; fill < (ring_only ? 0u : 2u); ++fill) {  // operands: zeros, then random (operand_word)
        for (int round = 0; round < 2; ++round) {
            const int g = grid;
            const uint32_t f = fill;
            bad |= run<MODE_MMA, 0>(dout, g, f) | run<MODE_NOW, 0>(dout, g, f) | run<MODE_AHEAD, 0>(dout, g, f) |
                   run<MODE_SPLIT, 0>(dout, g, f) | run<MODE_NOW, 232>(dout, g, f) | run<MODE_AHEAD, 232>(dout, g, f) |
                   run<MODE_NOW, 240>(dout, g, f) | run<MODE_AHEAD, 240>(dout, g, f) | run<MODE_NOW, 200>(dout, g, f) |
                   run<MODE_AHEAD, 200>(dout, g, f) | run<MODE_MMA, 0, 64>(dout, g, f) |
                   run<MODE_NOW, 232, 64>(dout, g, f) | run<MODE_AHEAD, 232, 64>(dout, g, f) |
                   run<MODE_SPLIT, 232, 64>(dout, g, f);
        }
    }
    // Stream mode: K and V bytes landing beside the loop, at the kernel's rate
    // (64 KB per ~2600-cycle step at D = 128) and back to back.
    unsigned char* src = nullptr;
    if (check(cudaMalloc(&src, STREAM_BYTES), "malloc") || check(cudaMemset(src, 0, STREAM_BYTES), "memset")) return 1;
    for (int round = 0; round < (ring_only ? 0 : 2); ++round) {
        for (int gap : {-1, 2600, 0}) {
            const unsigned char* sp = gap < 0 ? nullptr : src;
            bad |= run<MODE_MMA, 240>(dout, grid, 1, sp, gap) | run<MODE_NOW, 240>(dout, grid, 1, sp, gap) |
                   run<MODE_AHEAD, 240>(dout, grid, 1, sp, gap) | run<MODE_NOW, 232>(dout, grid, 1, sp, gap);
        }
    }
    // Ring mode: the kernel's loop with its K/V ring (waits, releases per thread or per warp, the
    // slot addresses), the slots refilled by bulk copies of random operands or, with
    // "sync only", by the producer's arrivals alone.
    static uint32_t host_words[STREAM_BYTES / 4];
    for (int i = 0; i < STREAM_BYTES / 4; ++i) host_words[i] = operand_word(1, 4 * i);
    if (check(cudaMemcpy(src, host_words, STREAM_BYTES, cudaMemcpyHostToDevice), "copy")) return 1;
    // Row sums (`loop_sched sums`): the ring loop with its FADDs, without them, and
    // with the sums from the tensor core (m64n136k16 on a block of ones).
    for (int round = 0; round < (sums ? 2 : 0); ++round) {
        bad |= run<MODE_RING, 240>(dout, grid, 1, src) | run<MODE_RING_NOSUM, 240>(dout, grid, 1, src) |
               run<MODE_RING_ONES, 240>(dout, grid, 1, src) | run<MODE_RING_NOPIN, 240>(dout, grid, 1, src) |
               run<MODE_RING, 232>(dout, grid, 1, src) | run<MODE_RING_NOSUM, 232>(dout, grid, 1, src) |
               run<MODE_RING_ONES, 232>(dout, grid, 1, src) | run<MODE_RING_NOPIN, 232>(dout, grid, 1, src);
    }
    // Tensor ring mode (`loop_sched tma`): the ring filled by bulk copies of one buffer, by
    // the kernel's TMA tensor loads walking K and V as its tiles do, and by half of them.
    if (tma) {
        const size_t elems = (size_t)TMA_HEADS * TMA_KEYS * DP;
        std::vector<uint32_t> words(elems / 2);
        for (size_t i = 0; i < words.size(); ++i) words[i] = operand_word(1, (uint32_t)(4 * i));
        void *dk = nullptr, *dv = nullptr;
        if (check(cudaMalloc(&dk, elems * 2), "malloc") || check(cudaMalloc(&dv, elems * 2), "malloc") ||
            check(cudaMemcpy(dk, words.data(), elems * 2, cudaMemcpyHostToDevice), "copy") ||
            check(cudaMemcpy(dv, words.data(), elems * 2, cudaMemcpyHostToDevice), "copy"))
            return 1;
        for (int i = 0; i < 2; ++i) {
            CUtensorMap* m = i ? &g_maps.v : &g_maps.k;
            if (fc_sm90_tensor_map(m, FC_DTYPE_FP16, i ? dv : dk, DP, TMA_KEYS, TMA_HEADS, 1, DP, (int64_t)TMA_KEYS * DP,
                                   (int64_t)TMA_HEADS * TMA_KEYS * DP, BC_MAX) != FC_OK) {
                fprintf(stderr, "loop_sched: tensor map failed\n");
                return 1;
            }
        }
        for (int round = 0; round < 2; ++round) {
            bad |= run<MODE_RING, 240>(dout, grid, 1, src) | run<MODE_RING_TMA, 240>(dout, grid, 1) |
                   run<MODE_RING_TMA_HALF, 240>(dout, grid, 1) | run<MODE_RING, 232>(dout, grid, 1, src) |
                   run<MODE_RING_TMA, 232>(dout, grid, 1) | run<MODE_RING_TMA_HALF, 232>(dout, grid, 1);
        }
        cudaFree(dk);
        cudaFree(dv);
    }
    for (int round = 0; round < (sums || tma ? 0 : 2); ++round) {
        bad |= run<MODE_NOW, 240>(dout, grid, 1) | run<MODE_RING, 240>(dout, grid, 1) |
               run<MODE_RING, 240>(dout, grid, 1, src) | run<MODE_RING_WARP, 240>(dout, grid, 1, src) |
               run<MODE_RING_RESCALE, 240>(dout, grid, 1, src) | run<MODE_NOW, 232>(dout, grid, 1) |
               run<MODE_RING, 232>(dout, grid, 1, src) | run<MODE_RING_WARP, 232>(dout, grid, 1, src) |
               run<MODE_RING_RESCALE, 232>(dout, grid, 1, src);
    }
    cudaFree(src);
    cudaFree(dout);
    return bad;
}
