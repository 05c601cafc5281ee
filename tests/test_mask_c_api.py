"""The C API's attention mask (fc_attn_params' mask, mask strides and mask_kind), through ctypes: the
CPU path's forward and backward against fp64 SDPA (math) with the same mask, bool and additive,
broadcast by zero strides, with the causal mode and a window on top; rows the mask hides entirely give
O = 0 and LSE = -inf; the checks refuse a bad mask and a GPU kernel (the CPU path takes masks first:
flashcore.attention does not pass one yet, docs/perf-notes.md session 83)."""
import ctypes
import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashcore
from conftest import band
from test_decode import _lib, _params

CPU = flashcore.KERNELS["cpu"]
DTYPE_ID = {torch.float32: 2, torch.float64: 3}
MASK_BOOL, MASK_ADD = 1, 2
MODES = {None: 0, "top_left": 1, "bottom_right": 2}


class BwdParams(ctypes.Structure):
    """Mirror of fc_attn_bwd_params (csrc/flashcore.h)."""
    _fields_ = ([(n, ctypes.c_void_p) for n in ("q", "k", "v", "o", "dout", "lse", "dlse", "dq", "dk", "dv")]
                + [(f"{t}_{s}_stride", ctypes.c_int64) for t in ("q", "k", "v", "o", "do", "dq", "dk", "dv")
                   for s in ("batch", "head", "row")]
                + [(n, ctypes.c_int) for n in ("B", "Hq", "Hkv", "Sq", "Sk", "D", "dtype")]
                + [("scale", ctypes.c_float), ("causal", ctypes.c_int), ("kernel", ctypes.c_int),
                   ("workspace", ctypes.c_void_p), ("workspace_bytes", ctypes.c_size_t), ("deterministic", ctypes.c_int),
                   ("window", ctypes.c_int), ("window_left", ctypes.c_int), ("window_right", ctypes.c_int),
                   ("Dv", ctypes.c_int), ("scale64", ctypes.c_double), ("lse64", ctypes.c_void_p),
                   ("dlse64", ctypes.c_void_p), ("mask", ctypes.c_void_p), ("mask_batch_stride", ctypes.c_int64),
                   ("mask_head_stride", ctypes.c_int64), ("mask_row_stride", ctypes.c_int64),
                   ("mask_kind", ctypes.c_int)])


def _set_mask(p, mask, kind):
    p.mask, p.mask_kind = mask.data_ptr(), kind
    p.mask_batch_stride, p.mask_head_stride, p.mask_row_stride = (mask.stride(i) for i in range(3))


def _fwd(q, k, v, mask, kind, mode, window, scale):
    lib = _lib()
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], dtype=q.dtype)
    p = _params(q, k, v, out, CPU, 0)
    p.scale, p.causal = scale, MODES[mode]
    if q.dtype == torch.float64:
        p.scale64, p.lse64 = scale, lse.data_ptr()
    else:
        p.lse = lse.data_ptr()
    if window is not None:
        p.window, (p.window_left, p.window_right) = 1, window
    _set_mask(p, mask, kind)
    why = ctypes.create_string_buffer(1024)
    assert lib.fc_attn_fwd_check(ctypes.byref(p), why, len(why)) == 0, why.value
    assert lib.fc_attn_fwd(ctypes.byref(p), None) == 0
    return out, lse, p


