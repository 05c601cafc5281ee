"""The Hopper kernel's barrier protocol, in scripts/barrier_model.py, under random schedules (CPU).

Every (mode, K/V stages, Q buffers, consumer warpgroups) the kernel instantiates must run without a deadlock, a read of
a slot that does not hold its tile, or a load into a slot being read. The odd key-split ring (3
stages) is the known-bad case: the model must catch it, or it could not catch anything.
"""
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "scripts"))
import barrier_model  # noqa: E402

SCHEDULES = 400


@pytest.mark.parametrize("config", barrier_model.KERNEL_CONFIGS, ids=lambda c: "{}-s{}-q{}-c{}".format(*c))
def test_kernel_protocol_is_safe(config):
    mode, stages, qbufs, consumers = config
    assert barrier_model.check(mode, stages, qbufs, SCHEDULES, consumers=consumers) is None


def test_model_catches_the_odd_key_split_ring():
    failure = barrier_model.check("split", 3, 2, SCHEDULES)
    assert failure is not None and ("reads K slot" in failure or "reads V slot" in failure), failure


def test_model_catches_a_late_second_q_half():
    # With Q halves, the second consumer's rows issued behind all of the tile's K/V tiles deadlock
    # once a tile has more K/V tiles than the ring holds: the model must say so.
    failure = barrier_model.check("overlap", 2, 1, SCHEDULES, late_half=True)
    assert failure is not None and "deadlock" in failure, failure
