// Portable backward kernels instantiated for head dims up to 128 (fp16 and bf16): 128-key CTAs of
// 32-key warps where the GPU has their shared memory and the grid fills the SMs (dispatch picks),
// 64-key CTAs elsewhere.
#include "attn_bwd_sm80_launch.cuh"

FC_SM80_BWD_DEFINE(d128, 128, 16)
FC_SM80_BWD_DEFINE(wide_d128, 128, 32)
