"""flashcore's backward: gradients of flashcore.attention through autograd.

Reference: autograd of plain attention math in fp64 (ref_dtype) on the
upcast inputs, for the query rows that see a key (fully masked rows are
checked apart: their dq is exactly 0). Pass rule per gradient, as for the
forward: max|grad - ref| <= 2 * max|sdpa_grad - ref| + eps, where sdpa_grad
is torch SDPA's backward in the same low precision on the same device and eps
is half an ulp of the dtype at the largest reference gradient (one rounding of
the output: a gradient near 1.5 in bf16 is stored to within 3.9e-3, and SDPA's
own error there may have rounded luckily). Every backward call poisons dq, dk and dv (and its scratch)
before the launch (conftest), so an element the kernel does not write shows
up as NaN. The CPU cases run in CI; the GPU cases need a GPU.
"""
import contextlib
import re

import pytest
import torch
import torch.nn.functional as F

import flashcore
from flashcore import _C

from conftest import (CAUSAL_MODES, DTYPE_NAMES, GPU_KERNELS, default_scale, dtype_id, expand_kv, live_rows,
                      make_qkv, mode_id, ref_dtype, requires_gpu, visible_mask)

DEVICES = ["cpu", pytest.param("cuda", marks=requires_gpu)]
# Where the gradients of the main tests run: the C path, and each GPU backward
# family the device runs (the forward's `kernel` picks it: sm80 everywhere,
# sm90 on a compute capability 9.0 GPU; "auto" there is sm90).
TARGETS = [pytest.param("cpu", "auto", id="cpu")] + [
    pytest.param("cuda", k, marks=requires_gpu, id=f"cuda-{k}") for k in GPU_KERNELS]
LOWP = [torch.float16, torch.bfloat16]
# Half an ulp at 1.0 (the rule's eps per unit of the largest gradient): 2^-11 fp16, 2^-8 bf16; fp32 as the forward's.
HALF_ULP = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8, torch.float32: 1e-5}


def kw_for(mode):
    return {"causal": mode is not None, "causal_alignment": mode or "top_left"}


def leaves(q, k, v):
    """Detached copies of q, k, v (layouts kept) that require grad."""
    return tuple(t.detach().requires_grad_(True) for t in (q, k, v))


def fc_grads(q, k, v, mode, go, glse=None, scale=None, kernel="auto", num_splits=None):
    """(dq, dk, dv) of sum(out * go) [+ sum(lse * glse)] through flashcore."""
    q, k, v = leaves(q, k, v)
    out, lse = flashcore.attention(q, k, v, scale=scale, return_lse=True, kernel=kernel, num_splits=num_splits,
                                   **kw_for(mode))
    loss = (out.float() * go.float()).sum()
    if glse is not None:
        loss = loss + (lse * glse).sum()
    loss.backward()
    return q.grad, k.grad, v.grad


def ref_grads(q, k, v, mode, go, glse=None, scale=None, dtype=None):
    """Reference (dq over the live rows, dk, dv): autograd of softmax attention in `dtype`."""
    dtype = dtype or ref_dtype(q.device)
    scale = default_scale(q) if scale is None else scale
    rows = live_rows(q.shape[2], k.shape[2], mode)
    rs = slice(rows.start, rows.stop)
    qf, kf, vf = (t.detach().to(dtype).requires_grad_(True) for t in (q, k, v))
    ke, ve = expand_kv(qf, kf, vf)
    s = torch.matmul(qf[:, :, rs], ke.transpose(-1, -2)) * scale
    s = s.masked_fill(~visible_mask(q.shape[2], k.shape[2], mode, q.device)[rs], float("-inf"))
    out = torch.matmul(torch.softmax(s, dim=-1), ve)
    loss = (out * go[:, :, rs].to(dtype)).sum()
    if glse is not None:
        loss = loss + (torch.logsumexp(s, dim=-1) * glse[:, :, rs].to(dtype)).sum()
    loss.backward()
    return qf.grad[:, :, rs], kf.grad, vf.grad, rs


def sdpa_grads(q, k, v, mode, go, scale, rs):
    """torch SDPA's backward in q's dtype over the live rows (no lse term)."""
    qs, ks, vs = leaves(q, k, v)
    ke, ve = expand_kv(qs, ks, vs)
    Sq, Sk = q.shape[2], k.shape[2]
    if mode == "bottom_right":
        kw = {"attn_mask": visible_mask(Sq, Sk, mode, q.device)[rs]}
    else:
        kw = {"is_causal": mode == "top_left"}
    out = F.scaled_dot_product_attention(qs[:, :, rs], ke, ve, scale=scale, **kw)
    (out.float() * go[:, :, rs].float()).sum().backward()
    return qs.grad[:, :, rs], ks.grad, vs.grad


