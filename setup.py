"""Builds flashcore's extension: the C core (csrc/) plus the pybind11 binding.

Targets: sm_80 SASS (runs on sm80/sm86/sm89) and sm_90a (H100/H200). Override
with FLASHCORE_ARCHS="80;90a"; the Hopper kernel needs 90a in the list. Sources
compile in parallel (MAX_JOBS).
"""
import glob
import os
import shutil

from setuptools import setup

# torch guesses CUDA_HOME from the nvcc on PATH, which may be a wrapper outside
# the toolkit (/usr/local/bin/nvcc); pick a directory that has the headers.
def _cuda_home():
    nvcc = shutil.which("nvcc")
    guesses = [os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))] if nvcc else []
    for home in guesses + ["/usr/local/cuda"]:
        if os.path.exists(os.path.join(home, "include", "cuda_runtime_api.h")):
            return home
    return None


if "CUDA_HOME" not in os.environ and _cuda_home():
    os.environ["CUDA_HOME"] = _cuda_home()

import torch  # noqa: E402
from torch.utils.cpp_extension import BuildExtension, CUDAExtension  # noqa: E402 (needs CUDA_HOME)

# The extension links torch's CUDA libraries, so a torch without CUDA (a "+cpu" or ROCm wheel) cannot host it;
# torch's own error for this ("CUDA_HOME environment variable is not set") points at the wrong fix.
if torch.version.cuda is None:
    raise SystemExit(f"flashcore: this torch ({torch.__version__}) has no CUDA (a CPU-only or ROCm build); "
                     f"flashcore's extension needs a CUDA build of torch (pip install torch==2.14.1 from PyPI), "
                     f"even to run on the CPU")

HERE = os.path.dirname(os.path.abspath(__file__))
ARCHS = os.environ.get("FLASHCORE_ARCHS", "80;90a").split(";")

sources = (["csrc/binding.cpp", "csrc/dispatch.c", "csrc/cpu/attn_cpu.c"]
           + sorted(glob.glob("csrc/sm80/*.cu")) + sorted(glob.glob("csrc/sm90/*.cu")))
gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in ARCHS]
# The Hopper kernel (csrc/sm90/) exists only in sm_90a code; dispatch offers it
# only when this build has some.
defines = ["-DFC_HAVE_SM90"] if "90a" in ARCHS else []

setup(
    name="flashcore",
    version="0.1.0",
    packages=["flashcore"],
    ext_modules=[
        CUDAExtension(
            name="flashcore._C",
            sources=sources,
            include_dirs=[os.path.join(HERE, "csrc")],
            extra_compile_args={
                "cxx": ["-O3", "-fopenmp"] + defines,
                "nvcc": ["-O3", "-std=c++17", "-Xptxas=-warn-spills", "-lineinfo"] + defines + gencode,
            },
            extra_link_args=["-fopenmp"],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
