"""flashcore.attention under torch's other modes, as SDPA behaves there.

Eager calls go straight to the binding; what only torch's dispatcher can run
takes the custom op (torch.ops.flashcore.attention): torch.jit.trace, tensor
subclasses (wrapper subclasses, FakeTensor, __torch_function__ overrides) and
functorch transforms (vmap, with a batching rule), and every call under a
TorchDispatchMode (FlopCounterMode counts it as torch counts SDPA's fused
kernels; selective activation checkpointing can save it), and meta tensors (the op's meta kernel gives
SDPA's shapes, with the eager checks). torch.autocast casts the inputs as it does for
SDPA. Layouts and views the kernels cannot read, and forward-mode AD
tangents, are refused by name. CPU tests, plus one autocast test on the GPU.
"""
import threading
import time

import pytest
import torch
import torch.nn.functional as F

import flashcore

from conftest import make_qkv, requires_gpu

DEV = "cuda"


def qkv(dtype=torch.float32, device="cpu", Sq=17, Sk=23, D=64):
    return make_qkv(2, 4, 2, Sq, Sk, D, dtype, device)


def test_jit_trace_records_the_op():
    """A traced function reruns the attention on new inputs (the trace holds
    the custom op, not the output's allocation)."""
    q, k, v = qkv()
    traced = torch.jit.trace(lambda q, k, v: flashcore.attention(q, k, v, is_causal=True), (q, k, v))
    assert "flashcore::attention" in str(traced.graph)
    q2, k2, v2 = qkv()
    assert torch.equal(traced(q2, k2, v2), flashcore.attention(q2, k2, v2, is_causal=True))


def test_vmap_over_a_leading_dim():
    q, k, v = qkv()
    qs = torch.stack([q, 2 * q, -q])
    out = torch.vmap(lambda x: flashcore.attention(x, k, v))(qs)
    for i in range(3):
        assert torch.equal(out[i], flashcore.attention(qs[i], k, v))


class _CountingC:
    """flashcore._C with its attention() calls counted."""

    def __init__(self, c):
        self._c, self.calls = c, 0

    def __getattr__(self, name):
        return getattr(self._c, name)

    def attention(self, *args):
        self.calls += 1
        return self._c.attention(*args)


def test_vmap_batching_rule_is_one_call(monkeypatch):
    """vmap folds its dim into B: one kernel call for all samples (the eager
    attempt that hands back NotImplemented, then the op), not torch's
    fallback of one call per sample."""
    q, k, v = qkv()
    counting = _CountingC(flashcore._C)
    monkeypatch.setattr(flashcore, "_C", counting)
    out = torch.vmap(lambda x: flashcore.attention(x, k, v, is_causal=True))(torch.stack([q] * 5))
    assert counting.calls == 2
    assert out.shape == (5,) + q.shape


@pytest.mark.parametrize("in_dims", [(0, 0, 0), (1, None, 2), (None, 3, None), (3, 1, 0), (0, None, None),
                                     (2, None, None)])
@pytest.mark.parametrize("mode", [None, "top_left", "bottom_right"])
def test_vmap_in_dims_and_lse(in_dims, mode):
    """Any in_dims (an unbatched tensor broadcast to every sample; q alone
    vmapped folds the samples into heads, else into B), GQA, Sq != Sk and
    LSE: each sample equals its own call."""
    n = 3
    per = [qkv(Sq=19, Sk=33) for _ in range(n)]
    batched = []
    for j in range(3):
        d = in_dims[j]
        batched.append(per[0][j] if d is None else torch.stack([p[j] for p in per], dim=d))
    causal = {"causal": True, "causal_alignment": mode} if mode else {}
    out, lse = torch.vmap(lambda q, k, v: flashcore.attention(q, k, v, return_lse=True, **causal),
                          in_dims=in_dims)(*batched)
    assert out.shape == (n, 2, 4, 19, 64) and lse.shape == (n, 2, 4, 19)
    for i in range(n):
        q, k, v = ((per[i][j] if in_dims[j] is not None else per[0][j]) for j in range(3))
        o_i, l_i = flashcore.attention(q, k, v, return_lse=True, **causal)
        assert torch.equal(out[i], o_i) and torch.equal(lse[i], l_i)


