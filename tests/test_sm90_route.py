"""Which sm90 instantiation each of test_gpu's path shapes runs, asked of the C
launcher itself (_C.sm90_route: the host logic of attn_fwd_sm90_launch.cuh,
no GPU needed) for an H100's 132 SMs. test_gpu's correctness tests run these
shapes to cover those paths; its Python mirrors of the launcher's rules are
checked against the C here over a sweep, so a change to either shows up on
the CPU, in CI.
"""
import itertools

import pytest

from flashcore import _C

import test_gpu as g

pytestmark = pytest.mark.skipif(not hasattr(_C, "sm90_route"), reason="the build has no sm_90a code")

SMS = g.DESIGN_SMS
CAUSAL = {None: 0, "top_left": 1, "bottom_right": 2}


def route(B, H, Sq, Sk, D, mode=None, sms=SMS):
    return _C.sm90_route(B, H, H, Sq, Sk, D, CAUSAL[mode], sms)


def test_standard_grid_routes():
    """The standard grid's shapes at S = 2k-16k, as the perf notes describe them."""
    for S in (2048, 4096, 8192, 16384):
        B = 16384 // S
        assert route(B, 32, S, S, 64) == "kv192"
        for mode in ("top_left", "bottom_right"):
            assert route(B, 32, S, S, 64, mode) == "dyn_kv192"
            assert route(B, 16, S, S, 128, mode) == "dyn_cons3"
            assert route(B, 8, S, S, 256, mode) == "pairs"
        assert route(B, 16, S, S, 128) == ("long" if S == 2048 else "pairs")
        assert route(B, 8, S, S, 256) == "pairs"
    assert route(32, 32, 512, 512, 64) == "cons3" and route(16, 32, 1024, 1024, 64) == "cons3"
    assert route(32, 16, 512, 512, 128, "top_left") == "dyn_cons2"
    assert route(32, 16, 512, 512, 128) == "cons2"
    assert route(1, 8, 512, 512, 64) == "key_split"


@pytest.mark.parametrize("shape", g.LARGE_GRID_SHAPES, ids=g.shape_id)
def test_large_grid_shapes_not_key_split(shape):
    for mode in CAUSAL:
        assert route(*shape, 64, mode) != "key_split"


@pytest.mark.parametrize("shape,D", g.WIDE_SHAPES, ids=lambda x: f"D{x}" if isinstance(x, int) else g.shape_id(x))
def test_wide_shapes_run_three_consumers(shape, D):
    for mode in ("top_left", "bottom_right"):
        r = route(*shape, D, mode)
        if D == 128:
            # bottom-right chunks of fewer than 2048 queries keep two consumers in the static
            # order (fc_sm90_d128_wide), on the long-row kernel (their 5 query blocks do not pair)
            two = mode == "bottom_right" and shape[2] < 2048
            assert r == ("long" if two else "dyn_cons3"), (mode, r)
        else:
            assert r == ("dyn_kv192" if shape == (4, 32, 550, 2300) else "cons3"), (mode, r)


@pytest.mark.parametrize("shape", g.KV192_SHAPES, ids=g.shape_id)
def test_kv192_shapes(shape):
    assert route(*shape, 64) == "kv192"


def test_kv192_causal_shapes():
    for shape in (g.KV192_CAUSAL_SHAPE, g.KV192_CAUSAL_ROWS_SHAPE, g.KV192_CAUSAL_TALL_SHAPE):
        for mode in ("top_left", "bottom_right"):
            assert route(*shape, 64, mode) == "dyn_kv192", (shape, mode)


@pytest.mark.parametrize("shape", g.Q_AHEAD_SHAPES, ids=g.shape_id)
def test_q_ahead_shapes_static_order(shape):
    for mode in CAUSAL:
        assert route(*shape, 128, mode) in ("cons2", "long"), mode


def test_q_halves_shapes_cover_both_orders():
    """D = 256 causal: the dynamic order for the second shape, the static one (single
    CTAs, or CTA pairs from 2048 keys) for the others."""
    for shape, want in zip(g.Q_HALVES_SHAPES, ("cons2", "dyn_cons2", "pairs")):
        assert route(*shape, 256, "top_left") == want, shape


@pytest.mark.parametrize("shape,D", g.CLUSTER_SHAPES + g.TAIL_SHAPES,
                         ids=lambda x: f"D{x}" if isinstance(x, int) else g.shape_id(x))
def test_pair_shapes(shape, D):
    assert route(*shape, D) == "pairs"
    if D > 128:
        for mode in ("top_left", "bottom_right"):
            assert route(*shape, D, mode) == "pairs"


SWEEP = list(itertools.product((1, 2, 4, 8), (4, 16, 32), (300, 550, 1000, 2100, 4100), (300, 2048, 2300, 8192)))


