"""Every input error: the right exception type, a message that names the
argument, and no crash. The table runs on CPU tensors (so it runs in CI) and
again on CUDA tensors when a GPU is present; device-specific errors follow.
"""
import math

import numpy as np
import pytest
import torch

import flashcore
from flashcore import _C

from conftest import GPU_KERNELS, GPU_OK, requires_cuda

B, H, S, D = 2, 4, 16, 64

DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=requires_cuda),
]
# a valid dtype for each device
DTYPE = {"cpu": torch.float32, "cuda": torch.float16}


def t(*shape, dev, dtype=None):
    return torch.randn(*shape, device=dev).to(DTYPE[dev] if dtype is None else dtype)


def qkv(dev, q=(B, H, S, D), k=(B, H, S, D), v=(B, H, S, D)):
    return t(*q, dev=dev), t(*k, dev=dev), t(*v, dev=dev)


def strided(shape, dev):
    """last-dim stride 2: every other element of a (B, H, S, 2D) tensor"""
    b, h, s, d = shape
    x = t(b, h, s, 2 * d, dev=dev)[..., ::2]
    assert x.shape == shape and x.stride(-1) == 2
    return x


def _case(name, build, exc, match):
    return pytest.param(build, exc, match, id=name)


def _with(dev, args=None, **kw):
    q, k, v = qkv(dev) if args is None else args
    return (q, k, v), kw


