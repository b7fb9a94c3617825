// Problems and what they cost: the one FLOP formula (exact over the mask's per-row key
// range), the bytes a call moves, the names of shapes and masks, the peer sweep and the
// documents of a varlen batch.
#include <algorithm>
#include <array>
#include <climits>
#include <cstdio>
#include <numeric>
#include <random>
#include <tuple>

#include "common/mask.h"
#include "flashlab/bench.h"

namespace flashlab::bench {
namespace {

Status invalid(const std::string& what) { return {StatusCode::kInvalidArgument, what}; }

// The sizes attention_flops reads, and per sequence its query and key lengths.
struct Layout {
  int64_t heads_q = 0, head_dim = 0, head_dim_v = 0;
  std::vector<std::pair<int64_t, int64_t>> lengths;  // (len_q, len_k) per batch entry
};

Status lengths_of(const Tensor& cu, const char* name, std::vector<int64_t>* out) {
  if (cu.device != Device::kCPU)
    return invalid(std::string(name) + ": counting FLOPs reads cu_seqlens on the host; pass a "
                                       "host copy");
  if (cu.dtype != DType::kI32 || cu.rank != 1 || cu.shape[0] < 1 || !cu.data)
    return invalid(std::string(name) + " must be a non-empty int32 vector [batch + 1]");
  const auto* c = static_cast<const int32_t*>(cu.data);
  for (int64_t b = 0; b + 1 < cu.shape[0]; ++b) {
    const int64_t len = int64_t(c[(b + 1) * cu.stride[0]]) - c[b * cu.stride[0]];
    if (len < 0) return invalid(std::string(name) + " must be non-decreasing");
    out->push_back(len);
  }
  return {};
}

Status layout_of(const ForwardArgs& a, Layout* l) {
  const bool varlen = a.maybe_cu_seqlens_q.present() || a.maybe_cu_seqlens_k.present();
  const int rank = varlen ? 3 : 4;
  for (const Tensor* t : {&a.q, &a.k, &a.v})
    if (t->rank != rank)
      return invalid("q, k and v must have rank " + std::to_string(rank) +
                     (varlen ? " with cu_seqlens" : " (or 3 with cu_seqlens)"));
  l->heads_q = a.q.shape[rank - 2];
  l->head_dim = a.q.shape[rank - 1];
  l->head_dim_v = a.v.shape[rank - 1];
  if (a.k.shape[rank - 1] != l->head_dim) return invalid("k's head dim must equal q's");
  if (!varlen) {
    l->lengths.assign(size_t(a.q.shape[0]), {a.q.shape[1], a.k.shape[1]});
    return {};
  }
  if (!a.maybe_cu_seqlens_q.present() || !a.maybe_cu_seqlens_k.present())
    return invalid("cu_seqlens_q and cu_seqlens_k: give both or neither");
  std::vector<int64_t> lq, lk;
  if (Status s = lengths_of(a.maybe_cu_seqlens_q, "cu_seqlens_q", &lq); !s.ok()) return s;
  if (Status s = lengths_of(a.maybe_cu_seqlens_k, "cu_seqlens_k", &lk); !s.ok()) return s;
  if (lq.size() != lk.size()) return invalid("cu_seqlens_q and cu_seqlens_k must have the same length");
  for (size_t b = 0; b < lq.size(); ++b) l->lengths.emplace_back(lq[b], lk[b]);
  return {};
}

// (query, key) pairs the mask lets through in one sequence.
int64_t visible_pairs(const ForwardArgs& a, int64_t len_q, int64_t len_k) {
  const MaskPolicy m =
      MaskPolicy::make(a.window_left, a.window_right, a.causal, len_q, len_k, a.softcap);
  int64_t pairs = 0;
  for (int64_t i = 0; i < len_q; ++i)
    pairs += std::max(0, m.key_end(int(i), int(len_q), int(len_k)) -
                             m.key_begin(int(i), int(len_q), int(len_k)));
  return pairs;
}

double bytes_of(const Tensor& t) { return double(t.numel()) * double(dtype_size(t.dtype)); }

}  // namespace

Status attention_flops(const ForwardArgs& args, double* forward_flops) noexcept {
  try {
    Layout l;
    if (Status s = layout_of(args, &l); !s.ok()) return s;
    int64_t pairs = 0;
    for (const auto& [len_q, len_k] : l.lengths) {
      if (len_q > INT_MAX || len_k > INT_MAX) return invalid("a sequence longer than 2^31 - 1");
      pairs += visible_pairs(args, len_q, len_k);
    }
    *forward_flops = double(pairs) * double(l.heads_q) * 2.0 * double(l.head_dim + l.head_dim_v);
    return {};
  } catch (const std::bad_alloc&) {
    return {StatusCode::kInvalidArgument, "out of host memory counting FLOPs"};
  }
}

Status attention_bytes(const ForwardArgs& args, Bytes* bytes) noexcept {
  const int rank = args.q.rank;
  if (rank < 3 || args.k.rank != rank || args.v.rank != rank)
    return invalid("q, k and v must have rank 4 (or 3 with cu_seqlens)");
  *bytes = Bytes{};
  bytes->q = bytes_of(args.q);
  bytes->k = bytes_of(args.k);
  bytes->v = bytes_of(args.v);
  // out is q's shape with v's head dim, in q's dtype.
  bytes->out = bytes->q / double(std::max<int64_t>(args.q.shape[rank - 1], 1)) *
               double(args.v.shape[rank - 1]);
  if (args.maybe_lse.present()) bytes->lse = bytes_of(args.maybe_lse);
  return {};
}

ForwardArgs shape_args(const Problem& p) {
  ForwardArgs a;
  if (p.lengths.empty()) {
    a.q = Tensor::contiguous(nullptr, p.dtype, {p.batch, p.seqlen_q, p.heads_q, p.head_dim}, p.device);
    a.k = Tensor::contiguous(nullptr, p.dtype, {p.batch, p.seqlen_k, p.heads_kv, p.head_dim}, p.device);
    a.v = Tensor::contiguous(nullptr, p.dtype, {p.batch, p.seqlen_k, p.heads_kv, p.head_dim_v}, p.device);
    a.out = Tensor::contiguous(nullptr, p.dtype, {p.batch, p.seqlen_q, p.heads_q, p.head_dim_v}, p.device);
  } else {
    const int64_t total = std::accumulate(p.lengths.begin(), p.lengths.end(), int64_t(0));
    a.q = Tensor::contiguous(nullptr, p.dtype, {total, p.heads_q, p.head_dim}, p.device);
    a.k = Tensor::contiguous(nullptr, p.dtype, {total, p.heads_kv, p.head_dim}, p.device);
    a.v = Tensor::contiguous(nullptr, p.dtype, {total, p.heads_kv, p.head_dim_v}, p.device);
    a.out = Tensor::contiguous(nullptr, p.dtype, {total, p.heads_q, p.head_dim_v}, p.device);
    a.maybe_cu_seqlens_q = Tensor::contiguous(nullptr, DType::kI32, {int64_t(p.lengths.size()) + 1});
    a.maybe_cu_seqlens_k = a.maybe_cu_seqlens_q;
    a.max_seqlen_q = p.seqlen_q;
    a.max_seqlen_k = p.seqlen_k;
  }
  a.causal = p.causal, a.softcap = p.softcap;
  a.window_left = p.window_left, a.window_right = p.window_right;
  return a;
}

double pass_flops(const Problem& p) {
  ForwardArgs a = shape_args(p);
  std::vector<int32_t> cu = cu_seqlens_of(p);
  a.maybe_cu_seqlens_q.data = a.maybe_cu_seqlens_k.data = cu.data();
  double f = 0;
  if (!attention_flops(a, &f).ok()) return kNaN;
  return p.train ? f * kTrainFlopFactor : p.backward ? f * kBackwardFlopFactor : f;
}

void set_lengths(Problem& p, std::vector<int> lengths) {
  p.lengths = std::move(lengths);
  if (p.lengths.empty()) return;
  p.batch = int(p.lengths.size());
  p.seqlen_q = p.seqlen_k = *std::max_element(p.lengths.begin(), p.lengths.end());
}

std::vector<int32_t> cu_seqlens_of(const Problem& p) {
  if (p.lengths.empty()) return {};
  std::vector<int32_t> cu(p.lengths.size() + 1, 0);
  for (size_t b = 0; b < p.lengths.size(); ++b) cu[b + 1] = cu[b] + p.lengths[b];
  return cu;
}

Status document_lengths(int tokens, int lo, int hi, uint64_t seed, std::vector<int>* lengths) {
  if (tokens < 1 || lo < 1 || hi < lo)
    return invalid("documents: need tokens >= 1 and 1 <= lo <= hi, got tokens " + std::to_string(tokens) +
                   ", lengths " + std::to_string(lo) + "-" + std::to_string(hi));
  // mt19937_64's sequence is fixed by the standard; the reduction to [lo, hi] is ours, so
  // the lengths do not depend on the standard library (uniform_int_distribution does).
  std::mt19937_64 rng(seed);
  const uint64_t span = uint64_t(hi - lo) + 1;
  lengths->clear();
  for (int filled = 0; filled < tokens;) {
    const int len = std::min(lo + int(rng() % span), tokens - filled);
    lengths->push_back(len);
    filled += len;
  }
  return {};
}

double kv_bytes(const Problem& p) {
  Bytes b;
  return attention_bytes(shape_args(p), &b).ok() ? b.kv() : kNaN;
}

std::string shape_string(const Problem& p) {
  auto pair = [](int a, int b) {
    return a == b ? std::to_string(a) : std::to_string(a) + "/" + std::to_string(b);
  };
  if (!p.lengths.empty()) {
    const int64_t total = std::accumulate(p.lengths.begin(), p.lengths.end(), int64_t(0));
    return "varlen(" + std::to_string(p.lengths.size()) + " docs, " + std::to_string(total) +
           " tokens, max " + std::to_string(p.seqlen_q) + ")x" + pair(p.heads_q, p.heads_kv) + "x" +
           pair(p.head_dim, p.head_dim_v) + " " + to_string(p.dtype);
  }
  std::string s = std::to_string(p.batch) + "x" + pair(p.heads_q, p.heads_kv) + "x" +
                  pair(p.seqlen_q, p.seqlen_k) + "x" + pair(p.head_dim, p.head_dim_v) + " " +
                  to_string(p.dtype);
  if (!p.decode) return s;
  s += " kvcache";
  if (p.page_size > 0) s += " paged(" + std::to_string(p.page_size) + ")";
  if (p.seqlen_new > 0) s += " append(" + std::to_string(p.seqlen_new) + ")";
  if (p.rotary) s += " rotary";
  return s;
}

std::string mask_string(const Problem& p) {
  const MaskPolicy m = MaskPolicy::make(p.window_left, p.window_right, p.causal, p.seqlen_q,
                                        p.seqlen_k, p.softcap);
  std::string s = "none";
  if (p.causal && m.window_left < 0)
    s = "causal";
  else if (m.is_local())
    s = "window(" + std::to_string(m.window_left) + "," + std::to_string(m.window_right) + ")";
  if (m.softcap > 0.f) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "+softcap(%g)", double(m.softcap));
    s += buf;
  }
  return s;
}

