"""flashcore.attention under torch.compile.

While torch.compile traces, flashcore.attention calls the custom op
torch.ops.flashcore.attention (flashcore/__init__.py): its fake impl gives the
output shapes, and at run time it is the same binding as an eager call. So a
compiled call must give the eager call's output bit for bit, with no graph
break (fullgraph=True), and refuse bad arguments with the eager messages.

The CPU cases run in CI with the aot_eager backend (dynamo + AOTAutograd, no
code generation); the GPU cases compile with inductor, and with CUDA graphs.
"""
import pytest
import torch

import flashcore

from conftest import make_qkv, requires_gpu

DEVICES = ["cpu", pytest.param("cuda", marks=requires_gpu)]
DTYPE = {"cpu": torch.float32, "cuda": torch.float16}

# (B, Hq, Hkv, Sq, Sk, D, causal mode, layout of q, k and v)
CASES = [
    (2, 4, 4, 17, 17, 64, None, "contiguous"),
    (1, 4, 2, 113, 203, 64, "top_left", "contiguous"),      # GQA, Sq < Sk
    (1, 2, 2, 203, 113, 128, "bottom_right", "transposed"),  # Sq > Sk: fully masked rows, strided
]


def case_id(c):
    return "B{}H{}-{}q{}k{}D{}_{}_{}".format(c[0], c[1], c[2], c[3], c[4], c[5], c[6] or "nocausal", c[7])


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    # Each test compiles its own lambdas; a shared cache would count their
    # recompiles against one code object's limit.
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def causal_kw(mode):
    return {"causal": mode is not None, "causal_alignment": mode or "top_left"}


def backend(dev):
    return "aot_eager" if dev == "cpu" else "inductor"


@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.parametrize("dev", DEVICES)
def test_compiled_matches_eager(dev, case):
    B, Hq, Hkv, Sq, Sk, D, mode, layout = case
    q, k, v = make_qkv(B, Hq, Hkv, Sq, Sk, D, DTYPE[dev], dev, layouts=(layout,) * 3)
    kw = causal_kw(mode)
    want, want_lse = flashcore.attention(q, k, v, return_lse=True, **kw)
    f = torch.compile(lambda q, k, v: flashcore.attention(q, k, v, return_lse=True, **kw),
                      fullgraph=True, backend=backend(dev))
    out, lse = f(q, k, v)
    assert out.shape == want.shape and lse.shape == (B, Hq, Sq) and lse.dtype == torch.float32
    assert torch.equal(out, want)
    assert torch.equal(lse, want_lse)


@pytest.mark.parametrize("dev", DEVICES)
def test_compiled_inside_a_graph(dev):
    """The op between other ops, with SDPA's argument names; the result is a tensor, not a tuple."""
    q, k, v = make_qkv(2, 4, 4, 64, 64, 64, DTYPE[dev], dev)

    def block(q, k, v):
        return flashcore.attention(q * 0.5, k, v, is_causal=True, scale=0.2).sum(dim=-1)

    want = block(q, k, v)
    out = torch.compile(block, fullgraph=True, backend=backend(dev))(q, k, v)
    assert isinstance(out, torch.Tensor)
    assert torch.equal(out, want)


def test_compiled_dynamic_shapes():
    """dynamic=True: one trace serves other sequence lengths (symbolic shapes in the fake impl)."""
    f = torch.compile(lambda q, k, v: flashcore.attention(q, k, v, causal=True, return_lse=True),
                      fullgraph=True, dynamic=True, backend="aot_eager")
    for Sq, Sk in ((17, 33), (40, 9), (97, 97)):
        q, k, v = make_qkv(1, 2, 2, Sq, Sk, 64, torch.float32, "cpu")
        want, want_lse = flashcore.attention(q, k, v, causal=True, return_lse=True)
        out, lse = f(q, k, v)
        assert torch.equal(out, want) and torch.equal(lse, want_lse)


def test_opcheck():
    """torch.library's own checks of the op: schema, fake impl against the real one, AOT dispatch."""
    q, k, v = make_qkv(1, 4, 2, 33, 47, 64, torch.float32, "cpu")
    op = torch.ops.flashcore.attention.default
    for args in ((q, k, v, None, 0.0, False, None, None, "top_left", False, "auto", None),
                 (q, k, v, None, 0.0, True, 0.3, None, "bottom_right", True, "auto", None)):
        torch.library.opcheck(op, args)


