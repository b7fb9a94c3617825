// The check every registry kernel goes through, CPU or GPU: one case (a Problem) at a
// time, fresh random inputs, outputs poisoned, the kernel run through the public API by
// name, then
//   - every output element written and nothing around the views touched,
//   - the inputs unchanged,
//   - out, lse, dq, dk, dv within docs/DESIGN.md's rule: max abs error vs the fp64 oracle
//     <= 2 x that of the low-precision yardstick + 1e-5.
// A case the kernel does not support (select_kernel says kUnsupported) is counted with
// its reason; a suite that ran no case at all fails.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "test_util.h"

namespace flashlab::test {

// Where a kernel's tensors live for one case. The host placement hands out views of the
// host tensors themselves; a device placement (tests/gpu/gpu_fixture.h) mirrors each
// tensor's whole storage, poison padding included, and copies it back on fetch().
class Placement {
 public:
  virtual ~Placement() = default;
  virtual Device device() const = 0;
  virtual void* stream() { return nullptr; }
  // A view of `t` where the kernel runs, holding t's current values. Placing the same
  // tensor again refreshes those values in the same view. Absent tensors stay absent.
  virtual Tensor place(const HostTensor& t) = 0;
  // Scratch for the kernel, filled with garbage (kernels must not expect zeros).
  virtual void* scratch(size_t bytes) = 0;
  // Waits for the kernel and copies a placed tensor back into `t`'s storage.
  virtual bool fetch(HostTensor& t) = 0;
  // False once any device call failed (the failure is already reported).
  virtual bool ok() const = 0;
};

class HostPlacement final : public Placement {
 public:
  Device device() const override { return Device::kCPU; }
  Tensor place(const HostTensor& t) override { return t.view(); }
  void* scratch(size_t bytes) override;
  bool fetch(HostTensor&) override { return true; }
  bool ok() const override { return true; }

 private:
  std::vector<std::unique_ptr<std::byte[]>> scratch_;
};

struct Case {
  std::string name;
  Problem problem;
};

// What a suite did with its table, printed as "ran N cases, M unsupported: <reasons>".
struct Tally {
  int ran = 0;
  std::vector<std::string> unsupported;  // "case: reason"
  // Prints the summary; fails the test when no case ran.
  void finish(std::string_view kernel, std::string_view pass, size_t cases) const;
};

using PlacementFactory = std::unique_ptr<Placement> (*)();
std::unique_ptr<Placement> make_host_placement();

void check_forward(std::string_view kernel, const Case& c, PlacementFactory where, Tally* tally);
void check_backward(std::string_view kernel, const Case& c, PlacementFactory where, Tally* tally);

// Dropout's mask as the kernel applies it: with V the identity (as many keys as V's head
// dim), out[b, i, h, j] = P_ij · M_ij / (1 − p), so the zeros of out are the dropped pairs.
// They must be exactly those DropoutPolicy::keep drops, and their fraction within 0.01 of
// p. Skips with the reason when the kernel takes no dropout or not this call.
void check_dropout_mask(std::string_view kernel, DType dtype, PlacementFactory where);

// One pass of one kernel over a table of cases, then the tally. A kernel that registers
// neither pass fails; one that lacks only this pass is skipped with that reason.
void run_suite(std::string_view kernel, bool backward, const std::vector<Case>& cases,
               PlacementFactory where);

// The registry's kernels: those with arch "cpu" (except the oracle) or all the others.
std::vector<std::string> cpu_kernels_under_test();
std::vector<std::string> gpu_kernels_under_test();
const KernelInfo* find_kernel(std::string_view name);
// gtest instance names: the kernel name, with anything but [A-Za-z0-9_] made '_'.
std::string kernel_param_name(const ::testing::TestParamInfo<std::string>& info);

}  // namespace flashlab::test
