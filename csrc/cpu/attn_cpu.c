/* attn_cpu.c -- the C reference path: attention forward on host memory.
 *
 * Same semantics as the GPU kernels (fc_attn_params, both causal alignments, sliding windows,
 * GQA, strides, LSE, fully masked rows -> O = 0 and LSE = -inf, a NaN among
 * a row's visible scores -> that row's O and LSE NaN) for fp16/bf16/fp32
 * inputs, and for fp64 ones (the CPU's alone), with the same online softmax: a
 * block of QB query rows streams over KC-key chunks. q, K and V are held in
 * fp64 (each input's value exactly); the dot products, the softmax (max,
 * exponentials, sums) and the O accumulator are fp64, so the reference's own
 * rounding stays far below any kernel's and SDPA's (with sequential fp32 sums
 * over D = 256 terms it did not, by 25 % in one fp32 case). For fp16/bf16/fp32
 * inputs a dot product or score past the fp32 range becomes +-inf, as in the
 * kernels, at the fp32 scale; fp64 calls keep fp64's range and take scale64,
 * and write the LSE to lse64. An attention mask (fc_attn_params' mask, so far
 * this path's alone) applies on top of the causal mode and window: a bool
 * mask's 0 hides a key as the causal mask does, an additive one's value is
 * added to the score. Each thread mallocs one scratch (QB + 2 KC rows of D
 * doubles for q, K and V, QB for the O accumulator: 192 KiB at D = 256) for its blocks' rows and chunks, so
 * the stack use is small whatever the thread's stack size; a failed malloc
 * returns FC_ERR_HOST_MEMORY. Parallel over (batch, head, row block) with
 * OpenMP when built with it. Used by flashcore.attention for CPU tensors and
 * by the standalone harness as the reference for the GPU kernels.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../flashcore.h"
#include "../kernels.h"

#define QB 16  /* query rows per block */
#define KC 32  /* keys per chunk */
#define SCRATCH_BYTES_PER_D ((QB + 2 * KC) * sizeof(double) + QB * sizeof(double))  /* q, K, V chunks; acc */

/* ---- element conversion (round to nearest even on the way out) ---- */

static float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else {  /* subnormal: normalize */
            exp = 127 - 15 + 1;
            while (!(man & 0x400u)) { man <<= 1; --exp; }
            bits = sign | (exp << 23) | ((man & 0x3ffu) << 13);
        }
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static uint16_t float_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return sign | (ax > 0x7f800000u ? 0x7e00u : 0x7c00u); /* NaN / Inf */
    if (ax >= 0x477ff000u) return sign | 0x7c00u;                                /* rounds to Inf */
    if (ax < 0x38800000u) {  /* subnormal or zero in half: scale to integer units of 2^-24 */
        float af;
        memcpy(&af, &ax, 4);
        return sign | (uint16_t)nearbyintf(af * 16777216.0f);
    }
    const uint32_t rounded = ax + 0xfffu + ((ax >> 13) & 1u);
    return sign | (uint16_t)((rounded - ((127u - 15u) << 23)) >> 13);
}

