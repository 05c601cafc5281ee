// harness.cu -- standalone check and timing of the flashcore kernels, no torch.
//
//   build/harness check [kernel] [small|paths]
//                                     correctness grid vs the C CPU path (fp32 inputs, fp64 sums);
//                                     `small` keeps the cases small enough for compute-sanitizer;
//                                     `paths` the larger ones that reach the Hopper kernels' schedules
//                                     (persistent CTAs, CTA pairs, row plans, windows over many tiles)
//                                     FC_CHECK_D=192 keeps the cases of one head dim (check, check-bwd)
//   build/harness bench [kernel]      TFLOP/s on the standard grid (CUDA events, median of runs)
//   build/harness check-bwd [kernel] [small|paths]
//                                     backward: GPU forward for O and LSE, then fc_attn_bwd on the
//                                     kernel against the CPU path (same values in fp32), twice;
//                                     FC_DETERMINISTIC=1 makes the calls deterministic (dq must rerun
//                                     bit-identical; bench-bwd times them so too)
//   build/harness bench-bwd [kernel] [B Hq Hkv Sq Sk D causal reps]
//                                     backward TFLOP/s (2.5x the forward's FLOPs), fp16, CUDA events;
//                                     FC_DV=128 gives the case of args v's own head dim
//   build/harness shape kernel B Hq Hkv Sq Sk D causal reps [flush]
//                                     (shape, host and bench-bwd: FC_WINDOW=left,right adds a window)
//                                     times one fp16 case (for ncu or a quick A/B); flush before
//                                     each launch: 0 none (default), 1 zero-fill (as do_bench), 2 read
//   build/harness host kernel B Hq Hkv Sq Sk D causal
//                                     host time of one fc_attn_fwd call (loops of back-to-back calls)
//   build/harness cases check|check-bwd kernel [small|paths]
//                                     lists the cases check or check-bwd would run (no GPU needed)
//   build/harness trace sm90 B Hq Hkv Sq Sk D causal FILE
//                                     (a -DFC_SM90_TRACE build) the Hopper kernel's timeline of one
//                                     launch after an L2 flush, written to FILE (scripts/sm90_trace.py)
//
// kernel: auto (default), sm80 or sm90. Builds with nvcc on a machine without
// a GPU (scripts/build_harness.sh) and runs on the GPU machine as is. Exit
// status 0 only if every case passes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../flashcore.h"
#include "../kernels.h"
#ifdef FC_SM90_TRACE
#include "../sm90/trace.cuh"
#include "../sm90/tensor_map.h"
#endif

#define CUDA_OK(x)                                                                          \
    do {                                                                                    \
        cudaError_t e_ = (x);                                                               \
        if (e_ != cudaSuccess) {                                                            \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(2);                                                                        \
        }                                                                                   \
    } while (0)

struct Case {
    int B, Hq, Hkv, Sq, Sk, D;
    fc_causal causal;
    fc_dtype dtype;
    bool bshd;  // inputs laid out (B, S, H, D) and passed as a strided view
    bool dlse = false;  // backward only: pass a random LSE gradient too
    bool win = false;   // a sliding window (fc_attn_params' window; causal names its diagonal)
    int wl = 0, wr = 0; // window_left, window_right
    int Dv = 0;         // v's own head dim (0: D); v, o, dout and dv keep rows of D elements, of
                        // which the first Dv are read and written
    bool path = false;  // one of the `paths` selection (see select_cases)
};

// "B=2 Hq=8 Hkv=2 Sq=113 Sk=203 D=64 Dv=64 causal=1 fp16 bshd dlse window=40,17": a case, for the logs.
static std::string case_label(const Case& c) {
    char buf[192];
    snprintf(buf, sizeof buf, "B=%d Hq=%d Hkv=%d Sq=%d Sk=%d D=%d Dv=%d causal=%d %s%s%s", c.B, c.Hq, c.Hkv, c.Sq,
             c.Sk, c.D, c.Dv ? c.Dv : c.D, (int)c.causal, c.dtype == FC_DTYPE_FP16 ? "fp16" : "bf16",
             c.bshd ? " bshd" : "", c.dlse ? " dlse" : "");
    return c.win ? std::string(buf) + " window=" + std::to_string(c.wl) + "," + std::to_string(c.wr) : buf;
}

// FC_WINDOW="left,right" gives the cases of shape, host and bench-bwd a window (ab.sh passes it on).
static void window_from_env(Case* c) {
    const char* e = getenv("FC_WINDOW");
    if (!e || !*e) return;
    c->win = sscanf(e, "%d,%d", &c->wl, &c->wr) == 2;
}

static uint16_t to_bits(float f, fc_dtype dt) {
    if (dt == FC_DTYPE_FP16) { __half h = __float2half_rn(f); uint16_t b; memcpy(&b, &h, 2); return b; }
    __nv_bfloat16 h = __float2bfloat16_rn(f); uint16_t b; memcpy(&b, &h, 2); return b;
}
static float from_bits(uint16_t b, fc_dtype dt) {
    if (dt == FC_DTYPE_FP16) { __half h; memcpy(&h, &b, 2); return __half2float(h); }
    __nv_bfloat16 h; memcpy(&h, &b, 2); return __bfloat162float(h);
}

// Element strides (batch, head, row) of a (B, H, S, D) tensor stored as BHSD or BSHD.
static void strides(const Case& c, int H, int S, int64_t s[3]) {
    if (c.bshd) { s[0] = (int64_t)S * H * c.D; s[1] = c.D; s[2] = (int64_t)H * c.D; }
    else { s[0] = (int64_t)H * S * c.D; s[1] = (int64_t)S * c.D; s[2] = c.D; }
}

static void fill_params(fc_attn_params* p, const Case& c, const void* q, const void* k, const void* v, void* o,
                        float* lse, fc_dtype dt, fc_kernel kernel) {
    memset(p, 0, sizeof(*p));
    p->q = q; p->k = k; p->v = v; p->o = o; p->lse = lse;
    int64_t s[3];
    strides(c, c.Hq, c.Sq, s); p->q_batch_stride = s[0]; p->q_head_stride = s[1]; p->q_row_stride = s[2];
    strides(c, c.Hkv, c.Sk, s);
    p->k_batch_stride = p->v_batch_stride = s[0]; p->k_head_stride = p->v_head_stride = s[1];
    p->k_row_stride = p->v_row_stride = s[2];
    // o in the case's layout too (BSHD cases: a strided O, as a caller's view of a (B, S, H, D) buffer)
    strides(c, c.Hq, c.Sq, s); p->o_batch_stride = s[0]; p->o_head_stride = s[1]; p->o_row_stride = s[2];
    p->B = c.B; p->Hq = c.Hq; p->Hkv = c.Hkv; p->Sq = c.Sq; p->Sk = c.Sk; p->D = c.D;
    p->dtype = dt; p->scale = 1.f / sqrtf((float)c.D); p->causal = c.causal; p->kernel = kernel;
    p->window = c.win; p->window_left = c.win ? c.wl : 0; p->window_right = c.win ? c.wr : 0;
    p->Dv = c.Dv;
}

