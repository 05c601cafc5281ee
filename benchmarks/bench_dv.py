"""Benchmark of calls whose v has a head dim of its own (Dv != D; MLA's D = 192, Dv = 128), forward
and forward + backward: flashcore as it runs them (v's own head dim on the sm90 kernels, flashcore.h's
Dv) against the same call with v padded to D by hand (flashcore:padded: forward and backward at D, what
flashcore ran before v's own head dim) and SDPA's backends, in one run on the same inputs.

    python benchmarks/bench_dv.py --out benchmarks/results/dv-h100.json
    python benchmarks/bench_dv.py --seqlens 4096 --fwdbwd-seqlens 1024,2048,4096,8192 \
        --out benchmarks/results/dv-bwd-h100.json      # forward + backward, the backward with Dv its own

Shapes: B * S = 16384 tokens, H = 16 query and KV heads, S in --seqlens, causal both, fp16, plus
bf16 at S = 4096. FLOPs = 2 * B * H * Sq * Sk * (D + Dv), halved for causal (Sq = Sk). Each impl
is timed by do_bench (median, L2 flushed) in ROUNDS rounds of shuffled order; a row is the median
reading. Suite "dv-fwdbwd" (S in --fwdbwd-seqlens, fp16): one forward and torch.autograd.grad of
q, k and v, FLOPs 3.5x the forward's. Writes the rows (with a "Dv" field) and a markdown table
beside them.
"""
import argparse
import datetime
import json
import os
import random
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (the benchmark protocol's timing and metadata helpers)

TOKENS = 16384
HEADS = 16
ROUNDS = 6
IMPLS = ("flashcore", "flashcore:padded", "sdpa-default", "sdpa-cudnn", "sdpa-efficient")


def make_fn(name, q, k, v, causal, fc, dout=None):
    """fn() running impl `name` on (q, k, v), or raises where the impl refuses the call. dout: the
    forward, then the gradients of q, k and v for this dout (its result: the three concatenated)."""
    if dout is not None:
        fwd = make_fn(name, q, k, v, causal, fc)

        def fn():
            grads = torch.autograd.grad(fwd(), (q, k, v), dout)
            return torch.cat([g.flatten() for g in grads])
        return fn
    if name == "flashcore":
        return lambda: fc.attention(q, k, v, is_causal=causal)
    if name == "flashcore:padded":
        d, dv = q.shape[-1], v.shape[-1]
        return lambda: fc.attention(q, k, F.pad(v, (0, d - dv)), is_causal=causal)[..., :dv].contiguous()
    if name == "sdpa-default":
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    from torch.nn.attention import sdpa_kernel
    backend = bench._sdpa_backend(name)

    def fn():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return fn


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqlens", default="512,1024,2048,4096,8192")
    ap.add_argument("--fwdbwd-seqlens", default="2048,4096", help="S of the dv-fwdbwd suite ('' for none)")
    ap.add_argument("--dims", default="192:128", help="D:Dv pairs, comma-separated")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    fc = bench.import_flashcore()
    torch.manual_seed(0)
    shapes = []
    for dims in args.dims.split(","):
        d, dv = (int(x) for x in dims.split(":"))
        for s in (int(x) for x in args.seqlens.split(",")):
            for causal in (False, True):
                shapes.append(("dv", TOKENS // s, s, d, dv, causal, "fp16"))
        if 4096 in [int(x) for x in args.seqlens.split(",")]:
            shapes.append(("dv", TOKENS // 4096, 4096, d, dv, False, "bf16"))
            shapes.append(("dv", TOKENS // 4096, 4096, d, dv, True, "bf16"))
        for s in (int(x) for x in args.fwdbwd_seqlens.split(",") if x):
            for causal in (False, True):
                shapes.append(("dv-fwdbwd", TOKENS // s, s, d, dv, causal, "fp16"))
    rows, rng = [], random.Random(20261128)
    for suite, B, S, d, dv, causal, dt in shapes:
        bwd = suite == "dv-fwdbwd"
        dtype = torch.float16 if dt == "fp16" else torch.bfloat16
        q, k = (torch.randn(B, HEADS, S, d, device="cuda", dtype=dtype, requires_grad=bwd) for _ in range(2))
        v = torch.randn(B, HEADS, S, dv, device="cuda", dtype=dtype, requires_grad=bwd)
        dout = torch.randn(B, HEADS, S, dv, device="cuda", dtype=dtype) if bwd else None  # (one for every impl)
        fns, ref = {}, None
        for name in IMPLS:
            try:
                fn = make_fn(name, q, k, v, causal, fc, dout)
                out = fn()
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 -- a backend that refuses the call is reported, not timed
                print(f"  {name}: skipped ({bench.first_line(e)})")
                continue
            ref = out if ref is None else ref
            tol = 0.1 * ref.abs().max().item() if bwd else 2e-2  # (gradients: a sanity bound)
            if (out.float() - ref.float()).abs().max().item() > tol:
                raise SystemExit(f"{name} disagrees with flashcore at B{B} S{S} D{d}/{dv} causal={causal}")
            fns[name] = fn
        times = {n: [] for n in fns}
        for _ in range(ROUNDS):
            order = list(fns)
            rng.shuffle(order)
            for n in order:
                times[n].append(bench.bench_us(fns[n]))
        flops = 2.0 * B * HEADS * S * S * (d + dv) * (0.5 if causal else 1.0) * (3.5 if bwd else 1.0)
        for n, ts in times.items():
            us = statistics.median(ts)
            rows.append(dict(suite=suite, impl=n, B=B, Hq=HEADS, Hkv=HEADS, Sq=S, Sk=S, D=d, Dv=dv, causal=causal,
                             dtype=dt, us=round(us, 2), tflops=round(flops / us / 1e6, 1), eager_us=None,
                             graph_us=None))
        line = "  ".join(f"{n} {statistics.median(ts):8.1f}" for n, ts in times.items())
        print(f"{suite} B{B} S{S} D{d}/{dv} {dt} causal={int(causal)}: {line} us", flush=True)
        del q, k, v, fns
    sha, dirty = bench.git_commit()
    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, cudnn=bench.cudnn_version(), commit=sha,
                dirty=dirty, date=datetime.date.today().isoformat(), rounds=ROUNDS,
                matmul_fp16_tflops=round(bench.matmul_tflops(), 1))
    with open(args.out, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    table = ["| shape | flashcore TFLOP/s | padded | cuDNN | efficient | fc / cuDNN | fc / padded |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    by = {}
    for r in rows:
        by.setdefault((r["suite"], r["B"], r["Sq"], r["D"], r["Dv"], r["causal"], r["dtype"]), {})[r["impl"]] = \
            r["tflops"]
    for (suite, B, S, d, dv, causal, dt), t in by.items():
        fc_t, pad, cu, ef = (t.get(n) for n in ("flashcore", "flashcore:padded", "sdpa-cudnn", "sdpa-efficient"))
        ratio = lambda a, b: f"{a / b:.3f}" if a and b else "-"  # noqa: E731
        table.append(f"| {suite} {dt} B{B} S{S} D{d}/{dv}{' causal' if causal else ''} | {fc_t} | {pad} | {cu} | "
                     f"{ef} | {ratio(fc_t, cu)} | {ratio(fc_t, pad)} |")
    with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
        f.write(f"{meta['gpu']}, torch {meta['torch']}, commit {sha[:8]}, {meta['date']}\n\n" + "\n".join(table) + "\n")
    print("\n".join(table))


if __name__ == "__main__":
    main()
