// attn_bwd_sm90_launch.cuh -- host side of the Hopper attention backward
// (attn_bwd_sm90.cuh): the tensor maps, the three launches (prep, main, post)
// and the C entry points of one padded head dim (FC_SM90_BWD_DEFINE, see kernels.h).
#pragma once

#include "attn_bwd_sm90.cuh"

// ---------------------------------------------------------------------------
// Launcher and the C entry points of one padded head dim (see kernels.h)

// The main kernel's launch: DET (deterministic) and WIN (a window) pick the instantiation.
template <int DP, typename T, bool DET, bool WIN>
static fc_status attn_bwd_sm90_main(const BwdSm90Args& a, unsigned ctas, cudaStream_t stream) {
    using Tile = BwdSm90Tile<DP>;
    if (fc_smem_limit_once<attn_bwd_sm90_kernel<DP, T, DET, WIN>>((int)Tile::SMEM_BYTES) != cudaSuccess)
        return FC_ERR_CUDA;
    attn_bwd_sm90_kernel<DP, T, DET, WIN><<<ctas, Tile::THREADS, Tile::SMEM_BYTES, stream>>>(a);
    return cudaGetLastError() == cudaSuccess ? FC_OK : FC_ERR_CUDA;
}

template <int DP, typename T>
static fc_status attn_bwd_sm90_launch(const fc_attn_bwd_params* p, int num_sms, cudaStream_t stream) {
    using Tile = BwdSm90Tile<DP>;
    BwdSm90Args a;
    a.p = *p;
    a.sq_pad = bwd_sq_pad(p->Sq);
    fc_status s = fc_sm90_tensor_map(&a.q_map, p->dtype, p->q, p->D, p->Sq, p->Hq, p->B, p->q_row_stride,
                                     p->q_head_stride, p->q_batch_stride, Tile::BR);
    if (s == FC_OK)
        s = fc_sm90_tensor_map(&a.do_map, p->dtype, p->dout, FC_DV(*p), p->Sq, p->Hq, p->B, p->do_row_stride,
                               p->do_head_stride, p->do_batch_stride, Tile::BR);
    if (s == FC_OK)
        s = fc_sm90_tensor_map(&a.k_map, p->dtype, p->k, p->D, p->Sk, p->Hkv, p->B, p->k_row_stride,
                               p->k_head_stride, p->k_batch_stride, Tile::BC);
    if (s == FC_OK)
        s = fc_sm90_tensor_map(&a.v_map, p->dtype, p->v, FC_DV(*p), p->Sk, p->Hkv, p->B, p->v_row_stride,
                               p->v_head_stride, p->v_batch_stride, Tile::BC);
    if (s == FC_OK)
        s = fc_sm90_tensor_map(&a.dk_map, p->dtype, p->dk, p->D, p->Sk, p->Hkv, p->B, p->dk_row_stride,
                               p->dk_head_stride, p->dk_batch_stride, Tile::WG_KEYS);
    if (s == FC_OK)
        s = fc_sm90_tensor_map(&a.dv_map, p->dtype, p->dv, FC_DV(*p), p->Sk, p->Hkv, p->B, p->dv_row_stride,
                               p->dv_head_stride, p->dv_batch_stride, Tile::WG_KEYS);
    if (s != FC_OK) return s;
    // dispatch keeps the portable kernel's key blocks x B x Hkv (at least the items) <= 2^31 - 1;
    // one persistent CTA per SM (the tile's shared memory allows no second); a deterministic call
    // one CTA per item (the kernel's loop over items stops after one)
    const unsigned items = (unsigned)((p->Sk + Tile::BC - 1) / Tile::BC) * (unsigned)(p->B * p->Hkv);
    const unsigned main_ctas = p->deterministic || items < (unsigned)num_sms ? items : (unsigned)num_sms;

    attn_bwd_prep_kernel<DP, T><<<bwd_row_grid<DP>((long long)p->B * p->Hq * a.sq_pad), BWD_ROW_THREADS, 0, stream>>>(
        *p, a.sq_pad);
    if (cudaGetLastError() != cudaSuccess) return FC_ERR_CUDA;

    // The WIN instantiation only where the window masks more than the causal mode (as the forward)
    const bool win = FC_WINDOW_MASKS_MORE(*p);
    const fc_status main =
        p->deterministic ? (win ? attn_bwd_sm90_main<DP, T, true, true>(a, main_ctas, stream)
                                : attn_bwd_sm90_main<DP, T, true, false>(a, main_ctas, stream))
                         : (win ? attn_bwd_sm90_main<DP, T, false, true>(a, main_ctas, stream)
                                : attn_bwd_sm90_main<DP, T, false, false>(a, main_ctas, stream));
    if (main != FC_OK) return main;

    attn_bwd_post_kernel<DP, T><<<bwd_row_grid<DP>((long long)p->B * p->Hq * p->Sq), BWD_ROW_THREADS, 0, stream>>>(
        *p, a.sq_pad);
    return cudaGetLastError() == cudaSuccess ? FC_OK : FC_ERR_CUDA;
}

#define FC_SM90_BWD_DEFINE(DP)                                                                      \
    extern "C" fc_status fc_sm90_bwd_d##DP(const fc_attn_bwd_params* p, int num_sms, fc_stream_t stream) {     \
        return p->dtype == FC_DTYPE_BF16 ? attn_bwd_sm90_launch<DP, __nv_bfloat16>(p, num_sms, (cudaStream_t)stream) \
                                         : attn_bwd_sm90_launch<DP, __half>(p, num_sms, (cudaStream_t)stream);        \
    }                                                                                               \
    extern "C" size_t fc_sm90_bwd_smem_d##DP(void) { return BwdSm90Tile<DP>::SMEM_BYTES; }
