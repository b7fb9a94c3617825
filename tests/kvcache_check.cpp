// forward_kvcache's checks against the oracle (kvcache_check.h).
#include "kvcache_check.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "common/mask.h"

namespace flashlab::test {

KvCacheArgs KvCall::args(std::string_view kernel) const {
  KvCacheArgs a;
  a.kernel = kernel;
  a.q = q.view(), a.k_cache = k_cache.view(), a.v_cache = v_cache.view();
  a.maybe_k_new = k_new.view(), a.maybe_v_new = v_new.view();
  a.maybe_cache_seqlens = seqlens.view(), a.maybe_cache_batch_idx = batch_idx.view();
  a.maybe_block_table = block_table.view(), a.maybe_cache_leftpad = leftpad.view();
  a.maybe_rotary_cos = rotary_cos.view(), a.maybe_rotary_sin = rotary_sin.view();
  a.out = out.view(), a.maybe_lse = lse.view();
  return a;
}

KvCacheArgs KvCall::args(std::string_view kernel, Placement& pl) const {
  KvCacheArgs a;
  a.kernel = kernel;
  a.stream = pl.stream();
  a.q = pl.place(q), a.k_cache = pl.place(k_cache), a.v_cache = pl.place(v_cache);
  a.maybe_k_new = pl.place(k_new), a.maybe_v_new = pl.place(v_new);
  a.maybe_cache_seqlens = pl.place(seqlens), a.maybe_cache_batch_idx = pl.place(batch_idx);
  a.maybe_block_table = pl.place(block_table), a.maybe_cache_leftpad = pl.place(leftpad);
  a.maybe_rotary_cos = pl.place(rotary_cos), a.maybe_rotary_sin = pl.place(rotary_sin);
  a.out = pl.place(out), a.maybe_lse = pl.place(lse);
  return a;
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// 0, 1, ..., n - 1 in a random order.
std::vector<double> shuffled(int64_t n, std::mt19937_64& rng) {
  std::vector<double> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0.0);
  std::shuffle(v.begin(), v.end(), rng);
  return v;
}

// Logical index of row `pos` (head 0, element 0) of sequence b in a cache.
int64_t cache_index(const KvCall& k, const KvCase& c, int b, int pos) {
  const int64_t row_elems = int64_t(c.heads_kv) * c.head_dim;
  if (c.page_size > 0) {
    const int64_t page = int64_t(k.block_table.get(b * k.block_table.shape()[1] + pos / c.page_size));
    return (page * c.page_size + pos % c.page_size) * row_elems;
  }
  const int64_t r = c.permuted ? int64_t(k.batch_idx.get(b)) : b;
  return (r * c.capacity + pos) * row_elems;
}

}  // namespace

