// What the registry entries of the Hopper forward share: cute_fa3's (fwd_dispatch.cu) and its
// schedule ablations' (ablations.cu, FLASHLAB_ABLATIONS builds only), and the tensor-map rules
// the backward's dispatch (bwd_dispatch.cu) checks too. Host code, no CuTe.
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

// A tensor map's rules for one tensor of `rows` × heads × batch rows (the forward's and the
// backward's maps alike): a 16-byte-aligned base, and every stride of a mode with more than
// one index a nonzero multiple of 16 bytes below 2^40; "" or the rule `name` breaks.
std::string tma_rules(const char* name, const void* ptr, int elem_bytes, int64_t rows,
                      int64_t row_stride, int heads, int64_t head_stride, int batch,
                      int64_t batch_stride);

}  // namespace flashlab::sm90