# Each builder takes the device and returns (args, kwargs) for flashcore.attention.
CASES = [
    # --- shapes ---------------------------------------------------------
    # (SDPA's other ranks are taken: test_shapes.py)
    _case("q_ndim1", lambda d: ((t(D, dev=d), *qkv(d)[1:]), {}), ValueError, r"\bq\b.*at least 2 dims"),
    _case("k_ndim5_batch", lambda d: ((qkv(d)[0], t(3, B + 1, H, S, D, dev=d), qkv(d)[2]), {}), ValueError,
          r"\bk\b: the batch dims \(all but the last three\) of shape \(3, 3, 4, 16, 64\) do not broadcast with "
          r"q's \(2, 4, 16, 64\)"),
    _case("v_ndim1", lambda d: ((*qkv(d)[:2], t(D, dev=d)), {}), ValueError, r"\bv\b.*at least 2 dims"),
    _case("k_batch", lambda d: (qkv(d, k=(B + 1, H, S, D), v=(B + 1, H, S, D)), {}), ValueError, r"\bk\b.*batch"),
    _case("v_batch", lambda d: (qkv(d, v=(B + 1, H, S, D)), {}), ValueError, r"\bv\b.*batch"),
    _case("k_headdim", lambda d: (qkv(d, k=(B, H, S, 32)), {}), ValueError, r"\bk\b.*head dim"),
    # (v's head dim may differ from q's, as in SDPA: test_shapes.py; up to 256)
    _case("v_headdim", lambda d: (qkv(d, v=(B, H, S, 264)), {}), ValueError, r"\bv\b: head dim 264 exceeds 256"),
    _case("kv_heads", lambda d: (qkv(d, v=(B, 2, S, D)), {}), ValueError, r"\bv\b.*heads.*\bk\b"),
    _case("hq_not_div_hkv", lambda d: (qkv(d, q=(B, 8, S, D), k=(B, 3, S, D), v=(B, 3, S, D)), {}),
          ValueError, r"\bk\b.*divide"),
    _case("hkv_gt_hq", lambda d: (qkv(d, q=(B, 2, S, D), k=(B, 4, S, D), v=(B, 4, S, D)), {}),
          ValueError, r"\bk\b.*divide"),
    _case("kv_seqlen", lambda d: (qkv(d, k=(B, H, S, D), v=(B, H, S + 1, D)), {}), ValueError,
          r"\bv\b.*sequence length"),
    # (head dims that are not multiples of 8 run zero-padded: test_shapes.test_head_dims_not_multiple_of_8)
    _case("headdim_264", lambda d: (qkv(d, *[(B, H, S, 264)] * 3), {}), ValueError, r"head dim.*\b264\b"),
    _case("headdim_512", lambda d: (qkv(d, *[(B, H, S, 512)] * 3), {}), ValueError, r"head dim.*\b512\b"),
    # --- strides --------------------------------------------------------
    _case("q_last_stride", lambda d: ((strided((B, H, S, D), d), *qkv(d)[1:]), {}), ValueError,
          r"\bq\b.*last dim.*contiguous"),
    _case("k_last_stride", lambda d: ((qkv(d)[0], strided((B, H, S, D), d), qkv(d)[2]), {}), ValueError,
          r"\bk\b.*last dim.*contiguous"),
    _case("v_last_stride", lambda d: ((*qkv(d)[:2], strided((B, H, S, D), d)), {}), ValueError,
          r"\bv\b.*last dim.*contiguous"),
    # --- empty ----------------------------------------------------------
    # (empty B, H and S are valid: test_empty.py)
    _case("headdim0", lambda d: (qkv(d, *[(B, H, S, 0)] * 3), {}), ValueError, r"\bq\b.*head dim.*\b0\b"),
    _case("kv_heads0", lambda d: (qkv(d, k=(B, 0, S, D), v=(B, 0, S, D)), {}), ValueError, r"\bk\b.*0 KV heads"),
    _case("headdim0_empty_batch", lambda d: (qkv(d, *[(0, H, S, 0)] * 3), {}), ValueError, r"\bq\b.*head dim"),
    # --- scale ----------------------------------------------------------
    _case("scale_nan", lambda d: _with(d, scale=float("nan")), ValueError, r"\bscale\b"),
    # (0 and negative scales run: test_scale_zero_and_negative)
    _case("scale_negative_underflows_fp32", lambda d: _with(d, scale=-1e-50), ValueError,
          r"\bscale\b: got -1e-50.*fp32"),
    _case("scale_negative_overflows", lambda d: _with(d, scale=-3e38), ValueError, r"\bscale\b: got -3e\+38"),
    _case("scale_inf", lambda d: _with(d, scale=math.inf), ValueError, r"\bscale\b"),
    _case("scale_neg_inf", lambda d: _with(d, scale=-math.inf), ValueError, r"\bscale\b"),
    _case("scale_underflows_fp32", lambda d: _with(d, scale=1e-50), ValueError, r"\bscale\b: got 1e-50.*fp32"),
    _case("scale_overflows_fp32", lambda d: _with(d, scale=1e300), ValueError, r"\bscale\b: got 1e\+300.*fp32"),
    _case("scale_huge_int", lambda d: _with(d, scale=10**400), ValueError, r"\bscale\b.*out of range"),
    _case("scale_str", lambda d: _with(d, scale="0.5"), TypeError, r"\bscale\b: expected a float, got str"),
    _case("scale_bool", lambda d: _with(d, scale=True), TypeError, r"\bscale\b: expected a float, got bool"),
    _case("scale_numpy_bool", lambda d: _with(d, scale=np.bool_(True)), TypeError,
          r"\bscale\b: expected a float, got numpy\.bool"),
    _case("scale_list", lambda d: _with(d, scale=[0.5]), TypeError, r"\bscale\b: expected a float, got list"),
    _case("scale_tensor", lambda d: _with(d, scale=torch.tensor(0.5)), TypeError, r"\bscale\b: expected a float"),
    # --- flags (SDPA's bools: True or False, not any truthy object) -------
    _case("is_causal_int", lambda d: _with(d, is_causal=2), TypeError, r"\bis_causal\b: expected a bool, got int"),
    _case("is_causal_str", lambda d: _with(d, is_causal="no"), TypeError, r"\bis_causal\b: expected a bool"),
    _case("is_causal_none", lambda d: _with(d, is_causal=None), TypeError, r"\bis_causal\b: expected a bool"),
    _case("is_causal_tensor", lambda d: _with(d, is_causal=torch.tensor([True, False])), TypeError,
          r"\bis_causal\b: expected a bool"),
    _case("causal_int", lambda d: _with(d, causal=1), TypeError, r"\bcausal\b: expected None or a bool"),
    _case("return_lse_str", lambda d: _with(d, return_lse="no"), TypeError, r"\breturn_lse\b: expected a bool"),
    _case("enable_gqa_str", lambda d: _with(d, enable_gqa="yes"), TypeError, r"\benable_gqa\b: expected a bool"),
    _case("scale_too_large", lambda d: _with(d, scale=3e38), ValueError, r"\bscale\b: got 3e\+38.*2\.3e38"),
    _case("scale_array", lambda d: _with(d, scale=np.array([0.5, 1.0])), TypeError,
          r"\bscale\b: expected a float, got numpy.ndarray that does not convert"),
    # --- unsupported SDPA arguments --------------------------------------
    # (attn_mask: tests/test_attn_mask.py)
    _case("dropout", lambda d: _with(d, dropout_p=0.1), ValueError, r"\bdropout_p\b"),
    _case("dropout_one", lambda d: _with(d, dropout_p=1.0), ValueError, r"\bdropout_p\b"),
    _case("dropout_tensor", lambda d: _with(d, dropout_p=torch.tensor([0.0, 0.0])), TypeError,
          r"\bdropout_p\b: expected a float"),
    _case("dropout_numpy_bool", lambda d: _with(d, dropout_p=np.bool_(False)), TypeError,
          r"\bdropout_p\b: expected a float, got numpy\.bool"),
    _case("dropout_str", lambda d: _with(d, dropout_p="0"), TypeError, r"\bdropout_p\b: expected a float"),
    # --- options --------------------------------------------------------
    _case("kernel_unknown", lambda d: _with(d, kernel="sm100"), ValueError, r"\bkernel\b"),
    _case("kernel_uppercase", lambda d: _with(d, kernel="CPU"), ValueError, r"\bkernel\b"),
    _case("kernel_empty", lambda d: _with(d, kernel=""), ValueError, r"\bkernel\b"),
    _case("alignment_unknown", lambda d: _with(d, causal=True, causal_alignment="bottom-right"),
          ValueError, r"\bcausal_alignment\b"),
    _case("alignment_unknown_is_causal", lambda d: _with(d, is_causal=True, causal_alignment="left"),
          ValueError, r"\bcausal_alignment\b"),
    _case("causal_disagree", lambda d: _with(d, is_causal=True, causal=False), ValueError, r"causal"),
    _case("alignment_unknown_not_causal", lambda d: _with(d, causal_alignment="bottom-right"),
          ValueError, r"\bcausal_alignment\b"),
    _case("alignment_none", lambda d: _with(d, causal_alignment=None), ValueError, r"\bcausal_alignment\b"),
    # --- dtypes ---------------------------------------------------------
    _case("q_complex64", lambda d: ((t(B, H, S, D, dev=d, dtype=torch.complex64),
                                     *[x.to(torch.complex64) for x in qkv(d)[1:]]), {}), TypeError, r"\bq\b.*dtype"),
    _case("q_int32", lambda d: ((torch.ones(B, H, S, D, dtype=torch.int32, device=d), *qkv(d)[1:]), {}),
          TypeError, r"\bq\b.*dtype"),
    _case("k_dtype_mismatch", lambda d: ((qkv(d)[0], qkv(d)[1].to(torch.bfloat16), qkv(d)[2]), {}),
          TypeError, r"\bk\b.*dtype"),
    _case("v_dtype_mismatch", lambda d: ((*qkv(d)[:2], qkv(d)[2].to(torch.bfloat16)), {}),
          TypeError, r"\bv\b.*dtype"),
    _case("k_float64", lambda d: ((qkv(d)[0], qkv(d)[1].double(), qkv(d)[2]), {}), TypeError, r"\bk\b.*dtype"),
    _case("q_not_a_tensor", lambda d: ((None, *qkv(d)[1:]), {}), TypeError, r"\bq\b: expected a torch.Tensor"),
    _case("k_not_a_tensor", lambda d: ((qkv(d)[0], 1.0, qkv(d)[2]), {}), TypeError,
          r"\bk\b: expected a torch.Tensor, got float"),
    _case("v_not_a_tensor", lambda d: ((*qkv(d)[:2], [[0.0]]), {}), TypeError, r"\bv\b: expected a torch.Tensor"),
    # --- lengths past FC_MAX_SEQ_LEN (2^30): stride-0 views, nothing allocated
    _case("sk_too_long", lambda d: ((qkv(d)[0], *[x[:, :, :1].expand(B, H, 2**30 + 1, D) for x in qkv(d)[1:]]), {}),
          ValueError, r"Sk=1073741825.*2\^30"),
    _case("sk_near_int32_max", lambda d: ((qkv(d)[0], *[x[:, :, :1].expand(B, H, 2**31 - 1, D)
                                                        for x in qkv(d)[1:]]), {}), ValueError, r"Sk=2147483647"),
    _case("sq_too_long", lambda d: ((qkv(d)[0][:, :, :1].expand(B, H, 2**30 + 1, D), *qkv(d)[1:]), {}),
          ValueError, r"Sq=1073741825.*2\^30"),
]


