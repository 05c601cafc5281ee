"""Sliding-window (local) attention: flashcore.attention(..., window=(left, right)).

Query i sees key j iff i + d - left <= j <= i + d + right (d: the causal
alignment's diagonal, 0 or Sk - Sq; None for no bound on a side; causal=True
takes right 0). Reference: fp64 attention math with that band as an explicit
mask (rows that see no key: out 0, lse -inf, dq 0); pass rule as the suite's
(conftest): max|out - ref| <= 2 * max|sdpa - ref| + eps, where sdpa is torch
SDPA in the same low precision with the band as its boolean attn_mask over the
rows that see a key (SDPA gives NaN on the others), and for fp16 also
allclose(out, sdpa, atol=1e-3). Gradients by test_backward's rule. Outputs are
poisoned before every call (conftest). The CPU cases run in CI.
"""
import ctypes
import random

import pytest
import torch
import torch.nn.functional as F

import flashcore
from flashcore import _C

import test_fuzz as fuzz
from conftest import (EPS, GPU_KERNELS, LSE_ATOL, band, default_scale, dtype_id, expand_kv, make_qkv, ref_attention,
                      ref_dtype, requires_gpu)
from test_backward import HALF_ULP, SM80_BWD_SMEM_D256, deterministic, maxerr

# (B, Hq, Hkv, Sq, Sk, causal, alignment, left, right): the seed shape with a 128-key window, odd lengths,
# Sq != Sk both ways (top-left with Sq > Sk leaves rows past the window's reach with no key), a two-sided
# window, each side alone, the diagonal alone, windows wider than the keys (causal and not), decode rows
# (the split-KV kernel), and more query tiles than an H100 has SMs (the Hopper kernel's persistent CTAs run
# several tiles, each from its own first K/V tile, through one ring).
CASES = [
    (2, 8, 8, 512, 512, True, "top_left", 127, 0),
    (1, 4, 2, 1000, 1000, True, "top_left", 255, 0),
    (2, 2, 1, 113, 203, True, "bottom_right", 50, 0),
    (1, 2, 2, 203, 113, True, "top_left", 17, 0),
    (1, 4, 4, 1025, 1023, False, "bottom_right", 100, 37),
    (1, 2, 2, 97, 1000, False, "top_left", None, 20),
    (1, 2, 1, 1000, 97, False, "bottom_right", 30, None),
    (1, 2, 2, 300, 300, True, "top_left", 0, 0),
    (1, 2, 2, 300, 257, False, "top_left", 5000, 5000),
    (1, 8, 1, 1, 4096, True, "bottom_right", 1023, 0),
    (2, 8, 2, 4, 3000, True, "bottom_right", 511, 0),
    (1, 4, 4, 17, 1, False, "top_left", 3, 3),
    (4, 16, 4, 2048, 2048, True, "top_left", 511, 0),
    (2, 8, 8, 700, 3000, True, "bottom_right", 1000, 0),
    (2, 8, 2, 1500, 1600, False, "top_left", 300, 200),
    # grids that route D = 64 to three consumers on an H100 (window3, test_sm90_route): 192-row tiles whose
    # padding rows (PAD_FIRST: 191 and 112 here) fill whole warpgroups of the first block
    (4, 16, 4, 1537, 1601, False, "bottom_right", 700, 100),
    (4, 16, 4, 2000, 1900, False, "top_left", None, 64),
    # a narrow window there: each consumer starts at its own rows' first K/V tile (the later ones
    # release the tile's first ones unread)
    (4, 16, 4, 2048, 2100, True, "bottom_right", 127, 0),
    # a causal window that masks nothing the diagonal does not (its left reaches key 0 from every row): the
    # Hopper kernels run it as the causal call (FC_WINDOW_MASKS_MORE), forward and backward
    (2, 4, 2, 1000, 1100, True, "bottom_right", 1100, 0),
]
SMALL = [c for c in CASES if c[3] * c[4] <= 300 * 300]  # the CPU path's share


def case_id(c):
    B, Hq, Hkv, Sq, Sk, causal, al, left, right = c
    return f"B{B}H{Hq}-{Hkv}q{Sq}k{Sk}-{'causal' if causal else 'full'}-{al}-w{left}_{right}"


