"""NaN in the inputs comes out as NaN, as in SDPA, never as a plausible number:
a query row holding a NaN, or a key holding one that a row sees, makes that
row's output and LSE NaN; a NaN in a value makes that column of the rows that
see it NaN. Whatever never reads the NaN is unaffected.
(A NaN in a value that a causal row does not see may still reach that row in
a tile kernel, which multiplies it by a zero weight; those rows are not
asserted, but for the split-KV kernel, which keeps rows without a visible key
at 0.)

Runs on the CPU path and on every GPU path: auto, each forced kernel, the
split-KV kernel and its combine, and the Hopper kernel's split tail.
"""
import pytest
import torch

import flashcore
from flashcore import _C

from conftest import GPU_KERNELS, dtype_id, make_qkv, mode_id, ref_attention, requires_gpu, run_poisoned

# (device, kernel, num_splits)
TARGETS = [pytest.param("cpu", "auto", None, id="cpu")] + [
    pytest.param("cuda", kern, None, id=f"cuda-{kern}", marks=requires_gpu) for kern in ["auto"] + GPU_KERNELS
] + [pytest.param("cuda", "auto", 3, id="cuda-split3", marks=requires_gpu)]

# (B, Hq, Hkv, Sq, Sk, D): several tiles with a partial one, Sq != Sk, GQA
SHAPES = [(2, 4, 2, 203, 203, 64), (1, 4, 4, 100, 333, 128), (1, 2, 1, 5, 1000, 256), (1, 2, 1, 150, 40, 64)]
ATOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5}


def shape_id(s):
    return "B{}_Hq{}_Hkv{}_Sq{}_Sk{}_D{}".format(*s)


def check_nan_rows(q, k, v, mode, kernel, num_splits, clean):
    """Run flashcore on inputs holding NaN and compare with the fp64 reference:
    NaN exactly where the reference has it (whole rows for a NaN score, one
    column for a NaN value; the LSE where a score is NaN), the rest close to it
    and bit for bit the output of the same call on `clean` (out, lse: q, k, v
    before the NaN went in), which those elements never read."""
    out, lse = run_poisoned(q, k, v, mode, kernel=kernel, num_splits=num_splits)
    ref_out, ref_lse = ref_attention(q, k, v, None, mode)
    nan_ref = torch.isnan(ref_out)
    assert nan_ref.any(), "the case must put a NaN into some output"
    assert torch.equal(torch.isnan(out).cpu(), nan_ref.cpu()), (
        f"NaN pattern: {torch.isnan(out).sum().item()} NaN elements where the reference has {nan_ref.sum().item()}")
    assert torch.equal(torch.isnan(lse).cpu(), torch.isnan(ref_lse).cpu()), "LSE: NaN where a row reads a NaN score"
    fine = ~nan_ref
    err = (out[fine].double() - ref_out[fine].double()).abs().max().item() if fine.any() else 0.0
    assert err <= ATOL[q.dtype], f"elements without NaN: max|out - ref| = {err:.3e}"
    assert torch.equal(out[fine], clean[0][fine]), "elements without NaN differ from the call without the NaN"
    assert torch.equal(lse[~torch.isnan(ref_lse)], clean[1][~torch.isnan(ref_lse)]), "LSE of rows without NaN"
    live = torch.isfinite(ref_lse)
    lse_err = (lse[live].double() - ref_lse[live].double()).abs().max().item() if live.any() else 0.0
    assert lse_err <= 2e-3, f"LSE without NaN: max error {lse_err:.3e}"


def dtypes_for(device):
    return [torch.float16, torch.bfloat16] + ([torch.float32] if device == "cpu" else [])


def check_with_nans(shape, dtypes, device, which, places, mode, kernel, num_splits):
    """For each dtype: fresh q, k, v of `shape` with NaN at `places` (indices
    into tensor `which`: "q", "k" or "v"), checked by check_nan_rows."""
    B, Hq, Hkv, Sq, Sk, D = shape
    for dtype in dtypes:
        qkv = dict(zip("qkv", make_qkv(B, Hq, Hkv, Sq, Sk, D, dtype, device)))
        clean = run_poisoned(qkv["q"], qkv["k"], qkv["v"], mode, kernel=kernel, num_splits=num_splits)
        qkv[which] = qkv[which].clone()
        for at in places:
            qkv[which][at] = float("nan")
        check_nan_rows(qkv["q"], qkv["k"], qkv["v"], mode, kernel, num_splits, clean)