KvCall make_call(const KvCase& c, std::mt19937_64& rng) {
  const int B = int(c.cached.size());
  KvCall k;
  k.q = HostTensor(c.dtype, {B, c.seqlen_q, c.heads_q, c.head_dim});
  k.q.fill_random(rng);
  int64_t rows = B + (c.permuted ? 1 : 0), per_row = c.capacity;
  if (c.page_size > 0) {
    const int max_pages = c.capacity / c.page_size;
    rows = int64_t(B) * max_pages + 3;  // pages no sequence uses stay in the pool
    per_row = c.page_size;
    std::vector<double> pages = shuffled(rows, rng);
    pages.resize(size_t(B) * max_pages);
    for (int b = 0; b < B; ++b)  // entries past the pages a sequence uses are never read
      for (int j = 0; j < max_pages; ++j)
        if (int64_t(j) * c.page_size >= c.cached[b] + c.seqlen_new) pages[b * max_pages + j] = -1;
    k.block_table = HostTensor(DType::kI32, {B, max_pages});
    k.block_table.assign(pages);
  } else if (c.permuted) {
    std::vector<double> idx = shuffled(rows, rng);
    idx.resize(B);
    k.batch_idx = HostTensor(DType::kI32, {B});
    k.batch_idx.assign(idx);
  }
  // Padded head strides, so that the caches' and new rows' strides are not their shapes';
  // whole 16-byte chunks where the head dim allows (CUDA kernels load 16 bytes at a time).
  const int64_t pad = c.head_dim % 8 == 0 ? 8 : 3;
  k.k_cache = HostTensor(c.dtype, {rows, per_row, c.heads_kv, c.head_dim}, {0, pad});
  k.v_cache = HostTensor(c.dtype, {rows, per_row, c.heads_kv, c.head_dim}, {0, 2 * pad});
  for (HostTensor* t : {&k.k_cache, &k.v_cache}) {
    t->poison();  // the padding stays poison: padding_untouched() shows a stray write
    t->fill_random(rng);
  }
  if (c.seqlen_new > 0) {
    k.k_new = HostTensor(c.dtype, {B, c.seqlen_new, c.heads_kv, c.head_dim}, {1, 0});
    k.v_new = HostTensor(c.dtype, {B, c.seqlen_new, c.heads_kv, c.head_dim});
    k.k_new.fill_random(rng);
    k.v_new.fill_random(rng);
  }
  k.seqlens = HostTensor(DType::kI32, {B});
  k.seqlens.assign(std::vector<double>(c.cached.begin(), c.cached.end()));
  if (!c.leftpad.empty()) {
    k.leftpad = HostTensor(DType::kI32, {B});
    k.leftpad.assign(std::vector<double>(c.leftpad.begin(), c.leftpad.end()));
    const int64_t row_elems = int64_t(c.heads_kv) * c.head_dim;
    for (int b = 0; b < B; ++b)
      for (int pos = 0; pos < c.leftpad[b]; ++pos)
        for (int64_t e = 0; e < row_elems; ++e) {
          k.k_cache.set(cache_index(k, c, b, pos) + e, std::numeric_limits<double>::quiet_NaN());
          k.v_cache.set(cache_index(k, c, b, pos) + e, std::numeric_limits<double>::quiet_NaN());
        }
  }
  if (c.nan_hidden) {
    const MaskPolicy mask = MaskPolicy::make(c.window_left, c.window_right, c.causal, c.seqlen_q,
                                             c.capacity, c.softcap);
    const int64_t row_elems = int64_t(c.heads_kv) * c.head_dim;
    const double nan = std::numeric_limits<double>::quiet_NaN();
    for (int b = 0; b < B; ++b) {
      const int len = c.cached[b] + c.seqlen_new;
      const int pad = c.leftpad.empty() ? 0 : c.leftpad[b];
      for (int pos = pad; pos < pad + mask.key_begin(0, c.seqlen_q, len - pad); ++pos)
        for (int64_t e = 0; e < row_elems; ++e) {
          k.k_cache.set(cache_index(k, c, b, pos) + e, nan);
          k.v_cache.set(cache_index(k, c, b, pos) + e, nan);
        }
    }
  }
  if (c.k_ramp > 0) {
    const int64_t row_elems = int64_t(c.heads_kv) * c.head_dim;
    for (int b = 0; b < B; ++b)
      for (int pos = 0; pos < c.cached[b]; ++pos) {
        const double scale = 1.0 + double(c.capacity - pos) / c.k_ramp;
        const int64_t row = cache_index(k, c, b, pos);
        for (int64_t e = 0; e < row_elems; ++e) k.k_cache.set(row + e, k.k_cache.get(row + e) * scale);
      }
  }
  if (c.nan_visible >= 0)
    k.k_cache.set(cache_index(k, c, 0, c.nan_visible), std::numeric_limits<double>::quiet_NaN());
  if (c.rotary_dim > 0) {  // RoPE: angle pos·10000^(−2i / rotary_dim)
    const int rows = c.capacity + c.seqlen_q, half = c.rotary_dim / 2;
    k.rotary_cos = HostTensor(c.dtype, {rows, half}, {4});
    k.rotary_sin = HostTensor(c.dtype, {rows, half}, {4});
    for (int pos = 0; pos < rows; ++pos)
      for (int i = 0; i < half; ++i) {
        const double angle = pos * std::pow(10000.0, -2.0 * i / c.rotary_dim);
        k.rotary_cos.set(int64_t(pos) * half + i, std::cos(angle));
        k.rotary_sin.set(int64_t(pos) * half + i, std::sin(angle));
      }
  }
  k.out = HostTensor(c.dtype, {B, c.seqlen_q, c.heads_q, c.head_dim});
  k.lse = HostTensor(DType::kF32, {B, c.heads_q, c.seqlen_q});
  k.out.poison();
  k.lse.poison();
  return k;
}