def call(q, k, v, c, kernel="auto", **kw):
    causal, al, left, right = c[5:]
    return flashcore.attention(q, k, v, causal=causal, causal_alignment=al, window=(left, right), kernel=kernel,
                               **kw)


def sdpa_masked(fn):
    """fn() (SDPA with the band as its mask, the low-precision error the checks allow twice of), taken again
    on SDPA's math backend if a fused backend returned NaN/Inf: seen from its backward on an H200 (torch 2.11,
    D = 256, 4 query rows each seeing one key, dk NaN), which would make the bound NaN."""
    res = fn()
    if all(bool(torch.isfinite(t).all()) for t in (res if isinstance(res, tuple) else (res,))):
        return res
    from torch.nn.attention import SDPBackend, sdpa_kernel
    # (in fp16/bf16 as the fused backends compute, not upcast to fp32, which would tighten the bound)
    allow = getattr(torch.backends.cuda, "allow_fp16_bf16_reduction_math_sdp", None)
    was = torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed() if allow else None
    try:
        if allow:
            allow(True)
        with sdpa_kernel(SDPBackend.MATH):
            return fn()
    finally:
        if allow:
            allow(was)


def check_fwd(out, lse, q, k, v, vis, scale):
    dt = q.dtype
    assert out.shape == q.shape and out.dtype == dt
    assert torch.isfinite(out).all(), "out has NaN/Inf (a row left unwritten?)"
    r_out, r_lse = ref_attention(q, k, v, scale, vis=vis)
    live = vis.any(-1)
    assert (out[:, :, ~live] == 0).all(), "rows that see no key must give out == 0"
    assert torch.equal(torch.isneginf(lse), torch.isneginf(r_lse)), "-inf lse rows differ from the reference's"
    if live.any():
        assert maxerr(lse[..., live], r_lse[..., live]) <= LSE_ATOL[dt]
    err = maxerr(out, r_out)
    if dt == torch.float32:
        assert err <= EPS[dt], f"max|out-ref| = {err:.3e}"
        return
    ke, ve = expand_kv(q, k, v)
    sd = sdpa_masked(lambda: F.scaled_dot_product_attention(q[:, :, live], ke, ve, attn_mask=vis[live], scale=scale))
    sd_err = maxerr(sd, r_out[:, :, live])
    assert err <= 2 * sd_err + EPS[dt], f"max|out-ref| = {err:.3e} > 2*{sd_err:.3e} + eps"
    if dt == torch.float16:
        assert torch.allclose(out[:, :, live], sd, atol=1e-3, rtol=1e-3), f"vs SDPA {maxerr(out[:, :, live], sd):.3e}"


def run_case(c, D, dtype, dev, kernel, **kw):
    B, Hq, Hkv, Sq, Sk = c[:5]
    q, k, v = make_qkv(B, Hq, Hkv, Sq, Sk, D, dtype, dev)
    out, lse = call(q, k, v, c, kernel=kernel, return_lse=True, **kw)
    check_fwd(out, lse, q, k, v, band(Sq, Sk, *c[5:], dev), default_scale(q))
    return q, k, v, out, lse


@pytest.mark.parametrize("c", SMALL, ids=case_id)
@pytest.mark.parametrize("D", [64, 136])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=dtype_id)
def test_forward_cpu(c, D, dtype):
    run_case(c, D, dtype, "cpu", "auto")


@requires_gpu
@pytest.mark.parametrize("c", CASES, ids=case_id)
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("kernel", ["auto"] + GPU_KERNELS)
def test_forward_gpu(kernel, dtype, D, c):
    run_case(c, D, dtype, "cuda", kernel)


@requires_gpu
@pytest.mark.parametrize("num_splits", [1, 3, 16])
@pytest.mark.parametrize("D", [64, 128, 256])
def test_forward_split_kv(D, num_splits):
    """The split-KV kernel with a window, forced splits: each split starts at the window's first tile."""
    for c in [(1, 8, 1, 1, 4096, True, "bottom_right", 1023, 0), (2, 8, 2, 4, 3000, False, "bottom_right", 300, 5),
              (1, 4, 4, 3, 2000, True, "top_left", 1, 0)]:
        run_case(c, D, torch.float16, "cuda", "auto", num_splits=num_splits)


