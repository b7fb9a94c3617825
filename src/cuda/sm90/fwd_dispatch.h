// What the registry entries of the Hopper forward share: cute_fa3's (fwd_dispatch.cu) and its
// schedule ablations' (ablations.cu, FLASHLAB_ABLATIONS builds only). Host code, no CuTe.
#pragma once

#include <string>

#include "common/params.h"
#include "cuda/sm90/fwd_instance.h"
#include "flashlab/flashlab.h"

namespace flashlab::sm90 {

// One instantiation's entry points (fwd_instance.h).
struct Instance {
  Status (*run)(const FwdParams&);
  const void* (*kernel)();
  int (*smem_bytes)();
};

template <DType kDtype, int kHeadDim, Schedule kSchedule = Schedule::kFull>
constexpr Instance instance() {
  using I = FwdInstance<kDtype, kHeadDim, kSchedule>;
  return {&I::run, &I::kernel, &I::smem_bytes};
}

// "" when the instantiation `in` can serve p, else the reason: the checks every schedule
// shares (inputs, head dims, grid limits, TMA's rules, the device).
std::string supports_instance(const FwdParams& p, const Instance& in);

// Launches `in` on p's device and stream.
Status run_instance(const FwdParams& p, const Instance& in);

}  // namespace flashlab::sm90
