// attn_fwd_sm90_launch.cuh -- host side of the Hopper attention forward
// (attn_fwd_sm90.cuh): the choice of instantiation (key-split mode, three
// consumers, the long-row D = 128 kernel, the dynamic tile order, sliding windows), the tensor
// maps and the tile order's host-computed divisors, and the C entry points of
// one padded head dim (FC_SM90_DEFINE, see kernels.h).
#pragma once

#include "attn_fwd_sm90.cuh"

// ---------------------------------------------------------------------------
// Launcher and the C entry points of one padded head dim (see kernels.h)

// Sets the smem limit of one instantiation and launches it.
// plan: the instantiation's Sm90PlanOf (n = 0 or Sm90NoPlan: the static order).
template <int DP, int CONS, typename T, bool KV_SPLIT, bool LONG = false, bool DYN = false, bool WIN = false,
          typename Plan = Sm90NoPlan>
static fc_status attn_fwd_sm90_run(const Sm90Args& a, unsigned grid, cudaStream_t stream, const Plan& plan = {}) {
    using Tile = Sm90Tile<DP, CONS, LONG>;
    static_assert(std::is_same_v<Plan, Sm90PlanOf<DP, CONS, LONG, 1, DYN, KV_SPLIT>>, "the instantiation's plan type");
    constexpr size_t smem = Tile::smem_bytes(KV_SPLIT);
    if (fc_smem_limit_once<attn_fwd_sm90_kernel<DP, CONS, T, KV_SPLIT, LONG, DYN, 1, WIN>>((int)smem) != cudaSuccess)
        return FC_ERR_CUDA;
    attn_fwd_sm90_kernel<DP, CONS, T, KV_SPLIT, LONG, DYN, 1, WIN><<<grid, Tile::THREADS, smem, stream>>>(a, plan);
    return cudaGetLastError() == cudaSuccess ? FC_OK : FC_ERR_CUDA;
}

// The tile order of a launch of `grid` CTAs with `br`-row tiles (see sm90_tile).
// kv_head_bytes: one head's K and V at the padded head dim, for the causal window.
// merge: the kernel may merge its last two causal windows (sm90_last_window).
// cap: the order balances windows of any size (sm90_window_cap, or a host
// plan), so they are kept to what the L2 holds (sm90_causal_window).
// divisors: the kernel finds its tiles by multiply and shift (MAGIC_DIV); the
// others read only last_window, and the divisors' host work is skipped.
static Sm90Sched sm90_sched(const fc_attn_params* p, int br, int grid, long long kv_head_bytes, bool merge,
                            bool divisors, bool cap) {
    Sm90Sched o = {};
    const int n_bh = p->B * p->Hq;
    o.br = br;
    o.n_mblocks = (p->Sq + br - 1) / br;
    o.n_tiles = o.n_mblocks * n_bh;
    o.window = sm90_causal_window(grid, o.n_mblocks, n_bh, kv_head_bytes, cap);
    o.last_window = sm90_last_window(n_bh, o.window, kv_head_bytes, merge);
    o.last_heads = n_bh - o.last_window * o.window;
    if (!divisors) return o;
    o.by_grid = sm90_div(grid);
    o.by_mblocks = sm90_div(o.n_mblocks);
    o.by_hq = sm90_div(p->Hq);
    o.by_group = sm90_div(p->Hq / p->Hkv);
    o.by_wtiles = sm90_div(o.window * o.n_mblocks);
    o.by_window = sm90_div(o.window);
    o.by_last = sm90_div(o.last_heads);
    return o;
}