namespace {

// An element the rotation computes: its exact (fp64) value and how far a kernel's may be
// from it: the rounding to the dtype plus fp32 arithmetic's (a few 2^-24 of the products).
struct Turned {
  int64_t index;  // logical element of the cache
  double exact, slack;
};

double rounding_of(DType t) {  // half an ulp, relative
  return t == DType::kBF16 ? 0x1p-8 : t == DType::kF16 ? 0x1p-11 : t == DType::kF32 ? 0x1p-24 : 0x1p-53;
}
// Half the spacing of the dtype's subnormals: the rounding's absolute bound below the
// normals, where the relative one no longer holds (an fp16 result near 1.6e-5 sits between
// subnormals 2^-24 apart).
double subnormal_rounding_of(DType t) {
  return t == DType::kBF16 ? 0x1p-134 : t == DType::kF16 ? 0x1p-25 : t == DType::kF32 ? 0x1p-150 : 0.0;
}

// FlashAttention-2's rule for q's positions: one per query when causal or a window bound can
// bind (it is in [0, capacity)), else every query at cache_seqlens[b].
bool per_query(const KvCase& c) {
  auto binds = [&](int w) { return w >= 0 && w < c.capacity; };
  return c.causal || binds(c.window_left) || binds(c.window_right);
}

// Head vector x[0, head_dim) turned at position pos in fp64 from the case's tables; slack[d]
// as in Turned (0 for the channels past rotary_dim, which are copied).
void turn(const KvCall& k, const KvCase& c, double* x, double* slack, int pos) {
  const int half = c.rotary_dim / 2;
  for (int d = 0; d < c.head_dim; ++d) slack[d] = 0;
  for (int i = 0; i < half; ++i) {
    const int ia = c.rotary_interleaved ? 2 * i : i, ib = c.rotary_interleaved ? 2 * i + 1 : i + half;
    const double cs = k.rotary_cos.get(int64_t(pos) * half + i), sn = k.rotary_sin.get(int64_t(pos) * half + i);
    const double a = x[ia], b = x[ib];
    x[ia] = a * cs - b * sn, x[ib] = a * sn + b * cs;
    const double tiny = subnormal_rounding_of(c.dtype);
    slack[ia] = rounding_of(c.dtype) * std::abs(x[ia]) + tiny + 0x1p-21 * (std::abs(a * cs) + std::abs(b * sn));
    slack[ib] = rounding_of(c.dtype) * std::abs(x[ib]) + tiny + 0x1p-21 * (std::abs(a * sn) + std::abs(b * cs));
  }
}

// The caches as they must be after the call: the new rows written by hand, k's rotated with
// rotary (the rotated channels listed in *turned).
void append_by_hand(const KvCall& k, const KvCase& c, HostTensor* kc, HostTensor* vc,
                    std::vector<Turned>* turned) {
  const int64_t row_elems = int64_t(c.heads_kv) * c.head_dim;
  std::vector<double> x(size_t(c.head_dim)), slack(size_t(c.head_dim));
  for (int b = 0; b < int(c.cached.size()); ++b)
    for (int t = 0; t < c.seqlen_new; ++t)
      for (int64_t h = 0; h < c.heads_kv; ++h) {
        const int64_t dst = cache_index(k, c, b, c.cached[b] + t) + h * c.head_dim;
        const int64_t src = (int64_t(b) * c.seqlen_new + t) * row_elems + h * c.head_dim;
        for (int d = 0; d < c.head_dim; ++d) x[size_t(d)] = k.k_new.get(src + d);
        if (c.rotary_dim > 0) turn(k, c, x.data(), slack.data(), c.cached[b] + t);
        for (int d = 0; d < c.head_dim; ++d) {
          kc->set(dst + d, x[size_t(d)]);
          vc->set(dst + d, k.v_new.get(src + d));
          if (d < c.rotary_dim) turned->push_back({dst + d, x[size_t(d)], slack[size_t(d)]});
        }
      }
}

// q as the attention must see it: with rotary each head vector turned (fp64, rounded to the
// dtype) at cache_seqlens[b] + i, or cache_seqlens[b] (per_query).
HostTensor q_seen(const KvCall& k, const KvCase& c) {
  HostTensor q = k.q;
  if (c.rotary_dim == 0) return q;
  std::vector<double> x(size_t(c.head_dim)), slack(size_t(c.head_dim));
  for (int b = 0; b < int(c.cached.size()); ++b)
    for (int i = 0; i < c.seqlen_q; ++i)
      for (int h = 0; h < c.heads_q; ++h) {
        const int64_t at = ((int64_t(b) * c.seqlen_q + i) * c.heads_q + h) * c.head_dim;
        for (int d = 0; d < c.head_dim; ++d) x[size_t(d)] = q.get(at + d);
        turn(k, c, x.data(), slack.data(), c.cached[b] + (per_query(c) ? i : 0));
        for (int d = 0; d < c.head_dim; ++d) q.set(at + d, x[size_t(d)]);
      }
  return q;
}

// The rotated elements of the new k rows within their slack of the fp64 rotation; each
// that is takes the kernel's value in *want, so that the byte comparison covers the rest.
::testing::AssertionResult turned_within(const HostTensor& got, const std::vector<Turned>& turned,
                                         HostTensor* want) {
  for (const Turned& t : turned) {
    const double g = got.get(t.index);
    if (!(std::abs(g - t.exact) <= t.slack))
      return ::testing::AssertionFailure() << "k_cache element " << t.index << " (a rotated new row) is " << g
                                           << ", the fp64 rotation " << t.exact << " (allowed " << t.slack << ")";
    want->set(t.index, g);
  }
  return ::testing::AssertionSuccess();
}

// Sequence b alone: q[b] and its `len` keys, cache rows [first, first + len) of the expected
// cache, as a dense problem.
Inputs sequence_inputs(const KvCall& k, const KvCase& c, const HostTensor& q, const HostTensor& kc,
                       const HostTensor& vc, int b, int first, int len) {
  Inputs in;
  in.q = HostTensor(c.dtype, {1, c.seqlen_q, c.heads_q, c.head_dim});
  const int64_t q_elems = int64_t(c.seqlen_q) * c.heads_q * c.head_dim;
  for (int64_t i = 0; i < q_elems; ++i) in.q.set(i, q.get(b * q_elems + i));
  in.k = HostTensor(c.dtype, {1, len, c.heads_kv, c.head_dim});
  in.v = HostTensor(c.dtype, {1, len, c.heads_kv, c.head_dim});
  const int64_t row_elems = int64_t(c.heads_kv) * c.head_dim;
  for (int pos = 0; pos < len; ++pos)
    for (int64_t e = 0; e < row_elems; ++e) {
      in.k.set(pos * row_elems + e, kc.get(cache_index(k, c, b, first + pos) + e));
      in.v.set(pos * row_elems + e, vc.get(cache_index(k, c, b, first + pos) + e));
    }
  return in;
}

void append_to(std::vector<double>* all, const std::vector<double>& part) {
  all->insert(all->end(), part.begin(), part.end());
}

}  // namespace