def maxerr(a, b):
    return 0.0 if a.numel() == 0 else (a.double() - b.double()).abs().max().item()


def check_grads(q, k, v, mode, got, go, glse=None, scale=None, sdpa=True):
    """Checks got = (dq, dk, dv) against the reference (see the module docstring)."""
    dt = q.dtype
    sc = default_scale(q) if scale is None else scale
    for g, t, name in zip(got, (q, k, v), ("dq", "dk", "dv")):
        assert g.shape == t.shape and g.dtype == dt, f"{name}: {tuple(g.shape)} {g.dtype}"
        assert torch.isfinite(g).all(), f"{name}: {(~torch.isfinite(g)).sum().item()} NaN/Inf elements"
    rq, rk, rv, rs = ref_grads(q, k, v, mode, go, glse, sc)
    assert (got[0][:, :, :rs.start] == 0).all(), "dq of rows that see no key must be 0"
    ours = (got[0][:, :, rs], got[1], got[2])
    if sdpa and glse is None:
        theirs = sdpa_grads(q, k, v, mode, go, sc, rs)
    elif dt != torch.float32:
        # no SDPA counterpart (the lse term): the same rule against the reference's autograd run in q's
        # dtype, the error a plain low-precision implementation makes
        theirs = ref_grads(q, k, v, mode, go, glse, sc, dtype=dt)[:3]
    else:
        theirs = (None,) * 3
    for name, g, r, sd in zip(("dq", "dk", "dv"), ours, (rq, rk, rv), theirs):
        eps = HALF_ULP[dt] * max(1.0, r.abs().max().item() if r.numel() else 1.0)
        err = maxerr(g, r)
        if sd is not None:
            sd_err = maxerr(sd, r)
            what = "sdpa" if sdpa and glse is None else "low-precision autograd"
            assert err <= 2 * sd_err + eps, (f"{name}: max|fc-ref| = {err:.3e} > 2*max|{what}-ref| + eps = "
                                            f"2*{sd_err:.3e} + {eps:.1e} ({DTYPE_NAMES[dt]}, {mode_id(mode)})")
        else:
            # fp32 without an SDPA counterpart: a few ulps of the largest value
            tol = 1e-5 * max(1.0, r.abs().max().item())
            assert err <= tol, f"{name}: max|fc-ref| = {err:.3e} > {tol:.1e}"


# (B, Hq, Hkv, Sq, Sk): odd lengths, Sq != Sk both ways, GQA, one query row, one key
SHAPES = [(2, 4, 2, 97, 203), (1, 2, 2, 203, 97), (1, 4, 1, 1, 17), (1, 2, 2, 17, 1), (2, 2, 2, 64, 64)]
# shapes 4-8: more key blocks than an H100 has SMs, so the Hopper kernel's persistent CTAs take several
# (top-left with Sq < Sk: the key blocks past Sq see no query; Sq = 100: at D = 64 one query block per head
# (two above), so its items walk one block or none, and a CTA takes and loads the next item from an
# item's only block)
# The portable backward takes its 128-key CTAs (dispatch.c's sm80_bwd_wide, on GPUs with their shared
# memory) where B * Hkv * ceil(Sk / 128) reaches 3/4 of the SM count (three times it for causal calls
# at D = 64): on an H100 shapes 4-7 (192-272 CTAs) at D = 128 and, non-causal, at D = 64, and the last
# (576) at D = 64 and 128 in every mode; the first three run its 64-key CTAs.
GPU_SHAPES = [(2, 8, 2, 512, 512), (1, 4, 4, 1024, 1023), (1, 2, 1, 1000, 1025), (2, 8, 8, 700, 2100),
              (4, 8, 4, 1100, 1500), (2, 8, 8, 100, 2100), (2, 8, 8, 2100, 2049), (4, 16, 16, 1000, 1100)]


def shape_id(s):
    return "B{}H{}-{}q{}k{}".format(*s)


# Shared memory per block the portable backward needs at D > 128 (attn_bwd_sm80_tile.cuh's tile table:
# 144.5 KB); sm86/89 GPUs have 99 KB.
SM80_BWD_SMEM_D256 = 147968


def refused_here(q, call):
    """Where the GPU has no backward at q's head dim (the portable one above 128 on a GPU without the
    shared memory, whatever kernel is asked for), checks that call() raises the refusal that names the
    cause and the fix, and returns True; elsewhere returns False."""
    D = q.shape[-1]
    if not (q.is_cuda and D > 128
            and torch.cuda.get_device_properties(q.device).shared_memory_per_block_optin < SM80_BWD_SMEM_D256):
        return False
    with pytest.raises(ValueError, match=rf"device: the backward at head dim {D} needs \d+ bytes of shared "
                                         r"memory per block, this GPU allows \d+.*q requires grad"):
        call()
    return True