def _check_raises(dev, build, exc, match):
    args, kwargs = build(dev)
    with pytest.raises(exc, match=match) as info:
        flashcore.attention(*args, **kwargs)
    msg = str(info.value)
    assert len(msg) >= 10, f"message too terse: {msg!r}"
    # the C++ binding's argument messages carry a hint on how to fix it
    if dev == "cuda":
        torch.cuda.synchronize()  # the device is still healthy
    return msg


@pytest.mark.parametrize("build,exc,match", CASES)
@pytest.mark.parametrize("dev", DEVICES)
def test_error(dev, build, exc, match):
    _check_raises(dev, build, exc, match)


@pytest.mark.parametrize("kernel", ["sm80", "sm90"])
def test_gpu_kernel_forced_on_cpu_tensors(kernel):
    q, k, v = qkv("cpu")
    with pytest.raises(ValueError, match=r"\bkernel\b.*CPU") as info:
        flashcore.attention(q, k, v, kernel=kernel)
    assert "auto" in str(info.value) or "CUDA" in str(info.value)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_cpu_accepts_all_three_dtypes(dtype):
    q, k, v = [x.to(dtype) for x in qkv("cpu")]
    out = flashcore.attention(q, k, v)
    assert out.dtype == dtype and torch.isfinite(out).all()


