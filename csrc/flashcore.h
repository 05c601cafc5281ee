/*
 * flashcore.h -- the whole public C API of flashcore's attention (forward and backward).
 *
 *   O = softmax(scale * Q K^T + mask) V          per (batch, head)
 *
 * Tensors are (B, H, S, D) views described by explicit element strides, so a
 * transposed (B, S, H, D) tensor is accepted without a copy. The last dim must
 * be contiguous. Grouped-query attention: Hkv divides Hq, and query head h
 * reads KV head h / (Hq / Hkv) in place.
 *
 * The library never allocates device memory, never exits, never synchronizes
 * the device, and launches only on the stream it is given. No torch, no C++.
 * Scratch memory (the split-KV partial results) is the caller's: ask
 * fc_attn_fwd_workspace_size, allocate that many bytes, pass them in the params.
 *
 * Empty calls are valid, as in torch's scaled_dot_product_attention: with
 * B, Hq or Sq = 0 there is no output row and nothing is read or written (q and
 * o may be NULL); with Sk = 0 (k and v may be NULL) every row sees no key, so
 * O = 0 and LSE = -inf. Everything else is checked as for any call.
 */
#ifndef FLASHCORE_H
#define FLASHCORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st* fc_stream_t;  /* same type as cudaStream_t */

typedef enum {
    FC_OK = 0,
    FC_ERR_NULL_POINTER,       /* a required pointer is NULL */
    FC_ERR_INVALID_SHAPE,      /* B, H, S or D out of range, or inconsistent */
    FC_ERR_UNSUPPORTED_DTYPE,  /* dtype not supported by the chosen kernel */
    FC_ERR_UNSUPPORTED_HEAD_DIM, /* D not a multiple of 8, or above 256 */
    FC_ERR_INVALID_STRIDE,     /* a stride or pointer breaks 16-byte alignment */
    FC_ERR_INVALID_SCALE,      /* scale is NaN, <= 0 or above FC_MAX_SCALE */
    FC_ERR_INVALID_ARGUMENT,   /* an enum field holds an unknown value */
    FC_ERR_ARCH,               /* the GPU (or forced kernel) cannot run this */
    FC_ERR_CUDA,               /* a CUDA runtime call failed */
    FC_ERR_WORKSPACE,          /* workspace NULL, misaligned or smaller than fc_attn_fwd_workspace_size */
    FC_ERR_HOST_MEMORY,        /* the CPU kernel could not malloc its per-thread scratch */
} fc_status;

typedef enum {
    FC_DTYPE_FP16 = 0,  /* IEEE half */
    FC_DTYPE_BF16 = 1,  /* bfloat16 */
    FC_DTYPE_FP32 = 2,  /* float; CPU kernel only */
    FC_DTYPE_FP64 = 3,  /* double; CPU kernel only, with its scale and LSE in fp64 too (scale64, lse64):
                           torch.autograd.gradcheck's dtype */
} fc_dtype;

typedef enum {
    FC_CAUSAL_NONE = 0,          /* full attention */
    FC_CAUSAL_TOP_LEFT = 1,      /* key j visible to query i iff j <= i (SDPA's is_causal) */
    FC_CAUSAL_BOTTOM_RIGHT = 2,  /* key j visible iff j <= i + Sk - Sq (KV-cache decode) */
} fc_causal;

typedef enum {
    FC_MASK_NONE = 0,  /* no mask (the default); mask must be NULL */
    FC_MASK_BOOL = 1,  /* uint8 elements: 0 hides key j from query i (as the causal mask hides it), any other
                          value leaves it visible */
    FC_MASK_ADD = 2,   /* elements of the call's dtype, added to scale * q . k (natural log): -inf hides the
                          key, a NaN makes the row NaN (as SDPA's additive attn_mask) */
    FC_MASK_ADD_FP32 = 3, /* as FC_MASK_ADD, with fp32 elements whatever the call's dtype (SDPA takes a float
                             mask with any q) */
} fc_mask_kind;

