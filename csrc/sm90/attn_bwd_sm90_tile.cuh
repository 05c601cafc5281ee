// attn_bwd_sm90_tile.cuh -- the Hopper backward's tile table (BwdSm90Tile,
// every tile choice of attn_bwd_sm90_kernel in one place), its named-barrier
// ids and its kernel arguments (BwdSm90Args). The algorithm is described at
// the top of attn_bwd_sm90.cuh.
#pragma once

#include <cuda.h>

#include "../flashcore.h"
#include "attn_bwd_sm90_mma.cuh"
#include "hopper.cuh"

// ---------------------------------------------------------------------------
// Tile table, per padded head dim DP (two warpgroups; BC = 128 keys per item, 64 at DP = 256).
//
//  DP  | BR  | STAGES | smem: K x KBUF,V + Q,dO ring + dS^T x 2 + dQ x 2 + LSE,Delta | registers per thread (255 max)
//  64  | 128 |   2    | 48 + 64 + 64 + 32 + 2 = 210 KB                      | S^T 64 + dP^T 64 + P^T 32 + dS^T 32
//      |     |        |                                                     | + dK, dV 32 each; dQ 32 once S^T is done
//  128 |  64 |   2    | 64 + 64 + 32 + 32 + 1 = 193 KB                      | S^T 32 + dP^T 32 + P^T 16 + dS^T 16 + dK,
//      |     |        |                                                     | dV 64 each + LSE, Delta 16 each; dQ 32
//  256 |  64 |   2    | 64 + 128 + 8 (one) + P^T 8 + exchange 16 + 0 (dQ   | S^T or dP^T 32 + dK, dV 64 each (128 of
//      |     |        | staged in the slot) + 1 = 225 KB                    | the 256 columns) + dQ 32 (BC = 64 keys)
// BR: the dQ phase gives each warpgroup one 64 x 64 wgmma tile of the
// block's dQ (BR x DP = 128 x 64 or 64 x 128): rows 64 * wg at DP = 64,
// columns 64 * wg at DP = 128, so each reads whole 128-byte swizzle slabs;
// at DP = 256 two (columns 128 * wg + 64 c).
// Two dS^T buffers: a warpgroup may store block i+1's dS^T while the other
// still reads block i's (DP = 256: one of each, as the exchange's barrier
// comes after both warpgroups' last reads of block i). STAGES: the ring loads
// one block ahead (DP = 64: up to two, EARLY_REFILL below); at DP = 64 a third
// slot and the dQ staging would pass the 227 KB a CTA may have.
template <int DP>
struct BwdSm90Tile {
    static constexpr int WGS = 2;                     // warpgroups
    static constexpr int THREADS = WGS * FC_WG_THREADS;
    static constexpr bool SPLIT_D = DP > 128;         // the warpgroups share the keys and split dK, dV's columns
    static constexpr int WG_KEYS = 64;                // keys (wgmma M rows) per warpgroup
    static constexpr int BC = SPLIT_D ? WG_KEYS : WGS * WG_KEYS;  // keys per item
    static constexpr int DH = SPLIT_D ? DP / WGS : DP;  // columns of dK, dV per warpgroup
    static constexpr int BR = DP <= 64 ? 128 : 64;    // query rows per block
    static constexpr int QW = SPLIT_D ? BR / WGS : BR;  // query rows (S^T's columns) per warpgroup
    static constexpr int STAGES = 2;                  // Q / dO / LSE / Delta slots
    static constexpr int KBUF = DP <= 64 ? 2 : 1;     // K buffers: two let the next item's K load under this one
    // The ring refills a slot as soon as both warpgroups are done with it, not at the next block's CTA
    // barrier: DP = 64 only (+1-4 % on an H100; at DP = 128 every earlier refill cost 3-10 %, perf notes,
    // session 66; DP = 256 stages its dQ in the slot). One empty barrier per slot.
    static constexpr bool EARLY_REFILL = DP == 64;
    static constexpr int EMPTY_BARS = EARLY_REFILL ? STAGES : 0;
    static constexpr int SLABS = DP / FC_SLAB_COLS;   // 64-column swizzle slabs of a K, V, Q or dO row
    static constexpr uint32_t ROWB = FC_SWZ_ROW_BYTES;
    static constexpr uint32_t KV_TILE = BC * DP * 2;  // bytes of K (or V)
    static constexpr uint32_t QDO_TILE = BR * DP * 2; // bytes of one slot's Q (or dO)
    static constexpr uint32_t SLAB = BR * ROWB;       // bytes of one 64-column slab of Q (or dO)
    // Q's next slab (SPLIT_D: Q's and dO's slabs alternate in a slot), Q's next slot, dO's first slab from Q's.
    static constexpr uint32_t QDO_SLAB_STEP = SPLIT_D ? 2 * SLAB : SLAB;
    static constexpr uint32_t SLOT_STEP = SPLIT_D ? 2 * QDO_TILE : QDO_TILE;
    static constexpr uint32_t DO_FROM_Q = SPLIT_D ? SLAB : STAGES * QDO_TILE;
    static constexpr uint32_t DS_TILE = BC * BR * 2;  // bytes of one dS^T buffer (BC key rows, BR columns)
    static constexpr uint32_t VEC = BR * 4;           // bytes of one slot's LSE (or Delta)
    static constexpr int DS_BUFS = SPLIT_D ? 1 : 2;   // dS^T buffers (see above)
    static constexpr int PT_BUFS = SPLIT_D ? 1 : 0;   // P^T buffers (SPLIT_D: P^T is stored as dS^T is)
    // SPLIT_D: the fp32 columns of S^T and dP^T the warpgroups pass each other (bwd_exchange_cols).
    static constexpr uint32_t XCHG_BYTES = SPLIT_D ? BWD_XCHG_BYTES<BR> : 0;
    static constexpr int DQ_ROWS = BWD_PIECE_ROWS;    // rows of a dQ piece (one wgmma M)
    static constexpr int DQ_COLS = BWD_PIECE_COLS;    // columns of a dQ piece (one wgmma N)
    static constexpr int DQ_PIECES = BR * DP / (WGS * BWD_PIECE);  // dQ pieces per warpgroup and block
    static constexpr uint32_t DQ_STAGE = BWD_PIECE * 4;  // bytes of one piece's staging
    static constexpr uint32_t OFF_K = 0;
    static constexpr uint32_t OFF_V = OFF_K + KBUF * KV_TILE;
    static constexpr uint32_t OFF_Q = OFF_V + KV_TILE;
    static constexpr uint32_t OFF_DO = OFF_Q + DO_FROM_Q;
    static constexpr uint32_t OFF_DS = OFF_Q + 2 * STAGES * QDO_TILE;
    static constexpr uint32_t OFF_PT = OFF_DS + DS_BUFS * DS_TILE;
    static constexpr uint32_t OFF_X = OFF_PT + PT_BUFS * DS_TILE;   // SPLIT_D: the exchange, one half per warpgroup
    static constexpr uint32_t OFF_DQ = OFF_X + XCHG_BYTES;
    static constexpr uint32_t OFF_LSE = OFF_DQ + (SPLIT_D ? 0 : WGS * DQ_STAGE);
    static constexpr uint32_t OFF_DELTA = OFF_LSE + STAGES * VEC;
    static constexpr uint32_t OFF_BAR = OFF_DELTA + STAGES * VEC;  // per K buffer, per slot, then EMPTY_BARS
    static constexpr uint32_t EPI_SLAB = WG_KEYS * ROWB;  // bytes of a 64-column slab of a warpgroup's dK (or dV)
    static constexpr uint32_t EPI_TILE = DH / FC_SLAB_COLS * EPI_SLAB;  // bytes of its dK (or dV), 16-bit
    static constexpr int NEXT_SLOTS = 2;              // int32 words passing a CTA's next item (see the kernel)
    static constexpr uint32_t OFF_NEXT = OFF_BAR + FC_MBAR_BYTES * (KBUF + STAGES + EMPTY_BARS);
    static constexpr uint32_t SMEM_BYTES = OFF_NEXT + NEXT_SLOTS * 4 + FC_SWZ_GROUP_BYTES;  // + alignment slack
    static_assert(SPLIT_D ? DQ_PIECES == DH / DQ_COLS && BR == DQ_ROWS : DQ_PIECES == 1,
                  "the dQ phase splits the block's dQ into pieces, one per warpgroup or (SPLIT_D) its columns'");
    static_assert(!SPLIT_D || (SLAB == DQ_STAGE / 2 && DH == 128 && BR == 64),
                  "SPLIT_D: a piece is staged in one slab of Q and the next of dO; dV and dK are wgmma N = 128");
    static_assert(DQ_ROWS == FC_SLAB_COLS && DQ_COLS == FC_SLAB_COLS, "a piece is one slab of dS^T's columns and of K's");
    static_assert(BWD_PIECE_THREADS == FC_WG_THREADS, "a warpgroup stages a piece in its fragment order");
    static_assert(BC % FC_BWD_KEYS_PER_CTA == 0, "dispatch's grid check (FC_BWD_KEYS_PER_CTA keys per CTA) bounds the items");
    static_assert(FC_BWD_ROW_PAD % BR == 0, "the padded LSE and Delta must cover every block's rows");
    static_assert(SMEM_BYTES <= FC_SM90_SMEM_MAX, "the tile's shared memory fits a CTA");
    static_assert(STAGES == 2, "the kernel's loads run one block ahead (an item's first block with its V)");
    static_assert(!EARLY_REFILL || (!SPLIT_D && DQ_PIECES == 1),
                  "one arrival per warpgroup and block (the kernel arrives per dQ piece); no dQ staged in the slot");
    static_assert(SPLIT_D ? 2 * EPI_TILE <= SLOT_STEP / WGS
                          : (DP == 128 ? EPI_TILE <= QDO_TILE && EPI_TILE <= DQ_STAGE : 2 * EPI_TILE <= QDO_TILE),
                  "a warpgroup's dK and dV fit the epilogue's areas (see the kernel)");
};