// Runs one case on the GPU, twice, and compares with the CPU path on the same values in fp32.
static bool check_case(const Case& c, fc_kernel kernel, std::mt19937& rng) {
    const size_t nq = (size_t)c.B * c.Hq * c.Sq * c.D, nk = (size_t)c.B * c.Hkv * c.Sk * c.D;
    const size_t nlse = (size_t)c.B * c.Hq * c.Sq;
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<uint16_t> hq(nq), hk(nk), hv(nk);
    std::vector<float> fq(nq), fk(nk), fv(nk);  // the same values in fp32
    for (size_t i = 0; i < nq; ++i) { hq[i] = to_bits(nd(rng), c.dtype); fq[i] = from_bits(hq[i], c.dtype); }
    for (size_t i = 0; i < nk; ++i) { hk[i] = to_bits(nd(rng), c.dtype); fk[i] = from_bits(hk[i], c.dtype); }
    for (size_t i = 0; i < nk; ++i) { hv[i] = to_bits(nd(rng), c.dtype); fv[i] = from_bits(hv[i], c.dtype); }

    std::vector<float> ref(nq), ref_lse(nlse);
    fc_attn_params p;
    fill_params(&p, c, fq.data(), fk.data(), fv.data(), ref.data(), ref_lse.data(), FC_DTYPE_FP32, FC_KERNEL_CPU);
    const fc_status ref_st = fc_attn_fwd(&p, nullptr);
    if (ref_st != FC_OK) { printf("cpu path failed the case: %s\n", fc_status_string(ref_st)); return false; }

    void *dq, *dk, *dv, *dout;
    float* dlse;
    CUDA_OK(cudaMalloc(&dq, nq * 2)); CUDA_OK(cudaMalloc(&dk, nk * 2)); CUDA_OK(cudaMalloc(&dv, nk * 2));
    CUDA_OK(cudaMalloc(&dout, nq * 2)); CUDA_OK(cudaMalloc(&dlse, nlse * 4));
    CUDA_OK(cudaMemcpy(dq, hq.data(), nq * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dk, hk.data(), nk * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dv, hv.data(), nk * 2, cudaMemcpyHostToDevice));
    fill_params(&p, c, dq, dk, dv, dout, dlse, c.dtype, kernel);
    p.workspace_bytes = fc_attn_fwd_workspace_size(&p);  // split-KV scratch, 0 when none
    if (p.workspace_bytes) {  // kept zero between the runs (counters_zeroed), and checked to be
        CUDA_OK(cudaMalloc(&p.workspace, p.workspace_bytes));
        CUDA_OK(cudaMemset(p.workspace, 0, p.workspace_bytes));
        p.counters_zeroed = 1;
    }

    std::vector<uint16_t> out[2];
    std::vector<float> lse[2];
    bool ok = true;
    for (int run = 0; run < 2; ++run) {
        CUDA_OK(cudaMemset(dout, 0xff, nq * 2));  // NaN in fp16 and bf16
        CUDA_OK(cudaMemset(dlse, 0xff, nlse * 4));
        char why[512];
        fc_status st = fc_attn_fwd_check(&p, why, sizeof(why));
        if (st != FC_OK) { printf("refused: %s", why); ok = false; break; }
        st = fc_attn_fwd(&p, nullptr);
        CUDA_OK(cudaDeviceSynchronize());
        if (st != FC_OK) { printf("launch failed: %s\n", fc_status_string(st)); ok = false; break; }
        if (p.workspace) {  // counters_zeroed: the call leaves its workspace all zero
            std::vector<unsigned char> ws(p.workspace_bytes);
            CUDA_OK(cudaMemcpy(ws.data(), p.workspace, ws.size(), cudaMemcpyDeviceToHost));
            if (std::any_of(ws.begin(), ws.end(), [](unsigned char x) { return x != 0; })) {
                printf("workspace not left zero\n");
                ok = false;
                break;
            }
        }
        out[run].resize(nq); lse[run].resize(nlse);
        CUDA_OK(cudaMemcpy(out[run].data(), dout, nq * 2, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(lse[run].data(), dlse, nlse * 4, cudaMemcpyDeviceToHost));
    }
    cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(dout); cudaFree(dlse);
    if (p.workspace) cudaFree(p.workspace);
    if (!ok) return false;

    const float tol = c.dtype == FC_DTYPE_FP16 ? 4e-3f : 3e-2f;  // abs, on O(1) outputs; P is rounded to dtype
    const int dv_cols = c.Dv ? c.Dv : c.D;
    double max_err = 0, max_lse_err = 0;
    size_t bad = 0, nan = 0, lse_bad = 0;
    for (size_t i = 0; i < nq; ++i) {
        if ((int)(i % c.D) >= dv_cols) {  // o's columns past Dv: never written (the poison stands)
            if (out[0][i] != 0xffff) ++bad;
            continue;
        }
        const float g = from_bits(out[0][i], c.dtype);
        if (!std::isfinite(g)) { ++nan; continue; }
        const double e = fabs((double)g - ref[i]);
        max_err = std::max(max_err, e);
        if (e > tol + tol * fabs(ref[i])) ++bad;
    }
    for (size_t i = 0; i < nlse; ++i) {
        if (std::isinf(ref_lse[i]) || std::isinf(lse[0][i])) {
            if (lse[0][i] != ref_lse[i]) ++lse_bad;
            continue;
        }
        const double e = fabs((double)lse[0][i] - ref_lse[i]);
        if (!(e <= 1e-3 + 1e-4 * fabs(ref_lse[i]))) ++lse_bad;
        if (std::isfinite(e)) max_lse_err = std::max(max_lse_err, e);
    }
    const bool same = out[0] == out[1] && memcmp(lse[0].data(), lse[1].data(), nlse * 4) == 0;
    const bool pass = bad == 0 && nan == 0 && lse_bad == 0 && same;
    printf("%s %s  max_err=%.2e lse_err=%.2e bad=%zu nan=%zu lse_bad=%zu rerun=%s\n", pass ? "PASS" : "FAIL",
           case_label(c).c_str(), max_err, max_lse_err, bad, nan, lse_bad, same ? "same" : "DIFFERS");
    return pass;
}

// Sliding-window cases {Sq, Sk, window_left, window_right} (run with both causal alignments as the
// diagonal): causal and two-sided windows, each side alone, rows that see no key, decode, many tiles.
static const int WINDOW_CASES[][4] = {{1000, 1000, 255, 0}, {113, 203, 40, 17}, {203, 113, 17, -1},
                                      {700, 2100, -1, 64},  {1, 4100, 1023, 0}, {1500, 1600, 300, 200}};

// small: only cases with Sq * Sk <= SMALL_CASE (for compute-sanitizer runs).
static constexpr long SMALL_CASE = 120000;

// Which cases of a grid run: all; `small` ones; or `paths`, the larger cases marked `path` (one dtype
// of each: the schedules do not depend on it) and the windows past SMALL_CASE, which reach the
// schedules small cases do not (several tiles or items per CTA, CTA pairs, row plans), for
// compute-sanitizer runs of those.
enum Select { SELECT_ALL, SELECT_SMALL, SELECT_PATHS, SELECT_BAD };

// argv[i] if given: small, paths, or SELECT_BAD (after a message) for any other word.
static Select select_from_arg(int argc, char** argv, int i) {
    if (argc <= i) return SELECT_ALL;
    const std::string a = argv[i];
    if (a == "small") return SELECT_SMALL;
    if (a == "paths") return SELECT_PATHS;
    fprintf(stderr, "harness: '%s' is not a case selection (small or paths, or none for all)\n", a.c_str());
    return SELECT_BAD;
}

static void select_cases(std::vector<Case>& cases, Select sel) {
    auto small = [](const Case& c) { return (long)c.Sq * c.Sk <= SMALL_CASE; };
    if (sel == SELECT_SMALL)
        cases.erase(std::remove_if(cases.begin(), cases.end(), [&](const Case& c) { return !small(c); }),
                    cases.end());
    if (sel == SELECT_PATHS)
        cases.erase(std::remove_if(cases.begin(), cases.end(),
                                   [&](const Case& c) { return !(c.path || (c.win && !small(c))); }),
                    cases.end());
}

// FC_CHECK_D=192 keeps the cases of that head dim D (compute-sanitizer runs of one kernel); false
// (after a message) if it is not a number > 0.
static bool keep_head_dim(std::vector<Case>& cases) {
    const char* only_d = getenv("FC_CHECK_D");
    if (!only_d) return true;
    const int d = atoi(only_d);
    if (d <= 0) { printf("FC_CHECK_D=%s: not a head dim\n", only_d); return false; }
    cases.erase(std::remove_if(cases.begin(), cases.end(), [d](const Case& c) { return c.D != d; }), cases.end());
    return true;
}

// The forward's correctness grid for kernel (v's own head dim on sm90 only).
static std::vector<Case> check_cases(fc_kernel kernel) {
    std::vector<Case> cases;
    const fc_causal modes[3] = {FC_CAUSAL_NONE, FC_CAUSAL_TOP_LEFT, FC_CAUSAL_BOTTOM_RIGHT};
    const int lens[][2] = {{512, 512}, {1, 1}, {17, 17}, {97, 97}, {1000, 1000}, {1025, 1025},
                           {113, 203}, {203, 113}, {1024, 1023}, {1, 777}, {300, 20}};
    for (int D : {64, 128, 256})
        for (auto& l : lens)
            for (fc_causal m : modes)
                cases.push_back({1, 2, 2, l[0], l[1], D, m, (D == 128 ? FC_DTYPE_BF16 : FC_DTYPE_FP16), false});
    for (fc_dtype dt : {FC_DTYPE_FP16, FC_DTYPE_BF16})
        for (fc_causal m : modes) {
            cases.push_back({2, 8, 8, 512, 512, 64, m, dt, false});     // seed shape
            cases.push_back({1, 8, 8, 512, 512, 64, m, dt, false});     // seed shape
            cases.push_back({2, 4, 4, 257, 300, 128, m, dt, true});     // strided (B, S, H, D) view
            cases.push_back({2, 8, 2, 130, 129, 128, m, dt, false});    // GQA 4:1
            cases.push_back({1, 4, 1, 64, 1100, 256, m, dt, false});    // MQA
            const size_t first_path = cases.size();  // from here to the decode cases: `paths` (fp16)
            cases.push_back({3, 16, 4, 700, 900, 64, m, dt, false});    // more tiles than SMs (persistent CTAs)
            cases.push_back({2, 16, 8, 640, 700, 128, m, dt, false});   // sm90: 128-row tiles (no key split)
            cases.push_back({2, 8, 4, 600, 2100, 128, m, dt, false});   // sm90 D128: long rows (LONG instantiation)
            cases.push_back({2, 8, 4, 700, 4200, 128, m, dt, false});   // sm90 D128: CTA pairs (clusters), GQA, partial block
            cases.push_back({1, 2, 2, 4352, 4100, 128, m, dt, false});  // sm90 D128: CTA pairs, Sq > Sk
            cases.push_back({2, 8, 4, 768, 2100, 256, m, dt, false});   // sm90 D256: CTA pairs
            cases.push_back({2, 16, 4, 1500, 2100, 256, m, dt, false}); // sm90 D256: pairs, causal: a host plan (192 pair tiles)
            cases.push_back({2, 9, 3, 1000, 6000, 128, m, dt, false});  // sm90 D128 pairs: split tail, 3-piece tiles
            cases.push_back({2, 12, 4, 1000, 4500, 96, m, dt, false});  // sm90 D96 pairs: split tail, D < 128
            cases.push_back({4, 16, 4, 4100, 128, 64, m, dt, false});  // sm90 D64: 192-row tiles, causal too
            cases.push_back({8, 16, 8, 1000, 700, 64, m, dt, false});  // sm90 D64: two padding consumers, rotated blocks
            cases.push_back({4, 16, 4, 1500, 3000, 64, m, dt, false}); // sm90 D64: 192-key K/V tiles (non-causal), GQA
            cases.push_back({4, 16, 4, 2000, 2100, 64, m, dt, false}); // sm90 D64: non-causal, a row plan (blocks of 80 rows)
            // sm90 D64 on 192-key tiles: non-causal with leads of 128, 174 and 64 keys; causal in
            // the dynamic order for rows of 2100 and 2048 keys (2600 x 2048 bottom-right: rows of no key)
            cases.push_back({2, 16, 4, 700, 4096, 64, m, dt, false});
            cases.push_back({2, 16, 4, 700, 4050, 64, m, dt, false});
            cases.push_back({2, 16, 4, 2100, 2100, 64, m, dt, false});
            cases.push_back({2, 16, 4, 2600, 2048, 64, m, dt, false});
            cases.push_back({2, 16, 4, 600, 2100, 128, m, dt, false});  // sm90 D128 causal: 192-row tiles, GQA
            cases.push_back({1, 16, 4, 2200, 2100, 128, m, dt, false}); // sm90 D128 causal: merged last window
            cases.push_back({2, 16, 4, 600, 4100, 128, m, dt, false});  // sm90 D128 causal: windows capped to the L2
            cases.push_back({4, 32, 8, 550, 2300, 64, m, dt, false});   // sm90 D64 causal: the dynamic order, capped windows
            for (size_t i = first_path; i < cases.size(); ++i) cases[i].path = dt == FC_DTYPE_FP16;
            cases.push_back({2, 32, 8, 1, 4100, 128, m, dt, false});    // decode: split-KV, GQA 4:1
            cases.push_back({1, 4, 1, 4, 1500, 256, m, dt, false});     // decode: Sq 4, MQA
        }
    // sm90 D64 causal in the dynamic order on 192-key K/V tiles (long rows, GQA)
    cases.push_back({4, 16, 4, 768, 8192, 64, FC_CAUSAL_BOTTOM_RIGHT, FC_DTYPE_FP16, false});
    cases.back().path = true;
    for (int D : {8, 40, 72, 96, 136, 200, 248})
        cases.push_back({1, 2, 1, 150, 170, D, FC_CAUSAL_TOP_LEFT, FC_DTYPE_FP16, D % 16 == 8});
    for (int D : {64, 128, 256})
        for (fc_causal m : {FC_CAUSAL_TOP_LEFT, FC_CAUSAL_BOTTOM_RIGHT})
            for (const auto& w : WINDOW_CASES) {
                Case c = {2, 8, 2, w[0], w[1], D, m, D == 128 ? FC_DTYPE_BF16 : FC_DTYPE_FP16, false};
                c.win = true; c.wl = w[2]; c.wr = w[3];
                cases.push_back(c);
            }
    // v's own head dim (the sm90 kernels at D > 128; others refuse it): MLA's 192 / 128 on its own tile
    // (GQA, a (B, S, H, D) view, several tiles per head, a window), 256 / 64 and 184 / 136 on D = 256's
    if (kernel == FC_KERNEL_SM90)
        for (fc_causal m : modes) {
            const Case own[5] = {{2, 8, 2, 200, 333, 192, m, FC_DTYPE_FP16, false},
                                 {1, 8, 2, 129, 70, 192, m, FC_DTYPE_BF16, true},
                                 {2, 16, 4, 1024, 1100, 192, m, FC_DTYPE_FP16, false},
                                 {1, 4, 1, 150, 170, 256, m, FC_DTYPE_BF16, false},
                                 {2, 4, 2, 190, 150, 184, m, FC_DTYPE_FP16, false}};
            const int dvs[5] = {128, 128, 128, 64, 136};
            for (int i = 0; i < 5; ++i) {
                cases.push_back(own[i]);
                cases.back().Dv = dvs[i];
                cases.back().path = i == 2;  // several tiles per head
            }
            if (m != FC_CAUSAL_NONE) {
                Case c = {2, 8, 2, 300, 400, 192, m, FC_DTYPE_FP16, false};
                c.Dv = 128; c.win = true; c.wl = 33; c.wr = 0;
                cases.push_back(c);
            }
        }
    return cases;
}

static std::vector<Case> check_bwd_cases(fc_kernel kernel);

// The cases of check (bwd: check-bwd) for kernel with selection sel and FC_CHECK_D; false (after
// a message) if FC_CHECK_D is not a head dim.
static bool grid_cases(bool bwd, fc_kernel kernel, Select sel, std::vector<Case>* cases) {
    *cases = bwd ? check_bwd_cases(kernel) : check_cases(kernel);
    select_cases(*cases, sel);
    return keep_head_dim(*cases);
}

// ---------------------------------------------------------------------------
// Backward check: the GPU forward gives O and LSE, then fc_attn_bwd runs on the
// GPU (sm80 kernel) and on the CPU path with the same values in fp32.

// FC_DETERMINISTIC=1: backward calls are deterministic (dq must rerun bit-identical).
static bool bwd_deterministic() {
    const char* e = getenv("FC_DETERMINISTIC");
    return e && atoi(e) != 0;
}

// Strides of the backward's tensors: q, k, v, o, dout, dq, dk, dv in the case's
// layout (o as fill_params makes the forward write it).
static void fill_bwd_params(fc_attn_bwd_params* p, const Case& c, const void* q, const void* k, const void* v,
                            const void* o, const void* dout, const float* lse, const float* dlse, void* dq,
                            void* dk, void* dv, fc_dtype dt, fc_kernel kernel) {
    memset(p, 0, sizeof(*p));
    p->q = q; p->k = k; p->v = v; p->o = o; p->dout = dout; p->lse = lse; p->dlse = dlse;
    p->dq = dq; p->dk = dk; p->dv = dv;
    int64_t s[3];
    strides(c, c.Hq, c.Sq, s);
    p->q_batch_stride = p->do_batch_stride = p->dq_batch_stride = s[0];
    p->q_head_stride = p->do_head_stride = p->dq_head_stride = s[1];
    p->q_row_stride = p->do_row_stride = p->dq_row_stride = s[2];
    strides(c, c.Hkv, c.Sk, s);
    p->k_batch_stride = p->v_batch_stride = p->dk_batch_stride = p->dv_batch_stride = s[0];
    p->k_head_stride = p->v_head_stride = p->dk_head_stride = p->dv_head_stride = s[1];
    p->k_row_stride = p->v_row_stride = p->dk_row_stride = p->dv_row_stride = s[2];
    strides(c, c.Hq, c.Sq, s); p->o_batch_stride = s[0]; p->o_head_stride = s[1]; p->o_row_stride = s[2];
    p->B = c.B; p->Hq = c.Hq; p->Hkv = c.Hkv; p->Sq = c.Sq; p->Sk = c.Sk; p->D = c.D;
    p->dtype = dt; p->scale = 1.f / sqrtf((float)c.D); p->causal = c.causal; p->kernel = kernel;
    p->window = c.win; p->window_left = c.win ? c.wl : 0; p->window_right = c.win ? c.wr : 0;
    p->deterministic = bwd_deterministic();
    p->Dv = c.Dv;
}

// Absolute floor of the backward's error bound (times the dtype tolerance),
// for N(0, 1) inputs: a gradient that is zero but for rounding (dQ and dK
// with one key: dS = dP - Delta cancels) is judged against it, not against
// its own max of about 1e-5.
static const double BWD_ATOL_SCALE = 1e-2;

// max |gpu - cpu| of one gradient (rows of D elements, the first cols of each), max |cpu| and the
// non-finite GPU values.
struct GradErr {
    double max_err = 0, max_ref = 0;
    size_t nan = 0;
};
static GradErr grad_err(const std::vector<uint16_t>& g, const std::vector<float>& ref, fc_dtype dt, int D,
                        int cols) {
    GradErr e;
    for (size_t i = 0; i < g.size(); ++i) {
        if ((int)(i % D) >= cols) continue;
        const float x = from_bits(g[i], dt);
        e.max_ref = std::max(e.max_ref, (double)fabsf(ref[i]));
        if (!std::isfinite(x)) { ++e.nan; continue; }
        e.max_err = std::max(e.max_err, fabs((double)x - ref[i]));
    }
    return e;
}

// Runs one backward case on the GPU (twice) and on the CPU path; prints the
// max error of dq, dk, dv relative to each gradient's max magnitude.
static bool check_bwd_case(const Case& c, fc_kernel kernel, std::mt19937& rng) {
    const size_t nq = (size_t)c.B * c.Hq * c.Sq * c.D, nk = (size_t)c.B * c.Hkv * c.Sk * c.D;
    const size_t nlse = (size_t)c.B * c.Hq * c.Sq;
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<uint16_t> hq(nq), hk(nk), hv(nk), hdo(nq);
    std::vector<float> fq(nq), fk(nk), fv(nk), fdo(nq), fdlse(c.dlse ? nlse : 0);
    for (size_t i = 0; i < nq; ++i) { hq[i] = to_bits(nd(rng), c.dtype); fq[i] = from_bits(hq[i], c.dtype); }
    for (size_t i = 0; i < nk; ++i) { hk[i] = to_bits(nd(rng), c.dtype); fk[i] = from_bits(hk[i], c.dtype); }
    for (size_t i = 0; i < nk; ++i) { hv[i] = to_bits(nd(rng), c.dtype); fv[i] = from_bits(hv[i], c.dtype); }
    for (size_t i = 0; i < nq; ++i) { hdo[i] = to_bits(nd(rng), c.dtype); fdo[i] = from_bits(hdo[i], c.dtype); }
    for (float& x : fdlse) x = nd(rng);

    void *dq, *dk, *dv, *ddo, *dout, *gq, *gk, *gv;
    float *dlse, *ddlse = nullptr;
    CUDA_OK(cudaMalloc(&dq, nq * 2)); CUDA_OK(cudaMalloc(&dk, nk * 2)); CUDA_OK(cudaMalloc(&dv, nk * 2));
    CUDA_OK(cudaMalloc(&ddo, nq * 2)); CUDA_OK(cudaMalloc(&dout, nq * 2)); CUDA_OK(cudaMalloc(&dlse, nlse * 4));
    CUDA_OK(cudaMalloc(&gq, nq * 2)); CUDA_OK(cudaMalloc(&gk, nk * 2)); CUDA_OK(cudaMalloc(&gv, nk * 2));
    CUDA_OK(cudaMemcpy(dq, hq.data(), nq * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dk, hk.data(), nk * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dv, hv.data(), nk * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(ddo, hdo.data(), nq * 2, cudaMemcpyHostToDevice));
    if (c.dlse) {
        CUDA_OK(cudaMalloc(&ddlse, nlse * 4));
        CUDA_OK(cudaMemcpy(ddlse, fdlse.data(), nlse * 4, cudaMemcpyHostToDevice));
    }
    std::vector<void*> to_free = {dq, dk, dv, ddo, dout, dlse, gq, gk, gv, ddlse};
    auto free_all = [&]() { for (void* x : to_free) if (x) cudaFree(x); };

    // Forward on the GPU: O and LSE.
    fc_attn_params fp;
    fill_params(&fp, c, dq, dk, dv, dout, dlse, c.dtype, FC_KERNEL_AUTO);
    fp.workspace_bytes = fc_attn_fwd_workspace_size(&fp);
    if (fp.workspace_bytes) { CUDA_OK(cudaMalloc(&fp.workspace, fp.workspace_bytes)); to_free.push_back(fp.workspace); }
    fc_status st = fc_attn_fwd(&fp, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    if (st != FC_OK) { printf("forward failed: %s\n", fc_status_string(st)); free_all(); return false; }
    std::vector<uint16_t> ho(nq);
    std::vector<float> fo(nq), flse(nlse);
    CUDA_OK(cudaMemcpy(ho.data(), dout, nq * 2, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(flse.data(), dlse, nlse * 4, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < nq; ++i) fo[i] = from_bits(ho[i], c.dtype);

    // Backward on the GPU, twice, into NaN-poisoned gradients and a garbage workspace.
    fc_attn_bwd_params bp;
    fill_bwd_params(&bp, c, dq, dk, dv, dout, ddo, dlse, ddlse, gq, gk, gv, c.dtype, kernel);
    bp.workspace_bytes = fc_attn_bwd_workspace_size(&bp);
    if (bp.workspace_bytes) { CUDA_OK(cudaMalloc(&bp.workspace, bp.workspace_bytes)); to_free.push_back(bp.workspace); }
    std::vector<uint16_t> oq[2], ok_[2], ov[2];
    for (int run = 0; run < 2; ++run) {
        CUDA_OK(cudaMemset(gq, 0xff, nq * 2)); CUDA_OK(cudaMemset(gk, 0xff, nk * 2));
        CUDA_OK(cudaMemset(gv, 0xff, nk * 2));
        if (bp.workspace) CUDA_OK(cudaMemset(bp.workspace, 0xff, bp.workspace_bytes));
        char why[512];
        st = fc_attn_bwd_check(&bp, why, sizeof(why));
        if (st != FC_OK) { printf("bwd refused: %s", why); free_all(); return false; }
        st = fc_attn_bwd(&bp, nullptr);
        CUDA_OK(cudaDeviceSynchronize());
        if (st != FC_OK) { printf("bwd launch failed: %s\n", fc_status_string(st)); free_all(); return false; }
        oq[run].resize(nq); ok_[run].resize(nk); ov[run].resize(nk);
        CUDA_OK(cudaMemcpy(oq[run].data(), gq, nq * 2, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(ok_[run].data(), gk, nk * 2, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(ov[run].data(), gv, nk * 2, cudaMemcpyDeviceToHost));
    }
    free_all();

    // The CPU path on the same values in fp32, with the GPU's O and LSE.
    std::vector<float> rq(nq), rk(nk), rv(nk);
    fill_bwd_params(&bp, c, fq.data(), fk.data(), fv.data(), fo.data(), fdo.data(), flse.data(),
                    c.dlse ? fdlse.data() : nullptr, rq.data(), rk.data(), rv.data(), FC_DTYPE_FP32, FC_KERNEL_CPU);
    st = fc_attn_bwd(&bp, nullptr);
    if (st != FC_OK) { printf("cpu bwd failed: %s\n", fc_status_string(st)); return false; }

    // Bound: max|gpu - cpu| <= tol * (max|cpu| + BWD_ATOL_SCALE), per gradient.
    const double tol = c.dtype == FC_DTYPE_FP16 ? 2e-2 : 4e-2;
    const GradErr eq = grad_err(oq[0], rq, c.dtype, c.D, c.D), ek = grad_err(ok_[0], rk, c.dtype, c.D, c.D),
                  ev = grad_err(ov[0], rv, c.dtype, c.D, c.Dv ? c.Dv : c.D);
    auto within = [&](const GradErr& e) { return e.nan == 0 && e.max_err <= tol * (e.max_ref + BWD_ATOL_SCALE); };
    const bool kv_same = ok_[0] == ok_[1] && ov[0] == ov[1], q_same = oq[0] == oq[1];
    const bool pass = within(eq) && within(ek) && within(ev) && kv_same && (q_same || !bp.deterministic);
    printf("%s %s  err/max dq %.1e (max %.2e) dk %.1e (max %.2e) dv %.1e (max %.2e) nan=%zu/%zu/%zu "
           "rerun dk,dv=%s dq=%s\n",
           pass ? "PASS" : "FAIL", case_label(c).c_str(), eq.max_err / std::max(eq.max_ref, 1e-30), eq.max_ref, ek.max_err / std::max(ek.max_ref, 1e-30), ek.max_ref,
           ev.max_err / std::max(ev.max_ref, 1e-30), ev.max_ref, eq.nan, ek.nan, ev.nan, kv_same ? "same" : "DIFFER",
           q_same ? "same" : "differs");
    return pass;
}

// The backward's correctness grid for kernel.
static std::vector<Case> check_bwd_cases(fc_kernel kernel) {
    std::vector<Case> cases;
    const fc_causal modes[3] = {FC_CAUSAL_NONE, FC_CAUSAL_TOP_LEFT, FC_CAUSAL_BOTTOM_RIGHT};
    const int lens[][2] = {{113, 203}, {203, 113}, {1, 300}, {300, 1}, {1000, 1025}, {512, 512}};
    for (int D : {64, 128, 72, 256})
        for (auto& l : lens)
            for (fc_causal m : modes)
                for (fc_dtype dt : {FC_DTYPE_FP16, FC_DTYPE_BF16}) {
                    const bool big = (long)l[0] * l[1] > SMALL_CASE;  // fewer heads on the long rows (CPU time)
                    // bf16 cases read (B, S, H, D) views and write the gradients likewise
                    cases.push_back({big ? 1 : 2, big ? 4 : 8, 2, l[0], l[1], D, m, dt, dt == FC_DTYPE_BF16});
                }
    for (fc_causal m : modes) {
        cases.push_back({2, 8, 2, 130, 257, 40, m, FC_DTYPE_FP16, true});     // D = 40, GQA 4:1
        cases.push_back({1, 4, 1, 64, 1100, 128, m, FC_DTYPE_BF16, false});   // MQA, one query block
        cases.push_back({1, 2, 2, 77, 90, 8, m, FC_DTYPE_FP16, false});       // D = 8
        cases.push_back({2, 4, 2, 150, 170, 96, m, FC_DTYPE_FP16, false, true});  // with dlse
        cases.push_back({1, 4, 4, 300, 200, 64, m, FC_DTYPE_BF16, true, true});   // with dlse, Sq > Sk
        cases.push_back({2, 4, 2, 190, 150, 136, m, FC_DTYPE_FP16, false});     // D = 136: one chunk of the 2nd half
        cases.push_back({1, 4, 1, 100, 333, 200, m, FC_DTYPE_BF16, true, true});  // D = 200, MQA, with dlse
        // more key blocks than an H100 has SMs: the Hopper kernel's persistent CTAs take several
        // (top-left with Sq < Sk: the key blocks past Sq walk no query block)
        const size_t first_path = cases.size();  // these four: `paths`
        cases.push_back({2, 8, 8, 700, 2100, 128, m, FC_DTYPE_FP16, false});
        cases.push_back({2, 8, 8, 700, 2100, 256, m, FC_DTYPE_BF16, true});
        cases.push_back({4, 8, 4, 1100, 1500, 64, m, FC_DTYPE_FP16, false, true});
        // one query block per head: items that walk one block or none, back to back (the Hopper
        // kernel takes the next item at an item's start and loads it from its only block)
        cases.push_back({2, 8, 8, 100, 2100, 64, m, FC_DTYPE_BF16, false});
        for (size_t i = first_path; i < cases.size(); ++i) cases[i].path = true;
        // v's own head dim (the sm90 kernel at D > 128; others refuse it): MLA's 192 / 128, and 256 / 64
        // with dlse on (B, S, H, D) views, and several items per CTA
        const Case own[3] = {{2, 4, 2, 190, 150, 192, m, FC_DTYPE_FP16, false},
                             {1, 4, 1, 100, 333, 256, m, FC_DTYPE_BF16, true, true},
                             {2, 8, 8, 700, 2100, 192, m, FC_DTYPE_BF16, false}};
        for (int i = 0; i < 3; ++i)
            if (kernel == FC_KERNEL_SM90) {
                cases.push_back(own[i]);
                cases.back().Dv = i == 1 ? 64 : 128;
                cases.back().path = i == 2;  // several items per CTA
            }
    }
    for (int D : {64, 128, 256})  // sliding windows (WINDOW_CASES), GQA 4:1
        for (const auto& w : WINDOW_CASES) {
            Case c = {1, 8, 2, w[0], w[1], D, w[0] < w[1] ? FC_CAUSAL_BOTTOM_RIGHT : FC_CAUSAL_TOP_LEFT,
                      D == 128 ? FC_DTYPE_BF16 : FC_DTYPE_FP16, false};
            c.win = true; c.wl = w[2]; c.wr = w[3];
            cases.push_back(c);
        }
    return cases;
}

// check (bwd: check-bwd): every case of the grid for kernel with selection sel; 1 if any failed.
static int run_check(bool bwd, fc_kernel kernel, Select sel) {
    std::mt19937 rng(bwd ? 4321 : 1234);
    std::vector<Case> cases;
    if (!grid_cases(bwd, kernel, sel, &cases)) return 2;
    int fails = 0;
    for (const Case& c : cases) fails += !(bwd ? check_bwd_case(c, kernel, rng) : check_case(c, kernel, rng));
    printf("%s: %zu cases, %d failed\n", bwd ? "check-bwd" : "check", cases.size(), fails);
    return fails ? 1 : 0;
}

// Reads n int4 so that L2 holds only clean lines of `p` afterwards.
__global__ void read_flush(const int4* p, size_t n, int* sink) {
    int acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        acc ^= p[i].x;
    if (acc == 0x7fffffff) *sink = acc;  // keeps the loads; almost never stores
}

enum Flush { FLUSH_NONE = 0, FLUSH_ZERO = 1, FLUSH_READ = 2 };
static const size_t FLUSH_BYTES = 256u << 20;  // several times any L2

// Fills n elements with N(0, 1) values in fp16/bf16 bits, on the GPU: a hash of
// (seed, index) gives two uniforms, Box-Muller turns them into one normal. Timing
// needs random-looking inputs, not the host generator's exact stream, and a host
// fill of a standard-grid case took about 2 s.
__global__ void fill_normal(uint16_t* p, size_t n, uint32_t seed, fc_dtype dt) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)seed << 32);  // splitmix64 finalizer
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
        x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
        x ^= x >> 31;
        const float u1 = ((uint32_t)x >> 8) * (1.f / 16777216.f) + (0.5f / 16777216.f);  // (0, 1]: log finite
        const float u2 = ((uint32_t)(x >> 32) >> 8) * (1.f / 16777216.f);
        const float z = sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
        if (dt == FC_DTYPE_FP16) p[i] = __half_as_ushort(__float2half_rn(z));
        else p[i] = __bfloat16_as_ushort(__float2bfloat16_rn(z));
    }
}

// fill_normal on the device buffer, then a look at its first m values: finite,
// mean and standard deviation within 6 standard errors (about 6 / sqrt(m)) of
// 0 and 1, or the timing inputs are wrong.
static void fill_inputs(void* d, size_t n, uint32_t seed, fc_dtype dt) {
    fill_normal<<<1024, 256>>>(static_cast<uint16_t*>(d), n, seed, dt);
    CUDA_OK(cudaGetLastError());
    const size_t m = std::min<size_t>(n, 1 << 16);
    std::vector<uint16_t> h(m);
    CUDA_OK(cudaMemcpy(h.data(), d, m * 2, cudaMemcpyDeviceToHost));
    double s = 0, s2 = 0;
    for (uint16_t b : h) { const double v = from_bits(b, dt); s += v; s2 += v * v; }
    const double mean = s / m, sd = sqrt(std::max(0.0, s2 / m - mean * mean));
    const double tol = 6.0 / sqrt((double)m);
    if (!std::isfinite(mean) || fabs(mean) > tol || fabs(sd - 1) > tol) {
        fprintf(stderr, "fill_inputs: %zu values with mean %.3f and sd %.3f, not N(0, 1)\n", m, mean, sd);
        exit(2);
    }
}

static const size_t ZEROED_WS_BYTES = 256;  // = the binding's kept-zero workspace (csrc/binding.cpp)

// Device inputs of one case: q, k, v filled with N(0, 1), out and the split-KV
// workspace allocated, and the params that point at them.
struct DeviceCase {
    void *dq = nullptr, *dk = nullptr, *dv = nullptr, *dout = nullptr;
    fc_attn_params p;
    DeviceCase(const Case& c, fc_kernel kernel) {
        const size_t nq = (size_t)c.B * c.Hq * c.Sq * c.D, nk = (size_t)c.B * c.Hkv * c.Sk * c.D;
        CUDA_OK(cudaMalloc(&dq, nq * 2)); CUDA_OK(cudaMalloc(&dk, nk * 2));
        CUDA_OK(cudaMalloc(&dv, nk * 2)); CUDA_OK(cudaMalloc(&dout, nq * 2));
        fill_inputs(dq, nq, 1, c.dtype);
        fill_inputs(dk, nk, 2, c.dtype);
        fill_inputs(dv, nk, 3, c.dtype);
        fill_params(&p, c, dq, dk, dv, dout, nullptr, c.dtype, kernel);
        p.workspace_bytes = fc_attn_fwd_workspace_size(&p);
        if (p.workspace_bytes) CUDA_OK(cudaMalloc(&p.workspace, p.workspace_bytes));
        // As the binding does: a workspace of at most ZEROED_WS_BYTES (the dynamic
        // order's counter) kept zero, so no memset per call; FC_COUNTERS_ZEROED=0
        // times the memset instead.
        const char* z = getenv("FC_COUNTERS_ZEROED");
        if (p.workspace_bytes && p.workspace_bytes <= ZEROED_WS_BYTES && !(z && strcmp(z, "0") == 0)) {
            CUDA_OK(cudaMemset(p.workspace, 0, p.workspace_bytes));
            p.counters_zeroed = 1;
        }
    }
    ~DeviceCase() {
        cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(dout);
        if (p.workspace) cudaFree(p.workspace);
    }
};

// Times one case: median of `reps` launches, CUDA events. Before each launch L2
// is left as is (FLUSH_NONE), zero-filled from a 256 MB buffer, which leaves it
// full of dirty lines (FLUSH_ZERO, as triton's do_bench does), or filled with
// clean lines by reading that buffer (FLUSH_READ). -1 if a launch fails.
// Median time in us of `reps` calls of launch() (an fc_status), each between two CUDA events;
// before() runs ahead of each call, outside the timed span. -1 if a call fails (`what` names it).
template <typename Launch, typename Before>
static double median_us(Launch launch, Before before, int reps, const char* what) {
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0)); CUDA_OK(cudaEventCreate(&e1));
    std::vector<float> ts;
    for (int r = 0; r < reps; ++r) {
        before();
        CUDA_OK(cudaEventRecord(e0));
        if (launch() != FC_OK) { printf("%s launch failed\n", what); ts.clear(); break; }
        CUDA_OK(cudaEventRecord(e1));
        CUDA_OK(cudaEventSynchronize(e1));
        float ms; CUDA_OK(cudaEventElapsedTime(&ms, e0, e1)); ts.push_back(ms);
    }
    cudaEventDestroy(e0); cudaEventDestroy(e1);
    if (ts.empty()) return -1;
    std::sort(ts.begin(), ts.end());
    return ts[ts.size() / 2] * 1e3;
}

// A standard-grid case: 16k tokens (B * S), H * D = 2048, fp16, Sq = Sk, causal top-left or none.
static Case grid_case(int D, int S, bool causal) {
    const int H = 2048 / D, B = 16384 / S;
    return {B, H, H, S, S, D, causal ? FC_CAUSAL_TOP_LEFT : FC_CAUSAL_NONE, FC_DTYPE_FP16, false};
}

static double time_case(const Case& c, fc_kernel kernel, int reps, Flush flush = FLUSH_NONE) {
    DeviceCase d(c, kernel);
    void* fbuf = nullptr;
    int* sink = nullptr;
    if (flush != FLUSH_NONE) { CUDA_OK(cudaMalloc(&fbuf, FLUSH_BYTES)); CUDA_OK(cudaMalloc(&sink, 4)); }
    if (flush == FLUSH_READ) CUDA_OK(cudaMemset(fbuf, 0, FLUSH_BYTES));
    for (int i = 0; i < 5; ++i) fc_attn_fwd(&d.p, nullptr);
    const double us = median_us(
        [&] { return fc_attn_fwd(&d.p, nullptr); },
        [&] {
            if (flush == FLUSH_ZERO) CUDA_OK(cudaMemsetAsync(fbuf, 0, FLUSH_BYTES));
            if (flush == FLUSH_READ) read_flush<<<1024, 256>>>((const int4*)fbuf, FLUSH_BYTES / 16, sink);
        },
        reps, "fwd");
    if (fbuf) { cudaFree(fbuf); cudaFree(sink); }
    return us;
}

static const int HOST_CALLS = 200;  // back-to-back calls per loop: far below the launch queue's depth
static const int HOST_LOOPS = 7;

// Host cost of fc_attn_fwd (checks, split plan, tensor maps, launch): wall time
// of HOST_CALLS calls issued back to back, with no synchronization inside the
// loop, so the GPU's own time does not count; median over HOST_LOOPS loops, each
// started on an idle GPU. Prints the loops' minimum and median in us per call.
static int run_host(const Case& c, fc_kernel kernel) {
    DeviceCase d(c, kernel);
    std::vector<double> per_call;
    for (int l = 0; l < HOST_LOOPS; ++l) {
        CUDA_OK(cudaDeviceSynchronize());
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < HOST_CALLS; ++i)
            if (fc_attn_fwd(&d.p, nullptr) != FC_OK) { printf("launch failed\n"); return 1; }
        const auto t1 = std::chrono::steady_clock::now();
        per_call.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / HOST_CALLS);
    }
    CUDA_OK(cudaDeviceSynchronize());
    std::sort(per_call.begin(), per_call.end());
    printf("host us per call: min %.2f median %.2f (%d loops of %d calls)\n", per_call[0],
           per_call[per_call.size() / 2], HOST_LOOPS, HOST_CALLS);
    return 0;
}