def test_vmap_nested():
    q, k, v = qkv()
    qs = torch.stack([torch.stack([q, -q]), torch.stack([2 * q, 0.5 * q])])  # (2, 2, B, H, S, D)
    out = torch.vmap(torch.vmap(lambda x: flashcore.attention(x, k, v)))(qs)
    for i in range(2):
        for j in range(2):
            assert torch.equal(out[i, j], flashcore.attention(qs[i, j], k, v))


def test_vmap_under_compile():
    """torch.compile(fullgraph=True) of a vmapped call traces the batching rule."""
    q, k, v = qkv()
    qs = torch.stack([q, -q, 3 * q])
    f = torch.compile(torch.vmap(lambda x: flashcore.attention(x, k, v, is_causal=True)), fullgraph=True)
    out = f(qs)
    for i in range(3):
        assert torch.equal(out[i], flashcore.attention(qs[i], k, v, is_causal=True))


def test_vmap_refusals_name_the_sample_shapes():
    """Under vmap a refusal reads as an unbatched call's (shapes per sample,
    not the folded N * B)."""
    q, k, v = qkv()
    qs = torch.stack([q, q])
    with pytest.raises(ValueError, match=r"q: expected a tensor of at least 2 dims \(\.\.\., S, D\), got 1-D of "
                                         r"shape \(64,\)"):
        torch.vmap(lambda x: flashcore.attention(x, x, x))(qs[:, 0, 0, 0])
    with pytest.raises(ValueError, match=r"k: the batch dims \(all but the last three\) of shape \(3, 2, 23, 64\) "
                                         r"do not broadcast with q's \(2, 4, 17, 64\)"):
        torch.vmap(lambda x: flashcore.attention(x, torch.cat([k, k[:1]]), torch.cat([v, v[:1]])))(qs)
    with pytest.raises(ValueError, match=r"attn_mask: not taken under torch.vmap so far"):
        torch.vmap(lambda x, m: flashcore.attention(x, k, v, attn_mask=m))(qs, torch.ones(2, 17, 23, dtype=torch.bool))
    with pytest.raises(TypeError, match=r"k: dtype Float differs from q's Half"):
        torch.vmap(lambda x: flashcore.attention(x.half(), k, v))(qs)
    # vmapped at the last dim: a sample's last dim is strided, as an eager call refuses
    with pytest.raises(ValueError, match=r"q: the last dim must be contiguous"):
        torch.vmap(lambda x: flashcore.attention(x, k, v), in_dims=-1)(torch.stack([q, q], dim=-1))


@pytest.mark.parametrize("kv_batched", [False, True])
def test_vmap_over_no_samples(kv_batched):
    q, k, v = qkv()
    qs = q.new_empty((0,) + q.shape)
    if kv_batched:
        k, v = k.new_empty((0,) + k.shape), v.new_empty((0,) + v.shape)
        f = torch.vmap(lambda x, y, z: flashcore.attention(x, y, z, return_lse=True))
    else:
        f = torch.vmap(lambda x, y, z: flashcore.attention(x, y, z, return_lse=True), in_dims=(0, None, None))
    out, lse = f(qs, k, v)
    assert out.shape == (0,) + q.shape and lse.shape == (0,) + q.shape[:3]


@requires_gpu
def test_gpu_vmap_matches_per_sample_calls():
    """On the GPU the folded call may take another kernel route than a
    sample's own call (routes depend on B), so the check is the suite's
    tolerance rather than bit equality."""
    n = 4
    per = [qkv(torch.float16, DEV, Sq=1000, Sk=1023, D=128) for _ in range(n)]
    qs, ks, vs = (torch.stack([p[j] for p in per]) for j in range(3))
    for causal in (False, True):
        out = torch.vmap(lambda q, k, v: flashcore.attention(q, k, v, is_causal=causal))(qs, ks, vs)
        for i in range(n):
            torch.testing.assert_close(out[i], flashcore.attention(*per[i], is_causal=causal), atol=1e-3, rtol=1e-3)
        # q alone vmapped: the samples become query heads over the shared k and v
        k, v = per[0][1], per[0][2]
        out = torch.vmap(lambda q: flashcore.attention(q, k, v, is_causal=causal))(qs)
        for i in range(n):
            torch.testing.assert_close(out[i], flashcore.attention(qs[i], k, v, is_causal=causal), atol=1e-3, rtol=1e-3)