def check_or_refused(q, k, v, mode, go, kernel):
    """check_grads of flashcore's gradients, or the refusal where the GPU has no backward (refused_here)."""
    if not refused_here(q, lambda: fc_grads(q, k, v, mode, go, kernel=kernel)):
        check_grads(q, k, v, mode, fc_grads(q, k, v, mode, go, kernel=kernel), go)


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("mode", CAUSAL_MODES, ids=mode_id)
@pytest.mark.parametrize("D", [40, 64, 96, 128, 136, 256])
@pytest.mark.parametrize("dtype", LOWP, ids=dtype_id)
@pytest.mark.parametrize("dev,kernel", TARGETS)
def test_grads(dev, kernel, dtype, D, mode, shape):
    B, Hq, Hkv, Sq, Sk = shape
    q, k, v = make_qkv(B, Hq, Hkv, Sq, Sk, D, dtype, dev)
    go = torch.randn(B, Hq, Sq, D, device=dev).to(dtype)
    check_or_refused(q, k, v, mode, go, kernel)


@requires_gpu
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=shape_id)
@pytest.mark.parametrize("mode", CAUSAL_MODES, ids=mode_id)
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("dtype", LOWP, ids=dtype_id)
@pytest.mark.parametrize("kernel", GPU_KERNELS)
def test_grads_gpu_long(kernel, dtype, D, mode, shape):
    B, Hq, Hkv, Sq, Sk = shape
    q, k, v = make_qkv(B, Hq, Hkv, Sq, Sk, D, dtype, "cuda")
    go = torch.randn(B, Hq, Sq, D, device="cuda").to(dtype)
    check_or_refused(q, k, v, mode, go, kernel)


@pytest.mark.parametrize("D", [8, 256])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_grads_cpu_any_head_dim(dtype, D):
    """The CPU path has no head-dim limit (and takes fp32)."""
    q, k, v = make_qkv(1, 4, 2, 33, 47, D, dtype, "cpu")
    go = torch.randn_like(q)
    check_grads(q, k, v, "top_left", fc_grads(q, k, v, "top_left", go), go)


@pytest.mark.parametrize("layouts", [("transposed",) * 3, ("sliced", "sliced_hi", "batch_step")],
                         ids=lambda x: "-".join(x))
@pytest.mark.parametrize("dev,kernel", TARGETS)
def test_grads_strided(dev, kernel, layouts):
    """Strided views as inputs; their gradients come back in the view's shape."""
    dtype = torch.float16
    q, k, v = make_qkv(2, 4, 2, 77, 130, 64, dtype, dev, layouts=layouts)
    go = torch.randn(2, 4, 77, 64, device=dev).to(dtype)
    check_grads(q, k, v, "bottom_right", fc_grads(q, k, v, "bottom_right", go, kernel=kernel), go)


@pytest.mark.parametrize("dev,kernel", TARGETS)
def test_grads_expanded_kv(dev, kernel):
    """k and v broadcast over heads (head stride 0): autograd sums the heads' gradients."""
    k0 = torch.randn(2, 1, 50, 64, device=dev).half().requires_grad_(True)
    v0 = torch.randn(2, 1, 50, 64, device=dev).half().requires_grad_(True)
    q = torch.randn(2, 4, 40, 64, device=dev).half().requires_grad_(True)
    out = flashcore.attention(q, k0.expand(2, 4, 50, 64), v0.expand(2, 4, 50, 64), is_causal=True, kernel=kernel)
    go = torch.randn_like(out)
    (out.float() * go.float()).sum().backward()
    want = fc_grads(q, k0.expand(2, 4, 50, 64).contiguous(), v0.expand(2, 4, 50, 64).contiguous(), "top_left", go,
                    kernel=kernel)
    assert torch.equal(q.grad, want[0])
    torch.testing.assert_close(k0.grad.float(), want[1].float().sum(1, keepdim=True), atol=2e-2, rtol=1e-2)
    torch.testing.assert_close(v0.grad.float(), want[2].float().sum(1, keepdim=True), atol=2e-2, rtol=1e-2)


@pytest.mark.parametrize("mode", CAUSAL_MODES, ids=mode_id)
@pytest.mark.parametrize("dev,dtype,kernel", [("cpu", torch.float32, "auto"), ("cpu", torch.float16, "auto")] + [
    pytest.param("cuda", torch.float16, k, marks=requires_gpu) for k in GPU_KERNELS],
                         ids=["cpu-fp32", "cpu-fp16"] + [f"cuda-{k}-fp16" for k in GPU_KERNELS])