@requires_gpu
def test_split_plan_counts_window_keys():
    """The split heuristic counts only the window's key tiles: a 1024-key window over 128k keys splits no
    more than the same window over 1024 keys would need the SMs for."""
    q = torch.randn(1, 8, 1, 128, device="cuda", dtype=torch.float16)
    k = torch.randn(1, 1, 131072, 128, device="cuda", dtype=torch.float16)
    full = _C.num_splits(q, k, k, 2, 0, 0)
    win = _C.num_splits(q, k, k, 2, 0, 0, (1023, 0))
    assert 1 <= win <= 16 < full, (win, full)


@pytest.mark.parametrize("w", [[2 ** 40, 0], [0, -2 ** 33], [1, 2, 3], [5]])
def test_raw_entry_points_refuse_a_bad_window_list(w):
    """The backward op and the raw forward take the C API's window as a list: one that is not two ints
    of C's range is a ValueError that names the window, not a pybind11 cast error."""
    q, k, v = make_qkv(1, 2, 2, 9, 11, 16, torch.float16, "cpu")
    out, lse = flashcore.attention(q, k, v, causal=True, return_lse=True)
    with pytest.raises(ValueError, match=r"window: expected None or \[window_left, window_right\]"):
        torch.ops.flashcore.attention_backward(torch.ones_like(out), q, k, v, out, lse, None, 0.25, 1, "auto",
                                               False, w)
    with pytest.raises(ValueError, match=r"window: expected None or \[window_left, window_right\]"):
        _C.fwd(q, k, v, 0.25, 1, 0, False, 0, w)


@pytest.mark.parametrize("dev,kernel", [("cpu", "auto")] +
                         [pytest.param("cuda", k, marks=requires_gpu) for k in ["auto"] + GPU_KERNELS])
def test_no_bound_is_no_window(dev, kernel):
    """window=None, (None, None), (-1, -1) and, causal, (None, 0): the plain call, bit for bit; a window wider
    than the keys on the portable kernel: the plain call's values."""
    q, k, v = make_qkv(1, 4, 2, 300, 333, 64, torch.float16, dev)
    for causal in (False, True):
        base = flashcore.attention(q, k, v, causal=causal, kernel=kernel)
        for w in (None, (None, None), (-1, -1)) + (((None, 0), (-1, 0)) if causal else ()):
            assert torch.equal(flashcore.attention(q, k, v, causal=causal, kernel=kernel, window=w), base), w
    base = flashcore.attention(q, k, v, causal=True, kernel=kernel)
    assert torch.equal(flashcore.attention(q, k, v, causal=True, kernel=kernel, window=(400, 0)), base)


@pytest.mark.parametrize("dev", ["cpu", pytest.param("cuda", marks=requires_gpu)])
def test_refusals(dev):
    q, k, v = make_qkv(1, 2, 2, 16, 16, 64, torch.float16, dev)
    with pytest.raises(ValueError, match=r"window: right = 3 with causal=True"):
        flashcore.attention(q, k, v, causal=True, window=(4, 3))
    with pytest.raises(ValueError, match=r"window: left = -2"):
        flashcore.attention(q, k, v, window=(-2, 0))
    with pytest.raises(TypeError, match=r"window: expected None or a pair"):
        flashcore.attention(q, k, v, window=5)
    with pytest.raises(TypeError, match=r"window: expected None or a pair"):
        flashcore.attention(q, k, v, window=(1, 2, 3))
    with pytest.raises(TypeError, match=r"window: right is float"):
        flashcore.attention(q, k, v, window=(1, 2.0))
    with pytest.raises(TypeError, match=r"window: left is bool"):
        flashcore.attention(q, k, v, window=(True, 2))
    with pytest.raises(ValueError, match=r"window: left = 18446744073709551616"):
        flashcore.attention(q, k, v, window=(2 ** 64, 0))
    # numpy ints count as ints, in eager calls and through the op (inputs that require grad)
    np = pytest.importorskip("numpy")
    base = flashcore.attention(q, k, v, window=(5, 2))
    assert torch.equal(flashcore.attention(q, k, v, window=(np.int64(5), np.int32(2))), base)
    qg = q.detach().requires_grad_(True)
    assert torch.equal(flashcore.attention(qg, k, v, window=(np.int64(5), np.int32(2))).detach(), base)
    for bad, err in (((2 ** 64, 0), ValueError), ((1.0, 0), TypeError), ((-2, 0), ValueError)):
        with pytest.raises(err, match=r"window: left"):
            flashcore.attention(qg, k, v, window=bad)
    # an __index__ that raises is refused before anything runs, in both paths, its error chained
    from test_decode import BadIndex
    for t in (q, qg):
        with pytest.raises(TypeError, match=r"^window: right: BadIndex does not convert to an int") as e:
            flashcore.attention(t, k, v, is_causal=True, window=(4, BadIndex()))
        assert isinstance(e.value.__cause__, ZeroDivisionError)
        with pytest.raises(TypeError, match=r"^window: left is Tensor; pass an int >= 0"):
            flashcore.attention(t, k, v, is_causal=True, window=(torch.tensor(4), 0))


