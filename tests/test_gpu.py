"""GPU kernels against fp64 reference math and torch SDPA (GUIDE section 3).

Every correctness test is parametrized over GPU_KERNELS: ["sm80"], plus
"sm90" on a compute-capability-9.0 device where forcing it works. The whole
module skips without a usable CUDA device.
"""
import os
import pathlib
import re
import sys

import pytest
import torch

import flashcore
from flashcore import _C

from conftest import (CAUSAL_MODES, GPU_KERNELS, call, check_attention, dtype_id, make_qkv, mode_id,
                      ref_attention, requires_gpu, run_poisoned, visible_mask)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "scripts"))
import tile_model  # noqa: E402  (the sm90 tile order's CPU model)

pytestmark = requires_gpu

DEV = "cuda"
# The path guards below (test_*_take_*, test_*_shapes_*) check that a test's shapes
# reach the sm90 path they were chosen for; the choice depends on the SM count,
# and the shapes were chosen for the 132 SMs of an H100 SXM or H200.
DESIGN_SMS = 132


def guard_sms():
    """The SM count for a path guard: skips the guard on a GPU without the sm90
    kernel or of another size, where the shapes may take other kernels (the
    correctness tests still run them there)."""
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    if "sm90" not in GPU_KERNELS or sms != DESIGN_SMS:
        pytest.skip(f"the shapes were chosen for the sm90 kernel on {DESIGN_SMS} SMs; this GPU has {sms}")
    return sms
DTYPES = [torch.float16, torch.bfloat16]
KERNELS = GPU_KERNELS

kernel_param = pytest.mark.parametrize("kernel", KERNELS)
dtype_param = pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
mode_param = pytest.mark.parametrize("mode", CAUSAL_MODES, ids=mode_id)


def shape_id(s):
    return "B{}H{}_q{}k{}".format(*s)


def run_and_check(kernel, B, Hq, Hkv, Sq, Sk, D, mode, dtype):
    """Fresh inputs, poisoned outputs, one call; out and LSE against the references."""
    q, k, v = make_qkv(B, Hq, Hkv, Sq, Sk, D, dtype, DEV)
    out, lse = run_poisoned(q, k, v, mode, kernel=kernel)
    check_attention(out, lse, q, k, v, None, mode)


# (B, H, Sq, Sk)
SHAPES = [
    # seed shapes
    (2, 8, 512, 512),
    (1, 8, 512, 512),
    # odd lengths, Sq == Sk
    (2, 4, 1, 1),
    (2, 4, 17, 17),
    (2, 4, 97, 97),
    (1, 4, 1000, 1000),
    (2, 3, 1025, 1025),
    # Sq != Sk, both ways
    (2, 4, 113, 203),
    (2, 4, 203, 113),
    (1, 4, 1024, 1023),
    (3, 2, 1, 1000),
    (2, 4, 17, 4),
]


# Every SHAPES entry fits on an H100's 132 SMs as 64-row tiles, so the sm90
# kernel runs them in key-split mode. These grids have more 64-row tiles than
# SMs and run its ordinary mode (persistent CTAs; 128-row tiles, or at D = 64
# non-causal 192-row tiles with three consumer warpgroups). The third has more
# heads than one causal window (33 heads for 8 query blocks on 132 SMs), so its
# causal tiles span several windows, the last one partial.
LARGE_GRID_SHAPES = [(2, 16, 640, 700), (3, 12, 1025, 1000), (4, 24, 1024, 1000)]


