// Runs one fuzz call through the public API and judges the answer.
//
//   - select_kernel, workspace_size and the pass must agree on the Status code;
//   - an invalid call must get a non-ok Status from all three;
//   - a valid call gets ok, or kUnsupported with a reason;
//   - an accepted call writes every output element (outputs are poisoned first), nothing
//     outside its views and none of its inputs, and its values are within docs/DESIGN.md's rule
//     against the fp64 oracle (cpu_reference on fp64 copies): max abs error <= 2 x that of
//     the same-dtype yardstick + 1e-5 x the values' magnitude (test_util's rule_bound;
//     fp64: 1e-9 of the values' magnitude);
//     where a kernel misses that bound but stays within 2x the error of FlashAttention-2's
//     own rounding (test_util's emulation), the rule is out of reach for the call: it passes
//     and the summary counts it apart;
//   - with NaN or Inf placed in q, k or v, a row that sees a NaN and no Inf (its query or a
//     visible key) is non-finite, and every row that sees none is finite and within the rule.
#pragma once

#include <string>

#include "call.h"

namespace flashlab::fuzz {

// Failure classes, as the summary counts them.
inline constexpr const char* kInvalidAccepted = "invalid call accepted";
inline constexpr const char* kWrongResult = "wrong result";
inline constexpr const char* kValidRefused = "valid call refused";
inline constexpr const char* kDisagreement = "status disagreement";
inline constexpr const char* kCudaError = "CUDA error";
inline constexpr const char* kOracleFailure = "oracle failure";

struct Outcome {
  // kOutOfReach: passed, but only within 2x the error of FlashAttention-2's own rounding
  // (test_util's emulation), not 2x the rule's yardstick.
  enum Kind { kPassed, kOutOfReach, kUnsupported, kRefused, kNotRun, kFailed };
  Kind kind = kPassed;
  const char* failure = "";  // one of the classes above when kFailed
  std::string message;
};

Outcome execute(const Call& c, const Env& env);

// Waits for the device and reports a pending CUDA error ("" on the CPU or when none).
std::string device_error(const Env& env);

}  // namespace flashlab::fuzz