static float bf16_to_float(uint16_t h) {
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static uint16_t float_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* Converts n elements starting at src (element offset off) to fp64 (exactly). */
static void load_row(double* dst, const void* base, int64_t off, int n, fc_dtype dt) {
    if (dt == FC_DTYPE_FP64) {
        memcpy(dst, (const double*)base + off, (size_t)n * sizeof(double));
    } else if (dt == FC_DTYPE_FP32) {
        const float* s = (const float*)base + off;
        for (int i = 0; i < n; ++i) dst[i] = s[i];
    } else if (dt == FC_DTYPE_FP16) {
        const uint16_t* s = (const uint16_t*)base + off;
        for (int i = 0; i < n; ++i) dst[i] = half_to_float(s[i]);
    } else {
        const uint16_t* s = (const uint16_t*)base + off;
        for (int i = 0; i < n; ++i) dst[i] = bf16_to_float(s[i]);
    }
}

/* Stores n fp64 values in dt: fp64 as they are; the others rounded to fp32 first, then (fp16, bf16)
 * to nearest even. */
static void store_row(void* base, int64_t off, const double* src, int n, fc_dtype dt) {
    if (dt == FC_DTYPE_FP64) {
        memcpy((double*)base + off, src, (size_t)n * sizeof(double));
    } else if (dt == FC_DTYPE_FP32) {
        float* d = (float*)base + off;
        for (int i = 0; i < n; ++i) d[i] = (float)src[i];
    } else {
        uint16_t* d = (uint16_t*)base + off;
        for (int i = 0; i < n; ++i)
            d[i] = dt == FC_DTYPE_FP16 ? float_to_half((float)src[i]) : float_to_bf16((float)src[i]);
    }
}

/* bytes per element of dt */
static size_t elem_bytes(fc_dtype dt) {
    return dt == FC_DTYPE_FP64 ? 8 : dt == FC_DTYPE_FP32 ? 4 : 2;
}

/* x, or +-inf where x is past the fp32 range (as an fp32 result overflows) */
static double fp32_range(double x) { return fabs(x) > FLT_MAX ? copysign(INFINITY, x) : x; }

/* q . k over D, summed in fp64 */
static double dot_d(const double* a, const double* b, int D) {
    double s = 0.;
#ifdef _OPENMP
#pragma omp simd reduction(+ : s) /* lets the compiler keep partial sums in SIMD lanes */
#endif
    for (int d = 0; d < D; ++d) s += a[d] * b[d];
    return s;
}

/* How one (batch, head)'s scores are formed: the scale, and the attention mask's rows (fc_attn_params'
 * mask), if any. */
typedef struct {
    fc_dtype dtype;      /* the call's dtype */
    float scale;         /* fp16/bf16/fp32 calls: the fp32 scale */
    double scale64;      /* fp64 calls: the fp64 scale */
    const void* mask;    /* the mask's element (b, h, 0, 0), or NULL: no mask */
    int64_t row_stride;  /* the mask's elements between rows */
    fc_mask_kind kind;   /* FC_MASK_BOOL (uint8), FC_MASK_ADD or FC_MASK_ADD_FP32 */
    fc_dtype elem;       /* an additive mask's element type: the call's dtype, or fp32 */
} scorer;

static scorer scorer_make(fc_dtype dt, float scale, double scale64, const void* mask, fc_mask_kind kind,
                          int64_t bs, int64_t hs, int64_t rs, int b, int h) {
    scorer c = {dt, scale, scale64, NULL, rs, kind, kind == FC_MASK_ADD_FP32 ? FC_DTYPE_FP32 : dt};
    if (kind == FC_MASK_NONE || !mask) return c;
    const size_t bytes = kind == FC_MASK_BOOL ? 1 : elem_bytes(c.elem);  /* (uint8, or the elements' type) */
    c.mask = (const char*)mask + ((int64_t)b * bs + (int64_t)h * hs) * (int64_t)bytes;
    return c;
}
/* (p: fc_attn_params or fc_attn_bwd_params, whose dtype, scale and mask fields are the same) */
#define SCORER(p, b, h) scorer_make((p)->dtype, (p)->scale, (p)->scale64, (p)->mask, (p)->mask_kind, \
                                    (p)->mask_batch_stride, (p)->mask_head_stride, (p)->mask_row_stride, b, h)
/* the call's scale as the CPU path applies it: scale64 for fp64 calls, the fp32 scale otherwise */
#define SCALE_OF(p) ((p)->dtype == FC_DTYPE_FP64 ? (p)->scale64 : (double)(p)->scale)

/* whether the mask hides key j from query i (a bool mask's 0) */
static int mask_hides(const scorer* c, int64_t i, int j) {
    return c->mask && c->kind == FC_MASK_BOOL && ((const uint8_t*)c->mask)[i * c->row_stride + j] == 0;
}