def test_wrapper_subclass_runs_through_the_op():
    two_tensor = pytest.importorskip("torch.testing._internal.two_tensor")
    q, k, v = qkv()
    q2, k2, v2 = qkv()
    out = flashcore.attention(two_tensor.TwoTensor(q, q2), two_tensor.TwoTensor(k, k2), two_tensor.TwoTensor(v, v2))
    assert type(out) is two_tensor.TwoTensor
    assert torch.equal(out.a, flashcore.attention(q, k, v))
    assert torch.equal(out.b, flashcore.attention(q2, k2, v2))


def test_fake_tensors_give_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q, k, v = torch.empty(2, 8, 33, 64), torch.empty(2, 2, 40, 64), torch.empty(2, 2, 40, 64)
        out, lse = flashcore.attention(q, k, v, return_lse=True)
    assert out.shape == (2, 8, 33, 64) and lse.shape == (2, 8, 33) and lse.dtype == torch.float32


class Logged(torch.Tensor):
    """A __torch_function__ subclass that records the functions it sees."""
    seen = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.seen.append(getattr(func, "__name__", str(func)))
        return super().__torch_function__(func, types, args, kwargs or {})


def test_dispatch_modes_see_the_call():
    """Under a TorchDispatchMode the eager call runs as the op, so the mode sees it (the same output bit
    for bit); outside one the mode-free path runs."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    q, k, v = qkv()
    want = flashcore.attention(q, k, v, is_causal=True)
    with Record() as mode:
        got = flashcore.attention(q, k, v, is_causal=True)
        # refusals in the eager words, before the op's schema or dispatcher could word them
        with pytest.raises(TypeError, match=r"^q: expected a torch.Tensor, got list"):
            flashcore.attention([1.0], k, v)
        with pytest.raises(ValueError, match=r"^q: is a negated view"):
            flashcore.attention(torch._neg_view(q), k, v)
        with pytest.raises(ValueError, match=r"^k: on meta but q is on cpu"):
            flashcore.attention(q, k.to("meta"), v)
        # with Python dispatch off the mode sees nothing, and the call runs as with no mode
        with torch.utils._mode_utils.no_dispatch():
            assert torch.equal(flashcore.attention(q, k, v, is_causal=True), want)
    assert mode.ops.count("flashcore.attention.default") == 1
    assert torch.equal(got, want)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dev", ["cpu", pytest.param("cuda", marks=requires_gpu)])
def test_flop_counter_counts_like_sdpa(dev, causal):
    """FlopCounterMode counts the forward and backward with torch's formulas for its fused SDPA kernels
    (2 B Hq Sq Sk (D + Dv) forward, 2 B Hq Sq Sk (3 D + 2 Dv) backward; causal not subtracted), GQA
    and (on the CPU, which takes it as it is) v's own head dim included, with or without grad."""
    from torch.utils.flop_counter import FlopCounterMode
    B, Hq, Hkv, Sq, Sk, D, Dv = 2, 4, 2, 17, 23, 64, 32 if dev == "cpu" else 64
    dtype = torch.float32 if dev == "cpu" else torch.float16
    q = torch.randn(B, Hq, Sq, D, device=dev, dtype=dtype, requires_grad=True)
    k = torch.randn(B, Hkv, Sk, D, device=dev, dtype=dtype, requires_grad=True)
    v = torch.randn(B, Hkv, Sk, Dv, device=dev, dtype=dtype, requires_grad=True)
    fwd, bwd = 2 * B * Hq * Sq * Sk * (D + Dv), 2 * B * Hq * Sq * Sk * (3 * D + 2 * Dv)
    with FlopCounterMode(display=False) as m:
        out = flashcore.attention(q, k, v, is_causal=causal)
        out.sum().backward()
    counts = {str(op): n for op, n in m.get_flop_counts()["Global"].items()}
    assert counts == {"flashcore.attention": fwd, "flashcore.attention_backward": bwd}
    with torch.no_grad(), FlopCounterMode(display=False) as m:
        flashcore.attention(q, k, v, is_causal=causal)
    assert m.get_total_flops() == fwd


def _meta(*shape, dtype=torch.float16, requires_grad=False):
    return torch.empty(*shape, device="meta", dtype=dtype, requires_grad=requires_grad)


@pytest.mark.parametrize("case", ["bhsd", "gqa", "causal", "3d", "broadcast", "own_dv", "wide_dv", "fp32", "bf16",
                                  "strided", "empty"])