// The balanced order of a causal call's tiles over `grid` clusters (Sm90Plan):
// tiles in sm90_tile_magic's numbering before its snake (windows of heads,
// longest first in each), each given to the cluster with the least work so
// far (ties: the lowest cluster), its work counted as its K/V tiles plus
// SM90_PLAN_OVER for the tile's prologue and epilogue: the assignment that
// scripts/tile_model.py models as the dynamic order, which puts max/mean
// cluster work at D = 256 causal S = 2k at 1.031 (static order 1.057), 4k
// 1.017 (1.046), 8k 1.009 (1.031), 16k 1.004 (1.031).
// Plans nothing (plan->n stays 0: the static order) for non-causal calls, for
// no more tiles than clusters, and where the plan does not fit Sm90Plan.
static constexpr int SM90_PLAN_OVER = 2;  // K/V steps a tile spends outside its loop (perf notes, session 18)
static inline bool sm90_plans(const fc_attn_params* p, long long n_tiles, int grid) {  // whether sm90_plan plans
    return p->causal != FC_CAUSAL_NONE && n_tiles > grid && n_tiles <= SM90_PLAN_TILES && grid <= SM90_PLAN_GRID;
}
static inline void sm90_plan(const fc_attn_params* p, const Sm90Sched& o, int grid, int bc, Sm90Plan* plan) {
    const int n = o.n_tiles;
    if (!sm90_plans(p, n, grid)) return;
    // A min-heap of (work, cluster), as one 64-bit key each: ties go to the lower cluster.
    unsigned long long heap[SM90_PLAN_GRID];
    for (int c = 0; c < grid; ++c) heap[c] = (unsigned long long)c;  // all at zero work: a valid heap
    uint8_t owner[SM90_PLAN_TILES];
    int count[SM90_PLAN_GRID] = {0};
    for (int u = 0; u < n; ++u) {  // sm90_tile_magic's causal numbering
        const int w = u / (o.window * o.n_mblocks) < o.last_window ? u / (o.window * o.n_mblocks) : o.last_window;
        const int i = u - w * o.window * o.n_mblocks;
        const int heads = w == o.last_window ? o.last_heads : o.window;
        const int nb = sm90_kv_tiles(*p, (o.n_mblocks - 1 - i / heads) * o.br, o.br, bc);
        const int c = (int)(heap[0] & 0xffffffffu);
        owner[u] = (uint8_t)c;
        ++count[c];
        // The root's work grows: sift it down.
        unsigned long long key = heap[0] + ((unsigned long long)(nb + SM90_PLAN_OVER) << 32);
        int k = 0;
        for (;;) {
            int m = 2 * k + 1;
            if (m >= grid) break;
            if (m + 1 < grid && heap[m + 1] < heap[m]) ++m;
            if (heap[m] >= key) break;
            heap[k] = heap[m];
            k = m;
        }
        heap[k] = key;
    }
    plan->n = n;
    plan->first[0] = 0;
    for (int c = 0; c < grid; ++c) plan->first[c + 1] = (uint16_t)(plan->first[c] + count[c]);
    int next[SM90_PLAN_GRID];
    for (int c = 0; c < grid; ++c) next[c] = plan->first[c];
    for (int u = 0; u < n; ++u) {
        // The kernel takes the snake (sm90_tile_magic, whose copy this is) on
        // whatever number it gets, and the snake is its own inverse: hand it the
        // number it maps to u.
        const int stripe = u / grid;
        const bool rev = (stripe & 1) && (stripe + 1) * grid <= n;
        plan->tile[next[owner[u]]++] = (uint16_t)(rev ? stripe * grid + grid - 1 - (u - stripe * grid) : u);
    }
}

