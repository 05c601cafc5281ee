// binding.cpp -- the only file that includes torch. It checks the tensors,
// fills fc_attn_params, calls the C API on the current CUDA stream, and raises
// a Python exception that names the argument and the fix on any bad input.
#include <torch/extension.h>
#include <ATen/autocast_mode.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/jit/frontend/tracer.h>

#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>

#include "flashcore.h"
#include "kernels.h"

namespace {

// flashcore.attention's docstring (flashcore/__init__.py sets it).
const char* const FC_ATTENTION_DOC = R"(Scaled dot-product attention, ``softmax(scale * Q K^T) V``, fused.

Args:
    query: (B, Hq, Sq, D) tensor.
    key: (B, Hkv, Sk, D) tensor; Hkv must divide Hq (grouped-query
        attention reads each KV head in place, with no copy).
    value: (B, Hkv, Sk, Dv) tensor; Dv may differ from D, as in SDPA (out
        has Dv columns): a multiple of 8 below D runs as it is on the CPU
        and on the Hopper kernel at D > 128 (MLA's 192 / 128; not a
        split-KV decode call), other pairs at the wider of the two,
        zero-padded.
        B, H and S may be 0, as with SDPA: the output is then empty, or
        all zeros (LSE -inf) when Sk = 0.
    attn_mask: ``None``, or SDPA's mask: bool (True: the key is seen) or
        of q's dtype or float32 (added to the scaled scores), broadcasting to
        (B, Hq, Sq, Sk); with the causal mode and window on top. So far the
        CPU path runs it (forward and backward); on CUDA it raises
        ``ValueError``. A row it hides entirely gives 0 and LSE -inf.
    dropout_p: accepted for SDPA compatibility; only ``0.0`` is supported:
        another value raises ``ValueError``, a wrong type (a bool, a
        string) ``TypeError``.
    is_causal / causal: apply a causal mask (the two names are aliases);
        ``True`` or ``False`` (``causal`` also ``None``), as are
        ``enable_gqa`` and ``return_lse``.
    scale: softmax scale, default ``1/sqrt(D)``; a number of magnitude
        at most 2.3e38, and 0 or at least about 1.4e-45 (fp32's smallest):
        0 and negative scales run as q * 0 at 1 and -q at -scale (exact).
    enable_gqa: accepted for SDPA compatibility; GQA is always on.
    causal_alignment: ``"top_left"`` (default, SDPA's ``is_causal``: query
        i sees keys j <= i) or ``"bottom_right"`` (FlashAttention's, for KV
        caches: query i sees keys j <= i + Sk - Sq). Rows that see no key
        give output 0 and LSE -inf.
    return_lse: also return the log-sum-exp (natural log) of the scaled
        scores, shape (B, Hq, Sq): fp32 (fp64 for fp64 inputs).
    kernel: ``"auto"`` (default), or force ``"sm80"`` (portable
        tensor-core kernel), ``"sm90"`` (Hopper kernel) or ``"cpu"``; the
        backward runs the same family (``"auto"``: sm90 on H100/H200,
        else sm80).
    num_splits: split-KV (flash-decoding) for few query rows and long
        keys. ``None`` or ``0``: a heuristic picks the kernel and how many
        ways to split Sk across the SMs; ``1``: no split; ``n > 1``: run
        the split-KV kernel with Sk split n ways (clamped to the number of
        key tiles). GPU only; ignored on the CPU. The partial results live
        in a scratch tensor from torch's allocator.
    window: sliding-window (local) attention, ``None`` (default) or
        ``(left, right)``: query i sees keys j with i + d - left <= j <=
        i + d + right, d the diagonal of ``causal_alignment`` (0, or
        Sk - Sq for bottom_right); each side an int >= 0, or ``None`` (or
        -1) for no bound. With ``causal=True`` right must be 0 or None
        (``window=(4095, 0)``: each query sees itself and the 4095 keys
        before it, Mistral's 4096-key window). FlashAttention's
        ``window_size`` with ``causal_alignment="bottom_right"``. Blocks of
        keys outside every row's window are skipped, so the cost grows
        with the window, not with Sk. Every kernel takes it, forward and
        backward.

Dtypes: fp16 and bf16 on CUDA; fp16, bf16, fp32 and fp64 on the CPU
(fp64 in fp64 throughout, scale and LSE included: torch.autograd.gradcheck
runs). Meta tensors (the CPU's dtypes) give meta outputs of the right shapes.
Head dim D: 1 to 256 (one that is not a multiple of 8 runs zero-padded to
the next one: exact, at the cost of the copies); v's Dv: 0 to 256 (see
value; the GPU backward's limits apply to the wider of the two).
GPUs: compute capability 8.x and 9.0 (A100, L4/Ada, H100/H200); a newer
one needs a build with its own code (FLASHCORE_ARCHS).
Every tensor's last dim must be contiguous (stride 1); other strides are
free on the CPU, and on the GPU multiples of 8 elements with 16-byte
aligned pointers, so ``x.transpose(1, 2)`` of a contiguous (B, S, H, D)
tensor works as is.

SDPA's other shapes work too: q (..., Sq, D), k and v (..., Sk, D) of any
rank >= 2, dim -3 the heads (so a 3-D tensor is (H, S, D)) and the dims
before it batch dims, broadcast as SDPA broadcasts them: a dim of 1
against any size, a single query head against k's heads, k's and v's
heads against each other. They run as one (B, H, S, D) call of views; a
broadcast that no such view expresses is copied. Heads that differ and
are not 1 take the GQA rule above, where SDPA needs enable_gqa=True.

NaN in the inputs gives NaN where it is read: in every column of a row
with a NaN score, in one column for a NaN value. Sq and Sk go up to 2^30.

Autograd: gradients for q, k and v (and through ``lse`` when returned)
come from flashcore's backward, on the CPU and on CUDA for any head dim
(the Hopper backward on H100/H200; elsewhere the portable one, which at
D > 128 needs 144.5 KB of shared memory per block: A100, not sm86/89
GPUs; where the GPU cannot run the backward, an input that requires grad
raises ValueError before the forward).
dk and dv are bit-reproducible; dq is too under
``torch.use_deterministic_algorithms(True)``, where the backward sums dQ
in a fixed order (slower).
There is no double backward and no forward-mode AD.

Returns:
    ``out`` of shape (B, Hq, Sq, Dv) (SDPA's output shape for its other
    shapes) and q's dtype (under torch.autocast the autocast dtype, as
    SDPA's), or ``(out, lse)``, lse of out's shape without Dv.)";

[[noreturn]] void value_error(const std::string& msg) { throw pybind11::value_error(msg); }

// The refusal of an input that requires grad, with {name} for the argument.
// Raised by the raw entry point _C.fwd (check_inputs); flashcore.attention takes
// inputs that require grad through its custom op, whose autograd formula runs fc_attn_bwd.
const char* const FC_REQUIRES_GRAD_MSG =
    "{name}: requires grad, but this entry point has no autograd formula; call flashcore.attention (which "
    "has a backward), or call it under torch.no_grad() or pass {name}.detach()";

std::string requires_grad_message(const std::string& name) {
    std::string msg = FC_REQUIRES_GRAD_MSG;
    for (size_t at = msg.find("{name}"); at != std::string::npos; at = msg.find("{name}", at + name.size()))
        msg.replace(at, 6, name);
    return msg;
}
[[noreturn]] void type_error(const std::string& msg) { throw pybind11::type_error(msg); }

std::string shape_str(const at::Tensor& t) {
    std::string s = "(";
    for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
    return s + ")";
}

std::string nested_message(const std::string& name) {
    return name + ": nested tensors are not supported; pad them to one (B, H, S, D) tensor (" + name +
           ".to_padded_tensor(0.0)) and drop the padded rows' outputs";
}

// A forward-mode AD tangent (torch.autograd.forward_ad) would be dropped: no jvp exists.
void check_no_tangent(const at::Tensor& t, const char* name) {
    if (t._fw_grad(/*level=*/0).defined())
        value_error(std::string(name) + ": carries a forward-mode AD tangent, but flashcore.attention has no "
                    "forward-mode derivative (no jvp); pass torch.autograd.forward_ad.unpack_dual(" + name +
                    ").primal, or use scaled_dot_product_attention");
}

// Every check that can be phrased in terms of the user's arguments lives
// here, so the message names the argument; fc_attn_fwd_check is the backstop.
// Whether v's head dim Dv is one a kernel may take as it is: a multiple of 8
// below q's D (fc_attn_params' Dv; the C checks say which kernels run it).
bool dv_candidate(const at::Tensor& q, const at::Tensor& v) {
    const int64_t d = q.size(3), dv = v.size(3);
    return dv >= 8 && dv < d && dv % 8 == 0;
}

// own_dv: the forward, where v's head dim may be its own (dv_candidate). sizes false: the checks
// that read no size or stride only (check_call's, for traced sizes that have no value). meta: meta
// tensors pass, in a dtype some device takes (check_call's: a meta call runs no kernel, only its
// output shapes are made, and a meta tensor may stand for a CPU or a CUDA one).
void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool own_dv = false,
                  bool sizes = true, bool meta = false) {
    const at::Tensor* ts[3] = {&q, &k, &v};
    const char* names[3] = {"q", "k", "v"};
    for (int i = 0; i < 3; ++i) {
        const at::Tensor& t = *ts[i];
        if (t.is_nested()) value_error(nested_message(names[i]));
        if (t.layout() != at::kStrided) {
            std::ostringstream layout;
            layout << t.layout();
            value_error(std::string(names[i]) + ": layout " + layout.str() + " is not supported; call " + names[i] +
                        ".to_dense()");
        }
        if (sizes && t.dim() != 4)
            value_error(std::string(names[i]) + ": expected a 4-D (B, H, S, D) tensor, got " +
                        std::to_string(t.dim()) + "-D of shape " + shape_str(t) +
                        "; add the missing dims with unsqueeze or reshape");
        if (t.is_cuda()) {
            if (t.scalar_type() != at::kHalf && t.scalar_type() != at::kBFloat16)
                type_error(std::string(names[i]) + ": dtype " + std::string(c10::toString(t.scalar_type())) +
                           " is not supported on CUDA; use torch.float16 or torch.bfloat16");
        } else if (t.is_cpu() || (meta && t.is_meta())) {
            if (t.scalar_type() != at::kHalf && t.scalar_type() != at::kBFloat16 &&
                t.scalar_type() != at::kFloat && t.scalar_type() != at::kDouble)
                type_error(std::string(names[i]) + ": dtype " + std::string(c10::toString(t.scalar_type())) +
                           " is not supported; use torch.float16, torch.bfloat16 or (CPU only) torch.float32 or "
                           "torch.float64");
        } else {
            value_error(std::string(names[i]) + ": device " + t.device().str() +
                        " is not supported; use a CUDA or CPU tensor");
        }
        if (sizes && t.stride(3) != 1)
            value_error(std::string(names[i]) + ": the last dim must be contiguous (stride 1), got stride " +
                        std::to_string(t.stride(3)) + "; call " + names[i] + ".contiguous()");
        // A negated view (torch._neg_view) holds -x as x plus a flag the kernels do not read.
        if (t.is_neg())
            value_error(std::string(names[i]) + ": is a negated view; call " + names[i] + ".resolve_neg()");
        // (_C.fwd only: flashcore.attention sends these to its custom op.) The
        // output would carry no grad_fn, and a backward pass would leave out
        // this path's gradients without a word: refused instead. The same holds
        // for a forward-mode tangent (torch.autograd.forward_ad): no jvp exists.
        if (t.requires_grad() && at::GradMode::is_enabled())
            value_error(requires_grad_message(names[i]));
        check_no_tangent(t, names[i]);
    }
    for (int i = 1; i < 3; ++i) {
        if (ts[i]->device() != q.device())
            value_error(std::string(names[i]) + ": on " + ts[i]->device().str() + " but q is on " +
                        q.device().str() + "; move q, k and v to the same device");
        if (ts[i]->scalar_type() != q.scalar_type())
            type_error(std::string(names[i]) + ": dtype " + std::string(c10::toString(ts[i]->scalar_type())) +
                       " differs from q's " + std::string(c10::toString(q.scalar_type())) +
                       "; cast q, k and v to one dtype");
        if (!sizes) continue;
        if (ts[i]->size(0) != q.size(0))
            value_error(std::string(names[i]) + ": batch " + std::to_string(ts[i]->size(0)) +
                        " differs from q's " + std::to_string(q.size(0)) + "; q, k and v need the same B");
        // (flashcore.attention pads a v of its own head dim where the kernel does not take it)
        const int64_t dv = ts[i]->size(3);
        if (dv != q.size(3) && (i == 1 || !own_dv || !dv_candidate(q, v)))
            value_error(std::string(names[i]) + ": head dim " + std::to_string(dv) + " differs from q's " +
                        std::to_string(q.size(3)) +
                        (i == 1 ? "; q and k need the same D (v's may differ)"
                         : own_dv ? "; this entry takes v's head dim equal to D or a multiple of 8 below it"
                                  : "; this entry needs v's D = q's"));
    }
    if (!sizes) return;
    if (v.size(1) != k.size(1))
        value_error("v: " + std::to_string(v.size(1)) + " heads but k has " + std::to_string(k.size(1)) +
                    "; k and v need the same number of heads");
    if (v.size(2) != k.size(2))
        value_error("v: sequence length " + std::to_string(v.size(2)) + " differs from k's " +
                    std::to_string(k.size(2)) + "; k and v need the same Sk");
    // Empty sizes (B, H or S = 0) are valid, as in SDPA: the output is empty, or
    // all zeros when Sk = 0 (no key is visible). D = 0 is not a supported head dim.
    if (k.size(1) == 0 ? q.size(1) > 0 : q.size(1) % k.size(1) != 0)
        value_error("k: " + std::to_string(k.size(1)) + " KV heads do not divide q's " +
                    std::to_string(q.size(1)) + " heads; use Hkv that divides Hq (GQA) or Hkv == Hq");
    const int64_t d = q.size(3);
    if (d < 1 || d > FC_MAX_HEAD_DIM)
        value_error("q: head dim D=" + std::to_string(d) + " is not supported; D must be from 1 to 256");
    if (d % 8 != 0)
        value_error("q: head dim D=" + std::to_string(d) + " is not a multiple of 8, which the kernels need; call "
                    "flashcore.attention, which pads it with zero columns (or pad q, k and v yourself)");
    for (int i = 0; i < 3; ++i)
        if (ts[i]->size(0) > INT32_MAX || ts[i]->size(1) > INT32_MAX || ts[i]->size(2) > INT32_MAX)
            value_error(std::string(names[i]) + ": a dim exceeds 2^31-1; split the call");
    // Before out is allocated (a stride-0 view can be that long; out cannot).
    if (q.size(2) > FC_MAX_SEQ_LEN)
        value_error("q: Sq=" + std::to_string(q.size(2)) + " exceeds 2^30, the longest sequence flashcore takes; "
                    "split the queries into chunks");
    if (k.size(2) > FC_MAX_SEQ_LEN)
        value_error("k: Sk=" + std::to_string(k.size(2)) + " exceeds 2^30, the longest sequence flashcore takes; "
                    "split the keys into chunks and merge the parts by their LSE (return_lse=True)");
}

fc_dtype to_fc_dtype(at::ScalarType t) {
    return t == at::kHalf ? FC_DTYPE_FP16 : t == at::kBFloat16 ? FC_DTYPE_BF16
         : t == at::kDouble ? FC_DTYPE_FP64 : FC_DTYPE_FP32;
}

// The LSE's dtype for inputs of dtype t: fp64 for fp64 inputs (the C API's lse64), else fp32.
at::ScalarType lse_dtype(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// A softmax scale the kernels take: > 0 in fp32 (1e-50 would round to 0) and at most
// FC_MAX_SCALE (false for NaN).
bool scale_ok(double scale) { return scale > 0.0 && scale <= FC_MAX_SCALE && (float)scale > 0.f; }

void check_scale(double scale) {
    if (!scale_ok(scale)) {
        char got[64];
        snprintf(got, sizeof got, "%g", scale);
        value_error(std::string("scale: got ") + got + "; it must be > 0 in fp32 (from about 1.4e-45) and at most "
                    "2.3e38 (flashcore.attention also takes 0, and a negative scale of that magnitude); pass None "
                    "for 1/sqrt(D)");
    }
}

void check_num_splits(int64_t num_splits) {
    if (num_splits < 0 || num_splits > INT32_MAX)
        value_error("num_splits: got " + std::to_string(num_splits) + "; pass None or 0 (heuristic), 1 (no split) "
                    "or n > 1 (split Sk n ways)");
}

// A sliding window as the C API takes it (fc_attn_params' window fields).
struct Window {
    int on;           // window: 0 none, 1 on
    int left, right;  // window_left, window_right (-1: no bound)
};

// Sets the window fields of params p (fc_attn_params or fc_attn_bwd_params).
template <typename Params>
void set_window(Params& p, const Window& w) {
    p.window = w.on; p.window_left = w.left; p.window_right = w.right;
}

// The raw entry points' window (fwd, bwd, num_splits): None, or (left, right) in the C API's terms
// (ints >= -1, -1 no bound); the C checks judge the values.
Window raw_window(const pybind11::object& w) {
    if (w.is_none()) return {0, 0, 0};
    try {
        const auto t = w.cast<std::pair<int, int>>();
        return {1, t.first, t.second};
    } catch (const pybind11::cast_error&) {
        value_error("window: expected None or [window_left, window_right], two ints from -1 (no bound) to "
                    "2^31 - 1, got " + pybind11::repr(w).cast<std::string>());
    }
}

// Everything but the output pointers; o borrows q's pointer and strides (the
// size and plan queries look at shapes only).
fc_attn_params fill_params(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                           int causal, int kernel, int64_t num_splits, const Window& w) {
    fc_attn_params p = {};
    p.q = q.data_ptr(); p.k = k.data_ptr(); p.v = v.data_ptr(); p.o = q.data_ptr();
    p.q_batch_stride = q.stride(0); p.q_head_stride = q.stride(1); p.q_row_stride = q.stride(2);
    p.k_batch_stride = k.stride(0); p.k_head_stride = k.stride(1); p.k_row_stride = k.stride(2);
    p.v_batch_stride = v.stride(0); p.v_head_stride = v.stride(1); p.v_row_stride = v.stride(2);
    p.o_batch_stride = q.stride(0); p.o_head_stride = q.stride(1); p.o_row_stride = q.stride(2);
    p.B = (int)q.size(0); p.Hq = (int)q.size(1); p.Hkv = (int)k.size(1);
    p.Sq = (int)q.size(2); p.Sk = (int)k.size(2); p.D = (int)q.size(3);
    p.Dv = v.size(3) != q.size(3) ? (int)v.size(3) : 0;
    p.dtype = to_fc_dtype(q.scalar_type());
    p.scale = (float)scale;
    p.scale64 = scale;
    p.causal = (fc_causal)causal;
    set_window(p, w);
    p.kernel = q.is_cpu() ? FC_KERNEL_CPU : (fc_kernel)kernel;
    p.num_splits = (int)num_splits;
    return p;
}

// A workspace of ZEROED_WS_BYTES per (device, stream), zero-filled once and
// kept for the process: calls that need only counters (the sm90 dynamic
// order's 16 bytes) pass it with counters_zeroed = 1, and the kernel leaves
// them at zero, so each such call saves a memset (0.2-0.7 % of a causal
// S = 512 call on an H100, perf notes, session 35). Keyed by the stream's
// unique id (cudaStreamGetId), so a stream handle reused after a destroy gets
// its own buffer; at most ZEROED_WS_STREAMS of them (a program that makes
// streams without end gets fresh scratch past that). NULL then, and while the
// stream is capturing a CUDA graph: a graph may replay on another stream,
// concurrently with eager calls on this one, so captured calls take fresh
// scratch and their launch zeroes it.
static constexpr size_t ZEROED_WS_BYTES = 256;
static constexpr size_t ZEROED_WS_STREAMS = 64;
static std::mutex zeroed_mu;
// (never destroyed: freeing CUDA memory from a static destructor at exit can
// run after torch's allocator is gone)
static auto* zeroed_kept = new std::map<std::pair<int, unsigned long long>, at::Tensor>();
// The kept buffer's key: q's device and the stream's unique id; false when the
// runtime gives no id.
static bool zeroed_key(const at::Tensor& q, cudaStream_t stream, std::pair<int, unsigned long long>* key) {
    unsigned long long id = 0;
    if (cudaStreamGetId(stream, &id) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    *key = {(int)q.get_device(), id};
    return true;
}

void* zeroed_workspace(const at::Tensor& q, cudaStream_t stream) {
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &cap) != cudaSuccess) {
        (void)cudaGetLastError();
        return nullptr;
    }
    std::pair<int, unsigned long long> key;
    if (cap != cudaStreamCaptureStatusNone || !zeroed_key(q, stream, &key)) return nullptr;
    std::lock_guard<std::mutex> lock(zeroed_mu);
    if (zeroed_kept->size() >= ZEROED_WS_STREAMS && zeroed_kept->find(key) == zeroed_kept->end()) return nullptr;
    at::Tensor& t = (*zeroed_kept)[key];
    if (!t.defined()) t = at::zeros({(int64_t)ZEROED_WS_BYTES}, q.options().dtype(at::kByte));  // (on this stream)
    return t.data_ptr();
}

// Drops the stream's kept buffer after a call that failed with it: the call
// may have stopped between writing it and zeroing it again.
void forget_zeroed_workspace(const at::Tensor& q, cudaStream_t stream) {
    std::pair<int, unsigned long long> key;
    if (!zeroed_key(q, stream, &key)) return;
    std::lock_guard<std::mutex> lock(zeroed_mu);
    zeroed_kept->erase(key);
}

// Raises the Python exception for a call that returned st: MemoryError for the
// CPU path's scratch (`what` says which), the launch's own failure when the
// checks passed (checked, its check function's status; `what` names it), else
// the reasons `why` the checks gave, as TypeError for a dtype, RuntimeError for
// the device and ValueError for the rest.
[[noreturn]] void raise_failure(fc_status st, fc_status checked, const char* why, const char* what) {
    if (st == FC_ERR_HOST_MEMORY) {
        PyErr_SetString(PyExc_MemoryError, (std::string("flashcore: ") + what).c_str());
        throw pybind11::error_already_set();
    }
    if (checked == FC_OK) throw std::runtime_error(std::string("flashcore: ") + what + ": " + fc_status_string(st));
    if (st == FC_ERR_CUDA || st == FC_ERR_ARCH) throw std::runtime_error(std::string("flashcore: ") + why);
    if (st == FC_ERR_UNSUPPORTED_DTYPE) type_error(std::string("flashcore: ") + why);
    value_error(std::string("flashcore: ") + why);
}

// Test switch (_C.set_poison_outputs): fill out and lse with NaN, and the
// allocated scratch with 0xff bytes, before each launch, so an element a kernel
// does not write reads as NaN whatever memory the allocator handed back.
static bool poison_outputs = false;

// Runs one C API call (check + launch): on the GPU as is, on the CPU, which
// computes the whole attention on this thread, with the GIL released so
// that other Python threads run meanwhile.
template <typename Call>
fc_status run_c(const at::Tensor& q, Call call) {
    if (q.is_cuda()) return call();
    pybind11::gil_scoped_release no_gil;
    return call();
}

// A kernel id the C API knows, on q's device type.
void check_kernel_id(const at::Tensor& q, int kernel) {
    if (kernel < FC_KERNEL_AUTO || kernel > FC_KERNEL_CPU)
        value_error("kernel: unknown kernel id " + std::to_string(kernel));
    if (q.is_cpu() && kernel != FC_KERNEL_AUTO && kernel != FC_KERNEL_CPU)
        value_error("kernel: a GPU kernel was forced but q is on the CPU; move the tensors to CUDA "
                    "or use kernel='auto'");
    if (q.is_cuda() && kernel == FC_KERNEL_CPU)
        value_error("kernel: 'cpu' was forced but q is on " + q.device().str() +
                    "; move the tensors to the CPU or use kernel='auto'");
    // (meta tensors that force a GPU kernel stand for CUDA ones: CUDA's dtypes)
    if (q.is_meta() && kernel != FC_KERNEL_AUTO && kernel != FC_KERNEL_CPU &&
        (q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble))
        type_error("q: dtype " + std::string(c10::toString(q.scalar_type())) + " is not supported on CUDA, where "
                   "the forced kernel runs; use torch.float16 or torch.bfloat16, or kernel='auto' or 'cpu'");
}

// attn_mask as the C API's mask: a bool tensor, or a floating one of q's dtype or fp32 (added to the scaled
// scores; under autocast a floating mask takes the autocast dtype, as SDPA's does), on q's device, that
// broadcasts to (B, Hq, Sq, Sk), viewed at that shape (zero strides where it broadcasts; a mask whose
// columns broadcast or are strided is copied). Undefined (FC_MASK_NONE) for None. sizes false: the
// checks that read no size (a traced call's). So far only the CPU path runs a mask (the C checks
// refuse it on the GPU, by name).
bool autocast_on(c10::DeviceType dev);  // (below, with the inputs' cast)
std::string type_name(const pybind11::handle& o);  // (below, with the argument readers)

struct Mask {
    at::Tensor t;       // (B, Hq, Sq, Sk) view, or undefined
    fc_mask_kind kind;  // FC_MASK_NONE, FC_MASK_BOOL, FC_MASK_ADD or FC_MASK_ADD_FP32
};

Mask mask_arg(const pybind11::handle& m, const at::Tensor& q, const at::Tensor& k, bool sizes = true) {
    if (m.is_none()) return {at::Tensor(), FC_MASK_NONE};
    if (!THPVariable_Check(m.ptr()))
        type_error("attn_mask: expected None or a tensor, got " + type_name(m) + "; pass a bool mask (True: "
                   "the key is seen) or a float one added to the scores");
    at::Tensor t = THPVariable_Unpack(m.ptr());
    if (t.is_nested() || t.layout() != at::kStrided)
        value_error("attn_mask: nested and non-strided tensors are not supported; pass a dense mask");
    if (!t.has_storage())
        value_error("attn_mask: a tensor with no storage of its own (a wrapper subclass, or one batched by "
                    "torch.vmap or another torch.func transform) is not taken; pass a plain tensor");
    if (t.requires_grad() && at::GradMode::is_enabled())
        value_error("attn_mask: requires grad, but flashcore has no gradient for the mask; pass "
                    "attn_mask.detach()");
    if (autocast_on(q.device().type()) && t.is_floating_point() && t.scalar_type() != at::kDouble)
        t = at::autocast::cached_cast(at::autocast::get_autocast_dtype(q.device().type()), t, q.device().type());
    // (SDPA's rule: bool, float32, or q's dtype)
    const bool is_bool = t.scalar_type() == at::kBool;
    if (!is_bool && t.scalar_type() != q.scalar_type() && t.scalar_type() != at::kFloat)
        type_error("attn_mask: dtype " + std::string(c10::toString(t.scalar_type())) + " is neither bool, float32 "
                   "nor q's " + std::string(c10::toString(q.scalar_type())) + "; pass a bool mask or "
                   "attn_mask.to(q.dtype)");
    if (t.device() != q.device() && !(t.is_meta() && q.is_meta()))
        value_error("attn_mask: on " + t.device().str() + " but q is on " + q.device().str() +
                    "; move the mask to q's device");
    const fc_mask_kind kind = is_bool ? FC_MASK_BOOL : t.scalar_type() == q.scalar_type() ? FC_MASK_ADD
                                                                                          : FC_MASK_ADD_FP32;
    if (!sizes) return {at::Tensor(), kind};
    const std::vector<int64_t> shape = {q.size(0), q.size(1), q.size(2), k.size(2)};
    if (t.dim() > 4 || !at::is_expandable_to(t.sizes(), shape))
        value_error("attn_mask: shape " + shape_str(t) + " does not broadcast to (B, Hq, Sq, Sk) = (" +
                    std::to_string(shape[0]) + ", " + std::to_string(shape[1]) + ", " + std::to_string(shape[2]) +
                    ", " + std::to_string(shape[3]) + "); pass a mask of that shape or one that broadcasts to it");
    // The C API reads the columns contiguous: a strided last dim is made so over the mask's own dims, a
    // broadcast one (size 1, or a 0-D mask) over its own dims widened to Sk, before the zero-stride expand.
    if (t.dim() == 0) t = t.reshape({1});
    if (t.size(-1) == 1 && shape[3] > 1) {
        std::vector<int64_t> own = t.sizes().vec();
        own.back() = shape[3];
        t = t.expand(own).contiguous();
    } else if (t.size(-1) > 1 && t.stride(-1) != 1) {
        t = t.contiguous();
    }
    return {t.expand(shape), kind};
}

// (P: fc_attn_params or fc_attn_bwd_params, whose mask fields are the same)
template <typename P>
void set_mask(P& p, const Mask& m) {
    if (m.kind == FC_MASK_NONE) return;
    p.mask = m.t.data_ptr();
    p.mask_batch_stride = m.t.stride(0); p.mask_head_stride = m.t.stride(1); p.mask_row_stride = m.t.stride(2);
    p.mask_kind = m.kind;
}

// Checks, allocates out (and lse), runs the C API; lse is undefined unless return_lse.
std::pair<at::Tensor, at::Tensor> run_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                          double scale, int causal, int kernel, bool return_lse,
                                          int64_t num_splits, const Window& w,
                                          const pybind11::handle& attn_mask = pybind11::none()) {
    check_inputs(q, k, v, true);
    check_num_splits(num_splits);
    check_scale(scale);
    if (causal < FC_CAUSAL_NONE || causal > FC_CAUSAL_BOTTOM_RIGHT)
        value_error("causal: unknown mode " + std::to_string(causal));
    check_kernel_id(q, kernel);
    const Mask mask = mask_arg(attn_mask, q, k);

    c10::OptionalDeviceGuard guard(q.device());
    at::Tensor out = at::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, q.options());  // (B, Hq, Sq, Dv)
    at::Tensor lse;
    if (return_lse) lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(lse_dtype(q.scalar_type())));

    fc_attn_params p = fill_params(q, k, v, scale, causal, kernel, num_splits, w);
    set_mask(p, mask);
    p.o = out.data_ptr();
    p.o_batch_stride = out.stride(0); p.o_head_stride = out.stride(1); p.o_row_stride = out.stride(2);
    if (return_lse && p.dtype == FC_DTYPE_FP64) p.lse64 = lse.data_ptr<double>();
    else if (return_lse) p.lse = lse.data_ptr<float>();

    // Scratch: a small workspace (the sm90 dynamic order's 16-byte tile counter)
    // from the stream's kept-zero buffer, so the launch needs no memset; larger
    // ones (split-KV and split-tail partials) from torch's caching allocator
    // (stream-ordered, so safe to free on return and fine under graph capture).
    fc_stream_t stream = q.is_cuda() ? (fc_stream_t)c10::cuda::getCurrentCUDAStream().stream() : nullptr;
    at::Tensor workspace;
    const size_t ws_bytes = q.is_cuda() ? fc_attn_fwd_workspace_size(&p) : 0;
    if (ws_bytes > 0) {
        p.workspace = ws_bytes <= ZEROED_WS_BYTES ? zeroed_workspace(q, (cudaStream_t)stream) : nullptr;
        p.counters_zeroed = p.workspace != nullptr;
        if (!p.workspace) {
            workspace = at::empty({(int64_t)ws_bytes}, q.options().dtype(at::kByte));
            p.workspace = workspace.data_ptr();
        }
        p.workspace_bytes = ws_bytes;
    }
    if (poison_outputs) {
        out.fill_(NAN);
        if (return_lse) lse.fill_(NAN);
        if (workspace.defined()) workspace.fill_(0xff);
    }

    // One call does check + launch; the reasons are only formatted on failure.
    const fc_status st = run_c(q, [&] { return fc_attn_fwd(&p, stream); });
    if (st != FC_OK) {
        if (p.counters_zeroed) forget_zeroed_workspace(q, (cudaStream_t)stream);
        if (st == FC_ERR_HOST_MEMORY) raise_failure(st, FC_OK, "", "the CPU kernel could not allocate its per-thread "
                                                                "scratch (malloc failed)");
        char why[1024];
        raise_failure(st, fc_attn_fwd_check(&p, why, sizeof(why)), why, "kernel launch failed");
    }
    return {out, lse};
}