def test_meta_tensors_give_sdpa_shapes(case):
    """Meta tensors (a model run on the meta device to count its FLOPs or plan its memory) give SDPA's
    output on meta tensors: its shape, dtype and device, for SDPA's shapes and options; the LSE with
    return_lse; and, with grad, gradients of the inputs' shapes."""
    q, k, v = _meta(2, 8, 17, 64), _meta(2, 8, 23, 64), _meta(2, 8, 23, 64)
    kw = {}
    if case == "gqa":
        k, v, kw = _meta(2, 2, 23, 64), _meta(2, 2, 23, 64), dict(enable_gqa=True)
    elif case == "causal":
        kw = dict(is_causal=True)
    elif case == "3d":
        q, k, v = q[0], k[0], v[0]
    elif case == "broadcast":
        q, k, v = _meta(3, 1, 8, 17, 64), _meta(1, 4, 8, 23, 64), _meta(23, 64)
    elif case == "own_dv":
        v = _meta(2, 8, 23, 40)
    elif case == "wide_dv":
        v = _meta(2, 8, 23, 100)
    elif case in ("fp32", "bf16"):
        dt = torch.float32 if case == "fp32" else torch.bfloat16
        q, k, v = (t.to(dt) for t in (q, k, v))
    elif case == "strided":
        q, k, v = (_meta(2, t.shape[2], 8, 64).transpose(1, 2) for t in (q, k, v))
    elif case == "empty":
        q, k, v = _meta(0, 8, 17, 64), _meta(0, 8, 0, 64), _meta(0, 8, 0, 64)
    want = F.scaled_dot_product_attention(q, k, v, **kw)
    out = flashcore.attention(q, k, v, **kw)
    assert (out.shape, out.dtype, out.device) == (want.shape, want.dtype, want.device)
    out, lse = flashcore.attention(q, k, v, return_lse=True, **kw)
    assert out.shape == want.shape and lse.shape == want.shape[:-1] and lse.dtype == torch.float32
    assert lse.device.type == "meta"
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    flashcore.attention(*leaves, **kw).sum().backward()
    for t, leaf in zip((q, k, v), leaves):
        assert (leaf.grad.shape, leaf.grad.dtype, leaf.grad.device) == (t.shape, t.dtype, t.device)


@pytest.mark.parametrize("make,err,match", [
    (lambda: (_meta(2, 4, 9, 64, dtype=torch.complex64),) * 3, TypeError,
     r"^q: dtype ComplexFloat is not supported; use torch.float16, torch.bfloat16 or \(CPU only\) torch.float32 "
     r"or torch.float64"),
    (lambda: (_meta(2, 4, 9, 64), _meta(2, 4, 9, 64, dtype=torch.bfloat16), _meta(2, 4, 9, 64)), TypeError,
     r"^k: dtype BFloat16 differs from q's Half"),
    (lambda: (_meta(2, 4, 9, 264),) * 3, ValueError, r"^q: head dim D=264 is not supported"),
    (lambda: (_meta(2, 4, 9, 64), _meta(2, 3, 9, 64), _meta(2, 3, 9, 64)), ValueError,
     r"^k: 3 KV heads do not divide q's 4 heads"),
    (lambda: (_meta(2, 4, 9, 64), _meta(2, 4, 9, 64), _meta(2, 4, 8, 64)), ValueError,
     r"^v: sequence length 8 differs from k's 9"),
    (lambda: (_meta(2, 4, 9, 64), _meta(2, 4, 64, 9).transpose(2, 3), _meta(2, 4, 9, 64)), ValueError,
     r"^k: the last dim must be contiguous \(stride 1\), got stride 9"),
    (lambda: (_meta(2, 4, 9, 64), torch.empty(2, 4, 9, 64, dtype=torch.float16), _meta(2, 4, 9, 64)), ValueError,
     r"^k: on cpu but q is on meta; move q, k and v to the same device"),
    (lambda: (_meta(2, 4, 9, 64), _meta(2, 4, 9, 64), _meta(2, 4, 9, 300)), ValueError,
     r"^v: head dim 300 exceeds 256"),
    (lambda: (_meta(2, 4, 9, 64), _meta(2, 4, 9, 64), torch.empty(2, 4, 9, 32)), ValueError,
     r"^v: on cpu but q is on meta"),
    (lambda: (torch._neg_view(_meta(2, 4, 9, 64)), _meta(2, 4, 9, 64), _meta(2, 4, 9, 64)), ValueError,
     r"^q: is a negated view; call q\.resolve_neg\(\)"),
])
def test_meta_refusals_in_eager_words(make, err, match):
    """What no device runs is refused on meta tensors in the eager call's words (dtypes as the CPU
    takes them: a meta tensor may stand for a CPU one), as are bad arguments."""
    with pytest.raises(err, match=match):
        flashcore.attention(*make())
    q = _meta(2, 4, 9, 64)
    for kw, match in ((dict(scale=float("nan")), r"^scale: got nan"), (dict(num_splits=-3), r"^num_splits: got -3"),
                      (dict(kernel="nope"), r"^kernel: expected one of"),
                      (dict(dropout_p=0.5), r"^dropout_p: "), (dict(window=(3,)), r"^window: expected None")):
        with pytest.raises((ValueError, TypeError), match=match):
            flashcore.attention(q, q, q, **kw)
    # a forced GPU kernel: the meta tensors stand for CUDA ones, in CUDA's dtypes
    for kernel in ("sm80", "sm90"):
        with pytest.raises(TypeError, match=r"^q: dtype Float is not supported on CUDA, where the forced kernel"):
            flashcore.attention(*(_meta(2, 4, 9, 64, dtype=torch.float32),) * 3, kernel=kernel)
        assert flashcore.attention(q, q, q, kernel=kernel).shape == q.shape
    assert flashcore.attention(*(_meta(2, 4, 9, 64, dtype=torch.float32),) * 3, kernel="cpu").shape == q.shape


