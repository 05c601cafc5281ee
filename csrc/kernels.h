/* kernels.h -- internal entry points behind fc_attn_fwd (not public API).
 * Each GPU entry point launches on `stream` and returns FC_OK or FC_ERR_CUDA;
 * dispatch.c has already validated the params. */
#ifndef FLASHCORE_KERNELS_H
#define FLASHCORE_KERNELS_H

#include <limits.h>

#include "flashcore.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The keys a query row sees, from the causal mode and the sliding window
 * (fc_attn_params): key j is visible to query i iff j < Sk, j <= i + hi
 * (when has_hi) and j >= i + lo (when has_lo). Without a window, has_hi is
 * `causal != NONE` and hi the causal diagonal, as the kernels always read
 * them. A window's hi is capped at Sk (every key visible from row 0 on) and
 * its lo dropped where no row's bound reaches past key 0, so i + hi and
 * i + lo stay within int32 for Sq, Sk <= FC_MAX_SEQ_LEN. Every kernel and
 * the CPU path take their masks and block ranges from here. */
typedef struct {
    int has_hi, hi;  /* upper bound: j <= i + hi */
    int has_lo, lo;  /* lower bound: j >= i + lo */
} fc_band;
#ifdef __CUDACC__
#define FC_BAND_FN static inline __host__ __device__
#else
#define FC_BAND_FN static inline
#endif
FC_BAND_FN fc_band fc_band_make(fc_causal causal, int window, int left, int right, int Sq, int Sk) {
    fc_band b;
    const long long diag = causal == FC_CAUSAL_BOTTOM_RIGHT ? (long long)Sk - Sq : 0;
    b.has_hi = causal != FC_CAUSAL_NONE;
    b.hi = (int)diag;
    b.has_lo = 0;
    b.lo = 0;
    if (window) {
        const long long hi = right < 0 ? (long long)Sk : diag + right, lo = diag - left;
        b.has_hi = hi < Sk;
        b.hi = (int)(hi < Sk ? hi : Sk);
        b.has_lo = left >= 0 && Sq - 1 + lo > 0;
        b.lo = b.has_lo ? (int)lo : 0;
    }
    return b;
}
/* The key block (of bc keys) of row0's first visible key, where the blocks
 * that rows row0 .. see start: 0 without a left edge (or one at or before key
 * 0), and at most n (the blocks there are). */
FC_BAND_FN int fc_band_first_block(fc_band band, int row0, int bc, int n) {
    return band.has_lo && row0 + band.lo > 0 ? ((row0 + band.lo) / bc < n ? (row0 + band.lo) / bc : n) : 0;
}
/* One past the last key rows r0 .. r0 + rows - 1 see (0 .. Sk; in 64 bits,
 * as r0 + rows + hi may pass INT_MAX at FC_MAX_SEQ_LEN). */
FC_BAND_FN int fc_band_key_end(fc_band band, int Sk, int r0, int rows) {
    if (!band.has_hi) return Sk;
    const long long last = (long long)r0 + rows - 1 + band.hi + 1;
    return last < 0 ? 0 : (last < Sk ? (int)last : Sk);
}
/* v's (and o's) head dim of params p (fc_attn_params or fc_attn_bwd_params, by value): Dv, or D where Dv is 0. */
#define FC_DV(p) ((p).Dv > 0 ? (p).Dv : (p).D)
/* The band of params p (fc_attn_params or fc_attn_bwd_params, by value). */
#define FC_BAND(p) fc_band_make((p).causal, (p).window, (p).window_left, (p).window_right, (p).Sq, (p).Sk)
/* Its causal mode's alone (window ignored, has_lo a constant 0): what the
 * kernel instantiations without a window read. */
#define FC_CAUSAL_BAND(p) fc_band_make((p).causal, 0, 0, 0, (p).Sq, (p).Sk)
/* Whether params p (either struct, by value) have a window that masks more
 * than their causal mode alone would. One that masks no more (no row's left
 * edge past key 0, no key after the diagonal: a 4096-key window over 4096
 * keys, say) gives the band FC_CAUSAL_BAND gives, so the Hopper kernels run
 * it as the causal call, on their instantiations that read only `causal`. */
