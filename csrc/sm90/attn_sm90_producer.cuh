// attn_sm90_producer.cuh -- the producer warpgroup of the Hopper attention
// forward (attn_fwd_sm90.cuh): one thread walks the CTA's tiles in the tile
// order and issues every TMA load, Q into its buffers (with the tile's
// coordinates beside it, TILE_INFO) and K and V through the STAGES-deep ring,
// each load completing on its full barrier once the slot's empty barrier says
// the consumers are done with it; with CTA pairs each producer loads half of
// every K/V tile's slabs to both CTAs. The algorithm and the barriers are
// described at the top of attn_fwd_sm90.cuh.
#pragma once

#include <stdint.h>

#include <type_traits>

#include "attn_sm90_parts.cuh"
#include "hopper.cuh"
#include "trace.cuh"

// Shared-memory addresses of one CTA (laid out by attn_fwd_sm90_kernel).
struct Sm90Smem {
    uint32_t sQ, sK, sV;          // Q buffers, the K ring, the V ring
    uint32_t q_full, q_empty;     // Q barriers, 8 bytes each (Q_BARS of each)
    uint32_t k_full, v_full;      // K/V ring barriers (STAGES of each)
    uint32_t k_empty, v_empty;
    uint32_t info;                // TILE_INFO slots, 16 bytes per Q barrier pair
};

// The producer thread (thread 0 of warpgroup 0) of attn_fwd_sm90_kernel with the
// same template arguments: pos gives the CTA's positions in the tile order,
// coord_at(x) the tile at position x (with TAIL or WIN its K/V tiles from
// t.kv0), next_tile(x) the position after x; crank is the CTA's rank in its
// cluster. Returns when every load is issued (and, with
// clusters, every slot is free again).
template <int DP, int CONS, bool KV_SPLIT, bool LONG, bool DYN, int CL, bool TAIL, bool WIN, typename Pos,
          typename CoordAt, typename NextTile>