// The row plan (Sm90RowPlan) of a non-causal call on 192-key K/V tiles (three
// D = 64 consumers) whose last query block of each head is short (Sq % BR rows:
// one or two consumers at work, the others skip it, PAD_SKIP). The static order
// gives every CTA every grid-th tile, so the r = n % grid CTAs that run one tile
// more end last, whatever short tiles they hold. A short tile costs less:
// measured on an H100 with one short block per CTA (perf notes, session 38),
// two consumers 0.78-0.88 of a whole tile, one 0.56-0.8. The plan keeps the
// static order's tile counts and gives each CTA as many short tiles as bring it
// nearest the common end (water-filling from the CTAs that end last, in
// SM90_ROW_COST units), spread evenly over its run; it hands out the whole
// tiles and the short ones in head order, slot by slot, so the CTAs at work at
// one time share a few heads' K/V in L2 as in the static order (a head's short
// tile runs about when its whole ones do). Measured on an
// H100 (REPS = 600): S = 2k +1-2 %, 4k +1.2-1.5 %, B4 H16 2000 x 2100 +2.3 %
// (the model: +2.7 %, +1.5 %). The 128-key kernel (S = 512-1k) gained nothing
// with it, 1k 1 % slower than its code without the plan, and keeps the static order.
// Plans nothing (a plan of n = 0) for causal calls, when the last block keeps
// all three consumers at work, for no more tiles than CTAs, and where the plan
// does not fit (more tiles than Sm90RowPlan holds, more CTAs than SM90_PLAN_GRID).
static constexpr int SM90_ROW_COST[4] = {0, 11, 13, 16};  // a tile's time by consumers at work (sixteenths)
static inline bool sm90_row_plans(const fc_attn_params* p, int br, long long n_tiles, int grid) {
    const int rows = p->Sq % br;  // the short block's (0: none)
    return p->causal == FC_CAUSAL_NONE && p->Sq > br && rows != 0 && (rows + 63) / 64 < 3 && n_tiles > grid &&
           n_tiles <= SM90_ROW_PLAN_TILES && grid <= SM90_PLAN_GRID;
}
// The plan depends only on the tile count, the query blocks per head, the CTAs
// and the short block's consumers; planning takes about 12 us of host time, so
// the last plan is kept per host thread for the calls of one shape that follow
// (a model's layers). The launch copies it into the kernel's parameters.
static inline const Sm90RowPlan& sm90_row_plan(const fc_attn_params* p, const Sm90Sched& o, int grid) {
    static const Sm90RowPlan none = {};  // n = 0: the static order
    const int n = o.n_tiles, m = o.n_mblocks, n_short = n / m;  // one short tile per head
    if (!sm90_row_plans(p, o.br, n, grid)) return none;
    const int consumers = (p->Sq - (m - 1) * o.br + 63) / 64;  // at work on a short tile
    static thread_local Sm90RowPlan kept;                    // n = 0 until a plan is made
    static thread_local int kept_m = 0, kept_grid = 0, kept_consumers = 0;
    if (kept.n == n && kept_m == m && kept_grid == grid && kept_consumers == consumers) return kept;
    const int full = SM90_ROW_COST[3];
    const int save = full - SM90_ROW_COST[consumers];  // what a short tile saves
    const int q = n / grid, r = n % grid;
    auto count = [&](int c) { return c < r ? q + 1 : q; };  // tiles of CTA c (the static order's)
    // Short tiles CTA c needs to end by level L.
    auto need = [&](int c, int L) {
        const int w = count(c) * full - L, k = w <= 0 ? 0 : (w + save - 1) / save;
        return k < count(c) ? k : count(c);
    };
    auto needed = [&](int L) {
        int t = 0;
        for (int c = 0; c < grid; ++c) t += need(c, L);
        return t;
    };
    int lo = 0, hi = (q + 1) * full;  // the lowest level with needed(L) <= n_short: needed(hi) = 0
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (needed(mid) <= n_short) hi = mid;
        else lo = mid + 1;
    }
    int shorts[SM90_PLAN_GRID], left = n_short;
    for (int c = 0; c < grid; ++c) left -= shorts[c] = need(c, lo);
    // The rest (fewer than needed(lo - 1) - needed(lo)) to CTAs at the level.
    for (int c = 0; c < grid && left > 0 && lo > 0; ++c)
        if (need(c, lo - 1) > shorts[c]) ++shorts[c], --left;
    // CTA c's short tiles spread evenly over its run, from a phase that differs
    // by CTA (phase[c] of count(c), spread over the CTAs that run short tiles),
    // so that as many short tiles run in each slot as heads' whole ones end.
    int phase[SM90_PLAN_GRID], with = 0;
    for (int c = 0; c < grid; ++c) with += shorts[c] > 0;
    for (int c = 0, i = 0; c < grid; ++c) phase[c] = shorts[c] > 0 ? i++ * count(c) / with : 0;
    kept.n = n;
    int next_full = 0, next_short = 0;  // the next whole and short tile, head by head
    for (int k = 0; k <= q; ++k)
        for (int c = 0; c < grid && k < count(c); ++c) {  // CTA c's k-th tile: static position k grid + c
            const int x = shorts[c], ph = phase[c];
            const bool is_short = ((k + 1) * x + ph) / count(c) > (k * x + ph) / count(c);
            int bh, mb;
            if (is_short) {
                bh = next_short++;
                mb = m - 1;
            } else {
                bh = next_full / (m - 1);
                mb = next_full++ % (m - 1);
            }
            // sm90_tile's number for (bh, mb): it rotates block u % m by bh m / grid (ROTATE)
            kept.tile[k * grid + c] = (uint16_t)(bh * m + ((mb - bh * m / grid) % m + m) % m);
        }
    kept_m = m;
    kept_grid = grid;
    kept_consumers = consumers;
    return kept;
}

