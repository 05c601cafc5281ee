"""Random cases: shapes, head dims (any from 1 to 256), GQA groups, layouts, scales, causal modes,
kernels and split counts drawn together, so that combinations no fixed list
names get checked too (GUIDE section 3's rules, through check_attention).

Each case draws everything from its own generator, seeded by FC_FUZZ_SEED
(default 0) and the case number, so a failure names a reproducible case:

    FC_FUZZ_SEED=7 FC_FUZZ_CASES=400 python -m pytest tests/test_fuzz.py

FC_FUZZ_CASES sets the GPU case count (default 120); the CPU cases (the C path,
small shapes) are a quarter of that. On the GPU every case also reruns the call
and requires bit-identical out and LSE.

The backward cases (test_fuzz_bwd_*, FC_FUZZ_BWD_CASES, default 60 on the GPU)
draw the same space plus the backward's own switches: torch's deterministic
mode and a loss that uses the returned LSE. Each checks dq, dk and dv against
the fp64 autograd reference by test_backward's rule, and on the GPU reruns: dk
and dv bit-identical always, dq too in the deterministic mode (by default its
fp32 adds across key blocks come in any order: within two ulps of its largest value).

The shape cases (test_fuzz_shapes, a third of FC_FUZZ_CASES on the GPU) write a drawn call in one of
SDPA's other forms (ranks 2-6, broadcast batch and head dims) and require flashcore.attention's fold to
give bit for bit the one (B, H, S, D) call on the broadcast inputs made contiguous.
"""
import math
import os
import random

import pytest
import torch

import flashcore

from conftest import (CAUSAL_MODES, DTYPE_NAMES, GPU_KERNELS, GPU_OK, check_attention, make_qkv, mode_id,
                      run_poisoned)
from test_backward import HALF_ULP, check_grads, deterministic, fc_grads, refused_here

