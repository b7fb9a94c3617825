// placeholder for the rung 'fa1' (being written)
#include "cuda/cuda_kernels.h"

namespace flashlab {
namespace {
std::string not_yet(const FwdParams&) { return "not built yet"; }
}  // namespace
KernelEntry fa1_entry() {
  KernelEntry e;
  e.info = {"fa1", "sm80+", "placeholder", true, false};
  e.supports_fwd = not_yet;
  return e;
}
}  // namespace flashlab
