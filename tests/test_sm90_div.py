"""The Hopper kernel's division by launch constants (csrc/sm90/attn_sm90_order.cuh, Sm90Div) on
the CPU: shift = ceil(log2 d), mul = floor(2^32 (2^shift - d) / d) + 1, and
n / d == (umulhi(n, mul) + n) >> shift with every intermediate in 32 bits, for 0 <= n < 2^31.
The arithmetic mirrors sm90_div and sm90_quot; the GPU suite runs the C code itself."""
import random

import pytest


def sm90_div(d):
    shift = 0
    while (1 << shift) < d:
        shift += 1
    mul = ((1 << 32) * ((1 << shift) - d)) // d + 1
    return mul, shift


def sm90_quot(n, div):
    mul, shift = div
    assert 0 <= mul < 1 << 32
    hi = (n * mul) >> 32
    assert hi + n < 1 << 32  # the add stays within 32 bits
    return (hi + n) >> shift


def divisors():
    rng = random.Random(7)
    ds = list(range(1, 2049)) + [2**k + e for k in range(11, 31) for e in (-1, 0, 1)]
    ds += [rng.randrange(1, 2**31) for _ in range(2000)]
    return [d for d in ds if 1 <= d < 2**31]


@pytest.mark.parametrize("chunk", range(4))
def test_quotients_exact(chunk):
    rng = random.Random(chunk)
    for d in divisors()[chunk::4]:
        div = sm90_div(d)
        ns = {0, 1, d - 1, d, d + 1, 2**31 - 1, 2**31 - 2, (2**31 - 1) // d * d, (2**31 - 1) // d * d - 1}
        ns |= {rng.randrange(0, 2**31) for _ in range(50)} | {rng.randrange(0, min(2**31, 64 * d)) for _ in range(50)}
        for n in ns:
            if 0 <= n < 2**31:
                assert sm90_quot(n, div) == n // d, (n, d)
