"""SDPA's shapes beyond one (B, H, S, D) call.

torch's scaled_dot_product_attention takes q (..., Sq, D), k and v (..., Sk, D)
of any rank >= 2, with dim -3 the heads and the dims before it batch dims,
broadcast against each other. flashcore.attention folds such inputs into one
(B, H, S, D) call (flashcore/__init__.py, _as_bhsd) and shapes out and lse
back. Each case is checked, forward and backward, against an fp64 reference
written with broadcasting matmuls (independent of the fold) and against SDPA
on the same low-precision tensors, on the CPU path and on every GPU kernel.
"""
import math

import pytest
import torch
import torch.nn.functional as F

import flashcore

from conftest import GPU_KERNELS, band, requires_gpu, visible_mask

D = 64
SQ, SK = 37, 53  # odd, Sq != Sk

# (id, q shape, k shape, v shape) without the trailing (S, D)
CASES = [
    ("3d", (6,), (6,), (6,)),
    ("2d", (), (), ()),
    ("5d", (2, 3, 4), (2, 3, 4), (2, 3, 4)),
    ("5d_gqa", (2, 3, 4), (2, 3, 2), (2, 3, 2)),
    ("kv_batch1", (3, 4), (1, 4), (1, 4)),
    ("k_batch1_v_full", (3, 4), (1, 4), (3, 4)),
    ("kv_3d_q_4d", (2, 4), (4,), (4,)),
    ("q_batch1", (1, 4), (3, 4), (3, 4)),
    ("q_one_head", (2, 1), (2, 4), (2, 4)),
    ("kv_heads_1_and_4", (2, 4), (2, 1), (2, 4)),
    ("5d_mixed", (3, 1, 4), (1, 2, 4), (1, 2, 4)),
    ("q_2d_kv_3d", (), (4,), (4,)),
]

DEVICES = [pytest.param("cpu", "cpu", id="cpu")] + [
    pytest.param("cuda", k, id=f"cuda-{k}", marks=requires_gpu) for k in GPU_KERNELS]
DTYPE = {"cpu": torch.float32, "cuda": torch.float16}


def ref(q, k, v, causal):
    """fp64 softmax(q k^T / sqrt(q's D)) v and its LSE with SDPA's broadcasting; a query head group of
    Hq / Hk heads reads one KV head (GQA), a single query head reads every KV head."""
    two_d = max(q.dim(), k.dim(), v.dim()) == 2
    q, k, v = (t.double() for t in (q, k, v))
    rank = max(3, q.dim(), k.dim(), v.dim())
    q, k, v = (t.reshape((1,) * (rank - t.dim()) + tuple(t.shape)) for t in (q, k, v))
    hk = max(k.shape[-3], v.shape[-3])
    hq = q.shape[-3]
    if hq % hk == 0:  # (heads, group) so that a KV head broadcasts over its group
        q = q.unflatten(-3, (hk, hq // hk))
        k, v = k.unsqueeze(-3), v.unsqueeze(-3)
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        s = s.masked_fill(~visible_mask(SQ, SK, "top_left", s.device), float("-inf"))
    out, lse = torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)
    if hq % hk == 0:
        out, lse = out.flatten(-4, -3), lse.flatten(-3, -2)
    return (out[0], lse[0]) if two_d else (out, lse)


def inputs(case, dtype, dev):
    _, qs, ks, vs = case
    return tuple(torch.randn(*s, n, D, device=dev).to(dtype) for s, n in ((qs, SQ), (ks, SK), (vs, SK)))


def sdpa(q, k, v, causal):
    # enable_gqa where the heads neither match nor broadcast (SDPA refuses it on 2-D inputs)
    gqa = q.dim() >= 3 and k.dim() >= 3 and q.shape[-3] not in (1, k.shape[-3]) and k.shape[-3] != 1
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)


def err(a, b):
    return (a.double() - b.double()).abs().max().item()


@pytest.mark.parametrize("causal", [False, True], ids=["nocausal", "causal"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dev,kernel", DEVICES)
def test_sdpa_shapes(dev, kernel, case, causal):
    dtype = DTYPE[dev]
    q, k, v = (t.requires_grad_() for t in inputs(case, dtype, dev))
    out, lse = flashcore.attention(q, k, v, is_causal=causal, return_lse=True, kernel=kernel)
    want, want_lse = ref(q, k, v, causal)
    low = sdpa(q, k, v, causal)
    assert out.shape == low.shape and out.dtype == dtype and lse.shape == low.shape[:-1]
    eps = 1e-5 if dtype == torch.float32 else 1e-3
    assert err(out, want) <= 2 * err(low, want) + eps
    assert err(lse, want_lse) <= 1e-4
    if dtype == torch.float16:
        assert torch.allclose(out, low, atol=1e-3, rtol=1e-3)
    # backward: the gradients of the broadcast inputs are summed over the dims they were broadcast in
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), g)
    low_grads = torch.autograd.grad(low, (q, k, v), g)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref_grads = torch.autograd.grad(ref(q64, k64, v64, causal)[0], (q64, k64, v64), g.double())
    for name, a, lo, r, t in zip("qkv", grads, low_grads, ref_grads, (q, k, v)):
        assert a.shape == t.shape, name
        ulp = 1e-5 if dtype == torch.float32 else 2.0 ** -11  # (half an fp16 ulp at 1, as test_backward.py)
        assert err(a, r) <= 2 * err(lo, r) + ulp * max(1.0, r.abs().max().item()), name


