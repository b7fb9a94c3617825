"""The package's metadata: one version, read by pip from python/flashlab/_version.py and by
CMake from CMakeLists.txt's project(); the license; the typing marker, the compiled
module's stubs and a typed user's script."""

from __future__ import annotations

import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _version_file() -> str:
    text = (ROOT / "python" / "flashlab" / "_version.py").read_text()
    m = re.search(r'__version__ = "(?P<value>[^"]+)"', text)
    assert m, "python/flashlab/_version.py has no __version__"
    return m["value"]


def test_one_version():
    version = _version_file()
    cmake = re.search(r"project\(flashlab VERSION ([0-9.]+)", (ROOT / "CMakeLists.txt").read_text())
    assert cmake, "CMakeLists.txt's project() has no VERSION"
    assert cmake[1] == version, f"CMakeLists.txt says {cmake[1]}, _version.py says {version}"
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject and "python/flashlab/_version.py" in pyproject


def test_one_cutlass_version():
    """The nvidia-cutlass a CUDA pip build asks for is the version cmake/cutlass.cmake downloads
    for a plain CMake build."""
    backend = (ROOT / "tools" / "build_backend" / "flashlab_build.py").read_text()
    cmake = (ROOT / "cmake" / "cutlass.cmake").read_text()
    want = re.search(r'CUTLASS_REQUIREMENT = "nvidia-cutlass==([0-9.]+)"', backend)
    have = re.search(r'set\(FLASHLAB_CUTLASS_VERSION "([0-9.]+)"\)', cmake)
    assert want and have, "the version strings moved: update this test"
    assert want[1] == have[1], f"flashlab_build.py asks for {want[1]}, cutlass.cmake has {have[1]}"


def test_installed_package_reports_it():
    import flashlab

    assert flashlab.__version__ == _version_file()
    assert (pathlib.Path(flashlab.__file__).parent / "py.typed").exists()


def test_license_is_bsd3():
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("BSD 3-Clause License")
    assert 'license = { file = "LICENSE" }' in (ROOT / "pyproject.toml").read_text()


def test_typed_user_script_runs():
    """tests/python/typed_user.py, which CI checks with mypy --strict, also runs."""
    import runpy

    shapes = runpy.run_path(str(ROOT / "tests" / "python" / "typed_user.py"))["main"]()
    assert shapes["flash_attn_func"] == (2, 16, 2, 32) and shapes["softmax_lse"] == (2, 2, 16)
    assert shapes["varlen"] == (32, 2, 32) and shapes["kvcache"] == (2, 1, 2, 32)


def _run(*args: str) -> "subprocess.CompletedProcess[str]":
    import sys

    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600)


def test_stubs_match_the_module(tmp_path):
    """The checked-in stubs of the compiled module (flashlab/_flashlab/*.pyi) are what
    nanobind's stubgen writes for the installed module with tools/stubs/_flashlab.pat."""
    import flashlab

    pytest.importorskip("nanobind.stubgen")
    r = _run("-m", "nanobind.stubgen", "-q", "-r", "-m", "flashlab._flashlab",
             "-p", str(ROOT / "tools" / "stubs" / "_flashlab.pat"), "-O", str(tmp_path))
    assert r.returncode == 0, r.stderr
    shipped = pathlib.Path(flashlab.__file__).parent / "_flashlab"
    for name in ("__init__.pyi", "bench.pyi"):
        assert (tmp_path / "_flashlab" / name).read_text() == (shipped / name).read_text(), (
            f"flashlab/_flashlab/{name} is stale: regenerate it with the command in "
            "tools/stubs/_flashlab.pat")


def test_typed_user_script_passes_mypy_strict():
    pytest.importorskip("mypy")
    r = _run("-m", "mypy", "--strict", "--no-incremental",
             str(ROOT / "tests" / "python" / "typed_user.py"))
    assert r.returncode == 0, r.stdout + r.stderr
