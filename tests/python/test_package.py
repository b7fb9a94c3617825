"""The package's metadata: one version, read by pip from python/flashlab/_version.py and by
CMake from CMakeLists.txt's project(); the license; the typing marker."""

from __future__ import annotations

import pathlib
import re

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


def test_installed_package_reports_it():
    import flashlab

    assert flashlab.__version__ == _version_file()
    assert (pathlib.Path(flashlab.__file__).parent / "py.typed").exists()


def test_license_is_bsd3():
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("BSD 3-Clause License")
    assert 'license = { file = "LICENSE" }' in (ROOT / "pyproject.toml").read_text()