// FLOPs as benchmarks/bench.py counts them: 4 B Hq Sq Sk D, halved for causal
// calls with Sq = Sk and no window; otherwise 4 B Hq D times the (query, key)
// pairs the mask leaves visible (kernels.h's fc_band: the causal mode, and the window).
static double case_flops(const Case& c) {
    const double dd = c.D + (c.Dv ? c.Dv : c.D);  // two matmuls: QK^T over D, PV over Dv
    const double full = 2.0 * c.B * c.Hq * (double)c.Sq * c.Sk * dd;
    if (!c.win && c.causal == FC_CAUSAL_NONE) return full;
    if (!c.win && c.Sq == c.Sk) return full / 2;
    const fc_band b = fc_band_make(c.causal, c.win, c.wl, c.wr, c.Sq, c.Sk);
    double seen = 0;
    for (long long i = 0; i < c.Sq; ++i) {
        const long long lo = b.has_lo ? std::max(0LL, i + b.lo) : 0;
        const long long hi = b.has_hi ? std::min((long long)c.Sk - 1, i + b.hi) : c.Sk - 1;
        seen += hi >= lo ? (double)(hi - lo + 1) : 0;
    }
    return 2.0 * c.B * c.Hq * dd * seen;
}

static void print_time(const Case& c, double us) {
    const double flops = case_flops(c);
    printf("%-4d %-4d %-4d %-6d %-6d %-4d %-7d %10.1f %9.1f\n", c.B, c.Hq, c.Hkv, c.Sq, c.Sk, c.D, (int)c.causal,
           us, us > 0 ? flops / us * 1e-6 : 0.0);
}