namespace {

// A problem of the sweep at head dim d (heads = hidden / d, rounded down: 21 heads at head
// dim 96 and hidden 2048), without its sequences.
Problem sweep_problem(const Sweep& s, int d, bool causal) {
  Problem p;
  p.heads_q = p.heads_kv = s.hidden / d;
  p.head_dim = p.head_dim_v = d;
  p.dtype = s.dtype;
  p.device = s.device;
  p.causal = causal;
  return p;
}

// The forward, the backward and the training step of `p`, as the sweep asks.
void add_passes(const Sweep& s, Problem p, std::vector<Problem>* out) {
  const std::array<std::pair<bool, bool>, 3> passes = {{{false, false}, {true, false}, {false, true}}};
  const std::array<bool, 3> wanted = {s.forward, s.backward, s.train};
  for (size_t i = 0; i < passes.size(); ++i) {
    if (!wanted[i]) continue;
    std::tie(p.backward, p.train) = passes[i];
    out->push_back(p);
  }
}

}  // namespace

std::vector<Problem> sweep_problems(const Sweep& s) {
  std::vector<Problem> out;
  for (int d : s.head_dims) {
    for (int len : s.seqlens) {
      if (d <= 0 || d > s.hidden || len <= 0 || s.tokens % len) continue;
      for (bool causal : s.causal) {
        Problem p = sweep_problem(s, d, causal);
        p.batch = s.tokens / len;
        p.seqlen_q = p.seqlen_k = len;
        add_passes(s, p, &out);
      }
    }
  }
  return out;
}

std::vector<Problem> varlen_problems(const Sweep& s, const std::vector<int>& lengths) {
  std::vector<Problem> out;
  for (int d : s.head_dims) {
    if (d <= 0 || d > s.hidden) continue;
    for (bool causal : s.causal) {
      Problem p = sweep_problem(s, d, causal);
      set_lengths(p, lengths);
      add_passes(s, p, &out);
    }
  }
  return out;
}

std::vector<Problem> decode_problems(const Sweep& s) {
  std::vector<Problem> out;
  for (int len_k : s.decode_seqlens) {
    Problem p;
    p.batch = s.decode_batch;
    p.heads_q = s.decode_heads_q;
    p.heads_kv = s.decode_heads_kv;
    p.seqlen_q = s.decode_seqlen_q;
    p.seqlen_k = len_k;
    p.head_dim = p.head_dim_v = s.decode_head_dim;
    p.dtype = s.dtype;
    p.device = s.device;
    p.decode = true;
    p.page_size = s.decode_page_size;
    p.seqlen_new = s.decode_seqlen_new;
    out.push_back(p);
  }
  return out;
}

}  // namespace flashlab::bench
