"""CPU checks of benchmarks/clocks.py's shape syntax and benchmarks/ncu_compare.py's
reading of ncu's CSV (no GPU, no ncu: a saved CSV in ncu's format)."""
import importlib.util
import pathlib
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"


def load(name):
    sys.path.insert(0, str(BENCH))  # clocks.py imports bench.py by name
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(BENCH))


clocks = load("clocks")
ncu_compare = load("ncu_compare")


def test_clock_shapes_take_a_dtype():
    a, b = clocks.parse_shapes("128:2048:0:bf16,64:4096:1")
    assert (a["D"], a["Sq"], a["causal"], a["dtype"], a["B"], a["Hq"]) == (128, 2048, False, "bf16", 8, 16)
    assert (b["D"], b["Sq"], b["causal"], b["dtype"], b["B"], b["Hq"]) == (64, 4096, True, "fp16", 4, 32)


@pytest.mark.parametrize("bad", ["128:2048", "128:2048:0:fp8", "128:2048:0:fp16:x"])
def test_clock_shapes_refuse_a_bad_item(bad):
    with pytest.raises(SystemExit, match=bad):
        clocks.parse_shapes(bad)


HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
          '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def csv_row(kid, kernel, metric, value):
    return (f'"{kid}","1","python","h","{kernel}","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0",'
            f'"Command line profiler metrics","{metric}","","{value}"')


def fake_run(kernels_per_call):
    """ncu's output for calls each running the given kernels: the child's lines, then the CSV."""
    lines, rows, kid = [], [HEADER], 0
    for i, names in enumerate(kernels_per_call):
        lines.append(f"PROFILED\tgrid fp16 shape{i}\timpl{i}")
        for name in names:
            rows.append(csv_row(kid, name, "gpu__time_duration.sum", f"{1000 * (kid + 1):,}"))
            rows.append(csv_row(kid, name, "sm__cycles_elapsed.avg.per_second", "1,600,000,000"))
            kid += 1
    return "\n".join(["==PROF== Connected to process 1"] + lines + rows) + "\n"


def test_ncu_report_matches_calls_to_kernels(capsys):
    assert ncu_compare.report(fake_run([["kernA"], ["kernB"]])) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("grid fp16 shape0") and "impl0" in out[1] and "kernA" in out[1]
    assert out[2].startswith("grid fp16 shape1") and "kernB" in out[2]
    assert out[1].split()[4:6] == ["1.0", "1600.0"]  # us from ns, MHz from Hz
    assert out[2].split()[4] == "2.0"


def test_ncu_report_does_not_guess_when_a_call_ran_two_kernels(capsys):
    ncu_compare.report(fake_run([["kernA", "memset"], ["kernB"]]))
    out = capsys.readouterr().out
    assert "3 kernels in 2 profiled calls" in out and "shape0" not in out


def test_ncu_report_lists_and_sums_the_kernels_of_one_call(capsys):
    # One ncu process per (shape, impl) (main): a backward call's three kernels all get its label.
    ncu_compare.report(fake_run([["prep", "main", "post"]]) + ncu_compare.RUN_SEP + fake_run([["kernB"]]))
    out = capsys.readouterr().out.splitlines()
    assert [ln.split()[-1] for ln in out[1:4]] == ["prep", "main", "post"]
    assert all(ln.startswith("grid fp16 shape0") for ln in out[1:5])
    assert out[4].split()[4] == "6.0" and "sum of the call's 3 kernels" in out[4]  # 1 + 2 + 3 us
    assert out[5].startswith("grid fp16 shape0") and out[5].split()[-1] == "kernB"