def test_c_api_window_checks():
    """fc_attn_fwd_check refuses a window without a diagonal, sides set without a window, an unknown window
    value and sides below -1, naming the fields."""
    from test_decode import _cpu_qkv, _lib, _params
    lib = _lib()
    q, k, v = _cpu_qkv()
    out = torch.empty_like(q)
    why = ctypes.create_string_buffer(1024)
    for window, left, right, causal, msg in ((1, 4, 0, 0, b"causal: a window needs a diagonal"),
                                              (0, 4, 0, 1, b"window_left, window_right: 4, 0 with window = 0"),
                                              (2, 4, 0, 1, b"window: 2; use 0"),
                                              (1, -2, 0, 1, b"window_left, window_right: -2, 0")):
        p = _params(q, k, v, out, flashcore.KERNELS["cpu"], 0)
        p.window, p.window_left, p.window_right, p.causal = window, left, right, causal
        st = lib.fc_attn_fwd_check(ctypes.byref(p), why, len(why))
        assert lib.fc_status_string(st) == b"invalid argument" and msg in why.value, why.value
    p = _params(q, k, v, out, flashcore.KERNELS["cpu"], 0)
    p.window, p.window_left, p.window_right, p.causal = 1, 3, -1, 2
    assert lib.fc_attn_fwd_check(ctypes.byref(p), None, 0) == 0


@requires_gpu
@pytest.mark.skipif("sm90" not in GPU_KERNELS, reason="the sm90 kernel does not run here")
def test_sm90_runs_windows():
    """A window that hides no key the causal mask does not (here 127 keys back at 128 rows) runs the causal
    call's kernel, bit for bit."""
    q, k, v = make_qkv(1, 2, 2, 128, 128, 64, torch.float16, "cuda")
    base = flashcore.attention(q, k, v, causal=True, kernel="sm90")
    for kernel in ("sm90", "auto"):
        assert torch.equal(flashcore.attention(q, k, v, causal=True, window=(127, 0), kernel=kernel), base)


def grads(q, k, v, c, go, kernel, **kw):
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    out = call(q, k, v, c, kernel=kernel, **kw)
    (out.float() * go.float()).sum().backward()
    return q.grad, k.grad, v.grad


def check_bwd(got, q, k, v, vis, go, scale):
    dt = q.dtype
    for g in got:
        assert torch.isfinite(g).all(), "a gradient has NaN/Inf (an element left unwritten?)"
    live = vis.any(-1)
    assert (got[0][:, :, ~live] == 0).all(), "dq of rows that see no key must be 0"
    rdt = ref_dtype(q.device)
    qf, kf, vf = (t.detach().to(rdt).requires_grad_(True) for t in (q, k, v))
    ke, ve = expand_kv(qf, kf, vf)
    s = (torch.matmul(qf[:, :, live], ke.transpose(-1, -2)) * scale).masked_fill(~vis[live], float("-inf"))
    (torch.matmul(torch.softmax(s, -1), ve) * go[:, :, live].to(rdt)).sum().backward()
    refs = (qf.grad[:, :, live], kf.grad, vf.grad)
    ours = (got[0][:, :, live], got[1], got[2])
    if dt == torch.float32:
        theirs = (None,) * 3
    else:
        def sdpa_grads():
            qs, ks, vs = (t.detach().requires_grad_(True) for t in (q, k, v))
            kse, vse = expand_kv(qs, ks, vs)
            o = F.scaled_dot_product_attention(qs[:, :, live], kse, vse, attn_mask=vis[live], scale=scale)
            (o.float() * go[:, :, live].float()).sum().backward()
            return qs.grad[:, :, live], ks.grad, vs.grad
        theirs = sdpa_masked(sdpa_grads)
    for name, g, r, sd in zip(("dq", "dk", "dv"), ours, refs, theirs):
        eps = HALF_ULP[dt] * max(1.0, r.abs().max().item() if r.numel() else 1.0)
        err = maxerr(g, r)
        tol = eps if sd is None else 2 * maxerr(sd, r) + eps
        assert err <= tol, f"{name}: max|fc-ref| = {err:.3e} > {tol:.3e}"