@pytest.mark.parametrize("dev,kernel", DEVICES[:1] + DEVICES[1:2])
def test_sdpa_shapes_no_grad_and_views(dev, kernel):
    """Without autograd (the binding's path) the result is the same; the output is a fresh tensor."""
    q, k, v = inputs(CASES[3], DTYPE[dev], dev)
    a = flashcore.attention(q, k, v, kernel=kernel)
    with torch.no_grad():
        b = flashcore.attention(q.requires_grad_(), k, v, kernel=kernel)
    assert torch.equal(a, b)
    assert a.data_ptr() not in (q.data_ptr(), k.data_ptr(), v.data_ptr())


@pytest.mark.parametrize("args,match", [
    (((8,), (8,), (8,)), r"q: expected a tensor of at least 2 dims \(\.\.\., S, D\), got 1-D"),
    (((4, 8), (8,), (4, 8)), r"k: expected a tensor of at least 2 dims"),
    (((3, 2, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8)),
     r"k: the batch dims \(all but the last three\) of shape \(2, 2, 7, 8\) do not broadcast with q's \(3, 2, 5, 8\)"),
    (((3, 2, 5, 8), (3, 2, 7, 8), (2, 2, 7, 8)),
     r"v: the batch dims .* of shape \(2, 2, 7, 8\) do not broadcast with q's \(3, 2, 5, 8\) and k's \(3, 2, 7, 8\)"),
    (((2, 3, 2, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8)), r"k: the batch dims .* of shape \(2, 2, 7, 8\) do not broadcast"),
    (((2, 4, 5, 8), (2, 4, 7, 8), (2, 2, 7, 8)), r"v: 2 heads but k has 4"),
    (((4, 5, 8), (3, 7, 8), (3, 7, 8)), r"k: 3 KV heads do not divide q's 4 heads"),
])
def test_sdpa_shapes_refused(args, match):
    q, k, v = (torch.randn(*s) for s in args)
    with pytest.raises(ValueError, match=match):
        flashcore.attention(q, k, v)


def test_sdpa_shapes_strided_last_dim_refused():
    """A last dim with stride != 1 is refused as on one (B, H, S, D) call, also where the fold would copy it."""
    q = torch.randn(3, 1, 4, 5, 16)[..., ::2]
    k = torch.randn(1, 2, 4, 7, 8)
    with pytest.raises(ValueError, match=r"q: the last dim must be contiguous \(stride 1\), got stride 2"):
        flashcore.attention(q, k, k)


def test_sdpa_shapes_zero_heads():
    """Heads of 1 broadcast against 0 as against any size (an empty output)."""
    for qs, ks, vs, want in (((1, 5, 8), (1, 7, 8), (0, 7, 8), (0, 5, 8)), ((1, 5, 8), (0, 7, 8), (0, 7, 8), (0, 5, 8)),
                             ((2, 1, 5, 8), (2, 0, 7, 8), (2, 0, 7, 8), (2, 0, 5, 8))):
        out, lse = flashcore.attention(torch.randn(*qs), torch.randn(*ks), torch.randn(*vs), return_lse=True)
        assert out.shape == want and lse.shape == want[:-1]


def test_single_heads_against_more():
    """q and k of one head against v of four: all broadcast to four heads, as SDPA broadcasts them."""
    q, k, v = torch.randn(2, 1, 5, 8), torch.randn(2, 1, 7, 8), torch.randn(2, 4, 7, 8)
    torch.testing.assert_close(flashcore.attention(q, k, v), F.scaled_dot_product_attention(q, k, v),
                               atol=1e-6, rtol=1e-5)


def test_compiled_unbacked_sizes():
    """A 4-D call traced with sizes torch.compile cannot compare (unbacked) stays one call: no guard fails the
    trace, and the result is the eager call's."""
    torch._dynamo.reset()
    q, k, v = (torch.randn(3, 4, n, 8) for n in (5, 7, 7))
    for t in (q, k, v):
        torch._dynamo.decorators.mark_unbacked(t, 0)
    got = torch.compile(lambda q, k, v: flashcore.attention(q, k, v), fullgraph=True, backend="aot_eager")(q, k, v)
    torch._dynamo.reset()
    assert torch.equal(got, flashcore.attention(q, k, v))


def test_sdpa_shapes_compiled():
    """torch.compile(fullgraph=True) traces the fold: no graph break, the eager result bit for bit."""
    torch._dynamo.reset()
    q, k, v = inputs(CASES[10], torch.float32, "cpu")
    want = flashcore.attention(q, k, v, is_causal=True, return_lse=True)
    got = torch.compile(lambda q, k, v: flashcore.attention(q, k, v, is_causal=True, return_lse=True),
                        fullgraph=True, backend="aot_eager")(q, k, v)
    torch._dynamo.reset()
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_op_refuses_other_shapes():
    """The custom op itself takes one (B, H, S, D) call; flashcore.attention folds the rest."""
    q = torch.randn(4, 5, 8)
    with pytest.raises(ValueError, match=r"the op takes one \(B, H, S, D\) call.*call flashcore.attention"):
        torch.ops.flashcore.attention(q, q, q, None, 0.0, False, None, None, "top_left", False, "auto", None)


