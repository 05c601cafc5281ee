/* dispatch.c -- validation and kernel choice behind the public C API.
 *
 * fc_attn_fwd_check collects every reason a call is unsupported (naming the
 * field and the fix), fc_attn_fwd_pick resolves FC_KERNEL_AUTO from the current
 * device's compute capability, plan_split chooses between the tile kernel and
 * the split-KV kernel (and how many splits), and fc_attn_fwd checks then
 * launches. Device attributes are read once per device and cached; nothing
 * here synchronizes.
 *
 * Kernel choice: the Hopper kernel (wgmma + TMA) on compute capability 9.0
 * when the build has sm_90a code (FC_HAVE_SM90), the portable mma.sync
 * kernel on every other sm80+ GPU. FC_KERNEL_SM80/SM90 force one. Decode-like
 * calls (few query rows per KV head) take the split-KV kernel on any GPU.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "flashcore.h"
#include "kernels.h"

#define FC_MAX_DEVICES 64
#define FC_GRID_X_MAX 2147483647LL  /* CUDA's limit on gridDim.x (query blocks x heads x batch) */
#define FC_ALIGN_ELEMS 8      /* 16-byte vector accesses of 2-byte elements */

const char* fc_status_string(fc_status s) {
    switch (s) {
        case FC_OK: return "ok";
        case FC_ERR_NULL_POINTER: return "null pointer";
        case FC_ERR_INVALID_SHAPE: return "invalid shape";
        case FC_ERR_UNSUPPORTED_DTYPE: return "unsupported dtype";
        case FC_ERR_UNSUPPORTED_HEAD_DIM: return "unsupported head dim";
        case FC_ERR_INVALID_STRIDE: return "invalid stride or alignment";
        case FC_ERR_INVALID_SCALE: return "invalid scale";
        case FC_ERR_INVALID_ARGUMENT: return "invalid argument";
        case FC_ERR_ARCH: return "unsupported GPU architecture";
        case FC_ERR_CUDA: return "CUDA error";
        case FC_ERR_WORKSPACE: return "workspace missing or too small";
        case FC_ERR_HOST_MEMORY: return "out of host memory";
    }
    return "unknown status";
}

/* ---- device attributes, cached per device ---- */

typedef struct {
    int valid;       /* 1 once read */
    int major, minor;
    int smem_optin;  /* max dynamic shared memory per block, bytes */
    int sm_count;    /* streaming multiprocessors */
    int decode_ctas_per_sm[3];  /* resident split-KV CTAs per SM at padded D 64, 128, 256 (0: cannot run) */
    int has_image;   /* 1: this build has code the device runs, 0: it has none (fc_sm80_has_image) */
} fc_device_info;

static fc_device_info g_devices[FC_MAX_DEVICES];