@pytest.mark.parametrize("dv", [64, 32, 40])
def test_flop_counter_on_the_meta_device(dv):
    """A model built and run under torch.device("meta") is counted as the same model on the CPU, v's own
    head dim included (32: taken as it is, 40: padded to D)."""
    from torch.utils.flop_counter import FlopCounterMode
    counts = []
    for dev in ("cpu", "meta"):
        with torch.device(dev):
            q, k, v = (torch.randn(2, 4, n, d, requires_grad=True) for n, d in ((17, 64), (23, 64), (23, dv)))
        with FlopCounterMode(display=False) as m:
            flashcore.attention(q, k, v, is_causal=True).sum().backward()
        counts.append({str(op): n for op, n in m.get_flop_counts()["Global"].items()})
    run = 64 if dv % 8 else dv  # (v's head dim the call runs)
    assert counts[0] == counts[1] == {"flashcore.attention": 2 * 2 * 4 * 17 * 23 * (64 + run),
                                      "flashcore.attention_backward": 2 * 2 * 4 * 17 * 23 * (3 * 64 + 2 * run)}


def test_selective_checkpoint_saves_the_call():
    """Selective activation checkpointing with a policy that saves the attention: the backward does not
    run the forward again, and the gradients are those of the plain call."""
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts
    from torch.utils.flop_counter import FlopCounterMode
    q, k, v = (t.requires_grad_() for t in qkv())

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op == torch.ops.flashcore.attention.default else \
            CheckpointPolicy.PREFER_RECOMPUTE

    def f(q, k, v):
        return flashcore.attention(q * 2, k, v, is_causal=True)

    want = torch.autograd.grad(f(q, k, v).sum(), (q, k, v))
    with FlopCounterMode(display=False) as m:
        out = checkpoint(f, q, k, v, use_reentrant=False,
                         context_fn=lambda: create_selective_checkpoint_contexts(policy))
        got = torch.autograd.grad(out.sum(), (q, k, v))
    counts = {str(op): n for op, n in m.get_flop_counts()["Global"].items()}
    assert counts["flashcore.attention"] == 2 * 2 * 4 * 17 * 23 * 128  # once: saved, not recomputed
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_torch_function_subclass_sees_the_call():
    q, k, v = qkv()
    Logged.seen.clear()
    out = flashcore.attention(q.as_subclass(Logged), k, v)
    assert type(out) is Logged and any("attention" in name for name in Logged.seen)
    assert torch.equal(out.as_subclass(torch.Tensor), flashcore.attention(q, k, v))


