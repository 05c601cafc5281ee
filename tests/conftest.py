"""Shared helpers for the flashcore test suite.

The test modules import the helpers below with ``from conftest import ...``
(pytest puts this directory on sys.path, since tests/ has no __init__.py).

Correctness protocol (docs: /work/shared/GUIDE.md section 3):
  * reference = fp64 math (fp32 without TF32 on GPUs with slow fp64) on the
    upcast low-precision inputs, causal mask built explicitly for both
    alignments;
  * pass rule  max|out - ref| <= 2 * max|sdpa_lowprec - ref| + eps, and for
    fp16 also allclose(out, sdpa_out, atol=1e-3, rtol=1e-3);
  * fresh random inputs per test, seeded from the test id; every call fills
    out and lse with NaN (and allocated scratch with 0xff bytes) before its
    launch (the binding's test switch, _C.set_poison_outputs, on for the whole
    suite), so unwritten elements show up;
  * fully masked rows give out == 0 exactly and lse == -inf.
"""
import math
import zlib

import pytest
import torch
import torch.nn.functional as F

import flashcore
from flashcore import _C

# ---------------------------------------------------------------------------
# Devices and kernels
# ---------------------------------------------------------------------------

HAS_CUDA = torch.cuda.is_available()

# Poisoned outputs for every call the suite makes (see the module docstring).
_C.set_poison_outputs(True)


def _gpu_status():
    """(ok, reason): whether the GPU tests can run on this machine."""
    if not HAS_CUDA:
        return False, "no CUDA device (torch.cuda.is_available() is False)"
    major, minor = torch.cuda.get_device_capability()
    why = _C.arch_reason(flashcore.KERNELS["auto"], major, minor)
    if why:
        return False, f"flashcore cannot run on compute capability {major}.{minor}: {why}"
    return True, ""


GPU_OK, GPU_SKIP_REASON = _gpu_status()
requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device (torch.cuda.is_available() is False)")
requires_gpu = pytest.mark.skipif(not GPU_OK, reason=GPU_SKIP_REASON or "GPU available")


def _probe_kernel(name):
    """True when forcing kernel `name` runs on the current GPU (tiny call)."""
    try:
        q = torch.randn(1, 1, 16, 64, device="cuda", dtype=torch.float16)
        out = flashcore.attention(q, q, q, kernel=name)
        torch.cuda.synchronize()
        return bool(torch.isfinite(out).all())
    except Exception:  # noqa: BLE001 -- any failure means "not available"
        return False


def _gpu_kernels():
    """GPU kernels to parametrize the correctness tests over.

    "sm80" always (tests skip when there is no usable GPU); "sm90" only on a
    compute-capability-9.0 device where forcing it works, so the Hopper kernel
    gets covered automatically once it is built.
    """
    kernels = ["sm80"]
    if GPU_OK and torch.cuda.get_device_capability() == (9, 0) and _probe_kernel("sm90"):
        kernels.append("sm90")
    return kernels


GPU_KERNELS = _gpu_kernels()

# ---------------------------------------------------------------------------
# Seeding: every test gets its own reproducible seed from its node id.
# ---------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _seed_per_test(request):
    seed = zlib.crc32(request.node.nodeid.encode()) & 0x7FFFFFFF
    torch.manual_seed(seed)  # seeds the CPU and every CUDA generator
    yield seed


# ---------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------

DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
CAUSAL_MODES = [None, "top_left", "bottom_right"]  # None = no causal mask


def mode_id(mode):
    return "nocausal" if mode is None else mode


