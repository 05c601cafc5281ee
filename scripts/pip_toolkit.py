"""Finds or names NVIDIA's pip-packaged CUDA toolkit for scripts/env.sh.

    python scripts/pip_toolkit.py home   # the installed toolkit's root (has bin/nvcc), or exit 1
    python scripts/pip_toolkit.py pin    # the wheel to install: cuda-toolkit[nvcc,cccl]==<torch's pin>

torch's CUDA wheels require `cuda-toolkit[...]==X.Y.Z`; the nvcc of that
version compiles for the runtime torch loads.
"""
import importlib.metadata as md
import os
import re
import sys


def home():
    try:
        dist = md.distribution("nvidia-cuda-nvcc")
    except md.PackageNotFoundError:
        return None
    for f in dist.files or []:
        if str(f).endswith("bin/nvcc"):
            nvcc = str(dist.locate_file(f))
            return os.path.dirname(os.path.dirname(nvcc)) if os.path.isfile(nvcc) else None
    return None


def pin_from(requirements):
    """The nvcc wheel matching a `cuda-toolkit[...]==X.Y.Z` line of torch's
    requirements, or None (a CPU build of torch pins none)."""
    for r in requirements:
        m = re.match(r"cuda-toolkit\[[^]]*\]\s*==\s*([0-9.]+)", r)
        if m:
            return "cuda-toolkit[nvcc,cccl]==" + m.group(1)
    return None


def pin():
    try:
        return pin_from(md.requires("torch") or [])
    except md.PackageNotFoundError:
        return None


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what not in ("home", "pin"):
        sys.exit("usage: pip_toolkit.py home|pin")
    out = home() if what == "home" else pin()
    if out is None:
        sys.exit(1)
    print(out)
