"""CPU checks of benchmarks/bench.py's FLOP counts (the TFLOP/s it reports)."""
import importlib.util
import json
import pathlib

import pytest
import torch

_spec = importlib.util.spec_from_file_location(
    "bench", pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "bench.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def visible_pairs(Sq, Sk, lower_right, left=None):
    """Query-key pairs a causal mask (with a window: left keys before the diagonal) lets through,
    counted on the mask itself."""
    i = torch.arange(Sq)[:, None]
    j = torch.arange(Sk)[None, :]
    d = Sk - Sq if lower_right else 0
    vis = j <= i + d
    if left is not None:
        vis &= j >= i + d - left
    return int(vis.sum())


@pytest.mark.parametrize("Sq,Sk", [(4, 4), (5, 9), (9, 5), (1, 7), (64, 640)])
def test_chunk_flops_count_the_bottom_right_mask(Sq, Sk):
    s = bench.shape("chunk", 2, 3, 3, Sq, Sk, 128, True, "fp16")
    assert bench.flops(s) == 4 * 2 * 3 * 128 * visible_pairs(Sq, Sk, True)
    assert "causal-br" in bench.shape_label(s)


def test_square_causal_flops_are_halved():
    s = bench.shape("grid", 2, 3, 3, 64, 64, 128, True, "fp16")
    assert bench.flops(s) == 4 * 2 * 3 * 64 * 64 * 128 / 2
    assert "causal-br" not in bench.shape_label(s)


def test_bwd_flops_are_two_and_a_half_forwards():
    """The bwd suite counts 2.5x the forward's FLOPs (GUIDE section 4), causal halving included."""
    for causal in (False, True):
        g = bench.shape("grid", 2, 16, 16, 4096, 4096, 128, causal, "fp16")
        assert bench.flops(dict(g, suite="bwd")) == 2.5 * bench.flops(g)
    shapes = bench.bwd_shapes(False, None)
    assert shapes and all(s["suite"] == "bwd" and s["D"] in (64, 128, 256) and s["dtype"] == "fp16" for s in shapes)
    assert {s["D"] for s in bench.bwd_shapes(False, {64})} == {64}


def test_chunk_suite_is_bottom_right_with_shorter_chunks():
    shapes = bench.chunk_shapes()
    assert shapes and all(s["causal"] and s["Sq"] < s["Sk"] and bench.bottom_right(s) for s in shapes)


def test_balanced_us_weighs_both_orders_alike():
    # Three forward rounds read 100, two reversed rounds read 110: the median of
    # all five (100) would follow the forward order; balanced_us is halfway.
    assert bench.balanced_us([100.0, 110.0, 100.0, 110.0, 100.0]) == pytest.approx(105.0)
    # Six rounds: each order's median, then their mean.
    assert bench.balanced_us([1.0, 4.0, 2.0, 5.0, 9.0, 6.0]) == pytest.approx((2.0 + 5.0) / 2)
    assert bench.balanced_us([7.0]) == 7.0


def test_round_orders_pair_a_drawn_order_with_its_reverse():
    n, rounds = 7, 6
    orders = bench.round_orders(n, rounds, "grid fp16 B8 H16 S2048 D128")
    assert len(orders) == rounds and all(sorted(o) == list(range(n)) for o in orders)
    for r in range(0, rounds, 2):  # every impl's places in a pair sum to n - 1
        assert orders[r + 1] == orders[r][::-1]
    # repeatable for a key, drawn anew per pair and per key (no fixed neighbours)
    assert orders == bench.round_orders(n, rounds, "grid fp16 B8 H16 S2048 D128")
    assert len({tuple(o) for o in orders[0::2]}) > 1
    assert orders != bench.round_orders(n, rounds, "grid fp16 B8 H16 S4096 D128")
    assert orders != bench.round_orders(n, rounds, "grid fp16 B8 H16 S2048 D128", seed=bench.ORDER_SEED + 1)
    # --order fixed: the listed order, then reversed (the earlier runs' rounds)
    assert bench.round_orders(3, 3, "x", seed=None) == [[0, 1, 2], [2, 1, 0], [0, 1, 2]]


def test_merge_lists_every_call_on_one_commit(tmp_path):
    path = str(tmp_path / "gpu.json")
    row = {"suite": "grid", "impl": "flashcore", "B": 1, "Hq": 1, "Hkv": 1, "Sq": 8, "Sk": 8, "D": 64,
           "causal": False, "dtype": "fp16", "us": 1.0}

    def call(commit, D, wall, dirty=False, ceiling=700):
        meta = {"commit": commit, "dirty": dirty, "suites": ["grid"], "grid_dims": [D], "wall_s": wall,
                "date": "2026-11-26", "matmul_fp16_tflops": ceiling, "copy_TBps": 3.0}
        bench.merge_results(path, meta, [{**row, "D": D}], [])
        with open(path) as f:
            return json.load(f)

    call("a" * 40, 64, 10.0)
    out = call("a" * 40, 128, 20.0)
    assert [c["grid_dims"] for c in out["meta"]["calls"]] == [[64], [128]]
    assert [c["wall_s"] for c in out["meta"]["calls"]] == [10.0, 20.0]
    assert sorted(r["D"] for r in out["rows"]) == [64, 128]
    out = call("b" * 40, 256, 30.0)  # another commit: only this call is listed
    assert [c["grid_dims"] for c in out["meta"]["calls"]] == [[256]]
    out = call("b" * 40, 64, 40.0, dirty=True)  # a dirty tree is not the commit's: not merged into calls
    assert [c["wall_s"] for c in out["meta"]["calls"]] == [40.0]
    call("unknown", 64, 50.0)
    out = call("unknown", 128, 60.0)
    assert [c["wall_s"] for c in out["meta"]["calls"]] == [60.0]
    # FLASHCORE_COMMIT runs (dirty None) on one commit: both calls, both ceilings in the header
    call("c" * 40, 64, 70.0, dirty=None, ceiling=744)
    out = call("c" * 40, 128, 80.0, dirty=None, ceiling=700)
    text = bench.ceilings_text(out["meta"])
    assert "2 calls" in text and "744" in text and "700" in text and "D 64" in text and "D 128" in text


@pytest.mark.parametrize("arg", ["96", "64,x", ",", "64,512"])
def test_grid_dims_refuses_unknown_head_dims(arg, capsys):
    assert bench.main(["--grid-dims", arg, "--suite", "grid"]) == 2
    assert "--grid-dims" in capsys.readouterr().err


def test_det_impls_run_under_deterministic_algorithms_and_restore():
    """A ":det" impl runs inside torch.use_deterministic_algorithms(True) (warn_only off), and the
    setting is restored afterwards; the plain impl runs without it."""
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
    was = torch.are_deterministic_algorithms_enabled()
    seen = []
    for name in ("sdpa-default", "sdpa-default:det"):
        ctx, fn = bench.make_impl(name, q, k, v, False, None, None)
        with ctx():
            seen.append((torch.are_deterministic_algorithms_enabled(),
                         torch.is_deterministic_algorithms_warn_only_enabled()))
            fn()
        assert torch.are_deterministic_algorithms_enabled() == was
    assert seen == [(was, torch.is_deterministic_algorithms_warn_only_enabled()), (True, False)]


def test_det_impls_are_opt_in_and_bwd_only():
    assert not any(n.endswith(":det") for n in bench.DEFAULT_IMPLS)
    assert set(bench.DET_IMPLS) <= set(bench.ALL_IMPLS) and set(bench.DET_IMPLS) <= set(bench.BWD_IMPLS)
    assert "flashcore:det" in bench.DET_IMPLS and "sdpa-cudnn:det" in bench.DET_IMPLS


def test_det_table_ratios():
    shape = dict(suite="bwd", B=4, Hq=32, Hkv=32, Sq=4096, Sk=4096, D=64, causal=False, dtype="fp16")
    rows = [dict(shape, impl=i, tflops=t) for i, t in
            [("flashcore", 450.0), ("flashcore:det", 300.0), ("sdpa-efficient:det", 100.0),
             ("sdpa-flash:det", 150.0), ("sdpa-cudnn", 420.0)]]
    table = bench.det_table(rows).splitlines()
    assert len(table) == 3
    cells = [c.strip() for c in table[2].strip("|").split("|")]
    # shape, fc, fc:det, default:det, cudnn:det, flash:det, efficient:det, det/best det SDPA, det/fc
    assert cells[1:] == ["450", "300", "-", "-", "150", "100", "2.00", "0.67"]


@pytest.mark.parametrize("S,left", [(50, 7), (50, 0), (50, 49), (33, 100)])
def test_window_flops_count_the_band(S, left):
    """A window row counts the pairs its causal band lets through (query i sees keys i - left .. i)."""
    s = dict(bench.shape("window", 2, 3, 1, S, S, 64, True, "fp16"), window=left)
    assert bench.flops(s) == 4 * 2 * 3 * 64 * visible_pairs(S, S, False, left)
    assert bench.flops(dict(s, suite="window-bwd")) == 2.5 * bench.flops(s)
    assert f"causal-w{left + 1}" in bench.shape_label(s)


def test_window_shapes_follow_dims_and_lefts():
    shapes = bench.window_shapes("window", (64, 256), (4095, 1023))
    assert {(s["D"], s["Hq"], s["Hkv"], s["window"]) for s in shapes} == {
        (64, 64, 16, 4095), (64, 64, 16, 1023), (256, 16, 4, 4095), (256, 16, 4, 1023)}
    assert all(s["B"] * s["Sq"] in (16384, 32768) for s in shapes)
    assert {s["Sq"] for s in bench.window_shapes("window-bwd", quick=True)} == {8192}


def test_window_rows_merge_by_their_window(tmp_path):
    """Rows of a window suite are keyed by their window: a new reading of that window replaces them, one
    of another window stands beside them."""
    path = str(tmp_path / "gpu.json")
    old = {"suite": "window", "impl": "flashcore", "B": 2, "Hq": 32, "Hkv": 8, "Sq": 8192, "Sk": 8192,
           "D": 128, "causal": True, "dtype": "fp16", "window": bench.WINDOW_LEFT, "us": 1.0}
    with open(path, "w") as f:
        json.dump({"meta": {"commit": "a" * 40}, "rows": [old]}, f)
    meta = {"commit": "b" * 40, "dirty": False, "suites": ["window"], "date": "2026-11-27"}
    rows = bench.merge_results(path, meta, [dict(old, us=2.0, window=bench.WINDOW_LEFT)], [])
    assert [(r["window"], r["us"]) for r in rows] == [(bench.WINDOW_LEFT, 2.0)]
    rows = bench.merge_results(path, meta, [dict(old, us=3.0, window=1023)], [])
    assert sorted((r["window"], r["us"]) for r in rows) == [(1023, 3.0), (bench.WINDOW_LEFT, 2.0)]
    grid = {k: v for k, v in old.items() if k not in ("causal", "window")}
    rows = bench.merge_results(path, meta, [dict(grid, suite="grid", causal=False)], [])
    assert [r for r in rows if r["suite"] == "grid"][0].get("window") is None  # other suites carry none


@pytest.mark.parametrize("arg", ["-1", "x", ","])
def test_window_left_refuses_bad_lists(arg, capsys):
    assert bench.main(["--window-left", arg, "--suite", "window"]) == 2
    assert "--window-left" in capsys.readouterr().err