def rand(shape, dtype, device, layout="contiguous"):
    """A random (B, H, S, D) tensor of `dtype` laid out as `layout`.

    layouts (the last dim is always contiguous):
      contiguous   plain randn
      transposed   a (B, S, H, D) tensor .transpose(1, 2)
      sliced       x[..., :D] of a (B, H, S, 2D) tensor (row stride 2D)
      sliced_hi    x[..., D:] of a (B, H, S, 2D) tensor (nonzero offset, 16-byte aligned for D % 8 == 0)
      batch_step   x[::2] of a (2B, H, S, D) tensor (batch stride doubled)
      expanded     a (B, 1, S, D) tensor .expand(B, H, S, D) (head stride 0)
    """
    B, H, S, D = shape
    if layout == "contiguous":
        return torch.randn(B, H, S, D, device=device).to(dtype)
    if layout == "transposed":
        return torch.randn(B, S, H, D, device=device).to(dtype).transpose(1, 2)
    if layout == "sliced":
        return torch.randn(B, H, S, 2 * D, device=device).to(dtype)[..., :D]
    if layout == "sliced_hi":
        return torch.randn(B, H, S, 2 * D, device=device).to(dtype)[..., D:]
    if layout == "batch_step":
        return torch.randn(2 * B, H, S, D, device=device).to(dtype)[::2]
    if layout == "expanded":
        return torch.randn(B, 1, S, D, device=device).to(dtype).expand(B, H, S, D)
    raise AssertionError(f"unknown layout {layout!r}")


def make_qkv(B, Hq, Hkv, Sq, Sk, D, dtype, device, layouts=("contiguous",) * 3, mult=1.0):
    """Fresh random q (B,Hq,Sq,D), k and v (B,Hkv,Sk,D); `mult` scales q."""
    q = rand((B, Hq, Sq, D), dtype, device, layouts[0])
    if mult != 1.0:
        q = (q.float() * mult).to(dtype)
    k = rand((B, Hkv, Sk, D), dtype, device, layouts[1])
    v = rand((B, Hkv, Sk, D), dtype, device, layouts[2])
    return q, k, v


# ---------------------------------------------------------------------------
# Reference
# ---------------------------------------------------------------------------


def visible_mask(Sq, Sk, mode, device="cpu"):
    """Bool (Sq, Sk): True where query i may attend to key j."""
    i = torch.arange(Sq, device=device).unsqueeze(1)
    j = torch.arange(Sk, device=device).unsqueeze(0)
    if mode is None:
        return torch.ones(Sq, Sk, dtype=torch.bool, device=device)
    if mode == "top_left":
        return j <= i
    if mode == "bottom_right":
        return j <= i + (Sk - Sq)
    raise AssertionError(f"unknown causal mode {mode!r}")


def band(Sq, Sk, causal, alignment, left, right, device):
    """Bool (Sq, Sk): True where query i sees key j under a causal mode and a window (left, right;
    None: no bound), the diagonal at 0 or (bottom_right) Sk - Sq."""
    i = torch.arange(Sq, device=device).unsqueeze(1)
    j = torch.arange(Sk, device=device).unsqueeze(0)
    d = Sk - Sq if alignment == "bottom_right" else 0
    vis = torch.ones(Sq, Sk, dtype=torch.bool, device=device)
    if causal:
        right = 0 if right is None else right
    if left is not None:
        vis &= j >= i + d - left
    if right is not None:
        vis &= j <= i + d + right
    return vis


def live_rows(Sq, Sk, mode):
    """range of query rows that see at least one key (a contiguous tail)."""
    if mode == "bottom_right" and Sq > Sk:
        return range(Sq - Sk, Sq)
    return range(0, Sq)


