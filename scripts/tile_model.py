#!/usr/bin/env python3
"""tile_model.py -- how evenly the Hopper kernel's persistent tile orders spread work over the
CTAs, on the CPU.

    python scripts/tile_model.py                      # the standard grid, both orders
    python scripts/tile_model.py --shape 32,32,512,64 --br 192 --idle 0.91
    python scripts/tile_model.py --shape 8,8,2048,256 --br 256 --grid 66   # CTA pairs: 66 clusters

A tile costs its K/V tile count plus --over steps (prologue, epilogue; about 2 at D = 128,
perf notes, sessions 18 and 28). In a non-causal 192-row tile whose last consumers hold only
padding rows (skipped, Sm90Tile::PAD_SKIP) the cost is scaled by --idle per idle consumer
(a timeline measured 0.91 for one idle consumer of three at D64 S512, perf notes, session 29).
It mirrors sm90_tile (csrc/sm90/attn_sm90_order.cuh): causal tiles longest first in windows of
heads (sm90_causal_window) with the snake over odd stripes and the last two windows merged, and
non-causal tiles head by head with ROTATE. The static order gives CTA c tiles c, c + grid, ...;
the dynamic order gives each next tile to the first CTA to finish, with windows capped to the L2
as the kernel caps them where the order balances any window (the three-consumer dynamic order at
D = 128, and at D = 64 for rows of 2048 keys or where the static order's windows exceed the cap, the D = 256 pairs' host
plan; at other shapes this column is a what-if, and the
two-consumer dynamic order keeps uncapped windows). Printed: max/mean CTA work,
the launch's time over a perfectly even split.
"""
import argparse
import heapq
import math

GRID = 132
WINDOW_CAP_BYTES = 24 << 20  # FC_SM90_WINDOW_CAP_BYTES (csrc/kernels.h)


def causal_window(grid, n_mblocks, n_bh, kv_head_bytes, cap=False, limit=16 << 20, cap_bytes=WINDOW_CAP_BYTES):
    heads = 2 * grid // math.gcd(2 * grid, n_mblocks)
    if grid % n_mblocks == 0 and heads * kv_head_bytes > limit:
        heads = grid // n_mblocks
    if cap and heads * kv_head_bytes > cap_bytes:
        heads = max(1, cap_bytes // kv_head_bytes)
    return min(heads, n_bh)


def last_window(n_bh, window, kv_head_bytes, merge=True, limit=32 << 20):
    full = n_bh // window
    if merge and (n_bh - (full - 1) * window) * kv_head_bytes <= limit:
        return full - 1
    return (n_bh - 1) // window


def tile_costs(B, H, S, D, br, causal, rotate, snake, grid, bc, over, idle, cap=False):
    """Cost of the tile at each position of the order (position t runs on CTA t % grid in the
    static order)."""
    n_mb = -(-S // br)
    n_bh = B * H
    n = n_mb * n_bh
    kv = S * D * 4
    win = causal_window(grid, n_mb, n_bh, kv, cap)
    last = last_window(n_bh, win, kv)
    pad = n_mb * br - S
    out = []
    for t0 in range(n):
        t, stripe = t0, t0 // grid
        if causal and snake and stripe & 1 and (stripe + 1) * grid <= n:
            t = stripe * grid + grid - 1 - (t - stripe * grid)
        if causal:
            w = min(t // (win * n_mb), last)
            i = t - w * win * n_mb
            heads = n_bh - w * win if w == last else win
            mb = n_mb - 1 - i // heads
            row0 = mb * br - (pad if br == 192 else 0)
            nb = min(-(-S // bc), (min(row0 + br, S) - 1) // bc + 1)
            out.append(nb + over)
        else:
            mb, bh = t % n_mb, t // n_mb
            if rotate:
                mb = (mb + bh * n_mb // grid) % n_mb
            rows = min(br, S - mb * br)
            idle_wgs = br // 64 - -(-rows // 64)
            out.append((-(-S // bc) + over) * idle ** idle_wgs)
    return out


def static(costs, grid):
    loads = [sum(costs[c::grid]) for c in range(grid)]
    return max(loads) / (sum(loads) / grid)


def dynamic(costs, grid):
    ends = [(0.0, c) for c in range(grid)]
    for x in costs:
        t, c = heapq.heappop(ends)
        heapq.heappush(ends, (t + x, c))
    return max(t for t, _ in ends) / (sum(costs) / grid)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", help="B,H,S,D (default: the standard grid)")
    ap.add_argument("--br", type=int, help="query rows per tile (default: 192 at D = 64, else 128)")
    ap.add_argument("--over", type=float, default=2.0, help="steps per tile outside its K/V loop")
    ap.add_argument("--idle", type=float, default=0.91, help="cost factor per idle consumer")
    ap.add_argument("--grid", type=int, default=GRID, help="CTAs (or CTA pairs) taking tiles")
    a = ap.parse_args()
    shapes = ([tuple(int(x) for x in a.shape.split(","))] if a.shape else
              [(16384 // S, 2048 // D, S, D) for D in (64, 128, 256) for S in (512, 1024, 2048, 4096, 8192, 16384)])
    print("B H S D br causal | static order | static, blocks not rotated | dynamic order")
    for B, H, S, D in shapes:
        br = a.br or (192 if D == 64 else 128)
        bc = 64 if D == 256 else 128
        for causal in (False, True):
            args = (B, H, S, D, br, causal)
            cur = tile_costs(*args, True, True, a.grid, bc, a.over, a.idle)
            old = tile_costs(*args, False, True, a.grid, bc, a.over, a.idle)
            dyn = tile_costs(*args, True, False, a.grid, bc, a.over, a.idle, cap=True)
            print(f"{B} {H} {S} {D} {br} {int(causal)} | {static(cur, a.grid):.3f} | {static(old, a.grid):.3f} | "
                  f"{dynamic(dyn, a.grid):.3f}")


if __name__ == "__main__":
    main()