#define FC_WINDOW_MASKS_MORE(p) ((p).window && (FC_BAND(p).has_lo || (p).window_right != 0))
/* Whether the sm90 forward runs p on its windowed instantiation (the static
 * order; two consumers, or three at D = 64 where fc_sm90_cons3_grid picks
 * them). */
static inline int fc_sm90_windowed(const fc_attn_params* p) { return FC_WINDOW_MASKS_MORE(*p); }

/* Portable mma.sync kernels, one per padded head dim (csrc/sm80/). */
fc_status fc_sm80_fwd_d64(const fc_attn_params* p, fc_stream_t stream);   /* D <= 64 */
fc_status fc_sm80_fwd_d128(const fc_attn_params* p, fc_stream_t stream);  /* 64 < D <= 128 */
fc_status fc_sm80_fwd_d256(const fc_attn_params* p, fc_stream_t stream);  /* 128 < D <= 256 */
fc_status fc_sm80_fwd_small_d64(const fc_attn_params* p, fc_stream_t stream);  /* D <= 64, BR = 64 */
size_t fc_sm80_smem_d64(void);   /* dynamic shared memory per CTA, bytes */
size_t fc_sm80_smem_d128(void);
size_t fc_sm80_smem_d256(void);

/* Backward kernels, one per padded head dim: portable mma.sync up to 256
 * (csrc/sm80/attn_bwd_sm80*.cu) and Hopper wgmma + TMA up to 256
 * (csrc/sm90/attn_bwd_sm90*.cu, sm_90a only, present with FC_HAVE_SM90). The
 * workspace (fc_attn_bwd_workspace_size) has one layout for both kernels
 * (csrc/common/bwd_rows.cuh): the fp32 dQ accumulator (B, Hq, Sq_pad, DP) in
 * 64 x 64 pieces, then Delta and LSE * log2(e) (B, Hq, Sq_pad) each, then the
 * Hopper kernel's int32 item counter (then, for a deterministic call, one
 * int32 turn counter per piece), with Sq_pad = Sq rounded up to FC_BWD_ROW_PAD
 * and DP = D padded to 64, 128 or 256. The prep kernel fills them (no memset
 * needed). */
#define FC_BWD_KEYS_PER_CTA 64 /* fewest keys per CTA of the portable main kernel (its grid: key blocks x B x Hkv;
                                  64 or 128 keys) */
#define FC_BWD_ROW_PAD 128     /* rows per head of the padded per-row vectors are a multiple of this */
#define FC_BWD_PIECE_DIM 64    /* rows and columns of a piece of the dQ accumulator */
fc_status fc_sm80_bwd_d64(const fc_attn_bwd_params* p, fc_stream_t stream);   /* D <= 64 */
fc_status fc_sm80_bwd_wide_d64(const fc_attn_bwd_params* p, fc_stream_t stream);  /* the same, 128-key CTAs */
fc_status fc_sm80_bwd_d128(const fc_attn_bwd_params* p, fc_stream_t stream);  /* 64 < D <= 128 */
fc_status fc_sm80_bwd_wide_d128(const fc_attn_bwd_params* p, fc_stream_t stream);  /* the same, 128-key CTAs */
#define FC_SM80_BWD_WIDE_KEYS 128 /* keys per CTA of the fc_sm80_bwd_wide_* kernels */
#define FC_SM80_BWD_WIDE_MIN_FILL_PCT 75     /* they run where their CTAs number this share of the SMs (%) */
#define FC_SM80_BWD_WIDE_CAUSAL_D64_PER_SM 3 /* causal calls at D <= 64 from this many CTAs per SM */
fc_status fc_sm80_bwd_d256(const fc_attn_bwd_params* p, fc_stream_t stream);  /* 128 < D <= 256 */
size_t fc_sm80_bwd_smem_d64(void);   /* dynamic shared memory per CTA of the main kernel, bytes */
size_t fc_sm80_bwd_smem_wide_d64(void);
size_t fc_sm80_bwd_smem_d128(void);
size_t fc_sm80_bwd_smem_wide_d128(void);
size_t fc_sm80_bwd_smem_d256(void);
/* num_sms sizes the Hopper main kernel's persistent grid */
fc_status fc_sm90_bwd_d64(const fc_attn_bwd_params* p, int num_sms, fc_stream_t stream);   /* D <= 64 */
fc_status fc_sm90_bwd_d128(const fc_attn_bwd_params* p, int num_sms, fc_stream_t stream);  /* 64 < D <= 128 */
fc_status fc_sm90_bwd_d256(const fc_attn_bwd_params* p, int num_sms, fc_stream_t stream);  /* 128 < D <= 256 */
size_t fc_sm90_bwd_smem_d64(void);
size_t fc_sm90_bwd_smem_d128(void);
size_t fc_sm90_bwd_smem_d256(void);

