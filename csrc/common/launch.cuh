// launch.cuh -- host helper shared by the kernel launchers.
#pragma once

#include <cuda_runtime.h>

#include <atomic>

// Bits of the per-kernel "limit already set" mask: devices 0..63 are cached,
// higher ordinals set the attribute on every launch (correct, just slower).
static constexpr int FC_SMEM_CACHE_DEVICES = 64;

// Raises kernel KERNEL's dynamic shared memory limit to `bytes` on the current
// device, once per device and process: cudaFuncSetAttribute is a driver call
// that otherwise runs on every launch, and it is the same every time. The
// limit lives with the function in the device's primary context, so a process
// that resets the device (cudaDeviceReset) would need it set again; torch
// never does. Racing first calls both set the same value, which is harmless.
template <auto KERNEL>
static cudaError_t fc_smem_limit_once(int bytes) {
    static std::atomic<unsigned long long> done{0};  // bit d: the limit is set on device d
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    const unsigned long long bit = dev < FC_SMEM_CACHE_DEVICES ? 1ull << dev : 0ull;
    if (bit && (done.load(std::memory_order_acquire) & bit)) return cudaSuccess;
    e = cudaFuncSetAttribute(KERNEL, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e == cudaSuccess) done.fetch_or(bit, std::memory_order_release);
    return e;
}
