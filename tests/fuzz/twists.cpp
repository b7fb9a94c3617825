// The invalid and extreme calls: a valid call with one rule of the API broken, or with
// sizes, strides and values at the edge of what the types hold.
#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <cstdint>
#include <limits>

#include "generate.h"

namespace flashlab::fuzz {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Slots among `among` that the call has, with at least `min_numel` elements.
std::vector<int> present(const Call& c, std::initializer_list<int> among, int64_t min_numel = 0) {
  std::vector<int> out;
  for (int s : among)
    if (c.layout[s].rank() > 0 && c.layout[s].numel() >= min_numel) out.push_back(s);
  return out;
}

std::vector<int> outputs(const Call& c) {
  return c.backward() ? present(c, {kDq, kDk, kDv}, 1) : present(c, {kOut, kLse}, 1);
}

std::vector<int> tensors(const Call& c) {
  return present(c, {kQ, kK, kV, kOut, kLse, kDout, kDq, kDk, kDv, kCuQ, kCuK});
}

int any_of(std::mt19937_64& rng, const std::vector<int>& xs) {
  return xs.empty() ? -1 : xs[rng() % xs.size()];
}

// Non-last dims of a layout with more than one element.
std::vector<int> wide_dims(const Layout& l) {
  std::vector<int> d;
  for (int i = 0; i + 1 < l.rank(); ++i)
    if (l.shape[i] > 1) d.push_back(i);
  return d;
}

void edit(Call* c, std::string what, std::function<void(Target&)> f) {
  c->twist = std::move(what);
  c->edit_args = std::move(f);
}

std::string name(int slot) { return slot_name(slot); }

// ---- overlaps: an output inside an input, inside another output, or inside itself ----

bool output_inside_other(Call* c, std::mt19937_64& rng, const Env& env) {
  const int slot = any_of(rng, outputs(*c));
  if (slot < 0) return false;
  std::vector<int> into;
  for (int s : present(*c, {kQ, kK, kV, kDout, kOut, kLse, kDq, kDk}, 1))
    if (s < slot && c->same_as[s] < 0) into.push_back(s);
  const int host = any_of(rng, into);
  if (host < 0) return false;
  const Layout& h = c->layout[host];
  // Over one of the host's elements (its first one, half the time).
  const int64_t elem = chance(rng, 50) ? 0 : int64_t(rng() % uint64_t(h.numel()));
  size_t off = size_t(h.offsets()[size_t(elem)]) * dtype_size(c->dtype_of(host));
  const size_t align = env.device == Device::kCUDA ? 16 : dtype_size(c->dtype_of(slot));
  off = off / align * align;
  c->alias_slot = slot;
  c->alias_into = host;
  c->alias_byte_offset = off;
  c->twist = name(slot) + " overlaps " + name(host);
  return true;
}

bool output_overlaps_itself(Call* c, std::mt19937_64& rng, const Env&) {
  const int slot = any_of(rng, outputs(*c));
  if (slot < 0) return false;
  Layout& l = c->layout[slot];
  const std::vector<int> dims = wide_dims(l);
  if (dims.empty()) return false;
  const int a = any_of(rng, dims);
  int b = any_of(rng, dims);
  if (a == b || chance(rng, 40)) {
    l.stride[a] = 0;  // a broadcast output
    c->twist = name(slot) + ".stride[" + std::to_string(a) + "] = 0";
  } else {
    l.stride[a] = l.stride[b];  // elements (a=1, b=0) and (a=0, b=1) coincide
    c->twist =
        name(slot) + ".stride[" + std::to_string(a) + "] = stride[" + std::to_string(b) + "]";
  }
  return true;
}

// ---- one tensor argument broken ----

bool wrong_dtype(Call* c, std::mt19937_64& rng, const Env&) {
  const int slot = any_of(rng, tensors(*c));
  DType to = DType::kI32;  // q: no float dtype at all
  if (slot == kCuQ || slot == kCuK) {
    to = pick(rng, {DType::kF32, DType::kF64});
  } else if (slot == kLse) {
    to = pick(rng, {DType::kF16, DType::kF64, DType::kI32});
  } else if (slot != kQ) {
    do {
      to = pick(rng, {DType::kF32, DType::kF16, DType::kBF16, DType::kF64, DType::kI32});
    } while (to == c->p.dtype);
  }
  edit(c, name(slot) + ".dtype = " + to_string(to),
       [slot, to](Target& t) { t.t[slot]->dtype = to; });
  return true;
}

bool wrong_device(Call* c, std::mt19937_64& rng, const Env& env) {
  const int slot = any_of(rng, tensors(*c));
  if (slot == kQ) return false;  // q defines the device; moving it alone moves the others' rule
  if (env.device == Device::kCUDA && chance(rng, 50)) {
    edit(c, name(slot) + ".device_index = 7", [slot](Target& t) { t.t[slot]->device_index = 7; });
    return true;
  }
  const Device to = env.device == Device::kCPU ? Device::kCUDA : Device::kCPU;
  edit(c, name(slot) + " on " + to_string(to), [slot, to](Target& t) { t.t[slot]->device = to; });
  return true;
}

bool wrong_rank(Call* c, std::mt19937_64& rng, const Env&) {
  const int slot = any_of(rng, tensors(*c));
  const int r = c->layout[slot].rank();
  const int to = r == kMaxRank || (r > 1 && chance(rng, 50)) ? r - 1 : r + 1;
  edit(c, name(slot) + " of rank " + std::to_string(to), [slot, to](Target& t) {
    Tensor& x = *t.t[slot];
    for (int d = x.rank; d < to; ++d) x.shape[d] = x.stride[d] = 1;
    x.rank = to;
  });
  return true;
}

bool negative_shape(Call* c, std::mt19937_64& rng, const Env&) {
  const int slot = any_of(rng, tensors(*c));
  const int d = uniform(rng, 0, c->layout[slot].rank() - 1);
  const int64_t to = -uniform(rng, 1, 5);
  edit(c, name(slot) + ".shape[" + std::to_string(d) + "] = " + std::to_string(to),
       [slot, d, to](Target& t) { t.t[slot]->shape[d] = to; });
  return true;
}

bool shape_mismatch(Call* c, std::mt19937_64& rng, const Env&) {
  const int slot = any_of(rng, tensors(*c));
  const int d = uniform(rng, 0, c->layout[slot].rank() - 1);
  const int64_t by = uniform(rng, 1, 3);
  edit(c, name(slot) + ".shape[" + std::to_string(d) + "] += " + std::to_string(by),
       [slot, d, by](Target& t) { t.t[slot]->shape[d] += by; });
  return true;
}

bool bad_stride(Call* c, std::mt19937_64& rng, const Env&) {
  const int slot = any_of(rng, present(*c, {kQ, kK, kV, kOut, kLse, kDout, kDq, kDk, kDv}, 2));
  if (slot < 0) return false;
  const Layout& l = c->layout[slot];
  const int last = l.rank() - 1;
  std::vector<int> dims = wide_dims(l);
  if (l.shape[last] > 1) dims.push_back(last);
  const int d = any_of(rng, dims);
  if (d < 0) return false;
  const int64_t to =
      d == last && chance(rng, 50) ? pick<int64_t>(rng, {0, 2, 3}) : -int64_t(uniform(rng, 1, 64));
  edit(c, name(slot) + ".stride[" + std::to_string(d) + "] = " + std::to_string(to),
       [slot, d, to](Target& t) { t.t[slot]->stride[d] = to; });
  return true;
}

bool null_data(Call* c, std::mt19937_64& rng, const Env&) {
  const int slot =
      any_of(rng, present(*c, {kQ, kK, kV, kOut, kLse, kDout, kDq, kDk, kDv, kCuQ, kCuK}, 1));
  if (slot < 0) return false;
  edit(c, name(slot) + ".data = nullptr", [slot](Target& t) { t.t[slot]->data = nullptr; });
  return true;
}

bool heads_not_a_multiple(Call* c, std::mt19937_64&, const Env&) {
  const int64_t to = c->p.heads_q + 1;  // heads_q % (heads_q + 1) = heads_q != 0
  const int axis = c->p.varlen() ? 1 : 2;
  edit(c, "heads_kv = " + std::to_string(to) + " with heads_q = " + std::to_string(c->p.heads_q),
       [to, axis](Target& t) {
         for (int s : {kK, kV, kDk, kDv})
           if (t.t[s]) t.t[s]->shape[axis] = to;
       });
  return true;
}

bool bad_head_dim(Call* c, std::mt19937_64& rng, const Env&) {
  const bool zero = chance(rng, 50);
  const int64_t to = zero ? 0 : uniform(rng, 1025, 4096);
  const std::initializer_list<int> like_q = {kQ, kK, kDq, kDk}, like_v = {kV, kOut, kDout, kDv};
  const std::vector<int> slots(zero ? like_q : like_v);
  edit(c, std::string(zero ? "head_dim" : "head_dim_v") + " = " + std::to_string(to),
       [slots, to](Target& t) {
         for (int s : slots)
           if (t.t[s] && t.t[s]->rank) t.t[s]->shape[t.t[s]->rank - 1] = to;
       });
  return true;
}

bool missing_lse(Call* c, std::mt19937_64&, const Env&) {
  if (!c->backward()) return false;
  edit(c, "backward without lse", [](Target& t) { *t.t[kLse] = Tensor{}; });
  return true;
}

// ---- varlen arguments ----

bool cu_seqlens_shape(Call* c, std::mt19937_64& rng, const Env&) {
  static int32_t zeros[8] = {};
  const int r = uniform(rng, 0, 2);
  if (!c->p.varlen()) {
    edit(c, "maybe_cu_seqlens_q only, on a padded call", [](Target& t) {
      *t.t[kCuQ] =
          Tensor::contiguous(zeros, DType::kI32, {2}, t.t[kQ]->device, t.t[kQ]->device_index);
    });
  } else if (r == 0) {
    edit(c, "maybe_cu_seqlens_k absent", [](Target& t) { *t.t[kCuK] = Tensor{}; });
  } else if (r == 1) {
    edit(c, "cu_seqlens of 0 entries",
         [](Target& t) { t.t[kCuQ]->shape[0] = t.t[kCuK]->shape[0] = 0; });
  } else {
    const int to = pick(rng, {-1, -100, INT_MIN});
    const bool q = chance(rng, 50);
    edit(c, std::string(q ? "max_seqlen_q" : "max_seqlen_k") + " = " + std::to_string(to),
         [q, to](Target& t) { (q ? t.c->max_seqlen_q : t.c->max_seqlen_k) = to; });
  }
  return true;
}

// Contents the API need not read (docs/DESIGN.md, device-side inputs): any Status, but no
// stray access. Where the API has the opt-in check, it must refuse them.
bool cu_seqlens_contents(Call* c, std::mt19937_64& rng, const Env&) {
  if (!c->p.varlen()) return false;
  const int slot = chance(rng, 50) ? kCuQ : kCuK;
  const int64_t n = c->p.batch + 1;
  const int64_t total = slot == kCuQ ? c->p.total_q() : c->p.total_k();
  const int r = uniform(rng, 0, 3);
  if (r == 3) {
    const int longest = slot == kCuQ ? c->p.max_len_q() : c->p.max_len_k();
    if (longest == 0) return false;
    (slot == kCuQ ? c->max_seqlen_q : c->max_seqlen_k) = longest - 1;
    c->twist =
        std::string(slot == kCuQ ? "max_seqlen_q" : "max_seqlen_k") + " below the longest sequence";
  } else {
    int64_t at, to;
    if (r == 0)
      at = 0, to = pick<int64_t>(rng, {1, -3, INT32_MIN});
    else if (r == 1)
      at = n - 1, to = pick<int64_t>(rng, {total + 1, total + 5, INT32_MAX});
    else
      at = uniform(rng, 1, int(n) - 1), to = -1;  // below its predecessor (>= 0)
    c->twist = name(slot) + "[" + std::to_string(at) + "] = " + std::to_string(to);
    c->edit_data = [slot, at, to](std::array<Buf, kSlots>& b) { b[slot].set(at, double(to)); };
  }
  c->expect = Expect::kNoCrash;
  if constexpr (kHasCheckInputs<CommonArgs>) {
    if (chance(rng, 50)) {
      c->check_inputs = true;
      c->expect = Expect::kInvalid;
    }
  }
  return true;
}

// ---- scalar options, workspace, kernel name, alignment ----

bool bad_scalar(Call* c, std::mt19937_64& rng, const Env&) {
  const int r = uniform(rng, 0, 5);
  const double x = r == 0   ? pick(rng, {kNaN, kInf, -kInf})
                   : r <= 2 ? pick<double>(rng, {-2, -1000, INT_MIN})
                   : r == 3 ? pick(rng, {-1.0, -kInf, kNaN, kInf})
                   : r == 4 ? pick(rng, {-0.1, 1.0, 1.5, kNaN, kInf})
                            : pick<double>(rng, {-1, INT_MIN});
  static const char* const kWhat[] = {"softmax_scale", "window_left", "window_right",
                                      "softcap",       "dropout_p",   "num_threads"};
  edit(c, std::string(kWhat[r]) + " = " + std::to_string(x), [r, x](Target& t) {
    CommonArgs& a = *t.c;
    switch (r) {
      case 0: a.softmax_scale = float(x); break;
      case 1: a.window_left = int(x); break;
      case 2: a.window_right = int(x); break;
      case 3: a.softcap = float(x); break;
      case 4: a.dropout_p = float(x); break;
      default: a.num_threads = int(x); break;
    }
  });
  return true;
}

bool bad_workspace(Call* c, std::mt19937_64& rng, const Env&) {
  c->workspace = chance(rng, 50) ? Workspace::kShort : Workspace::kNull;
  c->twist = "workspace below workspace_size (when the kernel needs one)";
  return true;
}

bool unknown_kernel(Call* c, std::mt19937_64&, const Env&) {
  c->kernel = "no_such_kernel";
  return true;
}

bool misaligned(Call* c, std::mt19937_64& rng, const Env& env) {
  if (env.device != Device::kCUDA) return false;
  const int slot = any_of(rng, present(*c, {kQ, kK, kV, kOut, kLse, kDout, kDq, kDk, kDv}, 2));
  if (slot < 0) return false;
  const std::vector<int> dims = wide_dims(c->layout[slot]);
  if (!dims.empty() && slot != kLse && chance(rng, 50)) {
    const int d = any_of(rng, dims);
    c->layout[slot].stride[d] += 1;
    // A slot that shares another's buffer (v = k) is read through that one's layout: give
    // it its own, or the twist would not reach the call.
    c->same_as[slot] = -1;
    c->twist = name(slot) + ".stride[" + std::to_string(d) + "] not a multiple of 16 bytes";
    return true;
  }
  edit(c, name(slot) + ".data not aligned",
       [slot](Target& t) { t.t[slot]->data = static_cast<std::byte*>(t.t[slot]->data) + 2; });
  return true;
}

using Twist = bool (*)(Call*, std::mt19937_64&, const Env&);
struct Named {
  const char* kind;
  Twist apply;
};

}  // namespace