def test_message_shows_shape():
    q, k, v = qkv("cpu")
    with pytest.raises(ValueError, match=r"\(64,\)"):
        flashcore.attention(q[0, 0, 0], k, v)


def test_alignment_checked_without_causal():
    """causal_alignment is validated whether or not a causal mask is requested,
    and a valid one without causal changes nothing."""
    q, k, v = qkv("cpu")
    with pytest.raises(ValueError, match=r"\bcausal_alignment\b"):
        flashcore.attention(q, k, v, causal_alignment="nonsense")
    out = flashcore.attention(q, k, v, causal_alignment="bottom_right")
    assert torch.equal(out, flashcore.attention(q, k, v))


def test_scale_takes_any_real_number():
    """scale: a float, an int or a numpy scalar, as SDPA's float argument."""
    q, k, v = qkv("cpu")
    ref = flashcore.attention(q, k, v, scale=0.125)
    for s in (np.float32(0.125), np.float64(0.125)):
        assert torch.equal(flashcore.attention(q, k, v, scale=s), ref)
    assert torch.equal(flashcore.attention(q, k, v, scale=1), flashcore.attention(q, k, v, scale=1.0))
    assert torch.isfinite(flashcore.attention(q, k, v, scale=1e-40)).all()  # an fp32 denormal is still > 0


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("scale", [0.0, -0.0, -0.125, -2, np.float32(-0.3)], ids=str)
def test_scale_zero_and_negative(dev, scale):
    """A scale <= 0 (SDPA takes one) runs as q * 0 at scale 1, or -q at -scale: against the fp64 softmax
    of scale * q k^T (SDPA's math backend's result; its default CPU backend gives NaN for causal
    calls here, torch 2.14), out, LSE and gradients, causal and not, every kernel on the GPU; a NaN in
    q still makes its row NaN at scale 0; compiled as eager."""
    kernels = ["auto"] if dev == "cpu" else GPU_KERNELS
    for causal in (False, True):
        for kernel in kernels:
            q, k, v = (x.requires_grad_() for x in qkv(dev))
            out, lse = flashcore.attention(q, k, v, scale=scale, is_causal=causal, return_lse=True, kernel=kernel)
            q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
            s = (q64 @ k64.transpose(-1, -2)) * float(scale)
            if causal:
                s = s.masked_fill(torch.ones(S, S, dtype=torch.bool, device=dev).triu(1), float("-inf"))
            want, want_lse = torch.softmax(s, -1) @ v64, torch.logsumexp(s, -1)
            tol = 1e-5 if dev == "cpu" else 2e-3
            torch.testing.assert_close(out.double(), want, atol=tol, rtol=tol)
            torch.testing.assert_close(lse.double(), want_lse, atol=1e-4, rtol=1e-5)
            g = torch.randn_like(want)
            got = torch.autograd.grad(out, (q, k, v), g.to(out.dtype))
            ref = torch.autograd.grad(want, (q64, k64, v64), g)
            for a, b in zip(got, ref):
                torch.testing.assert_close(a.double(), b, atol=10 * tol * max(1.0, b.abs().max().item()), rtol=0)
    q, k, v = qkv(dev)
    if float(scale) == 0:
        q[0, 0, 3, 5] = float("nan")
        out = flashcore.attention(q, k, v, scale=scale)
        assert out[0, 0, 3].isnan().all() and not out[0, 0, 4].isnan().any()
    elif dev == "cpu":
        s = float(scale)  # (a numpy float32 is data to dynamo: the traced call cannot flip it)
        f = torch.compile(lambda q, k, v: flashcore.attention(q, k, v, scale=s, is_causal=True),
                          fullgraph=True, backend="aot_eager")
        assert torch.equal(f(q, k, v), flashcore.attention(q, k, v, scale=s, is_causal=True))
        torch._dynamo.reset()