@pytest.mark.parametrize("device,kernel,num_splits", TARGETS)
@pytest.mark.parametrize("mode", [None, "top_left", "bottom_right"], ids=mode_id)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_nan_in_a_query_row(device, kernel, num_splits, mode, shape):
    B, Hq, Hkv, Sq, Sk, D = shape
    # the last row sees a key in every mode
    places = [(B - 1, Hq - 1, Sq - 1, D // 2), (0, 0, Sq // 2, 0)]
    check_with_nans(shape, dtypes_for(device), device, "q", places, mode, kernel, num_splits)


@pytest.mark.parametrize("device,kernel,num_splits", TARGETS)
@pytest.mark.parametrize("mode", [None, "top_left", "bottom_right"], ids=mode_id)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_nan_in_a_key(device, kernel, num_splits, mode, shape):
    # Causal: rows before the NaN key mask it and stay finite.
    B, Hq, Hkv, Sq, Sk, D = shape
    places = [(0, 0, min(Sq, Sk) // 2, D - 1)]
    check_with_nans(shape, dtypes_for(device), device, "k", places, mode, kernel, num_splits)


@pytest.mark.parametrize("device,kernel,num_splits", TARGETS)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_nan_in_a_value(device, kernel, num_splits, shape, dtype):
    B, Hq, Hkv, Sq, Sk, D = shape
    check_with_nans(shape, [dtype], device, "v", [(B - 1, Hkv - 1, Sk - 1, 0)], None, kernel, num_splits)


@pytest.mark.parametrize("device,kernel,num_splits", TARGETS)
@pytest.mark.parametrize("mode", [None, "top_left", "bottom_right"], ids=mode_id)
def test_score_past_fp32_range(device, kernel, num_splits, mode):
    """A score past the fp32 range (a bf16 q . k over 3.4e38) is inf, as in
    fp32 math and SDPA, and makes its row's output and LSE NaN (the CPU path
    computes scores in fp64 and must overflow too); the other rows, which
    read the same key with ordinary scores, come out as the reference has
    them."""
    B, Hq, Hkv, Sq, Sk, D = 1, 4, 2, 150, 203, 64
    q, k, v = (t.clone() for t in make_qkv(B, Hq, Hkv, Sq, Sk, D, torch.bfloat16, device))
    row = Sq - 1  # sees key 0 in every causal mode
    q[..., 0] = 0  # dim 0 adds nothing to any score ...
    q[0, 1, row, 0] = 3e19  # ... but this one's with key 0 (q head 1 reads KV head 0): 9e38 > 3.4e38
    k[0, 0, 0, 0] = 3e19
    out, lse = run_poisoned(q, k, v, mode, kernel=kernel, num_splits=num_splits)
    assert torch.isnan(out[0, 1, row]).all() and torch.isnan(lse[0, 1, row])
    ref_out, ref_lse = ref_attention(q, k, v, None, mode)
    keep = torch.ones(B, Hq, Sq, dtype=torch.bool, device=q.device)
    keep[0, 1, row] = False
    assert torch.isfinite(out[keep]).all() and torch.isfinite(lse[keep]).all()
    err = (out[keep].double() - ref_out[keep].double()).abs().max().item()
    assert err <= ATOL[torch.bfloat16], f"rows in range: max|out - ref| = {err:.3e}"
    lse_err = (lse[keep].double() - ref_lse[keep].double()).abs().max().item()
    assert lse_err <= 2e-3, f"LSE of rows in range: max error {lse_err:.3e}"


@requires_gpu
@pytest.mark.parametrize("num_splits", [None, 2])
def test_nan_value_split_kv_rows_without_keys(num_splits):
    # The split-KV kernel's merge skips a row that no warp saw a key for, so
    # rows that see no key stay 0 / -inf although a value loaded for other rows
    # is NaN (a tile kernel may give them NaN: 0 * NaN).
    q, k, v = make_qkv(2, 8, 2, 8, 4, 64, torch.float16, "cuda")
    assert _C.num_splits(q, k, v, flashcore.CAUSAL_ALIGNMENTS["bottom_right"], 0, num_splits or 0) >= 1
    v = v.clone()
    v[:, :, 0, 3] = float("nan")
    out, lse = run_poisoned(q, k, v, "bottom_right", num_splits=num_splits)
    dead = slice(0, 4)  # query i sees keys j <= i - 4
    assert (out[:, :, dead] == 0).all() and torch.isneginf(lse[:, :, dead]).all()
    assert torch.isnan(out[:, :, 4:, 3]).all() and not torch.isnan(out[:, :, 4:, :3]).any()


@requires_gpu
@pytest.mark.parametrize("where", ["q", "k"])
def test_nan_split_tail(where):
    # D = 128 non-causal CTA pairs whose last tiles are split into pieces and
    # merged (test_gpu's TAIL_SHAPES); batch 1, heads 7-8 hold those tiles.
    from test_gpu import TAIL_SHAPES, guard_sms, tail_pieces
    (B, H, Sq, Sk), D = TAIL_SHAPES[0]
    if GPU_KERNELS[-1] != "sm90":
        pytest.skip("the split tail is the Hopper kernel's")
    assert tail_pieces(B, H, Sq, Sk, guard_sms() // 2) >= 2, "no split tail on this GPU"
    check_with_nans((B, H, H, Sq, Sk, D), [torch.float16], "cuda", where, [(1, 8, 900, 5), (1, 7, 600, 70)], None,
                    "auto", None)