typedef enum {
    FC_KERNEL_AUTO = 0,  /* best kernel for the current CUDA device */
    FC_KERNEL_SM80 = 1,  /* portable mma.sync kernel, sm80..sm90 */
    FC_KERNEL_SM90 = 2,  /* Hopper wgmma + TMA kernel, sm90a (not built yet) */
    FC_KERNEL_CPU = 3,   /* host memory, C reference path; runs synchronously */
} fc_kernel;

typedef struct {
    const void* q;    /* (B, Hq, Sq, D) queries */
    const void* k;    /* (B, Hkv, Sk, D) keys */
    const void* v;    /* (B, Hkv, Sk, Dv) values */
    void* o;          /* (B, Hq, Sq, Dv) output, same dtype as q */
    float* lse;       /* (B, Hq, Sq) contiguous fp32 log-sum-exp (natural log), or NULL */

    int64_t q_batch_stride, q_head_stride, q_row_stride;  /* in elements */
    int64_t k_batch_stride, k_head_stride, k_row_stride;  /* in elements */
    int64_t v_batch_stride, v_head_stride, v_row_stride;  /* in elements */
    int64_t o_batch_stride, o_head_stride, o_row_stride;  /* in elements */

    int B;            /* batch size, >= 0 */
    int Hq;           /* query (and output) heads, >= 0 */
    int Hkv;          /* key/value heads, divides Hq; >= 1 unless Hq = 0 */
    int Sq;           /* query length, >= 0 */
    int Sk;           /* key/value length, >= 0; 0 = no keys: every row fully masked, O = 0, LSE = -inf */
    int D;            /* head dim, multiple of 8, 8..256 */

    fc_dtype dtype;   /* element type of q, k, v and o */
    float scale;      /* softmax scale, finite and > 0 (usually 1/sqrt(D)) */
    fc_causal causal; /* mask mode; see fc_causal */
    fc_kernel kernel; /* which implementation runs; FC_KERNEL_AUTO picks */

    int num_splits;   /* split-KV: 0 = heuristic, 1 = no split, n > 1 = run the split-KV kernel with Sk
                         split n ways (clamped to the key tiles and FC_MAX_SPLITS); the CPU path ignores it */
    void* workspace;  /* device scratch (split-KV partials, the sm90 kernel's tile counter or its split
                         tail's partials), 16-byte aligned; NULL when none is needed */
    size_t workspace_bytes; /* bytes at workspace; must be >= fc_attn_fwd_workspace_size(p) */
    int counters_zeroed;    /* 1: workspace_bytes of zeros at workspace (zero-filled when allocated and
                               since used only by calls with this flag set, each of which leaves its
                               workspace all zero again): the sm90 dynamic order's tile counter then needs
                               no memset before the launch, one operation fewer per call. 0: any memory
                               (the launch zeroes the counters it uses). */
    int window;       /* 0: no window (the default). 1: a sliding window around the diagonal that `causal`
                         names (TOP_LEFT: diag = 0, BOTTOM_RIGHT: diag = Sk - Sq; NONE is refused): key j is
                         visible to query i iff i + diag - window_left <= j <= i + diag + window_right.
                         Every kernel takes it (sm90: its own instantiation, unless the window masks
                         nothing the causal mode does not, which runs as the causal call) */
    int window_left;  /* window = 1: keys before the diagonal a query sees, >= 0; -1: all of them */
    int window_right; /* window = 1: keys after the diagonal a query sees, >= 0 (0: causal); -1: all */
    int Dv;           /* v's and o's head dim: 0 = D (the default). Another value (a multiple of 8 below D)
                         runs on the CPU kernel, and on the sm90 kernel where D > 128 (not split-KV); the
                         others refuse it (pad v to D, and cut o's extra columns). A caller that fills
                         the struct field by field sets it too (zero-initialize the struct) */
    double scale64;   /* FC_DTYPE_FP64: the softmax scale in fp64, which the CPU kernel uses (scale holds it
                         rounded to fp32, for the checks); ignored for the other dtypes */
    double* lse64;    /* FC_DTYPE_FP64: (B, Hq, Sq) contiguous fp64 LSE in place of lse (which must then be
                         NULL), or NULL; must be NULL for the other dtypes */
    const void* mask; /* (B, Hq, Sq, Sk) attention mask of mask_kind, applied with the causal mode and the
                         window, or NULL (FC_MASK_NONE); its columns contiguous. The CPU kernel only, so far */
    int64_t mask_batch_stride, mask_head_stride, mask_row_stride; /* in elements, >= 0: 0 broadcasts the dim */
    fc_mask_kind mask_kind; /* FC_MASK_NONE (zero-initialized), FC_MASK_BOOL, FC_MASK_ADD or FC_MASK_ADD_FP32 */
} fc_attn_params;

