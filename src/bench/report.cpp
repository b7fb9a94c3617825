// Runs over the registry (run_bench, run_ladder), the ratios between rows, and the
// report's footer.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <numeric>

#if FLASHLAB_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include "bench/check.h"
#include "flashlab/bench.h"

namespace flashlab::bench {
namespace {

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    const size_t start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? "" : line.substr(start);
  }
  return "";
}

// Adds `line` to a footer field unless it is there already (ladder problems share most).
void merge_line(std::string& field, const std::string& line) {
  if (line.empty() || field.find(line) != std::string::npos) return;
  field += (field.empty() ? "" : "\n  ") + line;
}

void merge_footer(Report& into, const Report& from) {
  merge_line(into.device, from.device);
  merge_line(into.checked, from.checked);
  merge_line(into.timing, from.timing);
  merge_line(into.inputs, from.inputs);
}

// Keeps, for each kernel, the fp32 row where it passed and the other dtype's row did not,
// or was slower.
void keep_faster(std::vector<Row>& rows, const std::vector<Row>& fp32_rows) {
  for (size_t i = 0; i < rows.size() && i < fp32_rows.size(); ++i) {
    const Row& alt = fp32_rows[i];
    if (alt.timed() && (!rows[i].timed() || alt.time_ms < rows[i].time_ms)) rows[i] = alt;
  }
}

}  // namespace

Status run_bench(const Problem& p, const Options& o, Report* report) {
  std::unique_ptr<Bench> bench;
  if (Status s = Bench::create(p, o, &bench); !s.ok()) return s;
  std::vector<Entry> entries(o.kernels.size());
  std::vector<Entry*> all;
  for (Entry& e : entries) all.push_back(&e);
  // cpu_reference goes first, so that on fp32 its checked call is the reference the others
  // are compared with instead of a second fp64 run (Bench::add_kernel); rows keep their order.
  std::vector<size_t> order(entries.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_partition(order.begin(), order.end(), [&](size_t i) { return o.kernels[i] == "cpu_reference"; });
  for (size_t i : order) {
    if (Status s = bench->add_kernel(o.kernels[i], &entries[i]); !s.ok()) return s;
    if (o.timing.rounds > 1) continue;
    Entry* one = &entries[i];
    bench->time({&one, 1});
    one->launch = nullptr;  // its workspace goes before the next kernel's
  }
  if (o.timing.rounds > 1) bench->time(all);
  const size_t first = report->rows.size();
  for (Entry& e : entries) report->rows.push_back(std::move(e.row));
  add_ratios(report->rows, first, report->rows.size());
  bench->describe(report);
  return {};
}

Status run_problems(std::span<const Problem> ps, const Options& o, Report* report,
                    std::vector<size_t>* groups) {
  for (const Problem& p : ps) {
    groups->push_back(report->rows.size());
    Report step;
    if (Status s = run_bench(p, o, &step); !s.ok()) return s;
    merge_footer(*report, step);
    for (Row& r : step.rows) report->rows.push_back(std::move(r));
  }
  return {};
}

// One mask of the ladder: the rungs in the problem's dtype, and on the GPU in fp32 too
// (the SIMT rungs can be faster in fp32, where they need no conversions).
Status run_ladder(const Problem& base, const Options& o, Report* report, std::vector<size_t>* groups) {
  for (bool causal : {false, true}) {
    Problem p = base;
    p.causal = causal;
    groups->push_back(report->rows.size());
    Report step;
    if (Status s = run_bench(p, o, &step); !s.ok()) return s;
    if (p.device == Device::kCUDA && p.dtype != DType::kF32) {
      p.dtype = DType::kF32;
      Report alt;
      if (Status s = run_bench(p, o, &alt); !s.ok()) return s;
      keep_faster(step.rows, alt.rows);
      merge_footer(step, alt);
      add_ratios(step.rows, 0, step.rows.size());
      merge_line(step.inputs, "ladder: rungs that take fp32 were timed in " +
                                  std::string(to_string(base.dtype)) + " and fp32; each row shows the faster");
    }
    merge_footer(*report, step);
    for (Row& r : step.rows) report->rows.push_back(std::move(r));
  }
  return {};
}

void add_ratios(std::vector<Row>& rows, size_t begin, size_t end) {
  double base = kNaN, prev = kNaN;
  for (size_t i = begin; i < end && i < rows.size(); ++i) {
    Row& r = rows[i];
    if (!r.timed()) continue;
    if (std::isnan(base)) base = r.time_ms;
    r.vs_base = base / r.time_ms;
    r.vs_prev = prev / r.time_ms;
    prev = r.time_ms;
  }
}

const char* to_string(RowStatus s) {
  switch (s) {
    case RowStatus::kOk: return "ok";
    case RowStatus::kUnchecked: return "unchecked";
    case RowStatus::kFail: return "FAIL";
    case RowStatus::kUnsupported: return "unsupported";
    case RowStatus::kError: return "error";
  }
  return "?";
}

std::string format_bytes(size_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double x = double(bytes);
  int u = 0;
  while (x >= 1024 && u + 1 < int(std::size(kUnits))) {
    x /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%zu B", bytes);
  else
    std::snprintf(buf, sizeof buf, x < 10 ? "%.2f %s" : x < 100 ? "%.1f %s" : "%.0f %s", x, kUnits[u]);
  return buf;
}

std::string device_description(Device device, int threads) {
  if (device == Device::kCPU) {
    const std::string model = cpu_model();
    return "CPU: " + (model.empty() ? std::string() : model + ", ") + std::to_string(threads) +
           " thread" + (threads == 1 ? "" : "s");
  }
#if FLASHLAB_WITH_CUDA
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    cudaGetLastError();
    return "CUDA device 0";
  }
  return std::string(prop.name) + " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) +
         ", " + std::to_string(prop.multiProcessorCount) + " SMs, " +
         format_bytes(size_t(prop.l2CacheSize)) + " L2, " + format_bytes(prop.totalGlobalMem) + ")";
#else
  return "CUDA device";
#endif
}

}  // namespace flashlab::bench
