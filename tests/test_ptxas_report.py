"""scripts/ptxas_report.py's gate (CPU): a ptxas -v log with a spill, or with any C75xx wgmma
diagnostic, fails the report; a clean log passes. The C7515 line is one nvcc 13.0 printed for a
Hopper-kernel variant that kept a wgmma result pending across the epilogue (perf notes,
"chained tiles"): the gate checked only C7514 then, and passed that build.
"""
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "scripts"))
import ptxas_report  # noqa: E402

ENTRY = """ptxas info    : Compiling entry function '_Z6kernelv' for 'sm_90a'
ptxas info    : Function properties for _Z6kernelv
    {frame} bytes stack frame, {spill} bytes spill stores, {spill} bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers, 1024 bytes smem, 376 bytes cmem[0]
"""
DIAGNOSTICS = [
    "ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are serialized due to "
    "non wgmma instructions reading accumulator registers of a wgmma between start and end of the pipeline stage "
    "in the function '_Z6kernelv'",
    "ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized due to "
    "non wgmma instructions defining accumulator registers of a wgmma between start and end of the pipeline stage "
    "in the function '_Z6kernelv'",
    "ptxas info    : (C7517) warpgroup.wait is injected in around line 29251 by compiler to allow use of registers "
    "defined by GMMA in function '_Z6kernelv'",
]


def report(tmp_path, text):
    log = tmp_path / "build.log"
    log.write_text(text)
    return ptxas_report.main(["--log", str(log)])


def test_clean_log_passes(tmp_path):
    assert report(tmp_path, ENTRY.format(frame=0, spill=0)) == 0


def test_spill_fails(tmp_path):
    assert report(tmp_path, ENTRY.format(frame=8, spill=4)) == 1


@pytest.mark.parametrize("line", DIAGNOSTICS, ids=["C7514", "C7515", "C7517"])
def test_wgmma_diagnostic_fails(tmp_path, line):
    assert report(tmp_path, ENTRY.format(frame=0, spill=0) + line + "\n") == 1
