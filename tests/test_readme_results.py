"""The README's benchmark figures against the committed results files (CPU, runs in CI).

The README quotes `benchmarks/results/*.json` in tables and sentences; when a results file is re-read
and the README is not updated (or the other way round), these fail and name the figure that differs.
"""
import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
README = (ROOT / "README.md").read_text()


def load(name):
    with open(RESULTS / name) as f:
        return json.load(f)


README_WINDOW_LEFT = 4095  # the README's window table: window=(4095, 0)
WINDOW_FILES = {"window": "window-h100.json", "window-bwd": "window-bwd-h100.json"}  # suite -> its results file


def by_shape(rows, left=README_WINDOW_LEFT):
    """(suite, dtype, D, Sq, Sk, causal, B) -> {impl: TFLOP/s}; window rows of the left edge `left` only."""
    out = {}
    for r in rows:
        if r["suite"].startswith("window") and r["window"] != left:
            continue
        key = (r["suite"], r["dtype"], r["D"], r["Sq"], r["Sk"], r["causal"], r["B"])
        out.setdefault(key, {})[r["impl"]] = r["tflops"]
    return out


def test_forward_table_is_the_results_markdown():
    """The README's forward table is h100.md as bench.py wrote it, under the commit it names."""
    md = (RESULTS / "h100.md").read_text().strip("\n")
    assert md in README, "README's forward table differs from benchmarks/results/h100.md: paste the new one"
    commit = load("h100.json")["meta"]["commit"][:7]
    assert f"`benchmarks/results/h100.{{json,md,png}}`: commit {commit}" in README


def test_forward_shortfall_count():
    """The count of standard-grid shapes at S >= 2k that reach 1.10x cuDNN, and the ratio ranges."""
    ratios = {k: v["flashcore"] / v["sdpa-cudnn"] for k, v in by_shape(load("h100.json")["rows"]).items()
              if k[0] == "grid" and k[3] >= 2048}
    assert len(ratios) == 32
    n = sum(r >= 1.10 for r in ratios.values())
    assert f"**{n} of 32\n  are >= 1.10x" in README or f"**{n} of 32 are >= 1.10x" in README
    nc = [r for k, r in ratios.items() if not k[5]]
    ca = [r for k, r in ratios.items() if k[5]]
    assert f"{min(nc):.3f}-{max(nc):.3f} non-causal, {min(ca):.3f}-{max(ca):.3f} causal" in README