/* The score of query i and key j from their dot product, with an additive mask's term added:
 * fp16/bf16/fp32 calls as the kernels form it, at the fp32 scale with fp32's overflow (+-inf past its
 * range); fp64 calls at scale64 in fp64. */
static double score(const scorer* c, int64_t i, int j, double dot) {
    const int fp64 = c->dtype == FC_DTYPE_FP64;
    const double s = fp64 ? dot * c->scale64 : fp32_range(fp32_range(dot) * c->scale);
    if (!c->mask || c->kind == FC_MASK_BOOL) return s;
    double t;
    load_row(&t, c->mask, i * c->row_stride + j, 1, c->elem);
    return fp64 ? s + t : fp32_range(s + t);
}

/* whether key j is visible to query i (kernels.h's band: causal mode and window) */
static int visible(fc_band band, int i, int j) {
    return (!band.has_hi || (int64_t)j <= (int64_t)i + band.hi) && (!band.has_lo || (int64_t)j >= (int64_t)i + band.lo);
}

/* Start of the keys rows r0 .. see (a window's lower bound for row r0): keys
 * before it, and past kernels.h's fc_band_key_end, are never loaded. */
static int key_begin_of(fc_band band, int Sk, int r0) {
    if (!band.has_lo) return 0;
    const int64_t first = (int64_t)r0 + band.lo;
    return first < 0 ? 0 : (first < Sk ? (int)first : Sk);
}

/* Keys c0 .. c0 + nk - 1 of one KV head (element offsets ko, vo) into kc, vc as fp64 rows of D
 * (v's first Dv columns of each row; Dv <= D). */
static void load_kv_chunk(double* kc, double* vc, const void* k, int64_t ko, int64_t k_row_stride, const void* v,
                          int64_t vo, int64_t v_row_stride, int c0, int nk, int D, int Dv, fc_dtype dt) {
    for (int j = 0; j < nk; ++j) {
        load_row(kc + j * D, k, ko + (int64_t)(c0 + j) * k_row_stride, D, dt);
        load_row(vc + j * D, v, vo + (int64_t)(c0 + j) * v_row_stride, Dv, dt);
    }
}

/* ---- one block of up to QB query rows of one (batch, head) ---- */