// The split tail of a non-causal call (attn_sm90_tail.cuh) of n_tiles tiles of
// `bc`-key K/V tiles on `units` clusters of `cl` CTAs with two consumers each;
// tl->main stays 0 (no split) for causal calls, for a single stripe or whole
// stripes, and where the tail's cluster would not finish at least
// SM90_TAIL_GAIN K/V steps sooner than a whole tile. Its model cost: a tile's
// prologue and epilogue (SM90_PLAN_OVER) per piece, two pieces per cluster,
// and the partials' writes and merge, about one step; W = ceil(r N / G), so
// the tail ends sooner when W + 2 x 2 + 1 < N + 2, W <= N - SM90_TAIL_GAIN.
// Zeroes the counters (the workspace's first FC_SM90_TAIL_COUNT_BYTES, see
// kernels.h; the partials follow) on `stream`, unless p->counters_zeroed says
// they are zero (fc_attn_fwd zeroes the workspace again after the kernel).
static constexpr int SM90_TAIL_GAIN = 4;
static inline fc_status sm90_tail(const fc_attn_params* p, long long n_tiles, int units, int bc, int cl,
                                  int num_sms, Sm90Tail* tl, cudaStream_t stream) {
    *tl = Sm90Tail{};
    if (p->causal != FC_CAUSAL_NONE) return FC_OK;
    const long long stripes = n_tiles / units, r = n_tiles % units, n_kv = (p->Sk + bc - 1) / bc;
    if (stripes < 1 || r == 0 || r * n_kv >= (1ll << 30)) return FC_OK;
    long long w = (r * n_kv + units - 1) / units;
    if (w < (n_kv + 1) / 2) w = (n_kv + 1) / 2;  // at most SM90_TAIL_MAX_PIECES pieces a tile
    if (w > n_kv - SM90_TAIL_GAIN) return FC_OK;
    const size_t need = fc_sm90_tail_workspace(p, num_sms);
    if (!p->workspace || p->workspace_bytes < need || need == 0) return FC_ERR_WORKSPACE;  // (dispatch sized it)
    tl->main = (int)(stripes * units);
    tl->n_kv = (int)n_kv;
    tl->steps = (int)w;
    tl->total = (int)(r * n_kv);
    tl->by_kv = sm90_div(tl->n_kv);
    tl->by_steps = sm90_div(tl->steps);
    tl->count = static_cast<unsigned*>(p->workspace);
    tl->part = reinterpret_cast<float4*>(static_cast<unsigned char*>(p->workspace) +
                                         FC_SM90_TAIL_COUNT_BYTES(FC_SM90_TAIL_CTAS(p, num_sms)));
    // (counters: r tiles x cl CTAs < CTAs; partials: fewer than G + r <= 2 G slots of cl CTAs)
    if (p->counters_zeroed) return FC_OK;  // (zero already)
    return cudaMemsetAsync(tl->count, 0, (size_t)r * cl * FC_SM90_TAIL_CTA_COUNTERS * sizeof(unsigned), stream) ==
                   cudaSuccess
               ? FC_OK
               : FC_ERR_CUDA;
}

// Clusters of SM90_CLUSTER CTAs (attn_fwd_sm90_kernel's CL) from this many keys
// per row (0: never). Measured on an H100 against single CTAs (perf notes,
// session 26; REPS = 600): D = 128 +0.6-3 % from 4k (the LONG kernel), 1 %
// slower at 2k; D = 256 +1-3 % from 2k; both 1-3 % slower at S = 512 in bursts.
// D = 64 keeps single CTAs: its one 64-column slab does not split in two.
static constexpr int SM90_CLUSTER = 2;
static constexpr int sm90_cluster_min_sk(int dp) { return dp == 128 ? 4096 : dp == 256 ? 2048 : 0; }
static_assert(sm90_cluster_min_sk(128) == FC_SM90_TAIL_MIN_SK, "the split tail is the D = 128 pairs' (kernels.h)");

// How many clusters fit on the GPU at once (its SMs pair up within GPCs), cached per device.
template <auto KERNEL>
static int sm90_max_clusters(const cudaLaunchConfig_t& cfg) {
    static std::atomic<int> cached[FC_SMEM_CACHE_DEVICES];  // 0: not yet asked
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 0;
    int n = dev < FC_SMEM_CACHE_DEVICES ? cached[dev].load(std::memory_order_relaxed) : 0;
    if (n > 0) return n;
    if (cudaOccupancyMaxActiveClusters(&n, KERNEL, &cfg) != cudaSuccess) return 0;
    if (dev < FC_SMEM_CACHE_DEVICES) cached[dev].store(n, std::memory_order_relaxed);
    return n;
}

