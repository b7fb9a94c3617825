// Random fuzz calls, deterministic in (seed, iteration): the same pair always builds the
// same call with the same input values, so any failure replays alone.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <random>
#include <string>

#include "call.h"

namespace flashlab::fuzz {

std::mt19937_64 rng_for(uint64_t seed, uint64_t iteration);

// A mix: about 62% valid calls (some with NaN/Inf in q, k, v), 26% invalid ones, 12% of
// extreme sizes and values.
Call random_call(std::mt19937_64& rng, const Env& env);

// A valid call on `kernel` with random sizes, dtype, mask, options and layouts.
Call random_valid(std::mt19937_64& rng, const Env& env, Pass pass, const std::string& kernel);
// Padded, permuted, broadcast (inputs) and shared layouts for every slot of a valid call.
void random_layouts(Call* c, std::mt19937_64& rng, const Env& env);

// One rule of the API broken (twists.cpp).
void make_invalid(Call* c, std::mt19937_64& rng, const Env& env);
// Sizes, strides and values at the edge of what the types hold (twists.cpp).
void make_extreme(Call* c, std::mt19937_64& rng, const Env& env);

// Every tensor of a call (cu_seqlens dropped) given `shape` [batch, seqlen, heads, head_dim]
// and `stride`, LSE [batch, heads, seqlen]; and the row-major strides of a shape, computed
// modulo 2^64 (the extreme calls are those whose true products do not fit).
void reshape_all(Target& t, const std::array<int64_t, 4>& shape,
                 const std::array<int64_t, 4>& stride);
std::array<int64_t, 4> contiguous_strides(const std::array<int64_t, 4>& shape);

// Small helpers for the generators.
inline int uniform(std::mt19937_64& rng, int lo, int hi) {  // [lo, hi]
  return lo + int(rng() % uint64_t(hi - lo + 1));
}
inline bool chance(std::mt19937_64& rng, int percent) { return int(rng() % 100) < percent; }
template <class T>
T pick(std::mt19937_64& rng, std::initializer_list<T> xs) {
  return xs.begin()[rng() % xs.size()];
}

}  // namespace flashlab::fuzz
