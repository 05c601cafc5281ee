// Hopper backward kernels instantiated for head dims up to 128 (fp16 and bf16); see attn_bwd_sm90.cuh
// (the kernel) and attn_bwd_sm90_launch.cuh (its launcher).
#include "attn_bwd_sm90_launch.cuh"

FC_SM90_BWD_DEFINE(128)
