// attn_bwd_sm80_launch.cuh -- host side of the portable backward (attn_bwd_sm80.cuh): the launcher
// of the three kernels and the C entry points of one (padded head dim, keys per warp) pair, which the
// attn_bwd_sm80_d*.cu files instantiate with FC_SM80_BWD_DEFINE.
#pragma once

#include "attn_bwd_sm80.cuh"

// ---------------------------------------------------------------------------
// Launcher and the C entry points of one padded head dim and keys per warp (see kernels.h)

template <int DP, int KPW, typename T>
static fc_status attn_bwd_sm80_launch(const fc_attn_bwd_params* p, cudaStream_t stream) {
    using Tile = BwdTile<DP, KPW>;
    // dispatch keeps the key blocks x B x Hkv <= 2^31 - 1
    const unsigned main_ctas = (unsigned)((p->Sk + Tile::BC - 1) / Tile::BC) * (unsigned)(p->B * p->Hkv);
    const int sq_pad = bwd_sq_pad(p->Sq);

    attn_bwd_prep_kernel<DP, T><<<bwd_row_grid<DP>((long long)p->B * p->Hq * sq_pad), BWD_ROW_THREADS, 0, stream>>>(
        *p, sq_pad);
    if (cudaGetLastError() != cudaSuccess) return FC_ERR_CUDA;

    if (fc_smem_limit_once<attn_bwd_sm80_kernel<DP, KPW, T>>((int)Tile::SMEM_BYTES) != cudaSuccess) return FC_ERR_CUDA;
    attn_bwd_sm80_kernel<DP, KPW, T><<<main_ctas, Tile::THREADS, Tile::SMEM_BYTES, stream>>>(*p);
    if (cudaGetLastError() != cudaSuccess) return FC_ERR_CUDA;

    attn_bwd_post_kernel<DP, T><<<bwd_row_grid<DP>((long long)p->B * p->Hq * p->Sq), BWD_ROW_THREADS, 0, stream>>>(
        *p, sq_pad);
    return cudaGetLastError() == cudaSuccess ? FC_OK : FC_ERR_CUDA;
}

// fc_sm80_bwd_<NAME> and fc_sm80_bwd_smem_<NAME> (kernels.h) for padded head dim DP and KPW keys per warp.
#define FC_SM80_BWD_DEFINE(NAME, DP, KPW)                                                           \
    extern "C" fc_status fc_sm80_bwd_##NAME(const fc_attn_bwd_params* p, fc_stream_t stream) {     \
        return p->dtype == FC_DTYPE_BF16 ? attn_bwd_sm80_launch<DP, KPW, __nv_bfloat16>(p, (cudaStream_t)stream) \
                                         : attn_bwd_sm80_launch<DP, KPW, __half>(p, (cudaStream_t)stream);        \
    }                                                                                              \
    extern "C" size_t fc_sm80_bwd_smem_##NAME(void) { return BwdTile<DP, KPW>::SMEM_BYTES; }