def test_grads_through_lse(dev, dtype, kernel, mode):
    """A loss that uses the returned lse: its gradient enters dS as P * dlse (fp32: to 1e-5 of the largest)."""
    q, k, v = make_qkv(1, 4, 2, 45, 70, 64, dtype, dev)
    go = torch.randn(1, 4, 45, 64, device=dev).to(dtype)
    glse = torch.randn(1, 4, 45, device=dev)
    check_grads(q, k, v, mode, fc_grads(q, k, v, mode, go, glse, kernel=kernel), go, glse)


@pytest.mark.parametrize("dev", DEVICES)
def test_grad_of_lse_alone(dev):
    """A loss of lse alone: out's gradient is None inside the formula (treated as zeros)."""
    q, k, v = make_qkv(1, 2, 2, 30, 40, 64, torch.float32 if dev == "cpu" else torch.float16, dev)
    glse = torch.randn(1, 2, 30, device=dev)
    got = fc_grads(q, k, v, None, torch.zeros(1, 2, 30, 64, device=dev), glse)
    check_grads(q, k, v, None, got, torch.zeros(1, 2, 30, 64, device=dev).to(q.dtype), glse)


def test_direct_op_call_without_lse():
    """torch.ops.flashcore.attention called with return_lse=False: the backward recomputes the LSE
    and gives the same gradients as flashcore.attention."""
    q, k, v = make_qkv(1, 4, 2, 33, 50, 64, torch.float32, "cpu")
    go = torch.randn(1, 4, 33, 64)
    a = leaves(q, k, v)
    out, lse = torch.ops.flashcore.attention(*a, None, 0.0, True, None, None, "bottom_right", False, "auto", None)
    assert lse.numel() == 0
    (out * go).sum().backward()
    want = fc_grads(q, k, v, "bottom_right", go)
    for t, w in zip(a, want):
        assert torch.equal(t.grad, w)


@pytest.mark.parametrize("dev", DEVICES)
def test_grad_of_sum(dev):
    """out.sum().backward() hands the backward an expanded (stride 0) gradient."""
    q, k, v = leaves(*make_qkv(1, 2, 2, 30, 30, 64, torch.float16, dev))
    flashcore.attention(q, k, v).sum().backward()
    go = torch.ones(1, 2, 30, 64, device=dev).half()
    check_grads(q.detach(), k.detach(), v.detach(), None, (q.grad, k.grad, v.grad), go)


@pytest.mark.parametrize("dev,kernel", TARGETS)
def test_fully_masked_rows(dev, kernel):
    """bottom-right with Sq > Sk: the first Sq - Sk rows see no key; their dq is 0, nothing is NaN."""
    q, k, v = make_qkv(1, 2, 2, 70, 20, 64, torch.bfloat16, dev)
    go = torch.randn(1, 2, 70, 64, device=dev).bfloat16()
    got = fc_grads(q, k, v, "bottom_right", go, kernel=kernel)
    assert (got[0][:, :, :50] == 0).all()
    check_grads(q, k, v, "bottom_right", got, go)


@pytest.mark.parametrize("sizes", [(0, 5), (5, 0), (0, 0)], ids=["Sq0", "Sk0", "both0"])
@pytest.mark.parametrize("dev", DEVICES)
def test_empty_lengths(dev, sizes):
    """Sq = 0: dk = dv = 0; Sk = 0: dq = 0 (no row sees a key)."""
    Sq, Sk = sizes
    q, k, v = leaves(*make_qkv(2, 4, 2, Sq, Sk, 64, torch.float16, dev))
    out, lse = flashcore.attention(q, k, v, return_lse=True)
    (out.float().sum() + lse.clamp(min=0).sum()).backward()
    for g, t in ((q.grad, q), (k.grad, k), (v.grad, v)):
        assert g.shape == t.shape and (g == 0).all()


@pytest.mark.parametrize("dev,kernel", TARGETS)
def test_gqa_grads_sum_over_group(dev, kernel):
    """dk, dv of a KV head are the sums over its query heads: the same as with k, v repeated."""
    q, k, v = make_qkv(1, 6, 2, 40, 40, 64, torch.float32 if dev == "cpu" else torch.float16, dev)
    go = torch.randn(1, 6, 40, 64, device=dev).to(q.dtype)
    g = fc_grads(q, k, v, None, go, kernel=kernel)
    gr = fc_grads(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), None, go, kernel=kernel)
    tol = 1e-5 if dev == "cpu" else 2e-2
    torch.testing.assert_close(g[0].float(), gr[0].float(), atol=tol, rtol=tol)
    torch.testing.assert_close(g[1].float(), gr[1].float().unflatten(1, (2, 3)).sum(2), atol=tol, rtol=tol)
    torch.testing.assert_close(g[2].float(), gr[2].float().unflatten(1, (2, 3)).sum(2), atol=tol, rtol=tol)