/* Hopper wgmma + TMA kernels, sm_90a only (csrc/sm90/); num_sms sizes the
 * persistent grid. Present when the build defines FC_HAVE_SM90. */
fc_status fc_sm90_fwd_d64(const fc_attn_params* p, int num_sms, fc_stream_t stream);   /* D <= 64 */
fc_status fc_sm90_fwd_d128(const fc_attn_params* p, int num_sms, fc_stream_t stream);  /* 64 < D <= 128 */
fc_status fc_sm90_fwd_d256(const fc_attn_params* p, int num_sms, fc_stream_t stream);  /* 128 < D <= 256 */
/* MLA's shapes: 128 < D <= 192 with v's head dim Dv <= 128 (fc_sm90_fwd_d192's tile, see fc_sm90_d192) */
fc_status fc_sm90_fwd_d192(const fc_attn_params* p, int num_sms, fc_stream_t stream);
static inline int fc_sm90_d192(const fc_attn_params* p) {
    return p->D > 128 && p->D <= 192 && FC_DV(*p) <= 128;
}
/* Whether an sm90 call takes its tiles from a counter in the workspace (the
 * dynamic tile order) rather than round robin: causal calls at D > 64 with
 * Sk < 2048 and more 128-row tiles than SMs, causal D = 128 calls from
 * Sk = 2048 on three consumers (fc_sm90_d128_wide), and causal D = 64 calls
 * with rows of 2048 keys or more, or whose static-order windows would not fit
 * the L2 (fc_sm90_d64_dynamic);
 * key-split mode and the other long-row kernels keep the static order. The
 * counter is 16 bytes of workspace, zeroed by the launcher before each
 * launch unless the params say it is zero already (counters_zeroed): the
 * kernel's last ticket puts it back to zero. Measured on an H100 (perf notes, sessions 22, 28, 34 and 37): causal
 * S = 512 +5-7 %, 1k +2-3 %, on three consumers 2k-4k +4-5 %, D = 64 causal
 * 8k +4 %, 4k +1 %; non-causal calls, and D = 64 ones with shorter rows whose
 * windows fit, lose with it.
 * dispatch.c sizes the workspace with this rule and the sm90 launcher
 * follows it. */
#define FC_SM90_DYN_WORKSPACE 16
#define FC_SM90_DYN_MAX_SK 2048 /* = the launcher's SM90_LONG_MIN_SK */
/* Tiles of an sm90 call with `br`-row tiles: query blocks x batch x heads. */
static inline long long fc_sm90_tiles(const fc_attn_params* p, int br) {
    return (long long)((p->Sq + br - 1) / br) * p->B * p->Hq;
}
/* Key-split mode (D <= 128): the 64-row tiles fit on the SMs in one wave. */
static inline int fc_sm90_key_split(const fc_attn_params* p, int num_sms) {
    return p->D <= 128 && fc_sm90_tiles(p, 64) <= num_sms;
}
/* Three consumer warpgroups (192-row tiles) pay from this many query rows
 * (shorter rows pad a tile further) and when the grid favours them: the
 * persistent CTAs take tiles in stripes of num_sms, so a call costs about
 * ceil(tiles / SMs) stripes of one tile's rows, and three consumers must
 * win that count at FC_SM90_CONS3_SPEEDUP rows per second over two (the gain
 * measured at D = 64 S >= 2k was 11-23 %, perf notes, session 10; 1.15 errs
 * toward two). They do not on a grid just past key-split mode (B1 H4 S4k:
 * one stripe of 128-row tiles against one of 192-row tiles on fewer SMs).
 * At D = 64 S = 512 they measured 4 % ahead of two consumers non-causal and
 * 7 % causal (session 22, with TILE_INFO); rows shorter than
 * FC_SM90_CONS3_MIN_SQ (at Sq <= 128 a whole warpgroup's rows are padding)
 * were not measured. */
