// smem_rate.cu -- microbenchmark: the tensor rate of wgmma streams by shape and
// operand source, alone and with bulk copies landing in shared memory beside
// them (sm90a), no torch.
//
//   nvcc -O3 -std=c++17 -Icsrc -gencode=arch=compute_90a,code=sm_90a -cudart static \
//        -o build/smem_rate csrc/tools/smem_rate.cu
//   build/smem_rate          # on the GPU machine
//   build/smem_rate burn KIND SECONDS   # one kind (0-4, the enum below), two warpgroups, back to back
//
// burn: launches of 2^14 groups each for SECONDS, then TFLOP/s over them. Run
// it beside `nvidia-smi --query-gpu=power.draw,clocks.sm -lms 100`: at the
// power limit the sustained rate of SS against RS at the same FLOP per wgmma
// is their energy per FLOP, the question the forward's D = 256 lead left
// (perf notes, session 40: fewer shared-memory bytes per key).
//
// The question (perf notes, session 66). At 4096 FLOP and 128 bytes of shared
// memory per clock and SM, an m64n64k16 with both operands in shared memory
// (SS) reads 4 KB per 32 clocks, the whole bandwidth; an m64n128k16 SS reads
// 6 KB per 64 clocks (96 B/clock); an m64n32k16 SS 3 KB per 16 (192 B/clock:
// it cannot run at the full rate); an RS wgmma (A from registers) reads only B.
// The backward's S^T and dP^T are m64n64k16 SS at D = 128 and m64n32k16 at
// D = 256; at D = 64 they are m64n128k16. If the count is right, the first two
// lose rate to any write that lands in shared memory while they run.
//
// One CTA per SM: one or two warpgroups, each issuing groups of GROUP wgmmas
// into one accumulator (the next group issues while one is in flight), and, when
// on, a copier warp whose lane 0 keeps COPIES bulk copies of CHUNK bytes
// (cp.async.bulk from a 256 KB global buffer, L2-resident: how a TMA load lands)
// in flight into a region of its own until the warpgroups are done. Per case:
// cycles per wgmma and warpgroup, the SM's FLOP per clock (and its share of
// 4096), the wgmmas' operand bytes per clock, and the copier's bytes per clock.
// The operands are filled with fp16 values of random bits (exponent capped) first:
// the rate does not depend on values, but the power does.
#include <cuda_fp16.h>
#include <stdio.h>
#include <stdlib.h>

#include <string>

#include "common/ptx.cuh"
#include "sm90/hopper.cuh"
#include "sm90/wgmma_ops.cuh"
#include "tools/tool_util.h"

static constexpr int MAX_SMS = 1024;        // output slots; the grid is one CTA per SM
static constexpr int GROUP = 8;             // wgmmas per commit group (k steps, as the kernels issue them)
static constexpr int ITERS = 256;           // timed groups per warpgroup
static constexpr int WARMUP = 8;            // groups before the clock starts
static constexpr int BURN_ITERS = 1 << 14;  // groups per warpgroup and launch in burn mode
static constexpr int COPIES = 4;            // bulk copies the copier keeps in flight
static constexpr uint32_t CHUNK = 16384;    // bytes per bulk copy
static constexpr uint32_t SRC_BYTES = 256 * 1024;  // the global buffer the copies read (cycled)
static constexpr uint32_t A_BYTES = 64 * 128;      // A: one 64-row slab (K-major)
static constexpr uint32_t B_BYTES = 128 * 128 * 2; // B: 128 rows, two slabs (N-major for RS n128)
static constexpr uint32_t OFF_COPY = A_BYTES + B_BYTES;
static constexpr uint32_t OFF_BAR = OFF_COPY + COPIES * CHUNK;
static constexpr uint32_t OFF_DONE = OFF_BAR + COPIES * FC_MBAR_BYTES;
static constexpr int SMEM_BYTES = OFF_DONE + 16 + FC_SWZ_GROUP_BYTES;  // + alignment slack
static constexpr int OUT = 4;  // per CTA: cycles per wgmma (sum over warpgroups), copier bytes, copier cycles, checksum