// fwd(q, k, v, scale, causal_mode, kernel, return_lse, num_splits, window=None) -> (out, lse | None):
// the raw entry point with ids for causal mode and kernel, and the C API's window (tests, benchmarks).
std::tuple<at::Tensor, c10::optional<at::Tensor>> fwd(const at::Tensor& q, const at::Tensor& k,
                                                      const at::Tensor& v, double scale, int causal,
                                                      int kernel, bool return_lse, int64_t num_splits,
                                                      const pybind11::object& window) {
    auto r = run_fwd(q, k, v, scale, causal, kernel, return_lse, num_splits, raw_window(window));
    return {r.first, return_lse ? c10::optional<at::Tensor>(r.second) : c10::nullopt};
}

// A tensor the backward reads as given when its rows suit the kernels (last
// dim contiguous; on the GPU 16-byte aligned rows), else a contiguous copy:
// autograd hands in gradients of any layout (an expanded one from a sum()).
at::Tensor rows_usable(const at::Tensor& t) {
    bool ok = t.stride(3) == 1;
    if (ok && t.is_cuda())
        ok = t.stride(0) % 8 == 0 && t.stride(1) % 8 == 0 && t.stride(2) % 8 == 0 &&
             reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
    return ok ? t : t.contiguous();
}

// The backward's params for these tensors (g: dout, o: out; dq, dk, dv written), but lse and dlse.
fc_attn_bwd_params bwd_params(const at::Tensor& g, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& o, const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& dv,
                              double scale, int causal, int kernel, bool deterministic,
                              const pybind11::object& window) {
    fc_attn_bwd_params p = {};
    p.q = q.data_ptr(); p.k = k.data_ptr(); p.v = v.data_ptr(); p.o = o.data_ptr(); p.dout = g.data_ptr();
    p.dq = dq.data_ptr(); p.dk = dk.data_ptr(); p.dv = dv.data_ptr();
    auto strides = [](const at::Tensor& t, int64_t& batch, int64_t& head, int64_t& row) {
        batch = t.stride(0); head = t.stride(1); row = t.stride(2);
    };
    strides(q, p.q_batch_stride, p.q_head_stride, p.q_row_stride);
    strides(k, p.k_batch_stride, p.k_head_stride, p.k_row_stride);
    strides(v, p.v_batch_stride, p.v_head_stride, p.v_row_stride);
    strides(o, p.o_batch_stride, p.o_head_stride, p.o_row_stride);
    strides(g, p.do_batch_stride, p.do_head_stride, p.do_row_stride);
    strides(dq, p.dq_batch_stride, p.dq_head_stride, p.dq_row_stride);
    strides(dk, p.dk_batch_stride, p.dk_head_stride, p.dk_row_stride);
    strides(dv, p.dv_batch_stride, p.dv_head_stride, p.dv_row_stride);
    p.B = (int)q.size(0); p.Hq = (int)q.size(1); p.Hkv = (int)k.size(1);
    p.Sq = (int)q.size(2); p.Sk = (int)k.size(2); p.D = (int)q.size(3);
    p.dtype = to_fc_dtype(q.scalar_type());
    p.scale = (float)scale;
    p.scale64 = scale;
    p.causal = (fc_causal)causal;
    set_window(p, raw_window(window));
    if (v.size(3) != q.size(3)) p.Dv = (int)v.size(3);
    p.kernel = q.is_cpu() ? FC_KERNEL_CPU : (fc_kernel)kernel;
    p.deterministic = deterministic;
    return p;
}