def test_sdpa_shapes_under_vmap():
    """Per-sample 3-D inputs under torch.vmap: each sample as its own call."""
    q, k, v = (torch.randn(3, 4, n, D) for n in (SQ, SK, SK))  # vmapped over dim 0: samples (4, S, D)
    out = torch.vmap(lambda a, b, c: flashcore.attention(a, b, c, is_causal=True))(q, k, v)
    for i in range(3):
        assert torch.equal(out[i], flashcore.attention(q[i], k[i], v[i], is_causal=True))


@pytest.mark.parametrize("dev,kernel", DEVICES[:1] + DEVICES[1:2])
def test_sdpa_shapes_empty(dev, kernel):
    """Empty batch dims, heads or keys fold as SDPA's do: an empty output, or zeros (LSE -inf) with no key."""
    dt = DTYPE[dev]
    # (q shape, k and v shape, SDPA's output shape, as torch 2.14's CPU path gives it; SDPA is not called
    # here: on an H100 with torch 2.11 it stopped the process with SIGFPE on zero heads, CPU and CUDA)
    for qs, ks, want in (((0, 3, 4, 5, D), (1, 3, 4, 7, D), (0, 3, 4, 5, D)), ((2, 0, 5, D), (2, 0, 7, D), (2, 0, 5, D)),
                         ((3, 4, 5, D), (4, 0, D), (3, 4, 5, D))):
        q, k = torch.randn(*qs, device=dev).to(dt), torch.randn(*ks, device=dev).to(dt)
        out, lse = flashcore.attention(q, k, k, return_lse=True, kernel=kernel)
        assert out.shape == want and lse.shape == want[:-1]
        if out.numel():
            assert torch.all(out == 0) and torch.all(lse == float("-inf"))


def test_exported_independent_batch_dims():
    """torch.export with q's and k/v's batch sizes as independent dims (no guard ties them), and
    torch.compile(dynamic=True) of a broadcast k/v batch of 1, each the eager result on two sizes."""
    class M(torch.nn.Module):
        def forward(self, q, k, v):
            return flashcore.attention(q, k, v)

    bq, bk = torch.export.Dim("bq"), torch.export.Dim("bk")
    q, k, v = (torch.randn(3, 4, n, 8) for n in (5, 7, 7))
    ep = torch.export.export(M(), (q, k, v), dynamic_shapes=({0: bq}, {0: bk}, {0: bk}))
    torch._dynamo.reset()
    f = torch.compile(lambda q, k, v: flashcore.attention(q, k, v), dynamic=True, fullgraph=True, backend="aot_eager")
    for b in (3, 5):
        q, k, v = (torch.randn(b, 4, n, 8) for n in (5, 7, 7))
        assert torch.equal(ep.module()(q, k, v), flashcore.attention(q, k, v))
        assert torch.equal(f(q, k[:1], v[:1]), flashcore.attention(q, k[:1], v[:1]))
    torch._dynamo.reset()


@pytest.mark.parametrize("causal", [False, True], ids=["nocausal", "causal"])
@pytest.mark.parametrize("dims", [(192, 128), (64, 128), (128, 64), (64, 100), (256, 8), (8, 256)],
                         ids=lambda d: f"D{d[0]}-Dv{d[1]}")
@pytest.mark.parametrize("dev,kernel", DEVICES)
def test_v_head_dim_differs(dev, kernel, dims, causal):
    """v's head dim Dv != D, as SDPA takes it (MLA-style 192 / 128 among them): out has Dv columns, the
    scale is D's; against SDPA's fp64 math and SDPA on the low-precision inputs, forward and backward."""
    d, dv = dims
    dtype = DTYPE[dev]
    q, k, v = (torch.randn(2, h, n, e, device=dev).to(dtype).requires_grad_()
               for h, n, e in ((4, SQ, d), (2, SK, d), (2, SK, dv)))  # (GQA: two KV heads)
    out, lse = flashcore.attention(q, k, v, is_causal=causal, return_lse=True, kernel=kernel)
    assert out.shape == (2, 4, SQ, dv) and lse.shape == (2, 4, SQ) and out.is_contiguous()
    kx, vx = (t.repeat_interleave(2, dim=1) for t in (k, v))
    r64 = [t.detach().double().requires_grad_() for t in (q, kx, vx)]
    want = F.scaled_dot_product_attention(*r64, is_causal=causal)
    low = F.scaled_dot_product_attention(q, kx, vx, is_causal=causal)
    eps = 1e-5 if dtype == torch.float32 else 1e-3
    assert err(out, want) <= 2 * err(low, want) + eps
    assert err(lse, ref(q, k, v, causal)[1]) <= 1e-4
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), g)
    ref_g = torch.autograd.grad(want, r64, g.double())
    low_g = torch.autograd.grad(low, (q, k, v), g)
    ref_g = (ref_g[0], ref_g[1].unflatten(1, (2, 2)).sum(2), ref_g[2].unflatten(1, (2, 2)).sum(2))
    ulp = 1e-5 if dtype == torch.float32 else 2.0 ** -11
    for name, a, lo, r, t in zip("qkv", got, low_g, ref_g, (q, k, v)):
        assert a.shape == t.shape, name
        assert err(a, r) <= 2 * err(lo, r) + ulp * max(1.0, r.abs().max().item()), name


# (D, Dv) pairs a kernel runs as they are (flashcore.h's Dv: a multiple of 8 below D; the CPU path, and
# the sm90 kernel at D > 128): MLA's tile (D <= 192, Dv <= 128: 192 / 128, 136 / 8, 160 / 96), D = 256's
# kernels with v narrower (256 / 128, 256 / 248, and 184 / 136 past the MLA tile's Dv), and 64 / 32, which
# the GPU kernels refuse (padded there).
NATIVE_DV = [(192, 128), (256, 128), (136, 8), (256, 248), (160, 96), (184, 136), (64, 32)]