def test_double_backward_refused():
    """There is no derivative of the backward: create_graph + a second backward raises, never a silent 0."""
    q, k, v = leaves(*make_qkv(1, 2, 2, 9, 9, 64, torch.float32, "cpu"))
    out = flashcore.attention(q, k, v)
    (gq,) = torch.autograd.grad(out.sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="attention_backward.*no autograd formula"):
        gq.sum().backward()


@pytest.mark.parametrize("mode", CAUSAL_MODES, ids=mode_id)
@pytest.mark.parametrize("dev", DEVICES)
def test_compiled_backward_matches_eager(dev, mode):
    """torch.compile(fullgraph=True) of forward + backward gives the eager gradients: bit for bit on
    the CPU (aot_eager), on the GPU with inductor to rounding (dq's reductions run in any order)."""
    dtype = torch.float32 if dev == "cpu" else torch.float16
    q, k, v = make_qkv(1, 4, 2, 33, 47, 64, dtype, dev)
    go = torch.randn(1, 4, 33, 64, device=dev).to(dtype)

    def loss(q, k, v):
        out, lse = flashcore.attention(q, k, v, return_lse=True, **kw_for(mode))
        return (out.float() * go.float()).sum() + lse.clamp(min=-1e4).sum()

    a = leaves(q, k, v)
    want = torch.autograd.grad(loss(*a), a)
    torch._dynamo.reset()
    f = torch.compile(loss, fullgraph=True, backend="aot_eager" if dev == "cpu" else "inductor")
    b = leaves(q, k, v)
    got = torch.autograd.grad(f(*b), b)
    torch._dynamo.reset()
    for g, w in zip(got, want):
        if dev == "cpu":
            assert torch.equal(g, w)
        else:
            torch.testing.assert_close(g, w, atol=2e-3, rtol=2e-3)


# ---- torch.func transforms: what the op has no formula for raises, never a silent zero ----

def _f(q, k, v):
    return flashcore.attention(q, k, v, is_causal=True).sum()


@pytest.mark.parametrize("transform", ["jvp", "jacfwd"])
def test_func_forward_mode_refused(transform):
    q, k, v = make_qkv(1, 2, 2, 9, 9, 64, torch.float32, "cpu")
    with pytest.raises(ValueError, match=r"^q: carries a forward-mode AD tangent.*no jvp"):
        if transform == "jvp":
            torch.func.jvp(lambda q: _f(q, k, v), (q,), (torch.randn_like(q),))
        else:
            torch.func.jacfwd(lambda q: _f(q, k, v))(q)


@pytest.mark.parametrize("transform", ["grad", "vjp", "vmap_of_grad", "grad_of_vmap"])
def test_func_grad_transforms_refused(transform):
    q, k, v = make_qkv(2, 2, 2, 9, 9, 64, torch.float32, "cpu")
    with pytest.raises(ValueError, match=r"^q: requires grad under a torch.func transform"):
        if transform == "grad":
            torch.func.grad(_f)(q[:1], k[:1], v[:1])
        elif transform == "vjp":
            torch.func.vjp(lambda q: flashcore.attention(q, k, v), q)
        elif transform == "vmap_of_grad":
            torch.vmap(torch.func.grad(lambda q, k, v: _f(q[None], k[None], v[None])))(q, k, v)
        else:
            torch.func.grad(lambda q: torch.vmap(lambda r: _f(r[None], k[:1], v[:1]))(q).sum())(q)


def test_dual_tensor_that_requires_grad_refused():
    """A forward-mode tangent on an input that also requires grad: flashcore's forward-mode message."""
    import torch.autograd.forward_ad as fwAD
    q, k, v = leaves(*make_qkv(1, 2, 2, 9, 9, 64, torch.float32, "cpu"))
    with fwAD.dual_level():
        qd = fwAD.make_dual(q, torch.randn_like(q))
        with pytest.raises(ValueError, match=r"^q: carries a forward-mode AD tangent"):
            flashcore.attention(qd, k, v)


def test_vmap_forward_autograd_backward():
    """vmap of the forward with the backward from torch.autograd outside: per-sample gradients match a loop."""
    q, k, v = leaves(*make_qkv(3, 2, 2, 12, 15, 64, torch.float32, "cpu"))
    out = torch.vmap(lambda q, k, v: flashcore.attention(q[None], k[None], v[None])[0])(q, k, v)
    go = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), go)
    want = fc_grads(q, k, v, None, go)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-6)