def test_usable_after_errors():
    """A bad call leaves nothing broken: a good call right after still works."""
    q, k, v = qkv("cpu")
    for bad in ({"scale": float("nan")}, {"kernel": "nope"}, {"dropout_p": 0.5}):
        with pytest.raises(ValueError):
            flashcore.attention(q, k, v, **bad)
    out = flashcore.attention(q, k, v)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("which", ["q", "k", "v"])
@pytest.mark.parametrize("dev", DEVICES)
def test_requires_grad_records(dev, which):
    """An input that requires grad gets an output with a grad_fn, and backward fills its
    gradient (tests/test_backward.py checks the values)."""
    args = dict(zip("qkv", qkv(dev)))
    args[which].requires_grad_(True)
    out = flashcore.attention(args["q"], args["k"], args["v"])
    assert out.grad_fn is not None
    out.float().sum().backward()
    g = args[which].grad
    assert g is not None and g.shape == args[which].shape and torch.isfinite(g).all()
    with torch.no_grad():
        assert torch.equal(out, flashcore.attention(args["q"], args["k"], args["v"]))


def test_raw_fwd_refuses_requires_grad():
    """_C.fwd, the raw entry point for tests and benchmarks, has no autograd formula: it refuses."""
    q, k, v = qkv("cpu")
    q.requires_grad_(True)
    with pytest.raises(ValueError, match=r"^q: requires grad.*flashcore.attention"):
        _C.fwd(q, k, v, 0.125, 0, flashcore.KERNELS["cpu"], False, 0)


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "detach"])
@pytest.mark.parametrize("dev", DEVICES)
def test_requires_grad_outside_autograd(dev, mode):
    """The same inputs run where autograd does not record, and match a call on plain tensors."""
    q, k, v = qkv(dev)
    want = flashcore.attention(q, k, v)
    gq, gk, gv = (x.clone().requires_grad_(True) for x in (q, k, v))
    if mode == "no_grad":
        with torch.no_grad():
            out = flashcore.attention(gq, gk, gv)
    elif mode == "inference_mode":
        with torch.inference_mode():
            out = flashcore.attention(gq, gk, gv)
    else:
        out = flashcore.attention(gq.detach(), gk.detach(), gv.detach())
    assert not out.requires_grad
    assert torch.equal(out, want)


