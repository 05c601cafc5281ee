/* kernels.h -- internal entry points behind fc_attn_fwd (not public API).
 * Each GPU entry point launches on `stream` and returns FC_OK or FC_ERR_CUDA;
 * dispatch.c has already validated the params. */
#ifndef FLASHCORE_KERNELS_H
#define FLASHCORE_KERNELS_H

#include "flashcore.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Portable mma.sync kernels, one per padded head dim (csrc/sm80/). */
fc_status fc_sm80_fwd_d64(const fc_attn_params* p, fc_stream_t stream);   /* D <= 64 */
fc_status fc_sm80_fwd_d128(const fc_attn_params* p, fc_stream_t stream);  /* 64 < D <= 128 */
fc_status fc_sm80_fwd_d256(const fc_attn_params* p, fc_stream_t stream);  /* 128 < D <= 256 */
size_t fc_sm80_smem_d64(void);   /* dynamic shared memory per CTA, bytes */
size_t fc_sm80_smem_d128(void);
size_t fc_sm80_smem_d256(void);

/* Hopper wgmma + TMA kernels, sm_90a only (csrc/sm90/); num_sms sizes the
 * persistent grid. Present when the build defines FC_HAVE_SM90. */
fc_status fc_sm90_fwd_d64(const fc_attn_params* p, int num_sms, fc_stream_t stream);   /* D <= 64 */
fc_status fc_sm90_fwd_d128(const fc_attn_params* p, int num_sms, fc_stream_t stream);  /* 64 < D <= 128 */
fc_status fc_sm90_fwd_d256(const fc_attn_params* p, int num_sms, fc_stream_t stream);  /* 128 < D <= 256 */
size_t fc_sm90_smem_d64(void);   /* dynamic shared memory per CTA, bytes */
size_t fc_sm90_smem_d128(void);
size_t fc_sm90_smem_d256(void);

/* Host reference path (csrc/cpu/), synchronous, on host memory. */
fc_status fc_cpu_fwd(const fc_attn_params* p);

#ifdef __cplusplus
}
#endif

#endif /* FLASHCORE_KERNELS_H */
