// Portable backward kernels instantiated for head dims up to 64 (fp16 and bf16): 64-key CTAs.
#include "attn_bwd_sm80.cuh"

FC_SM80_BWD_DEFINE(d64, 64, 4)
