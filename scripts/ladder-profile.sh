#!/usr/bin/env bash
# The profile facts quoted in docs/ladder: one ncu pass per GPU rung on the ladder problem
# (batch 4, heads 16, seqlen 4096, head dim 128, bf16), printing per kernel launch the
# time, HBM bytes, pipe utilizations and shared-memory bank conflicts.
#
#   scripts/ladder-profile.sh [BUILD_DIR] [flashlab bench flags...]   # default build/hopper
#
# ncu replays each kernel to collect its metrics and locks the clocks, so its times run
# longer than the benchmark's; quote the benchmark for speed and ncu for why.
set -uo pipefail
cd "$(dirname "$0")/.."
bdir="${1:-build/hopper}"
shift || true
bin="$bdir/flashlab"
metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum
metrics+=,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
metrics+=,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active
metrics+=,sm__warps_active.avg.pct_of_peak_sustained_active
metrics+=,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum
metrics+=,lts__t_sectors_op_red.sum

# ncu's CSV (one row per kernel launch and metric) → one line per launch.
summary=$(cat <<'EOF'
import csv, sys
rows = list(csv.reader(l for l in sys.stdin if l.startswith('"')))
if not rows:
    sys.exit("no ncu rows (is ncu on the PATH and the binary built?)")
head = rows[0]
ii, ki = head.index("ID"), head.index("Kernel Name")
mi, vi = head.index("Metric Name"), head.index("Metric Value")
launches = {}
for r in rows[1:]:
    launches.setdefault((r[ii], r[ki].split("(")[0]), {})[r[mi]] = r[vi]
for (_, kernel), m in launches.items():
    v = lambda name: float(m.get(name, "nan").replace(",", ""))
    print(f"{kernel[:40]:40s} {v('gpu__time_duration.sum') / 1e6:9.2f} ms"
          f"  read {v('dram__bytes_read.sum') / 1e9:6.2f} GB"
          f"  write {v('dram__bytes_write.sum') / 1e9:6.2f} GB"
          f"  hmma {v('sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active'):5.1f}%"
          f"  fma {v('sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active'):5.1f}%"
          f"  warps {v('sm__warps_active.avg.pct_of_peak_sustained_active'):5.1f}%"
          f"  smem-ld conflicts {v('l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum'):10.0f}"
          f"  L2 red sectors {v('lts__t_sectors_op_red.sum'):10.0f}")
EOF
)

profile() {  # profile TITLE LAUNCHES bench-flags...
  local title="$1" launches="$2"
  shift 2
  echo "== $title"
  ncu --metrics "$metrics" --launch-count "$launches" --csv --print-units base \
    "$bin" bench --iters 1 --warmup 0 --no-check "$@" 2>/dev/null | python3 -c "$summary"
}

profile "fa1 (forward)" 3 --kernel fa1 "$@"
profile "fa2_simt (forward)" 1 --kernel fa2_simt "$@"
profile "fa2_mma (forward)" 1 --kernel fa2_mma "$@"
profile "fa2_simt_bwd (backward; its forward of record first)" 4 --backward --kernel fa2_simt_bwd "$@"
