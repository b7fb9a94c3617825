// The check before timing (check.h): operands, the checked slice, the fp64 reference and
// the comparison.
#include "bench/check.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>

#include "common/dtype.h"
#include "common/mask.h"

namespace flashlab::bench {
namespace {

constexpr int kMinCheckedHeads = 2;   // query heads of a slice, at least (forward)
constexpr int kSliceRefinements = 3;  // passes that shrink the checked rows to the budget

// A box of a tensor: begin and count per axis.
struct Box {
  std::array<int64_t, kMaxRank> begin{}, count{};
};

Box full_box(const Tensor& t) {
  Box b;
  for (int d = 0; d < t.rank; ++d) b.count[d] = t.shape[d];
  return b;
}

// Calls f(element offset in t, index in the compact box) for every element of `box`, in
// row-major order; the innermost axis runs as a plain loop.
template <class F>
void for_each_in(const Tensor& t, const Box& box, F&& f) {
  const int last = t.rank - 1;
  int64_t rows = 1;
  for (int d = 0; d < last; ++d) rows *= box.count[d];
  const int64_t inner = box.count[last], step = t.stride[last];
  std::array<int64_t, kMaxRank> idx{};
  int64_t c = 0;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t off = box.begin[last] * step;
    for (int d = 0; d < last; ++d) off += (box.begin[d] + idx[d]) * t.stride[d];
    for (int64_t i = 0; i < inner; ++i) f(off + i * step, c++);
    for (int d = last - 1; d >= 0 && ++idx[d] == box.count[d]; --d) idx[d] = 0;
  }
}

std::vector<double> gather(const Tensor& host, const Box& box) {
  int64_t n = 1;
  for (int d = 0; d < host.rank; ++d) n *= box.count[d];
  std::vector<double> out(size_t(std::max<int64_t>(n, 0)));
  for_each_in(host, box, [&](int64_t off, int64_t c) { out[size_t(c)] = load_as_double(host.data, host.dtype, off); });
  return out;
}

// A varlen problem's document `doc` alone, as a padded batch of one.
Problem document_problem(const Problem& p, int doc) {
  Problem d = p;
  d.lengths.clear();
  d.batch = 1;
  d.seqlen_q = d.seqlen_k = p.lengths[size_t(doc)];
  return d;
}

// The slice of one document as the slice of document_problem.
Slice within_document(Slice s) {
  s.doc = -1;
  return s;
}

Problem slice_problem(const Problem& p, const Slice& s) {
  if (s.doc >= 0) return slice_problem(document_problem(p, s.doc), within_document(s));
  Problem sub = p;
  sub.batch = s.batches;
  sub.heads_q = s.heads_q;
  sub.heads_kv = s.heads_kv;
  sub.seqlen_q = s.rows;
  sub.dtype = DType::kF64;
  sub.device = Device::kCPU;
  sub.decode = false;  // the dense forward on the keys and values the cache holds
  sub.page_size = sub.seqlen_new = 0;
  return sub;
}

Box box_of(const Problem& p, const Slice& s, Slot slot);

// A varlen tensor's box of one document: its padded problem's box, on the document's rows.
Box document_box(const Problem& p, const Slice& s, Slot slot) {
  const Box d = box_of(document_problem(p, s.doc), within_document(s), slot);
  const int64_t start = cu_seqlens_of(p)[size_t(s.doc)];
  Box b;
  for (int a = 0; a + 1 < kMaxRank; ++a) b.begin[a] = d.begin[a + 1], b.count[a] = d.count[a + 1];
  b.begin[slot == kLse ? 1 : 0] += start;  // [1, heads, rows] -> [heads, total]; else [total, ...]
  return b;
}

// The slice's box of a tensor of the full problem.
Box box_of(const Problem& p, const Slice& s, Slot slot) {
  if (!p.lengths.empty()) return s.doc >= 0 ? document_box(p, s, slot) : full_box(slot_view(p, slot, nullptr));
  Box b = full_box(slot_view(p, slot, nullptr));
  b.count[0] = s.batches;
  switch (slot) {
    case kQ: case kOut: case kDout: case kDq:
      b.begin[1] = s.row0;
      b.count[1] = s.rows;
      b.count[2] = s.heads_q;
      break;
    case kDk: case kDv:
      b.begin[1] = s.key0;
      b.count[1] = p.seqlen_k - s.key0;
      [[fallthrough]];
    case kK: case kV:
      b.count[2] = s.heads_kv;
      break;
    case kLse:
      b.count[1] = s.heads_q;
      b.begin[2] = s.row0;
      b.count[2] = s.rows;
      break;
    case kKNew: case kVNew: case kSeqlens: case kTable: case kCu: case kCos: case kSin: case kSlots: break;
  }
  return b;
}

int64_t offset_of(const Tensor& t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  return i0 * t.stride[0] + i1 * t.stride[1] + i2 * t.stride[2] + i3 * t.stride[3];
}

// Decode: the keys (or values) the slice's sequences attend to, as the dense forward's
// [batches, seqlen_k, heads_kv, dim]: rows [0, seqlen_k - seqlen_new) of the cache (through
// the block table when paged), then the rows of k_new (v_new) that the call appends.
Status gather_cache(const Problem& p, const Slice& s, const std::array<Tensor, kSlots>& in,
                    Slot cache_slot, void* stream, std::vector<double>* out) {
  Buffer keep_cache, keep_new, keep_table;
  Tensor cache, fresh, table;
  if (Status st = host_view(in[cache_slot], stream, &keep_cache, &cache); !st.ok()) return st;
  if (Status st = host_view(in[cache_slot == kK ? kKNew : kVNew], stream, &keep_new, &fresh); !st.ok()) return st;
  if (Status st = host_view(in[kTable], stream, &keep_table, &table); !st.ok()) return st;
  const int64_t dim = cache.shape[3], kept = p.seqlen_k - p.seqlen_new;
  out->resize(size_t(s.batches) * size_t(p.seqlen_k) * size_t(s.heads_kv) * size_t(dim));
  const auto* pages = static_cast<const int32_t*>(table.data);
  size_t c = 0;
  for (int64_t b = 0; b < s.batches; ++b)
    for (int64_t j = 0; j < p.seqlen_k; ++j) {
      const Tensor& t = j < kept ? cache : fresh;
      int64_t i0 = b, i1 = j < kept ? j : j - kept;
      if (j < kept && p.page_size > 0) {
        i0 = pages[b * table.stride[0] + (j / p.page_size) * table.stride[1]];
        i1 = j % p.page_size;
      }
      for (int64_t h = 0; h < s.heads_kv; ++h)
        for (int64_t d = 0; d < dim; ++d) (*out)[c++] = load_as_double(t.data, t.dtype, offset_of(t, i0, i1, h, d));
    }
  return {};
}

std::string range_string(int begin, int end) {
  return end - begin == 1 ? std::to_string(begin)
                          : std::to_string(begin) + "-" + std::to_string(end - 1);
}

std::string shape_text(const Tensor& t) {
  std::string s = "[";
  for (int d = 0; d < t.rank; ++d) s += (d ? ", " : "") + std::to_string(t.shape[d]);
  return s + "]";
}

double* error_field(Row* r, Slot s) {
  switch (s) {
    case kOut: return &r->err_out;
    case kLse: return &r->err_lse;
    case kDq: return &r->err_dq;
    case kDk: return &r->err_dk;
    case kDv: return &r->err_dv;
    default: return nullptr;
  }
}

bool is_gradient(Slot s) { return s == kDq || s == kDk || s == kDv; }

// What a call must give for its row to be judged: the gradients of a backward or a
// training step, and the training step's out (LSE stays optional: peers rarely return it).
bool must_return(const Problem& p, Slot s) { return is_gradient(s) || (p.train && s == kOut); }

void fail(Row* row, Slot s, const std::string& why) {
  row->status = RowStatus::kFail;
  row->reason += std::string(row->reason.empty() ? "" : "; ") + slot_name(s) + ": " + why;
}

}  // namespace

