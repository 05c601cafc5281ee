"""CPU checks of benchmarks/bench.py's FLOP counts (the TFLOP/s it reports)."""
import importlib.util
import pathlib

import pytest
import torch

_spec = importlib.util.spec_from_file_location(
    "bench", pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "bench.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def visible_pairs(Sq, Sk, lower_right):
    """Query-key pairs a causal mask lets through, counted on the mask itself."""
    i = torch.arange(Sq)[:, None]
    j = torch.arange(Sk)[None, :]
    return int((j <= i + (Sk - Sq if lower_right else 0)).sum())


@pytest.mark.parametrize("Sq,Sk", [(4, 4), (5, 9), (9, 5), (1, 7), (64, 640)])
def test_chunk_flops_count_the_bottom_right_mask(Sq, Sk):
    s = bench.shape("chunk", 2, 3, 3, Sq, Sk, 128, True, "fp16")
    assert bench.flops(s) == 4 * 2 * 3 * 128 * visible_pairs(Sq, Sk, True)
    assert "causal-br" in bench.shape_label(s)


def test_square_causal_flops_are_halved():
    s = bench.shape("grid", 2, 3, 3, 64, 64, 128, True, "fp16")
    assert bench.flops(s) == 4 * 2 * 3 * 64 * 64 * 128 / 2
    assert "causal-br" not in bench.shape_label(s)


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


@pytest.mark.parametrize("arg", ["96", "64,x", ",", "64,512"])
def test_grid_dims_refuses_unknown_head_dims(arg, capsys):
    assert bench.main(["--grid-dims", arg, "--suite", "grid"]) == 2
    assert "--grid-dims" in capsys.readouterr().err
