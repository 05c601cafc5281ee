// trace.cuh -- an optional timeline of the Hopper kernel, for finding where a
// tile's time goes. Only a build with -DFC_SM90_TRACE records anything (the
// harness's `trace` mode); in every other build the macros are empty.
//
// Record layout: for CTA c, its tile number l < FC_TRACE_TILES and warpgroup
// w (0 producer, 1.. consumers, thread 0 of each), FC_TRACE_EV 64-bit slots at
// trace[((c * FC_TRACE_TILES + l) * FC_TRACE_WGS + w) * FC_TRACE_EV]. Slots
// TR_START .. TR_END are clock64() readings; TR_W_K .. TR_TAIL are cycles summed over the
// tile's waits of one kind; TR_BLOCKS is the K/V tiles the warpgroup ran (the producer: loaded;
// a window's or a skipping consumer's own, not the tile's end index); TR_GT is %globaltimer (ns)
// at the tile's start, for lining CTAs up.
#pragma once

#include "../common/ptx.cuh"  // globaltimer_ns

#define FC_TRACE_TILES 64
#define FC_TRACE_WGS 4
#define FC_TRACE_EV 16

enum {
    TR_START = 0,    // tile start (before its Q wait)
    TR_Q = 1,        // Q has landed (producer: Q's buffer was free)
    TR_PRO = 2,      // prologue done: first S, its softmax, P packed
    TR_LOOP = 3,     // steady-state loop done (before the last P V)
    TR_LASTPV = 4,   // last P V done
    TR_END = 5,      // epilogue done (producer: last load of the tile issued)
    TR_W_K = 6,      // waits on k_full (producer: k_empty)
    TR_W_V = 7,      // waits on v_full (producer: v_empty)
    TR_W_S = 8,      // wgmma_wait<1>: S of the next tile
    TR_W_PV = 9,     // wgmma_wait<0>: P V
    TR_SOFT = 10,    // masking + softmax in the loop
    TR_ISSUE = 11,   // issuing the loop's wgmma groups
    TR_TAIL = 12,    // the loop's O rescale and P packing
    TR_BLOCKS = 13,  // K/V tiles this warpgroup ran (loaded) in this tile
    TR_GT = 14,      // globaltimer at the start
};
#define TR_ACCS 7    // accumulated slots, TR_W_K .. TR_TAIL

#ifdef FC_SM90_TRACE
// Declares the recording pointer of this thread for tile `local` (null: no record).
#define TR_DECL(args, local, wg, rec)                                                                        \
    unsigned long long* tr_ = ((rec) && (local) < FC_TRACE_TILES && (args).trace)                            \
                                  ? (args).trace + (((size_t)blockIdx.x * FC_TRACE_TILES + (local)) * FC_TRACE_WGS + \
                                                    (wg)) * FC_TRACE_EV                                      \
                                  : nullptr;                                                                 \
    unsigned tr_acc_[TR_ACCS] = {};
#define TR_SET(e) \
    do {          \
        if (tr_) tr_[e] = clock64(); \
    } while (0)
#define TR_VAL(e, v) \
    do {             \
        if (tr_) tr_[e] = (v); \
    } while (0)
#define TR_GTIME() TR_VAL(TR_GT, globaltimer_ns())
// Runs the statement and adds its cycles to accumulator e (TR_W_K .. TR_SOFT).
#define TR_TIME(e, ...)                                          \
    do {                                                         \
        const long long tr_t0_ = clock64();                      \
        __VA_ARGS__;                                             \
        tr_acc_[(e) - TR_W_K] += (unsigned)(clock64() - tr_t0_); \
    } while (0)
// TR_MARK(t) takes a clock reading; TR_SINCE(e, t) adds the cycles since it to accumulator e.
#define TR_MARK(t) const long long t = clock64()
#define TR_SINCE(e, t) tr_acc_[(e) - TR_W_K] += (unsigned)(clock64() - (t))
#define TR_FLUSH()                                                     \
    do {                                                               \
        if (tr_)                                                       \
            for (int e_ = 0; e_ < TR_ACCS; ++e_) tr_[TR_W_K + e_] = tr_acc_[e_]; \
    } while (0)
#else
#define TR_DECL(args, local, wg, rec)
#define TR_SET(e)
#define TR_VAL(e, v)
#define TR_GTIME()
#define TR_TIME(e, ...) __VA_ARGS__
#define TR_MARK(t)
#define TR_SINCE(e, t)
#define TR_FLUSH()
#endif