#define FC_SM90_CONS3_MIN_SQ 512
#define FC_SM90_CONS3_SPEEDUP 1.15
static inline int fc_sm90_cons3_grid(const fc_attn_params* p, int num_sms) {
    if (p->Sq < FC_SM90_CONS3_MIN_SQ) return 0;
    const long long stripes2 = (fc_sm90_tiles(p, 128) + num_sms - 1) / num_sms;
    const long long stripes3 = (fc_sm90_tiles(p, 192) + num_sms - 1) / num_sms;
    return (double)(stripes3 * 192) < (double)(stripes2 * 128) * FC_SM90_CONS3_SPEEDUP;
}
/* Causal D = 128 calls from Sk = 2048 run three consumers in the dynamic order
 * (its last two causal windows merged, see sm90_last_window). Measured on an
 * H100 (perf notes, session 28): causal S2k and 4k +4-5 % over the static
 * order; the static order's CTAs ended up to 20 % apart (session 27).
 * Bottom-right calls with fewer than 2048 query rows (a chunk of queries
 * against a longer KV cache) keep two consumers: their rows see nearly all
 * the keys, and two consumers measured 1-8 % faster at Sq 512-1536 against
 * Sk 2048-16384, three 2-3.5 % faster from Sq = 2048 (session 30). */
static inline int fc_sm90_d128_wide(const fc_attn_params* p, int num_sms) {
    return p->causal != FC_CAUSAL_NONE && p->D > 64 && p->D <= 128 && p->Sk >= FC_SM90_DYN_MAX_SK &&
           (p->causal == FC_CAUSAL_TOP_LEFT || p->Sq >= FC_SM90_DYN_MAX_SK) && !fc_sm90_key_split(p, num_sms) &&
           fc_sm90_cons3_grid(p, num_sms);
}
/* The split tail of a non-causal sm90 call on D = 128 CTA pairs
 * (attn_sm90_tail.cuh): the launcher splits the last, partial stripe of tiles
 * by key ranges when it pays, and the consumers leave partials in the
 * workspace. Sized for the most a launch can use, with n = FC_SM90_TAIL_CTAS
 * CTAs (at most one per SM and one per 128-row tile): first 8n arrival
 * counters (one per consumer warp of each CTA of each tail tile), then 2n CTA
 * slots of partials, each two consumers x 128 threads x (D/2 + 4) floats at
 * the padded D = 128 (O, row maxima and sums): 18 MB on an H100. */
#define FC_SM90_TAIL_MIN_SK 4096 /* = sm90_cluster_min_sk(128): the D = 128 pairs' rows */
#define FC_SM90_TAIL_CTAS(p, num_sms) \
    ((size_t)(fc_sm90_tiles(p, 128) < (num_sms) ? fc_sm90_tiles(p, 128) : (num_sms)))
#define FC_SM90_TAIL_CTA_COUNTERS 8 /* per CTA of a tail tile: 2 consumers x 4 warps */
#define FC_SM90_TAIL_SLOT_BYTES ((size_t)2 * 128 * (128 / 2 + 4) * 4) /* a CTA's partials of one piece */
#define FC_SM90_TAIL_COUNT_BYTES(n) (((size_t)FC_SM90_TAIL_CTA_COUNTERS * (n) * 4 + 15) / 16 * 16)
static inline size_t fc_sm90_tail_workspace(const fc_attn_params* p, int num_sms) {
    if (p->causal != FC_CAUSAL_NONE || p->D <= 64 || p->D > 128 || p->Sk < FC_SM90_TAIL_MIN_SK ||
        fc_sm90_key_split(p, num_sms))
        return 0;
    const size_t n = FC_SM90_TAIL_CTAS(p, num_sms);
    return FC_SM90_TAIL_COUNT_BYTES(n) + 2 * n * FC_SM90_TAIL_SLOT_BYTES;
}
/* Heads per causal window of the sm90 tile order (its sm90_causal_window
 * without the cap, the rule and its measurements explained there):
 * 2 grid / gcd(2 grid, n_mblocks), so that a window is whole stripe pairs;
 * one stripe's heads instead where the query blocks divide the grid and the
 * window's K and V (kv_head_bytes per head) exceed FC_SM90_WINDOW_KV_BYTES;
 * at most n_bh. FC_SM90_WINDOW_CAP_BYTES: the cap, about half the L2. */
