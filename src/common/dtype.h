// Host-side element conversions for the CPU kernels and tests: fp16 and bf16 are stored
// as raw uint16_t bits, converted with round-to-nearest-even as the GPU does.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#include "flashlab/flashlab.h"

namespace flashlab {

inline float bf16_bits_to_float(uint16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }

inline uint16_t float_to_bf16_bits(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return uint16_t(u >> 16);
}

inline float half_bits_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: renormalize
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400u) == 0);
      u = sign | uint32_t(127 - 15 - e) << 23 | (man & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | man << 13;
  } else {
    u = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  return std::bit_cast<float>(u);
}

inline uint16_t float_to_half_bits(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {  // subnormal or zero in half: value = m · 2^-24
    float scaled = std::bit_cast<float>(abs) * 16777216.f;  // exact: power of two
    return uint16_t(sign | uint32_t(std::nearbyint(scaled)));
  }
  uint32_t mant_round = abs + 0xfffu + ((abs >> 13) & 1u);  // nearest even at bit 13
  return uint16_t(sign | ((mant_round - (uint32_t(127 - 15) << 23)) >> 13));
}

// Read element i of a buffer of `dtype` as double / float.
inline double load_as_double(const void* base, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(base)[i];
    case DType::kF64: return static_cast<const double*>(base)[i];
    case DType::kF16: return half_bits_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kBF16: return bf16_bits_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kI32: return static_cast<const int32_t*>(base)[i];
  }
  return 0.0;
}

inline float load_as_float(const void* base, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(base)[i];
    case DType::kF64: return float(static_cast<const double*>(base)[i]);
    case DType::kF16: return half_bits_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kBF16: return bf16_bits_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kI32: return float(static_cast<const int32_t*>(base)[i]);
  }
  return 0.f;
}

// Write `x` rounded to `dtype` at element i.
inline void store_from_double(void* base, DType dtype, int64_t i, double x) {
  switch (dtype) {
    case DType::kF32: static_cast<float*>(base)[i] = float(x); return;
    case DType::kF64: static_cast<double*>(base)[i] = x; return;
    case DType::kF16: static_cast<uint16_t*>(base)[i] = float_to_half_bits(float(x)); return;
    case DType::kBF16: static_cast<uint16_t*>(base)[i] = float_to_bf16_bits(float(x)); return;
    case DType::kI32: static_cast<int32_t*>(base)[i] = int32_t(x); return;
  }
}

// Round a value to what `dtype` can hold (identity for fp32/fp64).
inline float round_to(DType dtype, float x) {
  switch (dtype) {
    case DType::kF16: return half_bits_to_float(float_to_half_bits(x));
    case DType::kBF16: return bf16_bits_to_float(float_to_bf16_bits(x));
    default: return x;
  }
}

}  // namespace flashlab
