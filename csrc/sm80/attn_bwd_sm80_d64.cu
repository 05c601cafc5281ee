// Portable backward kernels instantiated for head dims up to 64 (fp16 and bf16): 128-key CTAs of
// 32-key warps where they fill the SMs (dispatch picks), 64-key CTAs elsewhere.
#include "attn_bwd_sm80_launch.cuh"

FC_SM80_BWD_DEFINE(d64, 64, 16)
FC_SM80_BWD_DEFINE(wide_d64, 64, 32)
