// ptx.cuh -- small device helpers shared by the CUDA kernels: cp.async,
// ldmatrix, mma.sync m16n8k16, fragment packing and the smem swizzle.
// Everything here is sm80+ PTX; nothing is Hopper-only.
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#define FC_DEVICE __device__ __forceinline__

static constexpr float FC_LOG2E = 1.4426950408889634f;  // log2(e): exp(x) == exp2(x * LOG2E)
static constexpr float FC_LN2 = 0.6931471805599453f;    // ln(2): converts a log2 value to a natural log

// ---------------------------------------------------------------------------
// Shared-memory addressing

FC_DEVICE uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// The GPU's global nanosecond timer (the timeline build and the tools line CTAs
// up and read the SM clock with it).
FC_DEVICE unsigned long long globaltimer_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// A tile of rows of DP elements is stored as 16-byte chunks (8 elements).
// Chunk c of row r lives at chunk position c ^ (r % 8): the 8 rows an ldmatrix
// phase reads hit 8 different 16-byte bank groups, so it is conflict-free.
// Needs DP >= 64 (at least 8 chunks per row). Returns an element offset.
//
// Because a row is a multiple of 128 bytes, the byte address of chunk c ^ x
// (x = row % 8) is swz(row, c0) ^ ((c - c0) * 16) whenever the bits of c - c0
// and c0 do not overlap: an ldmatrix that walks chunks at compile-time steps
// needs one base address per lane and one XOR with an immediate per step.
template <int DP>
FC_DEVICE int swz(int row, int chunk) {
    return row * DP + ((chunk ^ (row & 7)) << 3);
}

// ---------------------------------------------------------------------------
// cp.async: 16-byte global->shared copies that bypass registers.

// Copies 16 bytes when `valid`, else writes 16 zero bytes (src-size 0). The
// caller passes an in-bounds `src` even when invalid.
FC_DEVICE void cp_async_16(void* smem_dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem_dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}
FC_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
FC_DEVICE void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// ---------------------------------------------------------------------------
// ldmatrix: four 8x8 b16 matrices; lane l supplies the row address of matrix l/8.

// `addr` is a shared-state-space byte address (see smem_u32).
FC_DEVICE void ldmatrix_x4(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
FC_DEVICE void ldmatrix_x4_trans(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// ---------------------------------------------------------------------------
// mma.sync m16n8k16, fp32 accumulate: d += a * b.

template <typename T> FC_DEVICE void mma_16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1);

template <> FC_DEVICE void mma_16816<__half>(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <> FC_DEVICE void mma_16816<__nv_bfloat16>(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats -> one 32-bit register of two T (low half = x), round to nearest.
template <typename T> FC_DEVICE uint32_t pack2(float x, float y);
template <> FC_DEVICE uint32_t pack2<__half>(float x, float y) {
    __half2 h = __floats2half2_rn(x, y);
    return *reinterpret_cast<uint32_t*>(&h);
}
template <> FC_DEVICE uint32_t pack2<__nv_bfloat16>(float x, float y) {
    __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    return *reinterpret_cast<uint32_t*>(&h);
}

// The A fragment of an m16n8k16 step from the C fragments of two adjacent
// 8-column tiles (columns 0-7 and 8-15 of the 16-wide k step): one mma's fp32
// result fed to the next mma in T (the forward's P V; the backward's P^T dO,
// dS^T Q).
template <typename T>
FC_DEVICE void pack_a_from_c(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
    a[0] = pack2<T>(c0[0], c0[1]);
    a[1] = pack2<T>(c0[2], c0[3]);
    a[2] = pack2<T>(c1[0], c1[1]);
    a[3] = pack2<T>(c1[2], c1[3]);
}

// Programmatic dependent launch (sm90+; no-ops when compiled for older
// targets, and griddep_wait returns at once when the kernel was not launched
// as a programmatic dependent). griddep_launch_dependents lets the next
// kernel on the stream start launching; griddep_wait blocks until every
// kernel this one depends on has completed and its memory is visible.
FC_DEVICE void griddep_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
FC_DEVICE void griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// 2^x on the special-function unit; 2^-inf = +0, which masking relies on.
FC_DEVICE float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

FC_DEVICE float quad_max(float x) {  // max over the 4 lanes that share a fragment row
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
FC_DEVICE float quad_sum(float x) {  // sum over the 4 lanes that share a fragment row
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