def test_backward_entry_point_checks():
    """The backward's entry point names the argument and the fix for what a caller can get wrong."""
    q, k, v = make_qkv(1, 2, 2, 9, 11, 64, torch.float32, "cpu")
    out, lse = flashcore.attention(q, k, v, return_lse=True)
    go = torch.randn_like(out)
    with pytest.raises(TypeError, match=r"^dout: dtype .*cast dout to q's dtype"):
        _C.bwd(go.half(), q, k, v, out, lse, None, 0.125, 0)
    with pytest.raises(ValueError, match=r"^out: expected the forward output's shape \(B, Hq, Sq, Dv\) = "
                                         r"\(1, 2, 9, 64\)"):
        _C.bwd(go, q, k, v, out[:, :, :5], lse, None, 0.125, 0)
    with pytest.raises(ValueError, match=r"^lse: expected a float32 \(B, Hq, Sq\) = \(1, 2, 9\)"):
        _C.bwd(go, q, k, v, out, lse[..., :4], None, 0.125, 0)
    with pytest.raises(ValueError, match=r"^dlse: expected a float32"):
        _C.bwd(go, q, k, v, out, lse, lse.double(), 0.125, 0)
    with pytest.raises(ValueError, match=r"^scale: got .*forward's scale"):
        _C.bwd(go, q, k, v, out, lse, None, -1.0, 0)
    with pytest.raises(ValueError, match=r"^causal: unknown mode 3"):
        _C.bwd(go, q, k, v, out, lse, None, 0.125, 3)
    with pytest.raises(ValueError, match=r"^kernel: unknown kernel id 7"):
        _C.bwd(go, q, k, v, out, lse, None, 0.125, 0, 7)
    with pytest.raises(ValueError, match=r"^kernel: a GPU kernel was forced but q is on the CPU"):
        _C.bwd(go, q, k, v, out, lse, None, 0.125, 0, flashcore.KERNELS["sm90"])
    with pytest.raises(ValueError, match=r"^family: expected one of .*got 'sm70'"):
        torch.ops.flashcore.attention_backward(go, q, k, v, out, lse, None, 0.125, 0, "sm70")
    # the family defaults to "auto": the op's nine-argument form still works
    got = torch.ops.flashcore.attention_backward(go, q, k, v, out, lse, None, 0.125, 0)
    assert all(torch.isfinite(g).all() for g in got)


def test_opcheck_backward():
    """torch.library's checks of both ops with grad: autograd registration, fake impls, AOT dispatch."""
    q, k, v = leaves(*make_qkv(1, 4, 2, 21, 30, 64, torch.float32, "cpu"))
    torch.library.opcheck(torch.ops.flashcore.attention.default,
                          (q, k, v, None, 0.0, True, None, None, "bottom_right", True, "auto", None))
    out, lse = flashcore.attention(q.detach(), k.detach(), v.detach(), return_lse=True)
    torch.library.opcheck(torch.ops.flashcore.attention_backward.default,
                          (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out, lse, None, 0.125, 0,
                           "auto"))


def test_autocast_grads():
    """Under autocast the inputs are cast (bf16 on the CPU); fp32 leaves get fp32 gradients through the cast."""
    q, k, v = leaves(*make_qkv(1, 2, 2, 20, 20, 64, torch.float32, "cpu"))
    with torch.autocast("cpu"):
        out = flashcore.attention(q, k, v)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert q.grad.dtype == torch.float32 and torch.isfinite(q.grad).all()
    want = fc_grads(q.detach().bfloat16(), k.detach().bfloat16(), v.detach().bfloat16(), None,
                    torch.ones(1, 2, 20, 64).bfloat16())
    assert torch.equal(q.grad, want[0].float())


@requires_gpu
def test_gpu_bwd_device_check():
    """fc_attn_bwd_device_check answers for this GPU what a backward call at that head dim would be told."""
    K = flashcore.KERNELS
    small_smem = torch.cuda.get_device_properties(0).shared_memory_per_block_optin < SM80_BWD_SMEM_D256
    for D in (1, 40, 64, 128):
        assert _C.bwd_device_check(D, K["auto"], 0) == ""
        assert _C.bwd_device_check(D, K["sm80"], 0) == ""
    for D in (136, 256):
        for kernel in ("auto", "sm80"):
            why = _C.bwd_device_check(D, K[kernel], 0)
            if small_smem:
                assert re.match(rf"device: the backward at head dim {D} needs \d+ bytes of shared memory", why), why
            else:
                assert why == ""
    # a forced sm90 off Hopper is the forward's to refuse (empty here); on Hopper it runs every head dim
    for D in (64, 136, 256):
        assert _C.bwd_device_check(D, K["sm90"], 0) == ""
    assert _C.bwd_device_check(0, K["auto"], 0) == "D: expected a head dim from 1 to 256, got 0"
    assert _C.bwd_device_check(257, K["auto"], 0) == "D: expected a head dim from 1 to 256, got 257"
    assert _C.bwd_device_check(64, K["cpu"], 0).startswith("kernel: expected auto, sm80 or sm90")