SEED = int(os.environ.get("FC_FUZZ_SEED", "0"))
GPU_CASES = int(os.environ.get("FC_FUZZ_CASES", "120"))
CPU_CASES = max(1, GPU_CASES // 4)
BWD_GPU_CASES = int(os.environ.get("FC_FUZZ_BWD_CASES", "60"))
BWD_CPU_CASES = max(1, BWD_GPU_CASES // 4)
# Reference cost bound: B * Hq * Sq * Sk scores (fp64 on the GPU, fp32 / fp64 on the CPU).
GPU_SCORES = 128 * 2**20
CPU_SCORES = 2**20
# The layouts of conftest.rand; "expanded" (head stride 0) applies to k and v only.
QO_LAYOUTS = ["contiguous", "transposed", "sliced", "sliced_hi", "batch_step"]
KV_LAYOUTS = QO_LAYOUTS + ["expanded"]


def draw_len(rng, cap):
    """A sequence length: small and odd, a tile edge (64, 128, 192-key tiles) +-1, or any."""
    kind = rng.random()
    if kind < 0.3:
        n = rng.randint(1, 100)
    elif kind < 0.65:
        n = rng.choice([64, 128, 192]) * rng.randint(1, 24) + rng.choice([-1, 0, 1])
    else:
        n = rng.randint(1, cap)
    return max(1, min(n, cap))


def draw_call(rng, gpu, cap, budget, p_decode):
    """A call's parameters (a dict) from rng: shape, dtype, layouts, causal mode, scale, kernel and
    split count. Longer sides shrink until B * Hq * Sq * Sk <= budget (the reference's cost)."""
    # (a head dim that is no multiple of 8 runs as the call zero-padded to one: flashcore.attention's rewrite)
    D = rng.choice([64, 128, 256] * 3 + [8 * rng.randint(1, 32)] * 2 + [rng.randint(1, 255)])
    dtype = rng.choice([torch.float16, torch.bfloat16] + ([] if gpu else [torch.float32]))
    wide = rng.random() < 0.3  # many (batch, head) pairs: the persistent grids' several tiles per CTA
    Hkv = rng.randint(1, 8 if wide else 4)
    Hq = Hkv * rng.choice([1, 1, 2, 3, 4])
    B = rng.randint(1, 8 if wide else 3)
    Sq, Sk = draw_len(rng, cap), draw_len(rng, cap)
    if rng.random() < p_decode:
        Sq = rng.randint(1, 8)  # decode-like: the split-KV path under auto
    while B * Hq * Sq * Sk > budget:  # keep the reference affordable: shrink the longer side
        if Sq >= Sk:
            Sq = max(1, Sq // 2)
        else:
            Sk = max(1, Sk // 2)
    layouts = (rng.choice(QO_LAYOUTS), rng.choice(KV_LAYOUTS), rng.choice(KV_LAYOUTS))
    mode = rng.choice(CAUSAL_MODES)
    scale = None if rng.random() < 0.6 else rng.uniform(0.03, 0.6)
    # (drawn from the same list on every machine, so that a seed draws the same
    # shapes anywhere; "sm90" runs as "auto" where the Hopper kernel is not built for the GPU)
    kernel = rng.choice(["auto", "sm80", "sm90"])
    kernel = gpu_kernel(kernel) if gpu else "cpu"
    # num_splits: the heuristic, none, or a forced split count (never with the
    # sm90 kernel, which refuses a split).
    splits = rng.choice([None, None, 1, rng.randint(2, 12)])
    if kernel == "sm90" and splits not in (None, 1):
        splits = None
    return dict(B=B, Hq=Hq, Hkv=Hkv, Sq=Sq, Sk=Sk, D=D, dtype=dtype, layouts=layouts, mode=mode, scale=scale,
                kernel=kernel, num_splits=splits)


def draw_case(i, device):
    """Case i's parameters (a dict), from its own generator."""
    rng = random.Random(SEED * 1_000_003 + i * 7919 + (0 if device == "cuda" else 1))
    gpu = device == "cuda"
    c = draw_call(rng, gpu, 4500 if gpu else 300, GPU_SCORES if gpu else CPU_SCORES, 0.15)
    return dict(c, torch_seed=rng.getrandbits(31))


def describe(c):
    return (f"FC_FUZZ_SEED={SEED} case: B={c['B']} Hq={c['Hq']} Hkv={c['Hkv']} Sq={c['Sq']} Sk={c['Sk']} "
            f"D={c['D']} {DTYPE_NAMES[c['dtype']]} mode={mode_id(c['mode'])} scale={c['scale']} "
            f"layouts={c['layouts']} kernel={c['kernel']} num_splits={c['num_splits']}")


def run_case(c, device):
    torch.manual_seed(c["torch_seed"])
    q, k, v = make_qkv(c["B"], c["Hq"], c["Hkv"], c["Sq"], c["Sk"], c["D"], c["dtype"], device, layouts=c["layouts"])
    kw = {"num_splits": c["num_splits"]}
    try:
        out, lse = run_poisoned(q, k, v, c["mode"], kernel=c["kernel"], scale=c["scale"], **kw)
        check_attention(out, lse, q, k, v, c["scale"], c["mode"])
        if device == "cuda":
            out2, lse2 = run_poisoned(q, k, v, c["mode"], kernel=c["kernel"], scale=c["scale"], **kw)
            assert torch.equal(out, out2) and torch.equal(lse, lse2), "a rerun gave different bits"
    except AssertionError as e:
        raise AssertionError(f"{describe(c)}: {e}") from None
    except ValueError as e:
        # A forced split at a head dim whose split-KV kernel needs more shared memory
        # than the GPU has (sm86/89 at D > 128) is refused by design (test_decode).
        if (c["num_splits"] or 0) > 1 and "cannot run on this GPU" in str(e):
            pytest.skip(f"{describe(c)}: refused on this GPU: {e}")
        raise ValueError(f"{describe(c)}: {e}") from None


def assert_calls_cover(cases):
    """Asserts that draw_call's draws in cases reach every kernel, dtype, mode and head-dim kind, GQA,
    strided layouts and Sq != Sk; returns seen (f -> the set of f over the cases) for more."""
    seen = lambda f: {f(c) for c in cases}  # noqa: E731
    assert seen(lambda c: c["kernel"]) == {"auto", *GPU_KERNELS}
    assert seen(lambda c: c["dtype"]) == {torch.float16, torch.bfloat16}
    assert seen(lambda c: c["mode"]) == set(CAUSAL_MODES)
    assert {64, 128, 256} <= seen(lambda c: c["D"]) and seen(lambda c: c["D"] not in (64, 128, 256)) == {True, False}
    assert True in seen(lambda c: c["Hq"] > c["Hkv"])
    assert True in seen(lambda c: c["layouts"] != ("contiguous",) * 3)
    assert True in seen(lambda c: c["Sq"] != c["Sk"])
    return seen


def test_draws_cover_the_space():
    """The generator reaches what the cases are for: every kernel, dtype, mode and
    head-dim kind, GQA, strided layouts, forced splits and tile-edge lengths."""
    cases = [draw_case(i, "cuda") for i in range(GPU_CASES)] if GPU_CASES >= 100 else []
    if not cases:
        pytest.skip("FC_FUZZ_CASES < 100: too few draws to expect every kind")
    seen = assert_calls_cover(cases)
    assert True in seen(lambda c: (c["num_splits"] or 0) > 1)
    assert True in seen(lambda c: any(n % 64 in (63, 1) for n in (c["Sq"], c["Sk"])))


@pytest.mark.parametrize("i", range(CPU_CASES))
def test_fuzz_cpu(i):
    run_case(draw_case(i, "cpu"), "cpu")


@pytest.mark.skipif(not GPU_OK, reason="no usable CUDA device")
@pytest.mark.parametrize("i", range(GPU_CASES))
def test_fuzz_gpu(i):
    run_case(draw_case(i, "cuda"), "cuda")


# ---- the backward ----

# Reference cost bound of a backward case (the fp64 autograd keeps several score-sized tensors).
BWD_GPU_SCORES = 24 * 2**20
BWD_CPU_SCORES = 2**18


def draw_bwd_case(i, device):
    """Backward case i's parameters: draw_call's (its own generator) plus `det` (torch's
    deterministic mode) and `glse` (the loss also uses the returned LSE)."""
    rng = random.Random(SEED * 1_000_033 + i * 7907 + (0 if device == "cuda" else 1) + 500_009)
    gpu = device == "cuda"
    c = draw_call(rng, gpu, 3000 if gpu else 200, BWD_GPU_SCORES if gpu else BWD_CPU_SCORES, 0.1)
    det = rng.random() < 0.3
    glse = rng.random() < 0.25
    return dict(c, det=det, glse=glse, torch_seed=rng.getrandbits(31))


def describe_bwd(c):
    return describe(c).replace("FC_FUZZ_SEED", "backward FC_FUZZ_SEED") + f" det={c['det']} glse={c['glse']}"


def run_bwd_case(c, device):
    torch.manual_seed(c["torch_seed"])
    q, k, v = make_qkv(c["B"], c["Hq"], c["Hkv"], c["Sq"], c["Sk"], c["D"], c["dtype"], device, layouts=c["layouts"])
    go = torch.randn(c["B"], c["Hq"], c["Sq"], c["D"], device=device).to(c["dtype"])
    glse = torch.randn(c["B"], c["Hq"], c["Sq"], device=device) if c["glse"] else None
    grads = lambda: fc_grads(q, k, v, c["mode"], go, glse, c["scale"], c["kernel"],  # noqa: E731
                             c["num_splits"])
    try:
        if refused_here(q, grads):
            return
        with deterministic(c["det"]):
            first = grads()
            again = grads() if device == "cuda" else first
        check_grads(q, k, v, c["mode"], first, go, glse, c["scale"])
        assert torch.equal(again[1], first[1]) and torch.equal(again[2], first[2]), "a rerun gave other dk, dv bits"
        if c["det"]:
            assert torch.equal(again[0], first[0]), "a deterministic rerun gave other dq bits"
        else:
            big = first[0].abs().max().item() if first[0].numel() else 0.0
            tol = 4 * HALF_ULP[c["dtype"]] * max(1.0, big)
            err = (again[0].float() - first[0].float()).abs().max().item() if first[0].numel() else 0.0
            assert err <= tol, f"a rerun's dq moved by {err:.3e} > {tol:.1e}"
    except AssertionError as e:
        raise AssertionError(f"{describe_bwd(c)}: {e}") from None
    except ValueError as e:
        raise ValueError(f"{describe_bwd(c)}: {e}") from None


def test_bwd_draws_cover_the_space():
    """The backward generator reaches every kernel, dtype, mode, both switches, GQA and odd head dims."""
    cases = [draw_bwd_case(i, "cuda") for i in range(BWD_GPU_CASES)] if BWD_GPU_CASES >= 60 else []
    if not cases:
        pytest.skip("FC_FUZZ_BWD_CASES < 60: too few draws to expect every kind")
    seen = assert_calls_cover(cases)
    assert seen(lambda c: c["det"]) == {True, False} and seen(lambda c: c["glse"]) == {True, False}


@pytest.mark.parametrize("i", range(BWD_CPU_CASES))
def test_fuzz_bwd_cpu(i):
    run_bwd_case(draw_bwd_case(i, "cpu"), "cpu")


@pytest.mark.skipif(not GPU_OK, reason="no usable CUDA device")
@pytest.mark.parametrize("i", range(BWD_GPU_CASES))
def test_fuzz_bwd_gpu(i):
    run_bwd_case(draw_bwd_case(i, "cuda"), "cuda")


# ---- SDPA's other shapes ----
#
# A case draws a call (head dim, dtype, lengths, causal mode, kernel) and writes it in one of SDPA's other
# forms: zero to three batch dims, each shared by q or by k and v (size 1 there, broadcast), k and v with
# fewer leading dims than q, k's or v's heads 1 against the other's, a single query head against several KV
# heads, or, with no batch dim, a 3-D or 2-D call. flashcore.attention's fold must give bit for bit what
# the one (B, H, S, D) call on the broadcast inputs, made contiguous by torch, gives (strides change
# addressing only), in out's and lse's SDPA shapes.
SHAPE_GPU_CASES = max(1, GPU_CASES // 3)
SHAPE_CPU_CASES = max(1, CPU_CASES // 2)


def gpu_kernel(name):
    """A drawn kernel name, or "auto" where this GPU's build lacks that kernel (the draw stays the same)."""
    return name if name in GPU_KERNELS else "auto"


def draw_shape_case(i, device):
    rng = random.Random(SEED * 1_000_033 + i * 7907 + (0 if device == "cuda" else 1))
    gpu = device == "cuda"
    bdims = [rng.randint(1, 3) for _ in range(rng.choice([0, 0, 1, 2, 3]))]
    shared = [rng.choice(["", "q", "kv"]) for _ in bdims]  # who has a 1 there (broadcast)
    Hkv = rng.randint(1, 4)
    Hq = 1 if rng.random() < 0.2 else Hkv * rng.choice([1, 2, 3])
    kv_heads = rng.choice(["", "", "k1", "v1"])  # k's or v's heads given as 1 (broadcast to Hkv)
    prefix = next((j for j, s in enumerate(shared) if s != "kv"), len(shared))
    drop = rng.randint(0, prefix)  # leading dims k and v leave out (only dims they broadcast in)
    cap = 1500 if gpu else 200
    Sq, Sk = draw_len(rng, cap), draw_len(rng, cap)
    D = rng.choice([64, 128, 256, 8 * rng.randint(1, 32)])
    rank2 = not bdims and Hq == Hkv == 1 and rng.random() < 0.5
    return dict(bdims=bdims, shared=shared, Hq=Hq, Hkv=Hkv, kv_heads=kv_heads, drop=drop, Sq=Sq, Sk=Sk, D=D,
                rank2=rank2, dtype=rng.choice([torch.float16, torch.bfloat16] + ([] if gpu else [torch.float32])),
                mode=rng.choice(CAUSAL_MODES),
                kernel=gpu_kernel(rng.choice(["auto", "sm80", "sm90"])) if gpu else "cpu",
                torch_seed=rng.getrandbits(31))


def run_shape_case(c, device):
    torch.manual_seed(c["torch_seed"])
    bd, sh = c["bdims"], c["shared"]
    lead_q = [1 if s == "q" else n for n, s in zip(bd, sh)]
    lead_kv = [1 if s == "kv" else n for n, s in zip(bd, sh)][c["drop"]:]
    hk, hv = (1 if c["kv_heads"] == "k1" else c["Hkv"]), (1 if c["kv_heads"] == "v1" else c["Hkv"])
    hq_full = c["Hkv"] if c["Hq"] == 1 else c["Hq"]
    mk = lambda lead, h, s: torch.randn(*lead, h, s, c["D"], device=device).to(c["dtype"])  # noqa: E731
    q, k, v = mk(lead_q, c["Hq"], c["Sq"]), mk(lead_kv, hk, c["Sk"]), mk(lead_kv, hv, c["Sk"])
    if c["rank2"]:
        q, k, v = q[0], k[0], v[0]
    mode = c["mode"]
    kw = dict(causal=mode is not None, causal_alignment=mode or "top_left", kernel=c["kernel"], return_lse=True)
    try:
        out, lse = flashcore.attention(q, k, v, **kw)
        B = math.prod(bd)
        full = lambda t, h, s: t.expand(*bd, h, s, c["D"]).contiguous().reshape(B, h, s, c["D"])  # noqa: E731
        want, want_lse = flashcore.attention(full(q, hq_full, c["Sq"]), full(k, c["Hkv"], c["Sk"]),
                                             full(v, c["Hkv"], c["Sk"]), **kw)
        shape = (c["Sq"], c["D"]) if c["rank2"] else (*bd, hq_full, c["Sq"], c["D"])
        assert out.shape == shape and lse.shape == shape[:-1], f"shapes {tuple(out.shape)} {tuple(lse.shape)}"
        assert torch.equal(out.reshape(want.shape), want) and torch.equal(lse.reshape(want_lse.shape), want_lse)
    except AssertionError as e:
        raise AssertionError(f"FC_FUZZ_SEED={SEED} shape case {c}: {e}") from None


@pytest.mark.parametrize("dev,i", [("cpu", i) for i in range(SHAPE_CPU_CASES)] + [
    pytest.param("cuda", i, marks=pytest.mark.skipif(not GPU_OK, reason="no usable CUDA device"))
    for i in range(SHAPE_GPU_CASES)])
def test_fuzz_shapes(dev, i):
    run_shape_case(draw_shape_case(i, dev), dev)