// ---- operands ---------------------------------------------------------------------------

const char* slot_name(Slot s) {
  static constexpr const char* kNames[kSlots] = {"q",  "k",  "v",     "out",   "lse",           "dout",        "dq",
                                                 "dk", "dv", "k_new", "v_new", "cache_seqlens", "block_table", "cu_seqlens",
                                                 "rotary_cos", "rotary_sin"};
  return kNames[s];
}

int pages_per_sequence(const Problem& p) {
  return p.decode && p.page_size > 0 ? (p.seqlen_k + p.page_size - 1) / p.page_size : 0;
}

std::vector<int32_t> table_values(const Problem& p, Slot table, uint64_t seed) {
  if (table == kCu) return cu_seqlens_of(p);
  if (table == kSeqlens) return std::vector<int32_t>(size_t(p.batch), p.seqlen_k - p.seqlen_new);
  std::vector<int32_t> pages(size_t(p.batch) * size_t(pages_per_sequence(p)));
  std::iota(pages.begin(), pages.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(pages.begin(), pages.end(), rng);
  return pages;
}

Tensor slot_view(const Problem& p, Slot s, void* data) {
  const DType t = p.dtype;
  if (!slot_used(p, s)) return {};
  if (p.decode && (s == kK || s == kV)) {
    const int64_t dim = s == kK ? p.head_dim : p.head_dim_v;
    const int pages = pages_per_sequence(p);
    return pages > 0 ? Tensor::contiguous(data, t, {int64_t(p.batch) * pages, p.page_size, p.heads_kv, dim}, p.device)
                     : Tensor::contiguous(data, t, {p.batch, p.seqlen_k, p.heads_kv, dim}, p.device);
  }
  if (!p.lengths.empty()) {
    const int64_t total = cu_seqlens_of(p).back();
    switch (s) {
      case kQ: case kDq: return Tensor::contiguous(data, t, {total, p.heads_q, p.head_dim}, p.device);
      case kK: case kDk: return Tensor::contiguous(data, t, {total, p.heads_kv, p.head_dim}, p.device);
      case kV: case kDv: return Tensor::contiguous(data, t, {total, p.heads_kv, p.head_dim_v}, p.device);
      case kOut: case kDout: return Tensor::contiguous(data, t, {total, p.heads_q, p.head_dim_v}, p.device);
      case kLse: return Tensor::contiguous(data, DType::kF32, {p.heads_q, total}, p.device);
      case kCu: return Tensor::contiguous(data, DType::kI32, {p.batch + 1}, p.device);
      default: return {};
    }
  }
  switch (s) {
    case kKNew: return Tensor::contiguous(data, t, {p.batch, p.seqlen_new, p.heads_kv, p.head_dim}, p.device);
    case kVNew: return Tensor::contiguous(data, t, {p.batch, p.seqlen_new, p.heads_kv, p.head_dim_v}, p.device);
    case kSeqlens: return Tensor::contiguous(data, DType::kI32, {p.batch}, p.device);
    case kTable: return Tensor::contiguous(data, DType::kI32, {p.batch, pages_per_sequence(p)}, p.device);
    case kCos: case kSin: {  // a row per cache row a sequence can have
      const int64_t rows = pages_per_sequence(p) > 0 ? int64_t(pages_per_sequence(p)) * p.page_size : p.seqlen_k;
      return Tensor::contiguous(data, t, {rows, p.head_dim / 2}, p.device);
    }
    default: break;
  }
  switch (s) {
    case kQ: case kDq: return Tensor::contiguous(data, t, {p.batch, p.seqlen_q, p.heads_q, p.head_dim}, p.device);
    case kK: case kDk: return Tensor::contiguous(data, t, {p.batch, p.seqlen_k, p.heads_kv, p.head_dim}, p.device);
    case kV: case kDv: return Tensor::contiguous(data, t, {p.batch, p.seqlen_k, p.heads_kv, p.head_dim_v}, p.device);
    case kOut: case kDout: return Tensor::contiguous(data, t, {p.batch, p.seqlen_q, p.heads_q, p.head_dim_v}, p.device);
    case kLse: return Tensor::contiguous(data, DType::kF32, {p.batch, p.heads_q, p.seqlen_q}, p.device);
    default: break;
  }
  return {};
}

size_t slot_bytes(const Problem& p, Slot s) {
  const Tensor t = slot_view(p, s, nullptr);
  return size_t(t.numel()) * dtype_size(t.dtype);
}

bool slot_used(const Problem& p, Slot s) {
  switch (s) {
    case kKNew: case kVNew: return p.decode && p.seqlen_new > 0;
    case kSeqlens: return p.decode;
    case kTable: return p.decode && p.page_size > 0;
    case kCos: case kSin: return p.decode && p.seqlen_new > 0 && p.rotary;
    case kCu: return !p.lengths.empty();
    case kSlots: return false;
    default: return computes_gradients(p) || s <= kLse;
  }
}

std::vector<Slot> outputs_of(const Problem& p) {
  if (p.train) return {kOut, kLse, kDq, kDk, kDv};
  return p.backward ? std::vector<Slot>{kDq, kDk, kDv} : std::vector<Slot>{kOut, kLse};
}

std::vector<Slot> random_inputs_of(const Problem& p) {
  if (computes_gradients(p)) return {kQ, kK, kV, kDout};
  if (slot_used(p, kKNew)) return {kQ, kK, kV, kKNew, kVNew};
  return {kQ, kK, kV};
}

Status run_pass(const ForwardArgs& a) { return forward(a); }
Status run_pass(const BackwardArgs& a) { return backward(a); }
Status run_pass(const KvCacheArgs& a) { return forward_kvcache(a); }

Status select_pass(const ForwardArgs& a, std::string* name) { return select_kernel(a, name); }
Status select_pass(const BackwardArgs& a, std::string* name) { return select_kernel(a, name); }
Status select_pass(const KvCacheArgs& a, std::string* name) {
  size_t bytes = 0;
  if (Status s = workspace_size(a, &bytes); !s.ok()) return s;
  *name = a.kernel;
  return {};
}

// ---- the slice --------------------------------------------------------------------------

bool Slice::keys_compared() const { return key0 >= 0; }

Slice choose_slice(const Problem& p, double budget_flops, int threads) {
  Slice s{p.batch, p.heads_q, p.heads_kv, 0, p.seqlen_q, 0, true};
  auto cost = [&] { return pass_flops(slice_problem(p, s)); };
  if (cost() <= budget_flops) return s;
  if (!p.lengths.empty()) {
    const auto longest = std::max_element(p.lengths.rbegin(), p.lengths.rend());  // the last of equals
    const int doc = int(p.lengths.rend() - longest) - 1;
    s = choose_slice(document_problem(p, doc), budget_flops, threads);
    s.full = false;
    s.doc = doc;
    return s;
  }
  const int group = p.heads_q / p.heads_kv;
  const int width = std::max(kMinCheckedHeads, threads);  // cpu_reference runs a head per thread
  s.full = false;
  s.batches = 1;
  if (computes_gradients(p)) {
    // Whole kv groups (dk and dv sum over a group's query heads): as many as fit.
    s.heads_kv = 1;
    s.heads_q = group;
    const int fit = int(budget_flops / cost());
    s.heads_kv = std::clamp(fit, 1, std::max(1, std::min(p.heads_kv, width / group)));
    s.heads_q = s.heads_kv * group;
  } else {
    // A multiple of the group, or part of one group (its one kv head).
    s.heads_q = std::min(p.heads_q, width);
    if (s.heads_q >= group) s.heads_q -= s.heads_q % group;
    s.heads_kv = std::max(1, s.heads_q / group);
  }
  for (int i = 0; i < kSliceRefinements && cost() > budget_flops; ++i) {
    s.rows = std::max(1, int(s.rows * (budget_flops / cost())));
    s.row0 = p.seqlen_q - s.rows;
  }
  if (computes_gradients(p) && s.row0 > 0) {
    const MaskPolicy m = MaskPolicy::make(p.window_left, p.window_right, p.causal, p.seqlen_q,
                                          p.seqlen_k, p.softcap);
    const int end = m.key_end(s.row0 - 1, p.seqlen_q, p.seqlen_k);  // keys earlier rows see
    s.key0 = end < p.seqlen_k ? end : -1;
  }
  return s;
}

std::string slice_string(const Problem& p, const Slice& s) {
  if (s.full) return "the full problem";
  if (s.doc >= 0) {
    const Problem d = document_problem(p, s.doc);
    return "document " + std::to_string(s.doc) + " of " + std::to_string(p.batch) + " (" +
           std::to_string(d.seqlen_q) + " tokens from token " + std::to_string(cu_seqlens_of(p)[size_t(s.doc)]) +
           "), " + slice_string(d, within_document(s));
  }
  std::string t = p.batch > 1 ? "batch 0 of " + std::to_string(p.batch) + ", " : "";
  t += "query heads " + range_string(0, s.heads_q) + " of " + std::to_string(p.heads_q) +
       " (kv heads " + range_string(0, s.heads_kv) + ")";
  if (s.rows < p.seqlen_q)
    t += ", query rows " + range_string(s.row0, p.seqlen_q) + " of " + std::to_string(p.seqlen_q);
  if (computes_gradients(p) && s.row0 > 0)
    t += s.keys_compared() ? ", dk/dv on keys " + range_string(s.key0, p.seqlen_k)
                           : ", dk/dv not compared (earlier rows see every key)";
  return t;
}

// ---- the reference ----------------------------------------------------------------------

Status Oracle::compute(const Problem& p, const Slice& s, const std::array<Tensor, kSlots>& inputs,
                       int threads, void* stream, Progress* progress) {
  const Problem sub = slice_problem(p, s);
  std::array<std::vector<double>, kSlots> f64;
  // A train problem's backward reads the out and LSE of the reference's own forward.
  const std::vector<Slot> read = backward_alone(p) ? std::vector<Slot>{kQ, kK, kV, kDout, kOut, kLse}
                                 : p.train         ? std::vector<Slot>{kQ, kK, kV, kDout}
                                                   : std::vector<Slot>{kQ, kK, kV};
  for (Slot slot : read) {
    if (p.decode && (slot == kK || slot == kV)) {
      if (Status st = gather_cache(p, s, inputs, slot, stream, &f64[slot]); !st.ok()) return st;
      continue;
    }
    Buffer keep;
    Tensor host;
    if (Status st = host_view(inputs[slot], stream, &keep, &host); !st.ok()) return st;
    f64[slot] = gather(host, box_of(p, s, slot));
  }
  std::vector<float> lse(size_t(slot_view(sub, kLse, nullptr).numel()));
  if (backward_alone(p)) std::copy(f64[kLse].begin(), f64[kLse].end(), lse.begin());
  for (Slot slot : outputs_of(p))
    if (slot != kLse) f64[slot].assign(size_t(slot_view(sub, slot, nullptr).numel()), 0.0);
  std::array<Tensor, kSlots> v;
  for (int i = 0; i < kSlots; ++i) v[i] = slot_view(sub, Slot(i), f64[i].data());
  v[kLse] = slot_view(sub, kLse, lse.data());
  std::vector<int32_t> cu = cu_seqlens_of(sub);  // the whole varlen problem: its packing
  v[kCu] = slot_view(sub, kCu, cu.data());

  auto run = [&](auto& a) -> Status {
    a.causal = p.causal;
    a.window_left = p.window_left;
    a.window_right = p.window_right;
    a.softcap = p.softcap;
    a.num_threads = threads;
    a.kernel = "cpu_reference";
    a.quadratic_workspace_limit = SIZE_MAX;  // the slice was chosen to fit
    if (v[kCu].present()) {
      a.maybe_cu_seqlens_q = a.maybe_cu_seqlens_k = v[kCu];
      a.max_seqlen_q = a.max_seqlen_k = sub.seqlen_q;
    }
    size_t bytes = 0;
    if (Status st = workspace_size(a, &bytes); !st.ok()) return st;
    Buffer ws;
    if (Status st = ws.allocate(Device::kCPU, bytes); !st.ok()) return st;
    a.workspace = ws.data();
    a.workspace_bytes = ws.bytes();
    if (progress) progress->begin("check: cpu_reference in fp64 on " + slice_string(p, s));
    const Status st = run_pass(a);
    if (progress) progress->end();
    return st;
  };
  Status st;
  if (!backward_alone(p)) {
    ForwardArgs a;
    a.q = v[kQ], a.k = v[kK], a.v = v[kV], a.out = v[kOut], a.maybe_lse = v[kLse];
    st = run(a);
  }
  if (st.ok() && computes_gradients(p)) {
    BackwardArgs a;
    a.q = v[kQ], a.k = v[kK], a.v = v[kV], a.out = v[kOut], a.lse = v[kLse], a.dout = v[kDout];
    a.dq = v[kDq], a.dk = v[kDk], a.dv = v[kDv];
    st = run(a);
  }
  if (!st.ok()) return st;
  for (Slot slot : outputs_of(p)) {
    if (slot == kLse) {
      keep(kLse, std::vector<double>(lse.begin(), lse.end()));
      continue;
    }
    Box keys = full_box(v[slot]);  // dk and dv: the keys that are compared
    if (!s.full && (slot == kDk || slot == kDv)) {
      keys.begin[1] = std::max(s.key0, 0);
      keys.count[1] = s.keys_compared() ? sub.seqlen_k - s.key0 : 0;
    }
    keep(slot, gather(v[slot], keys));
  }
  ready_ = true;
  return {};
}

Status Oracle::adopt(const Problem& p, const Slice& s, const std::array<Tensor, kSlots>& got,
                     void* stream) {
  for (Slot slot : outputs_of(p)) {
    Buffer keep_host;
    Tensor host;
    if (Status st = host_view(got[slot], stream, &keep_host, &host); !st.ok()) return st;
    const bool keys_cut = (slot == kDk || slot == kDv) && !s.keys_compared();
    keep(slot, keys_cut ? std::vector<double>{} : gather(host, box_of(p, s, slot)));
  }
  ready_ = true;
  return {};
}

void Oracle::keep(Slot slot, std::vector<double> want) {
  want_[slot] = std::move(want);
  grad_scale_[slot] = 1.0;
  for (double x : want_[slot]) grad_scale_[slot] = std::max(grad_scale_[slot], std::fabs(x));
}

Status Oracle::compare(const Problem& p, const Slice& s, const std::array<Tensor, kSlots>& got,
                       void* stream, Row* row) const {
  const Tolerance tol = tolerance_for(p.dtype);
  for (Slot slot : outputs_of(p)) {
    const Tensor& t = got[slot];
    if (!t.present()) {
      if (must_return(p, slot)) fail(row, slot, "not returned");
      continue;
    }
    const Tensor expect = slot_view(p, slot, nullptr);
    if (t.rank != expect.rank || t.shape != expect.shape) {
      fail(row, slot, "shape " + shape_text(t) + ", expected " + shape_text(expect));
      continue;
    }
    Buffer keep;
    Tensor host;
    if (Status st = host_view(t, stream, &keep, &host); !st.ok()) return st;
    int64_t bad = 0;
    for_each_in(host, full_box(host), [&](int64_t off, int64_t) {
      const double x = load_as_double(host.data, host.dtype, off);
      bad += std::isnan(x) || (std::isinf(x) && !(slot == kLse && x < 0));
    });
    if (bad > 0)
      fail(row, slot, std::to_string(bad) + " of " + std::to_string(t.numel()) + " elements not written");
    if (!ready_ || ((slot == kDk || slot == kDv) && !s.keys_compared())) continue;
    // Equal infinities agree (a row that sees no key has LSE -inf in both); a NaN is an
    // infinite error.
    double err = 0;
    const std::vector<double>& want = want_[slot];
    for_each_in(host, box_of(p, s, slot), [&](int64_t off, int64_t c) {
      const double g = load_as_double(host.data, host.dtype, off), w = want[size_t(c)];
      const double d = g == w ? 0.0 : std::fabs(g - w);
      err = std::max(err, std::isnan(d) ? std::numeric_limits<double>::infinity() : d);
    });
    *error_field(row, slot) = err;
    const double limit = is_gradient(slot) ? tol.grad * grad_scale_[slot] : tol.out;
    if (!(err <= limit)) fail(row, slot, "error " + format_err(err) + " > " + format_err(limit));
  }
  return {};
}

std::string format_err(double e) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1e", e);
  return buf;
}

Tolerance tolerance_for(DType dtype) {
  switch (dtype) {
    case DType::kF16: return {5e-3, 1e-2};
    case DType::kBF16: return {2e-2, 4e-2};
    default: return {1e-4, 2e-4};
  }
}

}  // namespace flashlab::bench
