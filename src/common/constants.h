// Numeric constants shared by the host code and every kernel, one definition each.
// Softmax runs in base 2 (exp2 is one MUFU instruction on the GPU and the cheapest exponential
// on the CPU): scores are scaled by log2(e) going in, and the LSE comes back to natural log
// through ln(2).
#pragma once

namespace flashlab {

inline constexpr float kLog2e = 1.4426950408889634f;  // nats → log2 units
inline constexpr float kLn2 = 0.6931471805599453f;    // log2 units → nats
inline constexpr double kLog2eF64 = 1.4426950408889634;
inline constexpr double kLn2F64 = 0.6931471805599453;

}  // namespace flashlab
