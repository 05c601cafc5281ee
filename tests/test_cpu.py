"""The C CPU path against fp64 reference math and torch SDPA on the CPU.

Runs in CI (no GPU). The CPU path is a plain C loop, so shapes stay small:
B*H*Sq*Sk*D stays under ~3e7 per case.
"""
import math
import os
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import flashcore
from flashcore import _C

from conftest import (CAUSAL_MODES, call, check_attention, dtype_id, make_qkv, mode_id,
                      ref_attention, run_poisoned, sdpa_lowprec, visible_mask)

DEV = "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]

# (B, H, Sq, Sk): lengths 1, 17, 97; Sq != Sk both ways; Sq > Sk (fully masked
# rows under bottom_right) and Sq < Sk.
SHAPES = [
    (1, 2, 1, 1),
    (2, 2, 17, 17),
    (1, 2, 97, 97),
    (2, 1, 113, 203),
    (1, 2, 203, 113),
    (1, 3, 17, 4),
    (2, 1, 1, 200),
]


def shape_id(s):
    return "B{}H{}_q{}k{}".format(*s)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("mode", CAUSAL_MODES, ids=mode_id)
@pytest.mark.parametrize("D", [8, 64, 128, 256])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_cpu_matches_reference(shape, D, mode, dtype):
    B, H, Sq, Sk = shape
    assert B * H * Sq * Sk * D <= 3e7
    q, k, v = make_qkv(B, H, H, Sq, Sk, D, dtype, DEV)
    out, lse = run_poisoned(q, k, v, mode)
    check_attention(out, lse, q, k, v, None, mode)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("mode", CAUSAL_MODES, ids=mode_id)
@pytest.mark.parametrize("D", [40, 72, 200])
@pytest.mark.parametrize("shape", [(1, 2, 97, 97), (1, 1, 113, 203), (2, 1, 203, 113)], ids=shape_id)
def test_cpu_odd_head_dims(shape, D, mode, dtype):
    B, H, Sq, Sk = shape
    q, k, v = make_qkv(B, H, H, Sq, Sk, D, dtype, DEV)
    out, lse = run_poisoned(q, k, v, mode)
    check_attention(out, lse, q, k, v, None, mode)


@pytest.mark.parametrize("D", list(range(8, 257, 8)))
def test_cpu_every_head_dim(D):
    # every supported D; alternate dtype and causal mode so all get covered
    idx = D // 8
    dtype = DTYPES[idx % 3]
    mode = CAUSAL_MODES[idx % 3]
    q, k, v = make_qkv(1, 2, 1, 19, 33, D, dtype, DEV)
    out, lse = run_poisoned(q, k, v, mode)
    check_attention(out, lse, q, k, v, None, mode)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", [(1, 2, 17, 4), (1, 1, 203, 113), (2, 1, 5, 1), (1, 1, 2, 1)],
                         ids=shape_id)
def test_cpu_fully_masked_rows(shape, dtype):
    """bottom_right with Sq > Sk: the first Sq - Sk rows see no key."""
    B, H, Sq, Sk = shape
    q, k, v = make_qkv(B, H, H, Sq, Sk, 64, dtype, DEV)
    out, lse = run_poisoned(q, k, v, "bottom_right")
    n_dead = Sq - Sk
    assert torch.isfinite(out).all()
    assert (out[:, :, :n_dead] == 0).all()
    assert torch.isneginf(lse[:, :, :n_dead]).all()
    assert torch.isfinite(lse[:, :, n_dead:]).all()
    # The first live row sees exactly key 0: out == v[:, :, 0] and lse == scale*q.k0.
    # (fp32 allows the last bit: exp(s - m) may come out as 1 - 1ulp)
    first = out[:, :, n_dead]
    torch.testing.assert_close(first, v[:, :, 0], atol=0, rtol=1e-6 if dtype == torch.float32 else 0)
    s0 = (q[:, :, n_dead].double() * k[:, :, 0].double()).sum(-1) / math.sqrt(64)
    torch.testing.assert_close(lse[:, :, n_dead].double(), s0, atol=1e-4, rtol=1e-5)
    check_attention(out, lse, q, k, v, None, "bottom_right")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("mode", CAUSAL_MODES, ids=mode_id)