/* Short English name of a status code. Never NULL. */
const char* fc_status_string(fc_status s);

/* Largest head dim any kernel supports. */
#define FC_MAX_HEAD_DIM 256
/* Longest Sq and Sk (2^30): the kernels' key and row arithmetic is int32 with
 * a tile of headroom; longer sequences are refused (split the call). */
#define FC_MAX_SEQ_LEN (1 << 30)

/* Largest scale: the kernels work in exp2, and scale * log2(e) must stay a
 * finite fp32 (FLT_MAX / log2(e) is 2.36e38). */
#define FC_MAX_SCALE 2.3e38f

/* Most ways Sk is ever split (forced num_splits above this are clamped). */
#define FC_MAX_SPLITS 1024

/*
 * Says whether fc_attn_fwd would accept p. On failure returns the first
 * failing status and, when why != NULL, writes every reason found (one per
 * line, naming the field and the fix) into why[0 .. why_len). GPU kernels are
 * checked against the current CUDA device.
 */
fc_status fc_attn_fwd_check(const fc_attn_params* p, char* why, size_t why_len);

/* fc_attn_fwd_check without the workspace's checks: for a caller deciding how
 * to make a call (whether a kernel takes v's own head dim Dv, say) before it
 * has the workspace. */
fc_status fc_attn_fwd_check_args(const fc_attn_params* p, char* why, size_t why_len);

/*
 * Runs the forward pass on `stream` (ignored for FC_KERNEL_CPU, which runs on
 * the calling thread). Checks p first and launches nothing if it fails. After
 * the checks pass it can still return FC_ERR_CUDA (a launch failed) or, for
 * FC_KERNEL_CPU, FC_ERR_HOST_MEMORY.
 */
fc_status fc_attn_fwd(const fc_attn_params* p, fc_stream_t stream);

/* Why kernel k cannot run on a GPU of compute capability (major, minor), or
 * NULL when it can. FC_KERNEL_AUTO asks whether any GPU kernel can. */
const char* fc_arch_reason(fc_kernel k, int cc_major, int cc_minor);

/* Which kernel FC_KERNEL_AUTO resolves to for p on the current device. */
fc_kernel fc_attn_fwd_pick(const fc_attn_params* p);

/*
 * Split-KV plan for p on the current device: 0 when the tile kernel runs (no
 * split-KV kernel), else the number of Sk splits of the split-KV kernel
 * (1 = that kernel writes O directly, no workspace). Also 0 for the CPU path
 * and for params that fc_attn_fwd_check rejects.
 */
int fc_attn_fwd_num_splits(const fc_attn_params* p);