static const fc_device_info* current_device(void) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= FC_MAX_DEVICES) return NULL;
    fc_device_info* d = &g_devices[dev];
    if (!__atomic_load_n(&d->valid, __ATOMIC_ACQUIRE)) {  /* (pairs with the release store below) */
        fc_device_info t = {0, 0, 0, 0, 0, {0, 0, 0}, 0};
        if (cudaDeviceGetAttribute(&t.major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&t.minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&t.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&t.sm_count, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
            return NULL;
        if (t.major >= 8) {
            t.has_image = fc_sm80_has_image();
            if (t.has_image < 0) return NULL;  /* another CUDA error: reported as one, and not kept */
        }
        if (t.has_image) {  /* the occupancy query needs a device the kernels were built for */
            t.decode_ctas_per_sm[0] = fc_sm80_decode_ctas_per_sm_d64();
            t.decode_ctas_per_sm[1] = fc_sm80_decode_ctas_per_sm_d128();
            t.decode_ctas_per_sm[2] = fc_sm80_decode_ctas_per_sm_d256();
        }
        /* Concurrent first calls write the same values; a reader that sees valid set sees them all. */
        *d = t;
        __atomic_store_n(&d->valid, 1, __ATOMIC_RELEASE);
    }
    return d;
}

const char* fc_arch_reason(fc_kernel k, int cc_major, int cc_minor) {
    (void)cc_minor;
    switch (k) {
        case FC_KERNEL_AUTO:
        case FC_KERNEL_SM80:
            return cc_major >= 8 ? NULL
                                 : "the sm80 kernel needs a GPU of compute capability 8.0 or newer "
                                   "(A100, A10/RTX 30xx, L4/RTX 40xx, H100); this GPU is older";
        case FC_KERNEL_SM90:
#ifdef FC_HAVE_SM90
            return cc_major == 9 && cc_minor == 0
                       ? NULL
                       : "the sm90 kernel needs a compute capability 9.0 GPU (H100, H200); use kernel='auto' "
                         "or 'sm80'";
#else
            return "this flashcore build has no sm_90a code; rebuild with FLASHCORE_ARCHS containing 90a, "
                   "or use kernel='sm80'";
#endif
        case FC_KERNEL_CPU:
            return "the cpu kernel runs on host memory, not on a GPU";
    }
    return "unknown kernel";
}

/* Why GPU kernel k cannot run on dev: its architecture (fc_arch_reason), or a build with no code for
 * the device (sm_80 code runs on 8.x GPUs only and sm_90a code on 9.0 only, so a newer GPU needs code
 * of its own: FLASHCORE_ARCHS in setup.py). NULL: it runs. */
static const char* device_reason(fc_kernel k, const fc_device_info* dev) {
    const char* r = fc_arch_reason(k, dev->major, dev->minor);
    if (r || dev->has_image) return r;
    return "this flashcore build has no code for this GPU; rebuild it with FLASHCORE_ARCHS naming the GPU's "
           "compute capability (the default, \"80;90a\", runs on 8.x and 9.0 GPUs)";
}

static size_t kernel_smem(fc_kernel k, int D) {
#ifdef FC_HAVE_SM90
    if (k == FC_KERNEL_SM90)
        return D <= 64 ? fc_sm90_smem_d64() : D <= 128 ? fc_sm90_smem_d128() : fc_sm90_smem_d256();
#endif
    (void)k;
    return D <= 64 ? fc_sm80_smem_d64() : D <= 128 ? fc_sm80_smem_d128() : fc_sm80_smem_d256();
}

fc_kernel fc_attn_fwd_pick(const fc_attn_params* p) {
    if (p && p->kernel != FC_KERNEL_AUTO) return p->kernel;
    const fc_device_info* dev = current_device();
    if (dev && fc_arch_reason(FC_KERNEL_SM90, dev->major, dev->minor) == NULL) return FC_KERNEL_SM90;
    return FC_KERNEL_SM80;
}

/* ---- split-KV planning ----
 *
 * Kernel choice. The tile kernel gives each CTA 64-128 query rows of one query
 * head; with few rows per KV head (decode) most of its M dimension is padding
 * and each KV head is read once per query head. The split-KV kernel packs the
 * Hq/Hkv query heads of one KV head times Sq into 16-row tiles, so it is
 * chosen when those packed rows fit in FC_DECODE_MAX_ROW_BLOCKS tiles, or when
 * num_splits > 1 forces it.
 *
 * Number of splits (num_splits == 0). The kernel is bandwidth-bound: time ~
 * (waves of CTAs) x (key tiles per CTA + a fixed per-CTA cost). With `groups`
 * CTAs per split (B x Hkv x row blocks) and `slots` = the SM count, n splits cost
 *     ceil(groups * n / slots) * (ceil(tiles / n) + FC_SPLIT_OVERHEAD_TILES)
 * and the smallest cost wins (ties: fewer splits), for n up to FC_SPLIT_MAX_AUTO.
 * The overhead term keeps splits from shrinking to a tile or two (pipeline
 * fill, epilogue and the combine's extra traffic) and makes a grid that
 * already fills the GPU keep one split. Then the tiles are spread evenly:
 * tiles_per_split = ceil(tiles / n), n = ceil(tiles / tiles_per_split), so no
 * split is empty. Only visible keys count: top-left causal decode sees few.
 *
 * Why slots is the SM count and not SMs x resident CTAs per SM: one split CTA
 * already keeps 64 KB or more of K/V in flight, and on an H100 a second CTA
 * per SM only added DRAM streams. Measured (perf notes, decode retune):
 * B=1 Hq=32 Hkv=8 Sk=128k D=128 took 193.6 us with 16 splits (128 CTAs, one
 * per SM) and 200.8 us with 33 (two per SM); 17-24 splits (a few SMs with
 * two) took 200-210 us.
 */
#define FC_DECODE_MAX_ROW_BLOCKS 4  /* auto: split-KV kernel when Hq/Hkv * Sq <= 4 * 16 = 64 */
#define FC_SPLIT_MAX_AUTO 128       /* the heuristic never picks more splits than this */
#define FC_SPLIT_OVERHEAD_TILES 2   /* fixed cost of one CTA, in key tiles of streaming */

static int padded_dim_index(int D) { return D <= 64 ? 0 : D <= 128 ? 1 : 2; }
static int decode_bc(int D) { return D <= 64 ? FC_DECODE_BC(64) : D <= 128 ? FC_DECODE_BC(128) : FC_DECODE_BC(256); }

/* Thread blocks of the combine kernel (FC_COMBINE_ROWS query rows each), which
 * runs after every split-KV call and alone for a call with Sk = 0. */
static int64_t combine_blocks(const fc_attn_params* p) {
    return ((int64_t)p->B * p->Hq * p->Sq + FC_COMBINE_ROWS - 1) / FC_COMBINE_ROWS;
}

/* Fills sp (all but the workspace pointers) and returns 1 when the split-KV
 * kernel runs, 0 for the tile kernel. p's shapes must already be valid. */
static int plan_split(const fc_attn_params* p, const fc_device_info* dev, fc_split_plan* sp) {
    const int G = p->Hq / p->Hkv;
    const int64_t rows = (int64_t)G * p->Sq;
    const int64_t row_blocks = (rows + FC_DECODE_ROWS - 1) / FC_DECODE_ROWS;
    if (p->num_splits <= 1 && row_blocks > FC_DECODE_MAX_ROW_BLOCKS) return 0;
    const int ctas_per_sm = dev->decode_ctas_per_sm[padded_dim_index(p->D)];
    if (ctas_per_sm == 0) return 0;  /* cannot run here; check reports it when forced */

    /* key tiles any row can see: from row 0's first visible key (the kernel's
     * fc_decode_first_tile) to the last row's last one */
    const fc_band band = FC_BAND(*p);
    const int64_t visible = fc_band_key_end(band, p->Sk, 0, p->Sq);
    const int bc = decode_bc(p->D);
    const int64_t first = fc_decode_first_tile(band, bc);
    const int64_t tiles = visible <= first * bc ? 1 : (visible + bc - 1) / bc - first;
    const int64_t groups = row_blocks * p->B * p->Hkv;  /* CTAs per split */
    /* 1-D grid limits of the split and combine kernels; check rejects them when forced */
    if (groups > FC_GRID_X_MAX || combine_blocks(p) > FC_GRID_X_MAX) return 0;

    int64_t n;
    if (p->num_splits >= 1) {
        n = p->num_splits;
    } else {
        const int64_t slots = dev->sm_count;
        const int64_t n_max = tiles < FC_SPLIT_MAX_AUTO ? tiles : FC_SPLIT_MAX_AUTO;
        int64_t best_cost = -1;
        n = 1;
        for (int64_t c = 1; c <= n_max; ++c) {
            const int64_t waves = (groups * c + slots - 1) / slots;
            const int64_t cost = waves * ((tiles + c - 1) / c + FC_SPLIT_OVERHEAD_TILES);
            if (best_cost < 0 || cost < best_cost) { best_cost = cost; n = c; }
        }
    }
    if (n > tiles) n = tiles;
    if (n > FC_MAX_SPLITS) n = FC_MAX_SPLITS;
    if (n > FC_GRID_X_MAX / groups) n = FC_GRID_X_MAX / groups;  /* 1-D grid limit */
    if (n < 1) n = 1;
    const int64_t per = (tiles + n - 1) / n;
    sp->splits = (int)((tiles + per - 1) / per);
    sp->tiles_per_split = (int)per;
    sp->row_blocks = (int)row_blocks;
    sp->o_part = NULL;
    sp->lse_part = NULL;
    return 1;
}

static size_t split_workspace_bytes(const fc_attn_params* p, const fc_split_plan* sp) {
    if (sp->splits <= 1) return 0;
    return (size_t)sp->splits * (size_t)p->B * p->Hq * p->Sq * ((size_t)p->D + 1) * sizeof(float);
}

/* Whether the call runs the split-KV kernel (sp filled): with kernel auto or
 * sm80 when plan_split says so. A forced sm90 call never splits. */
static int use_split(const fc_attn_params* p, fc_kernel k, const fc_device_info* dev, fc_split_plan* sp) {
    if (k == FC_KERNEL_SM90 && p->kernel == FC_KERNEL_SM90) return 0;
    return plan_split(p, dev, sp);
}

/* ---- check ---- */

typedef struct {
    fc_status first;  /* first failing status, FC_OK if none */
    char* buf;        /* reasons, one per line */
    size_t len, used;
} fc_reasons;

static void fail(fc_reasons* r, fc_status s, const char* fmt, ...) {
    if (r->first == FC_OK) r->first = s;
    if (!r->buf || r->len == 0 || r->used + 1 >= r->len) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(r->buf + r->used, r->len - r->used, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    r->used += (size_t)n < r->len - r->used ? (size_t)n : r->len - r->used - 1;
    if (r->used + 1 < r->len) { r->buf[r->used++] = '\n'; r->buf[r->used] = '\0'; }
}

static void check_aligned(fc_reasons* r, const char* name, const void* ptr, int64_t sb, int64_t sh, int64_t sr) {
    if ((uintptr_t)ptr % (2 * FC_ALIGN_ELEMS) != 0)
        fail(r, FC_ERR_INVALID_STRIDE, "%s: data pointer is not 16-byte aligned; pass a contiguous tensor "
             "(for example %s.contiguous())", name, name);
    if (sb % FC_ALIGN_ELEMS || sh % FC_ALIGN_ELEMS || sr % FC_ALIGN_ELEMS)
        fail(r, FC_ERR_INVALID_STRIDE, "%s: strides (%lld, %lld, %lld) must be multiples of 8 elements on the GPU; "
             "pass %s.contiguous()", name, (long long)sb, (long long)sh, (long long)sr, name);
}

/* What the checks decided; the launch and the size queries reuse it. */
typedef struct {
    fc_kernel kernel;           /* the resolved kernel (never FC_KERNEL_AUTO) */
    const fc_device_info* dev;  /* the current device; NULL for the CPU kernel */
    int split;                  /* 1: the split-KV kernel runs with `plan` */
    int dyn;                    /* 1: the sm90 kernel takes its tiles from a workspace counter */
    size_t tail;                /* bytes of workspace for the sm90 kernel's split tail (0: none) */
    fc_split_plan plan;         /* valid when split (workspace pointers unset) */
} fc_choice;

/* Bytes of workspace the choice c needs: the split-KV partials, the sm90
 * dynamic order's tile counter, or the sm90 split tail's partials (see
 * fc_attn_fwd_workspace_size). */
static size_t choice_workspace_bytes(const fc_attn_params* p, const fc_choice* c) {
    return c->split ? split_workspace_bytes(p, &c->plan) : c->dyn ? FC_SM90_DYN_WORKSPACE : c->tail;
}

/* Whether p has no output row (B, Hq or Sq is 0): an empty call. */
static int no_output_rows(const fc_attn_params* p) {
    return p->B == 0 || p->Hq == 0 || p->Sq == 0;
}

/* Dv (fc_attn_params, fc_attn_bwd_params): 0 or a multiple of 8 from 8 to D. */
static void check_dv(fc_reasons* rp, int Dv, int D) {
    if (Dv != 0 && (Dv < 8 || Dv > D || Dv % 8 != 0))
        fail(rp, FC_ERR_UNSUPPORTED_HEAD_DIM, "Dv: v's head dim %d is not supported with D=%d; use 0 (the same "
             "as D) or a multiple of 8 from 8 to D (pad v, or q and k, to one head dim)", Dv, D);
}

/* A Dv other than D on GPU kernel k: only the sm90 kernels at D > 128 take it (forward and backward);
 * `what` names the refused kernel's pass ("kernel", "backward"), `fix` the padding that replaces it. */
static void check_dv_kernel(fc_reasons* rp, int Dv, int D, fc_kernel k, const char* what, const char* fix) {
    if (Dv != 0 && Dv != D && !(k == FC_KERNEL_SM90 && D > 128))
        fail(rp, FC_ERR_UNSUPPORTED_HEAD_DIM, "Dv: v's head dim %d differs from D=%d, which the %s %s does not "
             "run (the CPU kernel does, and the sm90 kernel at D > 128); %s", Dv, D,
             k == FC_KERNEL_SM90 ? "sm90 (at D <= 128)" : "sm80", what, fix);
}

/* Every check; the workspace is checked only when check_workspace is set
 * (the size queries run before the caller has one). On FC_OK, *c says which
 * kernel runs and how. */
static fc_status check_impl(const fc_attn_params* p, fc_reasons* rp, int check_workspace, fc_choice* c) {
    fc_reasons r = *rp;
    c->kernel = FC_KERNEL_CPU;
    c->dev = NULL;
    c->split = 0;
    c->dyn = 0;
    c->tail = 0;
    if (!p) { fail(&r, FC_ERR_NULL_POINTER, "params: NULL"); *rp = r; return r.first; }

    const int no_rows = no_output_rows(p);
    if (!no_rows && (!p->q || !p->o || (p->Sk > 0 && (!p->k || !p->v))))
        fail(&r, FC_ERR_NULL_POINTER, "q, k, v, o: every tensor pointer must be non-NULL (q and o may be NULL "
             "when B, Hq or Sq is 0, k and v when Sk is 0)");
    if (p->B < 0 || p->Hq < 0 || p->Hkv < 0 || p->Sq < 0 || p->Sk < 0)
        fail(&r, FC_ERR_INVALID_SHAPE, "shape: B=%d Hq=%d Hkv=%d Sq=%d Sk=%d must all be >= 0",
             p->B, p->Hq, p->Hkv, p->Sq, p->Sk);
    else if (p->Hkv == 0 ? p->Hq > 0 : p->Hq % p->Hkv != 0)
        fail(&r, FC_ERR_INVALID_SHAPE, "k, v: Hkv=%d must divide Hq=%d (Hkv = 0 only with Hq = 0)", p->Hkv, p->Hq);
    if (p->Sq > FC_MAX_SEQ_LEN || p->Sk > FC_MAX_SEQ_LEN)
        fail(&r, FC_ERR_INVALID_SHAPE, "shape: Sq=%d, Sk=%d: sequence lengths above 2^30 are not supported; split "
             "the call (queries into chunks, or keys into chunks merged by their LSE)", p->Sq, p->Sk);
    if (p->D < 8 || p->D > FC_MAX_HEAD_DIM || p->D % 8 != 0)
        fail(&r, FC_ERR_UNSUPPORTED_HEAD_DIM, "D: head dim %d is not supported; use a multiple of 8 from 8 to %d",
             p->D, FC_MAX_HEAD_DIM);
    check_dv(&r, p->Dv, p->D);
    if (!(p->scale > 0.f && p->scale <= FC_MAX_SCALE))  /* (false for NaN) */
        fail(&r, FC_ERR_INVALID_SCALE, "scale: %g must be > 0 and at most FC_MAX_SCALE (2.3e38)", (double)p->scale);
    if (p->causal != FC_CAUSAL_NONE && p->causal != FC_CAUSAL_TOP_LEFT && p->causal != FC_CAUSAL_BOTTOM_RIGHT)
        fail(&r, FC_ERR_INVALID_ARGUMENT, "causal: unknown mode %d", (int)p->causal);
    if (p->window != 0 && p->window != 1)
        fail(&r, FC_ERR_INVALID_ARGUMENT, "window: %d; use 0 (no window) or 1 (window_left, window_right)",
             p->window);
    else if (p->window == 0 && (p->window_left != 0 || p->window_right != 0))
        fail(&r, FC_ERR_INVALID_ARGUMENT, "window_left, window_right: %d, %d with window = 0; set window = 1 to "
             "use them, or leave them 0", p->window_left, p->window_right);
    else if (p->window == 1 && p->causal == FC_CAUSAL_NONE)
        fail(&r, FC_ERR_INVALID_ARGUMENT, "causal: a window needs a diagonal; pass FC_CAUSAL_TOP_LEFT or "
             "FC_CAUSAL_BOTTOM_RIGHT (window_right = -1 leaves the keys after it visible)");
    else if (p->window == 1 && (p->window_left < -1 || p->window_right < -1))
        fail(&r, FC_ERR_INVALID_ARGUMENT, "window_left, window_right: %d, %d; use keys >= 0, or -1 for no bound",
             p->window_left, p->window_right);
    if (p->dtype != FC_DTYPE_FP16 && p->dtype != FC_DTYPE_BF16 && p->dtype != FC_DTYPE_FP32 &&
        p->dtype != FC_DTYPE_FP64)
        fail(&r, FC_ERR_UNSUPPORTED_DTYPE, "dtype: unknown value %d", (int)p->dtype);
    if (p->dtype == FC_DTYPE_FP64) {
        if (!(p->scale64 > 0. && p->scale64 <= FC_MAX_SCALE && (float)p->scale64 == p->scale))
            fail(&r, FC_ERR_INVALID_SCALE, "scale64: %g must be > 0 and at most FC_MAX_SCALE (2.3e38), with scale "
                 "its fp32 rounding (%g)", p->scale64, (double)p->scale);
        if (p->lse)
            fail(&r, FC_ERR_INVALID_ARGUMENT, "lse: an fp64 call writes its LSE to lse64 (fp64); set lse to NULL");
    } else if (p->lse64) {
        fail(&r, FC_ERR_INVALID_ARGUMENT, "lse64: only an fp64 call writes it; set it to NULL (the LSE goes to "
             "lse)");
    }
    if (p->num_splits < 0)
        fail(&r, FC_ERR_INVALID_ARGUMENT, "num_splits: %d is negative; use 0 (heuristic), 1 (no split) or n > 1 "
             "(split Sk n ways)", p->num_splits);
    if (p->mask_kind != FC_MASK_NONE && p->mask_kind != FC_MASK_BOOL && p->mask_kind != FC_MASK_ADD &&
        p->mask_kind != FC_MASK_ADD_FP32)
        fail(&r, FC_ERR_INVALID_ARGUMENT, "mask_kind: unknown value %d", (int)p->mask_kind);
    else if (p->mask_kind == FC_MASK_NONE && p->mask)
        fail(&r, FC_ERR_INVALID_ARGUMENT, "mask: set, but mask_kind is FC_MASK_NONE; name its kind (FC_MASK_BOOL, "
             "FC_MASK_ADD or FC_MASK_ADD_FP32) or set it to NULL");
    else if (p->mask_kind != FC_MASK_NONE && !p->mask && !no_rows && p->Sk > 0)
        fail(&r, FC_ERR_NULL_POINTER, "mask: NULL with mask_kind %d; pass the (B, Hq, Sq, Sk) mask", (int)p->mask_kind);
    if (p->mask_batch_stride < 0 || p->mask_head_stride < 0 || p->mask_row_stride < 0)
        fail(&r, FC_ERR_INVALID_STRIDE, "mask: strides %lld, %lld, %lld must be >= 0 (0 broadcasts a dim)",
             (long long)p->mask_batch_stride, (long long)p->mask_head_stride, (long long)p->mask_row_stride);
    if (p->counters_zeroed != 0 && p->counters_zeroed != 1)
        fail(&r, FC_ERR_INVALID_ARGUMENT, "counters_zeroed: %d; use 1 for a workspace whose counters are zero "
             "(see flashcore.h) or 0", p->counters_zeroed);

    const fc_kernel k = fc_attn_fwd_pick(p);
    c->kernel = k;
    if (k == FC_KERNEL_CPU) { *rp = r; return r.first; }
    if (k != FC_KERNEL_SM80 && k != FC_KERNEL_SM90) {
        fail(&r, FC_ERR_INVALID_ARGUMENT, "kernel: unknown value %d", (int)p->kernel);
        *rp = r;
        return r.first;
    }

    /* GPU kernels */
    if (p->mask_kind != FC_MASK_NONE)
        fail(&r, FC_ERR_INVALID_ARGUMENT, "mask: only the CPU kernel takes a mask so far; run the call on the CPU "
             "(kernel FC_KERNEL_CPU on host memory)");
    const int own_dv = FC_DV(*p) != p->D;  /* v's head dim is not D: the sm90 tile kernel at D > 128 only */
    check_dv_kernel(&r, p->Dv, p->D, k, "kernel", "pad v to D and cut o's extra columns");
    if (p->dtype == FC_DTYPE_FP32 || p->dtype == FC_DTYPE_FP64)
        fail(&r, FC_ERR_UNSUPPORTED_DTYPE, "dtype: %s runs only on the CPU; use fp16 or bf16 on the GPU",
             p->dtype == FC_DTYPE_FP32 ? "fp32" : "fp64");
    if (((int64_t)p->Sq + 63) / 64 * p->B * p->Hq > FC_GRID_X_MAX)  /* 64: the smallest BR */
        fail(&r, FC_ERR_INVALID_SHAPE, "shape: B=%d x Hq=%d x Sq=%d needs more than 2^31-1 thread blocks; "
             "split the batch", p->B, p->Hq, p->Sq);
    check_aligned(&r, "q", p->q, p->q_batch_stride, p->q_head_stride, p->q_row_stride);
    check_aligned(&r, "k", p->k, p->k_batch_stride, p->k_head_stride, p->k_row_stride);
    check_aligned(&r, "v", p->v, p->v_batch_stride, p->v_head_stride, p->v_row_stride);
    check_aligned(&r, "o", p->o, p->o_batch_stride, p->o_head_stride, p->o_row_stride);

    const fc_device_info* dev = current_device();
    if (!dev) {
        fail(&r, FC_ERR_CUDA, "device: no usable CUDA device (cudaGetDevice, cudaDeviceGetAttribute or the "
             "kernels' cudaFuncGetAttributes failed)");
        *rp = r;
        return r.first;
    }
    const char* reason = device_reason(k, dev);
    if (reason) {
        fail(&r, FC_ERR_ARCH, "device: compute capability %d.%d: %s", dev->major, dev->minor, reason);
    } else if (p->D >= 8 && p->D <= FC_MAX_HEAD_DIM && kernel_smem(k, p->D) > (size_t)dev->smem_optin) {
        fail(&r, FC_ERR_ARCH, "device: head dim %d needs %zu bytes of shared memory per block, this GPU "
             "allows %d", p->D, kernel_smem(k, p->D), dev->smem_optin);
    }

    /* An empty call runs no tile kernel: no split, no workspace. With Sk = 0
     * the combine kernel writes the zero rows (fc_attn_fwd). */
    const int empty = no_rows || p->Sk == 0;
    if (r.first == FC_OK && !no_rows && p->Sk == 0 && combine_blocks(p) > FC_GRID_X_MAX)
        fail(&r, FC_ERR_INVALID_SHAPE, "shape: B=%d x Hq=%d x Sq=%d rows with Sk=0 need more than 2^31-1 "
             "thread blocks; split the batch", p->B, p->Hq, p->Sq);

    /* split-KV: only once the shapes are known to be valid */
    if (r.first == FC_OK) {
        const int64_t row_blocks =
            p->Hkv > 0 ? ((int64_t)(p->Hq / p->Hkv) * p->Sq + FC_DECODE_ROWS - 1) / FC_DECODE_ROWS : 0;
        if (p->num_splits > 1 && p->kernel == FC_KERNEL_SM90)
            fail(&r, FC_ERR_INVALID_ARGUMENT, "num_splits: the sm90 kernel does not split Sk; pass "
                 "num_splits=None, or kernel='auto' (split-KV runs the portable decode kernel)");
        else if (p->num_splits > 1 && dev->decode_ctas_per_sm[padded_dim_index(p->D)] == 0)
            fail(&r, FC_ERR_ARCH, "num_splits: the split-KV kernel cannot run on this GPU at head dim %d "
                 "(too little shared memory); pass num_splits=None", p->D);
        else if (p->num_splits > 1 && row_blocks * p->B * p->Hkv > FC_GRID_X_MAX)
            fail(&r, FC_ERR_INVALID_SHAPE, "num_splits: B=%d x Hkv=%d x Hq/Hkv*Sq/16 needs more than 2^31-1 "
                 "thread blocks; pass num_splits=None", p->B, p->Hkv);
        else if (p->num_splits > 1 && combine_blocks(p) > FC_GRID_X_MAX)
            fail(&r, FC_ERR_INVALID_SHAPE, "num_splits: B=%d x Hq=%d x Sq=%d rows need more than 2^31-1 thread "
                 "blocks to merge the splits; pass num_splits=None", p->B, p->Hq, p->Sq);
        else if (!empty) {
            c->split = use_split(p, k, dev, &c->plan);
            if (c->split && own_dv)
                fail(&r, FC_ERR_UNSUPPORTED_HEAD_DIM, "Dv: v's head dim %d differs from D=%d, which the split-KV "
                     "kernel this call runs (few query rows, many keys) does not take; pad v to D and cut o's "
                     "extra columns", p->Dv, p->D);
            if (!c->split && k == FC_KERNEL_SM90) {
                c->dyn = fc_sm90_dynamic_order(p, dev->sm_count);
                c->tail = fc_sm90_tail_workspace(p, dev->sm_count);
            }
        }
        const size_t need = r.first == FC_OK ? choice_workspace_bytes(p, c) : 0;
        if (check_workspace && need > 0) {
            if (!p->workspace || p->workspace_bytes < need) {
                char what[64];  /* (formatted only for the refusal) */
                if (c->split) snprintf(what, sizeof what, "%d splits", c->plan.splits);
                else if (c->dyn) snprintf(what, sizeof what, "the tile counter of a causal sm90 call");
                else snprintf(what, sizeof what, "the partials of a non-causal sm90 call");
                fail(&r, FC_ERR_WORKSPACE, "workspace: %zu bytes given, %zu needed for %s; allocate "
                     "fc_attn_fwd_workspace_size(params) bytes", p->workspace ? p->workspace_bytes : (size_t)0,
                     need, what);
            } else if ((uintptr_t)p->workspace % 16 != 0)
                fail(&r, FC_ERR_WORKSPACE, "workspace: pointer is not 16-byte aligned");
        }
    }
    c->dev = dev;
    *rp = r;
    return r.first;
}

/* check_impl with every reason written to why (the public check functions). */
static fc_status check_why(const fc_attn_params* p, char* why, size_t why_len, int check_workspace) {
    fc_reasons r = {FC_OK, why, why_len, 0};
    if (why && why_len) why[0] = '\0';
    fc_choice c;
    return check_impl(p, &r, check_workspace, &c);
}

fc_status fc_attn_fwd_check(const fc_attn_params* p, char* why, size_t why_len) {
    return check_why(p, why, why_len, 1);
}

fc_status fc_attn_fwd_check_args(const fc_attn_params* p, char* why, size_t why_len) {
    return check_why(p, why, why_len, 0);
}

int fc_attn_fwd_num_splits(const fc_attn_params* p) {
    fc_reasons r = {FC_OK, NULL, 0, 0};
    fc_choice c;
    return check_impl(p, &r, 0, &c) == FC_OK && c.split ? c.plan.splits : 0;
}

size_t fc_attn_fwd_workspace_size(const fc_attn_params* p) {
    fc_reasons r = {FC_OK, NULL, 0, 0};
    fc_choice c;
    return check_impl(p, &r, 0, &c) == FC_OK ? choice_workspace_bytes(p, &c) : 0;
}

/* Launches the checked choice c for p on stream. */
static fc_status launch_choice(const fc_attn_params* p, const fc_choice* c, fc_stream_t stream) {
    const fc_device_info* dev = c->dev;
    if (c->split) {  /* decode-like: the split-KV kernel, on any sm80+ GPU */
        fc_split_plan sp = c->plan;
        sp.pdl = sp.splits > 1 && dev->major >= 9;  /* only a combine kernel depends on it */
        if (sp.splits > 1) {  /* workspace layout: see fc_attn_fwd_workspace_size */
            sp.o_part = (float*)p->workspace;
            sp.lse_part = sp.o_part + (size_t)sp.splits * p->B * p->Hq * p->Sq * p->D;
        }
        return p->D <= 64 ? fc_sm80_decode_d64(p, &sp, stream)
             : p->D <= 128 ? fc_sm80_decode_d128(p, &sp, stream)
                           : fc_sm80_decode_d256(p, &sp, stream);
    }
    switch (c->kernel) {
        case FC_KERNEL_SM80:
            /* D <= 64 with fewer 128-row CTAs than SMs: 64-row CTAs (twice as many) */
            if (p->D <= 64 && (int64_t)((p->Sq + 127) / 128) * p->B * p->Hq < dev->sm_count)
                return fc_sm80_fwd_small_d64(p, stream);
            return p->D <= 64 ? fc_sm80_fwd_d64(p, stream)
                 : p->D <= 128 ? fc_sm80_fwd_d128(p, stream)
                               : fc_sm80_fwd_d256(p, stream);
#ifdef FC_HAVE_SM90
        case FC_KERNEL_SM90:
            /* (MLA's shapes take their own tile; its shared memory is below D = 256's, which check_impl checks) */
            return p->D <= 64 ? fc_sm90_fwd_d64(p, dev->sm_count, stream)
                 : p->D <= 128 ? fc_sm90_fwd_d128(p, dev->sm_count, stream)
                 : fc_sm90_d192(p) ? fc_sm90_fwd_d192(p, dev->sm_count, stream)
                               : fc_sm90_fwd_d256(p, dev->sm_count, stream);
#endif
        default: return FC_ERR_ARCH;
    }
}

fc_status fc_attn_fwd(const fc_attn_params* p, fc_stream_t stream) {
    fc_reasons r = {FC_OK, NULL, 0, 0};
    fc_choice c;
    fc_status s = check_impl(p, &r, 1, &c);
    if (s != FC_OK) return s;
    if (no_output_rows(p)) return FC_OK;
    if (c.kernel == FC_KERNEL_CPU) return fc_cpu_fwd(p);  /* (Sk = 0 included: every row masked) */
    if (p->Sk == 0) {  /* no keys: the combine of zero splits writes O = 0 (Dv columns), LSE = -inf */
        const fc_split_plan none = {0};
        fc_attn_params z = *p;
        z.D = FC_DV(*p);
        z.Dv = 0;
        return fc_split_combine(&z, &none, stream);
    }
    s = launch_choice(p, &c, stream);
    /* A workspace kept zero (counters_zeroed) is left zero: the dynamic order's
     * kernel zeroes its counter itself; partials (split-KV, the split tail) are
     * zeroed again behind their kernels. */
    if (s != FC_OK || !p->counters_zeroed || c.dyn) return s;
    const size_t partials = choice_workspace_bytes(p, &c);
    if (partials > 0 && cudaMemsetAsync(p->workspace, 0, partials, (cudaStream_t)stream) != cudaSuccess)
        return FC_ERR_CUDA;
    return s;
}

/* ---- backward ----
 *
 * The forward's checks run on the backward's q, k, v and o (a forward params
 * view with the sm80 family or the CPU as its kernel), then the backward's
 * own: dout, dq, dk, dv and lse pointers and alignment, the GPU kernel's head
 * dim and shared memory, and the workspace. On the GPU, kernel AUTO picks the
 * Hopper backward on a compute capability 9.0 device when the build has sm_90a
 * code (every head dim), else the portable one (every sm80+
 * device; at D > 128 those with 144.5 KB of shared memory per block); SM80 and
 * SM90 force one.
 */
static fc_attn_params bwd_forward_view(const fc_attn_bwd_params* p) {
    fc_attn_params f;
    memset(&f, 0, sizeof f);
    f.q = p->q; f.k = p->k; f.v = p->v; f.o = (void*)p->o;
    f.q_batch_stride = p->q_batch_stride; f.q_head_stride = p->q_head_stride; f.q_row_stride = p->q_row_stride;
    f.k_batch_stride = p->k_batch_stride; f.k_head_stride = p->k_head_stride; f.k_row_stride = p->k_row_stride;
    f.v_batch_stride = p->v_batch_stride; f.v_head_stride = p->v_head_stride; f.v_row_stride = p->v_row_stride;
    f.o_batch_stride = p->o_batch_stride; f.o_head_stride = p->o_head_stride; f.o_row_stride = p->o_row_stride;
    f.B = p->B; f.Hq = p->Hq; f.Hkv = p->Hkv; f.Sq = p->Sq; f.Sk = p->Sk; f.D = p->D;
    f.dtype = p->dtype; f.scale = p->scale; f.scale64 = p->scale64; f.causal = p->causal;
    f.window = p->window; f.window_left = p->window_left; f.window_right = p->window_right;
    f.mask = p->mask; f.mask_kind = p->mask_kind;
    f.mask_batch_stride = p->mask_batch_stride; f.mask_head_stride = p->mask_head_stride;
    f.mask_row_stride = p->mask_row_stride;
    f.kernel = p->kernel == FC_KERNEL_CPU ? FC_KERNEL_CPU : FC_KERNEL_SM80;
    f.num_splits = 1;
    return f;
}

#define FC_WORKSPACE_ALIGN 16 /* bytes: every workspace pointer and size is a multiple of this */

/* Workspace of the GPU backward (kernels.h, the same for both kernels): the dQ
 * accumulator of padded rows and head dim in pieces, Delta and LSE * log2(e) of
 * padded rows, the Hopper kernel's item counter, then a deterministic call's
 * turn counters (one per piece). */
static size_t bwd_workspace_bytes(const fc_attn_bwd_params* p) {
    const size_t vec = (size_t)p->B * p->Hq * (((size_t)p->Sq + FC_BWD_ROW_PAD - 1) / FC_BWD_ROW_PAD * FC_BWD_ROW_PAD);
    const size_t dp = (size_t)64 << padded_dim_index(p->D);  /* the padded head dim: 64, 128, 256 */
    const size_t turns = p->deterministic ? vec / FC_BWD_PIECE_DIM * (dp / FC_BWD_PIECE_DIM) : 0; /* int32 each */
    const size_t floats = vec * dp + 2 * vec + 1 + turns;  /* + 1: the item counter, one int32 */
    return (floats * sizeof(float) + FC_WORKSPACE_ALIGN - 1) / FC_WORKSPACE_ALIGN * FC_WORKSPACE_ALIGN;
}

/* The GPU backward kernel for p on dev: the forced one, or AUTO's choice. */
static fc_kernel bwd_pick(const fc_attn_bwd_params* p, const fc_device_info* dev) {
    if (p->kernel != FC_KERNEL_AUTO) return p->kernel;
    return dev && fc_arch_reason(FC_KERNEL_SM90, dev->major, dev->minor) == NULL ? FC_KERNEL_SM90 : FC_KERNEL_SM80;
}

static size_t bwd_smem(fc_kernel k, int D) {
#ifdef FC_HAVE_SM90
    if (k == FC_KERNEL_SM90)
        return D <= 64 ? fc_sm90_bwd_smem_d64() : D <= 128 ? fc_sm90_bwd_smem_d128() : fc_sm90_bwd_smem_d256();
#endif
    (void)k;
    return D <= 64 ? fc_sm80_bwd_smem_d64() : D <= 128 ? fc_sm80_bwd_smem_d128() : fc_sm80_bwd_smem_d256();
}

/* Whether the GPU backward runs its kernels (and needs the workspace): not
 * for an empty call, nor when Sq or Sk is 0 (the gradients are zeros). */
static int bwd_needs_workspace(const fc_attn_bwd_params* p) {
    return p->B > 0 && p->Hq > 0 && p->Sq > 0 && p->Sk > 0;
}

/* What GPU backward kernel k cannot do at head dim D on dev: the Hopper
 * kernel's architecture, and the shared memory per block. */
static void bwd_device_reasons(fc_reasons* rp, fc_kernel k, int D, const fc_device_info* dev) {
    const char* arch = k == FC_KERNEL_SM90 ? fc_arch_reason(k, dev->major, dev->minor) : NULL;
    if (arch)
        fail(rp, FC_ERR_ARCH, "kernel: this GPU has compute capability %d.%d; %s", dev->major, dev->minor, arch);
    else if (bwd_smem(k, D) > (size_t)dev->smem_optin)
        fail(rp, FC_ERR_ARCH, "device: the backward at head dim %d needs %zu bytes of shared memory per block, "
             "this GPU allows %d; use scaled_dot_product_attention for training at this head dim on this GPU",
             D, bwd_smem(k, D), dev->smem_optin);
}

/* Checks p; *kernel (when not NULL) gets the GPU kernel that would run, *dev (when not NULL) the
 * device it would run on. */
static fc_status bwd_check_impl(const fc_attn_bwd_params* p, fc_reasons* rp, int check_workspace, fc_kernel* kernel,
                                const fc_device_info** dev) {
    if (!p) { fail(rp, FC_ERR_NULL_POINTER, "params: NULL"); return rp->first; }
    if (p->kernel != FC_KERNEL_AUTO && p->kernel != FC_KERNEL_SM80 && p->kernel != FC_KERNEL_SM90 &&
        p->kernel != FC_KERNEL_CPU) {
        fail(rp, FC_ERR_INVALID_ARGUMENT, "kernel: unknown value %d", (int)p->kernel);
        return rp->first;
    }
    const fc_attn_params f = bwd_forward_view(p);  /* (at D: Dv is checked below) */
    fc_choice c;
    check_impl(&f, rp, 0, &c);
    check_dv(rp, p->Dv, p->D);
    const int no_rows = no_output_rows(&f);
    const int fp64 = p->dtype == FC_DTYPE_FP64;
    if (!no_rows && (!p->dout || !p->dq || !(fp64 ? (const void*)p->lse64 : (const void*)p->lse)))
        fail(rp, FC_ERR_NULL_POINTER, "dout, dq, %s: must be non-NULL (they may be NULL when B, Hq or Sq is 0)",
             fp64 ? "lse64" : "lse");
    if (fp64 && (p->lse || p->dlse))
        fail(rp, FC_ERR_INVALID_ARGUMENT, "lse, dlse: an fp64 call reads lse64 and dlse64 (fp64); set lse and dlse "
             "to NULL");
    else if (!fp64 && (p->lse64 || p->dlse64))
        fail(rp, FC_ERR_INVALID_ARGUMENT, "lse64, dlse64: only an fp64 call reads them; set them to NULL (use lse "
             "and dlse)");
    if (p->B > 0 && p->Hkv > 0 && p->Sk > 0 && (!p->dk || !p->dv))
        fail(rp, FC_ERR_NULL_POINTER, "dk, dv: must be non-NULL (they may be NULL when B, Hkv or Sk is 0)");
    if (p->kernel == FC_KERNEL_CPU || rp->first != FC_OK) return rp->first;

    check_aligned(rp, "dout", p->dout, p->do_batch_stride, p->do_head_stride, p->do_row_stride);
    check_aligned(rp, "dq", p->dq, p->dq_batch_stride, p->dq_head_stride, p->dq_row_stride);
    check_aligned(rp, "dk", p->dk, p->dk_batch_stride, p->dk_head_stride, p->dk_row_stride);
    check_aligned(rp, "dv", p->dv, p->dv_batch_stride, p->dv_head_stride, p->dv_row_stride);
    const fc_kernel k = bwd_pick(p, c.dev);
    if (kernel) *kernel = k;
    if (dev) *dev = c.dev;
    check_dv_kernel(rp, p->Dv, p->D, k, "backward", "pad v, o and dout to D and cut dv's extra columns");
    bwd_device_reasons(rp, k, p->D, c.dev);
    if ((int64_t)p->B * p->Hkv * ((p->Sk + FC_BWD_KEYS_PER_CTA - 1) / FC_BWD_KEYS_PER_CTA) > FC_GRID_X_MAX)
        fail(rp, FC_ERR_INVALID_SHAPE, "shape: B=%d x Hkv=%d x Sk=%d needs more than 2^31-1 thread blocks; "
             "split the batch", p->B, p->Hkv, p->Sk);
    if (p->B > 0 && p->Hq > 0 && p->Sq == 0 && (int64_t)p->B * p->Hkv * p->Sk / FC_COMBINE_ROWS >= FC_GRID_X_MAX)
        fail(rp, FC_ERR_INVALID_SHAPE, "shape: B=%d x Hkv=%d x Sk=%d zero rows of dk and dv need more than 2^31-1 "
             "thread blocks; split the batch", p->B, p->Hkv, p->Sk);
    /* (the workspace is not checked for a refused call: its size query answers 0 there) */
    const size_t need = bwd_needs_workspace(p) ? bwd_workspace_bytes(p) : 0;
    if (check_workspace && need > 0 && rp->first == FC_OK) {
        if (!p->workspace || p->workspace_bytes < need)
            fail(rp, FC_ERR_WORKSPACE, "workspace: %zu bytes given, %zu needed for the dQ accumulator; allocate "
                 "fc_attn_bwd_workspace_size(params) bytes", p->workspace ? p->workspace_bytes : (size_t)0, need);
        else if ((uintptr_t)p->workspace % FC_WORKSPACE_ALIGN != 0)
            fail(rp, FC_ERR_WORKSPACE, "workspace: pointer is not 16-byte aligned");
    }
    return rp->first;
}

/* bwd_check_impl with every reason written to why (the public check functions). */
static fc_status bwd_check_why(const fc_attn_bwd_params* p, char* why, size_t why_len, int check_workspace) {
    fc_reasons r = {FC_OK, why, why_len, 0};
    if (why && why_len) why[0] = '\0';
    return bwd_check_impl(p, &r, check_workspace, NULL, NULL);
}

fc_status fc_attn_bwd_check(const fc_attn_bwd_params* p, char* why, size_t why_len) {
    return bwd_check_why(p, why, why_len, 1);
}

fc_status fc_attn_bwd_check_args(const fc_attn_bwd_params* p, char* why, size_t why_len) {
    return bwd_check_why(p, why, why_len, 0);
}

fc_status fc_attn_bwd_device_check(int D, fc_kernel kernel, char* why, size_t why_len) {
    fc_reasons r = {FC_OK, why, why_len, 0};
    if (why && why_len) why[0] = '\0';
    if (kernel != FC_KERNEL_AUTO && kernel != FC_KERNEL_SM80 && kernel != FC_KERNEL_SM90) {
        fail(&r, FC_ERR_INVALID_ARGUMENT, "kernel: expected auto, sm80 or sm90 (a GPU backward kernel), got %d",
             (int)kernel);
        return r.first;
    }
    if (D < 1 || D > FC_BWD_MAX_GPU_HEAD_DIM) {
        fail(&r, FC_ERR_UNSUPPORTED_HEAD_DIM, "D: expected a head dim from 1 to %d, got %d",
             FC_BWD_MAX_GPU_HEAD_DIM, D);
        return r.first;
    }
    const fc_device_info* dev = current_device();
    if (!dev) {
        fail(&r, FC_ERR_CUDA, "device: the current CUDA device could not be queried");
        return r.first;
    }
    fc_attn_bwd_params p;
    memset(&p, 0, sizeof p);
    p.D = D;
    p.kernel = kernel;
    const fc_kernel k = bwd_pick(&p, dev);
    /* a device or kernel the forward refuses is the forward check's to report */
    if (device_reason(FC_KERNEL_SM80, dev) || device_reason(k, dev))
        return FC_OK;
    bwd_device_reasons(&r, k, D, dev);
    return r.first;
}

size_t fc_attn_bwd_workspace_size(const fc_attn_bwd_params* p) {
    fc_reasons r = {FC_OK, NULL, 0, 0};
    if (bwd_check_impl(p, &r, 0, NULL, NULL) != FC_OK || p->kernel == FC_KERNEL_CPU || !bwd_needs_workspace(p)) return 0;
    return bwd_workspace_bytes(p);
}

/* Writes zero rows into t: B batches x H heads x S rows of D elements (the
 * combine kernel of zero splits, which writes O = 0 and reads nothing). */
static fc_status zero_rows(void* t, int64_t sb, int64_t sh, int64_t sr, int B, int H, int S, int D, fc_dtype dt,
                           fc_stream_t stream) {
    fc_attn_params z;
    memset(&z, 0, sizeof z);
    z.o = t; z.o_batch_stride = sb; z.o_head_stride = sh; z.o_row_stride = sr;
    z.B = B; z.Hq = H; z.Hkv = H; z.Sq = S; z.D = D; z.dtype = dt;
    const fc_split_plan none = {0};
    return fc_split_combine(&z, &none, stream);
}

/* Whether the portable backward at D <= 128 takes its 128-key CTAs of 32-key warps (attn_bwd_sm80_tile.cuh's
 * tile table), given their shared memory per CTA: where the GPU has it (81 KB at D = 64: every sm80+
 * GPU, unmeasured on sm86/89; 161 KB at D = 128: sm80, sm90) and the grid is large enough. On an H100
 * (132 SMs; harness, perf notes session 69) at H = 8, S = 1k: 64 CTAs ran 19-26 % slower with them,
 * 128-256 CTAs 0-26 % faster except causal calls at D = 64 (1-12 % slower: the longest CTA's walk, twice
 * the 64-key one's, sets the time; still at 384 CTAs, 3-9 % faster at 512 and 1024), and the standard
 * grid's 2048-4096 CTAs 1.5-36 % faster. The thresholds sit between those points. */
static int sm80_bwd_wide(const fc_attn_bwd_params* p, const fc_device_info* dev, size_t smem) {
    const int64_t ctas = (int64_t)p->B * p->Hkv * ((p->Sk + FC_SM80_BWD_WIDE_KEYS - 1) / FC_SM80_BWD_WIDE_KEYS);
    if ((size_t)dev->smem_optin < smem) return 0;
    if (p->causal != FC_CAUSAL_NONE && p->D <= 64)
        return ctas >= (int64_t)FC_SM80_BWD_WIDE_CAUSAL_D64_PER_SM * dev->sm_count;
    return ctas * 100 >= (int64_t)FC_SM80_BWD_WIDE_MIN_FILL_PCT * dev->sm_count;
}

fc_status fc_attn_bwd(const fc_attn_bwd_params* p, fc_stream_t stream) {
    fc_reasons r = {FC_OK, NULL, 0, 0};
    fc_kernel k = FC_KERNEL_SM80;
    const fc_device_info* dev = NULL;
    fc_status s = bwd_check_impl(p, &r, 1, &k, &dev);
    if (s != FC_OK) return s;
    if (p->kernel == FC_KERNEL_CPU) return fc_cpu_bwd(p);
    if (p->B == 0 || p->Hq == 0) return FC_OK;
    /* one side empty: the other side's gradients are zero (no row sees a key) */
    if (p->Sq == 0 || p->Sk == 0) {
        if (p->Sq > 0)
            return zero_rows(p->dq, p->dq_batch_stride, p->dq_head_stride, p->dq_row_stride, p->B, p->Hq, p->Sq,
                             p->D, p->dtype, stream);
        if (p->Sk == 0) return FC_OK;
        s = zero_rows(p->dk, p->dk_batch_stride, p->dk_head_stride, p->dk_row_stride, p->B, p->Hkv, p->Sk, p->D,
                      p->dtype, stream);
        if (s != FC_OK) return s;
        return zero_rows(p->dv, p->dv_batch_stride, p->dv_head_stride, p->dv_row_stride, p->B, p->Hkv, p->Sk,
                         FC_DV(*p), p->dtype, stream);
    }
#ifdef FC_HAVE_SM90
    if (k == FC_KERNEL_SM90)  /* dev: the check's device, set once it passed */
        return p->D <= 64 ? fc_sm90_bwd_d64(p, dev->sm_count, stream)
             : p->D <= 128 ? fc_sm90_bwd_d128(p, dev->sm_count, stream)
                           : fc_sm90_bwd_d256(p, dev->sm_count, stream);
#endif
    if (p->D <= 64)
        return sm80_bwd_wide(p, dev, fc_sm80_bwd_smem_wide_d64()) ? fc_sm80_bwd_wide_d64(p, stream)
                                                                   : fc_sm80_bwd_d64(p, stream);
    if (p->D <= 128)
        return sm80_bwd_wide(p, dev, fc_sm80_bwd_smem_wide_d128()) ? fc_sm80_bwd_wide_d128(p, stream)
                                                                    : fc_sm80_bwd_d128(p, stream);
    return fc_sm80_bwd_d256(p, stream);
}