#define FC_SM90_WINDOW_KV_BYTES (16ll << 20)
#define FC_SM90_WINDOW_CAP_BYTES (24ll << 20)
#ifdef __CUDACC__
__host__ __device__
#endif
static inline int fc_sm90_window_heads(int grid, int n_mblocks, int n_bh, long long kv_head_bytes) {
    int a = 2 * grid, b = n_mblocks;
    while (b != 0) {
        const int r = a % b;
        a = b;
        b = r;
    }
    int heads = 2 * grid / a;
    if (grid % n_mblocks == 0 && heads * kv_head_bytes > FC_SM90_WINDOW_KV_BYTES) heads = grid / n_mblocks;
    return heads < n_bh ? heads : n_bh;
}
/* Causal D = 64 calls on three consumers whose windows in the static order
 * would hold more K/V than FC_SM90_WINDOW_CAP_BYTES (long rows: S = 8k on the
 * standard grid makes one window of 64 heads of 2 MB) take the dynamic order,
 * whose windows are capped (sm90_window_cap): the static order's snake needs
 * its whole windows, and their K/V came from HBM again and again (1.53 GB
 * read at causal 8k, where Q, K and V are 201 MB). Measured on an H100 (perf
 * notes, session 34, REPS = 600): causal 8k +4 %, 16k +2-4 %. So do calls
 * whose rows reach FC_SM90_D64_DYN_MIN_KEYS keys (Sk, or Sq top-left when shorter),
 * where the dynamic order runs 192-key K/V tiles: causal 2k flat, 4k +1 %,
 * bottom-right 1500 x 2048 +1.2 % (session 37). Below that the static order
 * stays: the dynamic one measured 1-2 % slower there (session 29). */
#define FC_SM90_D64_DYN_MIN_KEYS 2048
static inline int fc_sm90_d64_dynamic(const fc_attn_params* p, int num_sms) {
    if (p->causal == FC_CAUSAL_NONE || p->D > 64 || fc_sm90_key_split(p, num_sms) || !fc_sm90_cons3_grid(p, num_sms))
        return 0;
    const int row_keys = p->causal == FC_CAUSAL_TOP_LEFT && p->Sq < p->Sk ? p->Sq : p->Sk;  /* the longest row's */
    if (row_keys >= FC_SM90_D64_DYN_MIN_KEYS) return 1;
    const long long tiles = fc_sm90_tiles(p, 192), kv_head_bytes = (long long)p->Sk * 64 * 4;
    const int grid = tiles < num_sms ? (int)tiles : num_sms;
    return fc_sm90_window_heads(grid, (p->Sq + 191) / 192, p->B * p->Hq, kv_head_bytes) * kv_head_bytes >
           FC_SM90_WINDOW_CAP_BYTES;
}
static inline int fc_sm90_dynamic_order(const fc_attn_params* p, int num_sms) {
    if (p->causal == FC_CAUSAL_NONE || fc_sm90_windowed(p)) return 0;
    if (p->D <= 64) return fc_sm90_d64_dynamic(p, num_sms);
    if (p->Sk >= FC_SM90_DYN_MAX_SK) return fc_sm90_d128_wide(p, num_sms);
    return !fc_sm90_key_split(p, num_sms) && fc_sm90_tiles(p, 128) > num_sms;
}
/* The instantiation an sm90 call runs on num_sms SMs, by name ("key_split",
 * "dyn_kv192", "dyn_cons3", "dyn_cons2", "kv192", "cons3", "pairs", "long",
 * "cons2", "window", "window3"; see Sm90Kind in csrc/sm90/attn_fwd_sm90_launch.cuh): host logic only,
 * so tests check the routing of their shapes without a GPU. */
