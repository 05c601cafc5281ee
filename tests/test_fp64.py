"""fp64 inputs on the CPU: the C path in fp64 throughout (scale, scores, softmax, O and the LSE), so
results match SDPA's fp64 to rounding and torch.autograd.gradcheck runs; fp64 on CUDA is refused
(test_errors.test_cuda_other_dtypes_are_type_errors)."""
import ctypes
import math

import pytest
import torch
import torch.nn.functional as F

import flashcore
from conftest import band, make_qkv

F64 = torch.float64
TIGHT = dict(atol=1e-12, rtol=1e-12)


def _sdpa(q, k, v, mask, scale):
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = (q @ k.transpose(-1, -2)) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)  # (rows that see no key: 0, as flashcore gives them)
    return p @ v, lse


@pytest.mark.parametrize("Sq,Sk,Hq,Hkv,D,Dv", [(1, 1, 2, 2, 64, 64), (17, 23, 4, 2, 64, 64), (113, 203, 4, 1, 96, 96),
                                               (97, 40, 2, 2, 128, 128), (33, 65, 2, 2, 256, 256),
                                               (40, 50, 4, 2, 64, 24)])
@pytest.mark.parametrize("mode", [None, "top_left", "bottom_right", "window"])
def test_fp64_matches_sdpa(Sq, Sk, Hq, Hkv, D, Dv, mode):
    """Every shape kind (odd lengths, Sq != Sk, GQA, every head dim, v's own head dim) and mask (both
    causal alignments, a window) agrees with fp64 SDPA (math backend, its mask as a bool tensor) to
    1e-12; the LSE with torch.logsumexp; a scale that fp32 cannot hold is used as given."""
    torch.manual_seed(Sq * 1000 + Sk)
    q, k, v = make_qkv(2, Hq, Hkv, Sq, Sk, D, F64, "cpu", layouts=("transposed", "contiguous", "sliced"))
    v = v[..., :Dv]
    scale = 0.1234567891234567  # (not an fp32 value)
    kw = {"causal": mode is not None, "causal_alignment": "top_left" if mode in (None, "window") else mode}
    if mode == "window":
        kw["window"] = (5, 0)
        mask = band(Sq, Sk, True, "top_left", 5, 0, "cpu")
    else:
        mask = None if mode is None else band(Sq, Sk, True, mode, None, 0, "cpu")
    out, lse = flashcore.attention(q, k, v, scale=scale, return_lse=True, **kw)
    want, want_lse = _sdpa(q, k, v, mask, scale)
    assert out.dtype == lse.dtype == F64 and out.shape == (2, Hq, Sq, Dv)
    torch.testing.assert_close(out, want, **TIGHT)
    torch.testing.assert_close(lse, want_lse, **TIGHT)  # (-inf where a row sees no key)
    if mask is None or mask.any(-1).all():
        sd = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
        torch.testing.assert_close(out, sd, **TIGHT)
    assert torch.equal(out, flashcore.attention(q, k, v, scale=scale, **kw))  # reruns bit-identical


@pytest.mark.parametrize("kw", [{}, {"causal": True}, {"causal": True, "window": (3, 0)},
                                {"causal": True, "causal_alignment": "bottom_right"}],
                         ids=["full", "causal", "window", "bottom_right"])
@pytest.mark.parametrize("dv", [16, 8])
def test_fp64_gradcheck(kw, dv):
    """torch.autograd.gradcheck passes through out and the LSE together, with GQA (k and v shared by
    two query heads), Sq != Sk (rows that see no key under bottom-right), and v's own head dim."""
    torch.manual_seed(dv)
    q = torch.randn(1, 2, 9, 16, dtype=F64, requires_grad=True)
    k = torch.randn(1, 1, 7, 16, dtype=F64, requires_grad=True)
    v = torch.randn(1, 1, 7, dv, dtype=F64, requires_grad=True)

    def f(q, k, v):
        out, lse = flashcore.attention(q, k, v, return_lse=True, **kw)
        return out, lse.masked_fill(lse == float("-inf"), 0.0)  # (a row with no key: its lse has no gradient)

    assert torch.autograd.gradcheck(f, (q, k, v), check_batched_grad=True)  # (batched: the backward's vmap rule)


def test_fp64_native_dv_backward():
    """v's own head dim runs as it is in the fp64 backward too (as in fp32: no padded copies), with
    the same gradients as the padded call."""
    q, k = (torch.randn(1, 2, 9, 16, dtype=F64) for _ in range(2))
    v = torch.randn(1, 2, 9, 8, dtype=F64)
    assert flashcore._C.native_dv_bwd(q, k, v, 0, flashcore.KERNELS["cpu"], False, None)
    g = torch.randn(1, 2, 9, 8, dtype=F64)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    got = torch.autograd.grad(flashcore.attention(*leaves), leaves, g)
    padded = [t.clone().requires_grad_() for t in (q, k, F.pad(v, (0, 8)))]
    want = torch.autograd.grad(flashcore.attention(*padded), padded, F.pad(g, (0, 8)))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b[..., :a.shape[-1]], **TIGHT)


