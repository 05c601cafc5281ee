"""clocks.py -- SM clock and board power during each do_bench measurement.

    python benchmarks/clocks.py [--shapes D:S:causal[:dtype],...] [--order fc,cudnn,...] [--rounds 3]

Why: two readings of the same kernel in one bench.py run (flashcore and
flashcore:sm90, which dispatch identically at S >= 2k) differed by up to 6 %,
and the standalone harness (short bursts) reads up to 10 % above do_bench's
200 ms runs. This script times each implementation with bench.py's do_bench
settings while a thread samples NVML (read-only: SM clock, power, the
clock-event reasons) every few ms, so each reading comes with the clock it ran
at. Per shape, the implementations run in `--rounds` rounds, alternating the
order, right after the shape's inputs are made (as in bench.py).

Prints, per measurement: TFLOP/s, mean SM MHz, mean W, the share of samples
with the software power cap or a thermal slowdown active, and TFLOP/s per GHz
(throughput per clock: what the kernel does, not what the power manager did).

--sustained SECONDS replaces do_bench with back-to-back calls (no L2 flush)
after a warm-up as long, and adds GFLOP/J from NVML's energy counter: at the
power limit, throughput is energy efficiency times the limit.
"""
import argparse
import ctypes
import os
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402

NVML_CLOCK_SM = 1
REASON_SW_POWER_CAP = 0x4
REASON_THERMAL = 0x20 | 0x40 | 0x8  # SW thermal, HW thermal, HW slowdown
SAMPLE_S = 0.002

DEFAULT_SHAPES = "128:2048:0,128:16384:0,256:16384:0,256:4096:0,64:8192:0,128:512:0"
ALIASES = {"fc": "flashcore", "sm90": "flashcore:sm90", "sm80": "flashcore:sm80", "cudnn": "sdpa-cudnn",
           "flash": "sdpa-flash", "default": "sdpa-default"}


