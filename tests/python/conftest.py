"""pytest for the flashlab Python package.

Run from the repository root after `pip install .` (or with the extension staged by
`scripts/py-build.sh build/py` and `PYTHONPATH=build/py/python`):

    python -m pytest tests/python

CPU tests always run (NumPy; torch when it is installed). Tests marked `cuda` skip with the
reason when torch has no CUDA device or this build has no CUDA kernels. Inputs are fresh
random values each run; FLASHLAB_TEST_SEED=N repeats a run (the seed is printed on failure).
"""

from __future__ import annotations

import os
import random

import pytest

SEED = int(os.environ.get("FLASHLAB_TEST_SEED", random.SystemRandom().randrange(2**31)))


def pytest_report_header(config):
    return f"flashlab tests: seed {SEED} (FLASHLAB_TEST_SEED={SEED} repeats this run)"


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs torch with a CUDA device and a CUDA build")
    config.addinivalue_line("markers", "torch: needs torch")


def _torch_or_none():
    try:
        import torch

        return torch
    except ImportError:
        return None


def pytest_collection_modifyitems(config, items):
    import flashlab

    torch = _torch_or_none()
    skip_torch = pytest.mark.skip(reason="torch is not installed")
    if torch is None:
        skip_cuda = skip_torch
    elif not torch.cuda.is_available():
        skip_cuda = pytest.mark.skip(reason="torch sees no CUDA device")
    elif not flashlab.cuda_available():
        skip_cuda = pytest.mark.skip(reason="this flashlab build has no CUDA kernels")
    else:
        skip_cuda = None
    for item in items:
        if "cuda" in item.keywords and skip_cuda is not None:
            item.add_marker(skip_cuda)
        elif "torch" in item.keywords and torch is None:
            item.add_marker(skip_torch)


@pytest.fixture
def rng(request):
    """A NumPy generator seeded from the run's seed and the test's name."""
    import zlib

    import numpy as np

    return np.random.default_rng([SEED, zlib.crc32(request.node.nodeid.encode())])
