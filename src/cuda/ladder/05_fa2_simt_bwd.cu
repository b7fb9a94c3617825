// placeholder for the rung 'fa2_simt_bwd' (being written)
#include "cuda/cuda_kernels.h"

namespace flashlab {
namespace {
std::string not_yet(const FwdParams&) { return "not built yet"; }
}  // namespace
KernelEntry fa2_simt_bwd_entry() {
  KernelEntry e;
  e.info = {"fa2_simt_bwd", "sm80+", "placeholder", true, false};
  e.supports_fwd = not_yet;
  return e;
}
}  // namespace flashlab