def _no_pad(*args):
    raise AssertionError("v was padded where the kernel takes its own head dim")


@pytest.mark.parametrize("alignment", [None, "top_left", "bottom_right"], ids=["nocausal", "tl", "br"])
@pytest.mark.parametrize("dims", NATIVE_DV, ids=lambda d: f"D{d[0]}-Dv{d[1]}")
@pytest.mark.parametrize("dev,kernel", DEVICES)
def test_v_head_dim_native(dev, kernel, dims, alignment, monkeypatch):
    """A call without grad whose v has a head dim of its own runs on the kernel as it is where that kernel
    takes it (_C.native_dv says where, and must say so for the CPU path and for sm90 at D > 128), else
    padded: out against the fp64 reference by the suite's rule (fp16 also allclose to SDPA), bit for bit
    the call with v padded to D by hand, on fresh inputs with outputs poisoned (conftest), odd Sq != Sk
    both ways, GQA, q in a (B, S, H, D) view, fp16 and bf16 on the GPU, and a sliding window."""
    d, dv = dims
    kid = flashcore.KERNELS[kernel]
    for sq, sk, dtype in ((SQ, SK, DTYPE[dev]), (SK + 80, SQ, torch.bfloat16 if dev == "cuda" else DTYPE[dev])):
        torch.manual_seed(sq * 1000 + d + dv)
        q = torch.randn(2, sq, 4, d, device=dev).to(dtype).transpose(1, 2)  # (a (B, S, H, D) view)
        k, v = (torch.randn(2, 2, sk, e, device=dev).to(dtype) for e in (d, dv))
        mode = {None: 0, "top_left": 1, "bottom_right": 2}[alignment]
        native = flashcore._C.native_dv(q, k, v, mode, kid, 0, None)
        assert native == (dev == "cpu" or (kernel == "sm90" and d > 128)), (dev, kernel, dims)
        kw = dict(causal=alignment is not None, causal_alignment=alignment or "top_left", kernel=kernel)
        with monkeypatch.context() as m:
            if native:  # (the call runs as it is: flashcore.attention's padding must not run)
                m.setattr(flashcore, "_pad_head_dims", _no_pad)
            out, lse = flashcore.attention(q, k, v, return_lse=True, **kw)
        assert out.shape == (2, 4, sq, dv) and out.dtype == dtype and out.is_contiguous()
        padded, plse = flashcore.attention(q, k, F.pad(v, (0, d - dv)), return_lse=True, **kw)
        assert torch.equal(out, padded[..., :dv]) and torch.equal(lse, plse)
        kx, vx = (t.repeat_interleave(2, dim=1) for t in (k, v))
        mask = visible_mask(sq, sk, alignment, dev)
        want = F.scaled_dot_product_attention(*(t.double() for t in (q, kx, vx)), attn_mask=mask)
        low = F.scaled_dot_product_attention(q, kx, vx, attn_mask=mask)
        rows = mask.any(-1)  # (rows that see no key: out 0, which the masked SDPA leaves NaN)
        eps = 1e-5 if dtype == torch.float32 else 1e-3
        assert err(out[..., rows, :], want[..., rows, :]) <= 2 * err(low[..., rows, :], want[..., rows, :]) + eps
        assert torch.all(out[..., ~rows, :] == 0) and torch.all(lse[..., ~rows] == float("-inf"))
        if dtype == torch.float16:
            torch.testing.assert_close(out[..., rows, :], low[..., rows, :], atol=1e-3, rtol=1e-3)
        if alignment is not None:  # a window (its own sm90 instantiation), against the padded call
            w = dict(kw, window=(17, 0))
            with monkeypatch.context() as m:
                if native:
                    m.setattr(flashcore, "_pad_head_dims", _no_pad)
                got = flashcore.attention(q, k, v, **w)
            assert torch.equal(got, flashcore.attention(q, k, F.pad(v, (0, d - dv)), **w)[..., :dv])
            assert flashcore._C.native_dv(q, k, v, mode, kid, 0, (17, 0)) == native


