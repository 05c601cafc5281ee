"""Summarises a timeline recorded by the Hopper kernel (csrc/sm90/trace.cuh).

    BUILD_DIR=build/trace NVCC_FLAGS="-DFC_SM90_TRACE" scripts/build_harness.sh
    build/trace/harness trace sm90 8 16 16 2048 2048 128 0 t.bin     # on the GPU machine
    python scripts/sm90_trace.py t.bin

For consumer warpgroups (thread 0 of each) it splits a tile's cycles into: the
wait for Q, the prologue (first S, its softmax), the steady-state loop (and in
it the waits on K and V, on S and on P V, the softmax, the issue of the wgmma
groups, the O rescale and P packing), the last P V and the epilogue, averaged over every recorded tile, as cycles and as a share of the
tile. The producer line gives its waits for free K and V slots. The gap is the
time from one tile's end to the next one's start in the same warpgroup.
"""
import struct
import sys

import numpy as np

START, Q, PRO, LOOP, LASTPV, END, W_K, W_V, W_S, W_PV, SOFT, ISSUE, TAIL, BLOCKS, GT = range(15)


def load(path):
    with open(path, "rb") as f:
        ctas, tiles, wgs, ev, launch_ns = struct.unpack("<5q", f.read(40))
        rec = np.frombuffer(f.read(), dtype=np.uint64).astype(np.int64)
    return rec.reshape(ctas, tiles, wgs, ev), launch_ns


def consumer_parts(rec, w):
    """Per-tile cycles of consumer warpgroup w over every recorded tile: a dict of
    numpy arrays (tile total, K/V tiles, and each part of the tile), or None."""
    m = rec[:, :, w, START] != 0
    if not m.any():
        return None
    r = rec[:, :, w][m]
    return {
        "total": r[:, END] - r[:, START],
        "blocks": r[:, BLOCKS],
        "Q wait": r[:, Q] - r[:, START],
        "prologue": r[:, PRO] - r[:, Q],
        "loop": r[:, LOOP] - r[:, PRO],
        "  K wait": r[:, W_K],
        "  V wait": r[:, W_V],
        "  S wait": r[:, W_S],
        "  PV wait": r[:, W_PV],
        "  softmax": r[:, SOFT],
        "  wgmma issue": r[:, ISSUE],
        "  rescale, pack": r[:, TAIL],
        "last PV": r[:, LASTPV] - r[:, LOOP],
        "epilogue": r[:, END] - r[:, LASTPV],
    }


def summarise(rec, launch_ns):
    ctas, tiles, wgs, _ = rec.shape
    used = rec[:, :, :, START] != 0
    out = []
    # SM clock from clock64 and globaltimer deltas between first and last recorded tile of each CTA.
    rates = []
    for c in range(ctas):
        idx = np.nonzero(used[c, :, 1])[0]
        if len(idx) >= 2:
            a, b = idx[0], idx[-1]
            dg = rec[c, b, 1, GT] - rec[c, a, 1, GT]
            if dg > 0:
                rates.append((rec[c, b, 1, START] - rec[c, a, 1, START]) / dg)
    mhz = 1e3 * float(np.median(rates)) if rates else float("nan")
    out.append(f"launch {launch_ns / 1e3:.1f} us, SM clock about {mhz:.0f} MHz, "
               f"{int(used[:, :, 1].sum())} first-consumer tiles on {ctas} CTAs")
    for w in range(1, wgs):
        parts = consumer_parts(rec, w)
        if parts is None:
            continue
        tot, blocks = parts.pop("total"), parts.pop("blocks")
        r = rec[:, :, w][used[:, :, w]]
        out.append(f"consumer {w}: {len(tot)} tiles, {blocks.mean():.1f} K/V tiles each, "
                   f"{tot.mean():.0f} cycles per tile ({tot.mean() / max(blocks.mean(), 1):.0f} per K/V tile)")
        for k, v in parts.items():
            out.append(f"  {k:<16} {v.mean():9.0f} cycles  {100 * v.mean() / tot.mean():5.1f} %")
        gaps = []
        for c in range(ctas):
            idx = np.nonzero(used[c, :, w])[0]
            for a, b in zip(idx[:-1], idx[1:]):
                gaps.append(rec[c, b, w, START] - rec[c, a, w, END])
        if gaps:
            out.append(f"  gap between tiles {np.mean(gaps):.0f} cycles (max {np.max(gaps)})")
        steps = np.maximum(blocks - 1, 1)
        out.append(f"  loop per K/V tile {np.mean((r[:, LOOP] - r[:, PRO]) / steps):.0f} cycles, of which waits "
                   f"K {np.mean(r[:, W_K] / steps):.0f} V {np.mean(r[:, W_V] / steps):.0f} "
                   f"S {np.mean(r[:, W_S] / steps):.0f} PV {np.mean(r[:, W_PV] / steps):.0f}, "
                   f"softmax {np.mean(r[:, SOFT] / steps):.0f}, issue {np.mean(r[:, ISSUE] / steps):.0f}, "
                   f"rescale and pack {np.mean(r[:, TAIL] / steps):.0f}")
    m = used[:, :, 0]
    if m.any():
        r = rec[:, :, 0][m]
        tot = r[:, END] - r[:, START]
        out.append(f"producer: {tot.mean():.0f} cycles per tile issuing; waits Q slot "
                   f"{np.mean(r[:, Q] - r[:, START]):.0f}, K slots {r[:, W_K].mean():.0f}, V slots {r[:, W_V].mean():.0f}")
    return "\n".join(out)


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    for path in sys.argv[1:]:
        rec, launch_ns = load(path)
        print(f"== {path}")
        print(summarise(rec, launch_ns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