enum { SS_N32, SS_N64, SS_N128, RS_N64, RS_N128, KINDS };
static const int KIND_N[KINDS] = {32, 64, 128, 64, 128};
static const bool KIND_SS[KINDS] = {true, true, true, false, false};

// One group of GROUP wgmmas of the kind into d (N / 2 floats used): SS k steps of 32 bytes inside A's and B's
// slab (K-major, as the kernels' S^T); RS k steps of 16 rows of an N-major B (as dV += P^T dO).
template <int KIND>
__device__ __forceinline__ void group(float (&d)[64], uint64_t da, uint64_t db, uint64_t dbn,
                                      const uint32_t (&pa)[4]) {
#pragma unroll
    for (int k = 0; k < GROUP; ++k) {
        const uint64_t a = wgmma_desc_add(da, (k % 4) * 32), b = wgmma_desc_add(db, (k % 4) * 32);
        const uint64_t bn = wgmma_desc_add(dbn, k * 16 * FC_SWZ_ROW_BYTES);
        if constexpr (KIND == SS_N32) wgmma_ss_n32<__half>(*reinterpret_cast<float(*)[16]>(d), a, b, 1);
        if constexpr (KIND == SS_N64) wgmma_ss_n64<__half>(*reinterpret_cast<float(*)[32]>(d), a, b, 1);
        if constexpr (KIND == SS_N128) wgmma_ss_n128<__half>(d, a, b, 1);
        if constexpr (KIND == RS_N64) wgmma_rs_n64<__half>(*reinterpret_cast<float(*)[32]>(d), pa, bn, 1);
        if constexpr (KIND == RS_N128) wgmma_rs_n128<__half>(d, pa, bn, 1);
    }
}

