"""flashcore on a machine with several GPUs.

Tensors on cuda:1 while the current device is cuda:0 (a model split over GPUs,
or code that never calls torch.cuda.set_device), and calls on both GPUs from
two threads at once. Each result must be bit for bit the one the same inputs
give on cuda:0 (same GPU model; the backward in torch's deterministic mode),
the output must land on the inputs' device, and the current device must be
left as it was. What this exercises: the binding's device guard and streams,
the per-device caches (dispatch.c's device table, the launchers' shared-memory
limit set once per device, the kept zero-filled workspace per device and
stream), and scratch allocated on the inputs' device (split-KV partials, the
split tail's partials, the backward's dQ accumulator). Skips with fewer than
two usable GPUs of one model.
"""
import threading

import pytest
import torch

import flashcore

from conftest import GPU_KERNELS, GPU_OK

TWO = GPU_OK and torch.cuda.device_count() >= 2 and \
    torch.cuda.get_device_name(0) == torch.cuda.get_device_name(1)
requires_two = pytest.mark.skipif(not TWO, reason="needs two CUDA GPUs of one model")

# (B, Hq, Hkv, Sq, Sk, D, causal mode): seed shape causal, odd lengths with GQA, a decode call (split-KV),
# non-causal D = 128 from Sk = 4096 (the Hopper kernel's split tail), causal D = 256 bottom-right
CASES = [(2, 8, 8, 512, 512, 64, "top_left"), (1, 8, 2, 1000, 1025, 128, None), (4, 32, 8, 1, 4096, 128, None),
         (2, 16, 16, 2048, 4096, 128, None), (1, 4, 4, 300, 700, 256, "bottom_right")]


def case_id(c):
    return "B{}H{}-{}q{}k{}D{}_{}".format(*c[:6], c[6] or "nocausal")


def inputs(case, dev, seed):
    B, Hq, Hkv, Sq, Sk, D, _ = case
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g).half().to(dev) for s in ((B, Hq, Sq, D), (B, Hkv, Sk, D), (B, Hkv, Sk, D))]


def kw(case, kernel):
    mode = case[6]
    return dict(causal=mode is not None, causal_alignment=mode or "top_left", kernel=kernel)


@requires_two
@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.parametrize("kernel", ["auto"] + GPU_KERNELS)
def test_forward_on_the_second_gpu(kernel, case):
    want = flashcore.attention(*inputs(case, "cuda:0", 1), return_lse=True, **kw(case, kernel))
    with torch.cuda.device(0):
        out, lse = flashcore.attention(*inputs(case, "cuda:1", 1), return_lse=True, **kw(case, kernel))
        assert torch.cuda.current_device() == 0
    assert out.device == lse.device == torch.device("cuda:1")
    assert torch.equal(out.cpu(), want[0].cpu()) and torch.equal(lse.cpu(), want[1].cpu())


@requires_two
@pytest.mark.parametrize("case", [CASES[0], CASES[1], CASES[4]], ids=case_id)
@pytest.mark.parametrize("kernel", ["auto"] + GPU_KERNELS)
def test_backward_on_the_second_gpu(kernel, case):
    def grads(dev):
        q, k, v = (t.requires_grad_() for t in inputs(case, dev, 2))
        out = flashcore.attention(q, k, v, **kw(case, kernel))
        go = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).half().to(dev)
        return torch.autograd.grad(out, (q, k, v), go)

    det = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)  # (dq summed in a fixed order: bit-identical reruns)
    try:
        want = grads("cuda:0")
        with torch.cuda.device(0):
            got = grads("cuda:1")
            assert torch.cuda.current_device() == 0
    finally:
        torch.use_deterministic_algorithms(det)
    for g, w in zip(got, want):
        assert g.device == torch.device("cuda:1") and torch.equal(g.cpu(), w.cpu())


@requires_two
def test_both_gpus_from_two_threads():
    """Two threads, one per GPU, each with its own stream, calling back to back (first calls on
    the second GPU included, so the per-device caches fill while the other thread runs)."""
    cases = [CASES[0], CASES[2], CASES[3]]
    want = {(i, d): flashcore.attention(*inputs(c, "cuda:0", 4 + i), **kw(c, "auto")).cpu()
            for i, c in enumerate(cases) for d in (0, 1)}
    errors = []

    def work(d):
        try:
            torch.cuda.set_device(d)
            with torch.cuda.stream(torch.cuda.Stream()):
                for _ in range(10):
                    for i, c in enumerate(cases):
                        out = flashcore.attention(*inputs(c, f"cuda:{d}", 4 + i), **kw(c, "auto"))
                        if not torch.equal(out.cpu(), want[(i, d)]):
                            errors.append(f"cuda:{d} case {i}: differs from cuda:0's result")
        except Exception as e:  # noqa: BLE001 -- reported below
            errors.append(f"cuda:{d}: {e!r}")

    threads = [threading.Thread(target=work, args=(d,)) for d in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:4]


@requires_two
def test_inputs_on_two_gpus_refused():
    q, k, v = inputs(CASES[0], "cuda:0", 5)
    with pytest.raises(ValueError, match=r"k: on cuda:1 but q is on cuda:0; move q, k and v to the same device"):
        flashcore.attention(q, k.to("cuda:1"), v)