@requires_gpu
def test_gpu_training_refused_before_the_forward(monkeypatch):
    """Where the GPU cannot run the backward (here a stand-in reason), an input that requires grad is refused
    before the forward runs, naming the input; inference on the same inputs runs."""
    calls = []
    monkeypatch.setattr(_C, "bwd_device_check", lambda D, kernel, device: calls.append((D, kernel, device)) or
                        "device: no backward here")

    def forward_must_not_run(*args):
        raise AssertionError("the forward ran")

    monkeypatch.setattr(flashcore, "_attention_op", forward_must_not_run)
    q, k, v = make_qkv(1, 2, 2, 16, 16, 64, torch.float16, "cuda")
    with pytest.raises(ValueError, match=r"^device: no backward here \(k requires grad: the backward could not "
                                         r"run; call it under torch.no_grad\(\) for inference\)$"):
        flashcore.attention(q, k.detach().requires_grad_(True), v)
    assert calls == [(64, flashcore.KERNELS["auto"], q.device.index)]
    with torch.no_grad():
        flashcore.attention(q, k.detach().requires_grad_(True), v)
    flashcore.attention(q, k, v)  # (nothing requires grad)
    assert len(calls) == 1


@requires_gpu
def test_gpu_forced_sm90_backward_refused_off_hopper():
    """Forcing the Hopper backward on a GPU that is not compute capability 9.0 raises and names the GPU."""
    if torch.cuda.get_device_capability() == (9, 0):
        pytest.skip("the sm90 backward runs on this GPU")
    q, k, v = make_qkv(1, 2, 2, 16, 16, 64, torch.float16, "cuda")
    out, lse = flashcore.attention(q, k, v, return_lse=True)
    with pytest.raises(RuntimeError, match=r"kernel: this GPU has compute capability \d+\.\d+; the sm90 kernel"):
        _C.bwd(torch.randn_like(out), q, k, v, out, lse, None, 0.125, 0, flashcore.KERNELS["sm90"])


@requires_gpu
@pytest.mark.parametrize("kernel", ["auto", "sm80", "sm90"])
def test_gpu_forced_forward_kernel(kernel):
    """A forced kernel runs the forward and the backward of its family; the gradients match either way."""
    if kernel == "sm90" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm90 needs a compute capability 9.0 GPU")
    q, k, v = make_qkv(2, 4, 2, 300, 300, 128, torch.float16, "cuda")
    go = torch.randn(2, 4, 300, 128, device="cuda").half()
    check_grads(q, k, v, "top_left", fc_grads(q, k, v, "top_left", go, kernel=kernel), go)


@requires_gpu
@pytest.mark.parametrize("shape", [(2, 8, 2, 700, 900), (2, 8, 8, 100, 2100)], ids=shape_id)
@pytest.mark.parametrize("D,kernel", [(D, k) for D in (64, 128, 256) for k in GPU_KERNELS])
def test_gpu_reruns(D, kernel, shape):
    """dk and dv are bit-identical across reruns; dq (fp32 atomics across key blocks) within rounding.
    The second shape has more key blocks than an H100 has SMs: which CTA takes which item varies
    between runs, and the gradients must not."""
    B, Hq, Hkv, Sq, Sk = shape
    q, k, v = make_qkv(B, Hq, Hkv, Sq, Sk, D, torch.float16, "cuda")
    go = torch.randn(B, Hq, Sq, D, device="cuda").half()
    first = fc_grads(q, k, v, "bottom_right", go, kernel=kernel)
    for _ in range(5):
        again = fc_grads(q, k, v, "bottom_right", go, kernel=kernel)
        assert torch.equal(again[1], first[1]) and torch.equal(again[2], first[2])
        torch.testing.assert_close(again[0], first[0], atol=2e-3, rtol=2e-3)


@requires_gpu
@pytest.mark.parametrize("kernel", GPU_KERNELS)
def test_gpu_matches_cpu_path(kernel):
    """The GPU kernel's gradients against the C path's on the same inputs."""
    q, k, v = make_qkv(1, 4, 2, 130, 150, 64, torch.float16, "cuda")
    go = torch.randn(1, 4, 130, 64, device="cuda").half()
    g = fc_grads(q, k, v, "top_left", go, kernel=kernel)
    c = fc_grads(q.cpu(), k.cpu(), v.cpu(), "top_left", go.cpu())
    for a, b in zip(g, c):
        torch.testing.assert_close(a.cpu().float(), b.float(), atol=2e-2, rtol=2e-2)


# ---- deterministic mode (torch.use_deterministic_algorithms) ----

@contextlib.contextmanager
def deterministic(on):
    """torch.use_deterministic_algorithms(on) inside, the previous setting restored after."""
    was, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(on)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was, warn_only=warn_only)


@pytest.fixture
def deterministic_algorithms():
    """torch.use_deterministic_algorithms(True) for the test, restored after it."""
    with deterministic(True):
        yield