class Nvml:
    """The few NVML calls this needs, through ctypes (no pynvml on the GPU machine)."""

    def __init__(self, index=0):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        self._ok(self.lib.nvmlInit_v2())
        self.h = ctypes.c_void_p()
        self._ok(self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self.h)))
        self.reasons = getattr(self.lib, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            self.lib.nvmlDeviceGetCurrentClocksThrottleReasons

    @staticmethod
    def _ok(rc):
        if rc != 0:
            raise RuntimeError(f"NVML call failed with code {rc}")

    def energy_mj(self):
        """Energy used since the driver loaded, in mJ (Volta and newer)."""
        mj = ctypes.c_ulonglong()
        self._ok(self.lib.nvmlDeviceGetTotalEnergyConsumption(self.h, ctypes.byref(mj)))
        return mj.value

    def sample(self):
        mhz, mw, why = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_ulonglong()
        self.lib.nvmlDeviceGetClockInfo(self.h, NVML_CLOCK_SM, ctypes.byref(mhz))
        self.lib.nvmlDeviceGetPowerUsage(self.h, ctypes.byref(mw))
        self.reasons(self.h, ctypes.byref(why))
        return time.perf_counter(), mhz.value, mw.value / 1000.0, why.value


class Sampler(threading.Thread):
    def __init__(self, nvml):
        super().__init__(daemon=True)
        self.nvml, self.samples, self.stop = nvml, [], threading.Event()

    def run(self):
        while not self.stop.is_set():
            self.samples.append(self.nvml.sample())
            time.sleep(SAMPLE_S)

    def window(self, t0, t1):
        s = [x for x in self.samples if t0 <= x[0] <= t1]
        if not s:
            return None
        n = len(s)
        return {"mhz": sum(x[1] for x in s) / n, "w": sum(x[2] for x in s) / n,
                "cap": sum(1 for x in s if x[3] & REASON_SW_POWER_CAP) / n,
                "thermal": sum(1 for x in s if x[3] & REASON_THERMAL) / n}


def sustained(fn, flop, nvml, sampler, seconds):
    """Runs fn back to back (no L2 flush) for about `seconds` after a warm-up of
    the same length, so the power manager has settled; returns TFLOP/s, GFLOP/J
    (from NVML's energy counter) and the sampler's window over the timed part."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    n = max(1, int(seconds / max(time.perf_counter() - t0, 1e-6)))
    for _ in range(n):  # warm-up: reach the power limit's steady state
        fn()
    torch.cuda.synchronize()
    e0, t0 = nvml.energy_mj(), time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    e1, t1 = nvml.energy_mj(), time.perf_counter()
    joules = (e1 - e0) / 1e3
    return n * flop / (t1 - t0) / 1e12, n * flop / joules / 1e9 if joules > 0 else float("nan"), \
        sampler.window(t0, t1)


def parse_shapes(text):
    """D:S:causal items, with an optional fourth field fp16 (the default) or bf16."""
    out = []
    for item in text.split(","):
        f = item.split(":")
        if len(f) not in (3, 4) or (len(f) == 4 and f[3] not in bench.DTYPES):
            raise SystemExit(f"--shapes: '{item}' is not D:S:causal or D:S:causal:dtype "
                             f"(dtype one of {', '.join(bench.DTYPES)})")
        D, S, c = (int(x) for x in f[:3])
        B, H = bench.GRID_TOKENS // S, bench.GRID_HIDDEN // D
        out.append(bench.shape("grid", B, H, H, S, S, D, bool(c), f[3] if len(f) == 4 else "fp16"))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=DEFAULT_SHAPES,
                    help="D:S:causal[:dtype] items (standard-grid B and H; dtype fp16 or bf16, default fp16)")
    ap.add_argument("--order", default="fc,sm90,cudnn", help="implementations of round 1; later rounds alternate")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sustained", type=float, default=0.0,
                    help="instead of do_bench: SECONDS of back-to-back calls after as long a warm-up, "
                         "with GFLOP/J from NVML's energy counter")
    args = ap.parse_args(argv)
    impls = [ALIASES.get(x, x) for x in args.order.split(",")]
    fc = bench.import_flashcore()
    nvml = Nvml()
    sampler = Sampler(nvml)
    sampler.start()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; do_bench warmup {bench.WARMUP_MS} ms, "
          f"rep {bench.REP_MS} ms; NVML every {SAMPLE_S * 1e3:.0f} ms")
    print(f"{'shape':34s} {'rd':>2s} {'impl':15s} {'TFLOP/s':>8s} {'MHz':>6s} {'W':>5s} {'cap%':>5s} "
          f"{'therm%':>6s} {'TF/GHz':>7s}" + (f" {'GFLOP/J':>7s}" if args.sustained > 0 else ""))
    for s in parse_shapes(args.shapes):
        q, k, v = bench.make_inputs(s)
        for r in range(args.rounds):
            for name in (impls if r % 2 == 0 else impls[::-1]):
                ctx, fn = bench.make_impl(name, q, k, v, s["causal"], fc, None)
                gfj = None
                with ctx():
                    if args.sustained > 0:
                        tf, gfj, w = sustained(fn, bench.flops(s), nvml, sampler, args.sustained)
                    else:
                        fn()
                        torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        us = bench.bench_us(fn)
                        t1 = time.perf_counter()
                        tf = bench.flops(s) / (us * 1e-6) / 1e12
                        w = sampler.window(t0, t1)
                if w is None:
                    print(f"{bench.shape_label(s):34s} {r:2d} {name:15s} {tf:8.1f}  (no NVML samples)")
                    continue
                print(f"{bench.shape_label(s):34s} {r:2d} {name:15s} {tf:8.1f} {w['mhz']:6.0f} {w['w']:5.0f} "
                      f"{100 * w['cap']:5.0f} {100 * w['thermal']:6.0f} {tf / (w['mhz'] / 1e3):7.1f}"
                      + (f" {gfj:7.1f}" if gfj is not None else ""), flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    sampler.stop.set()
    return 0


if __name__ == "__main__":
    sys.exit(main())
