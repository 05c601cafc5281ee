"""flashcore: fused attention forward for PyTorch, with a thin C core.

    import flashcore
    out = flashcore.attention(q, k, v, causal=True)

``flashcore.attention`` is a drop-in for
``torch.nn.functional.scaled_dot_product_attention`` without a mask or dropout.
"""
import math

import torch

from . import _C

__all__ = ["attention", "KERNELS", "CAUSAL_ALIGNMENTS"]

# Mirrors fc_kernel and fc_causal in csrc/flashcore.h.
KERNELS = {"auto": 0, "sm80": 1, "sm90": 2, "cpu": 3}
CAUSAL_ALIGNMENTS = {"top_left": 1, "bottom_right": 2}


def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
              scale=None, enable_gqa=False, *, causal=None,
              causal_alignment="top_left", return_lse=False, kernel="auto", num_splits=None):
    """Scaled dot-product attention, ``softmax(scale * Q K^T) V``, fused.

    Args:
        query: (B, Hq, Sq, D) tensor.
        key: (B, Hkv, Sk, D) tensor; Hkv must divide Hq (grouped-query
            attention reads each KV head in place, with no copy).
        value: (B, Hkv, Sk, D) tensor.
        attn_mask, dropout_p: accepted for SDPA compatibility; only ``None``
            and ``0.0`` are supported, anything else raises ``ValueError``.
        is_causal / causal: apply a causal mask (the two names are aliases).
        scale: softmax scale, default ``1/sqrt(D)``; must be finite and > 0.
        enable_gqa: accepted for SDPA compatibility; GQA is always on.
        causal_alignment: ``"top_left"`` (default, SDPA's ``is_causal``: query
            i sees keys j <= i) or ``"bottom_right"`` (FlashAttention's, for KV
            caches: query i sees keys j <= i + Sk - Sq). Rows that see no key
            give output 0 and LSE -inf.
        return_lse: also return the fp32 log-sum-exp (natural log) of the
            scaled scores, shape (B, Hq, Sq).
        kernel: ``"auto"`` (default), or force ``"sm80"`` (portable
            tensor-core kernel), ``"sm90"`` (Hopper kernel) or ``"cpu"``.
        num_splits: split-KV (flash-decoding) for few query rows and long
            keys. ``None`` or ``0``: a heuristic picks the kernel and how many
            ways to split Sk across the SMs; ``1``: no split; ``n > 1``: run
            the split-KV kernel with Sk split n ways (clamped to the number of
            key tiles). GPU only; ignored on the CPU. The partial results live
            in a scratch tensor from torch's allocator.

    Dtypes: fp16 and bf16 on CUDA; fp16, bf16 and fp32 on the CPU.
    Head dim D: any multiple of 8 from 8 to 256.
    GPUs: compute capability 8.0 and newer (A100, L4/Ada, H100/H200).
    Every tensor's last dim must be contiguous (stride 1); other strides are
    free, so ``x.transpose(1, 2)`` of a (B, S, H, D) tensor works as is.

    Returns:
        ``out`` of shape (B, Hq, Sq, D) and q's dtype, or ``(out, lse)``.
    """
    if attn_mask is not None:
        raise ValueError("attn_mask: flashcore supports no explicit mask; pass attn_mask=None "
                         "(use causal=True for a causal mask)")
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p: flashcore has no dropout; got {dropout_p}, pass 0.0")
    if causal is None:
        causal = is_causal
    elif bool(causal) != bool(is_causal) and is_causal:
        raise ValueError("causal / is_causal: both given and they disagree; pass only one")
    if causal:
        mode = CAUSAL_ALIGNMENTS.get(causal_alignment)
        if mode is None:
            raise ValueError(f"causal_alignment: expected one of {sorted(CAUSAL_ALIGNMENTS)}, "
                             f"got {causal_alignment!r}")
    else:
        mode = 0
    k_id = KERNELS.get(kernel)
    if k_id is None:
        raise ValueError(f"kernel: expected one of {sorted(KERNELS)}, got {kernel!r}")
    if num_splits is None:
        num_splits = 0
    elif isinstance(num_splits, bool) or not isinstance(num_splits, int):
        raise TypeError(f"num_splits: expected None or an int, got {type(num_splits).__name__}")
    elif num_splits < 0:
        raise ValueError(f"num_splits: got {num_splits}; pass None or 0 (heuristic), 1 (no split) "
                         f"or n > 1 (split Sk n ways)")
    if scale is None:
        d = query.shape[-1] if isinstance(query, torch.Tensor) and query.dim() > 0 else 0
        scale = 1.0 / math.sqrt(d) if d > 0 else 1.0
    out, lse = _C.fwd(query, key, value, float(scale), mode, k_id, bool(return_lse), num_splits)
    return (out, lse) if return_lse else out