def test_mirrors_agree_with_the_launcher():
    """test_gpu's Python mirrors (three consumers, the D = 64 dynamic order, 192-key
    tiles) give the launcher's answers on a sweep of shapes."""
    for B, H, Sq, Sk in SWEEP:
        for mode in CAUSAL:
            r64 = route(B, H, Sq, Sk, 64, mode)
            key_split = -(-Sq // 64) * B * H <= SMS
            if key_split:
                assert r64 == "key_split"
                continue
            cons3 = g.uses_three_consumers(B, H, Sq, SMS)
            assert (r64 in ("cons3", "kv192", "dyn_cons3", "dyn_kv192")) == cons3, (B, H, Sq, Sk, mode, r64)
            assert (r64 in ("kv192", "dyn_kv192")) == g.takes_192_key_tiles(B, H, Sq, Sk, mode, SMS), \
                (B, H, Sq, Sk, mode, r64)
            if mode:
                assert r64.startswith("dyn") == g.d64_takes_dynamic_order(B, H, Sq, Sk, SMS, mode), \
                    (B, H, Sq, Sk, mode, r64)


def test_windows_route():
    """A window that hides keys the causal mask shows runs the windowed instantiation at every head dim and
    size (small grids included, which would take key-split mode); one that hides none (each row's window
    reaches key 0) routes as its causal call."""
    for D in (64, 128, 256):
        for B, H, S in ((1, 8, 512), (4, 16, 4096), (1, 32, 16384)):
            # (three consumers at D = 64 where the causal call would take them)
            win = "window3" if D == 64 and g.uses_three_consumers(B, H, S, SMS) else "window"
            for mode in (1, 2):
                assert _C.sm90_route(B, H, H, S, S, D, mode, SMS, (255, 0)) == win
                assert _C.sm90_route(B, H, H, S, S, D, mode, SMS, (-1, 64)) == win  # keys after the diagonal
                assert _C.sm90_route(B, H, H, S, S, D, mode, SMS, (S - 1, 0)) == _C.sm90_route(B, H, H, S, S, D,
                                                                                               mode, SMS)


def test_window3_route():
    """D = 64 windows on three consumers exactly where the grid favours them (sm90_use_cons3's rule), over a
    sweep; test_window's last two cases run that instantiation (padding rows in whole warpgroups)."""
    seen = set()
    for B, H, Sq, Sk in itertools.product((1, 2, 4), (8, 16, 32), (100, 511, 1537, 2000, 4096, 9000), (1601, 1900)):
        for mode, w in ((2, (700, 100)), (1, (-1, 64)), (1, (255, 0)), (2, (1000, 0))):
            r = _C.sm90_route(B, H, H // 4, Sq, Sk, 64, mode, SMS, w)
            if r not in ("window", "window3"):  # (a window that hides nothing its causal mode shows)
                assert r == _C.sm90_route(B, H, H // 4, Sq, Sk, 64, mode, SMS), (B, H, Sq, Sk, mode, w)
                continue
            assert r == ("window3" if g.uses_three_consumers(B, H, Sq, SMS) else "window"), (B, H, Sq, Sk, mode, w)
            seen.add(r)
    assert seen == {"window", "window3"}
    assert _C.sm90_route(4, 16, 4, 1537, 1601, 64, 2, SMS, (700, 100)) == "window3"
    assert _C.sm90_route(4, 16, 4, 2000, 1900, 64, 1, SMS, (-1, 64)) == "window3"


def test_mla_routes():
    """v's own head dim: 128 < D <= 192 with Dv <= 128 runs MLA's tile (fc_sm90_d192), in the kinds
    test_shapes' MLA cases name (test_v_head_dim_native_orders); a wider v, or D = 256, runs D = 256's
    kernels, the CTA pairs among them (test_v_head_dim_pairs)."""
    assert _C.sm90_route(2, 16, 16, 1000, 1000, 192, 1, SMS, None, 128) == "d192:dyn_cons2"
    assert _C.sm90_route(1, 8, 8, 2000, 1500, 192, 0, SMS, None, 128) == "d192:cons2"
    assert _C.sm90_route(2, 8, 8, 1100, 1300, 192, 2, SMS, (300, 0), 128) == "d192:window"
    assert _C.sm90_route(3, 12, 12, 700, 700, 192, 0, SMS, None, 128) == "d192:cons2"
    assert _C.sm90_route(3, 12, 12, 700, 700, 136, 0, SMS, None, 8) == "d192:cons2"
    for D, Dv in ((192, 136), (192, 0), (256, 128), (128, 64)):  # (D <= 128 never takes its own Dv)
        r = _C.sm90_route(2, 8, 8, 256, 4096, D, 1, SMS, None, Dv)
        assert r == route(2, 8, 256, 4096, D, "top_left") and not r.startswith("d192"), (D, Dv, r)
    assert _C.sm90_route(2, 8, 8, 256, 4096, 256, 1, SMS, None, 64) == "pairs"
    with pytest.raises(ValueError, match="Dv in 0..D"):
        _C.sm90_route(2, 8, 8, 256, 4096, 128, 1, SMS, None, 136)
