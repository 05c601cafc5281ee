/* dispatch.c -- validation and kernel choice behind the public C API.
 *
 * fc_attn_fwd_check collects every reason a call is unsupported (naming the
 * field and the fix), fc_attn_fwd_pick resolves FC_KERNEL_AUTO from the current
 * device's compute capability, and fc_attn_fwd checks then launches. Device
 * attributes are read once per device and cached; nothing here synchronizes.
 *
 * Kernel choice: the Hopper kernel (wgmma + TMA) on compute capability 9.0
 * when the build has sm_90a code (FC_HAVE_SM90), the portable mma.sync
 * kernel on every other sm80+ GPU. FC_KERNEL_SM80/SM90 force one.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "flashcore.h"
#include "kernels.h"

#define FC_MAX_DEVICES 64
#define FC_GRID_X_MAX 2147483647LL  /* CUDA's limit on gridDim.x (query blocks x heads x batch) */
#define FC_ALIGN_ELEMS 8      /* 16-byte vector accesses of 2-byte elements */

const char* fc_status_string(fc_status s) {
    switch (s) {
        case FC_OK: return "ok";
        case FC_ERR_NULL_POINTER: return "null pointer";
        case FC_ERR_INVALID_SHAPE: return "invalid shape";
        case FC_ERR_UNSUPPORTED_DTYPE: return "unsupported dtype";
        case FC_ERR_UNSUPPORTED_HEAD_DIM: return "unsupported head dim";
        case FC_ERR_INVALID_STRIDE: return "invalid stride or alignment";
        case FC_ERR_INVALID_SCALE: return "invalid scale";
        case FC_ERR_INVALID_ARGUMENT: return "invalid argument";
        case FC_ERR_ARCH: return "unsupported GPU architecture";
        case FC_ERR_CUDA: return "CUDA error";
    }
    return "unknown status";
}

/* ---- device attributes, cached per device ---- */

typedef struct {
    int valid;       /* 1 once read */
    int major, minor;
    int smem_optin;  /* max dynamic shared memory per block, bytes */
    int num_sms;     /* streaming multiprocessors (persistent grid size) */
} fc_device_info;

static fc_device_info g_devices[FC_MAX_DEVICES];