// Block: warpgroups x 128 threads, then the copier warp if copy. out[cta * OUT + e], see OUT.
// RS m64n128k16 takes 170 registers: with two warpgroups and the copier (nine warps, three on one
// SM sub-partition, whose register file holds 16384) it does not launch, and says so; capping its
// registers (launch bounds) makes ptxas serialize the wgmmas, which would time something else.
template <int KIND>
__global__ void smem_rate_kernel(const uint4* src, int copy, int iters, long long* out) {
    extern __shared__ unsigned char smem[];
    const uint32_t base = (smem_u32(smem) + FC_SWZ_GROUP_BYTES - 1) & ~(FC_SWZ_GROUP_BYTES - 1);
    const int wgs = blockDim.x / FC_WG_THREADS, tid = threadIdx.x;  // (the copier warp, if any, after them)
    volatile int* done = reinterpret_cast<volatile int*>(smem + (base + OFF_DONE - smem_u32(smem)));
    for (uint32_t i = tid; i < (A_BYTES + B_BYTES) / 4; i += blockDim.x) {  // operands: random fp16 pairs
        uint32_t h = (i + 1) * 2654435761u;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(base + 4 * i), "r"(h & 0xbbffbbffu) : "memory");  // |x| < 1
    }
    if (tid == 0) {
        *done = 0;
        for (int c = 0; c < COPIES; ++c) mbar_init(base + OFF_BAR + c * FC_MBAR_BYTES, 1);
        mbar_init_fence();
    }
    __syncthreads();  // the barriers, the done count and the operands before any use
    long long* o = out + blockIdx.x * OUT;
    if (tid >= wgs * FC_WG_THREADS) {  // the copier warp
        if (copy && tid % 32 == 0) {
            long long bytes = 0, n = 0;
            const long long t0 = clock64();
            for (int c = 0; c < COPIES; ++c, ++n) {
                mbar_expect_tx(base + OFF_BAR + c * FC_MBAR_BYTES, CHUNK);
                bulk_load(base + OFF_COPY + c * CHUNK, src + (n * CHUNK % SRC_BYTES) / 16, CHUNK,
                          base + OFF_BAR + c * FC_MBAR_BYTES);
            }
            for (int c = 0; *done < wgs; c = (c + 1) % COPIES, ++n) {
                const uint32_t bar = base + OFF_BAR + c * FC_MBAR_BYTES;
                mbar_wait(bar, ((n - COPIES) / COPIES) & 1);  // copy n - COPIES (into region c) has landed
                bytes += CHUNK;
                mbar_expect_tx(bar, CHUNK);
                bulk_load(base + OFF_COPY + c * CHUNK, src + (n * CHUNK % SRC_BYTES) / 16, CHUNK, bar);
            }
            o[1] = bytes;
            o[2] = clock64() - t0;
            for (long long m = n - COPIES; m < n; ++m)  // the copies still in flight, before the CTA exits
                mbar_wait(base + OFF_BAR + (m % COPIES) * FC_MBAR_BYTES, (m / COPIES) & 1);
        }
        return;
    }
    const uint64_t da = wgmma_desc(base, 16, FC_SWZ_GROUP_BYTES);
    const uint64_t db = wgmma_desc(base + A_BYTES, 16, FC_SWZ_GROUP_BYTES);
    const uint64_t dbn = wgmma_desc(base + A_BYTES, 128 * FC_SWZ_ROW_BYTES, FC_SWZ_GROUP_BYTES);
    float d[64];
    uint32_t pa[4];
    for (int i = 0; i < 64; ++i) d[i] = 0.f;
    for (int r = 0; r < 4; ++r) pa[r] = ((tid * 4 + r + 1) * 2654435761u) & 0xbbffbbffu;  // as the operands
    long long t0 = 0;
    for (int it = 0; it < iters + WARMUP; ++it) {
        if (it == WARMUP) {
            wgmma_wait<0>();
            t0 = clock64();
        }
        wgmma_fence();
        group<KIND>(d, da, db, dbn, pa);
        wgmma_commit();
        wgmma_wait<1>();  // one group in flight while the next issues
    }
    wgmma_wait<0>();
    fence_regs(d);
    const long long cycles = clock64() - t0;
    float sum = 0.f;
    for (int i = 0; i < 64; ++i) sum += d[i];
    if (tid % FC_WG_THREADS == 0) {
        atomicAdd(reinterpret_cast<unsigned long long*>(&o[0]), (unsigned long long)(cycles / iters));
        atomicAdd(reinterpret_cast<unsigned long long*>(&o[3]), (unsigned long long)(sum != 0.f));  // keeps d live
        atomicAdd((int*)done, 1);
    }
}

static int check(cudaError_t e, const char* what) { return tool_check("smem_rate", e, what); }

// FLOP of one m64nNk16 wgmma.
static double wgmma_flop(int n) { return 2.0 * 64 * n * 16; }

// The kernel of the kind allowed SMEM_BYTES of dynamic shared memory (before any launch of it).
template <int KIND>
static int allow_smem() {
    return check(cudaFuncSetAttribute(smem_rate_kernel<KIND>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES),
                 "smem attribute");
}

template <int KIND>
static int run(const uint4* src, long long* dout, int grid, int wgs, int copy) {
    static long long h[MAX_SMS * OUT];
    if (allow_smem<KIND>() || check(cudaMemset(dout, 0, sizeof(h)), "memset")) return 1;
    smem_rate_kernel<KIND><<<grid, wgs * FC_WG_THREADS + (copy ? 32 : 0), SMEM_BYTES>>>(src, copy, ITERS, dout);
    if (check(cudaGetLastError(), "launch") || check(cudaDeviceSynchronize(), "kernel") ||
        check(cudaMemcpy(h, dout, sizeof(h), cudaMemcpyDeviceToHost), "copy"))
        return 1;
    double per_group = 0, bytes = 0, ccycles = 0;
    for (int b = 0; b < grid; ++b) {
        per_group += (double)h[b * OUT] / wgs;
        bytes += (double)h[b * OUT + 1];
        ccycles += (double)h[b * OUT + 2];
    }
    per_group /= grid;
    const int n = KIND_N[KIND];
    const double per_wgmma = per_group / GROUP, flop = wgmma_flop(n) * wgs / per_wgmma;
    const double operand = ((KIND_SS[KIND] ? 64 * 16 * 2 : 0) + n * 16 * 2) * wgs / per_wgmma;
    printf("%s m64n%dk16  warpgroups %d  copier %-3s: %6.1f cycles per wgmma  %5.0f FLOP/clock (%3.0f %%)  "
           "operands %4.0f B/clock  copier %4.0f B/clock\n",
           KIND_SS[KIND] ? "SS" : "RS", n, wgs, copy ? "on" : "off", per_wgmma, flop, 100 * flop / 4096, operand,
           copy && ccycles > 0 ? bytes / ccycles : 0.0);
    return 0;
}