// Named barriers (0 is __syncthreads).
static constexpr int BWD_BAR_CTA = 1;  // both warpgroups, once per block and at an item's end
static constexpr int BWD_BAR_WG0 = 2;  // + wg: one warpgroup's dQ staging
// (4: the DP = 256 column exchange's, BWD_BAR_XCHG in attn_bwd_sm90_mma.cuh)

struct BwdSm90Args {
    CUtensorMap q_map;   // Q as (D, Sq, Hq, B), box (64, BR)
    CUtensorMap do_map;  // dO as (Dv, Sq, Hq, B), box (64, BR): columns past Dv load as zeros
    CUtensorMap k_map;   // K as (D, Sk, Hkv, B), box (64, BC)
    CUtensorMap v_map;   // V as (Dv, Sk, Hkv, B), box (64, BC): columns past Dv load as zeros
    CUtensorMap dk_map;  // dK as (D, Sk, Hkv, B), box (64, WG_KEYS): the epilogue's stores
    CUtensorMap dv_map;  // dV as (Dv, Sk, Hkv, B), box (64, WG_KEYS)
    fc_attn_bwd_params p;  // the call's params (dispatch checked them)
    int sq_pad;          // rows per head of the padded LSE and Delta (Sq rounded up to FC_BWD_ROW_PAD)
};