// The backward's LSE and dLSE pointers in p's dtype's fields: lse64 / dlse64 for fp64, lse / dlse otherwise.
void set_bwd_lse(fc_attn_bwd_params& p, const void* lse, const void* dlse) {
    if (p.dtype == FC_DTYPE_FP64) {
        p.lse64 = static_cast<const double*>(lse);
        p.dlse64 = static_cast<const double*>(dlse);
    } else {
        p.lse = static_cast<const float*>(lse);
        p.dlse = static_cast<const float*>(dlse);
    }
}

// bwd(dout, q, k, v, out, lse, dlse | None, scale, causal_mode, kernel=0, deterministic=False,
// window=None) -> (dq, dk, dv):
// the backward of a forward call with these q, k, v, scale, causal mode and window that
// gave out and lse (flashcore/__init__.py's autograd formula), on the kernel
// family of id `kernel` (auto: sm90 on H100/H200, else sm80). dq, dk, dv are
// contiguous, in q's dtype.
std::tuple<at::Tensor, at::Tensor, at::Tensor> bwd(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                                   const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                                   const c10::optional<at::Tensor>& dlse, double scale, int causal,
                                                   int kernel, bool deterministic, const pybind11::object& window,
                                                   const pybind11::object& attn_mask) {
    at::NoGradGuard no_grad;  // (a create_graph backward: the op itself has no derivative)
    check_inputs(q, k, v, true);  // (v's own head dim Dv: dout and out have Dv columns too)
    check_kernel_id(q, kernel);
    if (!scale_ok(scale))
        value_error("scale: got " + std::to_string(scale) + "; the backward needs the forward's scale, > 0 in fp32 "
                    "and at most 2.3e38");
    if (causal < FC_CAUSAL_NONE || causal > FC_CAUSAL_BOTTOM_RIGHT)
        value_error("causal: unknown mode " + std::to_string(causal) + "; pass 0 (none), 1 (top-left) or 2 "
                    "(bottom-right)");
    const std::vector<int64_t> rows = {q.size(0), q.size(1), q.size(2)};
    const std::vector<int64_t> out_shape = {q.size(0), q.size(1), q.size(2), v.size(3)};
    const std::pair<const at::Tensor*, const char*> like_q[2] = {{&dout, "dout"}, {&out, "out"}};
    for (const auto& t : like_q) {
        if (t.first->scalar_type() != q.scalar_type())
            type_error(std::string(t.second) + ": dtype " + std::string(c10::toString(t.first->scalar_type())) +
                       " differs from q's " + std::string(c10::toString(q.scalar_type())) + "; cast " + t.second +
                       " to q's dtype");
        if (t.first->sizes() != out_shape || t.first->device() != q.device())
            value_error(std::string(t.second) + ": expected the forward output's shape (B, Hq, Sq, Dv) = (" +
                        std::to_string(out_shape[0]) + ", " + std::to_string(out_shape[1]) + ", " +
                        std::to_string(out_shape[2]) + ", " + std::to_string(out_shape[3]) + ") on " +
                        q.device().str() + ", got " + shape_str(*t.first) + " on " + t.first->device().str());
    }
    const std::pair<const at::Tensor*, const char*> like_lse[2] = {{&lse, "lse"}, {dlse ? &*dlse : nullptr, "dlse"}};
    for (const auto& t : like_lse) {
        if (t.first && (t.first->sizes() != rows || t.first->scalar_type() != lse_dtype(q.scalar_type()) ||
                        t.first->device() != q.device()))
            value_error(std::string(t.second) + ": expected a " +
                        (q.scalar_type() == at::kDouble ? "float64" : "float32") + " (B, Hq, Sq) = (" +
                        std::to_string(rows[0]) +
                        ", " + std::to_string(rows[1]) + ", " + std::to_string(rows[2]) + ") tensor on " +
                        q.device().str() + ", got " + shape_str(*t.first) + " " +
                        std::string(c10::toString(t.first->scalar_type())) + " on " + t.first->device().str());
    }
    const Mask mask = mask_arg(attn_mask, q, k);
    c10::OptionalDeviceGuard guard(q.device());
    const at::Tensor g = rows_usable(dout), o = rows_usable(out), l = lse.contiguous();
    const at::Tensor dl = dlse ? dlse->contiguous() : at::Tensor();
    at::Tensor dq = at::empty(q.sizes(), q.options());
    at::Tensor dk = at::empty(k.sizes(), k.options());
    at::Tensor dv = at::empty(v.sizes(), v.options());

    fc_attn_bwd_params p = bwd_params(g, q, k, v, o, dq, dk, dv, scale, causal, kernel, deterministic, window);
    set_mask(p, mask);
    set_bwd_lse(p, l.data_ptr(), dl.defined() ? dl.data_ptr() : nullptr);

    fc_stream_t stream = q.is_cuda() ? (fc_stream_t)c10::cuda::getCurrentCUDAStream().stream() : nullptr;
    at::Tensor workspace;
    const size_t ws_bytes = q.is_cuda() ? fc_attn_bwd_workspace_size(&p) : 0;
    if (ws_bytes > 0) {
        workspace = at::empty({(int64_t)ws_bytes}, q.options().dtype(at::kByte));
        p.workspace = workspace.data_ptr();
        p.workspace_bytes = ws_bytes;
    }
    if (poison_outputs) {
        dq.fill_(NAN); dk.fill_(NAN); dv.fill_(NAN);
        if (workspace.defined()) workspace.fill_(0xff);
    }
    const fc_status st = run_c(q, [&] { return fc_attn_bwd(&p, stream); });
    if (st != FC_OK) {
        if (st == FC_ERR_HOST_MEMORY) raise_failure(st, FC_OK, "", "the CPU backward could not allocate its scratch "
                                                                "(malloc failed)");
        char why[1024];
        raise_failure(st, fc_attn_bwd_check(&p, why, sizeof(why)), why, "backward kernel launch failed");
    }
    return {dq, dk, dv};
}

