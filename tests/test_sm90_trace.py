"""scripts/sm90_trace.py (CPU): a synthetic timeline with known cycle counts is read back
into the parts the summary prints, and a file in the harness's format round-trips."""
import pathlib
import struct
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "scripts"))
import sm90_trace as tr  # noqa: E402

CTAS, TILES, WGS, EV = 3, 64, 4, 16


def synthetic():
    rec = np.zeros((CTAS, TILES, WGS, EV), dtype=np.int64)
    for c in range(CTAS):
        t = 1000 + 7 * c
        for tile in range(5):
            for w in (0, 1, 2):
                r = rec[c, tile, w]
                r[tr.START], r[tr.Q], r[tr.PRO] = t, t + 30, t + 230
                r[tr.LOOP], r[tr.LASTPV], r[tr.END] = t + 2230, t + 2330, t + 2500
                r[tr.W_K], r[tr.W_V], r[tr.W_S], r[tr.W_PV] = 40, 50, 60, 70
                r[tr.SOFT], r[tr.ISSUE], r[tr.TAIL] = 900, 400, 100
                r[tr.BLOCKS], r[tr.GT] = 9, 2 * (t - 1000)  # 0.5 cycles per ns
            t += 2600  # 100-cycle gap between tiles
    return rec


def test_parts_are_read_back():
    parts = tr.consumer_parts(synthetic(), 1)
    assert len(parts["total"]) == CTAS * 5
    expect = {"total": 2500, "blocks": 9, "Q wait": 30, "prologue": 200, "loop": 2000, "last PV": 100,
              "epilogue": 170, "  K wait": 40, "  softmax": 900, "  wgmma issue": 400, "  rescale, pack": 100}
    for k, v in expect.items():
        assert np.all(parts[k] == v), k
    assert tr.consumer_parts(synthetic(), 3) is None  # no third consumer recorded


def test_file_round_trip(tmp_path):
    rec = synthetic()
    path = tmp_path / "t.bin"
    with open(path, "wb") as f:
        f.write(struct.pack("<5q", CTAS, TILES, WGS, EV, 123456))
        f.write(rec.astype(np.uint64).tobytes())
    back, launch_ns = tr.load(path)
    assert launch_ns == 123456 and np.array_equal(back, rec)
    text = tr.summarise(back, launch_ns)
    assert "SM clock about 500 MHz" in text
    assert "2500 cycles per tile (278 per K/V tile)" in text
    assert "gap between tiles 100 cycles" in text
    assert "loop per K/V tile 250 cycles" in text  # 2000 cycles over 8 steps