static void print_header() {
    printf("%-4s %-4s %-4s %-6s %-6s %-4s %-7s %10s %9s\n", "B", "Hq", "Hkv", "Sq", "Sk", "D", "causal", "us",
           "TFLOP/s");
}

#ifdef FC_SM90_TRACE
// One launch of `c` after a zero-fill L2 flush, preceded by 20 untraced ones,
// with the kernel's timeline records (trace.cuh) written to `path`: a header
// of five int64 (CTAs, tiles per CTA, warpgroups, slots, launch ns), then the
// records.
static int run_trace(const Case& c, fc_kernel kernel, const char* path) {
    DeviceCase d(c, kernel);
    cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    const size_t n = (size_t)prop.multiProcessorCount * FC_TRACE_TILES * FC_TRACE_WGS * FC_TRACE_EV;
    void* fbuf = nullptr;
    CUDA_OK(cudaMalloc(&fbuf, FLUSH_BYTES));
    for (int i = 0; i < 20; ++i)
        if (fc_attn_fwd(&d.p, nullptr) != FC_OK) { printf("launch failed\n"); return 1; }
    CUDA_OK(cudaMalloc(&fc_sm90_trace_buf, n * 8));
    CUDA_OK(cudaMemset(fc_sm90_trace_buf, 0, n * 8));
    CUDA_OK(cudaMemset(fbuf, 0, FLUSH_BYTES));
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0)); CUDA_OK(cudaEventCreate(&e1));
    CUDA_OK(cudaEventRecord(e0));
    if (fc_attn_fwd(&d.p, nullptr) != FC_OK) { printf("launch failed\n"); return 1; }
    CUDA_OK(cudaEventRecord(e1));
    CUDA_OK(cudaEventSynchronize(e1));
    float ms; CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
    std::vector<unsigned long long> rec(n);
    CUDA_OK(cudaMemcpy(rec.data(), fc_sm90_trace_buf, n * 8, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaFree(fc_sm90_trace_buf)); fc_sm90_trace_buf = nullptr;
    cudaFree(fbuf);
    FILE* f = fopen(path, "wb");
    if (!f) { printf("cannot write %s\n", path); return 1; }
    const long long hdr[5] = {prop.multiProcessorCount, FC_TRACE_TILES, FC_TRACE_WGS, FC_TRACE_EV, (long long)(ms * 1e6)};
    fwrite(hdr, 8, 5, f);
    fwrite(rec.data(), 8, n, f);
    fclose(f);
    print_header();
    print_time(c, ms * 1e3);
    return 0;
}
#endif

