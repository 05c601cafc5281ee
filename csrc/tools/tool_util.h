// tool_util.h -- host helpers shared by the standalone microbenchmarks in
// csrc/tools/ (wgmma_queue.cu, smem_rate.cu, loop_sched.cu): CUDA error reporting and the
// one-CTA-per-SM grid they all launch.
#pragma once

#include <cuda_runtime.h>
#include <stdio.h>

// Nonzero (after printing "tool: what: error") when e is an error.
static int tool_check(const char* tool, cudaError_t e, const char* what) {
    if (e != cudaSuccess) fprintf(stderr, "%s: %s: %s\n", tool, what, cudaGetErrorString(e));
    return e != cudaSuccess;
}

// The SM count of device 0, capped at max_sms (the tool's output slots), in *grid.
static int tool_sm_grid(const char* tool, int max_sms, int* grid) {
    if (tool_check(tool, cudaDeviceGetAttribute(grid, cudaDevAttrMultiProcessorCount, 0), "SM count")) return 1;
    if (*grid > max_sms) *grid = max_sms;
    return 0;
}
