"""pytest for the flashlab Python package.

Run from the repository root after `pip install .` (or with the extension staged by
`scripts/py-build.sh build/py` and `PYTHONPATH=build/py/python`):

    python -m pytest tests/python

- test_cpu.py: NumPy (DLPack) and torch CPU tensors: values, LSE and gradients against the
  oracle in reference.py, varlen, strided and packed inputs, kernel=, kernels(), compile.
- test_validation.py: every rule of src/api/validate.cpp and of the Python layer, with its message.
- test_cuda.py (marker `cuda`): the same on CUDA tensors under docs/DESIGN.md's rule, every GPU
  kernel by name, the current stream, CUDA graphs, torch.compile(fullgraph=True).
- test_triton.py: the Triton rung.

CPU tests always run (NumPy; the `torch` ones when torch is installed, else they skip with
that reason). Tests marked `cuda` skip with the reason when torch has no CUDA device or this
build has no CUDA kernels. Inputs are fresh random values each run; the seed is printed at
the end, and FLASHLAB_TEST_SEED=N repeats a run (NumPy and torch generators alike).
"""

from __future__ import annotations

import os
import random
import sys
import zlib

import pytest

SEED = int(os.environ.get("FLASHLAB_TEST_SEED", random.SystemRandom().randrange(2**31)))


def _seed_line() -> str:
    return f"flashlab tests: seed {SEED} (FLASHLAB_TEST_SEED={SEED} repeats this run)"


def pytest_report_header(config):
    return _seed_line()


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(_seed_line())


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs torch with a CUDA device and a CUDA build")
    config.addinivalue_line("markers", "torch: needs torch")


def _torch_or_why():
    """(torch, None), or (None, why it cannot be imported)."""
    try:
        import torch

        return torch, None
    except ImportError as e:
        return None, f"torch is not installed ({e})"


def pytest_collection_modifyitems(config, items):
    torch, why = _torch_or_why()
    skip_torch = pytest.mark.skip(reason=why)
    if torch is None:
        skip_cuda = skip_torch
    elif not torch.cuda.is_available():
        skip_cuda = pytest.mark.skip(reason="torch sees no CUDA device")
    elif not __import__("flashlab").cuda_available():
        skip_cuda = pytest.mark.skip(reason="this flashlab build has no CUDA kernels")
    else:
        skip_cuda = None
    for item in items:
        if "cuda" in item.keywords and skip_cuda is not None:
            item.add_marker(skip_cuda)
        elif "torch" in item.keywords and torch is None:
            item.add_marker(skip_torch)


def _test_seed(request) -> int:
    return zlib.crc32(request.node.nodeid.encode())


@pytest.fixture
def rng(request):
    """A NumPy generator seeded from the run's seed and the test's name."""
    import numpy as np

    return np.random.default_rng([SEED, _test_seed(request)])


@pytest.fixture(autouse=True)
def _seed_torch(request):
    """torch's generators (CPU and every CUDA device) seeded the same way, when torch is loaded.
    The seed is reduced below 2^63, which torch takes (FLASHLAB_TEST_SEED may be any uint64,
    as the C++ tests take)."""
    if "torch" in sys.modules:
        sys.modules["torch"].manual_seed(((SEED << 32) ^ _test_seed(request)) % 2**63)
