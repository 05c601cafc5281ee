// Hopper kernel instantiation for padded head dim 64 (D <= 64); see attn_fwd_sm90.cuh and attn_fwd_sm90_launch.cuh.
#include "attn_fwd_sm90_launch.cuh"

FC_SM90_DEFINE(64)
