"""ncu_compare.py -- one launch of flashcore and of SDPA's backends under Nsight Compute.

    python benchmarks/ncu_compare.py [--shapes D:S:causal[:dtype],...] [--impls flashcore,sdpa-cudnn] [--bwd]

Why: bench.py's ratios say how far apart two kernels are; this says why, from
the same inputs on the same GPU: per launch the time, the SM clock, how busy the
tensor pipe, the special-function (XU: exponentials) pipe and the issue slots
were, the instruction count and the bytes read from DRAM, with the grid, block
and registers of the kernel. Each impl is warmed up, then one call runs between
cudaProfilerStart and cudaProfilerStop; ncu (`--profile-from-start off`,
`--clock-control none`, so the clock is the power manager's, as in bench.py)
profiles the kernels of that call only, one ncu process per (shape, impl), so
a call that runs several kernels (--bwd: the backward of a retained forward,
as bench.py's bwd suite times it) has each listed, and their sum. Shapes are
standard-grid ones (benchmarks/clocks.py's syntax). Needs ncu on PATH and a GPU;
writes nothing but its table (and the raw CSV with --csv PATH).
"""
import argparse
import csv
import io
import os
import subprocess
import sys

METRICS = {
    "gpu__time_duration.sum": "us",
    "sm__cycles_elapsed.avg.per_second": "MHz",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": "tensor%",
    "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active": "xu%",
    "sm__inst_issued.avg.pct_of_peak_sustained_active": "issue%",
    "sm__inst_executed.sum": "Minst",
    "dram__bytes_read.sum": "DRAM MB",
    "launch__grid_size": "grid",
    "launch__block_size": "block",
    "launch__registers_per_thread": "regs",
}
SCALE = {"us": 1e-3, "MHz": 1e-6, "Minst": 1e-6, "DRAM MB": 1e-6}  # from ns, Hz, instructions, bytes
WARMUP_CALLS = 5


def child(args):
    """Runs inside ncu: warm-up calls, then one profiled call per shape and impl."""
    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench  # noqa: E402
    import clocks  # noqa: E402

    fc = bench.import_flashcore()
    for s in clocks.parse_shapes(args.shapes):
        if args.bwd:
            s = dict(s, suite="bwd")
        q, k, v = bench.make_inputs(s)
        dout = torch.randn_like(q) if args.bwd else None
        for name in args.impls.split(","):
            ctx, fn = bench.make_impl(name, q, k, v, s["causal"], fc, None)
            if args.bwd:
                ctx, fn = bench.backward_of(ctx, fn, q, k, v, dout)
            with ctx():
                for _ in range(WARMUP_CALLS):
                    fn()
                torch.cuda.synchronize()
                torch.cuda.profiler.start()
                fn()
                torch.cuda.synchronize()
                torch.cuda.profiler.stop()
            print(f"PROFILED\t{bench.shape_label(s)}\t{name}", flush=True)
        del q, k, v
        torch.cuda.empty_cache()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="128:2048:0,128:16384:0")
    ap.add_argument("--impls", default="flashcore,sdpa-cudnn")
    ap.add_argument("--bwd", action="store_true", help="profile the backward (gradients of q, k, v) instead")
    ap.add_argument("--csv", default=None, help="also write ncu's raw CSV here")
    ap.add_argument("--from-csv", default=None, help="print the table of a saved --csv file instead of profiling")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args)
        return 0
    if args.from_csv:
        with open(args.from_csv) as f:
            return report(f.read())
    outs = []
    for shape in args.shapes.split(","):
        for impl in args.impls.split(","):
            cmd = ["ncu", "--profile-from-start", "off", "--clock-control", "none", "--csv", "--print-units", "base",
                   "--metrics", ",".join(METRICS), sys.executable, os.path.abspath(__file__), "--child",
                   "--shapes", shape, "--impls", impl] + (["--bwd"] if args.bwd else [])
            run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if run.returncode != 0:
                sys.stderr.write(run.stdout[-8000:])
                return run.returncode
            outs.append(run.stdout)
    if args.csv:
        with open(args.csv, "w") as f:
            f.write(RUN_SEP.join(outs))
    return report(RUN_SEP.join(outs))


RUN_SEP = "==RUN==\n"  # between the outputs of the ncu processes in a saved --csv file


def report(out):
    """Prints one row per profiled kernel from ncu's CSV output (with the child's
    lines), for each ncu process's output in out (RUN_SEP between them)."""
    hdr = f"{'shape':36s} {'impl':12s} " + " ".join(f"{v:>8s}" for v in METRICS.values()) + "  kernel"
    print(hdr)
    for part in out.split(RUN_SEP):
        report_run(part)
    return 0


def report_run(out):
    """The rows of one ncu process's output."""
    # The child's PROFILED lines say which (shape, impl) each profiled call was;
    # ncu numbers the kernels it profiled in launch order (ID). ncu prints no
    # per-kernel progress with --csv, so the kernels map to calls where each call
    # ran one kernel or the process profiled one call (main runs one process per
    # shape and impl); otherwise they are listed in order without their shape.
    labels = [ln.split("\t")[1:] for ln in out.splitlines() if ln.startswith("PROFILED\t")]
    rows = [ln for ln in out.splitlines() if ln.startswith('"')]
    kernels = {}
    for r in csv.DictReader(io.StringIO("\n".join(rows))):
        kid = int(r["ID"])
        k = kernels.setdefault(kid, {"name": r["Kernel Name"], "m": {}})
        k["m"][r["Metric Name"]] = float(r["Metric Value"].replace(",", ""))
    ids = sorted(kernels)
    one_call = len(labels) == 1 and len(ids) > 1
    if one_call:
        labels = labels * len(ids)
    elif len(ids) != len(labels):
        print(f"{len(ids)} kernels in {len(labels)} profiled calls: listed in launch order, shapes not matched")
        labels = [("?", "?")] * len(ids)
    for (label, impl), kid in zip(labels, ids):
        k = kernels[kid]
        vals = " ".join(f"{k['m'].get(m, float('nan')) * SCALE.get(u, 1):8.1f}" for m, u in METRICS.items())
        print(f"{label:36s} {impl:12s} {vals}  {k['name'][:60]}")
    if one_call:
        total = sum(kernels[kid]["m"].get("gpu__time_duration.sum", float("nan")) for kid in ids) * SCALE["us"]
        print(f"{labels[0][0]:36s} {labels[0][1]:12s} {total:8.1f}  (sum of the call's {len(ids)} kernels)")


if __name__ == "__main__":
    sys.exit(main())