/* scratch: SCRATCH_BYTES_PER_D x D bytes from malloc, this thread's own */
static void attn_block(const fc_attn_params* p, int b, int h, int r0, void* scratch) {
    const int D = p->D, Dv = FC_DV(*p), hk = h / (p->Hq / p->Hkv);  /* (Dv <= D: rows keep D's stride) */
    const int rows = p->Sq - r0 < QB ? p->Sq - r0 : QB;
    const fc_band band = FC_BAND(*p);
    const int64_t qo = (int64_t)b * p->q_batch_stride + (int64_t)h * p->q_head_stride;
    const int64_t ko = (int64_t)b * p->k_batch_stride + (int64_t)hk * p->k_head_stride;
    const int64_t vo = (int64_t)b * p->v_batch_stride + (int64_t)hk * p->v_head_stride;
    const int64_t oo = (int64_t)b * p->o_batch_stride + (int64_t)h * p->o_head_stride;

    double* acc = (double*)scratch; /* (QB, D): row r at acc + r * D */
    double* q = acc + QB * D;       /* (QB, D); at the end, row r holds O's row */
    double* kc = q + QB * D;        /* (KC, D) */
    double* vc = kc + KC * D;       /* (KC, D) */
    double m[QB], l[QB], s[KC];        /* running max and sum per row; one chunk's scores */
    const scorer sc = SCORER(p, b, h);
    for (int r = 0; r < rows; ++r) {
        load_row(q + r * D, p->q, qo + (int64_t)(r0 + r) * p->q_row_stride, D, p->dtype);
        memset(acc + r * D, 0, (size_t)Dv * sizeof(double));
        m[r] = -INFINITY;
        l[r] = 0.;
    }
    const int key_end = fc_band_key_end(band, p->Sk, r0, rows);
    for (int c0 = key_begin_of(band, p->Sk, r0); c0 < key_end; c0 += KC) {
        const int nk = key_end - c0 < KC ? key_end - c0 : KC;
        load_kv_chunk(kc, vc, p->k, ko, p->k_row_stride, p->v, vo, p->v_row_stride, c0, nk, D, Dv, p->dtype);
        for (int r = 0; r < rows; ++r) {
            const int i = r0 + r;
            const double* qr = q + r * D;
            double* ar = acc + r * D;
            double mx = -INFINITY;
            for (int j = 0; j < nk; ++j) {
                const int key = c0 + j;
                if (!visible(band, i, key) || mask_hides(&sc, i, key)) { s[j] = -INFINITY; continue; }
                s[j] = score(&sc, i, key, dot_d(qr, kc + j * D, D));
                if (s[j] > mx || isnan(s[j])) mx = s[j];  /* a NaN score sticks: the row's result is NaN */
            }
            if (mx == -INFINITY) continue;  /* no visible key in this chunk (or every score -inf) */
            const double m_new = mx > m[r] || isnan(mx) ? mx : m[r];
            const double corr = exp(m[r] - m_new);  /* exp(-inf) = 0 on the first visible chunk */
            l[r] *= corr;
            for (int d = 0; d < Dv; ++d) ar[d] *= corr;
            for (int j = 0; j < nk; ++j) {
                if (s[j] == -INFINITY) continue;
                const double pj = exp(s[j] - m_new);
                l[r] += pj;
                const double* vj = vc + j * D;
                for (int d = 0; d < Dv; ++d) ar[d] += pj * vj[d];
            }
            m[r] = m_new;
        }
    }
    for (int r = 0; r < rows; ++r) {
        const int empty = l[r] == 0.;  /* no visible key (a NaN sum is not empty: it stays NaN) */
        const double inv = empty ? 0. : 1. / l[r];
        const double* ar = acc + r * D;
        double* orow = q + r * D;
        for (int d = 0; d < Dv; ++d) orow[d] = ar[d] * inv;
        store_row(p->o, oo + (int64_t)(r0 + r) * p->o_row_stride, orow, Dv, p->dtype);
        const double lse = empty ? -INFINITY : m[r] + log(l[r]);
        const int64_t li = ((int64_t)b * p->Hq + h) * p->Sq + r0 + r;
        if (p->lse) p->lse[li] = (float)lse;
        if (p->lse64) p->lse64[li] = lse;
    }
}

/* Per-thread scratch inside a parallel region: NULL, with *failed set, when
 * malloc fails (the thread then computes no block and the call reports it). */
static void* thread_scratch(size_t bytes, int* failed) {
    void* scratch = malloc(bytes);
    if (!scratch) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
        *failed = 1;
    }
    return scratch;
}

fc_status fc_cpu_fwd(const fc_attn_params* p) {
    const int nblk = (p->Sq + QB - 1) / QB;
    const int64_t total = (int64_t)p->B * p->Hq * nblk;
    const size_t scratch_bytes = SCRATCH_BYTES_PER_D * (size_t)p->D;
    int failed = 0;  /* set by any thread whose malloc failed; its blocks are not computed */
#ifdef _OPENMP
#pragma omp parallel
#endif
    {
        void* scratch = thread_scratch(scratch_bytes, &failed);
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t t = 0; t < total; ++t) {
            const int blk = (int)(t % nblk), h = (int)((t / nblk) % p->Hq), b = (int)(t / ((int64_t)nblk * p->Hq));
            if (scratch) attn_block(p, b, h, blk * QB, scratch);
        }
        free(scratch);
    }
    return failed ? FC_ERR_HOST_MEMORY : FC_OK;
}