@pytest.mark.parametrize("bad,match", [
    ({"kernel": "nope"}, r"\bkernel\b"),
    ({"num_splits": -1}, r"\bnum_splits\b"),
    ({"dropout_p": 0.5}, r"\bdropout_p\b"),
    ({"scale": float("nan")}, r"\bscale\b"),
    ({"causal": True, "causal_alignment": "middle"}, r"\bcausal_alignment\b"),
], ids=["kernel", "num_splits", "dropout_p", "scale", "causal_alignment"])
def test_compiled_bad_argument(bad, match):
    """Bad arguments raise the eager ValueError from the compiled function."""
    q, k, v = make_qkv(1, 2, 2, 17, 17, 64, torch.float32, "cpu")
    f = torch.compile(lambda q, k, v: flashcore.attention(q, k, v, **bad), fullgraph=True, backend="aot_eager")
    with pytest.raises(ValueError, match=match):
        f(q, k, v)


def _type_error_eager_and_compiled(bad, match):
    """The eager call and the call compiled with graph breaks allowed raise the eager TypeError for the
    arguments `bad`; returns the call compiled with fullgraph=True, to be run by the caller."""
    q, k, v = make_qkv(1, 2, 2, 17, 17, 64, torch.float32, "cpu")
    with pytest.raises(TypeError, match=match):
        flashcore.attention(q, k, v, **bad)
    f = torch.compile(lambda q, k, v: flashcore.attention(q, k, v, **bad), backend="aot_eager")
    with pytest.raises(TypeError, match=match):
        f(q, k, v)
    torch._dynamo.reset()
    g = torch.compile(lambda q, k, v: flashcore.attention(q, k, v, **bad), fullgraph=True, backend="aot_eager")
    return lambda: g(q, k, v)


@pytest.mark.parametrize("bad,match", [
    ({"is_causal": 2}, r"\bis_causal\b: expected a bool, got int"),
    ({"causal": 1}, r"\bcausal\b: expected None or a bool"),
    ({"return_lse": "no"}, r"\breturn_lse\b: expected a bool"),
    ({"enable_gqa": None}, r"\benable_gqa\b: expected a bool"),
    ({"scale": "0.5"}, r"\bscale\b: expected a float, got str"),
    ({"dropout_p": True}, r"\bdropout_p\b: expected a float, got bool"),
    ({"num_splits": True}, r"\bnum_splits\b: expected None or an int, got bool"),
], ids=["is_causal", "causal", "return_lse", "enable_gqa", "scale", "dropout_p", "num_splits"])
def test_compiled_bad_argument_type(bad, match):
    """A wrong argument type raises the eager TypeError while torch.compile
    traces (the op's schema would otherwise coerce it); under fullgraph=True
    inside torch.compile's own error, as any exception raised while tracing."""
    run_fullgraph = _type_error_eager_and_compiled(bad, match)
    with pytest.raises(Exception, match=match) as e:
        run_fullgraph()
    chain, c = [], e.value
    while c is not None:
        chain.append(type(c).__name__)
        c = c.__cause__ or c.__context__
    assert any("TypeError" in n for n in chain), f"no TypeError in the raised chain {chain}"
    torch._dynamo.reset()


@pytest.mark.parametrize("name", ["scale", "dropout_p"])
def test_compiled_numpy_bool_refused(name):
    """A numpy bool as scale or dropout_p raises the eager TypeError compiled too, as a Python bool does;
    under fullgraph=True the trace stops."""
    np = pytest.importorskip("numpy")
    run_fullgraph = _type_error_eager_and_compiled({name: np.bool_(name == "scale")},
                                                   rf"\b{name}\b: expected a float, got numpy\.bool")
    with pytest.raises(Exception):  # (dynamo reads the numpy bool as data and stops the trace in its own words)
        run_fullgraph()
    torch._dynamo.reset()


