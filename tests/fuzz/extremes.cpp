// Calls at the edge of what the types hold. Meaningless ones (element counts or byte
// offsets past int64, 2^32 (batch, head) pairs over a few bytes) must be refused; the
// others (huge max_seqlen, num_threads, softmax_scale, softcap) may be refused, and when
// accepted they must be right.
#include <climits>
#include <cstdint>

#include "generate.h"

namespace flashlab::fuzz {

// Every tensor (cu_seqlens dropped) given `shape` as [batch, seqlen, heads,
// head_dim] and `stride`; LSE [batch, heads, seqlen]. Unsigned arithmetic: the point is
// that the true products do not fit.
void reshape_all(Target& t, const std::array<int64_t, 4>& shape,
                 const std::array<int64_t, 4>& stride) {
  *t.t[kCuQ] = *t.t[kCuK] = Tensor{};
  for (int s : {kQ, kK, kV, kOut, kDout, kDq, kDk, kDv}) {
    if (!t.t[s] || !t.t[s]->rank) continue;
    Tensor& x = *t.t[s];
    x.rank = 4;
    x.shape = shape;
    x.stride = stride;
  }
  if (t.t[kLse] && t.t[kLse]->rank) {
    Tensor& l = *t.t[kLse];
    l.rank = 3;
    l.shape = {shape[0], shape[2], shape[1], 0};
    l.stride = {stride[0], stride[2], stride[1] ? 1 : 0, 0};
  }
}

std::array<int64_t, 4> contiguous_strides(const std::array<int64_t, 4>& shape) {
  std::array<int64_t, 4> st{};
  uint64_t acc = 1;
  for (int d = 3; d >= 0; --d) {
    st[d] = int64_t(acc);
    acc *= uint64_t(shape[d]);
  }
  return st;
}

namespace {

void element_count_overflow(Call* c, std::mt19937_64& rng) {
  std::array<int64_t, 4> shape;
  if (chance(rng, 30)) {
    shape = {int64_t(1) << 30, int64_t(1) << 30, 16, 1};
  } else {
    for (int d = 0; d < 3; ++d) shape[d] = uniform(rng, 1 << 20, INT_MAX);
    shape[3] = pick<int64_t>(rng, {1, 8, 64});
  }
  const std::array<int64_t, 4> stride = contiguous_strides(shape);
  c->expect = Expect::kInvalid;
  c->twist = "every tensor [" + std::to_string(shape[0]) + "," + std::to_string(shape[1]) + "," +
             std::to_string(shape[2]) + "," + std::to_string(shape[3]) + "], null data";
  c->edit_args = [shape, stride](Target& t) {
    reshape_all(t, shape, stride);
    for (Tensor* x : t.t)
      if (x) x->data = nullptr;
  };
}

void byte_offset_overflow(Call* c, std::mt19937_64& rng) {
  std::vector<int> slots;
  for (int s : {kQ, kK, kV, kOut, kDout, kDq, kDk, kDv})
    if (c->layout[s].rank() && c->layout[s].numel() > 0)
      for (int d = 0; d + 1 < c->layout[s].rank(); ++d)
        if (c->layout[s].shape[d] > 1) slots.push_back(s * 8 + d);
  if (slots.empty()) {
    element_count_overflow(c, rng);
    return;
  }
  const int pickd = slots[rng() % slots.size()], s = pickd / 8, d = pickd % 8;
  // (shape - 1) · stride · element size >= 2^63 for every dtype of two bytes or more.
  const int64_t to = (int64_t(1) << 62) + int64_t(rng() >> 2);
  c->expect = Expect::kInvalid;
  c->twist =
      std::string(slot_name(s)) + ".stride[" + std::to_string(d) + "] = " + std::to_string(to);
  c->edit_args = [s, d, to](Target& t) { t.t[s]->stride[d] = to; };
}

void batch_heads_overflow(Call* c, std::mt19937_64& rng) {
  // A tiny real problem whose views claim 2^32 (batch, head) pairs through zero strides.
  const int D = c->p.head_dim;
  c->p = test::dense(c->p.dtype, 1, 1, 1, 1, 1, D);
  c->max_seqlen_q = c->max_seqlen_k = -1;
  contiguous_layouts(c);
  c->same_as.fill(-1);
  c->alias_slot = c->alias_into = -1;
  const int64_t batch = 65536 + uniform(rng, 0, 1000), heads = 65536;
  c->expect = Expect::kInvalid;
  c->twist =
      "batch " + std::to_string(batch) + " x heads " + std::to_string(heads) + " over zero strides";
  c->edit_args = [batch, heads, D](Target& t) {
    reshape_all(t, {batch, 1, heads, D}, {0, 0, 0, 1});
  };
}

void huge_max_seqlen(Call* c, std::mt19937_64& rng, const Env& env) {
  if (!c->p.varlen()) {
    std::vector<int> lq(size_t(uniform(rng, 1, 3))), lk(lq.size());
    for (int& l : lq) l = uniform(rng, 0, 5);
    for (int& l : lk) l = uniform(rng, 0, 5);
    test::Problem p = test::varlen(c->p.dtype, lq, lk, c->p.heads_q, c->p.heads_kv, c->p.head_dim);
    p.head_dim_v = c->p.head_dim_v;
    p.with_lse = c->p.with_lse;
    c->p = p;
    c->same_as.fill(-1);
    random_layouts(c, rng, env);
  }
  c->max_seqlen_q = uniform(rng, 1 << 20, INT_MAX);
  c->max_seqlen_k = uniform(rng, 1 << 20, INT_MAX);
  if (chance(rng, 50)) c->quadratic_limit = SIZE_MAX;
  c->expect = Expect::kRefuseOrCorrect;
  c->twist = "huge max_seqlen";
}

}  // namespace

void make_extreme(Call* c, std::mt19937_64& rng, const Env& env) {
  c->nonfinite.clear();
  switch (uniform(rng, 0, 6)) {
    case 0:
      element_count_overflow(c, rng);
      c->kind = "element count past int64";
      return;
    case 1:
      byte_offset_overflow(c, rng);
      c->kind = "byte offset past int64";
      return;
    case 2:
      batch_heads_overflow(c, rng);
      c->kind = "batch * heads past 2^31";
      return;
    case 3:
      huge_max_seqlen(c, rng, env);
      c->kind = "huge max_seqlen";
      return;
    case 4:
      c->p.num_threads = pick(rng, {1000, 2000, 65536, INT_MAX});
      c->twist = "huge num_threads";
      break;
    case 5:
      c->p.scale = pick(rng, {1e20f, 1e30f, 2.4e38f, 3.4e38f, -1e30f});
      c->twist = "huge softmax_scale";
      break;
    default:
      c->p.softcap = pick(rng, {1e30f, 3e38f});
      c->twist = "huge softcap";
      break;
  }
  c->expect = Expect::kRefuseOrCorrect;
  c->kind = c->twist;
}

}  // namespace flashlab::fuzz