def test_backward_table():
    """The README's fc/cudnn backward table and its ranges from bwd-h100.json, under the commit it names."""
    data = load("bwd-h100.json")
    shapes = by_shape(data["rows"])
    assert f"on commit {data['meta']['commit'][:7]}" in README
    rng = lambda xs, f: f"{f(min(xs))}-{f(max(xs))}"  # noqa: E731
    grid = [v for k, v in shapes.items() if k[0] == "bwd"]
    fc, cu, sm80 = ([v[i] for v in grid] for i in ("flashcore", "sdpa-cudnn", "flashcore:sm80"))
    to_cudnn = [v["flashcore"] / v["sdpa-cudnn"] for v in grid]
    to_flash = [v["flashcore"] / v["sdpa-flash"] for v in grid]
    assert (f"flashcore {rng(fc, '{:.0f}'.format)} TFLOP/s against cuDNN's {rng(cu, '{:.0f}'.format)} and "
            f"{rng(to_flash, '{:.2f}'.format)}x SDPA's flash backend") in README.replace("\n", " ")
    assert f"{rng(sm80, '{:.0f}'.format)} in that run" in README.replace("\n", " ")
    assert (f"Speed on an H100: {min(to_cudnn):.3f}-{max(to_cudnn):.2f}x cuDNN (SDPA's default there) on the "
            f"standard grid, {rng(to_flash, '{:.1f}'.format)}x SDPA's") in README.replace("\n  ", " ")
    for D in (64, 128, 256):
        for causal in (False, True):
            cells = []
            for S in (512, 1024, 2048, 4096, 8192, 16384):
                v = shapes[("bwd", "fp16", D, S, S, causal, 16384 // S)]
                cells.append(f"{v['flashcore'] / v['sdpa-cudnn']:.2f}")
            row = f"| D={D}{' causal' if causal else ''} | " + " | ".join(cells) + " |"
            assert row in README, f"README's backward table lacks {row}"


def _fmt(x):
    return f"{x:.1f}" if x < 100 else f"{x:.0f}"


@pytest.mark.parametrize("suite,name", [("window", "forward"), ("window-bwd", "backward")])
def test_window_table(suite, name):
    """The README's sliding-window table from the suite's results file, under the commit it names."""
    data = load(WINDOW_FILES[suite])
    shapes = by_shape(data["rows"])
    assert f"commit {data['meta']['commit'][:8]}" in README
    seen = 0
    for (s, dtype, D, Sq, Sk, causal, B), v in shapes.items():
        if s != suite:
            continue
        sdpa = max(x for k, x in v.items() if k.startswith("sdpa"))
        row = (f"| {name} D{D} B{B} S{Sq} | {_fmt(v['flashcore'])} | {_fmt(v['flashcore:sm80'])} | {_fmt(sdpa)} | "
               f"{_fmt(v['flex'])} | {v['flashcore'] / sdpa:.2f} | {v['flashcore'] / v['flex']:.2f} |")
        assert row in README, f"README's window table lacks {row}"
        seen += 1
    assert seen == 12


@pytest.mark.parametrize("left", [4095, 1023, 127])
def test_window_summary_ranges(left):
    """The API section's window ranges per head dim and window (TFLOP/s and x FlexAttention); a window the
    backward suite did not read says so."""
    rows = [r for f in WINDOW_FILES.values() for r in load(f)["rows"]]
    shapes = by_shape(rows, left)
    for D in (64, 128, 256):
        cells = []
        for suite in WINDOW_FILES:
            fc = [v["flashcore"] for k, v in shapes.items() if k[0] == suite and k[2] == D]
            fl = [v["flashcore"] / v["flex"] for k, v in shapes.items() if k[0] == suite and k[2] == D]
            cells += [f"{min(fc):.0f}-{max(fc):.0f}", f"{min(fl):.2f}-{max(fl):.2f}"] if fc else ["not read"] * 2
        row = f"  | {D} | {left + 1} | " + " | ".join(cells) + " |"
        assert row in README, f"README's window summary lacks {row.strip()}"


def test_decode_sentence():
    """The decode sentence's times, from h100.json's decode rows."""
    us = {}
    for r in load("h100.json")["rows"]:
        if r["suite"] == "decode" and r["impl"] in ("flashcore", "sdpa-default"):
            us[(r["Sk"], r["B"], r["impl"])] = r["us"]
    assert len(us) == 6  # (three decode shapes, each with both impls)
    for Sk, B in ((32768, 8), (4096, 8), (131072, 1)):
        for impl in ("flashcore", "sdpa-default"):
            assert re.search(rf"\b{us[(Sk, B, impl)]:.1f} us", README), (Sk, B, impl, us[(Sk, B, impl)])
    seq = lambda impl: " / ".join(f"{us[(Sk, B, impl)]:.1f}" for Sk, B in ((4096, 8), (32768, 8), (131072, 1)))  # noqa
    text = README.replace("\n  ", " ")
    assert f"the split-KV kernel {seq('flashcore')} us against SDPA default's {seq('sdpa-default')}" in text


def test_dv_sentence():
    """The API section's D = 192, Dv = 128 ranges: the forward's from dv-h100.json, forward + backward's
    from dv-bwd-h100.json (benchmarks/bench_dv.py; the backward with v's own head dim) and, with the
    backward padded, from dv-h100.json."""
    def spans(name):
        by = {}
        for r in load(name)["rows"]:
            by.setdefault((r["suite"], r["Sq"], r["causal"], r["dtype"]), {})[r["impl"]] = r["tflops"]

        def span(suite, impl, causal=None):
            x = [t["flashcore"] / t[impl] for k, t in by.items() if k[0] == suite and causal in (None, k[2])]
            return f"{min(x):.2f}-{max(x):.2f}x"
        return span
    fwd, both = spans("dv-h100.json"), spans("dv-bwd-h100.json")
    text = " ".join(README.split())
    for want in (f"{fwd('dv', 'sdpa-cudnn')} SDPA's cuDNN backend",
                 f"({fwd('dv', 'sdpa-default')} its default)", f"and {fwd('dv', 'flashcore:padded')} the padded call",
                 f"{both('dv-fwdbwd', 'sdpa-cudnn')} cuDNN", f"(causal {both('dv-fwdbwd', 'sdpa-cudnn', True)},",
                 f"non-causal {both('dv-fwdbwd', 'sdpa-cudnn', False)};",
                 f"{both('dv-fwdbwd', 'flashcore:padded')} the call with v padded by hand",
                 f"{fwd('dv-fwdbwd', 'sdpa-cudnn')} with the backward padded",  # (session 77's run)
                 f"and {both('dv-fwdbwd', 'sdpa-efficient')} SDPA's efficient backend"):
        assert want in text, want
