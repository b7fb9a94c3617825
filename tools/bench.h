// The benchmark harness behind `flashlab bench`: one attention problem, a list of
// kernels, and for each kernel one row. A row is made in a fixed order, so that no
// number is printed for a kernel that computes the wrong thing:
//   1. supports?  select_kernel() names the kernel; its refusal is the row's reason.
//   2. check      outputs are poisoned (NaN), the kernel runs once, every output element
//                 must be written, and the result is compared with cpu_reference run in
//                 fp64 on the same inputs (on a slice of batch 0 when the problem is large).
//   3. time       tools/timer.h: warm-up, median, input sets rotated past the L2 cache.
// Inputs are fresh unit-normal-ish values every run (a seed makes a run repeatable).
// Extra memory is the kernel's workspace_size(): the library never allocates, so its
// scratch is exactly what the caller must provide. The harness itself allocates freely.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "common/mask.h"
#include "flashlab/flashlab.h"

namespace flashlab::bench {

struct Problem {
  int batch = 1;
  int heads_q = 8;
  int heads_kv = 8;
  int seqlen_q = 4096;
  int seqlen_k = 4096;
  int head_dim = 128;
  int head_dim_v = 128;
  DType dtype = DType::kF32;
  Device device = Device::kCPU;
  bool causal = false;
  int window_left = -1;  // -1: unbounded
  int window_right = -1;
  float softcap = 0.f;   // 0: off
  bool backward = false; // time the backward pass instead of the forward
  // Kernels with O(seqlen²) workspace (cpu_reference, naive) refuse above this.
  size_t quadratic_workspace_limit = size_t(4) << 30;
};

// The problem's mask as the kernels see it: FlashAttention's normalization (a window at
// least as wide as the keys is unbounded; causal is the right window 0), the same one
// the API's validation applies.
MaskPolicy mask_of(const Problem& p);

// The one FLOP formula: forward = 2·(head_dim + head_dim_v) per (query, key) pair that
// the mask allows, summed exactly over rows (4·B·H·Sq·Sk·D unmasked, ~half causal);
// the backward counts 2.5x its forward.
double forward_flops(const Problem& p);
double pass_flops(const Problem& p);

// "1x8x4096x128 fp32"; GQA, Sq != Sk and Dv != D add "/other": "2x8/2x512/1024x64 bf16".
std::string shape_string(const Problem& p);
// "none", "causal", "window(64,0)", each with "+softcap(30)" when on.
std::string mask_string(const Problem& p);

// Max abs error allowed against the fp64 reference, by input dtype (unit-normal inputs,
// default softmax scale).
struct Tolerance {
  double out = 0;   // out and lse
  double grad = 0;  // dq, dk, dv: times max(1, max |reference|) of that gradient
};
Tolerance tolerance_for(DType dtype);

struct Options {
  std::vector<std::string> kernels;  // in row order
  int warmup = 1;                    // runs before the timed ones
  int iters = 5;                     // timed runs (median)
  int threads = 0;                   // CPU kernels and the check; 0 = all hardware threads
  uint64_t seed = 0;
  bool check = true;                 // compare with the fp64 reference
  bool progress = true;              // progress lines on stderr for long runs
};

enum class RowStatus {
  kOk,           // checked and within tolerance
  kUnchecked,    // ran, every output written, not compared (--no-check)
  kFail,         // error above tolerance, or an output element not written
  kUnsupported,  // the kernel refused the problem (reason says why)
  kError,        // a library or CUDA error while running (reason has the message)
};
const char* to_string(RowStatus s);

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Row {
  std::string kernel;
  Problem problem;
  RowStatus status = RowStatus::kOk;
  std::string reason;  // unsupported / error / what failed the check
  double time_ms = kNaN;
  int warmup_runs = 0;
  int timed_runs = 0;
  double flops = 0;
  double tflops = kNaN;
  size_t workspace_bytes = 0;
  // Max abs error against the fp64 reference; NaN when not compared or not an output.
  double err_out = kNaN, err_lse = kNaN, err_dq = kNaN, err_dk = kNaN, err_dv = kNaN;
  double vs_base = kNaN;  // time of the group's first timed row that passed / this time
  double vs_prev = kNaN;  // time of the previous timed row that passed / this time

  bool timed() const { return status == RowStatus::kOk || status == RowStatus::kUnchecked ||
                              status == RowStatus::kFail; }
};

struct Report {
  std::vector<Row> rows;
  std::string device;   // "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 50 MiB L2)" or "CPU: ..."
  std::string checked;  // what the check compared
  std::string timing;   // how the times were taken
  std::string inputs;   // seed, and where the backward's out/lse came from
};

// Runs every kernel of `opt.kernels` on `p`. Rows of kernels that refuse or fail are
// part of the report; the Status is not OK only when the harness itself cannot go on
// (allocation, CUDA device, an invalid problem).
Status run_bench(const Problem& p, const Options& opt, Report* report);

// vs base / vs prev over consecutive rows [begin, end) that form one comparison. Rows
// that failed their check are compared but never compared against.
void add_ratios(std::vector<Row>& rows, size_t begin, size_t end);

// "CPU: AMD EPYC, 2 threads" or the CUDA device's name and size.
std::string device_description(Device device, int threads);

// "0 B", "230 KiB", "4.00 GiB".
std::string format_bytes(size_t bytes);

}  // namespace flashlab::bench
