// Portable forward kernel instantiated for head dims up to 64 (fp16 and bf16).
#include "attn_fwd_sm80.cuh"

FC_SM80_DEFINE(64)
FC_SM80_DEFINE_SMALL(64)