def test_compiled_numpy_scale():
    """A numpy float64 scale runs compiled as in eager (the op's schema takes a
    Python float; the traced call converts it)."""
    np = pytest.importorskip("numpy")
    q, k, v = make_qkv(1, 2, 2, 17, 17, 64, torch.float32, "cpu")
    f = torch.compile(lambda q, k, v: flashcore.attention(q, k, v, scale=np.float64(0.3)), fullgraph=True,
                      backend="aot_eager")
    assert torch.equal(f(q, k, v), flashcore.attention(q, k, v, scale=0.3))


def test_compiled_numpy_ints():
    """numpy int64s from outside the compiled code (a model's config) as num_splits and window sides run
    compiled under fullgraph=True as in eager (the traced check converts them without reading their
    type), and a window side's value reaches the call; on torch 2.11 dynamo's own error stops the trace."""
    np = pytest.importorskip("numpy")
    q, k, v = make_qkv(1, 2, 2, 17, 23, 64, torch.float32, "cpu")
    splits, window = np.int64(2), (np.int64(3), np.int64(0))  # (numpy's default int; dynamo reads int32 as data)
    f = torch.compile(lambda q, k, v: flashcore.attention(q, k, v, is_causal=True, num_splits=splits,
                                                          window=window),
                      fullgraph=True, backend="aot_eager")
    want = flashcore.attention(q, k, v, is_causal=True, window=(3, 0))
    if tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 12):
        # torch 2.11's dynamo reads every numpy scalar as data: operator.index of one stops the trace
        with pytest.raises(torch._dynamo.exc.Unsupported, match="index"):
            f(q, k, v)
        return
    assert torch.equal(f(q, k, v), want)
    assert not torch.equal(want, flashcore.attention(q, k, v, is_causal=True, window=(4, 0)))


def test_compiled_attn_mask():
    """A mask (the CPU path's so far) runs compiled as in eager, forward and backward; a mask that does not
    broadcast is refused in the eager words."""
    q, k, v = make_qkv(1, 2, 2, 17, 19, 64, torch.float32, "cpu")
    mask = torch.rand(17, 19) < 0.8
    f = torch.compile(lambda q, k, v, m: flashcore.attention(q, k, v, attn_mask=m), fullgraph=True,
                      backend="aot_eager")
    assert torch.equal(f(q, k, v, mask), flashcore.attention(q, k, v, attn_mask=mask))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    grads = torch.autograd.grad(f(*leaves, mask).sum(), leaves)
    eager = [t.clone().requires_grad_() for t in (q, k, v)]
    for a, b in zip(grads, torch.autograd.grad(flashcore.attention(*eager, attn_mask=mask).sum(), eager)):
        assert torch.equal(a, b)
    with pytest.raises(Exception, match=r"attn_mask: shape \(3, 19\) does not broadcast"):
        f(q, k, v, torch.ones(3, 19, dtype=torch.bool))


@requires_gpu
@pytest.mark.parametrize("kernel", ["auto", "sm80"])
def test_compiled_cuda_graphs(kernel):
    """mode="reduce-overhead" replays the op in a CUDA graph: the output buffer
    and the split-KV scratch come from torch's allocator, so replays match eager."""
    q, k, v = make_qkv(2, 8, 8, 512, 512, 64, torch.float16, "cuda")
    f = torch.compile(lambda q, k, v: flashcore.attention(q, k, v, is_causal=True, kernel=kernel),
                      mode="reduce-overhead", fullgraph=True)
    want = flashcore.attention(q, k, v, is_causal=True, kernel=kernel)
    for _ in range(3):  # warm-up, record, replay
        out = f(q, k, v).clone()
    assert torch.equal(out, want)
    for x, new in zip((q, k, v), make_qkv(2, 8, 8, 512, 512, 64, torch.float16, "cuda")):
        x.copy_(new)  # a replay reads the new values in place
    assert torch.equal(f(q, k, v), flashcore.attention(q, k, v, is_causal=True, kernel=kernel))