__device__ __forceinline__ void sm90_producer(const Sm90Args& args, const Sm90Smem& sm, const Pos& pos, int crank,
                                              const CoordAt& coord_at, const NextTile& next_tile) {
    using Tile = Sm90Tile<DP, CONS, LONG>;
    constexpr int BR = Tile::BR, BC = Tile::BC, STAGES = Tile::stages(KV_SPLIT);
    constexpr int SLABS = Tile::SLABS, Q_BUFS = Tile::Q_BUFS;
    constexpr uint32_t ROWB = FC_SWZ_ROW_BYTES;
    constexpr int br = KV_SPLIT ? Tile::WG_ROWS : BR;  // query rows per tile
    const uint32_t sQ = sm.sQ, sK = sm.sK, sV = sm.sV, info = sm.info;
    const uint32_t q_full = sm.q_full, q_empty = sm.q_empty, k_full = sm.k_full, v_full = sm.v_full;
    const uint32_t k_empty = sm.k_empty, v_empty = sm.v_empty;
    tma_prefetch_map(&args.q_map);
    tma_prefetch_map(&args.k_map);
    tma_prefetch_map(&args.v_map);
    int it = 0;  // K/V tiles issued so far: position in the ring
    // LEAD_TILE: K/V tile j starts at key j BC - lead; the rows before key 0 load as
    // zeros, and TMA counts their bytes toward the full barrier's transaction as well.
    const int lead = sm90_kv_lead<Tile, DYN>(args.p);
    int local = 0;
    // One tile of `rows` rows (of tensor `map`, from row `row` of head h, batch b)
    // into smem at dst, one 64-column slab per TMA load, completing on mbarrier bar.
    // N: the slabs, std::integral_constant of SLABS (Q, K) or V_SLABS.
    auto load_slabs = [&](auto n, uint32_t dst, const CUtensorMap* map, uint32_t bar, int rows, int row, int h,
                          int b) {
        constexpr int N = decltype(n)::value;
#pragma unroll(DYN && (DP > 128 || CONS == 3) ? 1 : N)  // (the DYN producers' 24 and 32 registers)
        for (int s = 0; s < N; ++s) tma_load_4d(dst + s * rows * ROWB, map, bar, s * FC_SLAB_COLS, row, h, b);
    };
    using QKSlabs = std::integral_constant<int, SLABS>;
    using VSlabs = std::integral_constant<int, Tile::V_SLABS>;
    // Q_AHEAD: Q of tile local + 1 is issued after this tile's second K/V tile, not
    // after its last: its buffer held tile local - 1, whose consumers are done by
    // then or soon (they release it after that tile's epilogue), and no K/V load
    // waits behind it (the slots of K/V tiles 2, 3, ... free only once this tile's
    // consumers run). The dynamic order takes its next tile only when it needs it.
    constexpr bool ahead = Tile::Q_AHEAD && !DYN && !KV_SPLIT;
    // Tile t's Q (and coordinates) into buffer l % Q_BUFS; with Q_HALVES only
    // consumer `half`'s rows, on that consumer's barrier pair.
    auto load_q = [&](const Sm90TileCoord& t, int l, int half) {
        const int qb = l % Q_BUFS, qbar = Tile::Q_HALVES ? half : qb;
        mbar_wait(q_empty + 8 * qbar, ((l / Q_BUFS) & 1) ^ 1);  // these rows' previous tile is finished
        // The consumers read the tile's coordinates with its Q, so that finding
        // them (divisions) is not on their path from one tile to the next.
        if constexpr (Tile::TILE_INFO) st_shared_v4_s32(info + 16 * qbar, t.b, t.h, t.row0, t.n_blocks);
        if constexpr (Tile::Q_HALVES) {
            constexpr int rows = Tile::WG_ROWS;
            mbar_expect_tx(q_full + 8 * qbar, rows * DP * 2);  // (an arrive: releases the store above to its waiters)
#pragma unroll
            for (int s = 0; s < SLABS; ++s)  // into slabs of BR rows, as the consumers read them
                tma_load_4d(sQ + half * rows * ROWB + s * BR * ROWB, &args.q_map, q_full + 8 * qbar,
                            s * FC_SLAB_COLS, t.row0 + half * rows, t.h, t.b);
        } else {
            mbar_expect_tx(q_full + 8 * qbar, br * DP * 2);  // (an arrive: releases the store above to its waiters)
            load_slabs(QKSlabs{}, sQ + qb * Tile::Q_BYTES, &args.q_map, q_full + 8 * qbar, BR, t.row0, t.h, t.b);
        }
    };
    Sm90TileCoord t;
    if constexpr (ahead) {
        t = coord_at(pos.first());  // (grid <= n_tiles)
        load_q(t, 0, 0);
    }
    for (int tile = pos.first(); tile < pos.end(); ++local) {
        int nxt = 0;
        if constexpr (ahead) nxt = next_tile(tile);
        else t = coord_at(tile);
        TR_DECL(args, local, 0, true)
        TR_SET(TR_START);
        TR_GTIME();
        if constexpr (!ahead) load_q(t, local, 0);
        TR_SET(TR_Q);
        Sm90TileCoord tn = t;
        // K/V tile j of this tile into ring position it.
        auto load_kv = [&](int j) {
            const int st = it % STAGES;
            const uint32_t free_parity = ((it / STAGES) & 1) ^ 1;
            // Tile j of `map` into dst: with clusters our CTA's slabs, to both CTAs (the
            // other CTA's land on our barrier as well, and may count before our
            // expect_tx: the phase cannot complete before this thread's arrival).
            auto load_tile = [&](auto n, uint32_t dst, const CUtensorMap* map, uint32_t bar) {
                if constexpr (CL > 1) {
                    static_assert(decltype(n)::value == SLABS, "clusters: V as wide as K (DP != 192)");
#pragma unroll
                    for (int h = 0; h < SLABS / CL; ++h) {
                        const int s = h * CL + crank;
                        tma_load_4d_multicast(dst + s * BC * ROWB, map, bar, s * FC_SLAB_COLS, j * BC, t.hk, t.b,
                                              (1u << CL) - 1);
                    }
                } else {
                    load_slabs(n, dst, map, bar, BC, j * BC - lead, t.hk, t.b);
                }
            };
            TR_TIME(TR_W_K, mbar_wait(k_empty + 8 * st, free_parity));  // K slot st is free (in both CTAs)
            mbar_expect_tx(k_full + 8 * st, Tile::K_BYTES);
            load_tile(QKSlabs{}, sK + st * Tile::K_BYTES, &args.k_map, k_full + 8 * st);
            TR_TIME(TR_W_V, mbar_wait(v_empty + 8 * st, free_parity));  // V slot st is free (in both CTAs)
            mbar_expect_tx(v_full + 8 * st, Tile::V_BYTES);
            load_tile(VSlabs{}, sV + st * Tile::V_BYTES, &args.v_map, v_full + 8 * st);
        };
        const int kv0 = TAIL || WIN ? t.kv0 : 0;  // (a tail piece's, or a window's, first K/V tile)
        int j0 = kv0;
        if constexpr (Tile::Q_HALVES) {  // the second consumer's rows, behind the first K/V tile
            if (t.n_blocks > kv0) {
                load_kv(kv0);
                ++it;
                j0 = kv0 + 1;
            }
            load_q(t, local, 1);
        }
        for (int j = j0; j < t.n_blocks; ++j, ++it) {
            load_kv(j);
            if constexpr (ahead) {
                if (j == kv0 + 1 && nxt < pos.end()) {  // the next tile's Q, early
                    tn = coord_at(nxt);
                    load_q(tn, local + 1, 0);
                }
            }
        }
        if constexpr (ahead) {
            if (t.n_blocks - kv0 < 2 && nxt < pos.end()) {  // (a tile of 0 or 1 K/V tiles)
                tn = coord_at(nxt);
                load_q(tn, local + 1, 0);
            }
        }
        TR_SET(TR_END);
        TR_VAL(TR_BLOCKS, t.n_blocks - kv0);
        TR_FLUSH();
        if constexpr (ahead) {
            t = tn;
            tile = nxt;
        } else {
            tile = next_tile(tile);
        }
    }
    if constexpr (DYN) {  // no tile left: the sentinel, in the next Q buffer's slot (Q_HALVES: both)
#pragma unroll 1
        for (int half = 0; half < (Tile::Q_HALVES ? 2 : 1); ++half) {
            const int qbar = Tile::Q_HALVES ? half : local % Q_BUFS;
            mbar_wait(q_empty + 8 * qbar, ((local / Q_BUFS) & 1) ^ 1);  // the slot's previous tile is finished
            st_shared_v4_s32(info + 16 * qbar, 0, 0, 0, -1);
            mbar_arrive(q_full + 8 * qbar);  // (no load: releases the sentinel to the consumers)
        }
    }
    if constexpr (CL > 1) {
        // The other CTA's consumers arrive on our empty barriers until they release
        // their last slot: this CTA stays until every slot is free again (which
        // also means both CTAs have read everything either producer loaded).
#pragma unroll 1
        for (int i = 0; i < STAGES; ++i, ++it) {
            const uint32_t free_parity = ((it / STAGES) & 1) ^ 1;
            mbar_wait(k_empty + 8 * (it % STAGES), free_parity);
            mbar_wait(v_empty + 8 * (it % STAGES), free_parity);
        }
    }
}