/*
 * Bytes of workspace fc_attn_fwd needs for p: 0 when it needs none (CPU path,
 * or params fc_attn_fwd_check rejects). With n > 1 splits it is
 * n * B*Hq*Sq * (D + 1) * 4: fp32 partial O (n, B, Hq, Sq, D) followed by the
 * fp32 partial LSE (n, B, Hq, Sq). A causal call that runs the sm90 kernel
 * with its dynamic tile order needs 16 bytes (a counter, which the launch
 * zeroes unless counters_zeroed says it already is zero; the kernel leaves it
 * at zero). A
 * non-causal call that runs the sm90 kernel at 64 < D <= 128 with Sk >= 4096
 * needs room for its split tail's counters and partials (about 139 KB per SM,
 * 18 MB on an H100; FC_SM90_TAIL_CTAS in kernels.h).
 * Depends on p's shapes, num_splits and the current device (its SM count),
 * never on the pointers.
 */
size_t fc_attn_fwd_workspace_size(const fc_attn_params* p);

/* ---- backward ----
 *
 * Gradients of O = softmax(scale * Q K^T + mask) V, given the forward's O and
 * LSE and dO (the loss's gradient with respect to O):
 *   P  = exp(scale * Q K^T - LSE)        (the forward's probabilities)
 *   dV = P^T dO
 *   dS = P * (dO V^T - Delta),  Delta_i = sum_d dO_id O_id
 *   dQ = scale * dS K,  dK = scale * dS^T Q
 * With a gradient dlse for the LSE as well, dS = P * (dO V^T - Delta + dlse).
 * dK and dV of a KV head sum over the Hq / Hkv query heads that read it.
 * Rows that see no key (LSE = -inf) give dQ = 0 and add nothing to dK, dV;
 * keys no row sees get dK = dV = 0. Same shapes, strides, dtypes and causal
 * modes as the forward. GPU kernels need D <= FC_BWD_MAX_GPU_HEAD_DIM (both
 * of them); the portable one at D > 128 needs 144.5 KB of shared memory per
 * block, which sm86/sm89 GPUs do not have. The CPU path takes any D the forward takes.
 */
#define FC_BWD_MAX_GPU_HEAD_DIM FC_MAX_HEAD_DIM /* every head dim the forward takes */
typedef struct {
    const void* q;    /* (B, Hq, Sq, D) the forward's queries */
    const void* k;    /* (B, Hkv, Sk, D) keys */
    const void* v;    /* (B, Hkv, Sk, Dv) values */
    const void* o;    /* (B, Hq, Sq, Dv) the forward's output */
    const void* dout; /* (B, Hq, Sq, Dv) gradient of the loss with respect to o */
    const float* lse; /* (B, Hq, Sq) contiguous fp32, the forward's LSE (natural log) */
    const float* dlse; /* (B, Hq, Sq) contiguous fp32 gradient of the loss with respect to lse, or NULL
                          (none): it adds P_ij * dlse_i to dS_ij */
    void* dq;         /* (B, Hq, Sq, D) gradient for q, written */
    void* dk;         /* (B, Hkv, Sk, D) gradient for k, written */
    void* dv;         /* (B, Hkv, Sk, Dv) gradient for v, written */

    int64_t q_batch_stride, q_head_stride, q_row_stride;    /* in elements */
    int64_t k_batch_stride, k_head_stride, k_row_stride;    /* in elements */
    int64_t v_batch_stride, v_head_stride, v_row_stride;    /* in elements */
    int64_t o_batch_stride, o_head_stride, o_row_stride;    /* in elements */
    int64_t do_batch_stride, do_head_stride, do_row_stride; /* in elements, of dout */
    int64_t dq_batch_stride, dq_head_stride, dq_row_stride; /* in elements */
    int64_t dk_batch_stride, dk_head_stride, dk_row_stride; /* in elements */
    int64_t dv_batch_stride, dv_head_stride, dv_row_stride; /* in elements */

    int B, Hq, Hkv, Sq, Sk, D; /* as in fc_attn_params */
    fc_dtype dtype;   /* element type of every tensor but lse and dlse (fp32; fp64 for FC_DTYPE_FP64) */
    float scale;      /* the forward's softmax scale */
    fc_causal causal; /* the forward's mask mode */
    fc_kernel kernel; /* FC_KERNEL_AUTO (sm90 on H100/H200 in a build with sm_90a code, else
                         sm80), FC_KERNEL_SM80 (mma.sync, sm80+),
                         FC_KERNEL_SM90 (wgmma + TMA, compute capability 9.0) or FC_KERNEL_CPU */
    void* workspace;  /* device scratch, 16-byte aligned: fp32 dQ accumulator and per-row vectors
                         (and, deterministic, the turn counters) */
    size_t workspace_bytes; /* bytes at workspace; must be >= fc_attn_bwd_workspace_size(p) */
    int deterministic; /* nonzero: dQ's GPU sums taken in a fixed order (per block of dQ the last key
                          block first), so dq is bit-reproducible; both GPU kernels, slower. dk, dv
                          and the CPU path are reproducible either way. Zero-initialize the struct:
                          0 is the default */
    int window, window_left, window_right; /* the forward's sliding window (fc_attn_params); every kernel */
    int Dv;           /* v's, o's, dout's and dv's head dim: 0 = D (the default), else as in fc_attn_params
                         (a multiple of 8 up to D): a Dv below D runs on the CPU path and the sm90 kernel
                         at D > 128; elsewhere pad v, o and dout to D with zero columns and cut dv's */
    double scale64;   /* FC_DTYPE_FP64: the forward's scale in fp64 (as in fc_attn_params) */
    const double* lse64;  /* FC_DTYPE_FP64: the forward's LSE in fp64, in place of lse (then NULL) */
    const double* dlse64; /* FC_DTYPE_FP64: dlse in fp64, in place of dlse (then NULL), or NULL */
    const void* mask; /* the forward's mask (fc_attn_params), or NULL; the CPU path only, so far */
    int64_t mask_batch_stride, mask_head_stride, mask_row_stride; /* in elements, >= 0 */
    fc_mask_kind mask_kind; /* the forward's */
} fc_attn_bwd_params;