// Whether bwd runs (q, k, v) on the kernel as it is with v's head dim its own (fc_attn_bwd_check_args);
// false (also for inputs bwd refuses, which it then raises for): flashcore/__init__.py's autograd
// formula pads v, out and dout to D. The check reads the other tensors' pointers and strides for their
// alignment only: q stands in for out, dout, dq and lse, k for dk and v for dv (bwd's out and dout pass
// rows_usable and its gradients are new contiguous tensors, aligned wherever q, k and v are).
bool native_dv_bwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int causal, int kernel,
                   bool deterministic, const pybind11::object& window) {
    try {
        at::NoGradGuard no_grad;
        check_inputs(q, k, v, true, true, true);
        check_kernel_id(q, kernel);
        if (!dv_candidate(q, v)) return false;
        if (q.is_meta()) return true;  // (as native_dv: the CPU's backward takes it)
        c10::OptionalDeviceGuard guard(q.device());
        fc_attn_bwd_params p = bwd_params(q, q, k, v, q, q, k, v, 1.0, causal, kernel, deterministic, window);
        set_bwd_lse(p, q.data_ptr(), nullptr);
        return fc_attn_bwd_check_args(&p, nullptr, 0) == FC_OK;
    } catch (const std::exception&) {
        return false;
    }
}