/* ---- backward ----
 *
 * Two passes, each parallel over blocks whose outputs no other block writes:
 *   rows (b, h, QB query rows): one stream over the visible keys gives, per
 *     row, Delta_i = sum_j P_ij dP_ij (exact: dO_i . O_i with the unrounded O)
 *     and dQ_i = scale * (sum_j P_ij dP_ij k_j - (Delta_i - dlse_i) sum_j P_ij k_j),
 *     fp64; Delta - dlse goes to a heap array for the second pass.
 *   keys (b, KV head, KC keys): a stream over the rows of the group's query
 *     heads that see any of the block's keys gives dV_j = sum_i P_ij dO_i and
 *     dK_j = scale * sum_i P_ij (dP_ij - Delta_i + dlse_i) q_i, fp64.
 * P_ij = exp(s_ij - lse_i) with the forward's LSE; a row with LSE = -inf sees
 * no key (dQ = 0, adds nothing). The scores are the forward's (fp32_range). */

/* scratch of the rows pass, per D: q, dO (QB rows) and K, V (KC keys); two sums per row; all fp64 */
#define BWD_ROWS_SCRATCH_PER_D ((2 * QB + 2 * KC) * sizeof(double) + 2 * QB * sizeof(double))

/* The forward's LSE of row i, and dlse's (0 where there is none), in fp64 */
static double lse_of(const fc_attn_bwd_params* p, int64_t i) {
    return p->dtype == FC_DTYPE_FP64 ? p->lse64[i] : p->lse[i];
}
static double dlse_of(const fc_attn_bwd_params* p, int64_t i) {
    return p->dtype == FC_DTYPE_FP64 ? (p->dlse64 ? p->dlse64[i] : 0.) : (p->dlse ? p->dlse[i] : 0.);
}

static void bwd_rows_block(const fc_attn_bwd_params* p, int b, int h, int r0, double* delta, void* scratch) {
    const int D = p->D, Dv = FC_DV(*p), hk = h / (p->Hq / p->Hkv);  /* (Dv <= D: rows keep D's stride) */
    const int rows = p->Sq - r0 < QB ? p->Sq - r0 : QB;
    const fc_band band = FC_BAND(*p);
    const int64_t qo = (int64_t)b * p->q_batch_stride + (int64_t)h * p->q_head_stride;
    const int64_t go = (int64_t)b * p->do_batch_stride + (int64_t)h * p->do_head_stride;
    const int64_t ko = (int64_t)b * p->k_batch_stride + (int64_t)hk * p->k_head_stride;
    const int64_t vo = (int64_t)b * p->v_batch_stride + (int64_t)hk * p->v_head_stride;
    const int64_t dqo = (int64_t)b * p->dq_batch_stride + (int64_t)h * p->dq_head_stride;
    const int64_t row0 = ((int64_t)b * p->Hq + h) * p->Sq + r0; /* index of row r0 in lse and delta */
    const double scale = SCALE_OF(p);
    const scorer sc = SCORER(p, b, h);

    double* pdk = (double*)scratch; /* (QB, D): sum_j P_ij dP_ij k_j */
    double* pk = pdk + QB * D;      /* (QB, D): sum_j P_ij k_j */
    double* q = pk + QB * D;
    double* g = q + QB * D;         /* dO rows (Dv columns) */
    double* kc = g + QB * D;
    double* vc = kc + KC * D;
    double lse[QB], dsum[QB];
    for (int r = 0; r < rows; ++r) {
        load_row(q + r * D, p->q, qo + (int64_t)(r0 + r) * p->q_row_stride, D, p->dtype);
        load_row(g + r * D, p->dout, go + (int64_t)(r0 + r) * p->do_row_stride, Dv, p->dtype);
        memset(pdk + r * D, 0, (size_t)D * sizeof(double));
        memset(pk + r * D, 0, (size_t)D * sizeof(double));
        lse[r] = lse_of(p, row0 + r);
        dsum[r] = 0.;
    }
    const int key_end = fc_band_key_end(band, p->Sk, r0, rows);
    for (int c0 = key_begin_of(band, p->Sk, r0); c0 < key_end; c0 += KC) {
        const int nk = key_end - c0 < KC ? key_end - c0 : KC;
        load_kv_chunk(kc, vc, p->k, ko, p->k_row_stride, p->v, vo, p->v_row_stride, c0, nk, D, Dv, p->dtype);
        for (int r = 0; r < rows; ++r) {
            if (lse[r] == -INFINITY) continue; /* the row sees no key */
            for (int j = 0; j < nk; ++j) {
                if (!visible(band, r0 + r, c0 + j) || mask_hides(&sc, r0 + r, c0 + j)) continue;
                const double* kj = kc + j * D;
                const double s = score(&sc, r0 + r, c0 + j, dot_d(q + r * D, kj, D));
                const double pij = exp(s - lse[r]);
                const double pdp = pij * dot_d(g + r * D, vc + j * D, Dv);
                dsum[r] += pdp;
                for (int d = 0; d < D; ++d) {
                    pdk[r * D + d] += pdp * kj[d];
                    pk[r * D + d] += pij * kj[d];
                }
            }
        }
    }
    for (int r = 0; r < rows; ++r) {
        if (lse[r] != -INFINITY) dsum[r] -= dlse_of(p, row0 + r); /* dS = P (dP - Delta + dlse) */
        double* dq = q + r * D; /* (q's row is no longer needed) */
        for (int d = 0; d < D; ++d) dq[d] = scale * (pdk[r * D + d] - dsum[r] * pk[r * D + d]);
        store_row(p->dq, dqo + (int64_t)(r0 + r) * p->dq_row_stride, dq, D, p->dtype);
        delta[row0 + r] = dsum[r];
    }
}