// The cluster instantiation: CTAs in pairs, each pair on one tile of 2 x BR rows.
// Where the device runs no such cluster (none fits: a partitioned GPU, say), the
// single-CTA kernel on `grid` CTAs: the same arithmetic, in the same order per row.
template <int DP, typename T, bool LONG>
static fc_status attn_fwd_sm90_run_cluster(Sm90Args a, long long n_pair_tiles, unsigned grid, int num_sms,
                                           cudaStream_t stream) {
    using Tile = Sm90Tile<DP, 2, LONG>;
    constexpr auto kernel = attn_fwd_sm90_kernel<DP, 2, T, false, LONG, false, SM90_CLUSTER>;
    constexpr size_t smem = Tile::smem_bytes(false);
    if (fc_smem_limit_once<kernel>((int)smem) != cudaSuccess) return FC_ERR_CUDA;
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = SM90_CLUSTER;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.blockDim = dim3(Tile::THREADS);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    cfg.gridDim = dim3(SM90_CLUSTER);  // (the query asks how many such clusters fit)
    const int max_clusters = sm90_max_clusters<kernel>(cfg);
    if (max_clusters <= 0) {
        a.sched = sm90_sched(&a.p, Tile::BR, (int)grid, (long long)a.p.Sk * DP * 4, true, Tile::MAGIC_DIV, false);
        return attn_fwd_sm90_run<DP, 2, T, false, LONG>(a, grid, stream);
    }
    const long long clusters = n_pair_tiles < max_clusters ? n_pair_tiles : max_clusters;
    cfg.gridDim = dim3((unsigned)(clusters * SM90_CLUSTER));
    using Plan = Sm90PlanOf<DP, 2, LONG, SM90_CLUSTER, false, false>;
    constexpr bool has_plan = Plan::PLAN;
    const bool planned = has_plan && sm90_plans(&a.p, n_pair_tiles, (int)clusters);  // (its windows capped)
    a.sched = sm90_sched(&a.p, SM90_CLUSTER * Tile::BR, (int)clusters, (long long)a.p.Sk * DP * 4, true,
                         Tile::MAGIC_DIV, planned);  // pair tiles over clusters
    Plan plan{};  // (n = 0: the static order)
    if constexpr (has_plan) {
        static_assert(Tile::MAGIC_DIV, "sm90_plan numbers tiles as sm90_tile_magic does");
        sm90_plan(&a.p, a.sched, (int)clusters, Tile::BC, &plan);
    }
    if constexpr (sm90_tail_kernel(DP, 2, SM90_CLUSTER, false, false, LONG)) {
        // The workspace layout of kernels.h against the kernel's (sm90_tail_piece_end):
        // a counter per consumer warp, and per thread its O accumulators plus m and l.
        static_assert(Tile::CONSUMERS * 4 == FC_SM90_TAIL_CTA_COUNTERS &&
                          FC_SM90_TAIL_SLOT_BYTES ==
                              (size_t)Tile::CONSUMERS * 128 * (Tile::PV_PARTS * Tile::PV_N / 2 + 4) * sizeof(float),
                      "FC_SM90_TAIL_* (kernels.h)");
        const fc_status s = sm90_tail(&a.p, a.sched.n_tiles, (int)clusters, Tile::BC, SM90_CLUSTER, num_sms, &a.tail,
                                      stream);
        if (s != FC_OK) return s;
    }
    if (cudaLaunchKernelEx(&cfg, kernel, a, plan) != cudaSuccess) return FC_ERR_CUDA;
    return cudaGetLastError() == cudaSuccess ? FC_OK : FC_ERR_CUDA;
}

// D = 128 calls from this many keys per row run the LONG instantiation (the
// softmax pinned ahead of the P V wait), or causal ones three consumers in
// the dynamic order (fc_sm90_d128_wide). Measured on an H100 (perf notes,
// session 19): +1-2 % at S = 2k-4k, +3-4 % at 16k; 1-1.5 % slower at S <= 1k.
static constexpr int SM90_LONG_MIN_SK = 2048;
static_assert(SM90_LONG_MIN_SK == FC_SM90_DYN_MAX_SK,
              "the two-consumer dynamic order (kernels.h) stops where LONG starts");
static_assert(sm90_cluster_min_sk(128) >= SM90_LONG_MIN_SK, "the D = 128 cluster kernel is the LONG one");
static_assert(sm90_cluster_min_sk(256) >= FC_SM90_DYN_MAX_SK, "pairs and the dynamic order take different rows");
static_assert(Sm90Tile<64, 3>::BR == 192 && Sm90Tile<128, 3>::BR == 192 && Sm90Tile<128>::BR == 128,
              "fc_sm90_cons3_grid and fc_sm90_d64_dynamic (kernels.h)");

// Whether an ordinary-mode call at padded head dim DP runs Sm90Tile<DP, 3>: at
// D = 64 when the grid favours it, at D = 128 for causal calls from
// FC_SM90_DYN_MAX_SK keys (fc_sm90_d128_wide), in the dynamic order. Measured
// on an H100 at D = 128 (perf notes, session 27): with the static order causal
// S2k-8k +2-3 % over two consumers, and CTAs ending up to 20 % apart (10-11
// tiles of unequal length each), which the dynamic order with merged windows
// recovers (+4-5 % at 2k-4k, session 28); non-causal 2-7 % slower, causal
// S512-1k 10-12 % slower.
template <int DP>
static bool sm90_use_cons3(const fc_attn_params* p, int num_sms) {
    if constexpr (DP == 64) return fc_sm90_cons3_grid(p, num_sms);
    if constexpr (DP == 128) return fc_sm90_d128_wide(p, num_sms);
    return false;
}