/* Says whether fc_attn_bwd would accept p; reasons as in fc_attn_fwd_check. */
fc_status fc_attn_bwd_check(const fc_attn_bwd_params* p, char* why, size_t why_len);

/* fc_attn_bwd_check without the workspace's checks (as fc_attn_fwd_check_args). */
fc_status fc_attn_bwd_check_args(const fc_attn_bwd_params* p, char* why, size_t why_len);

/* Says whether the GPU backward (kernel AUTO, SM80 or SM90) can run at head
 * dim D on the current CUDA device wherever the forward can: FC_OK, or the
 * status and reason fc_attn_bwd_check gives every call at that head dim there
 * (the Hopper kernel's architecture, shared memory per block). A device or kernel
 * the forward itself refuses answers FC_OK: fc_attn_fwd_check says why. A
 * framework can ask before the forward of a training step rather than fail in
 * its backward. */
fc_status fc_attn_bwd_device_check(int D, fc_kernel kernel, char* why, size_t why_len);

/* Runs the backward pass on `stream` (the CPU path on the calling thread).
 * Checks p first and launches nothing if it fails. */
fc_status fc_attn_bwd(const fc_attn_bwd_params* p, fc_stream_t stream);

/* Bytes of workspace fc_attn_bwd needs for p: 0 for the CPU path, for calls
 * with B, Hq, Sq or Sk = 0 (the gradients are zeros) and for params the
 * check rejects, else, rounded up to 16 (both GPU kernels): B*Hq*Sq_pad*(DP + 2)*4
 * with Sq_pad = Sq rounded up to 128 and DP = D rounded up to 64, 128 or 256 (the
 * fp32 dQ accumulator in tiles, Delta and the LSE in base 2, padded rows) + 4 (the
 * sm90 main kernel's item counter), plus B*Hq*(Sq_pad / 64)*(DP / 64)*4 for a
 * deterministic call (the turn counters). */
size_t fc_attn_bwd_workspace_size(const fc_attn_bwd_params* p);

#ifdef __cplusplus
}
#endif

#endif /* FLASHCORE_H */