@pytest.mark.parametrize("heads", [(4, 1), (4, 2), (6, 3), (3, 3)], ids=lambda h: f"hq{h[0]}hkv{h[1]}")
@pytest.mark.parametrize("seq", [(17, 33), (61, 29)], ids=lambda s: f"q{s[0]}k{s[1]}")
def test_cpu_gqa(seq, heads, mode, dtype):
    Hq, Hkv = heads
    Sq, Sk = seq
    q, k, v = make_qkv(2, Hq, Hkv, Sq, Sk, 64, dtype, DEV)
    out, lse = run_poisoned(q, k, v, mode, enable_gqa=True)
    check_attention(out, lse, q, k, v, None, mode)
    # also against SDPA's own GQA
    if mode != "bottom_right":
        sd = F.scaled_dot_product_attention(q, k, v, is_causal=(mode == "top_left"), enable_gqa=True)
        ref, _ = ref_attention(q, k, v, None, mode)
        assert (out.double() - ref).abs().max() <= 2 * (sd.double() - ref).abs().max() + 1e-3


LAYOUTS = [
    ("transposed", "transposed", "transposed"),
    ("sliced", "sliced", "sliced"),
    ("sliced_hi", "batch_step", "sliced"),
    ("transposed", "sliced", "contiguous"),
    ("batch_step", "expanded", "expanded"),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("mode", CAUSAL_MODES, ids=mode_id)
@pytest.mark.parametrize("layouts", LAYOUTS, ids=lambda l: "-".join(l))
def test_cpu_strided_inputs(layouts, mode, dtype):
    q, k, v = make_qkv(2, 3, 3, 37, 45, 64, dtype, DEV, layouts=layouts)
    assert q.stride(-1) == k.stride(-1) == v.stride(-1) == 1
    out, lse = run_poisoned(q, k, v, mode)
    check_attention(out, lse, q, k, v, None, mode)
    # same answer as on contiguous copies
    out_c, lse_c = call(q.contiguous(), k.contiguous(), v.contiguous(), mode)
    torch.testing.assert_close(out, out_c, atol=0, rtol=0)
    torch.testing.assert_close(lse, lse_c, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("mode", CAUSAL_MODES, ids=mode_id)
@pytest.mark.parametrize("scale,mult", [(0.05, 1.0), (0.5, 1.0), (2.0, 1.0), (None, 8.0)],
                         ids=["s0.05", "s0.5", "s2", "big_logits"])
def test_cpu_scale_and_large_logits(scale, mult, mode, dtype):
    q, k, v = make_qkv(1, 2, 2, 41, 67, 64, dtype, DEV, mult=mult)
    out, lse = run_poisoned(q, k, v, mode, scale=scale)
    check_attention(out, lse, q, k, v, scale, mode)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("mode", CAUSAL_MODES, ids=mode_id)
def test_cpu_deterministic(mode, dtype):
    q, k, v = make_qkv(2, 2, 1, 97, 61, 128, dtype, DEV)
    o1, l1 = call(q, k, v, mode)
    o2, l2 = call(q, k, v, mode)
    assert torch.equal(o1, o2)
    assert torch.equal(l1, l2)


def test_cpu_inputs_not_modified():
    q, k, v = make_qkv(1, 2, 2, 17, 23, 64, torch.float32, DEV)
    qc, kc, vc = q.clone(), k.clone(), v.clone()
    call(q, k, v, "bottom_right")
    assert torch.equal(q, qc) and torch.equal(k, kc) and torch.equal(v, vc)


def test_cpu_api_aliases_and_defaults():
    q, k, v = make_qkv(2, 2, 2, 33, 33, 64, torch.float32, DEV)
    base = flashcore.attention(q, k, v, causal=True)
    assert isinstance(base, torch.Tensor)  # return_lse=False returns a bare tensor
    # is_causal is an alias of causal; both given and agreeing is fine
    assert torch.equal(flashcore.attention(q, k, v, is_causal=True), base)
    assert torch.equal(flashcore.attention(q, k, v, is_causal=True, causal=True), base)
    # default alignment is top_left (SDPA's is_causal)
    assert torch.equal(flashcore.attention(q, k, v, causal=True, causal_alignment="top_left"), base)
    # with Sq == Sk both alignments coincide
    assert torch.equal(flashcore.attention(q, k, v, causal=True, causal_alignment="bottom_right"), base)
    # explicit SDPA defaults are accepted
    assert torch.equal(flashcore.attention(q, k, v, None, 0.0, True, None, True), base)
    # scale=None means 1/sqrt(D)
    assert torch.equal(flashcore.attention(q, k, v, causal=True, scale=1 / math.sqrt(64)), base)
    # kernel="cpu" and "auto" pick the same CPU path
    assert _C.picked_kernel(q, k) == "cpu"
    assert torch.equal(flashcore.attention(q, k, v, causal=True, kernel="cpu"), base)
    # return_lse=True gives the same out plus an fp32 lse
    out, lse = flashcore.attention(q, k, v, causal=True, return_lse=True)
    assert torch.equal(out, base)
    assert lse.dtype == torch.float32 and lse.shape == (2, 2, 33)
    # the alignment is ignored without a causal mask
    full = flashcore.attention(q, k, v)
    assert torch.equal(flashcore.attention(q, k, v, causal_alignment="bottom_right"), full)
    # sanity: matches SDPA
    torch.testing.assert_close(base, F.scaled_dot_product_attention(q, k, v, is_causal=True),
                               atol=2e-5, rtol=2e-5)


def test_cpu_exports():
    assert flashcore.KERNELS == {"auto": 0, "sm80": 1, "sm90": 2, "cpu": 3}
    assert flashcore.CAUSAL_ALIGNMENTS == {"top_left": 1, "bottom_right": 2}
    assert set(flashcore.__all__) >= {"attention", "KERNELS", "CAUSAL_ALIGNMENTS"}


def test_cpu_attention_names_match_the_exported_tables():
    """flashcore.attention (C++) knows every name of KERNELS and CAUSAL_ALIGNMENTS, with the same
    meaning as the id that _C.fwd takes, and refuses names outside them."""
    q, k, v = make_qkv(1, 2, 2, 9, 11, 16, torch.float32, DEV)
    for name, mode in flashcore.CAUSAL_ALIGNMENTS.items():
        out = flashcore.attention(q, k, v, causal=True, causal_alignment=name)
        ref, _ = _C.fwd(q, k, v, 0.25, mode, flashcore.KERNELS["cpu"], False, 0)
        assert torch.equal(out, ref), name
    for name in flashcore.KERNELS:
        if name in ("auto", "cpu"):
            assert torch.isfinite(flashcore.attention(q, k, v, kernel=name)).all()
        else:  # a GPU kernel forced on CPU tensors: refused for the device, not for the name
            with pytest.raises(ValueError, match=r"kernel: a GPU kernel was forced"):
                flashcore.attention(q, k, v, kernel=name)
    with pytest.raises(ValueError, match=r"kernel: expected one of 'auto', 'sm80', 'sm90', 'cpu'"):
        flashcore.attention(q, k, v, kernel="gpu")


def test_cpu_single_key_and_query():
    """Tiny hand-checkable cases: one key gives out == v exactly."""
    q, k, v = make_qkv(1, 1, 1, 5, 1, 8, torch.float32, DEV)
    out, lse = call(q, k, v, None)
    torch.testing.assert_close(out, v.expand(1, 1, 5, 8), atol=0, rtol=1e-6)
    s = (q.double() @ k.double().transpose(-1, -2)).squeeze(-1) / math.sqrt(8)
    torch.testing.assert_close(lse.double(), s, atol=1e-5, rtol=1e-6)
    # top_left with Sq=1: the only query sees key 0 alone
    q, k, v = make_qkv(1, 1, 1, 1, 7, 8, torch.float32, DEV)
    out, _ = call(q, k, v, "top_left")
    torch.testing.assert_close(out, v[:, :, :1], atol=0, rtol=1e-6)
    # bottom_right with Sq=1 (decode): the query sees every key
    out, _ = call(q, k, v, "bottom_right")
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), atol=2e-6, rtol=1e-5)