/* scratch of the keys pass, per D: K, V (KC keys) and q, dO (one row); dK, dV sums (KC keys); all fp64 */
#define BWD_KEYS_SCRATCH_PER_D ((2 * KC + 2) * sizeof(double) + 2 * KC * sizeof(double))

static void bwd_keys_block(const fc_attn_bwd_params* p, int b, int hk, int c0, const double* delta, void* scratch) {
    const int D = p->D, Dv = FC_DV(*p), G = p->Hq / p->Hkv;  /* (v, dO and dV rows: Dv columns at D's stride) */
    const int nk = p->Sk - c0 < KC ? p->Sk - c0 : KC;
    const fc_band band = FC_BAND(*p);
    const int64_t ko = (int64_t)b * p->k_batch_stride + (int64_t)hk * p->k_head_stride;
    const int64_t vo = (int64_t)b * p->v_batch_stride + (int64_t)hk * p->v_head_stride;
    const double scale = SCALE_OF(p);

    double* dk = (double*)scratch; /* (KC, D) */
    double* dv = dk + KC * D;      /* (KC, D) */
    double* kc = dv + KC * D;
    double* vc = kc + KC * D;
    double* q = vc + KC * D; /* one query row */
    double* g = q + D;       /* its dO row */
    load_kv_chunk(kc, vc, p->k, ko, p->k_row_stride, p->v, vo, p->v_row_stride, c0, nk, D, Dv, p->dtype);
    memset(dk, 0, (size_t)2 * KC * D * sizeof(double));
    /* rows that see key c0 or later (i + hi >= c0), up to the last that sees key c0 + nk - 1 or
     * earlier (i + lo <= c0 + nk - 1) */
    int64_t first = band.has_hi ? (int64_t)c0 - band.hi : 0, end = p->Sq;
    if (first < 0) first = 0;
    if (band.has_lo && (int64_t)c0 + nk - band.lo < end) end = (int64_t)c0 + nk - band.lo;
    for (int h = hk * G; h < (hk + 1) * G; ++h) {
        const scorer sc = SCORER(p, b, h);
        const int64_t qo = (int64_t)b * p->q_batch_stride + (int64_t)h * p->q_head_stride;
        const int64_t go = (int64_t)b * p->do_batch_stride + (int64_t)h * p->do_head_stride;
        const int64_t row0 = ((int64_t)b * p->Hq + h) * p->Sq;
        for (int64_t i = first; i < end; ++i) {
            const double lse = lse_of(p, row0 + i);
            if (lse == -INFINITY) continue;
            load_row(q, p->q, qo + i * p->q_row_stride, D, p->dtype);
            load_row(g, p->dout, go + i * p->do_row_stride, Dv, p->dtype);
            for (int j = 0; j < nk; ++j) {
                if (!visible(band, (int)i, c0 + j) || mask_hides(&sc, i, c0 + j)) continue;
                const double s = score(&sc, i, c0 + j, dot_d(q, kc + j * D, D));
                const double pij = exp(s - lse);
                const double ds = pij * (dot_d(g, vc + j * D, Dv) - delta[row0 + i]); /* delta: Delta - dlse */
                for (int d = 0; d < Dv; ++d) dv[j * D + d] += pij * g[d];
                for (int d = 0; d < D; ++d) dk[j * D + d] += ds * q[d];
            }
        }
    }
    const int64_t dko = (int64_t)b * p->dk_batch_stride + (int64_t)hk * p->dk_head_stride;
    const int64_t dvo = (int64_t)b * p->dv_batch_stride + (int64_t)hk * p->dv_head_stride;
    for (int j = 0; j < nk; ++j) {
        double* row = kc + j * D; /* (the key's row is no longer needed) */
        for (int d = 0; d < D; ++d) row[d] = scale * dk[j * D + d];
        store_row(p->dk, dko + (int64_t)(c0 + j) * p->dk_row_stride, row, D, p->dtype);
        store_row(p->dv, dvo + (int64_t)(c0 + j) * p->dv_row_stride, dv + j * D, Dv, p->dtype);
    }
}

