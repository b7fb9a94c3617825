#include "generate.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <limits>

namespace flashlab::fuzz {

std::mt19937_64 rng_for(uint64_t seed, uint64_t iteration) {
  std::seed_seq seq{uint32_t(seed), uint32_t(seed >> 32), uint32_t(iteration),
                    uint32_t(iteration >> 32)};
  return std::mt19937_64(seq);
}

namespace {

const KernelInfo* info_of(const Env& env, const std::string& name) {
  for (const KernelInfo& k : env.kernels)
    if (k.name == name) return &k;
  return nullptr;
}

DType random_dtype(std::mt19937_64& rng, const Env& env, const std::string& kernel) {
  const int r = uniform(rng, 0, 99);
  if (env.device == Device::kCUDA)
    return r < 40 ? DType::kF16 : r < 80 ? DType::kBF16 : r < 95 ? DType::kF32 : DType::kF64;
  if (kernel == "cpu_reference")
    return r < 40 ? DType::kF64 : r < 70 ? DType::kF32 : r < 85 ? DType::kF16 : DType::kBF16;
  return r < 35 ? DType::kF32 : r < 60 ? DType::kF16 : r < 85 ? DType::kBF16 : DType::kF64;
}

int random_head_dim(std::mt19937_64& rng, const Env& env) {
  if (env.device == Device::kCUDA) {
    const int r = uniform(rng, 0, 99);
    return r < 30   ? 64
           : r < 60 ? 128
           : r < 85 ? pick(rng, {32, 96, 256, 16})
                    : 8 * uniform(rng, 1, 32);
  }
  return chance(rng, 95) ? pick(rng, {1, 2, 3, 4, 5, 7, 8, 16, 32, 64}) : pick(rng, {96, 128, 160});
}

int random_len(std::mt19937_64& rng, const Env& env) {
  const int r = uniform(rng, 0, 99);
  if (env.device == Device::kCUDA)
    return r < 50 ? uniform(rng, 0, 70) : r < 90 ? uniform(rng, 0, 300) : uniform(rng, 300, 700);
  return r < 70 ? uniform(rng, 0, 24) : r < 95 ? uniform(rng, 0, 80) : uniform(rng, 100, 200);
}

// A window bound: unbounded, within the sequence, or far beyond it.
int random_bound(std::mt19937_64& rng, int len) {
  const int r = uniform(rng, 0, 99);
  if (r < 40) return -1;
  if (r < 80) return uniform(rng, 0, len + 3);
  return pick(rng, {len + 100, 1 << 20, INT_MAX});
}

}  // namespace

Call random_valid(std::mt19937_64& rng, const Env& env, Pass pass, const std::string& kernel) {
  Call c;
  c.pass = pass;
  c.kernel = kernel;
  c.data_seed = rng();
  const DType dt = random_dtype(rng, env, kernel);
  const int D = random_head_dim(rng, env);
  const int heads_kv = uniform(rng, 1, 3), heads_q = heads_kv * uniform(rng, 1, 3);
  test::Problem& p = c.p;
  if (chance(rng, 30)) {
    std::vector<int> lq(size_t(uniform(rng, 1, 4))), lk(lq.size());
    for (int& l : lq) l = chance(rng, 20) ? 0 : random_len(rng, env);
    for (int& l : lk) l = chance(rng, 20) ? 0 : random_len(rng, env);
    p = test::varlen(dt, lq, lk, heads_q, heads_kv, D);
    if (chance(rng, 20)) {
      c.max_seqlen_q = p.max_len_q() + uniform(rng, 1, 5);
      c.max_seqlen_k = p.max_len_k() + uniform(rng, 1, 5);
    }
  } else {
    // One draw per statement: the order of a call's arguments is unspecified.
    const int batch = chance(rng, 5) ? 0 : uniform(rng, 1, 3);
    const int seqlen_q = random_len(rng, env);
    const int seqlen_k = random_len(rng, env);
    p = test::dense(dt, batch, seqlen_q, seqlen_k, heads_q, heads_kv, D);
  }
  if (chance(rng, 20)) p.head_dim_v = random_head_dim(rng, env);
  if (chance(rng, 25)) p.causal = true;
  if (chance(rng, 30)) {
    p.window_left = random_bound(rng, p.max_len_k());
    p.window_right = random_bound(rng, p.max_len_q());
  }
  if (chance(rng, 15)) p.softcap = float(uniform(rng, 10, 300)) / 10.f;
  if (chance(rng, 30)) {
    const double u = double(uniform(rng, 1, 30)) / 10.0;
    p.scale = float((chance(rng, 10) ? -u : u) / std::sqrt(double(D)));
  }
  const KernelInfo* info = info_of(env, kernel);
  const bool takes_dropout =
      !info || (pass == Pass::kForward ? info->forward_dropout : info->backward_dropout);
  if (chance(rng, takes_dropout ? 15 : 3)) {
    const float prob = pick(rng, {0.1f, 0.3f, 0.5f, 0.9f});
    const uint64_t seed = rng();
    const uint64_t offset = rng() >> uniform(rng, 0, 63);
    p.drop(prob, seed, offset);
  }
  const int t = uniform(rng, 0, 99);
  p.num_threads = t < 50 ? 0 : t < 95 ? uniform(rng, 1, 4) : pick(rng, {7, 16, 64});
  p.with_lse = pass == Pass::kBackward || chance(rng, 80);
  c.deterministic = chance(rng, 30);
  random_layouts(&c, rng, env);
  return c;
}

void random_layouts(Call* c, std::mt19937_64& rng, const Env& env) {
  const auto shapes = shapes_of(*c);
  contiguous_layouts(c);
  const int64_t align = env.device == Device::kCUDA ? 16 / int64_t(dtype_size(c->p.dtype)) : 1;
  bool padded = false;
  for (int slot : {kQ, kK, kV, kDout, kOut, kLse, kDq, kDk, kDv}) {
    if (shapes[slot].empty()) continue;
    LayoutOptions o;
    o.permute = chance(rng, 30);
    o.pad = chance(rng, 35);
    // Broadcast inputs only: out and LSE are the backward's inputs but the forward's outputs.
    o.zero = (slot == kQ || slot == kK || slot == kV || slot == kDout) && chance(rng, 15);
    o.align = slot == kLse ? 1 : std::max<int64_t>(align, 1);
    c->layout[slot] = random_layout(shapes[slot], o, rng);
    padded = padded || (o.pad && slot <= kV);
  }
  // Inputs read through one buffer twice: k = v, q = k (self-attention shapes).
  if (shapes[kK] == shapes[kV] && chance(rng, 10)) {
    c->layout[kV] = c->layout[kK];
    c->same_as[kV] = kK;
  }
  if (shapes[kQ] == shapes[kK] && chance(rng, 10)) {
    c->layout[kK] = c->layout[kQ];
    c->same_as[kK] = kQ;
    if (c->same_as[kV] == kK) c->same_as[kV] = kQ;
  }
  c->nan_padding = padded && chance(rng, 30);
}

Call random_call(std::mt19937_64& rng, const Env& env) {
  const Pass pass = env.has(Pass::kBackward) && chance(rng, 35) ? Pass::kBackward : Pass::kForward;
  std::vector<std::string> names;
  for (const KernelInfo& k : env.kernels)
    if (pass == Pass::kForward ? k.has_forward : k.has_backward) names.emplace_back(k.name);
  const std::string kernel =
      names.empty() || chance(rng, 15) ? std::string(kAutoKernel) : names[rng() % names.size()];
  Call c = random_valid(rng, env, pass, kernel);
  const int kind = uniform(rng, 0, 99);
  if (kind < 62) {
    // NaN and Inf in q, k, v (forward; dropout off: a dropped key still multiplies its V).
    if (pass == Pass::kForward && chance(rng, 15)) {
      c.p.dropout_p = 0.f;
      c.kind = "valid, NaN/Inf in q/k/v";
      for (int n = uniform(rng, 1, 3); n > 0; --n) {
        const int slot = pick(rng, {int(kQ), int(kK), int(kV)});
        const int64_t numel = c.layout[slot].numel();
        if (numel == 0) continue;
        const int r = uniform(rng, 0, 99);
        const double x = r < 60 ? std::numeric_limits<double>::quiet_NaN()
                                : (r < 80 ? 1 : -1) * std::numeric_limits<double>::infinity();
        c.nonfinite.push_back({slot, int64_t(rng() % uint64_t(numel)), x});
      }
    }
  } else if (kind < 88) {
    make_invalid(&c, rng, env);
  } else {
    make_extreme(&c, rng, env);
  }
  return c;
}

}  // namespace flashlab::fuzz