BWD_CASES = [CASES[i] for i in (0, 1, 2, 3, 4, 5, 6, 7, 10)]


@pytest.mark.parametrize("c", [c for c in BWD_CASES if c in SMALL], ids=case_id)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_backward_cpu(c, dtype):
    B, Hq, Hkv, Sq, Sk = c[:5]
    q, k, v = make_qkv(B, Hq, Hkv, Sq, Sk, 64, dtype, "cpu")
    go = torch.randn(B, Hq, Sq, 64).to(dtype)
    check_bwd(grads(q, k, v, c, go, "auto"), q, k, v, band(Sq, Sk, *c[5:], "cpu"), go, default_scale(q))


@requires_gpu
@pytest.mark.parametrize("c", BWD_CASES, ids=case_id)
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("kernel", ["auto", "sm80"])
def test_backward_gpu(kernel, dtype, D, c):
    B, Hq, Hkv, Sq, Sk = c[:5]
    q, k, v = make_qkv(B, Hq, Hkv, Sq, Sk, D, dtype, "cuda")
    go = torch.randn(B, Hq, Sq, D, device="cuda").to(dtype)
    check_bwd(grads(q, k, v, c, go, kernel), q, k, v, band(Sq, Sk, *c[5:], "cuda"), go, default_scale(q))


# Deterministic backward cases: a causal window; bottom-right with Sq < Sk, whose first key blocks no row
# sees (their turns are never taken); no right edge (has_hi false), at D = 64 (more key blocks per head).
DET_CASES = [(2, 8, 2, 1500, 1500, True, "top_left", 300, 0, 128),
             (2, 8, 2, 700, 2100, True, "bottom_right", 300, 0, 128),
             (1, 4, 4, 1000, 1100, False, "top_left", 200, None, 64)]


@requires_gpu
@pytest.mark.parametrize("case", DET_CASES, ids=lambda c: case_id(c[:9]) + f"-D{c[9]}")
@pytest.mark.parametrize("kernel", ["auto", "sm80"])
def test_reruns_bit_identical(kernel, case):
    """Five reruns of a windowed forward and a deterministic backward give the same bits."""
    c, D = case[:9], case[9]
    q, k, v = make_qkv(*c[:5], D, torch.float16, "cuda")
    go = torch.randn_like(q)
    with deterministic(True):
        first = None
        for _ in range(5):
            r = (call(q, k, v, c, kernel=kernel),) + grads(q, k, v, c, go, kernel)
            if first is None:
                first = r
            assert all(torch.equal(a, b) for a, b in zip(r, first))
    check_bwd(first[1:], q, k, v, band(*c[3:5], *c[5:], "cuda"), go, default_scale(q))


@pytest.mark.parametrize("dev", ["cpu", pytest.param("cuda", marks=requires_gpu)])
def test_compile(dev):
    """torch.compile(fullgraph=True) of a windowed call (forward and backward) matches eager bit for bit."""
    c = (1, 4, 2, 130, 190, False, "bottom_right", 40, 7)
    q, k, v = make_qkv(*c[:5], 64, torch.float16, dev)

    def f(q, k, v):
        return call(q, k, v, c)

    eager = grads(q, k, v, c, torch.ones_like(q), "auto")
    qc, kc, vc = (t.detach().requires_grad_(True) for t in (q, k, v))
    out = torch.compile(f, fullgraph=True)(qc, kc, vc)
    assert torch.equal(out, f(q, k, v))
    out.float().sum().backward()
    assert all(torch.equal(a, b) for a, b in zip((qc.grad, kc.grad, vc.grad), eager))