// Whether a call on three D = 64 consumers takes 192-key K/V tiles
// (Sm90Tile::WIDE_KV, the D = 64 LONG instantiation). Non-causal: from
// SM90_WIDE_KV_MIN_SK keys, where 192-key tiles cover Sk with at most
// SM90_WIDE_KV_SLACK_PERMILLE more keys than 128-key tiles (the lead of K/V
// tile 0, Sm90Tile::LEAD_TILE, whose first P V runs on zeros; its S and softmax
// skip the lead's whole 64-key groups). Measured on an H100 (perf notes, sessions
// 36-37; REPS = 600): +2 % at 8k and 16k (0.8 % more keys); with the lead tile
// +1.7 % at 2k and +1.1 % at 4k (3.1 %; 1.6 % slower at 2k and flat at 4k with
// a partial last tile), 2-4 % slower at 1k (12.5 %) and 1.5 % at 512: about
// +2.8 % per key, less the padding. Causal: in the dynamic order
// (fc_sm90_d64_dynamic: many heads of long K/V rows), +3-4 % at 8k and 16k, +4 %
// and +7 % on 550 x 2300 and 768 x 8192 bottom-right, flat on the same shapes
// top-left (rows of at most 768 keys); in the static order causal 2k and 4k
// were flat (-0.6 %, +0.5 %) and 1k 4.5 % slower, so the static order keeps
// 128-key tiles (causal rows from 2048 keys take the dynamic order, session 37).
static constexpr int SM90_WIDE_KV_MIN_SK = 2048;
static constexpr int SM90_WIDE_KV_SLACK_PERMILLE = 32;
using Sm90WideKv = Sm90Tile<64, 3, true>;
static inline bool sm90_wide_kv(const fc_attn_params* p, bool cons3, bool dyn) {
    // Causal calls only in the dynamic order: the static-order kernel's lead tile
    // (LEAD_TILE) has no causal mask.
    if (p->causal != FC_CAUSAL_NONE) return cons3 && dyn;
    if (!cons3 || p->Sk < SM90_WIDE_KV_MIN_SK) return false;
    constexpr long long WIDE = Sm90WideKv::BC, NARROW = Sm90Tile<64, 3>::BC;  // keys per K/V tile
    const long long wide = (p->Sk + WIDE - 1) / WIDE * WIDE, narrow = (p->Sk + NARROW - 1) / NARROW * NARROW;
    return wide * 1000 <= narrow * (1000 + SM90_WIDE_KV_SLACK_PERMILLE);
}

// The instantiation a call runs, decided by sm90_route from the params and the
// SM count alone (fc_sm90_route_d* names it for tests and tools).
enum Sm90Kind {
    SM90_KEY_SPLIT,   // 64-row tiles, each CTA on half the keys (D <= 128)
    SM90_DYN_KV192,   // three D = 64 consumers, 192-key K/V tiles, dynamic order
    SM90_DYN_CONS3,   // three consumers, dynamic order (D = 64, causal D = 128)
    SM90_DYN_CONS2,   // two consumers, dynamic order (causal D >= 128)
    SM90_KV192,       // three D = 64 consumers, 192-key K/V tiles, static order (row plan)
    SM90_CONS3,       // three D = 64 consumers, static order
    SM90_PAIRS,       // CTA pairs sharing K/V (long rows at D = 128, 256)
    SM90_LONG,        // two D = 128 consumers, the softmax pinned ahead of the P V wait
    SM90_CONS2,       // two consumers, static order
    SM90_WINDOW,      // two consumers, static order, a sliding window (fc_sm90_windowed)
    SM90_WINDOW3,     // three D = 64 consumers, static order, a sliding window
};
static const char* const SM90_KIND_NAMES[] = {"key_split", "dyn_kv192", "dyn_cons3", "dyn_cons2", "kv192",
                                              "cons3", "pairs", "long", "cons2", "window", "window3"};