def test_forward_ad_tangent_refused():
    """A dual tensor would lose its tangent (there is no forward-mode derivative): refused."""
    import torch.autograd.forward_ad as fwAD
    q, k, v = qkv()
    with fwAD.dual_level():
        for name in "qkv":
            args = {"q": q, "k": k, "v": v}
            args[name] = fwAD.make_dual(args[name], torch.randn_like(args[name]))
            with pytest.raises(ValueError, match=rf"^{name}: carries a forward-mode AD tangent.*unpack_dual\({name}\)"):
                flashcore.attention(args["q"], args["k"], args["v"])
        # the primal alone runs
        out = flashcore.attention(fwAD.unpack_dual(fwAD.make_dual(q, torch.randn_like(q))).primal, k, v)
    assert torch.equal(out, flashcore.attention(q, k, v))


@pytest.mark.parametrize("make,match", [
    (lambda t: t.to_sparse(), r"^q: layout Sparse is not supported; call q\.to_dense\(\)"),
    (lambda t: torch._neg_view(t), r"^q: is a negated view; call q\.resolve_neg\(\)"),
], ids=["sparse", "neg_view"])
def test_unreadable_layouts_refused(make, match):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=match):
        flashcore.attention(make(q), k, v)


@pytest.mark.parametrize("layout", [torch.strided, torch.jagged], ids=["strided", "jagged"])
def test_nested_tensors_refused(layout):
    nt = torch.nested.nested_tensor([torch.randn(2, 8, 64), torch.randn(2, 5, 64)], layout=layout)
    with pytest.raises(ValueError, match=r"^q: nested tensors are not supported.*to_padded_tensor"):
        flashcore.attention(nt, nt, nt)


def test_autocast_cpu_casts_like_sdpa():
    """Under CPU autocast (bf16) fp32 inputs run in bf16, as SDPA's do; an fp32
    k beside a bf16 q is cast too. Eager and compiled."""
    q, k, v = qkv()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        out = flashcore.attention(q, k, v)
        mixed = flashcore.attention(q.bfloat16(), k, v)
        compiled = torch.compile(lambda q, k, v: flashcore.attention(q, k, v), fullgraph=True,
                                 backend="aot_eager")(q, k, v)
    assert ref.dtype == out.dtype == mixed.dtype == compiled.dtype == torch.bfloat16
    plain = flashcore.attention(q.bfloat16(), k.bfloat16(), v.bfloat16())
    assert torch.equal(out, plain) and torch.equal(mixed, plain) and torch.equal(compiled, plain)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
    # fp64 inputs are not cast by autocast (SDPA's rule): they run in fp64, as SDPA's do
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref64 = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), enable_gqa=True)
        out64 = flashcore.attention(q.double(), k.double(), v.double())
    assert ref64.dtype == out64.dtype == torch.float64
    torch.testing.assert_close(out64, ref64, atol=1e-12, rtol=1e-12)


@requires_gpu
def test_autocast_cuda_casts_like_sdpa():
    """Standard mixed precision: fp32 activations under autocast('cuda') run
    in fp16 (or the dtype autocast names), as SDPA's do."""
    q, k, v = qkv(device=DEV, Sq=300, Sk=301, D=128)
    for dtype in (torch.float16, torch.bfloat16):
        with torch.autocast("cuda", dtype=dtype):
            out = flashcore.attention(q, k, v, is_causal=True)
            ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        assert out.dtype == ref.dtype == dtype
        assert torch.equal(out, flashcore.attention(q.to(dtype), k.to(dtype), v.to(dtype), is_causal=True))
        torch.testing.assert_close(out.float(), ref.float(), atol=2e-2 if dtype == torch.bfloat16 else 2e-3,
                                   rtol=1e-2)


def test_cpu_call_releases_the_gil():
    """The CPU path computes with the GIL released: a Python thread runs
    alongside a call of several tenths of a second."""
    q, k, v = make_qkv(1, 8, 8, 1024, 1024, 128, torch.float32, "cpu")
    ticks, done = [0], threading.Event()

    def count():
        while not done.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    t = threading.Thread(target=count)
    t.start()
    t0 = time.perf_counter()
    flashcore.attention(q, k, v)
    took = time.perf_counter() - t0
    done.set()
    t.join()
    # with the GIL held through the C code the thread would tick once or twice at its ends;
    # released, about once per millisecond
    assert took > 0.05 and ticks[0] >= 10, (ticks[0], took)