fc_status fc_cpu_bwd(const fc_attn_bwd_params* p) {
    const int nrow = (p->Sq + QB - 1) / QB, nkey = (p->Sk + KC - 1) / KC;
    const int64_t row_blocks = (int64_t)p->B * p->Hq * nrow, key_blocks = (int64_t)p->B * p->Hkv * nkey;
    const size_t rows_bytes = BWD_ROWS_SCRATCH_PER_D * (size_t)p->D, keys_bytes = BWD_KEYS_SCRATCH_PER_D * (size_t)p->D;
    double* delta = (double*)malloc(((size_t)p->B * p->Hq * p->Sq + 1) * sizeof(double)); /* (B, Hq, Sq) */
    if (!delta) return FC_ERR_HOST_MEMORY;
    int failed = 0; /* set by any thread whose malloc failed; the call then returns FC_ERR_HOST_MEMORY */
#ifdef _OPENMP
#pragma omp parallel
#endif
    {
        void* scratch = thread_scratch(rows_bytes > keys_bytes ? rows_bytes : keys_bytes, &failed);
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t t = 0; t < row_blocks; ++t) {
            const int blk = (int)(t % nrow), h = (int)((t / nrow) % p->Hq), b = (int)(t / ((int64_t)nrow * p->Hq));
            if (scratch) bwd_rows_block(p, b, h, blk * QB, delta, scratch);
        }
        /* (the loop's implied barrier: every Delta is written before the keys pass reads it) */
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t t = 0; t < key_blocks; ++t) {
            const int blk = (int)(t % nkey), hk = (int)((t / nkey) % p->Hkv), b = (int)(t / ((int64_t)nkey * p->Hkv));
            if (scratch && !failed) bwd_keys_block(p, b, hk, blk * KC, delta, scratch);
        }
        free(scratch);
    }
    free(delta);
    return failed ? FC_ERR_HOST_MEMORY : FC_OK;
}
