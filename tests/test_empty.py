"""Empty calls, as torch's scaled_dot_product_attention takes them: B, H or Sq
= 0 give an empty output; Sk = 0 leaves every row without a visible key, so the
output is all zeros and the LSE all -inf. Runs on the CPU path (CI) and on
every GPU kernel; D = 0 and Hkv = 0 with Hq > 0 stay refused (test_errors.py).
"""
import pytest
import torch
import torch.nn.functional as F

import flashcore

from conftest import (CAUSAL_MODES, GPU_KERNELS, dtype_id, expand_kv, make_qkv, mode_id, ref_attention,
                      requires_gpu, run_poisoned)

# (B, Hq, Hkv, Sq, Sk)
SHAPES = [
    (0, 4, 4, 16, 16),    # no batch
    (2, 0, 0, 16, 16),    # no heads
    (2, 0, 2, 16, 16),    # no query heads, some KV heads
    (2, 4, 2, 0, 16),     # no queries (GQA)
    (2, 4, 4, 0, 0),      # no queries, no keys
    (2, 4, 4, 16, 0),     # no keys: zeros
    (2, 4, 2, 17, 0),     # no keys, GQA, an odd length
    (1, 8, 2, 1, 0),      # no keys, a decode-like call
    (3, 2, 1, 130, 0),    # no keys, rows over several 128-row tiles
]

# (device, kernel): the CPU path, then auto and every forced kernel on a GPU
TARGETS = [pytest.param("cpu", "auto", id="cpu")] + [
    pytest.param("cuda", kern, id=f"cuda-{kern}", marks=requires_gpu) for kern in ["auto"] + GPU_KERNELS
]


def shape_id(s):
    return "B{}_Hq{}_Hkv{}_Sq{}_Sk{}".format(*s)


@pytest.mark.parametrize("device,kernel", TARGETS)
@pytest.mark.parametrize("mode", CAUSAL_MODES, ids=mode_id)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("D", [64, 256])
def test_empty_call(device, kernel, mode, shape, D):
    dtype = torch.float32 if device == "cpu" else torch.float16
    q, k, v = make_qkv(*shape, D, dtype, device)
    out, lse = run_poisoned(q, k, v, mode, kernel=kernel)
    B, Hq, _, Sq, Sk = shape
    assert out.shape == q.shape and out.dtype == q.dtype and out.device == q.device
    assert lse.shape == (B, Hq, Sq) and lse.dtype == torch.float32 and lse.device == q.device
    assert torch.equal(out.cpu(), torch.zeros(q.shape, dtype=dtype))
    assert bool((lse == float("-inf")).all())
    if out.numel():
        assert Sk == 0  # only a call without keys has output rows here
    # the reference math (not SDPA: torch 2.11's CPU SDPA dies of SIGFPE on some
    # of these) gives the same zeros: the softmax of an empty row sums to nothing
    ref, ref_lse = ref_attention(q, k, v, causal_mode=mode, dtype=torch.float64)
    assert ref.shape == q.shape and torch.equal(out.double(), ref)
    assert torch.equal(lse.double(), ref_lse)


@requires_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("num_splits", [None, 1, 4])
def test_no_keys_with_splits_and_strides(dtype, num_splits):
    # q transposed from (B, S, H, D), out written in full even where the
    # allocator hands back NaN-poisoned memory
    B, Hq, Hkv, Sq, D = 2, 8, 2, 33, 128
    q = torch.randn(B, Sq, Hq, D, device="cuda").to(dtype).transpose(1, 2)
    k = torch.randn(B, Hkv, 0, D, device="cuda").to(dtype)
    out, lse = run_poisoned(q, k, k, None, num_splits=num_splits)
    assert torch.equal(out, torch.zeros_like(out)) and bool((lse == float("-inf")).all())
    # and the next, ordinary call on the same stream is unaffected
    k = torch.randn(B, Hkv, 40, D, device="cuda").to(dtype)
    ref = F.scaled_dot_product_attention(q, *expand_kv(q, k, k))
    assert torch.allclose(flashcore.attention(q, k, k, enable_gqa=True), ref, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=requires_gpu)])
def test_empty_under_torch_compile_fake(device):
    # the custom op's fake impl gives the same empty shapes the binding returns
    from flashcore import _attention_fake
    q, k, v = make_qkv(0, 4, 4, 16, 16, 64, torch.float32 if device == "cpu" else torch.float16, device)
    out, lse = _attention_fake(q, k, v, None, 0.0, False, None, None, "top_left", True, "auto", None)
    real, real_lse = flashcore.attention(q, k, v, return_lse=True)
    assert out.shape == real.shape and lse.shape == real_lse.shape