@pytest.mark.parametrize("dims", [(192, 128), (160, 64), (256, 8), (64, 32)], ids=lambda d: f"D{d[0]}-Dv{d[1]}")
@pytest.mark.parametrize("dev,kernel", DEVICES)
def test_v_head_dim_native_grad(dev, kernel, dims, monkeypatch):
    """With grad, an eager call whose kernel takes v's own head dim runs the op on it as it is (v is not
    padded: _pad_head_dims must not run), and so does its backward where the backward kernel takes it
    (_C.native_dv_bwd: the CPU path and sm90 at D > 128; _pad_cols must not run), else it pads v, out and
    dout: out, lse and the gradients bit for bit those of the call with v padded to D by hand."""
    d, dv = dims
    dtype = DTYPE[dev]
    native = dev == "cpu" or (kernel == "sm90" and d > 128)
    torch.manual_seed(d + dv)
    q, k, v = (torch.randn(2, h, n, e, device=dev).to(dtype).requires_grad_()
               for h, n, e in ((4, SQ, d), (2, SK, d), (2, SK, dv)))
    kid = flashcore.KERNELS[kernel]
    assert flashcore._C.native_dv_bwd(q, k, v, 1, kid, False, None) == native, (dev, kernel, dims)
    with monkeypatch.context() as m:
        if native:
            m.setattr(flashcore, "_pad_head_dims", _no_pad)
            m.setattr(flashcore, "_pad_cols", _no_pad)
        out, lse = flashcore.attention(q, k, v, is_causal=True, return_lse=True, kernel=kernel)
        assert out.shape == (2, 4, SQ, dv)
        g = torch.randn_like(out)
        got = torch.autograd.grad((out * g).sum() + lse.sum(), (q, k, v))
    vp = F.pad(v, (0, d - dv))
    want_out, want_lse = flashcore.attention(q, k, vp, is_causal=True, return_lse=True, kernel=kernel)
    want = torch.autograd.grad((want_out[..., :dv] * g).sum() + want_lse.sum(), (q, k, v))
    assert torch.equal(out, want_out[..., :dv]) and torch.equal(lse, want_lse)
    for a, b, name in zip(got, want, "qkv"):
        assert a.shape == b.shape and torch.equal(a, b), name
    if not native:  # the backward op itself refuses v's own head dim where its kernel does not take it
        with pytest.raises(ValueError, match=rf"Dv: v's head dim {dv} differs from D={d}, which the"):
            flashcore._C.bwd(g, *(t.detach() for t in (q, k, v, out, lse)), None, d ** -0.5, 1, kid)


@pytest.mark.parametrize("mode", ["br-sq>sk", "window", "dout-view"])
@pytest.mark.parametrize("dev,kernel", DEVICES)
def test_v_head_dim_native_grad_modes(dev, kernel, mode, monkeypatch):
    """v's own head dim (D = 192, Dv = 128; D = 136, Dv = 8) through the backward with bottom-right causal
    and Sq > Sk (rows that see no key: dq 0), a window, and a grad_out that is a strided view (the
    binding's rows_usable): gradients bit for bit those of v padded to D by hand, not padded where the
    kernel takes Dv (the CPU path, sm90)."""
    dtype = DTYPE[dev]
    for d, dv in ((192, 128), (136, 8)):
        native = dev == "cpu" or kernel == "sm90"
        sq, sk = (71, 40) if mode == "br-sq>sk" else (SQ, SK)
        torch.manual_seed(d + dv + sq)
        q, k, v = (torch.randn(1, h, n, e, device=dev).to(dtype).requires_grad_()
                   for h, n, e in ((4, sq, d), (2, sk, d), (2, sk, dv)))
        kw = dict(causal=True, causal_alignment="bottom_right" if mode == "br-sq>sk" else "top_left",
                  window=(9, 0) if mode == "window" else None, kernel=kernel)
        g = torch.randn(1, sq, 4, dv, device=dev).to(dtype).transpose(1, 2)  # (a (B, S, H, Dv) view)
        if mode != "dout-view":
            g = g.contiguous()

        def grads(vv, no_pad):
            with monkeypatch.context() as m:
                if no_pad:
                    m.setattr(flashcore, "_pad_head_dims", _no_pad)
                    m.setattr(flashcore, "_pad_cols", _no_pad)
                out = flashcore.attention(q, k, vv, **kw)
                return torch.autograd.grad((out[..., :dv] * g).sum(), (q, k, v))
        got, want = grads(v, native), grads(F.pad(v, (0, d - dv)), False)
        for a, b, name in zip(got, want, "qkv"):
            assert torch.equal(a, b), (d, dv, name)
        if mode == "br-sq>sk":
            assert torch.all(got[0][:, :, :sq - sk] == 0)  # (rows before the diagonal's start see no key)


@requires_gpu
@pytest.mark.parametrize("case", [(2, 16, 8, 1000, 1000, "top_left", None), (1, 8, 2, 700, 1500, None, None),
                                  (2, 8, 4, 1100, 1300, "bottom_right", (300, 0)),
                                  (3, 4, 4, 333, 129, "bottom_right", None)],
                         ids=["causal", "gqa-sk>sq", "window", "sq>sk"])