// Name -> id tables (fc_kernel, fc_causal); flashcore.KERNELS and
// CAUSAL_ALIGNMENTS are these, exported by the module (name_dict).
struct NamedId {
    const char* name;
    int id;
};
const NamedId KERNEL_IDS[] = {{"auto", FC_KERNEL_AUTO}, {"sm80", FC_KERNEL_SM80}, {"sm90", FC_KERNEL_SM90},
                              {"cpu", FC_KERNEL_CPU}};
const NamedId ALIGNMENT_IDS[] = {{"top_left", FC_CAUSAL_TOP_LEFT}, {"bottom_right", FC_CAUSAL_BOTTOM_RIGHT}};

// The id of `value` in `table`, or a ValueError naming `arg` and the accepted names.
template <size_t N>
int named_id(const NamedId (&table)[N], const pybind11::object& value, const char* arg) {
    if (pybind11::isinstance<pybind11::str>(value)) {
        const std::string v = value.cast<std::string>();
        for (const NamedId& e : table)
            if (v == e.name) return e.id;
    }
    std::string names;
    for (const NamedId& e : table) names += std::string(names.empty() ? "'" : ", '") + e.name + "'";
    value_error(std::string(arg) + ": expected one of " + names + ", got " +
                pybind11::repr(value).cast<std::string>());
}

template <size_t N>
pybind11::dict name_dict(const NamedId (&table)[N]) {
    pybind11::dict d;
    for (const NamedId& e : table) d[e.name] = e.id;
    return d;
}

// The Python type name of o, for messages.
std::string type_name(const pybind11::handle& o) { return Py_TYPE(o.ptr())->tp_name; }

// q, k or v as a tensor, or a TypeError naming the argument.
const at::Tensor& tensor_arg(const pybind11::handle& o, const char* name) {
    if (!THPVariable_Check(o.ptr()))
        type_error(std::string(name) + ": expected a torch.Tensor, got " + type_name(o));
    return THPVariable_Unpack(o.ptr());
}

// A bool argument: True or False, as SDPA's bool arguments (not any truthy
// object, nor a numpy bool, which SDPA refuses too).
bool bool_arg(const pybind11::handle& o, const char* name) {
    if (!PyBool_Check(o.ptr()))
        type_error(std::string(name) + ": expected a bool, got " + type_name(o) + "; pass True or False");
    return o.ptr() == Py_True;
}

// A float argument: a Python float or int, or a numpy scalar (anything with
// __float__); not a bool, a string or a tensor (stricter than SDPA, which
// takes a bool or a one-element tensor as a number).
double float_arg(const pybind11::handle& o, const char* name, const char* fix) {
    PyObject* p = o.ptr();
    const bool number = PyFloat_Check(p) || PyLong_Check(p) || PyObject_HasAttrString(p, "__float__");
    const char* type = Py_TYPE(p)->tp_name;
    const bool numpy_bool = !strcmp(type, "numpy.bool") || !strcmp(type, "numpy.bool_");  // (numpy 2's, 1's)
    if (!number || PyBool_Check(p) || numpy_bool || THPVariable_Check(p) || PyComplex_Check(p))
        type_error(std::string(name) + ": expected a float, got " + type_name(o) + "; " + fix);
    const double d = PyFloat_AsDouble(p);
    if (d == -1.0 && PyErr_Occurred()) {
        const bool overflow = PyErr_ExceptionMatches(PyExc_OverflowError);  // an int beyond a double's range
        PyErr_Clear();
        if (overflow)
            value_error(std::string(name) + ": " + pybind11::repr(o).cast<std::string>() + " is out of range; " + fix);
        type_error(std::string(name) + ": expected a float, got " + type_name(o) + " that does not convert to one; " +
                   fix);
    }
    return d;
}

