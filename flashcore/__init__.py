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

# Mirrors fc_kernel and fc_causal in csrc/flashcore.h and the name tables in csrc/binding.cpp.
KERNELS = {"auto": 0, "sm80": 1, "sm90": 2, "cpu": 3}
CAUSAL_ALIGNMENTS = {"top_left": 1, "bottom_right": 2}