void make_invalid(Call* c, std::mt19937_64& rng, const Env& env) {
  // Overlaps count twice: they are the rule most easily broken by a caller.
  static constexpr Named kTwists[] = {
      {"output overlaps another tensor", output_inside_other},
      {"output overlaps another tensor", output_inside_other},
      {"output overlaps itself", output_overlaps_itself},
      {"output overlaps itself", output_overlaps_itself},
      {"wrong dtype", wrong_dtype},
      {"wrong device", wrong_device},
      {"wrong rank", wrong_rank},
      {"negative shape", negative_shape},
      {"shape mismatch", shape_mismatch},
      {"bad stride", bad_stride},
      {"null data", null_data},
      {"heads_q not a multiple of heads_kv", heads_not_a_multiple},
      {"head dim out of range", bad_head_dim},
      {"backward without lse", missing_lse},
      {"cu_seqlens shape or max_seqlen", cu_seqlens_shape},
      {"cu_seqlens contents", cu_seqlens_contents},
      {"scalar option out of range", bad_scalar},
      {"workspace too small or null", bad_workspace},
      {"unknown kernel", unknown_kernel},
      {"misaligned for CUDA", misaligned},
  };
  c->expect = Expect::kInvalid;
  c->nonfinite.clear();
  for (;;) {
    const Named& t = kTwists[rng() % std::size(kTwists)];
    if (t.apply(c, rng, env)) {
      c->kind = t.kind;
      return;
    }
  }
}

}  // namespace flashlab::fuzz