def test_fp64_gradients_match_sdpa():
    """The backward's dq, dk, dv in fp64 agree with SDPA's fp64 autograd to 1e-11."""
    torch.manual_seed(3)
    q, k, v = make_qkv(2, 4, 2, 37, 45, 64, F64, "cpu")
    g = torch.randn(2, 4, 37, 64, dtype=F64)
    ours = torch.autograd.grad(flashcore.attention(*[t.requires_grad_() for t in (q, k, v)], is_causal=True), (q, k, v), g)
    q2, k2, v2 = (t.detach().requires_grad_() for t in (q, k, v))
    sd = F.scaled_dot_product_attention(q2, k2, v2, is_causal=True, enable_gqa=True)
    want = torch.autograd.grad(sd, (q2, k2, v2), g)
    for a, b in zip(ours, want):
        assert a.dtype == F64
        torch.testing.assert_close(a, b, atol=1e-11, rtol=1e-11)


def test_fp64_compiled_and_refusals():
    """Compiled (aot_eager, fullgraph) bit for bit the eager call; a forced GPU kernel and a dtype mix
    are refused by name."""
    q, k, v = make_qkv(1, 2, 2, 17, 19, 64, F64, "cpu")
    f = torch.compile(lambda q, k, v: flashcore.attention(q, k, v, is_causal=True, return_lse=True),
                      fullgraph=True, backend="aot_eager")
    out, lse = f(q, k, v)
    want, want_lse = flashcore.attention(q, k, v, is_causal=True, return_lse=True)
    assert torch.equal(out, want) and torch.equal(lse, want_lse) and lse.dtype == F64
    with pytest.raises(ValueError, match=r"^kernel: a GPU kernel was forced but q is on the CPU"):
        flashcore.attention(q, k, v, kernel="sm80")
    with pytest.raises(TypeError, match=r"^k: dtype Float differs from q's Double"):
        flashcore.attention(q, k.float(), v)


def test_backward_op_lse_dtype():
    """The backward op refuses an LSE of the wrong dtype (fp32 for fp64 inputs, fp64 for fp32 ones) when
    it runs and when it is traced (its fake implementation, e.g. under torch.export or FakeTensorMode)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    for dtype, other in ((F64, torch.float32), (torch.float32, F64)):
        q, k, v = make_qkv(1, 2, 2, 5, 7, 64, dtype, "cpu")
        out, lse = flashcore.attention(q, k, v, return_lse=True)
        bad = lse.to(other)
        with pytest.raises(ValueError, match=r"^lse: expected a float"):
            torch.ops.flashcore.attention_backward(out, q, k, v, out, bad, None, 0.125, 0)
        with FakeTensorMode() as mode:
            fq, fk, fv, fo, fl = (mode.from_tensor(t) for t in (q, k, v, out, bad))
            with pytest.raises(ValueError, match=r"^lse: expected a float"):
                torch.ops.flashcore.attention_backward(fo, fq, fk, fv, fo, fl, None, 0.125, 0)


def test_c_api_fp64_fields():
    """fc_attn_fwd_check: an fp64 call writes lse64 (lse set is refused), other dtypes may not set
    lse64, and scale64 must be > 0 with scale its fp32 rounding."""
    from test_decode import _lib, _params
    lib = _lib()
    q, k, v = (t.double() for t in make_qkv(1, 2, 2, 5, 7, 64, torch.float32, "cpu"))
    out, lse = torch.empty_like(q), torch.empty(1, 2, 5, dtype=F64)
    why = ctypes.create_string_buffer(1024)
    p = _params(q, k, v, out, flashcore.KERNELS["cpu"], 0)
    p.lse64 = lse.data_ptr()
    assert lib.fc_attn_fwd(ctypes.byref(p), None) == 0
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), **TIGHT)
    torch.testing.assert_close(lse, torch.logsumexp((q @ k.transpose(-1, -2)) / 8, -1), **TIGHT)
    for field, value, status, msg in (("lse", lse.data_ptr(), b"invalid argument", b"lse: an fp64 call writes"),
                                      ("scale64", 0.0, b"invalid scale", b"scale64: 0 must be > 0"),
                                      ("scale64", 0.3, b"invalid scale", b"with scale its fp32 rounding")):
        p = _params(q, k, v, out, flashcore.KERNELS["cpu"], 0)
        setattr(p, field, value)
        st = lib.fc_attn_fwd_check(ctypes.byref(p), why, len(why))
        assert lib.fc_status_string(st) == status and msg in why.value, why.value
    q32, k32, v32 = (t.float() for t in (q, k, v))
    p = _params(q32, k32, v32, torch.empty_like(q32), flashcore.KERNELS["cpu"], 0)
    p.lse64 = lse.data_ptr()
    st = lib.fc_attn_fwd_check(ctypes.byref(p), why, len(why))
    assert lib.fc_status_string(st) == b"invalid argument" and b"lse64: only an fp64 call" in why.value, why.value
    assert math.isfinite(p.scale)