def test_cpu_misaligned_pointer_is_correct():
    """A view whose data pointer is not 16-byte aligned (offset of one fp16
    element, row stride D+1): the CPU path has no alignment rule, so it is
    computed (the GPU kernels refuse it, test_gpu)."""
    D = 64
    base = torch.randn(1, 2, 19, D + 1).to(torch.float16)
    q = base[..., 1:]
    k, v = make_qkv(1, 2, 2, 19, 19, D, torch.float16, DEV)[1:]
    out, lse = call(q, k, v, None)
    check_attention(out, lse, q, k, v, None, None)


def test_cpu_fp32_long_dot_products():
    """fp32, D = 256, logits scaled 5x over the default, 300 keys: the C path
    accumulates in fp64, so it stays within the suite's rule (an earlier fp32
    accumulation was 1.75e-5 off against a 1.41e-5 bound on exactly this
    draw: FC_FUZZ_SEED=55, CPU case 78)."""
    torch.manual_seed(762700588)
    scale = 0.3143798166880455  # the draw's; the default is 1 / 16
    q, k, v = make_qkv(2, 8, 4, 5, 300, 256, torch.float32, DEV, layouts=("sliced_hi", "batch_step", "transposed"))
    out, lse = run_poisoned(q, k, v, "bottom_right", kernel="cpu", scale=scale)
    check_attention(out, lse, q, k, v, scale, "bottom_right")
    ref, _ = ref_attention(q, k, v, scale, "bottom_right")
    assert (out - ref).abs().max().item() < 1e-6  # fp32 rounding of the output, not of the sums


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_cpu_score_past_fp32_range_is_nan(dtype):
    """A score past the fp32 range is +inf in the kernels, as in SDPA, and the
    row comes out NaN; the C path computes scores in fp64 and must do the same
    (not return a finite row with LSE = +inf). Rows whose scores stay in range
    are unaffected."""
    q = torch.ones(1, 1, 2, 8, dtype=dtype)
    q[0, 0, 0] = 3e19  # row 0: q . k = 8 * 3e19 * 3e19 overflows fp32 (and fp64 does not)
    k = torch.full((1, 1, 3, 8), 3e19, dtype=dtype)
    k[0, 0, 1] = 1.0
    v = torch.randn(1, 1, 3, 8).to(dtype)
    out, lse = flashcore.attention(q, k, v, scale=1.0, return_lse=True)
    sdpa = F.scaled_dot_product_attention(q, k, v, scale=1.0)
    assert torch.isnan(sdpa[0, 0, 0]).all()  # the behaviour matched
    assert torch.isnan(out[0, 0, 0]).all() and torch.isnan(lse[0, 0, 0])
    assert torch.isfinite(out[0, 0, 1]).all() and torch.isfinite(lse[0, 0, 1])


