#!/usr/bin/env bash
# The one command for a GPU machine: build for the local GPU (sm_90a by default), run every
# test (CPU and GPU), the GPU suite under compute-sanitizer, and the benchmarks; print a
# summary table last. Full logs go to $OUT (or ./gpu-check-logs when OUT is unset).
#
#   scripts/gpu-check.sh [--no-sanitizer] [--no-bench] [--no-python] [--no-pybench]
#                        [--filter GTEST_FILTER]
#                        [-- extra bench flags]
#
# The Python steps (when python3 has torch and nanobind): the same build makes the extension
# (-DFLASHLAB_PYTHON=ON), scripts/py-build.sh --stage-only stages it, then pytest on
# tests/python and `python -m flashlab.bench --quick`.
#
# CUTLASS headers: the build finds them through -DCUTLASS_DIR; on a machine without network,
# carry them in .cutlass/include (an ignored folder) and this script points the build there.
set -uo pipefail
cd "$(dirname "$0")/.."

sanitize=1 bench=1 python=1 pybench=1 filter='*Gpu*'
# The reduced case set the sanitizers run (FLASHLAB_TEST_CASES: name substrings).
sanitizer_cases='bf16_hdim64_basic,fp16_hdim128_causal,bf16_hdim64_sq_gt_sk_causal_masked_rows,fp16_hdim128_gqa8to1,bf16_hdim128_window_32_8,fp16_hdim64_varlen_zero_lengths,bf16_hdim128_padded_strides,fp32_hdim64_seqlen127,bf16_hdim64_dropout_causal_gqa,bf16_hdim256,fp16_hdim64_softcap_causal'
bench_extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --no-sanitizer) sanitize=0 ;;
    --no-bench) bench=0 ;;
    --no-python) python=0 ;;
    --no-pybench) pybench=0 ;;
    --filter) filter="$2"; shift ;;
    --) shift; bench_extra=("$@"); break ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
  shift
done

# Under the device tool's $OUT (which returns at most 8 files) the logs are packed into one
# gpu-check-logs.tar.gz at the end.
logs="${OUT:+$OUT/gpu-check}"
logs="${logs:-$PWD/gpu-check-logs}"
mkdir -p "$logs"
declare -a rows=()
failed=0

step() {  # step NAME LOGFILE COMMAND...
  local name="$1" log="$2"; shift 2
  local t0=$SECONDS
  echo "== $name: $*" | tee -a "$logs/$log"
  if "$@" >>"$logs/$log" 2>&1; then
    rows+=("$(printf '%-28s %-6s %5ss  %s' "$name" PASS $((SECONDS - t0)) "$log")")
  else
    rows+=("$(printf '%-28s %-6s %5ss  %s' "$name" FAIL $((SECONDS - t0)) "$log")")
    failed=1
  fi
  tail -n 25 "$logs/$log"
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$logs/gpu.txt"

cutlass_flag=()
[ -f .cutlass/include/cute/tensor.hpp ] && cutlass_flag=(-DCUTLASS_DIR="$PWD/.cutlass/include")
# The Python module comes out of the same build (one compile of the CUDA sources).
python_flag=(-DFLASHLAB_PYTHON=OFF)
[ "$python" = 1 ] && python3 -c 'import torch, nanobind' 2>/dev/null &&
  python_flag=(-DFLASHLAB_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)")
step configure build.log cmake --preset hopper "${cutlass_flag[@]}" "${python_flag[@]}"
step build build.log cmake --build --preset hopper -j "$(nproc)"
step "tests (all)" tests.log ctest --preset hopper
bin=build/hopper
if [ "$sanitize" = 1 ]; then
  for tool in memcheck racecheck synccheck; do
    step "sanitizer $tool" "sanitizer-$tool.log" env FLASHLAB_TEST_CASES="$sanitizer_cases" \
      compute-sanitizer --tool "$tool" --error-exitcode 1 \
      "$bin/tests/flashlab_tests" --gtest_filter="$filter"
  done
fi
if [ "$bench" = 1 ]; then
  step "bench (default GPU)" bench.log "$bin/flashlab" bench "${bench_extra[@]}"
  step "bench --ladder" ladder.log "$bin/flashlab" bench --ladder "${bench_extra[@]}"
  step "bench --backward" backward.log "$bin/flashlab" bench --backward "${bench_extra[@]}"
  step "bench --backward --causal" backward.log "$bin/flashlab" bench --backward --causal "${bench_extra[@]}"
fi

if [ "${python_flag[0]}" = -DFLASHLAB_PYTHON=ON ]; then
  step "python: stage" python.log scripts/py-build.sh --stage-only "$bin"
  export PYTHONPATH="$PWD/$bin/python${PYTHONPATH:+:$PYTHONPATH}"
  step "python: pytest" pytest.log python3 -m pytest tests/python -q -rs
  if [ "$bench" = 1 ] && [ "$pybench" = 1 ]; then
    step "python: bench --quick" pybench.log python3 -m flashlab.bench --quick --out "$logs/pybench"
  fi
fi

echo
echo "== summary ($(head -n1 "$logs/gpu.txt"))"
printf '%-28s %-6s %6s  %s\n' step result time log
printf '%s\n' "${rows[@]}"
if [ -n "${OUT:-}" ]; then
  tar czf "$OUT/gpu-check-logs.tar.gz" -C "$logs" . && rm -rf "$logs"
  echo "logs: gpu-check-logs.tar.gz"
fi
exit $failed