static int run_bench(fc_kernel kernel) {
    print_header();
    for (int D : {64, 128, 256})
        for (int S : {512, 1024, 2048, 4096, 8192, 16384})
            for (int causal = 0; causal < 2; ++causal) {
                const Case c = grid_case(D, S, causal);
                const double us = time_case(c, kernel, 20);
                if (us < 0) return 1;
                print_time(c, us);
            }
    return 0;
}

// The fp16 case of the `shape` and `host` arguments B Hq Hkv Sq Sk D causal(0, 1, 2).
static Case case_from_args(char** a) {
    const int causal = atoi(a[6]);
    Case c = {atoi(a[0]), atoi(a[1]), atoi(a[2]), atoi(a[3]), atoi(a[4]), atoi(a[5]),
              causal == 2 ? FC_CAUSAL_BOTTOM_RIGHT : causal ? FC_CAUSAL_TOP_LEFT : FC_CAUSAL_NONE, FC_DTYPE_FP16, false};
    window_from_env(&c);
    return c;
}

// Times fc_attn_bwd (`kernel`) on one fp16 case: inputs N(0, 1), O and LSE from
// the forward; median of `reps` calls, CUDA events. -1 if a call fails.
static double time_bwd_case(const Case& c, fc_kernel kernel, int reps) {
    DeviceCase d(c, FC_KERNEL_AUTO);
    const size_t nq = (size_t)c.B * c.Hq * c.Sq * c.D, nk = (size_t)c.B * c.Hkv * c.Sk * c.D;
    float* lse;
    void *ddo, *gq, *gk, *gv;
    CUDA_OK(cudaMalloc(&lse, (size_t)c.B * c.Hq * c.Sq * 4));
    CUDA_OK(cudaMalloc(&ddo, nq * 2)); CUDA_OK(cudaMalloc(&gq, nq * 2));
    CUDA_OK(cudaMalloc(&gk, nk * 2)); CUDA_OK(cudaMalloc(&gv, nk * 2));
    fill_inputs(ddo, nq, 4, c.dtype);
    d.p.lse = lse;
    double us = -1;
    fc_attn_bwd_params bp;
    if (fc_attn_fwd(&d.p, nullptr) == FC_OK) {
        fill_bwd_params(&bp, c, d.dq, d.dk, d.dv, d.dout, ddo, lse, nullptr, gq, gk, gv, c.dtype, kernel);
        bp.workspace_bytes = fc_attn_bwd_workspace_size(&bp);
        if (bp.workspace_bytes) CUDA_OK(cudaMalloc(&bp.workspace, bp.workspace_bytes));
        const auto launch = [&] { return fc_attn_bwd(&bp, nullptr); };
        if (median_us(launch, [] {}, 3, "bwd") >= 0)  // 3 warm-up calls
            us = median_us(launch, [] {}, reps, "bwd");
        if (bp.workspace) cudaFree(bp.workspace);
    } else {
        printf("forward failed\n");
    }
    cudaFree(lse); cudaFree(ddo); cudaFree(gq); cudaFree(gk); cudaFree(gv);
    return us;
}