@pytest.mark.parametrize("dims", [(192, 128), (256, 64), (184, 136), (256, 248), (136, 8)],
                         ids=lambda d: f"D{d[0]}-Dv{d[1]}")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_v_head_dim_native_bwd(case, dims, dtype, monkeypatch):
    """The Hopper backward with v's own head dim (D > 128; dO, V and dV of Dv columns, the products over
    columns past D or Dv skipped), over several key blocks per item and items per CTA, GQA, odd Sq != Sk,
    rows that see no key, a window, gradients through the LSE too: deterministic, each gradient bit for bit
    the backward of v padded to D by hand, and the same on a rerun; not deterministic, dk and dv bit for bit
    and dq within the padded call's own rerun spread; and against fp64 gradients (one batch entry, one KV
    head's query heads) by the suite's rule."""
    if "sm90" not in GPU_KERNELS:
        pytest.skip("the sm90 backward runs v's own head dim (no sm90 device here)")
    B, Hq, Hkv, sq, sk, alignment, window = case
    d, dv = dims
    torch.manual_seed(sq + sk + d + dv)
    q = torch.randn(B, Hq, sq, d, device="cuda").to(dtype).requires_grad_()
    k = torch.randn(B, Hkv, sk, d, device="cuda").to(dtype).requires_grad_()
    v = torch.randn(B, Hkv, sk, dv, device="cuda").to(dtype).requires_grad_()
    mode = {None: 0, "top_left": 1, "bottom_right": 2}[alignment]
    kw = dict(causal=alignment is not None, causal_alignment=alignment or "top_left", window=window)
    g = torch.randn(B, Hq, sq, dv, device="cuda").to(dtype)

    assert flashcore._C.native_dv(q, k, v, mode, 0, 0, None if window is None else list(window))

    def grads(vv, native, with_lse=True):
        with monkeypatch.context() as m:
            if native:  # (neither the forward nor the backward pads)
                m.setattr(flashcore, "_pad_head_dims", _no_pad)
                m.setattr(flashcore, "_pad_cols", _no_pad)
            out, lse = flashcore.attention(q, k, vv, return_lse=True, **kw)
            loss = (out[..., :dv] * g).sum() + (lse.clamp_min(-1e4).sum() if with_lse else 0)
            return torch.autograd.grad(loss, (q, k, v))

    was = torch.are_deterministic_algorithms_enabled()
    try:
        for det in (True, False):
            torch.use_deterministic_algorithms(det)
            assert flashcore._C.native_dv_bwd(q, k, v, mode, 0, det, None if window is None else list(window))
            got, again, want = grads(v, True), grads(v, True), grads(F.pad(v, (0, d - dv)), False)
            if det:
                for a, b, c, name in zip(got, again, want, "qkv"):
                    assert torch.equal(a, b) and torch.equal(a, c), name
            else:
                assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
                spread = err(grads(F.pad(v, (0, d - dv)), False)[0], want[0])
                assert err(got[0], want[0]) <= 2 * spread + 2.0 ** -10 * want[0].abs().max().item()
        got = grads(v, True, with_lse=False)
    finally:
        torch.use_deterministic_algorithms(was)
    # against fp64: rows that see no key get dq = 0 and add nothing (their g is zeroed for SDPA, whose
    # fully masked rows are NaN, and their mask opened)
    G = Hq // Hkv
    mask = band(sq, sk, alignment is not None, alignment, *(window or (None, None)), "cuda")
    rows = mask.any(-1)
    mask |= ~rows.unsqueeze(1)
    qs, gs = q[:1, :G], g[:1, :G] * rows.unsqueeze(1).to(dtype)
    ks, vs = (t[:1, :1].expand(-1, G, -1, -1) for t in (k, v))
    r64 = [t.detach().double().requires_grad_() for t in (q[:1, :G], k[:1, :1], v[:1, :1])]
    ref = torch.autograd.grad(F.scaled_dot_product_attention(r64[0], *(t.expand(-1, G, -1, -1) for t in r64[1:]),
                                                             attn_mask=mask), r64, gs.double())
    low = torch.autograd.grad(F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask), (q, k, v), gs)
    low = (low[0][:1, :G], low[1][:1, :1], low[2][:1, :1])
    mine = (got[0][:1, :G], got[1][:1, :1], got[2][:1, :1])  # (KV head 0's gradients: query heads 0 .. G-1)
    for name, a, lo, r in zip("qkv", mine, low, ref):
        assert err(a, r) <= 2 * err(lo, r) + 2.0 ** -11 * max(1.0, r.abs().max().item()), name