@pytest.mark.parametrize("on", [False, True], ids=["default", "deterministic"])
def test_backward_passes_the_deterministic_flag(monkeypatch, on):
    """The autograd formula hands torch.are_deterministic_algorithms_enabled() to the C backward."""
    seen = []
    real_bwd = _C.bwd

    def spy(*args):
        seen.append(args[10])  # (dout, q, k, v, out, lse, dlse, scale, causal, kernel, deterministic, window)
        return real_bwd(*args)

    q, k, v = make_qkv(1, 4, 2, 30, 41, 64, torch.float32, "cpu")
    go = torch.randn(1, 4, 30, 64)
    monkeypatch.setattr(_C, "bwd", spy)
    with deterministic(on):
        fc_grads(q, k, v, "top_left", go)
    assert seen == [on]


# Odd lengths, Sq != Sk both ways, GQA; the last: 32 x 32 CTAs of 64 keys (32 x 16 of 128 keys where the
# portable backward takes those, in every mode at D = 64 and 128), more than an H100 holds at once (the
# turns' waits then depend on the order the CTAs start in)
DET_SHAPES = [(2, 8, 2, 700, 900), (1, 4, 1, 1000, 333), (1, 2, 2, 1025, 1025), (4, 8, 8, 2048, 2047)]


@requires_gpu
@pytest.mark.parametrize("shape", DET_SHAPES, ids=shape_id)
@pytest.mark.parametrize("mode", CAUSAL_MODES, ids=mode_id)
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("kernel", ["auto", "sm80", "sm90"])
def test_gpu_deterministic_reruns(deterministic_algorithms, kernel, D, mode, shape):
    """Under torch.use_deterministic_algorithms(True) dq is bit-identical across reruns too (the dQ adds of
    the key blocks take turns, in both GPU backward kernels), and all three gradients pass the reference rule."""
    if kernel == "sm90" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Hopper backward needs a compute capability 9.0 GPU")
    if D > 128 and torch.cuda.get_device_properties(0).shared_memory_per_block_optin < SM80_BWD_SMEM_D256:
        pytest.skip("the portable backward at D > 128 needs 144.5 KB of shared memory per block")
    B, Hq, Hkv, Sq, Sk = shape
    q, k, v = make_qkv(B, Hq, Hkv, Sq, Sk, D, torch.float16, "cuda")
    go = torch.randn(B, Hq, Sq, D, device="cuda").half()
    first = fc_grads(q, k, v, mode, go, kernel=kernel)
    for _ in range(4):
        again = fc_grads(q, k, v, mode, go, kernel=kernel)
        for name, a, b in zip(("dq", "dk", "dv"), again, first):
            assert torch.equal(a, b), f"{name} differs between deterministic reruns"
    torch.use_deterministic_algorithms(False)  # (the reference's own matmuls and SDPA's backward)
    check_grads(q, k, v, mode, first, go)


@pytest.mark.parametrize("dev,dtype", [("cpu", torch.float64), ("cpu", torch.float32),
                                       pytest.param("cuda", torch.float16, marks=requires_gpu)])
def test_batched_gradients(dev, dtype):
    """Batched vector-Jacobian products (autograd.grad with is_grads_batched, jacobian with
    vectorize=True) run the backward op's vmap rule, one call for all samples: equal to one backward
    per sample, for q, k and v of a GQA call with v's own head dim."""
    torch.manual_seed(5)
    q = torch.randn(2, 4, 13, 64, device=dev).to(dtype).requires_grad_()
    k = torch.randn(2, 2, 11, 64, device=dev).to(dtype).requires_grad_()
    v = torch.randn(2, 2, 11, 32, device=dev).to(dtype).requires_grad_()
    out = flashcore.attention(q, k, v, is_causal=True, causal_alignment="bottom_right")
    gs = torch.randn(3, *out.shape, device=dev).to(dtype)
    batched = torch.autograd.grad(out, (q, k, v), gs, is_grads_batched=True, retain_graph=True)
    for i in range(3):
        one = torch.autograd.grad(out, (q, k, v), gs[i], retain_graph=True)
        for a, b in zip(batched, one):
            if dev == "cpu":
                assert torch.equal(a[i], b)  # (the same sums in the same order: bit for bit)
            else:  # (a larger grid: the GPU's dq sums (atomic adds) and its tile choice may differ)
                torch.testing.assert_close(a[i], b, atol=2e-3, rtol=2e-3)
    if dev == "cpu":
        x = q.detach()[:1, :2, :5, :16].clone()
        f = lambda x: flashcore.attention(x, x, x)  # noqa: E731
        torch.testing.assert_close(torch.autograd.functional.jacobian(f, x, vectorize=True),
                                   torch.autograd.functional.jacobian(f, x), atol=0, rtol=0)