// Backward FLOPs: 2.5 times the forward's (five matmuls against two).
static const double BWD_FLOP_FACTOR = 2.5;

static void print_bwd_time(const Case& c, double us) {
    const double flops = BWD_FLOP_FACTOR * case_flops(c);
    printf("%-4d %-4d %-4d %-6d %-6d %-4d %-7d %10.1f %9.1f\n", c.B, c.Hq, c.Hkv, c.Sq, c.Sk, c.D, (int)c.causal,
           us, us > 0 ? flops / us * 1e-6 : 0.0);
}

// bench-bwd: 16k tokens (B * S), H * D = 2048, fp16; or the one case of args.
static int run_bench_bwd(fc_kernel kernel, int argc, char** argv) {
    print_header();
    if (argc == 11) {
        Case c = case_from_args(argv + 3);
        if (const char* e = getenv("FC_DV")) c.Dv = atoi(e);  // v's own head dim (0: D)
        const double us = time_bwd_case(c, kernel, atoi(argv[10]));
        print_bwd_time(c, us);
        return us < 0;
    }
    for (int D : {64, 128, 256})
        for (int S : {1024, 4096})
            for (int causal = 0; causal < 2; ++causal) {
                const Case c = grid_case(D, S, causal);
                const double us = time_bwd_case(c, kernel, 20);
                if (us < 0) return 1;
                print_bwd_time(c, us);
            }
    return 0;
}