@requires_gpu
@pytest.mark.parametrize("case", [(2, 16, 1000, 1000, "top_left", None), (1, 8, 2000, 1500, None, None),
                                  (2, 8, 1100, 1300, "bottom_right", (300, 0)), (3, 12, 700, 700, None, None)],
                         ids=["dynamic", "static", "window", "grid-odd"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_v_head_dim_native_orders(case, dtype):
    """MLA's D = 192, Dv = 128 on the Hopper kernel's tile orders (a causal call with more tiles than SMs takes
    the dynamic order, a window its own instantiation): bit for bit the call with v padded to D, and against
    the fp64 reference on a sample of heads by the suite's rule."""
    if "sm90" not in GPU_KERNELS:
        pytest.skip("the sm90 kernel runs v's own head dim (no sm90 device here)")
    B, H, sq, sk, alignment, window = case
    torch.manual_seed(sq + sk)
    q = torch.randn(B, H, sq, 192, device="cuda").to(dtype)
    k = torch.randn(B, H, sk, 192, device="cuda").to(dtype)
    v = torch.randn(B, H, sk, 128, device="cuda").to(dtype)
    mode = {None: 0, "top_left": 1, "bottom_right": 2}[alignment]
    assert flashcore._C.native_dv(q, k, v, mode, flashcore.KERNELS["auto"], 0, window)
    kw = dict(causal=alignment is not None, causal_alignment=alignment or "top_left", window=window)
    out = flashcore.attention(q, k, v, **kw)
    assert torch.equal(out, flashcore.attention(q, k, F.pad(v, (0, 64)), **kw)[..., :128])
    mask = band(sq, sk, alignment is not None, alignment, *(window or (None, None)), "cuda")
    rows = mask.any(-1)
    qs, ks, vs, os = (t[:1, :2] for t in (q, k, v, out))  # (one batch entry, two heads)
    want = F.scaled_dot_product_attention(qs.double(), ks.double(), vs.double(), attn_mask=mask)
    low = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask)
    assert err(os[..., rows, :], want[..., rows, :]) <= 2 * err(low[..., rows, :], want[..., rows, :]) + 1e-3
    assert torch.all(os[..., ~rows, :] == 0)


@requires_gpu
@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"], ids=["tl", "br"])
def test_v_head_dim_pairs(alignment):
    """v narrower than D = 256 on the CTA pairs (rows of 2048 keys or more, test_sm90_route.test_mla_routes),
    whose multicast V loads then include slabs wholly past v's columns; and no keys at all with MLA's pair:
    bit for bit the calls with v padded to D."""
    if "sm90" not in GPU_KERNELS:
        pytest.skip("the sm90 kernel runs v's own head dim (no sm90 device here)")
    torch.manual_seed(4096)
    q = torch.randn(2, 8, 256, 256, device="cuda", dtype=torch.float16)
    k = torch.randn(2, 8, 4096, 256, device="cuda", dtype=torch.float16)
    v = torch.randn(2, 8, 4096, 64, device="cuda", dtype=torch.float16)
    kw = dict(causal=True, causal_alignment=alignment)
    assert flashcore._C.native_dv(q, k, v, {"top_left": 1, "bottom_right": 2}[alignment], 0, 0, None)
    out, lse = flashcore.attention(q, k, v, return_lse=True, **kw)
    want, wlse = flashcore.attention(q, k, F.pad(v, (0, 192)), return_lse=True, **kw)
    assert torch.equal(out, want[..., :64]) and torch.equal(lse, wlse)
    q, k, v = (torch.randn(2, 4, n, e, device="cuda", dtype=torch.float16) for n, e in ((5, 192), (0, 192), (0, 128)))
    out, lse = flashcore.attention(q, k, v, return_lse=True, kernel="sm90")
    assert out.shape == (2, 4, 5, 128) and torch.all(out == 0) and torch.all(lse == float("-inf"))


@pytest.mark.parametrize("dev,kernel", DEVICES)
@pytest.mark.parametrize("d,dv", [(1, 1), (4, 4), (12, 12), (20, 20), (100, 100), (250, 250), (12, 64), (100, 96),
                                  (255, 40)])
def test_head_dims_not_multiple_of_8(dev, kernel, d, dv):
    """A head dim D that is not a multiple of 8 (SDPA takes any) runs as the call zero-padded to the next
    one (q . k unchanged, the scale 1/sqrt(D)): against the fp64 reference, forward (out and LSE) and
    backward, with GQA, causal masks and a 3-D call; compiled (fullgraph) the same as eager."""
    dtype = DTYPE[dev]
    torch.manual_seed(d * 1000 + dv)
    q = torch.randn(2, 4, 37, d, device=dev).to(dtype).requires_grad_()
    k = torch.randn(2, 2, 45, d, device=dev).to(dtype).requires_grad_()
    v = torch.randn(2, 2, 45, dv, device=dev).to(dtype).requires_grad_()
    out, lse = flashcore.attention(q, k, v, is_causal=True, return_lse=True, kernel=kernel)
    assert out.shape == (2, 4, 37, dv) and out.dtype == dtype and lse.shape == (2, 4, 37)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    s = (q64 @ k64.repeat_interleave(2, 1).transpose(-1, -2)) / math.sqrt(d)
    s = s.masked_fill(~visible_mask(37, 45, "top_left", dev), float("-inf"))
    want, want_lse = torch.softmax(s, -1) @ v64.repeat_interleave(2, 1), torch.logsumexp(s, -1)
    sd = F.scaled_dot_product_attention(*(t.detach() for t in (q, k, v)), is_causal=True, enable_gqa=True)
    tol = 2 * err(sd, want) + 1e-5  # (GUIDE's rule: within twice SDPA's own error at this dtype)
    assert err(out, want) <= tol and err(lse, want_lse) <= 1e-4 * max(1.0, want_lse.abs().max().item())
    g = torch.randn_like(want)
    got = torch.autograd.grad(out, (q, k, v), g.to(dtype))
    ref_g = torch.autograd.grad(want, (q64, k64, v64), g)
    for a, b, name in zip(got, ref_g, "qkv"):
        assert a.shape == b.shape and err(a, b) <= (1e-4 if dev == "cpu" else 2e-2) * max(1.0, b.abs().max().item()), name
    if dev == "cpu":
        x = q[0].detach()  # (3-D: (H, S, D))
        torch.testing.assert_close(flashcore.attention(x, x, x), F.scaled_dot_product_attention(x, x, x),
                                   atol=1e-5, rtol=1e-5)
        torch._dynamo.reset()  # (each case compiles the same lambda: no recompile limit across cases)
        f = torch.compile(lambda q, k, v: flashcore.attention(q, k, v, is_causal=True), fullgraph=True,
                          backend="aot_eager")
        assert torch.equal(f(*(t.detach() for t in (q, k, v))), out.detach())
        torch._dynamo.reset()


def test_v_head_dim_refusals():
    q = torch.randn(2, 4, 5, 64)
    with pytest.raises(ValueError, match=r"k: head dim 32 differs from q's 64; q and k need the same D \(v's may"):
        flashcore.attention(q, torch.randn(2, 4, 7, 32), torch.randn(2, 4, 7, 128))
    with pytest.raises(ValueError, match=r"q: head dim D=300 is not supported; D must be from 1 to 256"):
        flashcore.attention(torch.randn(2, 4, 5, 300), torch.randn(2, 4, 7, 300), torch.randn(2, 4, 7, 128))
    with pytest.raises(ValueError, match=r"q: head dim D=12 is not a multiple of 8, which the kernels need; call "
                                         r"flashcore.attention"):
        q12 = torch.randn(2, 4, 5, 12)
        torch.ops.flashcore.attention(q12, q12, q12, None, 0.0, False, None, None, "top_left", False, "auto", None)
    with pytest.raises(ValueError, match=r"v: the last dim must be contiguous"):
        flashcore.attention(q, torch.randn(2, 4, 7, 64), torch.randn(2, 4, 7, 256)[..., ::2])
    with pytest.raises(ValueError, match=r"v: head dim 128 differs from q's 64, which the op runs only where"):
        torch.ops.flashcore.attention(q, q, torch.randn(2, 4, 5, 128), None, 0.0, False, None, None, "top_left",
                                      False, "auto", None)
    with pytest.raises(ValueError, match=r"the op takes one \(B, H, S, D\) call"):
        torch.ops.flashcore.attention(q, q[:1], q[:1], None, 0.0, False, None, None, "top_left", False, "auto", None)
    # a call that may run with v's own head dim (24 below 64) gets the argument errors of any call
    k, v = torch.randn(2, 4, 7, 64), torch.randn(2, 4, 7, 24)
    for grad in (False, True):
        qg = q.clone().requires_grad_(grad)
        for bad in (float("nan"), -1e-50, 1e300):
            with pytest.raises(ValueError, match=r"scale: got"):
                flashcore.attention(qg, k, v, scale=bad)
    op = lambda q, k, v: torch.ops.flashcore.attention(q, k, v, None, 0.0, False, None, None,  # noqa: E731
                                                       "top_left", False, "auto", None)
    with pytest.raises(ValueError, match=r"v: sequence length 9 differs from k's 7"):
        op(q, k, torch.randn(2, 4, 9, 24))
    with pytest.raises(TypeError, match=r"v: dtype Double differs from q's Float"):
        op(q, k, v.double())


@pytest.mark.parametrize("dev,kernel", DEVICES)
def test_v_head_dim_with_the_rest(dev, kernel):
    """Dv != D together with SDPA's other shapes (3-D, 5-D with broadcast k/v), bottom-right causal with
    Sq > Sk (rows that see no key), a scale of the caller's, gradients through the LSE, no keys, and Dv = 0."""
    dtype = DTYPE[dev]
    mk = lambda *s: torch.randn(*s, device=dev).to(dtype).requires_grad_()  # noqa: E731
    for q, k, v, kw in (
            (mk(4, 60, 64), mk(2, 41, 64), mk(2, 41, 96), dict(causal=True, causal_alignment="bottom_right")),
            (mk(3, 2, 4, 37, 128), mk(1, 2, 1, 53, 128), mk(1, 2, 1, 53, 40), dict(scale=0.07)),
            (mk(2, 4, 37, 64), mk(2, 4, 53, 64), mk(2, 4, 53, 256), dict(is_causal=True))):
        out, lse = flashcore.attention(q, k, v, return_lse=True, kernel=kernel, **kw)
        # the same call with v split into D-wide column blocks, each padded to D by hand (no _pad_head_dims)
        d, dv = q.shape[-1], v.shape[-1]
        parts = [flashcore.attention(q, k, F.pad(v[..., c:c + d], (0, max(0, c + d - dv))), return_lse=True,
                                     kernel=kernel, **kw) for c in range(0, dv, d)]
        want = torch.cat([o for o, _ in parts], -1)[..., :dv]
        assert out.shape == want.shape and out.dtype == dtype
        # (the wider call may run another tile kernel, whose sums come in another order; -inf rows equal)
        torch.testing.assert_close(lse, parts[0][1], atol=1e-5, rtol=0)
        assert err(out, want) <= (1e-6 if dtype == torch.float32 else 2e-3)  # (the wider call's own rounding)
        g = torch.autograd.grad((out.float().square().sum() + lse.sum()), (q, k, v))
        w = torch.autograd.grad((want.float().square().sum() + parts[0][1].sum()), (q, k, v))
        for a, b, name in zip(g, w, "qkv"):
            assert a.shape == b.shape and err(a, b) <= 1e-3 * max(1.0, b.abs().max().item()), name
    q, k = torch.randn(2, 3, 5, 64, device=dev).to(dtype), torch.randn(2, 3, 0, 64, device=dev).to(dtype)
    out, lse = flashcore.attention(q, k, torch.randn(2, 3, 0, 16, device=dev).to(dtype), return_lse=True,
                                   kernel=kernel)
    assert out.shape == (2, 3, 5, 16) and torch.all(out == 0) and torch.all(lse == float("-inf"))
    out = flashcore.attention(q, q, torch.randn(2, 3, 1, 5, device=dev).to(dtype).transpose(-1, -2), kernel=kernel)
    assert out.shape == (2, 3, 5, 1)  # (a last dim of one element: its stride does not matter)
    assert flashcore.attention(q, q, q[..., :0], kernel=kernel).shape == (2, 3, 5, 0)


def test_v_head_dim_compiled():
    torch._dynamo.reset()
    q, k, v = torch.randn(2, 4, 5, 64), torch.randn(2, 4, 7, 64), torch.randn(1, 4, 7, 128)
    f = torch.compile(lambda q, k, v: flashcore.attention(q, k, v, is_causal=True, return_lse=True), fullgraph=True,
                      backend="aot_eager")
    got, want = f(q, k, v), flashcore.attention(q, k, v, is_causal=True, return_lse=True)
    torch._dynamo.reset()
    assert all(torch.equal(a, b) for a, b in zip(got, want))
