"""CPU checks of benchmarks/clocks.py's shape syntax, benchmarks/ncu_compare.py's
reading of ncu's CSV (no GPU, no ncu: a saved CSV in ncu's format) and scripts/sanitize.sh's
verdicts (a stand-in compute-sanitizer)."""
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


# scripts/sanitize.sh's verdicts, with a stand-in compute-sanitizer that prints what the real one and the
# harness print (no GPU, no toolkit needed).
FAKE_SANITIZER = """#!/bin/bash
tool=$2
sleep "${FAKE_SLEEP:-0}"
echo "check-bwd: 3 cases, ${FAKE_FAILED:-0} failed"
if [ "$tool" = racecheck ]; then
    echo "========= RACECHECK SUMMARY: ${FAKE_HAZARDS:-0} hazards displayed (${FAKE_HAZARDS:-0} errors, 0 warnings)"
else
    echo "========= ERROR SUMMARY: ${FAKE_ERRORS:-0} errors"
fi
echo "$@ FC_DETERMINISTIC=$FC_DETERMINISTIC" >> "$FAKE_CALLS"
exit "${FAKE_RC:-0}"
"""


def run_sanitize(tmp_path, **env):
    import os
    import subprocess
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "compute-sanitizer"
    fake.write_text(FAKE_SANITIZER)
    fake.chmod(0o755)
    harness = tmp_path / "harness"
    harness.write_text("")
    harness.chmod(0o755)
    calls = tmp_path / "calls"
    full = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "HARNESS": str(harness),
            "OUT": str(tmp_path / "out"), "FAKE_CALLS": str(calls), **env}
    script = BENCH.parent / "scripts" / "sanitize.sh"
    r = subprocess.run(["bash", str(script)], env=full, capture_output=True, text=True, timeout=60)
    return r, (calls.read_text().splitlines() if calls.exists() else [])


def test_sanitize_clean_runs_every_tool_and_run(tmp_path):
    r, calls = run_sanitize(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "every run clean" in r.stdout
    # racecheck, synccheck, memcheck x (fwd/bwd, sm90/sm80, bwd deterministic: 6 small runs
    # + the three sm90 paths runs)
    assert len(calls) == 3 * 9
    assert sum("check sm90 paths FC_DETERMINISTIC=0" in c for c in calls) == 3
    assert sum("check-bwd sm90 paths FC_DETERMINISTIC=1" in c for c in calls) == 3
    assert sum("check-bwd sm90 small FC_DETERMINISTIC=1" in c for c in calls) == 3
    assert sum(" check sm80 small FC_DETERMINISTIC=0" in c for c in calls) == 3


def test_sanitize_jobs_run_at_once_and_all_count(tmp_path):
    import time
    t0 = time.monotonic()
    r, calls = run_sanitize(tmp_path, FC_SANITIZE_JOBS="6", FAKE_SLEEP="1")
    took = time.monotonic() - t0
    assert r.returncode == 0 and "every run clean" in r.stdout, r.stdout + r.stderr
    assert len(calls) == 27 and r.stdout.count("clean  ") == 27
    assert 4 < took < 14, took  # five rounds of (at most) six one-second runs: not 27 in a row, nor at once
    # one racecheck finding among the parallel runs still fails the gate
    r, _ = run_sanitize(tmp_path, FC_SANITIZE_JOBS="4", FAKE_HAZARDS="1")
    assert r.returncode == 1 and r.stdout.count("FAILED racecheck") == 9, r.stdout


@pytest.mark.parametrize("env, why", [({"FAKE_HAZARDS": "25"}, "RACECHECK SUMMARY: 25 hazards"),
                                      ({"FAKE_ERRORS": "2"}, "ERROR SUMMARY: 2 errors"),
                                      ({"FAKE_FAILED": "1"}, "3 cases, 1 failed"),
                                      ({"FAKE_RC": "3"}, "(rc 3)"),
                                      ({"FAKE_SLEEP": "3", "FC_SANITIZE_TIMEOUT": "1"}, "TIMEOUT after 1 s")])
def test_sanitize_fails_on_any_finding(tmp_path, env, why):
    tools = "racecheck" if "FAKE_HAZARDS" in env else "memcheck"
    r, _ = run_sanitize(tmp_path, FC_SANITIZE_TOOLS=tools, FC_SANITIZE_RUNS="bwd-sm90", **env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"FAILED {tools} bwd-sm90" in r.stdout and why in r.stdout, r.stdout


@pytest.mark.parametrize("jobs", ["0", "four"])
def test_sanitize_refuses_a_bad_job_count(tmp_path, jobs):
    r, calls = run_sanitize(tmp_path, FC_SANITIZE_JOBS=jobs)
    assert r.returncode == 2 and "FC_SANITIZE_JOBS" in r.stderr and not calls


def test_sanitize_paths_runs_take_the_paths_cases(tmp_path):
    r, calls = run_sanitize(tmp_path, FC_SANITIZE_TOOLS="synccheck",
                            FC_SANITIZE_RUNS="fwd-sm90-paths bwd-sm90-det-paths bwd-sm80")
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(c.split(" ", 5)[-1] for c in calls) == [
        "check sm90 paths FC_DETERMINISTIC=0", "check-bwd sm80 small FC_DETERMINISTIC=0",
        "check-bwd sm90 paths FC_DETERMINISTIC=1"]


def test_sanitize_needs_a_harness(tmp_path):
    r, calls = run_sanitize(tmp_path, HARNESS=str(tmp_path / "missing"))
    assert r.returncode == 2 and "no harness" in r.stderr and not calls
