// Portable backward kernels instantiated for head dims up to 256 (fp16 and bf16).
#include "attn_bwd_sm80_launch.cuh"

FC_SM80_BWD_DEFINE(d256, 256, 32)