// o as a Python int through __index__ (numpy's ints among them), or a TypeError naming the argument,
// chained to the error its __index__ raised; a null int_ where o is not such an int (a bool, a tensor, a
// type with no __index__: the caller's refusal names it).
pybind11::int_ index_arg(const pybind11::handle& o, const std::string& name) {
    if (PyBool_Check(o.ptr()) || !PyIndex_Check(o.ptr()) || THPVariable_Check(o.ptr()))
        return pybind11::reinterpret_steal<pybind11::int_>(pybind11::handle());
    PyObject* i = PyNumber_Index(o.ptr());
    if (!i) {
        pybind11::raise_from(PyExc_TypeError, (name + ": " + type_name(o) + " does not convert to an int; pass "
                                               "an int").c_str());
        throw pybind11::error_already_set();
    }
    return pybind11::reinterpret_steal<pybind11::int_>(i);
}

// One side of flashcore.attention's window: an int >= 0, or None or -1 (no bound on that side).
int window_side(const pybind11::handle& o, const char* side) {
    if (o.is_none()) return -1;
    const pybind11::int_ i = index_arg(o, std::string("window: ") + side);
    if (!i)
        type_error(std::string("window: ") + side + " is " + type_name(o) + "; pass an int >= 0 (keys), or None "
                   "for no bound");
    int overflow = 0;
    const long long n = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);  // (overflow: beyond long long)
    if (overflow || n < -1 || n > INT32_MAX)
        value_error(std::string("window: ") + side + " = " + pybind11::repr(i).cast<std::string>() +
                    "; pass an int from 0 to 2^31-1 (keys), or None (or -1) for no bound");
    return (int)n;
}

// flashcore.attention's window with its causal flag and alignment: the C causal mode (the alignment's
// diagonal whenever a window is on) and the C window. None, or (left, right): key j visible to query i
// iff i + d - left <= j <= i + d + right, d the alignment's diagonal. A causal call sees no key after the
// diagonal (right 0, or None); a window with no bound on either side is none (plain causal or full).
Window parse_window(const pybind11::object& w, bool causal_v, int alignment, int* mode) {
    *mode = causal_v ? alignment : FC_CAUSAL_NONE;
    if (w.is_none()) return {0, 0, 0};
    if (!(PyTuple_Check(w.ptr()) || PyList_Check(w.ptr())) || pybind11::len(w) != 2)
        type_error("window: expected None or a pair (left, right) of keys before and after the diagonal, got " +
                   pybind11::repr(w).cast<std::string>());
    const pybind11::sequence seq = pybind11::reinterpret_borrow<pybind11::sequence>(w);
    const int left = window_side(seq[0], "left");
    int right = window_side(seq[1], "right");
    if (causal_v) {
        if (right > 0)
            value_error("window: right = " + std::to_string(right) + " with causal=True, which sees no key after "
                        "the diagonal; pass window=(left, 0), or causal=False with window=(left, right)");
        right = 0;
    }
    if (left == -1 && right == (causal_v ? 0 : -1)) return {0, 0, 0};
    *mode = alignment;
    return {1, left, right};
}

// flashcore.attention's non-tensor arguments: their types checked as a typed
// signature would (flashcore/__init__.py's _check_arg_types repeats the type
// checks for the torch.compile path), then their values.
struct CallArgs {
    int causal_mode;   // fc_causal (a window's diagonal where there is one, causal or not)
    Window window;     // the window, in the C API's terms
    int kernel;        // fc_kernel
    int64_t splits;    // num_splits (0: heuristic)
    bool has_scale;    // scale given (else 1/sqrt(D))
    double scale;      // the given scale
    bool return_lse;   // also return the LSE
};

CallArgs parse_args(const pybind11::object& attn_mask, const pybind11::object& dropout_p,
                    const pybind11::object& is_causal, const pybind11::object& scale,
                    const pybind11::object& enable_gqa, const pybind11::object& causal,
                    const pybind11::object& causal_alignment, const pybind11::object& return_lse,
                    const pybind11::object& kernel, const pybind11::object& num_splits,
                    const pybind11::object& window) {
    CallArgs a = {};
    if (!attn_mask.is_none() && !THPVariable_Check(attn_mask.ptr()))  // (a tensor's checks: mask_arg, with q and k)
        type_error("attn_mask: expected None or a tensor, got " + type_name(attn_mask) + "; pass a bool mask "
                   "(True: the key is seen) or a float one added to the scores");
    if (float_arg(dropout_p, "dropout_p", "pass 0.0") != 0.0)
        value_error("dropout_p: flashcore has no dropout; got " + pybind11::str(dropout_p).cast<std::string>() +
                    ", pass 0.0");
    const bool is_causal_v = bool_arg(is_causal, "is_causal");
    bool_arg(enable_gqa, "enable_gqa");  // GQA is always on; the flag is SDPA's
    bool causal_v = is_causal_v;
    if (!causal.is_none()) {
        if (!PyBool_Check(causal.ptr()))
            type_error("causal: expected None or a bool, got " + type_name(causal) + "; pass True or False");
        causal_v = causal.ptr() == Py_True;
        if (causal_v != is_causal_v && is_causal_v)
            value_error("causal / is_causal: both given and they disagree; pass only one");
    }
    const int alignment = named_id(ALIGNMENT_IDS, causal_alignment, "causal_alignment");  // checked causal or not
    a.window = parse_window(window, causal_v, alignment, &a.causal_mode);
    a.kernel = named_id(KERNEL_IDS, kernel, "kernel");
    if (!num_splits.is_none()) {
        const pybind11::int_ n = index_arg(num_splits, "num_splits");  // (ints as the window's sides take them)
        if (!n) type_error("num_splits: expected None or an int, got " + type_name(num_splits));
        if (n < pybind11::int_(0) || n > pybind11::int_(INT32_MAX))  // also keeps the cast below in range
            value_error("num_splits: got " + pybind11::repr(n).cast<std::string>() +
                        "; pass None or 0 (heuristic), 1 (no split) or n > 1 (split Sk n ways)");
        a.splits = n.cast<int64_t>();
    }
    a.has_scale = !scale.is_none();  // (its value is checked in run_fwd, with the default's)
    if (a.has_scale) a.scale = float_arg(scale, "scale", "pass None for 1/sqrt(D) or a float > 0");
    a.return_lse = bool_arg(return_lse, "return_lse");
    return a;
}

// Whether flashcore.attention runs this scale as another call (_flip_scale): 0 as q * 0 at scale 1,
// a negative one whose magnitude the kernels take as -q at -scale (SDPA takes both; the kernels, whose
// softmax subtracts the row's largest score before scaling, take scale > 0).
bool flips_scale(const CallArgs& a) {
    return a.has_scale && (a.scale == 0.0 || (a.scale < 0.0 && scale_ok(-a.scale)));
}

// True for a q, k or v that only torch's dispatcher can run: a tensor
// subclass (FakeTensor, wrapper subclasses, __torch_function__ overrides) or a
// functorch wrapper (vmap, jvp: no storage of its own). attention() then
// returns NotImplemented and flashcore.attention calls the custom op instead.
bool for_dispatcher(const pybind11::handle& o, const char* name) {
    if (!THPVariable_Check(o.ptr())) return false;  // (tensor_arg raises)
    if (!THPVariable_CheckExact(o.ptr())) {
        // A nested tensor of jagged layout is a Python subclass; refused as check_inputs refuses the others.
        if (pybind11::getattr(o, "is_nested", pybind11::bool_(false)).ptr() == Py_True) value_error(nested_message(name));
        return true;
    }
    const at::Tensor& t = THPVariable_Unpack(o.ptr());
    return !t.is_nested() && t.layout() == at::kStrided && !t.has_storage();  // (check_inputs refuses the others)
}

// Whether q, k and v are already one (B, H, S, D) call: 4-D, one batch size,
// k's heads equal to v's, q's not a single head broadcast to several KV
// heads, and v's head dim q's. SDPA's other shapes ((..., S, D) of any rank
// >= 2, batch and head dims broadcast, v's head dim its own) go to
// flashcore.attention, which makes them such a call (_as_bhsd,
// _pad_head_dims) and shapes the output back. A nested or non-strided tensor counts
// as one call here: check_inputs refuses it.
// any_dv: v's head dim not compared (a call that may run with v's own, native_dv).
bool bhsd_call(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool any_dv = false) {
    for (const at::Tensor* t : {&q, &k, &v})
        if (t->is_nested() || t->layout() != at::kStrided) return true;
    if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) return false;
    return (any_dv || v.size(3) == q.size(3)) && k.size(0) == q.size(0) && v.size(0) == q.size(0) &&
           k.size(1) == v.size(1) && !(q.size(1) == 1 && k.size(1) != 1);
}

// Whether q's head dim is one no kernel takes but a zero-padded call runs exactly: 1 to 255 and
// not a multiple of 8. flashcore.attention (_pad_head_dims) pads q, k and v to the next multiple of 8
// (q . k is unchanged, the scale stays 1/sqrt(D)) and cuts out's extra columns.
bool pads_head_dim(const at::Tensor& q) {
    if (q.is_nested() || q.layout() != at::kStrided || q.dim() < 1) return false;  // (check_inputs refuses them)
    const int64_t d = q.size(-1);
    return d >= 1 && d < FC_MAX_HEAD_DIM && d % 8 != 0;
}