static const fc_device_info* current_device(void) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= FC_MAX_DEVICES) return NULL;
    fc_device_info* d = &g_devices[dev];
    if (!d->valid) {
        fc_device_info t = {1, 0, 0, 0, 0};
        if (cudaDeviceGetAttribute(&t.major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&t.minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&t.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&t.num_sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
            return NULL;
        *d = t;  /* concurrent first calls write the same values */
    }
    return d;
}

const char* fc_arch_reason(fc_kernel k, int cc_major, int cc_minor) {
    (void)cc_minor;
    switch (k) {
        case FC_KERNEL_AUTO:
        case FC_KERNEL_SM80:
            return cc_major >= 8 ? NULL
                                 : "the sm80 kernel needs a GPU of compute capability 8.0 or newer "
                                   "(A100, A10/RTX 30xx, L4/RTX 40xx, H100); this GPU is older";
        case FC_KERNEL_SM90:
#ifdef FC_HAVE_SM90
            return cc_major == 9 && cc_minor == 0
                       ? NULL
                       : "the sm90 kernel needs a compute capability 9.0 GPU (H100, H200); use kernel='auto' "
                         "or 'sm80'";
#else
            return "this flashcore build has no sm_90a code; rebuild with FLASHCORE_ARCHS containing 90a, "
                   "or use kernel='sm80'";
#endif
        case FC_KERNEL_CPU:
            return "the cpu kernel runs on host memory, not on a GPU";
    }
    return "unknown kernel";
}

static size_t kernel_smem(fc_kernel k, int D) {
#ifdef FC_HAVE_SM90
    if (k == FC_KERNEL_SM90)
        return D <= 64 ? fc_sm90_smem_d64() : D <= 128 ? fc_sm90_smem_d128() : fc_sm90_smem_d256();
#endif
    (void)k;
    return D <= 64 ? fc_sm80_smem_d64() : D <= 128 ? fc_sm80_smem_d128() : fc_sm80_smem_d256();
}

fc_kernel fc_attn_fwd_pick(const fc_attn_params* p) {
    if (p && p->kernel != FC_KERNEL_AUTO) return p->kernel;
    const fc_device_info* dev = current_device();
    if (dev && fc_arch_reason(FC_KERNEL_SM90, dev->major, dev->minor) == NULL) return FC_KERNEL_SM90;
    return FC_KERNEL_SM80;
}

/* ---- check ---- */

typedef struct {
    fc_status first;  /* first failing status, FC_OK if none */
    char* buf;        /* reasons, one per line */
    size_t len, used;
} fc_reasons;

static void fail(fc_reasons* r, fc_status s, const char* fmt, ...) {
    if (r->first == FC_OK) r->first = s;
    if (!r->buf || r->len == 0 || r->used + 1 >= r->len) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(r->buf + r->used, r->len - r->used, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    r->used += (size_t)n < r->len - r->used ? (size_t)n : r->len - r->used - 1;
    if (r->used + 1 < r->len) { r->buf[r->used++] = '\n'; r->buf[r->used] = '\0'; }
}

static void check_aligned(fc_reasons* r, const char* name, const void* ptr, int64_t sb, int64_t sh, int64_t sr) {
    if ((uintptr_t)ptr % (2 * FC_ALIGN_ELEMS) != 0)
        fail(r, FC_ERR_INVALID_STRIDE, "%s: data pointer is not 16-byte aligned; pass a contiguous tensor "
             "(for example %s.contiguous())", name, name);
    if (sb % FC_ALIGN_ELEMS || sh % FC_ALIGN_ELEMS || sr % FC_ALIGN_ELEMS)
        fail(r, FC_ERR_INVALID_STRIDE, "%s: strides (%lld, %lld, %lld) must be multiples of 8 elements on the GPU; "
             "pass %s.contiguous()", name, (long long)sb, (long long)sh, (long long)sr, name);
}

fc_status fc_attn_fwd_check(const fc_attn_params* p, char* why, size_t why_len) {
    fc_reasons r = {FC_OK, why, why_len, 0};
    if (why && why_len) why[0] = '\0';
    if (!p) { fail(&r, FC_ERR_NULL_POINTER, "params: NULL"); return r.first; }

    if (!p->q || !p->k || !p->v || !p->o)
        fail(&r, FC_ERR_NULL_POINTER, "q, k, v, o: every tensor pointer must be non-NULL");
    if (p->B < 1 || p->Hq < 1 || p->Hkv < 1 || p->Sq < 1 || p->Sk < 1)
        fail(&r, FC_ERR_INVALID_SHAPE, "shape: B=%d Hq=%d Hkv=%d Sq=%d Sk=%d must all be >= 1 (empty tensors "
             "are not supported)", p->B, p->Hq, p->Hkv, p->Sq, p->Sk);
    else if (p->Hq % p->Hkv != 0)
        fail(&r, FC_ERR_INVALID_SHAPE, "k, v: Hkv=%d must divide Hq=%d", p->Hkv, p->Hq);
    if (p->D < 8 || p->D > FC_MAX_HEAD_DIM || p->D % 8 != 0)
        fail(&r, FC_ERR_UNSUPPORTED_HEAD_DIM, "D: head dim %d is not supported; use a multiple of 8 from 8 to %d",
             p->D, FC_MAX_HEAD_DIM);
    if (!(isfinite(p->scale) && p->scale > 0.f))
        fail(&r, FC_ERR_INVALID_SCALE, "scale: %g must be finite and > 0", (double)p->scale);
    if (p->causal != FC_CAUSAL_NONE && p->causal != FC_CAUSAL_TOP_LEFT && p->causal != FC_CAUSAL_BOTTOM_RIGHT)
        fail(&r, FC_ERR_INVALID_ARGUMENT, "causal: unknown mode %d", (int)p->causal);
    if (p->dtype != FC_DTYPE_FP16 && p->dtype != FC_DTYPE_BF16 && p->dtype != FC_DTYPE_FP32)
        fail(&r, FC_ERR_UNSUPPORTED_DTYPE, "dtype: unknown value %d", (int)p->dtype);

    const fc_kernel k = fc_attn_fwd_pick(p);
    if (k == FC_KERNEL_CPU) return r.first;
    if (k != FC_KERNEL_SM80 && k != FC_KERNEL_SM90) {
        fail(&r, FC_ERR_INVALID_ARGUMENT, "kernel: unknown value %d", (int)p->kernel);
        return r.first;
    }

    /* GPU kernels */
    if (p->dtype == FC_DTYPE_FP32)
        fail(&r, FC_ERR_UNSUPPORTED_DTYPE, "dtype: fp32 runs only on the CPU; use fp16 or bf16 on the GPU");
    if (((int64_t)p->Sq + 63) / 64 * p->B * p->Hq > FC_GRID_X_MAX)  /* 64: the smallest BR */
        fail(&r, FC_ERR_INVALID_SHAPE, "shape: B=%d x Hq=%d x Sq=%d needs more than 2^31-1 thread blocks; "
             "split the batch", p->B, p->Hq, p->Sq);
    check_aligned(&r, "q", p->q, p->q_batch_stride, p->q_head_stride, p->q_row_stride);
    check_aligned(&r, "k", p->k, p->k_batch_stride, p->k_head_stride, p->k_row_stride);
    check_aligned(&r, "v", p->v, p->v_batch_stride, p->v_head_stride, p->v_row_stride);
    check_aligned(&r, "o", p->o, p->o_batch_stride, p->o_head_stride, p->o_row_stride);

    const fc_device_info* dev = current_device();
    if (!dev) {
        fail(&r, FC_ERR_CUDA, "device: no usable CUDA device (cudaGetDevice or cudaDeviceGetAttribute failed)");
        return r.first;
    }
    const char* reason = fc_arch_reason(k, dev->major, dev->minor);
    if (reason) {
        fail(&r, FC_ERR_ARCH, "device: compute capability %d.%d: %s", dev->major, dev->minor, reason);
    } else if (p->D >= 8 && p->D <= FC_MAX_HEAD_DIM && kernel_smem(k, p->D) > (size_t)dev->smem_optin) {
        fail(&r, FC_ERR_ARCH, "device: head dim %d needs %zu bytes of shared memory per block, this GPU "
             "allows %d", p->D, kernel_smem(k, p->D), dev->smem_optin);
    }
    return r.first;
}

fc_status fc_attn_fwd(const fc_attn_params* p, fc_stream_t stream) {
    fc_status s = fc_attn_fwd_check(p, NULL, 0);
    if (s != FC_OK) return s;
    switch (fc_attn_fwd_pick(p)) {
        case FC_KERNEL_CPU: return fc_cpu_fwd(p);
        case FC_KERNEL_SM80:
            return p->D <= 64 ? fc_sm80_fwd_d64(p, stream)
                 : p->D <= 128 ? fc_sm80_fwd_d128(p, stream)
                               : fc_sm80_fwd_d256(p, stream);
#ifdef FC_HAVE_SM90
        case FC_KERNEL_SM90: {
            const fc_device_info* dev = current_device();  /* cached, valid after the check */
            if (!dev) return FC_ERR_CUDA;
            return p->D <= 64 ? fc_sm90_fwd_d64(p, dev->num_sms, stream)
                 : p->D <= 128 ? fc_sm90_fwd_d128(p, dev->num_sms, stream)
                               : fc_sm90_fwd_d256(p, dev->num_sms, stream);
        }
#endif
        default: return FC_ERR_ARCH;
    }
}
