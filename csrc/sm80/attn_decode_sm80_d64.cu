// Split-KV decode kernel instantiated for head dims up to 64 (fp16 and bf16).
#include "attn_decode_sm80.cuh"

FC_SM80_DECODE_DEFINE(64)
