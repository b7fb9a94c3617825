#!/usr/bin/env bash
# Build the `flashlab` Python extension with CMake alone (no pip, no network: the GPU machine
# has nanobind but no scikit-build-core) and stage an importable package:
#
#   scripts/py-build.sh [BUILD_DIR]        # default build/py
#   scripts/py-build.sh --stage-only DIR   # stage the module of a build made elsewhere
#   PYTHONPATH=build/py/python python3 -c 'import flashlab; print(flashlab.kernels())'
#
# The staged package links to python/flashlab/*.py, so edits to the Python layer need no
# rebuild. Environment: FLASHLAB_CUDA (AUTO/ON/OFF, default AUTO), FLASHLAB_CUDA_ARCHS
# (default 90a), CUTLASS_DIR (optional). `pip install .` is the user's path; this is the
# developer's and the device's.
set -euo pipefail
cd "$(dirname "$0")/.."

# --stage-only BUILD_DIR: stage the module another build made (configured with
# -DFLASHLAB_PYTHON=ON, as scripts/gpu-check.sh does with its hopper build).
stage_only=0
if [ "${1:-}" = --stage-only ]; then stage_only=1; shift; fi
bdir="${1:-build/py}"
if [ "$stage_only" = 0 ]; then
  py="$(command -v python3)"
  cmake -S . -B "$bdir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DFLASHLAB_PYTHON=ON -DFLASHLAB_TESTS=OFF -DFLASHLAB_CLI=OFF -DFLASHLAB_CUTE_SMOKE=OFF \
    -DFLASHLAB_CUDA="${FLASHLAB_CUDA:-AUTO}" -DFLASHLAB_CUDA_ARCHS="${FLASHLAB_CUDA_ARCHS:-90a}" \
    ${CUTLASS_DIR:+-DCUTLASS_DIR="$CUTLASS_DIR"} -DPython_EXECUTABLE="$py" >/dev/null
  cmake --build "$bdir" -j "$(nproc)" --target _flashlab
fi

stage="$bdir/python/flashlab"
rm -rf "$stage"
mkdir -p "$stage"
for f in "$PWD"/python/flashlab/*; do ln -s "$f" "$stage/"; done
cp "$(find "$bdir" -maxdepth 2 -name '_flashlab*.so' | head -n1)" "$stage/"
echo "staged: PYTHONPATH=$PWD/$bdir/python"
