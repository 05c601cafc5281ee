"""flashcore: fused attention forward for PyTorch, with a thin C core.

    import flashcore
    out = flashcore.attention(q, k, v, causal=True)

``flashcore.attention`` is a drop-in for
``torch.nn.functional.scaled_dot_product_attention`` without a mask or dropout.
"""
import torch  # noqa: F401  (loads torch's libraries before the extension)

from . import _C

# The whole call, argument handling included, is C++ (csrc/binding.cpp), so an
# eager call does no Python-level work; help(flashcore.attention) has the docs.
attention = _C.attention

__all__ = ["attention", "KERNELS", "CAUSAL_ALIGNMENTS"]

# Name -> id of fc_kernel and fc_causal (csrc/flashcore.h): the binding's own
# tables, the ones flashcore.attention parses its string options with.
KERNELS = dict(_C.KERNELS)
CAUSAL_ALIGNMENTS = dict(_C.CAUSAL_ALIGNMENTS)
