// tensor_map.cu -- host code: TMA tensor maps for the Hopper kernel (see
// tensor_map.h). cuTensorMapEncodeTiled is a driver API call; it is fetched
// through the runtime's entry-point query so the library does not link
// libcuda. Encoding is pure host work (no device call, no synchronization).
#include <cuda_runtime_api.h>

#include "tensor_map.h"

#ifdef FC_SM90_TRACE
unsigned long long* fc_sm90_trace_buf = nullptr;
#endif

typedef CUresult (*fc_encode_tiled_fn)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                       const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                       CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

static const int FC_TMA_RANK = 4;          // (D, S, H, B)
static const int FC_TMA_BOX_COLS = 64;     // 64 2-byte columns = one 128-byte swizzle row
static const int FC_TMA_ENTRY_VERSION = 12000;  // cuTensorMapEncodeTiled exists since CUDA 12.0

static fc_encode_tiled_fn encode_fn(void) {
    static fc_encode_tiled_fn fn = nullptr;  // concurrent first calls store the same pointer
    if (!fn) {
        void* ptr = nullptr;
        cudaDriverEntryPointQueryResult found;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, FC_TMA_ENTRY_VERSION, cudaEnableDefault,
                                             &found) != cudaSuccess ||
            found != cudaDriverEntryPointSuccess)
            return nullptr;
        fn = (fc_encode_tiled_fn)ptr;
    }
    return fn;
}

extern "C" fc_status fc_sm90_tensor_map(CUtensorMap* map, fc_dtype dtype, const void* base, int D, int S, int H,
                                        int B, int64_t row_stride, int64_t head_stride, int64_t batch_stride,
                                        int box_rows) {
    fc_encode_tiled_fn encode = encode_fn();
    if (!encode) return FC_ERR_CUDA;
    const int64_t elem = 2;
    const cuuint64_t dims[FC_TMA_RANK] = {(cuuint64_t)D, (cuuint64_t)S, (cuuint64_t)H, (cuuint64_t)B};
    // Byte strides of dims 1..3 (dim 0 is contiguous).
    const cuuint64_t strides[FC_TMA_RANK - 1] = {(cuuint64_t)(row_stride * elem), (cuuint64_t)(head_stride * elem),
                                                 (cuuint64_t)(batch_stride * elem)};
    const cuuint32_t box[FC_TMA_RANK] = {FC_TMA_BOX_COLS, (cuuint32_t)box_rows, 1, 1};
    const cuuint32_t elem_strides[FC_TMA_RANK] = {1, 1, 1, 1};
    const CUtensorMapDataType type =
        dtype == FC_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    CUresult r = encode(map, type, FC_TMA_RANK, const_cast<void*>(base), dims, strides, box, elem_strides,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? FC_OK : FC_ERR_INVALID_STRIDE;
}
