/* tensor_map.h -- builds the TMA tensor maps the Hopper kernels load their
 * inputs through, and the backward stores dK and dV through (host side). A
 * (B, H, S, D) tensor with element strides becomes a 4-D map (D, S, H, B) read
 * (or written) in boxes of (64 columns, box_rows rows), laid out in shared
 * memory with the 128-byte swizzle. Elements outside the tensor read as zero,
 * which pads D up to the tile width and masks the S tails, and are not written. */
#ifndef FLASHCORE_SM90_TENSOR_MAP_H
#define FLASHCORE_SM90_TENSOR_MAP_H

#include <cuda.h>

#include "../flashcore.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Fills *map; returns FC_OK, FC_ERR_CUDA when the driver entry point is
 * missing, or FC_ERR_INVALID_STRIDE when the driver rejects the layout. */
fc_status fc_sm90_tensor_map(CUtensorMap* map, fc_dtype dtype, const void* base, int D, int S, int H, int B,
                             int64_t row_stride, int64_t head_stride, int64_t batch_stride, int box_rows);

#ifdef FC_SM90_TRACE
/* Device buffer the Hopper kernel records its timeline into (trace.cuh); set by the harness. */
extern unsigned long long* fc_sm90_trace_buf;
#endif

#ifdef __cplusplus
}
#endif

#endif /* FLASHCORE_SM90_TENSOR_MAP_H */