// Whether a (B, H, S, D) call whose v has a head dim of its own runs as it is:
// the kernel it picks takes v's Dv (fc_attn_params: a multiple of 8 below D, on
// the CPU kernel or the sm90 one at D > 128, not split-KV; fc_attn_fwd_check_args
// says, for a valid scale: the caller's is checked on its own). Otherwise
// flashcore.attention pads v to D. The inputs and num_splits have passed
// check_inputs(q, k, v, true) (meta tensors too, which run as the CPU takes them) and check_num_splits.
bool native_dv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int causal, int kernel,
               int64_t num_splits, const Window& w) {
    if (!dv_candidate(q, v)) return false;
    if (q.is_meta()) return true;  // (meta tensors run no kernel: as the CPU takes them)
    c10::OptionalDeviceGuard guard(q.device());
    fc_attn_params p = fill_params(q, k, v, 1.0, causal, kernel, num_splits, w);
    const int64_t dv = v.size(3);
    p.o_row_stride = dv;  // (run_fwd's out: contiguous (B, Hq, Sq, Dv))
    p.o_head_stride = q.size(2) * dv;
    p.o_batch_stride = q.size(1) * p.o_head_stride;
    return fc_attn_fwd_check_args(&p, nullptr, 0) == FC_OK;
}

// Whether autocast casts inputs on device type dev (CUDA and CPU: the two flashcore runs on).
bool autocast_on(c10::DeviceType dev) {
    return (dev == c10::DeviceType::CUDA || dev == c10::DeviceType::CPU) && at::autocast::is_autocast_enabled(dev);
}

// Under torch.autocast SDPA runs in the autocast dtype (by default fp16 on
// CUDA, bf16 on the CPU), casting floating inputs other than fp64: flashcore
// casts as SDPA does.
void autocast_inputs(at::Tensor& q, at::Tensor& k, at::Tensor& v) {
    const c10::DeviceType dev = q.device().type();
    if (!autocast_on(dev)) return;
    const at::ScalarType to = at::autocast::get_autocast_dtype(dev);
    q = at::autocast::cached_cast(to, q, dev);
    k = at::autocast::cached_cast(to, k, dev);
    v = at::autocast::cached_cast(to, v, dev);
}

// Whether a TorchDispatchMode would see a call run as the op: one is set, and Python dispatch is
// not switched off (torch.utils._mode_utils.no_dispatch: the call then runs here, as with no mode).
bool dispatch_mode_active() {
    return c10::impl::TorchDispatchModeTLS::any_modes_set() &&
           !c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::Python);
}

// flashcore.attention: SDPA's argument list plus flashcore's keyword-only
// options, handled here so an eager call does no Python-level work. Returns
// NotImplemented for calls the custom op must take: inputs for_dispatcher
// names, meta tensors, inputs that require grad (the op carries the autograd formula), calls
// under torch.jit.trace (which records dispatcher ops only), and calls under a
// TorchDispatchMode (FlopCounterMode, selective activation checkpointing,
// debug and logging modes), which sees only the ops the dispatcher runs.
pybind11::object attention(const pybind11::handle& query, const pybind11::handle& key, const pybind11::handle& value,
                           const pybind11::object& attn_mask, const pybind11::object& dropout_p,
                           const pybind11::object& is_causal, const pybind11::object& scale,
                           const pybind11::object& enable_gqa, const pybind11::object& causal,
                           const pybind11::object& causal_alignment, const pybind11::object& return_lse,
                           const pybind11::object& kernel, const pybind11::object& num_splits,
                           const pybind11::object& window) {
    if (torch::jit::tracer::isTracing() || for_dispatcher(query, "q") || for_dispatcher(key, "k") ||
        for_dispatcher(value, "v"))
        return pybind11::reinterpret_borrow<pybind11::object>(Py_NotImplemented);
    at::Tensor q = tensor_arg(query, "q");
    at::Tensor k = tensor_arg(key, "k");
    at::Tensor v = tensor_arg(value, "v");
    if (!bhsd_call(q, k, v, true) || pads_head_dim(q))
        return pybind11::reinterpret_borrow<pybind11::object>(Py_NotImplemented);
    const bool own_dv = !bhsd_call(q, k, v);  // v's head dim its own (native_dv)
    // Meta tensors (shapes without data: a model run on the meta device to count its FLOPs or plan its
    // memory) take the op, whose meta kernel checks the call as its fake implementation does and gives
    // the output's shapes, as SDPA gives them on meta tensors (v's own head dim where the CPU takes it).
    const bool meta = q.is_meta() || k.is_meta() || v.is_meta();
    if (meta || dispatch_mode_active()) {
        // check_inputs' refusals first, in its words (the op's schema and dispatcher word some
        // otherwise, and take a negated view; meta mixed with another device is named here); not where
        // autocast casts the inputs first or v's head dim is its own and padded (flashcore.attention
        // judges those calls, and the op then raises the same).
        if ((!own_dv || (meta && dv_candidate(q, v))) && !autocast_on(q.device().type())) {
            at::NoGradGuard no_grad;  // (requiring grad is the op's autograd formula's)
            check_inputs(q, k, v, true, true, meta);
        }
        return pybind11::reinterpret_borrow<pybind11::object>(Py_NotImplemented);
    }
    // Inputs that require grad while autograd records take the custom op, whose
    // autograd formula runs the backward (flashcore/__init__.py); a forward-mode
    // tangent is refused first, as check_inputs refuses it.
    if (at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad())) {
        check_no_tangent(q, "q");
        check_no_tangent(k, "k");
        check_no_tangent(v, "v");
        return pybind11::reinterpret_borrow<pybind11::object>(Py_NotImplemented);
    }
    autocast_inputs(q, k, v);
    const CallArgs a = parse_args(attn_mask, dropout_p, is_causal, scale, enable_gqa, causal, causal_alignment,
                                  return_lse, kernel, num_splits, window);
    if (flips_scale(a)) return pybind11::reinterpret_borrow<pybind11::object>(Py_NotImplemented);
    const double d = q.dim() > 0 ? (double)q.size(-1) : 0.0;
    const double scale_v = a.has_scale ? a.scale : (d > 0 ? 1.0 / std::sqrt(d) : 1.0);
    if (own_dv) {
        // v's own head dim: a call that may run as it is gets run_fwd's argument errors here (its
        // padded copy would get the same ones, where a refusal below would show as a refused Dv).
        if (!dv_candidate(q, v)) return pybind11::reinterpret_borrow<pybind11::object>(Py_NotImplemented);
        check_inputs(q, k, v, true);
        check_num_splits(a.splits);
        check_scale(scale_v);
        if (!native_dv(q, k, v, a.causal_mode, a.kernel, a.splits, a.window))
            return pybind11::reinterpret_borrow<pybind11::object>(Py_NotImplemented);  // (padded by flashcore.attention)
    }
    auto r = run_fwd(q, k, v, scale_v, a.causal_mode, a.kernel, a.return_lse, a.splits, a.window, attn_mask);
    if (a.return_lse) return pybind11::make_tuple(r.first, r.second);
    return pybind11::cast(r.first);
}

// attention()'s checks that read neither the data nor the GPU, on the custom op's arguments
// (flashcore/__init__.py's fake implementation runs them on an exported call's fake tensors, so
// torch.export refuses a bad call when it traces it, with the eager message; and on meta tensors,
// whose call runs no kernel). q, k and v are one
// (B, H, S, D) call with concrete sizes, or (sizes false: a traced size has no value) 4-D tensors
// whose sizes and strides are not read. False for a v whose head dim is its own and one no kernel
// takes (not dv_candidate: the op raises its own message). What the kernel refuses (fc_attn_fwd_check:
// the GPU's arch and shared memory, alignment, the split plan, whether it takes v's own head dim)
// needs the GPU and the pointers, and is checked when the call runs.
bool check_call(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const pybind11::object& attn_mask,
                const pybind11::object& dropout_p, const pybind11::object& is_causal, const pybind11::object& scale,
                const pybind11::object& causal, const pybind11::object& causal_alignment,
                const pybind11::object& return_lse, const pybind11::object& kernel,
                const pybind11::object& num_splits, const pybind11::object& window, bool sizes) {
    at::NoGradGuard no_grad;  // (inputs that require grad are the op's autograd formula's, as in its run)
    const CallArgs a = parse_args(attn_mask, dropout_p, is_causal, scale, pybind11::bool_(false), causal,
                                  causal_alignment, return_lse, kernel, num_splits, window);
    if (sizes && q.dim() == 4 && v.dim() == 4 && v.size(3) != q.size(3) && !dv_candidate(q, v)) return false;
    check_inputs(q, k, v, true, sizes, true);
    check_num_splits(a.splits);
    if (sizes || a.has_scale) check_scale(a.has_scale ? a.scale : 1.0 / std::sqrt((double)q.size(3)));
    check_kernel_id(q, a.kernel);
    mask_arg(attn_mask, q, k, sizes && q.dim() == 4 && k.dim() == 4);
    return true;
}

// Split-KV plan for these inputs: 0 when the tile kernel runs, else the number
// of Sk splits (1 = split-KV kernel without a combine). For tests and benchmarks.
int num_splits_for(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int causal, int kernel,
                   int64_t num_splits, const pybind11::object& window) {
    check_inputs(q, k, v);
    check_num_splits(num_splits);
    if (q.is_cpu()) return 0;
    c10::OptionalDeviceGuard guard(q.device());
    fc_attn_params p = fill_params(q, k, v, 1.0, causal, kernel, num_splits, raw_window(window));
    return fc_attn_fwd_num_splits(&p);
}

