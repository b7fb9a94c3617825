#include "call.h"

#include <sstream>

namespace flashlab::fuzz {

const char* slot_name(int slot) {
  static const char* const kNames[kSlots] = {
      "cu_seqlens_q", "cu_seqlens_k", "q", "k", "v", "dout", "out", "lse", "dq", "dk", "dv"};
  return slot >= 0 && slot < kSlots ? kNames[slot] : "?";
}

const char* to_string(Expect e) {
  switch (e) {
    case Expect::kValid: return "valid";
    case Expect::kInvalid: return "invalid";
    case Expect::kRefuseOrCorrect: return "refuse-or-correct";
    case Expect::kNoCrash: return "no-crash";
  }
  return "?";
}

DType Call::dtype_of(int slot) const {
  if (slot == kCuQ || slot == kCuK) return DType::kI32;
  if (slot == kLse) return DType::kF32;
  return p.dtype;
}

std::string Call::describe() const {
  std::ostringstream s;
  s << (backward() ? "backward" : "forward") << " kernel=" << kernel
    << " expect=" << to_string(expect) << " | " << p.describe();
  if (max_seqlen_q >= 0 || max_seqlen_k >= 0)
    s << " max_seqlen " << max_seqlen_q << "/" << max_seqlen_k;
  if (quadratic_limit) s << " quadratic_limit " << quadratic_limit;
  if (check_inputs) s << " check_inputs";
  for (int slot = 0; slot < kSlots; ++slot) {
    if (same_as[slot] >= 0)
      s << " " << slot_name(slot) << "=" << slot_name(same_as[slot]);
    else if (layout[slot].rank() > 0 && !layout[slot].contiguous())
      s << " " << slot_name(slot) << layout[slot].describe();
  }
  for (const NonFinite& n : nonfinite)
    s << " " << slot_name(n.slot) << "[" << n.index << "]=" << n.value;
  if (nan_padding) s << " nan-padding";
  if (alias_slot >= 0)
    s << " " << slot_name(alias_slot) << "-inside-" << slot_name(alias_into) << "+"
      << alias_byte_offset << "B";
  if (workspace == Workspace::kShort) s << " workspace-short";
  if (workspace == Workspace::kNull) s << " workspace-null";
  if (!twist.empty()) s << " | " << twist;
  return s.str();
}

bool Env::has(Pass pass) const {
  for (const KernelInfo& k : kernels)
    if (pass == Pass::kForward ? k.has_forward : k.has_backward) return true;
  return false;
}

bool is_input(const Call& c, int slot) {
  switch (slot) {
    case kCuQ:
    case kCuK:
    case kQ:
    case kK:
    case kV: return true;
    case kOut:
    case kLse:
    case kDout: return c.backward();
    default: return false;
  }
}

bool is_output(const Call& c, int slot) {
  switch (slot) {
    case kOut:
    case kLse: return !c.backward();
    case kDq:
    case kDk:
    case kDv: return c.backward();
    default: return false;
  }
}

std::array<std::vector<int64_t>, kSlots> shapes_of(const Call& c) {
  const test::Problem& p = c.p;
  std::array<std::vector<int64_t>, kSlots> s;
  const int64_t B = p.batch, Hq = p.heads_q, Hk = p.heads_kv, D = p.head_dim, Dv = p.head_dim_v;
  auto rows = [&](int64_t total, int64_t seqlen, int64_t heads, int64_t dim) {
    return p.varlen() ? std::vector<int64_t>{total, heads, dim}
                      : std::vector<int64_t>{B, seqlen, heads, dim};
  };
  s[kQ] = rows(p.total_q(), p.seqlen_q, Hq, D);
  s[kK] = rows(p.total_k(), p.seqlen_k, Hk, D);
  s[kV] = rows(p.total_k(), p.seqlen_k, Hk, Dv);
  s[kOut] = rows(p.total_q(), p.seqlen_q, Hq, Dv);
  if (c.backward() || p.with_lse)
    s[kLse] = p.varlen() ? std::vector<int64_t>{Hq, p.total_q()}
                         : std::vector<int64_t>{B, Hq, p.seqlen_q};
  if (c.backward()) {
    s[kDout] = s[kOut];
    s[kDq] = s[kQ];
    s[kDk] = s[kK];
    s[kDv] = s[kV];
  }
  if (p.varlen()) s[kCuQ] = s[kCuK] = {B + 1};
  return s;
}

void contiguous_layouts(Call* c) {
  const auto shapes = shapes_of(*c);
  for (int slot = 0; slot < kSlots; ++slot)
    c->layout[slot] = shapes[slot].empty() ? Layout{} : contiguous(shapes[slot]);
}

}  // namespace flashlab::fuzz
