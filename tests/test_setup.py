"""CPU checks of scripts/pip_toolkit.py, which scripts/env.sh uses to find or
install nvcc from NVIDIA's pip wheels where a machine has no CUDA toolkit."""
import importlib.util
import os
import pathlib

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "scripts" / "pip_toolkit.py"
spec = importlib.util.spec_from_file_location("pip_toolkit", SCRIPT)
pip_toolkit = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pip_toolkit)


def test_pin_follows_torchs_cuda_toolkit_requirement():
    # torch 2.14.1's own line (a CUDA build), and a CPU build's requirements (no toolkit)
    cuda = ['filelock', 'cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,'
            'nvtx]==13.0.3; platform_system == "Linux"', 'nvidia-cudnn-cu13==9.24.0.43; platform_system == "Linux"']
    assert pip_toolkit.pin_from(cuda) == "cuda-toolkit[nvcc,cccl]==13.0.3"
    assert pip_toolkit.pin_from(["cuda-toolkit[nvcc] == 12.8.1"]) == "cuda-toolkit[nvcc,cccl]==12.8.1"
    assert pip_toolkit.pin_from(["filelock", "sympy>=1.13.3", "cuda-bindings<14,>=13.0.3"]) is None


def test_home_has_nvcc_or_is_none():
    home = pip_toolkit.home()
    assert home is None or os.path.isfile(os.path.join(home, "bin", "nvcc"))


def test_version_is_one_number():
    """flashcore.__version__, pyproject.toml's and setup.py's are the same string."""
    import re

    import flashcore

    root = SCRIPT.parent.parent
    found = {f: re.search(r'^\s*version\s*=\s*"([^"]+)"', (root / f).read_text(), re.M).group(1)
             for f in ("pyproject.toml", "setup.py")}
    assert found == {f: flashcore.__version__ for f in found}