static int usage() {
    fprintf(stderr, "usage: harness check [auto|sm80|sm90] [small|paths] | bench [auto|sm80|sm90] |\n"
                    "       check-bwd [auto|sm80|sm90] [small|paths] | bench-bwd [auto|sm80|sm90] [B Hq Hkv Sq Sk D causal(0,1,2) reps] |\n"
                    "       shape [auto|sm80|sm90] B Hq Hkv Sq Sk D causal(0,1,2) reps [flush: 0 none, 1 zero, 2 read] |\n"
                    "       host [auto|sm80|sm90] B Hq Hkv Sq Sk D causal(0,1,2) |\n"
                    "       cases check|check-bwd auto|sm80|sm90 [small|paths]\n");
    return 2;
}

// cases: the cases `check` or `check-bwd` would run (with the same selection and FC_CHECK_D), one per
// line, without a GPU (which cases a sanitizer run will take, and how many).
static int run_cases(const std::string& grid, fc_kernel kernel, Select sel) {
    if (grid != "check" && grid != "check-bwd") { fprintf(stderr, "cases: check or check-bwd, not %s\n", grid.c_str()); return 2; }
    std::vector<Case> cases;
    if (!grid_cases(grid == "check-bwd", kernel, sel, &cases)) return 2;
    for (const Case& c : cases) printf("%s\n", case_label(c).c_str());
    printf("%s: %zu cases\n", grid.c_str(), cases.size());
    return 0;
}