const char* fc_sm90_route_d64(const fc_attn_params* p, int num_sms);
const char* fc_sm90_route_d128(const fc_attn_params* p, int num_sms);
const char* fc_sm90_route_d256(const fc_attn_params* p, int num_sms);
const char* fc_sm90_route_d192(const fc_attn_params* p, int num_sms);
size_t fc_sm90_smem_d64(void);   /* dynamic shared memory per CTA, bytes (the larger mode) */
size_t fc_sm90_smem_d128(void);
size_t fc_sm90_smem_d256(void);
size_t fc_sm90_smem_d192(void);

/* Split-KV ("decode") kernel (csrc/sm80/attn_decode_sm80.cuh). One CTA owns
 * FC_DECODE_ROWS packed query rows of one (batch, KV head) -- the Hq/Hkv query
 * heads that share the KV head, times Sq -- and one range of whole key tiles
 * of FC_DECODE_BC(DP) keys. */
#define FC_DECODE_ROWS 16                        /* packed query rows per CTA: one m16 mma tile */
#define FC_DECODE_BC(DP) ((DP) <= 128 ? 64 : 32) /* keys per K/V tile at padded head dim DP */

/* The first key tile (of bc keys) the split-KV kernel's splits start from:
 * the one of row 0's first visible key, so a window's splits share out only
 * the keys its rows see (dispatch's plan counts the tiles from here too). */
FC_BAND_FN int fc_decode_first_tile(fc_band band, int bc) { return fc_band_first_block(band, 0, bc, INT_MAX); }

typedef struct {
    int splits;           /* key ranges (CTAs per row block); 1 = write O and LSE directly */
    int tiles_per_split;  /* key tiles of FC_DECODE_BC keys in each range (the last may be short) */
    int row_blocks;       /* ceil(Hq/Hkv * Sq / FC_DECODE_ROWS) */
    float* o_part;        /* (splits, B, Hq, Sq, D) fp32 partial O, each normalized by its own sum; splits > 1 */
    float* lse_part;      /* (splits, B, Hq, Sq) fp32 partial LSE (natural log), -inf where no key was seen */
    int pdl;              /* 1: splits > 1 on sm90+, the combine kernel launches as a programmatic dependent */
} fc_split_plan;

/* Launch the split-KV kernel, then (splits > 1) the combine kernel. */
fc_status fc_sm80_decode_d64(const fc_attn_params* p, const fc_split_plan* sp, fc_stream_t stream);
fc_status fc_sm80_decode_d128(const fc_attn_params* p, const fc_split_plan* sp, fc_stream_t stream);
fc_status fc_sm80_decode_d256(const fc_attn_params* p, const fc_split_plan* sp, fc_stream_t stream);
/* 1 where this build has code the current device runs: the sm80-family kernels (compiled for every
 * arch in FLASHCORE_ARCHS) load there (csrc/sm80/attn_combine.cu); 0 where it has none; -1 for
 * another CUDA error (out of memory while loading, a sticky error). */
int fc_sm80_has_image(void);
/* Resident split-KV CTAs per SM on the current device (occupancy API), 0 on error. */
int fc_sm80_decode_ctas_per_sm_d64(void);
int fc_sm80_decode_ctas_per_sm_d128(void);
int fc_sm80_decode_ctas_per_sm_d256(void);
/* Merges the splits of sp into p->o (q's dtype) and p->lse (csrc/sm80/attn_combine.cu),
 * one CTA per FC_COMBINE_ROWS query rows. With sp->splits = 0 it writes O = 0 and
 * LSE = -inf (the rows of a call with Sk = 0) and reads nothing. */
#define FC_COMBINE_ROWS 4
fc_status fc_split_combine(const fc_attn_params* p, const fc_split_plan* sp, fc_stream_t stream);

/* Host reference path (csrc/cpu/), synchronous, on host memory. */
fc_status fc_cpu_fwd(const fc_attn_params* p);
fc_status fc_cpu_bwd(const fc_attn_bwd_params* p);

#ifdef __cplusplus
}
#endif

#endif /* FLASHCORE_KERNELS_H */