struct Sm90Route {
    Sm90Kind kind;
    bool kv_split;  // key-split mode (fc_sm90_key_split)
    bool cons3;     // three consumer warpgroups (192-row tiles)
    bool dyn;       // the dynamic tile order (fc_sm90_dynamic_order)
    bool wide_kv;   // 192-key K/V tiles (sm90_wide_kv)
    bool pairs;     // CTA pairs
};
template <int DP>
static Sm90Route sm90_route(const fc_attn_params* p, int num_sms) {
    using Tile = Sm90Tile<DP>;
    Sm90Route r = {};
    if (fc_sm90_windowed(p)) {  // (its own instantiation; the others have no left edge in their masks)
        // Three D = 64 consumers where the grid favours them, as without a window (sm90_use_cons3;
        // perf notes, session 74). Not key-split mode: its CTAs would each take half of every tile's keys.
        r.cons3 = DP == 64 && fc_sm90_cons3_grid(p, num_sms);
        r.kind = r.cons3 ? SM90_WINDOW3 : SM90_WINDOW;
        return r;
    }
    // Key-split mode when the 64-row tiles fit on the SMs in one wave: twice
    // the SMs at work, each on half the keys of its tile.
    static_assert(Tile::KV_SPLIT_OK == (DP <= 128) && Tile::WG_ROWS == 64, "fc_sm90_key_split (kernels.h)");
    r.kv_split = fc_sm90_key_split(p, num_sms);
    r.cons3 = !r.kv_split && sm90_use_cons3<DP>(p, num_sms);
    r.dyn = fc_sm90_dynamic_order(p, num_sms);
    r.wide_kv = DP == 64 && sm90_wide_kv(p, r.cons3, r.dyn);
    // CTA pairs for long rows, when the query blocks of a head pair up evenly (the
    // dynamic order's rows are shorter: FC_SM90_DYN_MAX_SK <= sm90_cluster_min_sk).
    r.pairs = !r.kv_split && !r.cons3 && sm90_cluster_min_sk(DP) > 0 && p->Sk >= sm90_cluster_min_sk(DP) &&
              (p->Sq + Tile::BR - 1) / Tile::BR % SM90_CLUSTER == 0;
    // (at D = 64 the dynamic order implies three consumers, fc_sm90_d64_dynamic)
    r.kind = r.kv_split                                  ? SM90_KEY_SPLIT
             : r.dyn && r.wide_kv                        ? SM90_DYN_KV192
             : r.dyn && r.cons3                          ? SM90_DYN_CONS3
             : r.dyn                                     ? SM90_DYN_CONS2
             : r.wide_kv                                 ? SM90_KV192
             : DP == 64 && r.cons3                       ? SM90_CONS3
             : r.pairs                                   ? SM90_PAIRS
             : DP == 128 && p->Sk >= SM90_LONG_MIN_SK    ? SM90_LONG
                                                         : SM90_CONS2;
    return r;
}

