"""The persistent Hopper backward's protocol, in scripts/bwd_barrier_model.py, under random schedules (CPU).

The three layouts the kernel instantiates (whole: DP = 64 with two K buffers; whole1: DP = 128 with
one; split: DP = 256) must run over random item lists
(items that walk no block included) without a deadlock, a read of a buffer that does not hold its
tile, a write into a buffer still being read, or a next-item word overwritten before it was read.
Each order in BAD breaks one of the kernel's rules: the model must catch every one of them, or it
could not catch anything.
"""
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "scripts"))
import bwd_barrier_model  # noqa: E402

SCHEDULES = 400
EXPECTED = {"one_next_word": "next-item word", "early_kv": "TMA writes ('K', ", "early_refill": "TMA writes (",
            "no_bulk_wait": "('R', ", "no_epi_wait": "('R', ", "early_epi": "('slot'",
            "epi_next_slot": "'epi'", "early_release": "TMA writes (", "no_xchg": "('X', ",
            # an early refill without the test (or testing the phase before) overwrites a slot still
            # read, or reaches the load's wait on the slot's release before it has happened
            "unguarded_ahead": ("TMA writes (", "would wait on block"),
            "stale_parity": ("TMA writes (", "would wait on block")}


@pytest.mark.parametrize("layout", bwd_barrier_model.LAYOUTS)
def test_kernel_protocol_is_safe(layout):
    assert bwd_barrier_model.check(layout, SCHEDULES) is None


@pytest.mark.parametrize("layout,bad", [(lay, bad) for bad, lays in bwd_barrier_model.BAD.items() for lay in lays])
def test_model_catches_a_bad_order(layout, bad):
    failure = bwd_barrier_model.check(layout, SCHEDULES, bad=bad)
    expected = EXPECTED[bad] if isinstance(EXPECTED[bad], tuple) else (EXPECTED[bad],)
    assert failure is not None and any(e in failure for e in expected), failure
