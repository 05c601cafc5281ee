// attn_combine.cu -- merges the splits of the split-KV kernel.
//
// Algorithm. Split s left, for every query row, an fp32 partial output O_s
// normalized by its own softmax sum and its log-sum-exp lse_s (natural log,
// -inf when the split saw no key of that row). With M = max_s lse_s:
//     O = sum_s exp(lse_s - M) O_s / L,   L = sum_s exp(lse_s - M),
//     LSE = M + ln L,
// which is the softmax over all keys. One warp per query row: the lanes first
// reduce M and L over the splits (lane l takes splits l, l+32, ...), then lane
// l accumulates 8 output columns starting at 8l (D <= 256 needs <= 32 lanes)
// over every split, and stores them in the input dtype with one 16-byte store.
// A row no split saw (M = -inf) gives O = 0 and LSE = -inf, never NaN; with
// zero splits (a call with Sk = 0) every row is such a row and nothing is read.
// On sm90+ the kernel is a programmatic dependent of the split kernel: it is
// launched while that one runs and waits for it (griddepcontrol) before its
// first read.
//
// Limits. D a multiple of 8 up to 256; any number of splits, 0 included (each row reads
// splits * (D + 1) floats); B * Hq * Sq rows up to 2^31 - 1 warps.
#include <cuda_runtime.h>
#include <math.h>

#include "../common/ptx.cuh"
#include "../flashcore.h"
#include "../kernels.h"

static constexpr int COMBINE_WARPS = FC_COMBINE_ROWS;  // rows per CTA, one warp each
static constexpr int WARP_SIZE = 32;

// ---------------------------------------------------------------------------
// Kernel

template <typename T>
__global__ void __launch_bounds__(COMBINE_WARPS * WARP_SIZE)
split_combine_kernel(const __grid_constant__ fc_attn_params p, const fc_split_plan sp) {
    griddep_wait();  // the split kernel's partials are complete and visible (no-op without PDL)
    const int lane = threadIdx.x % WARP_SIZE;
    const int64_t total_rows = (int64_t)p.B * p.Hq * p.Sq;
    const int64_t row = (int64_t)blockIdx.x * COMBINE_WARPS + threadIdx.x / WARP_SIZE;  // row of (B, Hq, Sq)
    if (row >= total_rows) return;
    const float* lse_s = sp.splits > 0 ? sp.lse_part + row : nullptr;  // split s at lse_s[s * total_rows]

    float mx = -INFINITY;
    for (int s = lane; s < sp.splits; s += WARP_SIZE) mx = fmaxf(mx, lse_s[s * total_rows]);
#pragma unroll
    for (int o = WARP_SIZE / 2; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    // A split that saw no key has LSE -inf: weight 0. A NaN split (LSE NaN, which
    // fmaxf skips) gives a NaN weight, so the row comes out NaN.
    const float m_use = mx == -INFINITY ? 0.f : mx;
    float l = 0.f;
    for (int s = lane; s < sp.splits; s += WARP_SIZE) l += __expf(lse_s[s * total_rows] - m_use);
#pragma unroll
    for (int o = WARP_SIZE / 2; o > 0; o /= 2) l += __shfl_xor_sync(0xffffffffu, l, o);

    const int i = (int)(row % p.Sq), h = (int)(row / p.Sq % p.Hq), b = (int)(row / p.Sq / p.Hq);
    const int c = lane * 8;  // this lane's first column
    if (c < p.D) {
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        if (l != 0.f) {
            const float* o_s = sp.o_part + row * p.D + c;  // split s at o_s[s * total_rows * D]
            for (int s = 0; s < sp.splits; ++s) {
                const float wt = __expf(lse_s[s * total_rows] - m_use);  // 0 for a split that saw no key
                const float4* src = reinterpret_cast<const float4*>(o_s + s * total_rows * p.D);
                const float4 x0 = src[0], x1 = src[1];
                acc[0] += wt * x0.x; acc[1] += wt * x0.y; acc[2] += wt * x0.z; acc[3] += wt * x0.w;
                acc[4] += wt * x1.x; acc[5] += wt * x1.y; acc[6] += wt * x1.z; acc[7] += wt * x1.w;
            }
        }
        const float inv = l != 0.f ? 1.f / l : 0.f;
        uint4 packed;
        packed.x = pack2<T>(acc[0] * inv, acc[1] * inv);
        packed.y = pack2<T>(acc[2] * inv, acc[3] * inv);
        packed.z = pack2<T>(acc[4] * inv, acc[5] * inv);
        packed.w = pack2<T>(acc[6] * inv, acc[7] * inv);
        T* o = static_cast<T*>(p.o) + b * p.o_batch_stride + h * p.o_head_stride + (int64_t)i * p.o_row_stride + c;
        *reinterpret_cast<uint4*>(o) = packed;
    }
    if (p.lse && lane == 0) p.lse[row] = l != 0.f ? mx + logf(l) : -INFINITY;
}

// ---------------------------------------------------------------------------
// Launcher

extern "C" fc_status fc_split_combine(const fc_attn_params* p, const fc_split_plan* sp, fc_stream_t stream) {
    const int64_t rows = (int64_t)p->B * p->Hq * p->Sq;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)((rows + COMBINE_WARPS - 1) / COMBINE_WARPS));
    cfg.blockDim = dim3(COMBINE_WARPS * WARP_SIZE);
    cfg.stream = (cudaStream_t)stream;
    // Programmatic dependent launch (sm90+): this grid is launched while the
    // split kernel still runs and waits for it in griddep_wait, so the gap
    // between the two launches leaves the critical path.
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = sp->pdl ? 1 : 0;
    const cudaError_t e = p->dtype == FC_DTYPE_BF16
                              ? cudaLaunchKernelEx(&cfg, split_combine_kernel<__nv_bfloat16>, *p, *sp)
                              : cudaLaunchKernelEx(&cfg, split_combine_kernel<__half>, *p, *sp);
    return e == cudaSuccess && cudaGetLastError() == cudaSuccess ? FC_OK : FC_ERR_CUDA;
}

// Whether the current device runs this build's code: the combine kernel's attributes load only where
// the build has an image for the device (this file is compiled for every arch in FLASHCORE_ARCHS, as
// the other sm80-family files are).
extern "C" int fc_sm80_has_image(void) {
    cudaFuncAttributes attr;
    const cudaError_t e = cudaFuncGetAttributes(&attr, split_combine_kernel<__half>);
    if (e == cudaSuccess) return 1;
    (void)cudaGetLastError();  // clear this query's error (a sticky one stays, and fails the next launch)
    return e == cudaErrorInvalidDeviceFunction || e == cudaErrorNoKernelImageForDevice ? 0 : -1;
}
