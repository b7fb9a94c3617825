// The schedule ablations of cute_fa3: the Hopper forward with one technique of its schedule
// turned off (pingpong, the intra-warpgroup overlap, or both) or the persistent tile
// scheduler turned on, each registered under its own name so that the benchmark measures what
// the technique adds (docs/sm90/fwd.md). Built for bf16 head dim 128 only
// (instantiations/fwd_hdim128_bf16_<schedule>.cu), never auto's pick, and compiled only with
// the CMake option FLASHLAB_ABLATIONS (cmake/sm90_kernels.cmake; src/kernel_list.h lists
// their entries under the same option).
#include <cstddef>
#include <string>

#include "common/registry.h"
#include "cuda/sm90/fwd_dispatch.h"

namespace flashlab::sm90 {
namespace {

// The registry's name and summary of each ablation, looked up by its schedule.
struct Ablation {
  Schedule schedule;
  const char* name;
  const char* summary;
};
// A table, one row per ablation: its rows are alike by design.
constexpr Ablation kAblations[] = {
    {Schedule::kNoPingpong, "cute_fa3_no_pingpong",
     "cute_fa3 without pingpong (both consumer warpgroups issue their wgmma at will); bf16 head "
     "dim 128 only, to measure what pingpong adds"},
    {Schedule::kNoOverlap, "cute_fa3_no_overlap",
     "cute_fa3 without the intra-warpgroup overlap (each wgmma batch waited for in place, "
     "pingpong kept); bf16 head dim 128 only"},
    {Schedule::kSerial, "cute_fa3_serial",
     "cute_fa3 with neither pingpong nor the intra-warpgroup overlap: warp specialization, TMA "
     "and wgmma alone; bf16 head dim 128 only"},
    {Schedule::kPersistent, "cute_fa3_persistent",
     "cute_fa3 with the persistent tile scheduler (one CTA per SM taking tiles longest first) in "
     "place of one CTA per query tile; bf16 head dim 128 only"},
};
template <Schedule kSchedule>
constexpr Ablation ablation() {
  for (const Ablation& a : kAblations)
    if (a.schedule == kSchedule) return a;
  return {kSchedule, nullptr, nullptr};
}

template <Schedule kSchedule>
constexpr Instance kInstance = instance<DType::kBF16, 128, kSchedule>();

template <Schedule kSchedule>
std::string supports(const FwdParams& p) {
  if (p.dtype != DType::kBF16 || p.head_dim != 128)
    return "a schedule ablation of cute_fa3, built for bf16 head dim 128 only";
  return supports_instance(p, kInstance<kSchedule>);
}

template <Schedule kSchedule>
Status run(const FwdParams& p) {
  return run_instance(p, kInstance<kSchedule>);
}

// The persistent kernel's tile counter (fwd_scheduler.cuh's DynamicTiles), zeroed on the
// stream before each launch.
size_t persistent_workspace(const FwdParams&) { return 16; }

template <Schedule kSchedule>
KernelEntry ablation_entry() {
  constexpr Ablation kAblation = ablation<kSchedule>();
  static_assert(kAblation.name != nullptr, "kAblations has no entry for this schedule");
  // auto_priority 0 (the default): never auto's pick.
  return {.info = {kAblation.name, "sm90a", kAblation.summary},
          .supports_fwd = supports<kSchedule>,
          .workspace_fwd = kSchedule == Schedule::kPersistent ? persistent_workspace : nullptr,
          .run_fwd = run<kSchedule>};
}

}  // namespace

KernelEntry cute_fa3_no_pingpong_entry() { return ablation_entry<Schedule::kNoPingpong>(); }
KernelEntry cute_fa3_no_overlap_entry() { return ablation_entry<Schedule::kNoOverlap>(); }
KernelEntry cute_fa3_serial_entry() { return ablation_entry<Schedule::kSerial>(); }
KernelEntry cute_fa3_persistent_entry() { return ablation_entry<Schedule::kPersistent>(); }

}  // namespace flashlab::sm90