def expand_kv(q, k, v):
    """Repeat k/v heads for GQA: query head h reads kv head h // (Hq // Hkv)."""
    Hq, Hkv = q.shape[1], k.shape[1]
    if Hq == Hkv:  # (Hq = Hkv = 0 included: an empty call)
        return k, v
    assert Hq % Hkv == 0
    return k.repeat_interleave(Hq // Hkv, dim=1), v.repeat_interleave(Hq // Hkv, dim=1)


def default_scale(q):
    return 1.0 / math.sqrt(q.shape[-1])


# fp64 reference math, except on GPUs whose fp64 rate is a small fraction of
# fp32 (consumer and L-series parts): fp32 there, with TF32 off. Either is far
# more accurate than the fp16/bf16 tolerances need.
FAST_FP64_CC = {(6, 0), (7, 0), (8, 0), (9, 0), (10, 0)}
torch.set_float32_matmul_precision("highest")  # no TF32 in reference matmuls


def ref_dtype(device):
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.get_device_capability(device) not in FAST_FP64_CC:
        return torch.float32
    return torch.float64


def ref_attention(q, k, v, scale=None, causal_mode=None, dtype=None, vis=None):
    """Reference attention in `dtype` (default ref_dtype: fp64) on the upcast inputs.

    Returns (out, lse): out (B, Hq, Sq, D) and lse (B, Hq, Sq) in `dtype`, the
    natural-log logsumexp of scale * q k^T over the visible keys (those of
    causal_mode, or of the bool (Sq, Sk) mask vis where given). Rows that see
    no key give out 0 and lse -inf.
    """
    if scale is None:
        scale = default_scale(q)
    if dtype is None:
        dtype = ref_dtype(q.device)
    k, v = expand_kv(q, k, v)
    qf, kf, vf = q.to(dtype), k.to(dtype), v.to(dtype)
    Sq, Sk = q.shape[2], k.shape[2]
    s = torch.matmul(qf, kf.transpose(-1, -2)) * scale
    if vis is None:
        vis = visible_mask(Sq, Sk, causal_mode, q.device)
    s = s.masked_fill(~vis, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # -inf for a fully masked row
    dead = ~vis.any(dim=-1)  # (Sq,)
    safe_lse = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    p = torch.exp(s - safe_lse.unsqueeze(-1))  # exp(-inf) = 0 on masked entries
    p = p.masked_fill(dead.view(1, 1, Sq, 1), 0.0)
    out = torch.matmul(p, vf)
    return out, lse


def sdpa_lowprec(q, k, v, scale, mode):
    """torch SDPA on the low-precision inputs for the rows that see a key.

    Returns (rows, out_rows): a slice of query rows and SDPA's output there.
    top_left / none use SDPA's own is_causal; bottom_right uses an explicit
    boolean mask (its fully masked rows are left out, SDPA gives NaN there).
    """
    Sq, Sk = q.shape[2], k.shape[2]
    k, v = expand_kv(q, k, v)
    rows = live_rows(Sq, Sk, mode)
    rs = slice(rows.start, rows.stop)
    q = q[:, :, rs]
    if mode == "bottom_right":
        kw = {"attn_mask": visible_mask(Sq, Sk, mode, q.device)[rs]}
    else:
        kw = {"is_causal": mode == "top_left"}
    # SDPA's CUDA kernels put B and H in 65535-limited grid dims: chunk them.
    B, H = q.shape[:2]
    if B <= SDPA_CHUNK and H <= SDPA_CHUNK:
        return rs, F.scaled_dot_product_attention(q, k, v, scale=scale, **kw)
    out = torch.empty_like(q)
    for b in range(0, B, SDPA_CHUNK):
        for h in range(0, H, SDPA_CHUNK):
            i = (slice(b, b + SDPA_CHUNK), slice(h, h + SDPA_CHUNK))
            out[i] = F.scaled_dot_product_attention(q[i], k[i], v[i], scale=scale, **kw)
    return rs, out


SDPA_CHUNK = 4096


# Additive slack of the 2x rule, per dtype.
EPS = {torch.float16: 1e-4, torch.bfloat16: 1e-3, torch.float32: 1e-5}
# Absolute tolerance of the LSE against the fp64 reference LSE.
LSE_ATOL = {torch.float16: 1e-3, torch.bfloat16: 2e-3, torch.float32: 1e-4}


def call(q, k, v, mode, kernel="auto", scale=None, return_lse=True, **kw):
    """flashcore.attention with the test's causal mode."""
    if mode is None:
        return flashcore.attention(q, k, v, scale=scale, kernel=kernel, return_lse=return_lse, **kw)
    return flashcore.attention(q, k, v, scale=scale, causal=True, causal_alignment=mode,
                               kernel=kernel, return_lse=return_lse, **kw)


def run_poisoned(q, k, v, mode, kernel="auto", scale=None, **kw):
    """Run flashcore with out and lse poisoned (as every call in the suite is;
    returns out, lse, synchronized)."""
    out, lse = call(q, k, v, mode, kernel=kernel, scale=scale, return_lse=True, **kw)
    if q.is_cuda:
        torch.cuda.synchronize()
    return out, lse


def _maxerr(a, b):
    if a.numel() == 0:
        return 0.0
    return (a.double() - b.double()).abs().max().item()


def check_attention(out, lse, q, k, v, scale, mode, *, sdpa=True, lse_atol=None, eps=None):
    """Check flashcore's (out, lse) for (q, k, v) against the reference.

    * shape, dtype, device; no NaN/Inf in out; no NaN/+inf in lse
    * fully masked rows: out == 0 exactly, lse == -inf exactly
    * max|out - ref| <= 2 * max|sdpa_lowprec - ref| + eps (sdpa=True), else
      max|out - ref| <= eps
    * fp16: allclose(out, sdpa, atol=1e-3, rtol=1e-3); fp32: allclose(out, ref) at 2e-5
    * |lse - ref_lse| <= lse_atol on the live rows
    """
    B, Hq, Sq, D = q.shape
    Sk = k.shape[2]
    dt = q.dtype
    eps = EPS[dt] if eps is None else eps
    lse_atol = LSE_ATOL[dt] if lse_atol is None else lse_atol
    sc = default_scale(q) if scale is None else scale

    assert out.shape == (B, Hq, Sq, D), f"out shape {tuple(out.shape)}"
    assert out.dtype == dt and out.device == q.device
    assert torch.isfinite(out).all(), f"out has {(~torch.isfinite(out)).sum().item()} NaN/Inf elements"

    ref_out, ref_lse = ref_attention(q, k, v, sc, mode)
    rows = live_rows(Sq, Sk, mode)
    n_dead = rows.start
    if n_dead:
        dead_out = out[:, :, :n_dead]
        assert (dead_out == 0).all(), "fully masked rows must give out == 0 exactly"

    err = _maxerr(out, ref_out)
    if sdpa:
        rs, sd = sdpa_lowprec(q, k, v, sc, mode)
        sd_err = _maxerr(sd, ref_out[:, :, rs])
        tol = 2 * sd_err + eps
        assert err <= tol, (f"max|out-ref| = {err:.3e} > 2*max|sdpa-ref| + eps = "
                            f"2*{sd_err:.3e} + {eps:.0e} ({DTYPE_NAMES[dt]}, mode={mode_id(mode)})")
        if dt == torch.float16:
            assert torch.allclose(out[:, :, rs], sd, atol=1e-3, rtol=1e-3), (
                f"fp16 out vs sdpa: max diff {_maxerr(out[:, :, rs], sd):.3e}")
        elif dt == torch.float32:
            # against the fp64 reference, not SDPA: SDPA's own fp32 error exceeds 2e-5 where scores are
            # large (3.8e-5 at D = 256, scale 0.58, against flashcore's 2.3e-7: FC_FUZZ_SEED=31337 cpu[28])
            assert torch.allclose(out.double(), ref_out, atol=2e-5, rtol=2e-5), (
                f"fp32 out vs the reference: max diff {err:.3e}")
    else:
        assert err <= eps, f"max|out-ref| = {err:.3e} > {eps:.0e}"

    if lse is not None:
        assert lse.shape == (B, Hq, Sq), f"lse shape {tuple(lse.shape)}"
        assert lse.dtype == torch.float32 and lse.device == q.device
        assert not torch.isnan(lse).any(), "lse has NaN"
        assert not torch.isposinf(lse).any(), "lse has +inf"
        exp_dead = torch.isneginf(ref_lse)
        got_dead = torch.isneginf(lse)
        assert torch.equal(got_dead, exp_dead), (
            f"-inf lse rows: got {got_dead.sum().item()}, expected {exp_dead.sum().item()}")
        live = ~exp_dead
        if live.any():
            lerr = _maxerr(lse[live], ref_lse[live])
            assert lerr <= lse_atol, f"max|lse-ref| = {lerr:.3e} > {lse_atol:.0e}"


def dtype_id(dt):
    return DTYPE_NAMES[dt]