// burn: two warpgroups of the kind, no copier, launched back to back for `seconds`.
template <int KIND>
static int burn(const uint4* src, long long* dout, int grid, double seconds) {
    const int wgs = 2, n = KIND_N[KIND];
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    int bad = allow_smem<KIND>() || check(cudaEventCreate(&e0), "event") || check(cudaEventCreate(&e1), "event");
    long launches = 0;
    float ms = 0.f;
    if (!bad) cudaEventRecord(e0);
    while (!bad && ms < 1000.0 * seconds) {
        for (int i = 0; i < 50; ++i, ++launches)
            smem_rate_kernel<KIND><<<grid, wgs * FC_WG_THREADS, SMEM_BYTES>>>(src, 0, BURN_ITERS, dout);
        cudaEventRecord(e1);
        bad = check(cudaGetLastError(), "launch") || check(cudaEventSynchronize(e1), "kernel") ||
              check(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
    }
    if (!bad) {
        const double flop = wgmma_flop(n) * GROUP * (double)(BURN_ITERS + WARMUP) * wgs * grid * launches;
        printf("burn %s m64n%dk16 warpgroups %d: %ld launches in %.2f s, %.1f TFLOP/s\n", KIND_SS[KIND] ? "SS" : "RS",
               n, wgs, launches, ms / 1000.0, flop / (ms * 1e9));
    }
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    return bad;
}

int main(int argc, char** argv) {
    long long* dout = nullptr;
    uint4* src = nullptr;
    int grid = 0;
    if (tool_sm_grid("smem_rate", MAX_SMS, &grid)) return 1;
    if (check(cudaMalloc(&dout, MAX_SMS * OUT * sizeof(long long)), "malloc") ||
        check(cudaMalloc(&src, SRC_BYTES), "malloc") || check(cudaMemset(src, 0, SRC_BYTES), "memset"))
        return 1;
    if (argc == 4 && std::string(argv[1]) == "burn") {
        const int kind = atoi(argv[2]);
        const double seconds = atof(argv[3]);
        const int r = kind == SS_N32 ? burn<SS_N32>(src, dout, grid, seconds)
                      : kind == SS_N64 ? burn<SS_N64>(src, dout, grid, seconds)
                      : kind == SS_N128 ? burn<SS_N128>(src, dout, grid, seconds)
                      : kind == RS_N64 ? burn<RS_N64>(src, dout, grid, seconds)
                      : kind == RS_N128 ? burn<RS_N128>(src, dout, grid, seconds)
                                        : (fprintf(stderr, "smem_rate: burn KIND (0-%d) SECONDS\n", KINDS - 1), 2);
        cudaFree(dout);
        cudaFree(src);
        return r;
    }
    int bad = 0;
    for (int wgs = 1; wgs <= 2; ++wgs)
        for (int copy = 0; copy <= 1; ++copy) {
            bad |= run<SS_N32>(src, dout, grid, wgs, copy) | run<SS_N64>(src, dout, grid, wgs, copy);
            bad |= run<SS_N128>(src, dout, grid, wgs, copy) | run<RS_N64>(src, dout, grid, wgs, copy);
            bad |= run<RS_N128>(src, dout, grid, wgs, copy);
        }
    cudaFree(dout);
    cudaFree(src);
    return bad;
}