// Which kernel 'auto' resolves to for these inputs (for tests and benchmarks).
std::string picked_kernel(const at::Tensor& q, const at::Tensor& k) {
    if (q.is_cpu()) return "cpu";
    c10::OptionalDeviceGuard guard(q.device());
    fc_attn_params p = {};
    p.B = 1; p.Hq = (int)q.size(1); p.Hkv = (int)k.size(1); p.Sq = (int)q.size(2);
    p.Sk = (int)k.size(2); p.D = (int)q.size(3); p.dtype = to_fc_dtype(q.scalar_type());
    switch (fc_attn_fwd_pick(&p)) {
        case FC_KERNEL_SM80: return "sm80";
        case FC_KERNEL_SM90: return "sm90";
        case FC_KERNEL_CPU: return "cpu";
        default: return "none";
    }
}

// Why the GPU backward cannot run at head dim D with kernel id `kernel` on CUDA
// device `device` (fc_attn_bwd_device_check); empty if it can.
std::string bwd_device_check(int D, int kernel, int device) {
    c10::cuda::CUDAGuard guard((c10::DeviceIndex)device);
    char why[512];
    if (fc_attn_bwd_device_check(D, (fc_kernel)kernel, why, sizeof why) == FC_OK) return std::string();
    std::string s(why);
    while (!s.empty() && s.back() == '\n') s.pop_back();  // (the C reasons end in a newline each)
    return s;
}

#ifdef FC_HAVE_SM90
// The sm90 instantiation a call of this shape runs on num_sms SMs (kernels.h's
// fc_sm90_route_d*; host logic, no GPU needed). For tests.
// Dv: v's head dim (0: D); MLA's tile (fc_sm90_d192) names its route "d192:" + the kind.
std::string sm90_route(int B, int Hq, int Hkv, int Sq, int Sk, int D, int causal, int num_sms,
                       const pybind11::object& window, int Dv) {
    fc_attn_params p = {};
    p.B = B; p.Hq = Hq; p.Hkv = Hkv; p.Sq = Sq; p.Sk = Sk; p.D = D; p.Dv = Dv;
    p.causal = (fc_causal)causal;
    set_window(p, raw_window(window));
    if (D < 1 || D > FC_MAX_HEAD_DIM || num_sms < 1 || Dv < 0 || Dv > D)
        value_error("sm90_route: D in 1..256, Dv in 0..D and num_sms >= 1");
    if (fc_sm90_d192(&p)) return std::string("d192:") + fc_sm90_route_d192(&p, num_sms);
    return D <= 64 ? fc_sm90_route_d64(&p, num_sms) : D <= 128 ? fc_sm90_route_d128(&p, num_sms)
                                                               : fc_sm90_route_d256(&p, num_sms);
}
#endif

}  // namespace

PYBIND11_MODULE(_C, m) {
    m.doc() = "flashcore C core binding";
    namespace py = pybind11;
    // flashcore.attention (flashcore/__init__.py) passes all 14 arguments by
    // position, and makes the last six keyword-only for its callers.
    m.def("attention", &attention, "flashcore.attention's eager path; see flashcore.attention",
          py::arg("query"), py::arg("key"), py::arg("value"), py::arg("attn_mask"), py::arg("dropout_p"),
          py::arg("is_causal"), py::arg("scale"), py::arg("enable_gqa"), py::arg("causal"),
          py::arg("causal_alignment"), py::arg("return_lse"), py::arg("kernel"), py::arg("num_splits"),
          py::arg("window"));
    m.def("causal_window", [](bool causal, const pybind11::object& causal_alignment, const pybind11::object& window) {
        int mode = 0;
        const Window w = parse_window(window, causal, named_id(ALIGNMENT_IDS, causal_alignment, "causal_alignment"),
                                      &mode);
        return std::make_pair(mode, w.on ? pybind11::cast(std::make_pair(w.left, w.right)) : pybind11::none());
    }, "(causal on, causal_alignment, window) -> (causal mode id, (window_left, window_right) | None) as the C API "
       "takes them (the op's backward)", py::arg("causal"), py::arg("causal_alignment"), py::arg("window"));
    m.def("check_call", &check_call, "the custom op's argument checks that need no data and no GPU (its fake "
          "implementation's); false: v's head dim is its own and one no kernel takes",
          py::arg("query"), py::arg("key"), py::arg("value"), py::arg("attn_mask"), py::arg("dropout_p"),
          py::arg("is_causal"), py::arg("scale"), py::arg("causal"), py::arg("causal_alignment"),
          py::arg("return_lse"), py::arg("kernel"), py::arg("num_splits"), py::arg("window"),
          py::arg("sizes") = true);
    m.attr("ATTENTION_DOC") = FC_ATTENTION_DOC;
    m.attr("KERNELS") = name_dict(KERNEL_IDS);
    m.attr("CAUSAL_ALIGNMENTS") = name_dict(ALIGNMENT_IDS);
    m.def("fwd", &fwd, "attention forward with causal mode and kernel ids, the C API's window (see "
          "flashcore.attention)", py::arg("q"), py::arg("k"), py::arg("v"), py::arg("scale"), py::arg("causal"),
          py::arg("kernel"), py::arg("return_lse"), py::arg("num_splits"), py::arg("window") = pybind11::none());
    m.def("bwd", &bwd, "attention backward: (dout, q, k, v, out, lse, dlse | None, scale, causal_mode, "
          "kernel id, deterministic) -> (dq, dk, dv)", py::arg("dout"), py::arg("q"), py::arg("k"), py::arg("v"),
          py::arg("out"), py::arg("lse"), py::arg("dlse"), py::arg("scale"), py::arg("causal"), py::arg("kernel") = 0,
          py::arg("deterministic") = false, py::arg("window") = pybind11::none(),
          py::arg("attn_mask") = pybind11::none());
    m.def("native_dv", [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int causal, int kernel,
                          int64_t num_splits, const pybind11::object& window) {
        // (inputs the call refuses: false, and the padded call raises; requiring grad is the op's to handle)
        try {
            at::NoGradGuard no_grad;
            check_inputs(q, k, v, true, true, true);
            check_num_splits(num_splits);
        } catch (const std::exception&) {
            return false;
        }
        return native_dv(q, k, v, causal, kernel, num_splits, raw_window(window));
    }, "whether flashcore.attention runs (q, k, v), tensors as given (no autocast), on the kernel as it is, v's "
       "head dim its own (causal mode id, kernel id, num_splits, the C API's window or None); false: v is "
       "padded to D",
       py::arg("q"), py::arg("k"), py::arg("v"), py::arg("causal"), py::arg("kernel"), py::arg("num_splits"),
       py::arg("window") = pybind11::none());
    m.def("native_dv_bwd", &native_dv_bwd, "whether the backward of a call of (q, k, v), v's head dim its own, "
          "runs on the kernel as it is (causal mode id, kernel id, deterministic, the C API's window or None); "
          "false: v, out and dout are padded to D", py::arg("q"), py::arg("k"), py::arg("v"), py::arg("causal"),
          py::arg("kernel"), py::arg("deterministic") = false, py::arg("window") = pybind11::none());
    m.attr("BWD_MAX_GPU_HEAD_DIM") = FC_BWD_MAX_GPU_HEAD_DIM;
    m.attr("MAX_HEAD_DIM") = FC_MAX_HEAD_DIM;
    m.attr("MAX_SCALE") = (double)FC_MAX_SCALE;  // (scale_ok's bound, for the op path's _flip_scale)
    m.def("picked_kernel", &picked_kernel, "kernel that kernel='auto' runs for (q, k)");
    m.def("bwd_device_check", &bwd_device_check, "why the GPU backward cannot run at head dim D with this kernel "
          "id on this CUDA device; empty if it can", py::arg("D"), py::arg("kernel"), py::arg("device"));
    m.def("num_splits", &num_splits_for, "split-KV plan for (q, k, v, causal_mode, kernel, num_splits, window): "
          "0 = tile kernel, n >= 1 = split-KV kernel with n splits", py::arg("q"), py::arg("k"), py::arg("v"),
          py::arg("causal"), py::arg("kernel"), py::arg("num_splits"), py::arg("window") = pybind11::none());
#ifdef FC_HAVE_SM90
    m.def("sm90_route", &sm90_route, "the sm90 instantiation (B, Hq, Hkv, Sq, Sk, D, causal_mode, num_sms, "
          "window=None: the C API's (window_left, window_right), Dv=0: v's head dim) runs",
          py::arg("B"), py::arg("Hq"), py::arg("Hkv"), py::arg("Sq"), py::arg("Sk"), py::arg("D"),
          py::arg("causal"), py::arg("num_sms"), py::arg("window") = pybind11::none(), py::arg("Dv") = 0);
#endif
    m.def("set_poison_outputs", [](bool on) { poison_outputs = on; },
          "tests: fill out and lse with NaN (scratch with 0xff) before every launch");
    m.def("arch_reason", [](int kernel, int cc_major, int cc_minor) {
        const char* r = fc_arch_reason((fc_kernel)kernel, cc_major, cc_minor);
        return r ? std::string(r) : std::string();
    }, "why `kernel` cannot run on compute capability (major, minor); empty if it can");
}