static fc_kernel kernel_from_name(const std::string& name) {
    return name == "sm80" ? FC_KERNEL_SM80 : name == "sm90" ? FC_KERNEL_SM90 : FC_KERNEL_AUTO;
}

int main(int argc, char** argv) {
    setvbuf(stdout, nullptr, _IOLBF, 0);  // line-buffered: a log cut off by a timeout still shows the last case
    const std::string mode = argc > 1 ? argv[1] : "check";
    const std::string kname = argc > 2 ? argv[2] : "auto";
    const fc_kernel kernel = kernel_from_name(kname);
    const bool grid = mode == "check" || mode == "check-bwd" || mode == "cases";
    const Select sel = grid ? select_from_arg(argc, argv, mode == "cases" ? 4 : 3) : SELECT_ALL;
    if (sel == SELECT_BAD) return 2;
    if (mode == "cases") return argc >= 4 && argc <= 5 ? run_cases(argv[2], kernel_from_name(argv[3]), sel) : usage();
    cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s (sm_%d%d), kernel=%s\n", prop.name, prop.major, prop.minor, kname.c_str());
    if (mode == "check") return run_check(false, kernel, sel);
    if (mode == "bench") return run_bench(kernel);
    if (mode == "check-bwd") return run_check(true, kernel, sel);
    if (mode == "bench-bwd" && (argc == 3 || argc == 11)) return run_bench_bwd(kernel, argc, argv);
    if (mode == "host" && argc == 10) return run_host(case_from_args(argv + 3), kernel);
#ifdef FC_SM90_TRACE
    if (mode == "trace" && argc == 11) return run_trace(case_from_args(argv + 3), kernel, argv[10]);
#endif
    const int flush = argc == 12 ? atoi(argv[11]) : FLUSH_NONE;
    if (mode == "shape" && (argc == 11 || argc == 12) && flush >= FLUSH_NONE && flush <= FLUSH_READ) {
        // one case, fp16, e.g. for ncu or compute-sanitizer
        const Case c = case_from_args(argv + 3);
        print_header();
        const double us = time_case(c, kernel, atoi(argv[10]), (Flush)flush);
        print_time(c, us);
        return us < 0;
    }
    return usage();
}