void check_kvcache_case(std::string_view kernel, const KvCase& c, Placement& pl) {
  FLASHLAB_SEED_TRACE();
  SCOPED_TRACE("case " + c.name);
  std::mt19937_64 rng = rng_for(std::string(kernel) + "/kvcache/" + c.name);
  KvCall k = make_call(c, rng);
  HostTensor want_k = k.k_cache, want_v = k.v_cache;
  std::vector<Turned> turned;
  append_by_hand(k, c, &want_k, &want_v, &turned);
  const HostTensor want_q = q_seen(k, c);
  const HostTensor q0 = k.q, kn0 = k.k_new, vn0 = k.v_new, bt0 = k.block_table, cos0 = k.rotary_cos;

  KvCacheArgs a = k.args(kernel, pl);
  a.causal = c.causal;
  a.window_left = c.window_left;
  a.window_right = c.window_right;
  a.softcap = c.softcap;
  a.num_splits = c.num_splits;
  a.rotary_interleaved = c.rotary_interleaved;
  size_t bytes = 0;
  ASSERT_OK(workspace_size(a, &bytes));
  a.workspace = pl.scratch(bytes);
  a.workspace_bytes = bytes;
  ASSERT_OK(forward_kvcache(a));
  for (HostTensor* t : {&k.out, &k.lse, &k.k_cache, &k.v_cache, &k.q, &k.k_new, &k.v_new, &k.block_table,
                        &k.rotary_cos})
    if (t->view().present()) {
      ASSERT_TRUE(pl.fetch(*t));
    }
  ASSERT_TRUE(pl.ok());

  EXPECT_TRUE(turned_within(k.k_cache, turned, &want_k));
  EXPECT_TRUE(k.k_cache.storage() == want_k.storage()) << "k_cache is not the cache plus the new rows";
  EXPECT_TRUE(k.v_cache.storage() == want_v.storage()) << "v_cache is not the cache plus the new rows";
  EXPECT_TRUE(k.q.storage() == q0.storage() && k.k_new.storage() == kn0.storage() &&
              k.v_new.storage() == vn0.storage() && k.block_table.storage() == bt0.storage() &&
              k.rotary_cos.storage() == cos0.storage())
      << "forward_kvcache wrote an input";
  EXPECT_TRUE(k.out.written_exactly("out", c.nan_visible >= 0));
  EXPECT_TRUE(k.lse.written_exactly("lse", c.nan_visible >= 0));

  Results oracle, lowp;
  for (int b = 0; b < int(c.cached.size()); ++b) {
    const int first = c.leftpad.empty() ? 0 : c.leftpad[b];
    const int len = c.cached[b] + c.seqlen_new - first;  // the sequence's keys
    if (len == 0) {  // no key: out rows 0, LSE -inf, exactly
      const std::vector<double> zeros(size_t(c.seqlen_q) * c.heads_q * c.head_dim, 0.0);
      const std::vector<double> empty(size_t(c.heads_q) * c.seqlen_q, -kInf);
      for (Results* r : {&oracle, &lowp}) append_to(&r->out, zeros), append_to(&r->lse, empty);
      continue;
    }
    Problem p = dense(c.dtype, 1, c.seqlen_q, len, c.heads_q, c.heads_kv, c.head_dim)
                    .window(c.window_left, c.window_right)
                    .cap(c.softcap);
    p.causal = c.causal;
    const Inputs in = sequence_inputs(k, c, want_q, want_k, want_v, b, first, len);
    const Results o = run_reference_fp64(p, in, false), l = run_lowp(p, in, false);
    append_to(&oracle.out, o.out), append_to(&oracle.lse, o.lse);
    append_to(&lowp.out, l.out), append_to(&lowp.lse, l.lse);
  }
  std::vector<double> got_out = k.out.to_f64(), got_lse = k.lse.to_f64();
  ASSERT_EQ(oracle.out.size(), got_out.size());
  ASSERT_EQ(oracle.lse.size(), got_lse.size());
  // Where the oracle is NaN (a row that sees a NaN), the kernel must be NaN too; those
  // elements then leave the error bound's comparison.
  auto nan_where_oracle = [](const char* what, std::vector<double>& got, std::vector<double>& want,
                             std::vector<double>& low) {
    int64_t nan = 0, finite = 0;
    for (size_t i = 0; i < want.size(); ++i)
      if (std::isnan(want[i])) ++nan, finite += !std::isnan(got[i]), got[i] = want[i] = low[i] = 0.0;
    EXPECT_EQ(finite, 0) << what << ": elements finite where the row sees a NaN";
    return nan;
  };
  const int64_t nan_out = nan_where_oracle("out", got_out, oracle.out, lowp.out);
  const int64_t nan_lse = nan_where_oracle("lse", got_lse, oracle.lse, lowp.lse);
  if (c.nan_visible >= 0) {  // the case reaches some rows: query heads of KV head 0's group
    EXPECT_TRUE(nan_out > 0 && nan_lse > 0) << "no row sees the NaN at row " << c.nan_visible;
  }
  EXPECT_TRUE(within_rule("out", max_abs_err(got_out, oracle.out), max_abs_err(lowp.out, oracle.out),
                          magnitude_of(oracle.out)));
  EXPECT_TRUE(within_rule("lse", max_abs_err(got_lse, oracle.lse), max_abs_err(lowp.lse, oracle.lse),
                          magnitude_of(oracle.lse)));
}


}  // namespace flashlab::test
