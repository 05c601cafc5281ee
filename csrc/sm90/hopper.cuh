// hopper.cuh -- sm90a device helpers for the Hopper kernel: mbarriers, TMA
// tensor loads, wgmma descriptors and fences, named barriers and setmaxnreg.
// Every function is a thin wrapper over one or two PTX instructions.
#pragma once

#include <stdint.h>

#include "../common/ptx.cuh"
#include "wgmma_ops.cuh"

static constexpr int FC_WG_THREADS = 128;      // threads of a warpgroup (four warps)
static constexpr uint32_t FC_MBAR_BYTES = 8;   // one mbarrier

// ---------------------------------------------------------------------------
// mbarriers (64-bit, in shared memory; addresses are shared-space bytes)

FC_DEVICE void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initialized barriers visible to the async proxy (TMA) and to other threads.
FC_DEVICE void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

// Arrives once and adds `bytes` to the transaction count the phase waits for.
FC_DEVICE void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
FC_DEVICE void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Blocks until the phase of parity `parity` has completed. A fresh barrier is
// in phase 0, so waiting on parity 1 returns at once (the "previous" phase).
FC_DEVICE void mbar_wait(uint32_t bar, uint32_t parity) {
    asm volatile(
        "{\n.reg .pred done;\n"
        "WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT;\n"
        "}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}

// Whether the phase of parity `parity` has completed, without waiting (a fresh
// barrier passes parity 1 at once, as in mbar_wait). A true result acquires what
// the phase's arrivals released, as a completed wait does.
FC_DEVICE bool mbar_test(uint32_t bar, uint32_t parity) {
    uint32_t done;
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
    return done != 0;
}

// ---------------------------------------------------------------------------
// Clusters (thread block clusters of CTAs on neighbouring SMs)

FC_DEVICE uint32_t cluster_ctarank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
// Every thread of every CTA of the cluster: what each did before is visible to all after.
FC_DEVICE void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// The shared::cluster address of this CTA's shared address `addr` in CTA `rank` of the cluster.
FC_DEVICE uint32_t cluster_map(uint32_t addr, uint32_t rank) {
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
    return r;
}
// Arrives once on the mbarrier at shared::cluster address `bar` (this CTA's or
// another's). The default .release.cta: a consumer signals that its wgmma reads
// of a K/V slot are done, and a retired wgmma_wait already orders those; with
// .release.cluster ptxas puts MEMBAR.ALL.GPU before every arrival.
FC_DEVICE void mbar_arrive_cluster(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

FC_DEVICE void st_shared_v4_s32(uint32_t addr, int a, int b, int c, int d) {
    asm volatile("st.shared.v4.s32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}
FC_DEVICE int4 ld_shared_v4_s32(uint32_t addr) {
    int4 v;
    asm volatile("ld.shared.v4.s32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr) : "memory");
    return v;
}
FC_DEVICE void st_shared_f32(uint32_t addr, float v) {
    asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
}

// ---------------------------------------------------------------------------
// TMA: one box of a 4-D tensor map into shared memory, completing on `bar`.
// Coordinates are (col, row, head, batch); out-of-range elements read as 0.

FC_DEVICE void tma_load_4d(uint32_t dst, const void* tensor_map, uint32_t bar, int c0, int c1, int c2, int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
        "[%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(dst),
        "l"((uint64_t)tensor_map), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
        : "memory");
}
// One box from shared memory at src (laid out as tma_load_4d leaves it) into a 4-D tensor map,
// as one bulk async operation of this thread's current bulk group (bulk_commit closes it).
// Elements outside the tensor are not written.
FC_DEVICE void tma_store_4d(const void* tensor_map, uint32_t src, int c0, int c1, int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
                     (uint64_t)tensor_map),
                 "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}
// The same load delivered to every CTA of `cta_mask` (bit r: cluster rank r), at
// dst in each, each completing its bytes on the mbarrier at `bar` in that CTA.
FC_DEVICE void tma_load_4d_multicast(uint32_t dst, const void* tensor_map, uint32_t bar, int c0, int c1, int c2,
                                     int c3, uint16_t cta_mask) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster "
        "[%0], [%1, {%3, %4, %5, %6}], [%2], %7;\n" ::"r"(dst),
        "l"((uint64_t)tensor_map), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "h"(cta_mask)
        : "memory");
}
// A contiguous copy of `bytes` (a multiple of 16; both addresses 16-byte
// aligned) from global memory into shared memory, completing on `bar`.
FC_DEVICE void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(__cvta_generic_to_global(src)), "r"(bytes), "r"(bar)
                 : "memory");
}
// Adds `bytes` (a multiple of 16) of fp32 at shared address src to global dst
// (both 16-byte aligned), elementwise, as one bulk async operation of this
// thread's current bulk group (bulk_commit closes it).
FC_DEVICE void bulk_reduce_add_f32(void* dst, uint32_t src, uint32_t bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(
                     __cvta_generic_to_global(dst)), "r"(src),
                 "r"(bytes)
                 : "memory");
}
FC_DEVICE void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's bulk groups are pending their reads of shared memory.
template <int N>
FC_DEVICE void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory"); }
// Waits until at most N of this thread's bulk groups are pending (writes done).
template <int N>
FC_DEVICE void bulk_wait() { asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory"); }
FC_DEVICE void tma_prefetch_map(const void* tensor_map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)tensor_map) : "memory");
}
// Orders this thread's generic-proxy shared-memory accesses before later
// async-proxy (TMA, wgmma) accesses of the same bytes.
FC_DEVICE void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Orders this thread's generic-proxy global-memory accesses with its async-proxy ones (both ways).
FC_DEVICE void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }

// ---------------------------------------------------------------------------
// wgmma shared-memory descriptors, 128-byte swizzle.
//
// A tile stored as TMA writes it with CU_TENSOR_MAP_SWIZZLE_128B: 64-column
// slabs of (rows x 128 bytes), each 16-byte chunk c of row r at chunk c ^ (r % 8),
// every slab 1024-byte aligned.
//  K-major operand (Q, K: the contracted dim is contiguous): 8-row groups are
//    SBO = 1024 bytes apart; a k16 step inside a slab adds 32 bytes.
//  N-major operand (V: the output dim is contiguous): 8-row (k) groups are
//    SBO = 1024 bytes apart, 64-column slabs LBO = rows * 128 bytes apart.
static constexpr uint32_t FC_SWZ_ROW_BYTES = 128;   // one swizzled row of a slab
static constexpr uint32_t FC_SWZ_GROUP_BYTES = 1024;  // 8 rows: one swizzle period
static constexpr int FC_SLAB_COLS = 64;              // 2-byte columns per slab

FC_DEVICE uint64_t wgmma_desc(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
    return (uint64_t)((smem_addr & 0x3FFFF) >> 4) | ((uint64_t)(lbo_bytes >> 4) << 16) |
           ((uint64_t)(sbo_bytes >> 4) << 32) | (1ull << 62);  // layout type 1: 128-byte swizzle
}

static constexpr uint32_t FC_SM90_SMEM_MAX = 227 * 1024;  // dynamic shared memory a CTA may have on sm90

// The descriptor of the operand `bytes` past the one desc describes (same
// strides). The start address field holds address / 16 in 14 bits; a CTA's
// shared memory (at most 227 KB from address 0) keeps address + bytes below
// 256 KB, so the sum never carries out of the field. One add per wgmma, where
// building each descriptor from its address took five uniform instructions.
FC_DEVICE uint64_t wgmma_desc_add(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

FC_DEVICE void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
FC_DEVICE void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
FC_DEVICE void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }

// Pins accumulator registers at this point of the program: the compiler may
// not move their reads above a wgmma_wait or their writes below a wgmma issue.
template <int N>
FC_DEVICE void fence_regs(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// ---------------------------------------------------------------------------
// Warpgroup roles

// Barrier among `threads` threads (a multiple of 32) on hardware barrier `id`
// (0 is __syncthreads).
FC_DEVICE void named_barrier_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Arrives at barrier `id` without waiting (the other threads of `threads` sync on it).
FC_DEVICE void named_barrier_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
template <int REGS>
FC_DEVICE void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS)); }
template <int REGS>
FC_DEVICE void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS)); }