def run_python(script, **env):
    """Runs `script` in a fresh Python with this flashcore importable and the
    extra environment `env`; a crash (a signal) fails the calling test."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(flashcore.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])), **env)
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, "exit status {}: {}".format(r.returncode, r.stderr[-2000:])
    return r


SMALL_STACK_SCRIPT = """
import threading, torch, flashcore
torch.manual_seed(0)
q, k, v = torch.randn(1, 2, 40, 256), torch.randn(1, 2, 70, 256), torch.randn(1, 2, 70, 256)
res = {}
threading.stack_size(64 * 1024)
t = threading.Thread(target=lambda: res.setdefault("out", flashcore.attention(q, k, v)))
t.start(); t.join()
torch.set_num_threads(1)  # the reference runs after, on torch's own threads
ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double())
print("max_err", (res["out"].double() - ref).abs().max().item())
"""


def test_cpu_small_thread_stacks():
    """The CPU kernel keeps its rows and key chunks in a per-thread heap
    scratch (192 KiB at D = 256), not on the stack: a Python thread with a 64 KB
    stack and OpenMP workers with 64 KB stacks compute D = 256 correctly. Run
    in a subprocess, so that a regression is a failed test, not a dead run."""
    r = run_python(SMALL_STACK_SCRIPT, OMP_NUM_THREADS="2", OMP_STACKSIZE="64K")
    err = float(r.stdout.split("max_err")[1])
    assert err < 1e-5, r.stdout


# An LD_PRELOAD shim whose malloc fails for one size: the CPU kernel's
# per-thread scratch at D = 136 (SCRATCH_BYTES_PER_D in csrc/cpu/attn_cpu.c:
# 768 bytes per head-dim element).
FAILING_MALLOC_C = r"""
#include <stddef.h>
extern void* __libc_malloc(size_t);
void* malloc(size_t n) { return n == 768 * 136 ? NULL : __libc_malloc(n); }
"""
FAILING_MALLOC_SCRIPT = """
import torch, flashcore
q = torch.randn(1, 2, 20, 136)
try:
    flashcore.attention(q, q, q)
