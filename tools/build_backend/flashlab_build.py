"""FlashLab's PEP 517 build backend: scikit-build-core's, plus one build requirement.

The CuTe kernels include the CUTLASS/CuTe headers, which come from the nvidia-cutlass wheel
(cmake/cutlass.cmake finds them in the build environment's Python). That wheel pulls in
cuda-python, scipy, numpy, networkx, pydot and treelib: 12 wheels, about 72 MB downloaded
and 350 MB installed into pip's isolated build environment. So it is asked for only when the
build compiles CUDA: FLASHLAB_CUDA is not OFF and, for the default AUTO, CMake will find
nvcc (CUDACXX, nvcc on the PATH or $CUDA_PATH/bin, as CMake's CUDA detection looks). A
CPU-only build downloads none of it. Were the guess wrong, cutlass.cmake still finds or
downloads the headers itself.
"""

from __future__ import annotations

import os
import shlex
import shutil
from typing import Dict, List, Optional, Union

from scikit_build_core import build as _skbuild
from scikit_build_core.build import *  # noqa: F401,F403  (the other PEP 517 hooks as they are)

CUTLASS_REQUIREMENT = "nvidia-cutlass==4.2.0.0"  # cmake/cutlass.cmake's FLASHLAB_CUTLASS_VERSION

ConfigSettings = Optional[Dict[str, Union[str, List[str]]]]


def _flashlab_cuda(config_settings: ConfigSettings, state: str) -> str:
    """FLASHLAB_CUDA as the CMake configure will get it: a -D in cmake.args or CMAKE_ARGS
    (the last one; they come last on CMake's command line), else scikit-build-core's
    cmake.define (pyproject.toml, SKBUILD_CMAKE_DEFINE, -C cmake.define.FLASHLAB_CUDA=...),
    else CMakeLists.txt's AUTO."""
    from scikit_build_core.settings.skbuild_read_settings import SettingsReader

    cmake = SettingsReader.from_file("pyproject.toml", config_settings,
                                     state=state).settings.cmake  # type: ignore[arg-type]
    args = [*cmake.args, *shlex.split(os.environ.get("CMAKE_ARGS", ""))]
    for arg in reversed(args):
        if arg.startswith("-DFLASHLAB_CUDA=") or arg.startswith("-DFLASHLAB_CUDA:"):
            return arg.split("=", 1)[1]
    return str(cmake.define.get("FLASHLAB_CUDA", "AUTO"))


def _finds_nvcc() -> bool:
    if os.environ.get("CUDACXX"):
        return True
    cuda_path = os.environ.get("CUDA_PATH")
    return bool(shutil.which("nvcc") or
                (cuda_path and shutil.which("nvcc", path=os.path.join(cuda_path, "bin"))))


def builds_cuda(config_settings: ConfigSettings = None, state: str = "wheel") -> bool:
    value = _flashlab_cuda(config_settings, state).strip().upper()
    if value == "AUTO":
        return _finds_nvcc()
    # CMake's false constants; anything else turns the CUDA kernels on.
    return not (value in ("", "0", "OFF", "NO", "FALSE", "N", "IGNORE", "NOTFOUND")
                or value.endswith("-NOTFOUND"))


def get_requires_for_build_wheel(config_settings: ConfigSettings = None) -> List[str]:
    requires = _skbuild.get_requires_for_build_wheel(config_settings)
    return [*requires, CUTLASS_REQUIREMENT] if builds_cuda(config_settings) else requires


def get_requires_for_build_editable(config_settings: ConfigSettings = None) -> List[str]:
    requires = _skbuild.get_requires_for_build_editable(config_settings)
    return ([*requires, CUTLASS_REQUIREMENT] if builds_cuda(config_settings, "editable")
            else requires)