def _bwd(q, k, v, out, lse, g, mask, kind, fwd_p):
    lib = _lib()
    lib.fc_attn_bwd.argtypes = [ctypes.POINTER(BwdParams), ctypes.c_void_p]
    lib.fc_attn_bwd.restype = ctypes.c_int
    grads = [torch.empty_like(t) for t in (q, k, v)]
    p = BwdParams()
    ptrs = dict(q=q, k=k, v=v, o=out, dout=g, dq=grads[0], dk=grads[1], dv=grads[2])
    for name, t in ptrs.items():
        setattr(p, name, t.data_ptr())
        for i, s in enumerate(("batch", "head", "row")):
            setattr(p, f"{'do' if name == 'dout' else name}_{s}_stride", t.stride(i))
    for f in ("B", "Hq", "Hkv", "Sq", "Sk", "D", "dtype", "scale", "causal", "window", "window_left",
              "window_right", "scale64"):
        setattr(p, f, getattr(fwd_p, f))
    p.kernel = CPU
    if q.dtype == torch.float64:
        p.lse64 = lse.data_ptr()
    else:
        p.lse = lse.data_ptr()
    _set_mask(p, mask, kind)
    assert lib.fc_attn_bwd(ctypes.byref(p), None) == 0
    return grads


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", ["bool", "add"])
@pytest.mark.parametrize("mode,window", [(None, None), ("top_left", None), ("bottom_right", (6, 0))])
@pytest.mark.parametrize("bcast", ["full", "keys", "rows"])
def test_mask_matches_sdpa(dtype, kind, mode, window, bcast):
    """Forward (out, LSE) and backward (dq, dk, dv) of the CPU path with a mask against fp64 SDPA (math
    backend) with the same mask and the causal mode / window folded into it; a mask broadcast from
    (B, 1, 1, Sk) (key padding) or (1, 1, Sq, Sk) reads through zero strides, with no copy."""
    torch.manual_seed(hash((kind, mode, bcast)) % 1000)
    B, Hq, Hkv, Sq, Sk, D = 2, 4, 2, 23, 31, 16
    q, k, v = (torch.randn(B, h, s, D, dtype=dtype) for h, s in ((Hq, Sq), (Hkv, Sk), (Hkv, Sk)))
    shape = {"full": (B, Hq, Sq, Sk), "keys": (B, 1, 1, Sk), "rows": (1, 1, Sq, Sk)}[bcast]
    vis = torch.rand(shape) < 0.7
    if bcast == "keys":
        vis[1] = False  # (a batch entry whose keys are all padding: every row of it sees none)
    else:
        vis[..., 0, :] = False  # (a row the mask hides entirely)
    if kind == "bool":
        mask, kid = vis.to(torch.uint8).expand(B, Hq, Sq, Sk), MASK_BOOL
        bias = torch.zeros(shape, dtype=torch.float64).masked_fill(~vis, float("-inf"))
    else:
        bias = torch.randn(shape, dtype=torch.float64).masked_fill(~vis, float("-inf"))
        mask, kid = bias.to(dtype).expand(B, Hq, Sq, Sk), MASK_ADD
        bias = mask.double()
    scale = 1 / math.sqrt(D)
    out, lse, p = _fwd(q, k, v, mask, kid, mode, window, scale)
    allowed = band(Sq, Sk, mode is not None, mode or "top_left", None if window is None else window[0],
                   None if mode is None else 0, "cpu") if mode else torch.ones(Sq, Sk, dtype=torch.bool)
    full_bias = bias.expand(B, Hq, Sq, Sk).masked_fill(~allowed, float("-inf"))
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    s = (q64 @ k64.repeat_interleave(2, 1).transpose(-1, -2)) * scale + full_bias
    want_lse = torch.logsumexp(s, -1)
    dead = want_lse == float("-inf")
    probs = torch.softmax(s.masked_fill(dead[..., None], 0.0), -1) * (~dead)[..., None]  # (dead rows: 0, no NaN)
    want = probs @ v64.repeat_interleave(2, 1)
    tol = dict(atol=1e-12, rtol=1e-12) if dtype == torch.float64 else dict(atol=2e-6, rtol=2e-6)
    torch.testing.assert_close(out.double(), want.detach(), **tol)
    torch.testing.assert_close(lse.double(), want_lse.detach(), **tol)
    assert dead.any() and torch.all(out[dead] == 0) and torch.all(lse[dead] == float("-inf"))
    live = ~dead
    with sdpa_kernel(SDPBackend.MATH):
        sd = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=full_bias,
                                            scale=scale, enable_gqa=True)
    torch.testing.assert_close(out.double()[live], sd[live], **tol)  # (SDPA gives NaN where no key is seen)
    g = torch.randn_like(out)
    got = _bwd(q, k, v, out, lse, g, mask, kid, p)
    ref = torch.autograd.grad(want, (q64, k64, v64), g.double())
    gtol = dict(atol=1e-11, rtol=1e-11) if dtype == torch.float64 else dict(atol=2e-5, rtol=2e-5)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a.double(), b, **gtol)


def test_mask_checks():
    """fc_attn_fwd_check names a bad mask: an unknown kind, a pointer without a kind, a kind without a
    pointer, negative strides, and a GPU kernel (the CPU path alone takes masks so far)."""
    lib = _lib()
    q, k, v = (torch.randn(1, 2, 5, 64) for _ in range(3))
    out, m = torch.empty_like(q), torch.ones(1, 2, 5, 5, dtype=torch.uint8)
    why = ctypes.create_string_buffer(1024)
    cases = ((dict(mask_kind=7), b"invalid argument", b"mask_kind: unknown value 7"),
             (dict(mask=m.data_ptr()), b"invalid argument", b"mask: set, but mask_kind is FC_MASK_NONE"),
             (dict(mask_kind=MASK_BOOL), b"null pointer", b"mask: NULL with mask_kind 1"),
             (dict(mask=m.data_ptr(), mask_kind=MASK_BOOL, mask_row_stride=-5), b"invalid stride or alignment",
              b"mask: strides"),
             (dict(mask=m.data_ptr(), mask_kind=MASK_BOOL, kernel=flashcore.KERNELS["sm80"]), b"invalid argument",
              b"mask: only the CPU kernel takes a mask so far"))
    for fields, status, msg in cases:
        p = _params(q, k, v, out, CPU, 0)
        for f, x in fields.items():
            setattr(p, f, x)
        st = lib.fc_attn_fwd_check(ctypes.byref(p), why, len(why))
        assert lib.fc_status_string(st) == status and msg in why.value, (fields, why.value)
    p = _params(q, k, v, out, CPU, 0)
    _set_mask(p, m, MASK_BOOL)
    assert lib.fc_attn_fwd_check(ctypes.byref(p), None, 0) == 0
