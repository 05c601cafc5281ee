"""flashcore.attention's attn_mask (SDPA's): a bool mask (True: the key is seen) or an additive one of q's
dtype, broadcast to (B, Hq, Sq, Sk), with the causal mode and a window on top. So far the CPU path runs
it (forward and backward); on CUDA a mask is refused by name (the GPU kernels take none yet)."""
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashcore
from conftest import make_qkv, requires_gpu

B, HQ, HKV, SQ, SK, D = 2, 4, 2, 37, 45, 64


def _tril(sq, sk):
    return torch.ones(sq, sk, dtype=torch.bool).tril()


def _sdpa64(q, k, v, mask, **kw):
    """SDPA's math backend in fp64 with the mask (its rows that see no key give NaN there)."""
    m = mask if mask.dtype == torch.bool else mask.double()
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=m, enable_gqa=True, **kw)


MASKS = {
    "padding": lambda: torch.rand(B, 1, 1, SK) < 0.8,            # key padding, broadcast over heads and rows
    "full_bool": lambda: torch.rand(B, HQ, SQ, SK) < 0.6,
    "rows": lambda: torch.rand(SQ, SK) < 0.7,                     # one (Sq, Sk) mask for every batch and head
    "additive": lambda: torch.randn(1, HQ, SQ, SK),               # a bias (ALiBi-like), broadcast over B
    "additive_inf": lambda: torch.randn(B, 1, SQ, SK).masked_fill(torch.rand(B, 1, SQ, SK) < 0.3, float("-inf")),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("name", list(MASKS))
@pytest.mark.parametrize("causal", [False, True])
def test_mask_matches_sdpa(name, dtype, causal):
    """Out and LSE against SDPA's math backend in fp64 (the causal mask folded into the mask) within
    its own error at the dtype, and the gradients of q, k and v; rows the mask hides entirely give 0
    and LSE -inf (SDPA's math backend gives NaN there); reruns are bit-identical."""
    torch.manual_seed(hash((name, causal)) % 10000)
    q, k, v = make_qkv(B, HQ, HKV, SQ, SK, D, dtype, "cpu")
    mask = MASKS[name]()
    mask = mask if mask.dtype == torch.bool else mask.to(dtype)
    out, lse = flashcore.attention(q, k, v, attn_mask=mask, is_causal=causal, return_lse=True)
    assert torch.equal(out, flashcore.attention(q, k, v, attn_mask=mask, is_causal=causal))
    full = mask
    if causal:
        full = mask & _tril(SQ, SK) if mask.dtype == torch.bool else mask.masked_fill(~_tril(SQ, SK), float("-inf"))
    want = _sdpa64(q, k, v, full)
    dead = torch.isnan(want).all(-1)  # (rows that see no key)
    assert torch.all(out[dead] == 0) and torch.all(lse[dead] == float("-inf"))
    tol = {torch.float32: 2e-6, torch.bfloat16: 2e-2, torch.float64: 1e-12}[dtype]
    torch.testing.assert_close(out.double()[~dead], want[~dead], atol=tol, rtol=tol)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    g = torch.randn(B, HQ, SQ, D).to(dtype)
    got = torch.autograd.grad(flashcore.attention(*leaves, attn_mask=mask, is_causal=causal), leaves, g)
    ref_leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = _sdpa64(*ref_leaves, full)
    ref = torch.where(torch.isnan(ref), 0.0, ref)  # (dead rows: no gradient, as flashcore gives them none)
    want_g = torch.autograd.grad(ref, ref_leaves, g.double())
    for a, b in zip(got, want_g):
        b = b.nan_to_num(0.0)
        torch.testing.assert_close(a.double(), b, atol=10 * tol * max(1.0, b.abs().max().item()), rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_fp32_mask_with_other_dtypes(dtype):
    """A float32 additive mask with q of another dtype (SDPA takes one) is added as it is, in fp32, not
    rounded to q's dtype: against the same call with the mask in fp64 folded into the reference."""
    torch.manual_seed(7)
    q, k, v = make_qkv(B, HQ, HKV, SQ, SK, D, dtype, "cpu")
    bias = (torch.randn(1, HQ, SQ, SK) * 3).masked_fill(torch.rand(1, HQ, SQ, SK) < 0.2, float("-inf"))
    out, lse = flashcore.attention(q, k, v, attn_mask=bias, is_causal=True, return_lse=True)
    s = (q.double() @ k.double().repeat_interleave(2, 1).transpose(-1, -2)) / D ** 0.5 + bias.double()
    s = s.masked_fill(~_tril(SQ, SK), float("-inf"))
    live = torch.isfinite(s).any(-1)
    want, want_lse = torch.softmax(s, -1) @ v.double().repeat_interleave(2, 1), torch.logsumexp(s, -1)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(out.double()[live], want[live], atol=tol if dtype == torch.float64 else 2e-2,
                               rtol=tol if dtype == torch.float64 else 2e-2)
    torch.testing.assert_close(lse.double()[live], want_lse[live], atol=tol, rtol=tol)  # (fp32 bias, not rounded)


def test_mask_with_window_and_bottom_right():
    """The mask applies on top of a sliding window with the bottom-right diagonal (Sq < Sk)."""
    q, k, v = make_qkv(1, 2, 2, 20, 50, 64, torch.float32, "cpu")
    mask = torch.rand(1, 1, 20, 50) < 0.8
    out = flashcore.attention(q, k, v, attn_mask=mask, causal=True, causal_alignment="bottom_right", window=(7, 0))
    i, j = torch.arange(20)[:, None], torch.arange(50)[None, :]
    band = (j <= i + 30) & (j >= i + 30 - 7)
    want = _sdpa64(q, k, v, mask & band)
    live = ~torch.isnan(want).all(-1)
    torch.testing.assert_close(out.double()[live], want[live], atol=2e-6, rtol=2e-6)


def test_mask_refusals():
    """A mask of another dtype, one that does not broadcast, one that requires grad, a non-tensor and a mask
    with SDPA's other shapes (folded calls) or under vmap are refused by name."""
    q, k, v = make_qkv(B, HQ, HKV, SQ, SK, D, torch.float32, "cpu")
    cases = ((torch.ones(SQ, SK, dtype=torch.int32), TypeError, r"^attn_mask: dtype Int is neither bool, float32"),
             (torch.ones(SQ, SK, dtype=torch.float64), TypeError, r"^attn_mask: dtype Double is neither"),
             (torch.ones(SQ, SK, dtype=torch.float16), TypeError, r"^attn_mask: dtype Half is neither"),
             (torch.ones(3, SK, dtype=torch.bool), ValueError, r"^attn_mask: shape \(3, 45\) does not broadcast"),
             (torch.ones(2, B, HQ, SQ, SK, dtype=torch.bool), ValueError, r"^attn_mask: shape .* does not broadcast"),
             (torch.zeros(SQ, SK, requires_grad=True), ValueError, r"^attn_mask: requires grad"),
             ([[True]], TypeError, r"^attn_mask: expected None or a tensor, got list"))
    for mask, exc, match in cases:
        with pytest.raises(exc, match=match):
            flashcore.attention(q, k, v, attn_mask=mask)
    with pytest.raises(ValueError, match=r"^attn_mask: taken so far with q, k, v of one \(B, H, S, D\) call"):
        flashcore.attention(q[0], k[0], v[0], attn_mask=torch.ones(SQ, SK, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^attn_mask: on cpu but q is on meta"):
        flashcore.attention(*(t.to("meta") for t in (q, k, v)), attn_mask=torch.ones(SQ, SK, dtype=torch.bool))


def test_mask_grads_batched_and_export():
    """Batched gradients (the backward's vmap rule) with a mask, and torch.export of a masked call."""
    q, k, v = (t.requires_grad_() for t in make_qkv(1, 2, 2, 9, 11, 16, torch.float64, "cpu"))
    mask = torch.rand(9, 11) < 0.7
    mask[:, 0] = True
    out = flashcore.attention(q, k, v, attn_mask=mask)
    gs = torch.randn(3, *out.shape, dtype=torch.float64)
    batched = torch.autograd.grad(out, (q, k, v), gs, is_grads_batched=True, retain_graph=True)
    for i in range(3):
        for a, b in zip(batched, torch.autograd.grad(out, (q, k, v), gs[i], retain_graph=True)):
            assert torch.equal(a[i], b)

    class M(torch.nn.Module):
        def forward(self, q, k, v, m):
            return flashcore.attention(q, k, v, attn_mask=m)
    args = tuple(t.detach() for t in (q, k, v)) + (mask,)
    ep = torch.export.export(M(), args)
    assert torch.equal(ep.module()(*args), flashcore.attention(*args[:3], attn_mask=mask))


@requires_gpu
def test_mask_refused_on_cuda():
    """The GPU kernels take no mask yet: a CUDA call with one raises ValueError naming the mask."""
    q, k, v = make_qkv(B, HQ, HKV, SQ, SK, D, torch.float16, "cuda")
    with pytest.raises(ValueError, match=r"mask: only the CPU kernel takes a mask so far"):
        flashcore.attention(q, k, v, attn_mask=torch.ones(SQ, SK, dtype=torch.bool, device="cuda"))


def test_mask_review_cases():
    """A mask that requires grad is refused with q requiring grad too; under CPU autocast a float mask
    takes bf16 (as SDPA's) and the backward runs after the autocast block; an in-place change of the
    mask before backward() is torch's version error, not a wrong gradient; a vmapped mask is refused by
    name; a mask broadcast along the keys (Sq, 1) or 0-D runs, without a (B, Hq, Sq, Sk) copy."""
    q, k, v = make_qkv(1, 2, 2, 9, 11, 16, torch.float32, "cpu")
    with pytest.raises(ValueError, match=r"^attn_mask: requires grad"):
        flashcore.attention(q.clone().requires_grad_(), k, v, attn_mask=torch.zeros(9, 11, requires_grad=True))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    bias = torch.randn(9, 11)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = flashcore.attention(*leaves, attn_mask=bias)
        want = F.scaled_dot_product_attention(*leaves, attn_mask=bias, enable_gqa=True)
    assert out.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), want.float(), atol=2e-2, rtol=2e-2)
    out.float().sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in leaves)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    mask = torch.rand(9, 11) < 0.8
    out = flashcore.attention(*leaves, attn_mask=mask)
    mask.fill_(True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()
    with pytest.raises(ValueError, match=r"^attn_mask: a tensor with no storage of its own"):
        torch.vmap(lambda m: flashcore.attention(q, k, v, attn_mask=m))(torch.randn(3, 9, 11))
    rowwise = torch.randn(9, 1)  # (adds a constant per row: the softmax is unchanged)
    torch.testing.assert_close(flashcore.attention(q, k, v, attn_mask=rowwise), flashcore.attention(q, k, v),
                               atol=1e-6, rtol=1e-6)
    assert torch.equal(flashcore.attention(q, k, v, attn_mask=torch.tensor(True)), flashcore.attention(q, k, v))
    assert torch.all(flashcore.attention(q, k, v, attn_mask=torch.tensor(False)) == 0)


def test_mask_export_dynamic_keys():
    """torch.export with a dynamic Sk shared by k, v and the mask exports (the fake's checks read the
    mask at its example sizes, with no guard on them) and runs at another length."""
    q, k, v = make_qkv(1, 2, 2, 9, 11, 16, torch.float32, "cpu")
    mask = torch.rand(9, 11) < 0.8
    mask[:, 0] = True

    class M(torch.nn.Module):
        def forward(self, q, k, v, m):
            return flashcore.attention(q, k, v, attn_mask=m)
    sk = torch.export.Dim("sk", min=2)
    ep = torch.export.export(M(), (q, k, v, mask), dynamic_shapes=({}, {2: sk}, {2: sk}, {1: sk}))
    _, k2, v2 = make_qkv(1, 2, 2, 9, 20, 16, torch.float32, "cpu")
    m2 = torch.rand(9, 20) < 0.8
    assert torch.equal(ep.module()(q, k2, v2, m2), flashcore.attention(q, k2, v2, attn_mask=m2))