class _Exported(torch.nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.kw = kw

    def forward(self, q, k, v):
        return flashcore.attention(q, k, v, **self.kw)


_QKV = ((1, 2, 9, 64),) * 3


@pytest.mark.parametrize("shapes,dtype,kw,exc,match", [
    (((1, 2, 9, 264),) * 3, torch.float32, {}, ValueError, r"^q: head dim D=264 is not supported"),
    (_QKV, torch.complex64, {}, TypeError, r"^q: dtype ComplexFloat is not supported"),
    (((1, 4, 9, 64), (1, 3, 9, 64), (1, 3, 9, 64)), torch.float32, {}, ValueError, r"^k: 3 KV heads do not divide"),
    (_QKV, torch.float32, {"num_splits": -1}, ValueError, r"^num_splits: got -1"),
    (_QKV, torch.float32, {"scale": -1e-50}, ValueError, r"^scale: got -1e-50"),
    (_QKV, torch.float32, {"kernel": "nope"}, ValueError, r"^kernel: expected one of"),
    (_QKV, torch.float32, {"kernel": "sm80"}, ValueError, r"^kernel: a GPU kernel was forced but q is on the CPU"),
    (_QKV, torch.float32, {"causal_alignment": "middle"}, ValueError, r"^causal_alignment: expected one of"),
    ("transposed", torch.float32, {}, ValueError, r"^q: the last dim must be contiguous"),
], ids=["D264", "complex", "heads", "num_splits", "scale", "kernel", "kernel_cpu", "alignment", "last_stride"])
def test_export_refuses_bad_calls(shapes, dtype, kw, exc, match):
    """torch.export refuses a bad call while it traces it, with the eager call's exception and message
    (the op's fake implementation runs the binding's checks that need no data), with static sizes and
    with a dynamic Sk (checked at the example's value); the same call with good arguments exports."""
    if shapes == "transposed":
        q = torch.randn(1, 2, 64, 9, dtype=dtype).transpose(2, 3)  # (last dim of stride 9)
        k, v = (torch.randn(1, 2, 9, 64, dtype=dtype) for _ in range(2))
    else:
        q, k, v = (torch.randn(*s, dtype=dtype) for s in shapes)
    with pytest.raises(exc, match=match):
        flashcore.attention(q, k, v, **kw)
    with pytest.raises(exc, match=match):
        torch.export.export(_Exported(**kw), (q, k, v))
    sk = torch.export.Dim("sk", min=2)
    with pytest.raises(exc, match=match):
        torch.export.export(_Exported(**kw), (q, k, v), dynamic_shapes=({}, {2: sk}, {2: sk}))
    q, k, v = (torch.randn(*s) for s in _QKV)
    ep = torch.export.export(_Exported(), (q, k, v), dynamic_shapes=({}, {2: sk}, {2: sk}))
    k, v = (torch.randn(1, 2, 30, 64) for _ in range(2))
    assert torch.equal(ep.module()(q, k, v), flashcore.attention(q, k, v))


class _ExportedPrefix(torch.nn.Module):
    """Attention over the first n keys, n read from a tensor: an unbacked (data-dependent) Sk."""
    def __init__(self, **kw):
        super().__init__()
        self.kw = kw

    def forward(self, q, k, v, n):
        n = n.item()
        torch._check(n >= 1)
        torch._check(n <= k.shape[2])
        return flashcore.attention(q, k[:, :, :n], v[:, :, :n], **self.kw)


@pytest.mark.parametrize("dtype,D,kw,exc,match", [
    (torch.float32, 64, {"scale": float("nan")}, ValueError, r"^scale: got nan"),
    (torch.complex64, 64, {}, TypeError, r"^q: dtype ComplexFloat is not supported"),
    (torch.float32, 264, {}, ValueError, r"^q: head dim D=264 is not supported"),
    (torch.float32, 64, {"kernel": "sm80"}, ValueError, r"^kernel: a GPU kernel was forced"),
], ids=["scale", "complex", "D264", "kernel"])
def test_export_refuses_bad_calls_of_unbacked_length(dtype, D, kw, exc, match):
    """With a data-dependent Sk (no value in the trace), export still refuses what the eager call
    refuses by name; the good call exports and runs at other lengths."""
    q, k, v = (torch.randn(2, 4, 9, D, dtype=dtype) for _ in range(3))
    n = torch.tensor(5)
    with pytest.raises(exc, match=match):
        _ExportedPrefix(**kw)(q, k, v, n)
    with pytest.raises(exc, match=match):
        torch.export.export(_ExportedPrefix(**kw), (q, k, v, n))
    q, k, v = (torch.randn(2, 4, 9, 64) for _ in range(3))
    ep = torch.export.export(_ExportedPrefix(), (q, k, v, n))
    for m in (1, 7):
        assert torch.equal(ep.module()(q, k, v, torch.tensor(m)), flashcore.attention(q, k[:, :, :m], v[:, :, :m]))


@pytest.mark.parametrize("shapes,dims,match", [
    (((2, 4, 9, 64), (3, 4, 11, 64), (3, 4, 11, 64)), ({0: "bq"}, {0: "bk"}, {0: "bk"}),
     r"^k: the batch dims \(all but the last three\) of shape \(3, 4, 11, 64\) do not broadcast"),
    (((2, 4, 9, 64), (2, 2, 11, 64), (2, 3, 11, 64)), (None, {1: "hk"}, {1: "hv"}),
     r"^v: 3 heads but k has 2; k and v need the same number of heads \(or one of them 1, broadcast\)"),
], ids=["batch", "heads"])
def test_export_independent_dims_refuse_as_eager(shapes, dims, match):
    """Batch (or head) dims exported as independent, whose example sizes do not broadcast: export
    refuses with the eager call's message, not the op's."""
    q, k, v = (torch.randn(*s) for s in shapes)
    with pytest.raises(ValueError, match=match):
        flashcore.attention(q, k, v)
    dynamic = tuple(d and {i: torch.export.Dim(name, min=2) for i, name in d.items()} for d in dims)
    with pytest.raises(ValueError, match=match):
        torch.export.export(_Exported(), (q, k, v), dynamic_shapes=dynamic)


def test_fake_and_meta_calls_of_the_op():
    """The op on fake CUDA tensors (no GPU needed) refuses what the eager call refuses (fp32 on CUDA),
    and what its run refuses (a v head dim of its own that no kernel takes, a call that is not one
    (B, H, S, D) call), and gives the output shapes for a good call; so does its meta kernel on meta
    tensors (which take the CPU's dtypes)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    args = (None, 0.0, False, None, None, "top_left", True, "auto", None, None)
    with FakeTensorMode():
        q = torch.empty(2, 4, 33, 128, device="cuda")
        with pytest.raises(TypeError, match=r"^q: dtype Float is not supported on CUDA"):
            torch.ops.flashcore.attention(q, q, q, *args)
        q, k = torch.empty(2, 4, 33, 128, device="cuda", dtype=torch.bfloat16), \
            torch.empty(2, 2, 40, 128, device="cuda", dtype=torch.bfloat16)
        out, lse = torch.ops.flashcore.attention(q, k, k, *args)
        assert out.shape == (2, 4, 33, 128) and lse.shape == (2, 4, 33) and out.device.type == "cuda"
        with pytest.raises(ValueError, match=r"^v: head dim 60 differs from q's 128, which the op runs only"):
            torch.ops.flashcore.attention(q, k, k[..., :60], *args)
        with pytest.raises(ValueError, match=r"^q, k, v: the op takes one \(B, H, S, D\) call"):
            torch.ops.flashcore.attention(q, k[:1], k[:1], *args)
    q = torch.empty(2, 4, 33, 128, device="meta")
    out, lse = torch.ops.flashcore.attention(q, q, q, *args)
    assert out.shape == (2, 4, 33, 128) and lse.shape == (2, 4, 33) and out.device.type == "meta"
    out, lse = torch.ops.flashcore.attention(q.double(), q.double(), q.double(), *args)  # (fp64: the CPU's)
    assert out.dtype == lse.dtype == torch.float64 and lse.shape == (2, 4, 33)
    with pytest.raises(TypeError, match=r"^q: dtype Double is not supported on CUDA, where the forced kernel"):
        torch.ops.flashcore.attention(q.double(), q.double(), q.double(), *args[:7], "sm80", *args[8:])
    qc = q.to(torch.complex64)
    with pytest.raises(TypeError, match=r"^q: dtype ComplexFloat is not supported; use torch.float16"):
        torch.ops.flashcore.attention(qc, qc, qc, *args)
    with pytest.raises(ValueError, match=r"^q, k, v: the op takes one \(B, H, S, D\) call"):
        torch.ops.flashcore.attention(q, q[:1], q[:1], *args)