# ---- random windows ----
#
# test_fuzz's call draws (shape, head dim, GQA, dtype, strided layouts, scale, kernel, split count) with a
# window drawn on top: each side None, 0, a few keys, or up to twice the longer length (causal calls:
# right 0 or None; non-causal ones draw their diagonal). Forward by the band reference, on the GPU rerun
# bit for bit; a third of the cases also take the backward (torch's deterministic mode in half of those).
WIN_GPU_CASES = max(1, fuzz.GPU_CASES // 3)
WIN_CPU_CASES = max(1, fuzz.CPU_CASES // 2)


def draw_window_case(i, device):
    gpu = device == "cuda"
    rng = random.Random(fuzz.SEED * 1_000_037 + i * 7901 + (0 if gpu else 1) + 900_001)
    c = fuzz.draw_call(rng, gpu, 3000 if gpu else 300, fuzz.BWD_GPU_SCORES if gpu else fuzz.BWD_CPU_SCORES, 0.15)
    causal = c["mode"] is not None
    alignment = c["mode"] or rng.choice(["top_left", "bottom_right"])
    longest = max(c["Sq"], c["Sk"])
    side = lambda: rng.choice([None, 0, rng.randint(0, 64), rng.randint(0, 2 * longest)])  # noqa: E731
    left, right = side(), (rng.choice([None, 0]) if causal else side())
    return dict(c, win=(c["B"], c["Hq"], c["Hkv"], c["Sq"], c["Sk"], causal, alignment, left, right),
                bwd=rng.random() < 1 / 3, det=rng.random() < 0.5, torch_seed=rng.getrandbits(31))


def run_window_case(c, device):
    torch.manual_seed(c["torch_seed"])
    w = c["win"]
    q, k, v = make_qkv(*w[:5], c["D"], c["dtype"], device, layouts=c["layouts"])
    scale = default_scale(q) if c["scale"] is None else c["scale"]
    vis = band(*w[3:5], *w[5:], device)
    what = (f"FC_FUZZ_SEED={fuzz.SEED} window case: {case_id(w)} D={c['D']} {c['dtype']} layouts={c['layouts']} "
            f"scale={c['scale']} kernel={c['kernel']} num_splits={c['num_splits']} bwd={c['bwd']} det={c['det']}")
    kw = dict(scale=c["scale"], num_splits=c["num_splits"])
    try:
        out, lse = call(q, k, v, w, kernel=c["kernel"], return_lse=True, **kw)
        check_fwd(out, lse, q, k, v, vis, scale)
        if device == "cuda":
            out2, lse2 = call(q, k, v, w, kernel=c["kernel"], return_lse=True, **kw)
            assert torch.equal(out, out2) and torch.equal(lse, lse2), "a rerun gave different bits"
        if c["bwd"] and (device == "cpu" or c["D"] <= 128 or
                         torch.cuda.get_device_properties(q.device).shared_memory_per_block_optin >=
                         SM80_BWD_SMEM_D256):
            go = torch.randn_like(q)
            with deterministic(c["det"]):
                got = grads(q, k, v, w, go, c["kernel"], **kw)
                if c["det"] and device == "cuda":
                    assert torch.equal(got[0], grads(q, k, v, w, go, c["kernel"], **kw)[0]), "dq moved on a rerun"
            check_bwd(got, q, k, v, vis, go, scale)
    except AssertionError as e:
        raise AssertionError(f"{what}: {e}") from None


def test_window_draws_cover_the_space():
    cases = [draw_window_case(i, "cuda") for i in range(max(WIN_GPU_CASES, 40))]
    seen = lambda f: {f(c) for c in cases}  # noqa: E731
    assert seen(lambda c: c["win"][5]) == {True, False}
    assert seen(lambda c: c["win"][6]) == {"top_left", "bottom_right"}
    assert {None, 0} <= seen(lambda c: c["win"][7]) and True in seen(lambda c: (c["win"][7] or 0) > 64)
    assert True in seen(lambda c: (c["win"][8] or 0) > 0) and seen(lambda c: c["bwd"]) == {True, False}


@pytest.mark.parametrize("i", range(WIN_CPU_CASES))
def test_fuzz_window_cpu(i):
    run_window_case(draw_window_case(i, "cpu"), "cpu")


@requires_gpu
@pytest.mark.parametrize("i", range(WIN_GPU_CASES))
def test_fuzz_window_gpu(i):
    run_window_case(draw_window_case(i, "cuda"), "cuda")
