// wgmma_queue.cu -- microbenchmark: how long a warpgroup's wgmma issue takes
// against the execution of what it issued (sm90a), no torch.
//
//   nvcc -O3 -std=c++17 -Icsrc -gencode=arch=compute_90a,code=sm_90a -cudart static \
//        -o build/wgmma_queue csrc/tools/wgmma_queue.cu
//   build/wgmma_queue          # on the GPU machine
//
// One CTA per SM, one or two warpgroups, each issuing m64n128k16 fp16 wgmma
// groups in a loop as the attention kernel's consumers do: a group of N with
// both operands in shared memory (S = Q K^T: N = 8 at D = 128), optionally
// followed by a group of 8 with A from registers (P V). clock64 readings give,
// per iteration: the cycles spent issuing each group, until the first group is
// done, and until both are. Shared memory holds whatever it held: the timing
// does not depend on the values. At the full rate an SM runs one such wgmma in
// 64 cycles (4096 FLOP per clock). Measured on an H100 (perf notes, session 25):
// issue returns at once while about eight are outstanding per SM (both
// warpgroups together), and blocks beyond that until the queue drains.
#include <cuda_fp16.h>
#include <stdio.h>

#include "common/ptx.cuh"
#include "sm90/hopper.cuh"
#include "sm90/wgmma_ops.cuh"
#include "tools/tool_util.h"

static constexpr int MAX_SMS = 1024;       // output slots; the grid is one CTA per SM
static constexpr int ITERS = 64;          // timed iterations per warpgroup
static constexpr int WARMUP = 4;          // iterations left out of the means
static constexpr int SMEM_BYTES = 100 * 1024;
static constexpr int SLOTS = 4;           // readings per warpgroup: issue SS, issue RS, first wait, all done
static constexpr uint32_t A_BYTES = 64 * 128 * 2;    // 64 x 128 fp16 A tile (Q rows)
static constexpr uint32_t B_BYTES = 128 * 128 * 2;   // 128 x 128 fp16 B tile (K or V)

// Modes: SS group only, SS group then RS group, RS group only.
enum { MODE_SS = 0, MODE_SS_RS = 1, MODE_RS = 2 };

__device__ __forceinline__ long long clk() {
    long long t;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
    return t;
}

template <int N>
__device__ __forceinline__ void ss_group(float (&d)[64], uint64_t da, uint64_t db) {
#pragma unroll
    for (int k = 0; k < N; ++k)  // k steps of 32 bytes inside one slab, as issue_qk's
        wgmma_ss_n128<__half>(d, wgmma_desc_add(da, (k % 4) * 32), wgmma_desc_add(db, (k % 4) * 32), 1);
}

__device__ __forceinline__ void rs_group(float (&o)[64], const uint32_t (&pa)[8][4], uint64_t dv) {
#pragma unroll
    for (int k = 0; k < 8; ++k)  // 16-key steps of V, as issue_pv's
        wgmma_rs_n128<__half>(o, pa[k], wgmma_desc_add(dv, k * 16 * FC_SWZ_ROW_BYTES), 1);
}

