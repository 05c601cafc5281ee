// Hopper kernel instantiation for padded head dim 256 (D <= 256); see attn_fwd_sm90.cuh.
#include "attn_fwd_sm90.cuh"

FC_SM90_DEFINE(256)