@pytest.mark.parametrize("shape", LARGE_GRID_SHAPES, ids=shape_id)
def test_large_grid_shapes_leave_key_split_mode(shape):
    B, H, Sq, Sk = shape
    sms = guard_sms()
    assert -(-Sq // 64) * B * H > sms, "shape must have more 64-row tiles than SMs"


# The sm90 kernel's ordinary mode runs 192-row tiles (three consumer warpgroups)
# for calls from Sq = 512 when the grid favours them (sm90_use_cons3): at D = 64
# in every causal mode, at D = 128 for causal calls from Sk = 2048, in the dynamic
# tile order (non-causal calls of those shapes keep two consumers, and so do
# bottom-right ones with Sq < 2048: (2, 16, 600, 2100) runs both). These shapes
# qualify, with a partial last 192-row tile; at D = 64 Sk is kept short so that
# the fp64 reference stays small; at D = 128 the second has Sq > Sk. Causal
# windows (sm90_causal_window) of 12 heads for (4, 16, 4100, 300) and 11 for
# (1, 16, 2200, 2100) leave 4 and 5 heads over, which join the last window
# (sm90_last_window); for (2, 16, 600, 4100) the window is capped to the L2
# (11 heads of 2 MB K/V: windows of 11, 11 and 10 heads). (4, 32, 550, 2300)
# at D = 64 runs causal calls in the dynamic order (fc_sm90_d64_dynamic): the
# static order's window would be 44 heads of 0.59 MB K/V, more than the 24 MB
# cap, so the windows are 42, 42 and 44 heads (the last two merged).
WIDE_SHAPES = [((4, 16, 600, 300), 64), ((4, 16, 1000, 300), 64), ((4, 16, 1601, 300), 64),
               ((4, 16, 4100, 300), 64), ((3, 12, 4097, 1000), 64), ((4, 32, 550, 2300), 64),
               ((2, 16, 600, 2100), 128), ((1, 16, 2200, 2100), 128), ((2, 16, 600, 4100), 128)]
wide_param = pytest.mark.parametrize("shape,D", WIDE_SHAPES,
                                     ids=lambda x: f"D{x}" if isinstance(x, int) else shape_id(x))


def uses_three_consumers(B, H, Sq, sms):
    """sm90_use_cons3 (csrc/sm90/attn_fwd_sm90_launch.cuh) for a causal call, mirrored."""
    stripes = lambda br: -(-(-(-Sq // br) * B * H) // sms)  # noqa: E731
    return Sq >= 512 and -(-Sq // 64) * B * H > sms and stripes(192) * 192 < stripes(128) * 128 * 1.15


def d64_window_over_cap(B, H, Sq, Sk, sms):
    """Whether a causal D = 64 call's static-order window (tile_model.causal_window,
    the mirror of fc_sm90_window_heads) holds more than the cap's K/V."""
    n_mb, kv = -(-Sq // 192), Sk * 64 * 4
    heads = tile_model.causal_window(min(n_mb * B * H, sms), n_mb, B * H, kv)
    return heads * kv > tile_model.WINDOW_CAP_BYTES


def d64_takes_dynamic_order(B, H, Sq, Sk, sms, mode):
    """fc_sm90_d64_dynamic (csrc/kernels.h) for a causal D = 64 call, mirrored: three
    consumers, and rows of 2048 keys or more (Sk; top-left Sq when shorter) or a
    static-order window over the cap."""
    row_keys = min(Sq, Sk) if mode == "top_left" else Sk
    return uses_three_consumers(B, H, Sq, sms) and (row_keys >= 2048 or d64_window_over_cap(B, H, Sq, Sk, sms))


def test_d64_dynamic_order_mirror():
    """The mirror above on shapes worked by hand: the standard grid's causal D = 64
    from S = 2k (rows of 2048 keys; from 8k one window of every head, 2 MB each), not
    below; the WIDE_SHAPES entry (windows of 2.4 MB heads), and top-left rows shorter
    than their keys."""
    for mode in ("top_left", "bottom_right"):
        assert d64_takes_dynamic_order(2, 32, 8192, 8192, 132, mode)
        assert d64_takes_dynamic_order(1, 32, 16384, 16384, 132, mode)
        assert d64_takes_dynamic_order(4, 32, 4096, 4096, 132, mode)
        assert d64_takes_dynamic_order(8, 32, 2048, 2048, 132, mode)
        assert not d64_takes_dynamic_order(16, 32, 1024, 1024, 132, mode)
        assert d64_takes_dynamic_order(4, 32, 550, 2300, 132, mode)
        assert not d64_takes_dynamic_order(4, 32, 550, 2000, 132, mode)
    assert d64_takes_dynamic_order(4, 32, 1500, 2048, 132, "bottom_right")
    assert not d64_takes_dynamic_order(4, 32, 1500, 2048, 132, "top_left")  # rows of at most 1500 keys


@wide_param
def test_wide_shapes_take_the_wide_path(shape, D):
    B, H, Sq, Sk = shape
    sms = guard_sms()
    assert uses_three_consumers(B, H, Sq, sms) and Sq % 192 != 0
    assert D == 64 or Sk >= 2048, "D = 128: three consumers from 2048 keys"
    for mode in ("top_left", "bottom_right"):
        assert D == 128 or d64_takes_dynamic_order(B, H, Sq, Sk, sms, mode) == (shape == (4, 32, 550, 2300))


@dtype_param
@mode_param
@wide_param
@kernel_param
@pytest.mark.parametrize("group", [1, 4], ids=lambda g: f"gqa{g}")
def test_gpu_wide_tiles(kernel, shape, D, mode, dtype, group):
    B, H, Sq, Sk = shape
    run_and_check(kernel, B, H, H // group, Sq, Sk, D, mode, dtype)


# D = 64 calls on three consumers take 192-key K/V tiles (Sm90Tile::WIDE_KV,
# sm90_wide_kv in csrc/sm90/attn_fwd_sm90_launch.cuh): non-causal ones whose key
# rows such tiles cover with little padding, and causal ones in the dynamic order.
# Non-causal (B, H, Sq, Sk), with K/V tile 0 partial (Sm90Tile::LEAD_TILE: a lead
# of 12, 72, 174 and 64 keys before key 0, so the softmax skips none, one, two and
# one 64-key groups) or whole (Sk = 3072); and a causal shape (WIDE_SHAPES'
# dynamic-order entry is another). Every non-causal one runs a row plan
# (sm90_row_plan): its last query block is short (24, 40 and 80 rows).
KV192_SHAPES = [(2, 32, 600, 2100), (2, 32, 1000, 3000), (2, 32, 600, 4050), (2, 32, 600, 2048), (2, 32, 600, 3072),
                (2, 32, 2000, 2100)]
KV192_CAUSAL_SHAPE = (4, 16, 768, 8192)
# Causal, in the dynamic order for its rows of 2100 keys (its windows would fit the L2);
# and with Sq > Sk (bottom-right: the first 500 rows see no key, consumers of no K/V tile).
KV192_CAUSAL_ROWS_SHAPE = (2, 16, 2100, 2100)
KV192_CAUSAL_TALL_SHAPE = (2, 16, 2600, 2100)


def takes_192_key_tiles(B, H, Sq, Sk, causal, sms):
    """sm90_wide_kv mirrored: causal calls in the D = 64 dynamic order; non-causal
    ones on three consumers from Sk = 2048 where 192-key tiles cover Sk with at
    most 3.2 % more keys than 128-key tiles do. causal: None or a causal mode."""
    if causal:
        return d64_takes_dynamic_order(B, H, Sq, Sk, sms, causal)
    if Sk < 2048 or not uses_three_consumers(B, H, Sq, sms):
        return False
    return -(-Sk // 192) * 192 * 1000 <= -(-Sk // 128) * 128 * 1032


def test_192_key_tile_rule():
    """The mirror on the standard grid: D = 64 from 2k take them, causal and not
    (2k and 4k non-causal: 3.1 % padding, a lead of 64 and 128 keys; causal: the
    dynamic order), 512 and 1k not. Not where the padding is larger (Sk = 2113:
    5.9 %). And the shapes of the tests below."""
    for causal in (None, "top_left", "bottom_right"):
        assert takes_192_key_tiles(2, 32, 8192, 8192, causal, 132)
        assert takes_192_key_tiles(1, 32, 16384, 16384, causal, 132)
        assert takes_192_key_tiles(8, 32, 2048, 2048, causal, 132)
        assert takes_192_key_tiles(4, 32, 4096, 4096, causal, 132)
        assert not takes_192_key_tiles(16, 32, 1024, 1024, causal, 132)
        assert not takes_192_key_tiles(32, 32, 512, 512, causal, 132)
        assert takes_192_key_tiles(4, 32, 550, 2300, causal, 132)
        assert takes_192_key_tiles(*KV192_CAUSAL_SHAPE, causal, 132)
    assert not takes_192_key_tiles(8, 32, 2048, 2113, None, 132)


def takes_row_plan(B, H, Sq, Sk, sms):
    """sm90_row_plans mirrored (csrc/sm90/attn_fwd_sm90_launch.cuh): a non-causal
    call on 192-key tiles whose last 192-row query block is short enough for a
    consumer to skip it (at most 128 rows), with more tiles than SMs and at most
    SM90_ROW_PLAN_TILES of them."""
    rows, n_tiles = Sq % 192, -(-Sq // 192) * B * H
    return (takes_192_key_tiles(B, H, Sq, Sk, None, sms) and Sq > 192 and 0 < rows <= 128
            and sms < n_tiles <= 4096)


def test_row_plan_rule():
    """The mirror on the standard grid: D = 64 2k (short blocks of 128 rows) and 4k
    (64 rows) are planned; 8k and 16k too (2752 tiles); not the 128-key calls (512,
    1k), not a last block of 129-191 rows (all three consumers at work), not more
    tiles than a plan holds."""
    assert takes_row_plan(8, 32, 2048, 2048, 132) and takes_row_plan(4, 32, 4096, 4096, 132)
    assert takes_row_plan(2, 32, 8192, 8192, 132) and takes_row_plan(1, 32, 16384, 16384, 132)
    assert not takes_row_plan(16, 32, 1024, 1024, 132) and not takes_row_plan(32, 32, 512, 512, 132)
    assert not takes_row_plan(2, 32, 1100, 2100, 132)  # 140 rows
    assert not takes_row_plan(32, 32, 2048, 2048, 132)  # 11264 tiles
    for shape in KV192_SHAPES:
        assert takes_row_plan(*shape, 132), shape


@pytest.mark.parametrize("shape", KV192_SHAPES, ids=shape_id)
def test_kv192_shapes_take_them(shape):
    sms = guard_sms()
    assert takes_192_key_tiles(*shape, None, sms)
    assert takes_row_plan(*shape, sms)


def test_kv192_causal_shape_takes_them():
    sms = guard_sms()
    for mode in ("top_left", "bottom_right"):
        assert takes_192_key_tiles(*KV192_CAUSAL_SHAPE, mode, sms)
        assert takes_192_key_tiles(*KV192_CAUSAL_ROWS_SHAPE, mode, sms)
        assert takes_192_key_tiles(*KV192_CAUSAL_TALL_SHAPE, mode, sms)
    assert not d64_window_over_cap(*KV192_CAUSAL_ROWS_SHAPE, sms), "the rows, not the windows, take the dynamic order"


@dtype_param
@pytest.mark.parametrize("shape", KV192_SHAPES, ids=shape_id)
@pytest.mark.parametrize("group", [1, 4], ids=lambda g: f"gqa{g}")
@kernel_param
def test_gpu_192_key_tiles(kernel, shape, dtype, group):
    B, H, Sq, Sk = shape
    run_and_check(kernel, B, H, H // group, Sq, Sk, 64, None, dtype)


@dtype_param
@pytest.mark.parametrize("mode", ["top_left", "bottom_right"])
@pytest.mark.parametrize("group", [1, 4], ids=lambda g: f"gqa{g}")
@pytest.mark.parametrize("shape", [KV192_CAUSAL_SHAPE, KV192_CAUSAL_ROWS_SHAPE, KV192_CAUSAL_TALL_SHAPE],
                         ids=shape_id)
@kernel_param
def test_gpu_192_key_tiles_causal(kernel, shape, mode, dtype, group):
    B, H, Sq, Sk = shape
    run_and_check(kernel, B, H, H // group, Sq, Sk, 64, mode, dtype)


# D = 128 grids in the sm90 kernel's ordinary mode and static tile order (not
# key-split, and causal with no more 128-row tiles than SMs or with Sk >= 2048),
# where the producer issues the next tile's Q after a tile's second K/V tile, or
# after its last when it has fewer (Sm90Tile::Q_AHEAD): bottom-right with Sq > Sk
# gives tiles of zero and one K/V tile, Sk = 2100 runs the LONG instantiation
# (run at D = 128 by test_gpu_long_sequences).
Q_AHEAD_SHAPES = [(2, 8, 900, 300), (2, 8, 700, 2100)]


@pytest.mark.parametrize("shape", Q_AHEAD_SHAPES, ids=shape_id)
def test_q_ahead_shapes_run_the_static_order(shape):
    B, H, Sq, Sk = shape
    sms = guard_sms()
    assert -(-Sq // 64) * B * H > sms, "more 64-row tiles than SMs: not key-split"
    assert -(-Sq // 128) * B * H <= sms or Sk >= 2048, "causal calls keep the static order"



@dtype_param
@mode_param
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("shape", SHAPES + LARGE_GRID_SHAPES, ids=shape_id)
@kernel_param
def test_gpu_matches_reference(kernel, shape, D, mode, dtype):
    B, H, Sq, Sk = shape
    run_and_check(kernel, B, H, H, Sq, Sk, D, mode, dtype)


@dtype_param
@mode_param
@pytest.mark.parametrize("D", [8, 40, 72, 96, 200])
@pytest.mark.parametrize("shape", [(2, 4, 97, 97), (2, 4, 113, 203), (2, 4, 203, 113), (1, 2, 1025, 1025)],
                         ids=shape_id)
@kernel_param
def test_gpu_odd_head_dims(kernel, shape, D, mode, dtype):
    B, H, Sq, Sk = shape
    run_and_check(kernel, B, H, H, Sq, Sk, D, mode, dtype)


@pytest.mark.parametrize("variant", [(torch.float16, "bottom_right"), (torch.bfloat16, None),
                                     (torch.float16, "top_left")],
                         ids=["fp16-bottom_right", "bf16-nocausal", "fp16-top_left"])
@pytest.mark.parametrize("D", list(range(8, 257, 8)))
@kernel_param
def test_gpu_every_head_dim(kernel, D, variant):
    dtype, mode = variant
    run_and_check(kernel, 1, 4, 2, 97, 131, D, mode, dtype)


LAYOUTS = [
    ("transposed", "transposed", "transposed"),
    ("sliced", "sliced", "sliced"),
    ("sliced_hi", "batch_step", "sliced"),
    ("transposed", "sliced", "contiguous"),
    ("batch_step", "expanded", "expanded"),
]


@dtype_param
@mode_param
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("layouts", LAYOUTS, ids=lambda l: "-".join(l))
@kernel_param
def test_gpu_strided_inputs(kernel, layouts, D, mode, dtype):
    q, k, v = make_qkv(2, 4, 4, 113, 203, D, dtype, DEV, layouts=layouts)
    assert q.stride(-1) == k.stride(-1) == v.stride(-1) == 1
    out, lse = run_poisoned(q, k, v, mode, kernel=kernel)
    check_attention(out, lse, q, k, v, None, mode)
    # strides change addressing only: same bits as on contiguous copies
    out_c, lse_c = call(q.contiguous(), k.contiguous(), v.contiguous(), mode, kernel=kernel)
    assert torch.equal(out, out_c)
    assert torch.equal(lse, lse_c)


@pytest.mark.parametrize("mode", [None, "top_left", "bottom_right"])
@pytest.mark.parametrize("layouts", [LAYOUTS[0], LAYOUTS[2]], ids=lambda l: "-".join(l))
@kernel_param
def test_gpu_192_key_tiles_strided(kernel, layouts, mode):
    """Strided views on the 192-key tiles: non-causal with a lead tile (its TMA rows
    before key 0), causal in the dynamic order for its rows."""
    B, H, Sq, Sk = KV192_SHAPES[0] if mode is None else KV192_CAUSAL_ROWS_SHAPE
    q, k, v = make_qkv(B, H, H, Sq, Sk, 64, torch.float16, DEV, layouts=layouts)
    out, lse = run_poisoned(q, k, v, mode, kernel=kernel)
    check_attention(out, lse, q, k, v, None, mode)
    out_c, lse_c = call(q.contiguous(), k.contiguous(), v.contiguous(), mode, kernel=kernel)
    assert torch.equal(out, out_c)
    assert torch.equal(lse, lse_c)


@dtype_param
@mode_param
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("seq", [(97, 203), (203, 97), (512, 512)], ids=lambda s: f"q{s[0]}k{s[1]}")
@pytest.mark.parametrize("heads", [(8, 1), (8, 2), (8, 4), (6, 3)], ids=lambda h: f"hq{h[0]}hkv{h[1]}")
@kernel_param
def test_gpu_gqa(kernel, heads, seq, D, mode, dtype):
    Hq, Hkv = heads
    Sq, Sk = seq
    q, k, v = make_qkv(2, Hq, Hkv, Sq, Sk, D, dtype, DEV)
    out, lse = run_poisoned(q, k, v, mode, kernel=kernel, enable_gqa=True)
    check_attention(out, lse, q, k, v, None, mode)


@dtype_param
@mode_param
@pytest.mark.parametrize("scale,mult", [(0.05, 1.0), (0.5, 1.0), (2.0, 1.0), (None, 8.0)],
                         ids=["s0.05", "s0.5", "s2", "big_logits"])
@kernel_param
def test_gpu_scale_and_large_logits(kernel, scale, mult, mode, dtype):
    q, k, v = make_qkv(2, 4, 4, 257, 300, 64, dtype, DEV, mult=mult)
    out, lse = run_poisoned(q, k, v, mode, kernel=kernel, scale=scale)
    check_attention(out, lse, q, k, v, scale, mode)


@dtype_param
@mode_param
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("ramp", [0.5, 3.0, -3.0], ids=lambda r: f"ramp{r:+g}")
@kernel_param
def test_gpu_row_max_moves(kernel, ramp, D, mode, dtype):
    """Key norms grow along Sk (ramp > 0) or shrink (ramp < 0), so a row's
    running max rises across K/V tiles by small and by large steps (2-7 moves
    of more than 2^8 per row with ramp 3), where N(0, 1) inputs move it by
    small steps only: the O rescale at tile boundaries, with large factors.
    A softmax whose max lags the row's (the lazy-max experiment, perf notes,
    session 15) measured 2.6x SDPA's error here."""
    Sk = 1000
    q, k, v = make_qkv(2, 4, 4, 300, Sk, D, dtype, DEV)
    tiles = torch.arange(Sk, device=DEV, dtype=torch.float32) / 64  # position in 64-key tiles
    if ramp < 0:
        tiles = tiles.flip(0)
    k = (k.float() * (1 + abs(ramp) * tiles)[:, None]).to(dtype)
    out, lse = run_poisoned(q, k, v, mode, kernel=kernel)
    check_attention(out, lse, q, k, v, None, mode)


# D = 256 (one Q buffer): each consumer's 64 rows of Q load and are released on a
# barrier pair of their own (Sm90Tile::Q_HALVES), so in causal tiles the consumer of
# the first rows, which runs fewer K/V tiles, starts its next tile without waiting
# for the other. Bottom-right with Sq > Sk gives tiles in which one consumer has no
# K/V tile and the other has one. The first shape runs the static tile order, the
# second the dynamic one (causal calls), the third has Sk >= 2048. Run at D = 256 by
# test_gpu_long_sequences.
Q_HALVES_SHAPES = [(2, 8, 900, 300), (4, 16, 900, 300), (2, 8, 700, 2100)]


@pytest.mark.parametrize("shape", Q_HALVES_SHAPES, ids=shape_id)
def test_q_halves_shapes_cover_both_tile_orders(shape):
    B, H, Sq, Sk = shape
    sms = guard_sms()
    dynamic = Sk < 2048 and -(-Sq // 128) * B * H > sms  # fc_sm90_dynamic_order (kernels.h), causal
    assert dynamic == (shape == Q_HALVES_SHAPES[1])


LONG_SHAPES = [(1, 2, 1, 8192), (1, 2, 4096, 4096), (1, 1, 2048, 8192), (1, 2, 8192, 1024), (2, 8, 600, 2100)]


@dtype_param
@mode_param
@pytest.mark.parametrize("shape,D", [(s, 128) for s in LONG_SHAPES + Q_AHEAD_SHAPES] +
                         [(s, 256) for s in Q_HALVES_SHAPES],
                         ids=lambda x: f"D{x}" if isinstance(x, int) else shape_id(x))
@kernel_param
def test_gpu_long_sequences(kernel, shape, D, mode, dtype):
    B, H, Sq, Sk = shape
    run_and_check(kernel, B, H, H, Sq, Sk, D, mode, dtype)


# sm90 CTA pairs (two CTAs of a cluster sharing each K/V tile by multicast TMA;
# sm90_cluster_min_sk in attn_fwd_sm90_launch.cuh): D = 128 from Sk = 4096, D = 256
# from 2048, when a head's 128-row query blocks pair up evenly and the call is not
# key-split. The first shape ends in a partial query block, the second has Sq > Sk
# (bottom-right rows that see no key); the last has more pair tiles (192) than an
# H100 has clusters (66), so its causal calls take the host-planned order (Sm90Plan);
# group = 2 makes them GQA.
CLUSTER_SHAPES = [((2, 8, 700, 4200), 128), ((1, 2, 4352, 4100), 128), ((2, 8, 768, 2100), 256),
                  ((1, 4, 2048, 2048), 256), ((2, 16, 1500, 2100), 256)]
CLUSTER_MIN_SK = {128: 4096, 256: 2048}


@pytest.mark.parametrize("shape,D", CLUSTER_SHAPES, ids=lambda x: f"D{x}" if isinstance(x, int) else shape_id(x))
def test_cluster_shapes_run_cta_pairs(shape, D):
    B, H, Sq, Sk = shape
    sms = guard_sms()
    assert Sk >= CLUSTER_MIN_SK[D] and -(-Sq // 128) % 2 == 0
    assert D > 128 or -(-Sq // 64) * B * H > sms, "key-split mode (D <= 128) takes grids this small"


@dtype_param
@mode_param
@pytest.mark.parametrize("shape,D", CLUSTER_SHAPES, ids=lambda x: f"D{x}" if isinstance(x, int) else shape_id(x))
@pytest.mark.parametrize("group", [1, 2])
@kernel_param
def test_gpu_cta_pairs(kernel, shape, D, mode, dtype, group):
    B, H, Sq, Sk = shape
    run_and_check(kernel, B, H, H // group, Sq, Sk, D, mode, dtype)


# Non-causal D = 128 CTA pairs whose last, partial stripe of pair tiles is split
# by key ranges across the clusters (the split tail, csrc/sm90/attn_sm90_tail.cuh):
# (B, H, Sq, Sk), D. The first has tiles of three pieces, the second D < 128.
TAIL_SHAPES = [((2, 9, 1000, 6000), 128), ((2, 12, 1000, 4500), 96)]


def tail_pieces(B, H, Sq, Sk, clusters):
    """The launcher's rule (sm90_tail in attn_fwd_sm90_launch.cuh): the most pieces
    of one tile, or 0 when the tail is not split."""
    tiles, n_kv = -(-Sq // 256) * B * H, -(-Sk // 128)
    stripes, r = divmod(tiles, clusters)
    w = max(-(-(r * n_kv) // clusters), (n_kv + 1) // 2)
    if stripes < 1 or r == 0 or w > n_kv - 4:
        return 0
    return max((q * n_kv + n_kv - 1) // w - q * n_kv // w + 1 for q in range(r))


@pytest.mark.parametrize("shape,D", TAIL_SHAPES, ids=lambda x: f"D{x}" if isinstance(x, int) else shape_id(x))
def test_tail_shapes_split(shape, D):
    B, H, Sq, Sk = shape
    sms = guard_sms()
    assert Sk >= CLUSTER_MIN_SK[128] and -(-Sq // 128) % 2 == 0, "CTA pairs"
    assert tail_pieces(B, H, Sq, Sk, sms // 2) >= 2, "no split tail on this GPU (one cluster per two SMs)"


@dtype_param
@pytest.mark.parametrize("shape,D", TAIL_SHAPES, ids=lambda x: f"D{x}" if isinstance(x, int) else shape_id(x))
@pytest.mark.parametrize("group", [1, 3])
@kernel_param
def test_gpu_split_tail(kernel, shape, D, dtype, group):
    B, H, Sq, Sk = shape
    run_and_check(kernel, B, H, H // group, Sq, Sk, D, None, dtype)


@dtype_param
@mode_param
@pytest.mark.parametrize("shape", [(4, 8, 2000, 2000), (4, 8, 1700, 1900)], ids=shape_id)
@kernel_param
def test_gpu_causal_partial_blocks(kernel, shape, mode, dtype):
    """D = 64 with enough rows for the sm90 kernel's 192-row tiles, whose causal
    query blocks end at the last row: the first block holds the padding rows."""
    B, H, Sq, Sk = shape
    run_and_check(kernel, B, H, H, Sq, Sk, 64, mode, dtype)


@dtype_param
@pytest.mark.parametrize("shape", [(65535, 1, 1, 8, 8), (1, 65535, 65535, 8, 8), (1, 65535, 5, 8, 8),
                                   (2, 40000, 8, 3, 5), (300, 300, 1, 2, 3)],
                         ids=lambda s: "B{}Hq{}Hkv{}_q{}k{}".format(*s))
@kernel_param
def test_gpu_large_grid(kernel, shape, dtype):
    """B and Hq up to 65535 each (CUDA's gridDim.y/z limit) and B*Hq far
    above it must run correctly."""
    B, Hq, Hkv, Sq, Sk = shape
    q, k, v = make_qkv(B, Hq, Hkv, Sq, Sk, 64, dtype, DEV)
    out, lse = run_poisoned(q, k, v, "top_left", kernel=kernel)
    check_attention(out, lse, q, k, v, None, "top_left")


@pytest.mark.parametrize("shape", [(65536, 1, 1, 8, 8), (1, 65536, 1, 8, 8), (70000, 2, 2, 4, 4)],
                         ids=lambda s: "B{}Hq{}Hkv{}_q{}k{}".format(*s))
@kernel_param
def test_gpu_grid_limit_correct_or_rejected(kernel, shape):
    """Past 65535 batches or heads: either a correct result or a ValueError
    that says how to split the call; never a silent wrong answer or a crash."""
    B, Hq, Hkv, Sq, Sk = shape
    q, k, v = make_qkv(B, Hq, Hkv, Sq, Sk, 64, torch.float16, DEV)
    try:
        out, lse = call(q, k, v, None, kernel=kernel)
        torch.cuda.synchronize()
    except ValueError as e:
        assert re.search(r"65535|split", str(e)), str(e)
        torch.cuda.synchronize()
        return
    check_attention(out, lse, q, k, v, None, None)


@pytest.mark.parametrize("case", [
    (2, 8, 512, 512, 64, None, torch.float16),
    (2, 3, 1025, 1025, 128, "top_left", torch.bfloat16),
    (1, 4, 17, 4, 256, "bottom_right", torch.float16),
    (3, 2, 1, 1000, 40, "bottom_right", torch.bfloat16),
], ids=lambda c: "B{}H{}_q{}k{}_D{}_{}_{}".format(*c[:5], mode_id(c[5]), dtype_id(c[6])))
@kernel_param
def test_gpu_poisoned_output_fully_written(kernel, case):
    """out and lse are filled with NaN before the launch (the suite's poison
    switch): every element must have been written, with and without lse."""
    B, H, Sq, Sk, D, mode, dtype = case
    q, k, v = make_qkv(B, H, H, Sq, Sk, D, dtype, DEV)
    out, lse = run_poisoned(q, k, v, mode, kernel=kernel)
    assert not torch.isnan(out).any(), "out has NaN: some elements were never written"
    assert not torch.isnan(lse).any(), "lse has NaN: some elements were never written"
    check_attention(out, lse, q, k, v, None, mode)
    out2 = call(q, k, v, mode, kernel=kernel, return_lse=False)
    torch.cuda.synchronize()
    assert isinstance(out2, torch.Tensor)
    assert not torch.isnan(out2).any()
    check_attention(out2, None, q, k, v, None, mode)


@pytest.mark.parametrize("case", [
    (2, 8, 512, 512, 64, "top_left", torch.float16),
    (1, 4, 1025, 1023, 128, "bottom_right", torch.bfloat16),
    (2, 8, 97, 203, 256, None, torch.float16),
    # 160 query blocks of 128 rows: the sm80 D = 64 pipelined ring, not its small-grid variant
    (2, 16, 640, 700, 64, "top_left", torch.float16),
    # sm90 CTA pairs (CLUSTER_SHAPES)
    (2, 8, 768, 4200, 128, "bottom_right", torch.bfloat16),
    # sm90 D = 128 non-causal CTA pairs with a split tail, tiles of three pieces (TAIL_SHAPES)
    (2, 9, 1000, 6000, 128, None, torch.float16),
    # sm90 D = 256 causal CTA pairs in the host-planned order (CLUSTER_SHAPES)
    (2, 16, 1500, 2100, 256, "bottom_right", torch.float16),
    # sm90 D = 128 causal on 192-row tiles (WIDE_SHAPES)
    (2, 16, 600, 2100, 128, "top_left", torch.float16),
    # sm90 D = 64 causal in the dynamic order, windows capped to the L2 (WIDE_SHAPES)
    (4, 32, 550, 2300, 64, "bottom_right", torch.float16),
    # sm90 D = 64 on 192-row tiles: two consumers of padding rows skip each head's last block
    (4, 16, 1000, 300, 64, None, torch.bfloat16),
    # sm90 D = 64 non-causal on 192-key K/V tiles (KV192_SHAPES)
    (2, 32, 1000, 3000, 64, None, torch.float16),
    # sm90 D = 64 causal in the dynamic order on 192-key K/V tiles (KV192_CAUSAL_SHAPE)
    (4, 16, 768, 8192, 64, "bottom_right", torch.bfloat16),
], ids=lambda c: "B{}H{}_q{}k{}_D{}_{}_{}".format(*c[:5], mode_id(c[5]), dtype_id(c[6])))
@kernel_param
def test_gpu_deterministic(kernel, case):
    """20 runs on the same inputs give bit-identical out and lse (no races)."""
    B, H, Sq, Sk, D, mode, dtype = case
    q, k, v = make_qkv(B, H, H, Sq, Sk, D, dtype, DEV)
    out0, lse0 = call(q, k, v, mode, kernel=kernel)
    for i in range(20):
        out, lse = call(q, k, v, mode, kernel=kernel)
        assert torch.equal(out, out0), f"run {i + 1} differs from run 0"
        assert torch.equal(lse, lse0), f"lse of run {i + 1} differs from run 0"
    check_attention(out0, lse0, q, k, v, None, mode)


@dtype_param
@mode_param
@pytest.mark.parametrize("shape", [(2, 8, 512, 512, 64), (1, 4, 1, 1000, 128), (2, 4, 203, 113, 256)],
                         ids=lambda s: "B{}H{}_q{}k{}_D{}".format(*s))
def test_gpu_auto_kernel(shape, mode, dtype):
    B, H, Sq, Sk, D = shape
    q, k, v = make_qkv(B, H, H, Sq, Sk, D, dtype, DEV)
    picked = _C.picked_kernel(q, k)
    assert picked in ("sm80", "sm90"), picked
    if picked == "sm90":
        assert torch.cuda.get_device_capability() == (9, 0)
    out, lse = run_poisoned(q, k, v, mode, kernel="auto")
    check_attention(out, lse, q, k, v, None, mode)
    # the default kernel is auto
    out_default = flashcore.attention(q, k, v, causal=mode is not None,
                                      causal_alignment=mode or "top_left")
    torch.testing.assert_close(out_default, out, atol=0, rtol=0)


@kernel_param
def test_gpu_sdpa_drop_in(kernel):
    """The SDPA calling convention works positionally and gives SDPA's answer."""
    q, k, v = make_qkv(2, 8, 8, 512, 512, 64, torch.float16, DEV)
    out = flashcore.attention(q, k, v, None, 0.0, True, None, False, kernel=kernel)
    sd = torch.nn.functional.scaled_dot_product_attention(q, k, v, None, 0.0, True)
    assert torch.allclose(out, sd, atol=1e-3, rtol=1e-3)


@kernel_param
def test_gpu_non_default_stream(kernel):
    """The kernel runs on the current stream: on a busy side stream, it must
    wait for the work queued before it there (it would read NaN otherwise)."""
    q, k, v = make_qkv(2, 8, 8, 1024, 1024, 128, torch.float16, DEV)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        q2 = torch.full_like(q, float("nan"))
        a = torch.randn(4096, 4096, device=DEV, dtype=torch.float16)
        for _ in range(20):  # keep the side stream busy for a while
            a = (a @ a).clamp_(-1, 1)
        q2.copy_(q)
        out, lse = call(q2, k, v, "top_left", kernel=kernel)
    torch.cuda.current_stream().wait_stream(side)
    for t in (q2, out, lse):
        t.record_stream(torch.cuda.current_stream())
    torch.cuda.synchronize()
    check_attention(out, lse, q, k, v, None, "top_left")


@kernel_param
def test_gpu_cuda_graph_capture(kernel):
    """No synchronization or allocation inside the library: the call can be
    captured in a CUDA graph and replayed on new inputs."""
    q, k, v = make_qkv(1, 4, 2, 300, 500, 64, torch.bfloat16, DEV)
    sq, sk, sv = q.clone(), k.clone(), v.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside capture
        for _ in range(2):
            call(sq, sk, sv, "bottom_right", kernel=kernel)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        gout, glse = call(sq, sk, sv, "bottom_right", kernel=kernel)
    q2, k2, v2 = make_qkv(1, 4, 2, 300, 500, 64, torch.bfloat16, DEV)
    sq.copy_(q2)
    sk.copy_(k2)
    sv.copy_(v2)
    g.replay()
    torch.cuda.synchronize()
    check_attention(gout, glse, q2, k2, v2, None, "bottom_right")


@pytest.mark.skipif("sm90" not in GPU_KERNELS, reason="needs the sm90 kernel (an H100/H200)")
def test_gpu_dynamic_order_kept_counter():
    """Causal sm90 calls in the dynamic tile order draw their tiles from a
    16-byte counter that the binding keeps zero per stream (no memset per call:
    the kernel's last ticket zeroes it again). Back-to-back calls on one stream,
    calls on two streams at once, and a captured graph (which takes fresh
    scratch, zeroed by its own launch) replayed between eager calls all give
    the right answer, and reruns are bit-identical."""
    B, H, S, D = 4, 16, 1000, 128  # 8 x 64 = 512 tiles of 128 rows: the dynamic order
    assert -(-S // 128) * B * H > torch.cuda.get_device_properties(DEV).multi_processor_count
    q, k, v = make_qkv(B, H, H, S, S, D, torch.float16, DEV)
    first, lse = call(q, k, v, "top_left")
    for _ in range(3):
        out, _ = call(q, k, v, "top_left")
        assert torch.equal(out, first)
    check_attention(first, lse, q, k, v, None, "top_left")
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    inputs = [make_qkv(B, H, H, S, S, D, torch.float16, DEV) for _ in streams]
    outs = [None, None]
    for st in streams:
        st.wait_stream(torch.cuda.current_stream())
    for _ in range(3):  # both streams' launches in flight together
        for i, st in enumerate(streams):
            with torch.cuda.stream(st):
                outs[i] = call(*inputs[i], "top_left")
    for st in streams:
        torch.cuda.current_stream().wait_stream(st)
    for i in range(2):
        check_attention(*outs[i], *inputs[i], None, "top_left")
    sq, sk, sv = q.clone(), k.clone(), v.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call(sq, sk, sv, "top_left")
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        gout, _ = call(sq, sk, sv, "top_left")
    for _ in range(2):
        g.replay()
        eager, _ = call(q, k, v, "top_left")
        assert torch.equal(eager, first)
    torch.cuda.synchronize()
    assert torch.equal(gout, first)


@kernel_param
def test_gpu_inputs_not_modified(kernel):
    q, k, v = make_qkv(2, 4, 2, 203, 113, 128, torch.float16, DEV)
    qc, kc, vc = q.clone(), k.clone(), v.clone()
    call(q, k, v, "bottom_right", kernel=kernel)
    torch.cuda.synchronize()
    assert torch.equal(q, qc) and torch.equal(k, kc) and torch.equal(v, vc)


@kernel_param
def test_gpu_fully_masked_rows(kernel):
    """bottom_right with Sq > Sk: the first Sq - Sk rows see no key."""
    for dtype in DTYPES:
        q, k, v = make_qkv(2, 4, 2, 300, 100, 64, dtype, DEV)
        out, lse = run_poisoned(q, k, v, "bottom_right", kernel=kernel)
        assert (out[:, :, :200] == 0).all()
        assert torch.isneginf(lse[:, :, :200]).all()
        assert torch.isfinite(lse[:, :, 200:]).all()
        # row 200 sees key 0 alone
        assert torch.equal(out[:, :, 200], v.repeat_interleave(2, 1)[:, :, 0])
        check_attention(out, lse, q, k, v, None, "bottom_right")


@kernel_param
def test_gpu_misaligned_pointer_is_rejected(kernel):
    """Views that break 16-byte alignment (offset of one element, row stride
    D+1): a ValueError naming q and the fix, never a crash; the same values
    made contiguous run."""
    D = 64
    base = torch.randn(2, 4, 97, D + 1, device=DEV).to(torch.float16)
    q = base[..., 1:]
    k, v = make_qkv(2, 4, 4, 97, 97, D, torch.float16, DEV)[1:]
    with pytest.raises(ValueError, match=r"q: data pointer is not 16-byte aligned.*q\.contiguous\(\)"):
        call(q, k, v, "top_left", kernel=kernel)
    q = q.contiguous()
    out, lse = call(q, k, v, "top_left", kernel=kernel)
    check_attention(out, lse, q, k, v, None, "top_left")


@kernel_param
def test_gpu_output_tensors(kernel):
    """Output and lse are fresh tensors on q's device with the right shapes,
    even for transposed inputs."""
    q, k, v = make_qkv(2, 4, 4, 33, 65, 64, torch.float16, DEV, layouts=("transposed",) * 3)
    out, lse = call(q, k, v, None, kernel=kernel)
    assert out.shape == (2, 4, 33, 64) and out.device == q.device and out.dtype == torch.float16
    assert lse.shape == (2, 4, 33) and lse.device == q.device and lse.dtype == torch.float32


def test_gpu_kernel_list():
    """The Hopper kernel is tested wherever it can run: on compute capability
    9.0 a build whose sm90 kernel fails its probe call (conftest) fails here,
    rather than the suite leaving it out (FC_TESTS_ALLOW_NO_SM90=1 accepts a
    build made without sm_90a)."""
    assert KERNELS[0] == "sm80"
    if torch.cuda.get_device_capability() != (9, 0):
        assert KERNELS == ["sm80"]
    elif os.environ.get("FC_TESTS_ALLOW_NO_SM90") != "1":
        assert KERNELS == ["sm80", "sm90"], "the sm90 kernel did not run on this compute capability 9.0 GPU"
        assert _C.picked_kernel(*make_qkv(1, 1, 1, 128, 128, 64, torch.float16, DEV)[:2]) == "sm90"
    assert _C.arch_reason(flashcore.KERNELS["sm80"], *torch.cuda.get_device_capability()) == ""


def test_gpu_reference_helper():
    """Sanity check of the reference helper on the GPU against SDPA in fp64."""
    q, k, v = make_qkv(2, 4, 2, 97, 131, 64, torch.float32, DEV)
    for mode in CAUSAL_MODES:
        out, lse = ref_attention(q, k, v, None, mode)
        kk, vv = k.double().repeat_interleave(2, 1), v.double().repeat_interleave(2, 1)
        mask = visible_mask(97, 131, mode, DEV)
        sd = torch.nn.functional.scaled_dot_product_attention(q.double(), kk, vv, attn_mask=mask)
        torch.testing.assert_close(out.double(), sd, atol=1e-5, rtol=1e-5)
        assert torch.isfinite(lse).all()


# Kept last in the module: an out-of-bounds access here would poison the CUDA
# context for every test after it.
@kernel_param
def test_gpu_zz_offsets_beyond_2_pow_31_elements(kernel):
    """Element offsets past 2^31 (batch stride 2^31) need 64-bit address math."""
    free, _ = torch.cuda.mem_get_info()
    big = 2 ** 31
    if free < 3 * big * 2:
        pytest.skip("needs ~6 GiB of free GPU memory")
    B, H, S, D = 2, 2, 16, 64
    per_batch = H * S * D
    base = torch.empty(big + 3 * per_batch, dtype=torch.float16, device=DEV)
    views = []
    for i in range(3):  # q, k, v: batch 1 starts past element 2^31
        x = base.as_strided((B, H, S, D), (big, S * D, D, 1), storage_offset=i * per_batch)
        x.copy_(torch.randn(B, H, S, D, device=DEV))
        views.append(x)
    q, k, v = views
    for mode in CAUSAL_MODES:
        out, lse = run_poisoned(q, k, v, mode, kernel=kernel)
        check_attention(out, lse, q, k, v, None, mode)
    del base, views, q, k, v
    torch.cuda.empty_cache()