# ---------------------------------------------------------------------------
# CUDA-only errors
# ---------------------------------------------------------------------------


@requires_cuda
@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_cuda_float32_is_type_error(which):
    q, k, v = qkv("cuda")
    args = {"q": q, "k": k, "v": v}
    args = {n: (x.float() if n == which or which == "q" else x) for n, x in args.items()}
    # which == "q": all fp32, so q's own dtype check fires first
    with pytest.raises(TypeError, match=rf"\b{which}\b.*dtype.*(float16|bfloat16)"):
        flashcore.attention(args["q"], args["k"], args["v"])
    torch.cuda.synchronize()


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float64, torch.int8])
def test_cuda_other_dtypes_are_type_errors(dtype):
    q, k, v = [x.to(dtype) for x in qkv("cuda")]
    with pytest.raises(TypeError, match=r"\bq\b.*dtype"):
        flashcore.attention(q, k, v)


@requires_cuda
@pytest.mark.parametrize("cpu_one", ["k", "v"])
def test_cuda_cpu_mix_names_tensor(cpu_one):
    q, k, v = qkv("cuda")
    if cpu_one == "k":
        k = k.cpu()
    else:
        v = v.cpu()
    with pytest.raises(ValueError, match=rf"\b{cpu_one}\b.*\bcpu\b") as info:
        flashcore.attention(q, k, v)
    assert "cuda" in str(info.value)
    torch.cuda.synchronize()


@requires_cuda
def test_cuda_q_on_cpu_kv_on_cuda():
    q, k, v = qkv("cuda")
    with pytest.raises(ValueError, match=r"\bk\b.*\bcuda"):
        flashcore.attention(q.cpu(), k, v)
    torch.cuda.synchronize()


@requires_cuda
def test_cuda_kernel_cpu_forced():
    q, k, v = qkv("cuda")
    with pytest.raises(ValueError, match=r"\bkernel\b.*cpu"):
        flashcore.attention(q, k, v, kernel="cpu")
    torch.cuda.synchronize()


@requires_cuda
def test_cuda_sm90_forced_off_hopper():
    """Forcing the Hopper kernel off a Hopper GPU (or before it is built) is a
    RuntimeError with a reason, never a crash."""
    cap = torch.cuda.get_device_capability()
    if cap == (9, 0) and "sm90" in GPU_KERNELS:
        pytest.skip("the sm90 kernel runs here; covered by test_gpu.py")
    q, k, v = qkv("cuda")
    with pytest.raises(RuntimeError, match=r"(?i)sm_?90|9\.0|hopper|built") as info:
        flashcore.attention(q, k, v, kernel="sm90")
    assert str(info.value).startswith("flashcore")
    torch.cuda.synchronize()
    if GPU_OK:  # the GPU still works afterwards
        assert torch.isfinite(flashcore.attention(q, k, v)).all()


@requires_cuda
def test_cuda_sm80_forced_on_old_gpu():
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) >= (8, 0):
        pytest.skip("GPU is sm80 or newer")
    q, k, v = qkv("cuda")
    with pytest.raises(RuntimeError, match=r"sm80|8\.0"):
        flashcore.attention(q, k, v, kernel="sm80")