// out[(cta * 2 + warpgroup) * (SLOTS + 1) + e]: mean cycles of reading e, then a checksum.
template <int MODE, int N>
__global__ void wgmma_queue_kernel(long long* out) {
    extern __shared__ unsigned char smem[];
    const uint32_t base = (smem_u32(smem) + FC_SWZ_GROUP_BYTES - 1) & ~(FC_SWZ_GROUP_BYTES - 1);
    const uint64_t da = wgmma_desc(base, 16, FC_SWZ_GROUP_BYTES);           // 64 x 128 A tile
    const uint64_t db = wgmma_desc(base + A_BYTES, 16, FC_SWZ_GROUP_BYTES);
    const uint64_t dv = wgmma_desc(base + A_BYTES + B_BYTES, 128 * FC_SWZ_ROW_BYTES, FC_SWZ_GROUP_BYTES);
    float d[64], o[64];
    uint32_t pa[8][4];
    for (int i = 0; i < 64; ++i) d[i] = o[i] = 0.f;
    for (int k = 0; k < 8; ++k)
        for (int r = 0; r < 4; ++r) pa[k][r] = 0x3c003c00u;  // (1.0, 1.0) in fp16
    long long acc[SLOTS] = {0, 0, 0, 0};
    for (int it = 0; it < ITERS + WARMUP; ++it) {
        const long long t0 = clk();
        wgmma_fence();
        if constexpr (MODE != MODE_RS) {
            ss_group<N>(d, da, db);
            wgmma_commit();
        }
        const long long t1 = clk();
        if constexpr (MODE != MODE_SS) {
            wgmma_fence();
            rs_group(o, pa, dv);
            wgmma_commit();
        }
        const long long t2 = clk();
        if constexpr (MODE == MODE_SS_RS) wgmma_wait<1>();
        else wgmma_wait<0>();
        fence_regs(d);
        const long long t3 = clk();
        wgmma_wait<0>();
        fence_regs(o);
        const long long t4 = clk();
        if (it >= WARMUP) {
            acc[0] += t1 - t0;
            acc[1] += t2 - t1;
            acc[2] += t3 - t0;
            acc[3] += t4 - t0;
        }
    }
    float sum = 0.f;
    for (int i = 0; i < 64; ++i) sum += d[i] + o[i];
    if (threadIdx.x % 128 == 0) {
        long long* r = out + (blockIdx.x * 2 + threadIdx.x / 128) * (SLOTS + 1);
        for (int e = 0; e < SLOTS; ++e) r[e] = acc[e] / ITERS;
        r[SLOTS] = (long long)sum;  // keeps the accumulators live
    }
}

static int check(cudaError_t e, const char* what) { return tool_check("wgmma_queue", e, what); }

template <int MODE, int N>
static int run(long long* dout, int grid, int warpgroups) {
    static long long h[MAX_SMS * 2 * (SLOTS + 1)];
    static const char* names[3] = {"SS group", "SS group + RS group of 8", "RS group of 8"};
    if (check(cudaFuncSetAttribute(wgmma_queue_kernel<MODE, N>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   SMEM_BYTES), "smem attribute") ||
        check(cudaMemset(dout, 0, sizeof(h)), "memset"))
        return 1;
    wgmma_queue_kernel<MODE, N><<<grid, 128 * warpgroups, SMEM_BYTES>>>(dout);
    if (check(cudaGetLastError(), "launch") || check(cudaDeviceSynchronize(), "kernel") ||
        check(cudaMemcpy(h, dout, sizeof(h), cudaMemcpyDeviceToHost), "copy"))
        return 1;
    double a[SLOTS] = {0, 0, 0, 0};
    int n = 0;
    for (int b = 0; b < grid; ++b)
        for (int w = 0; w < warpgroups; ++w, ++n)
            for (int e = 0; e < SLOTS; ++e) a[e] += (double)h[(b * 2 + w) * (SLOTS + 1) + e];
    printf("warpgroups %d  %-25s SS N %2d: issue SS %5.0f  issue RS %5.0f  first done %5.0f  all done %5.0f cycles\n",
           warpgroups, names[MODE], MODE == MODE_RS ? 0 : N, a[0] / n, a[1] / n, a[2] / n, a[3] / n);
    return 0;
}

int main() {
    long long* dout = nullptr;
    int grid = 0;
    if (tool_sm_grid("wgmma_queue", MAX_SMS, &grid)) return 1;
    if (check(cudaMalloc(&dout, MAX_SMS * 2 * (SLOTS + 1) * sizeof(long long)), "malloc")) return 1;
    int bad = 0;
    for (int wgs = 1; wgs <= 2; ++wgs) {
        bad |= run<MODE_SS, 1>(dout, grid, wgs) | run<MODE_SS, 2>(dout, grid, wgs) | run<MODE_SS, 4>(dout, grid, wgs);
        bad |= run<MODE_SS, 8>(dout, grid, wgs) | run<MODE_SS, 16>(dout, grid, wgs);
        bad |= run<MODE_SS_RS, 8>(dout, grid, wgs) | run<MODE_RS, 8>(dout, grid, wgs);
    }
    cudaFree(dout);
    return bad;
}
