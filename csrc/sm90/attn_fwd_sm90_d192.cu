// Hopper kernel instantiation for MLA's shapes: q and k of 128 < D <= 192, v of Dv <= 128 (Sm90Tile<192>);
// see attn_fwd_sm90.cuh and attn_fwd_sm90_launch.cuh.
#include "attn_fwd_sm90_launch.cuh"

FC_SM90_DEFINE(192)