template <int DP, typename T>
static fc_status attn_fwd_sm90_launch(const fc_attn_params* p, int num_sms, cudaStream_t stream) {
    using Tile = Sm90Tile<DP>;
    Sm90Args a;
    a.p = *p;
    a.p.Dv = FC_DV(*p);  // (the kernels read v's head dim as given: Dv = 0 means D)
    a.tile_counter = nullptr;  // the static order unless fc_sm90_dynamic_order (below)
    a.tail = Sm90Tail{};       // no split tail unless sm90_tail (below)
#ifdef FC_SM90_TRACE
    a.trace = fc_sm90_trace_buf;
#endif
    const Sm90Route r = sm90_route<DP>(p, num_sms);
    const int consumers = r.cons3 ? 3 : 2;
    const int br = r.kv_split ? Tile::WG_ROWS : r.cons3 ? 3 * Tile::WG_ROWS : Tile::BR;  // 3 consumers: Sm90Tile<DP, 3>::BR
    const int q_box = Tile::Q_HALVES ? Tile::WG_ROWS : br;  // rows of one Q load (Q_HALVES: a consumer's)
    const int bc = r.wide_kv ? Sm90WideKv::BC : Tile::BC;  // keys per K/V tile (one K or V load)
    fc_status s = fc_sm90_tensor_map(&a.q_map, p->dtype, p->q, p->D, p->Sq, p->Hq, p->B, p->q_row_stride,
                                     p->q_head_stride, p->q_batch_stride, q_box);
    if (s == FC_OK)
        s = fc_sm90_tensor_map(&a.k_map, p->dtype, p->k, p->D, p->Sk, p->Hkv, p->B, p->k_row_stride,
                               p->k_head_stride, p->k_batch_stride, bc);
    if (s == FC_OK)
        s = fc_sm90_tensor_map(&a.v_map, p->dtype, p->v, a.p.Dv, p->Sk, p->Hkv, p->B, p->v_row_stride,
                               p->v_head_stride, p->v_batch_stride, bc);
    if (s != FC_OK) return s;
    const long long n_tiles = fc_sm90_tiles(p, br);
    const unsigned grid = (unsigned)(n_tiles < num_sms ? n_tiles : num_sms);
    // The tile order (pairs: their own, in attn_fwd_sm90_run_cluster). Every kernel reads
    // its last_window; the divisors only the MAGIC_DIV kernels.
    a.sched = sm90_sched(p, br, (int)grid, (long long)p->Sk * DP * 4, sm90_merge_windows(r.dyn, consumers),
                         sm90_magic_div(DP, consumers) && !r.pairs, sm90_window_cap(r.dyn, consumers));
    if (r.dyn) {  // (dispatch checked the workspace)
        if (!p->workspace || p->workspace_bytes < FC_SM90_DYN_WORKSPACE) return FC_ERR_WORKSPACE;
        a.tile_counter = static_cast<unsigned int*>(p->workspace);
        // (the kernel leaves the counter at zero: a workspace kept zero needs no memset)
        if (!p->counters_zeroed && cudaMemsetAsync(a.tile_counter, 0, sizeof(unsigned int), stream) != cudaSuccess)
            return FC_ERR_CUDA;
    }
    switch (r.kind) {
        case SM90_KEY_SPLIT:
            if constexpr (Tile::KV_SPLIT_OK) return attn_fwd_sm90_run<DP, 2, T, true>(a, grid, stream);
            break;
        case SM90_DYN_KV192:
            if constexpr (DP == 64) return attn_fwd_sm90_run<DP, 3, T, false, true, true>(a, grid, stream);
            break;
        case SM90_DYN_CONS3:
            if constexpr (DP <= 128) return attn_fwd_sm90_run<DP, 3, T, false, false, true>(a, grid, stream);
            break;
        case SM90_DYN_CONS2:
            if constexpr (DP >= 128) return attn_fwd_sm90_run<DP, 2, T, false, false, true>(a, grid, stream);
            break;
        case SM90_KV192:
            if constexpr (DP == 64)
                return attn_fwd_sm90_run<DP, 3, T, false, true>(a, grid, stream, sm90_row_plan(p, a.sched, (int)grid));
            break;
        case SM90_CONS3:
            if constexpr (DP == 64) return attn_fwd_sm90_run<DP, 3, T, false>(a, grid, stream);
            break;
        case SM90_PAIRS:
            if constexpr (sm90_cluster_min_sk(DP) > 0)
                return attn_fwd_sm90_run_cluster<DP, T, DP == 128>(a, fc_sm90_tiles(p, SM90_CLUSTER * Tile::BR), grid,
                                                                   num_sms, stream);
            break;
        case SM90_LONG:
            if constexpr (DP == 128) return attn_fwd_sm90_run<DP, 2, T, false, true>(a, grid, stream);
            break;
        case SM90_CONS2:
            return attn_fwd_sm90_run<DP, 2, T, false>(a, grid, stream);
        case SM90_WINDOW:
            return attn_fwd_sm90_run<DP, 2, T, false, false, false, true>(a, grid, stream);
        case SM90_WINDOW3:
            if constexpr (DP == 64) return attn_fwd_sm90_run<DP, 3, T, false, false, false, true>(a, grid, stream);
            break;
    }
    return FC_ERR_ARCH;  // (unreachable: sm90_route gives only the kinds this DP instantiates)
}

// Dynamic smem of the largest instantiation at DP (dispatch checks the device can give it).
template <int DP>
static constexpr size_t sm90_smem_max() {
    size_t m = Sm90Tile<DP>::smem_bytes(Sm90Tile<DP>::KV_SPLIT_OK);
    if constexpr (DP <= 128) m = m > Sm90Tile<DP, 3>::smem_bytes(false) ? m : Sm90Tile<DP, 3>::smem_bytes(false);
    if constexpr (DP == 64) m = m > Sm90WideKv::smem_bytes(false) ? m : Sm90WideKv::smem_bytes(false);
    return m;
}

#define FC_SM90_DEFINE(DP)                                                                              \
    extern "C" fc_status fc_sm90_fwd_d##DP(const fc_attn_params* p, int num_sms, fc_stream_t stream) { \
        return p->dtype == FC_DTYPE_BF16                                                                \
                   ? attn_fwd_sm90_launch<DP, __nv_bfloat16>(p, num_sms, (cudaStream_t)stream)          \
                   : attn_fwd_sm90_launch<DP, __half>(p, num_sms, (cudaStream_t)stream);                \
    }                                                                                                   \
    extern "C" size_t fc_sm90_smem_d##DP(void) { return sm90_smem_max<DP>(); }                        \
    extern "C" const char* fc_sm90_route_d##DP(const fc_attn_params* p, int num_sms) {                  \
        return SM90_KIND_NAMES[sm90_route<DP>(p, num_sms).kind];                                        \
    }