except MemoryError as e:
    print("MemoryError:", e)
"""


def test_cpu_failed_malloc_raises_memory_error(tmp_path):
    """A scratch malloc that fails gives FC_ERR_HOST_MEMORY, raised as
    MemoryError by the binding (glibc, a C compiler needed for the shim)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    try:
        glibc = bool(os.confstr("CS_GNU_LIBC_VERSION"))
    except (ValueError, OSError):
        glibc = False
    if cc is None or not glibc:
        pytest.skip("needs a C compiler and glibc for the malloc shim")
    src = tmp_path / "fail_malloc.c"
    src.write_text(FAILING_MALLOC_C)
    shim = tmp_path / "fail_malloc.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(shim), str(src)], check=True)
    r = run_python(FAILING_MALLOC_SCRIPT, LD_PRELOAD=str(shim), OMP_NUM_THREADS="2")
    assert "MemoryError: flashcore: the CPU kernel could not allocate its per-thread scratch" in r.stdout, r.stdout


# ---------------------------------------------------------------------------
# arch_reason (pure C, no GPU needed)
# ---------------------------------------------------------------------------

SM80, SM90, AUTO = flashcore.KERNELS["sm80"], flashcore.KERNELS["sm90"], flashcore.KERNELS["auto"]


@pytest.mark.parametrize("kernel", [SM80, AUTO], ids=["sm80", "auto"])
@pytest.mark.parametrize("cc", [(7, 5), (7, 0), (6, 1)], ids=lambda c: f"cc{c[0]}{c[1]}")
def test_arch_reason_too_old(kernel, cc):
    why = _C.arch_reason(kernel, *cc)
    assert isinstance(why, str) and why, f"cc {cc} must be refused"
    assert "sm80" in why or "8.0" in why, why


@pytest.mark.parametrize("cc", [(8, 0), (8, 6), (8, 9), (9, 0)], ids=lambda c: f"cc{c[0]}{c[1]}")
def test_arch_reason_sm80_runs(cc):
    assert _C.arch_reason(SM80, *cc) == ""
    assert _C.arch_reason(AUTO, *cc) == ""


@pytest.mark.parametrize("cc", [(7, 5), (8, 0), (8, 6), (8, 9)], ids=lambda c: f"cc{c[0]}{c[1]}")
def test_arch_reason_sm90_needs_hopper(cc):
    why = _C.arch_reason(SM90, *cc)
    assert isinstance(why, str) and why, f"the sm90 kernel cannot run on cc {cc}"


# ---------------------------------------------------------------------------
# the test helpers themselves
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", CAUSAL_MODES, ids=mode_id)
@pytest.mark.parametrize("seq", [(7, 7), (5, 11), (11, 5)], ids=lambda s: f"q{s[0]}k{s[1]}")
def test_reference_helper(seq, mode):
    """ref_attention agrees with fp64 SDPA (explicit mask for bottom_right)."""
    Sq, Sk = seq
    q, k, v = [t.double() for t in make_qkv(2, 4, 2, Sq, Sk, 16, torch.float32, DEV)]
    out, lse = ref_attention(q, k, v, 0.3, mode)
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    mask = visible_mask(Sq, Sk, mode)
    if mode == "top_left":
        assert torch.equal(mask, torch.ones(Sq, Sk, dtype=torch.bool).tril())
    if mode == "bottom_right":
        assert torch.equal(mask, torch.ones(Sq, Sk, dtype=torch.bool).tril(Sk - Sq))
    live = mask.any(-1)
    sd = F.scaled_dot_product_attention(q[:, :, live], kk, vv, attn_mask=mask[live], scale=0.3)
    torch.testing.assert_close(out[:, :, live], sd)
    assert (out[:, :, ~live] == 0).all() and torch.isneginf(lse[:, :, ~live]).all()
    s = (q @ kk.transpose(-1, -2)) * 0.3
    torch.testing.assert_close(lse[:, :, live], torch.logsumexp(s.masked_fill(~mask, -math.inf), -1)[:, :, live])
    rs, sdl = sdpa_lowprec(q, k, v, 0.3, mode)
    torch.testing.assert_close(sdl, sd)
