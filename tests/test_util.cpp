#include "test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <sstream>

#include "common/dtype.h"

namespace flashlab::test {

// ---- seeds ------------------------------------------------------------------------------

uint64_t test_seed() {
  static const uint64_t seed = [] {
    if (const char* env = std::getenv("FLASHLAB_TEST_SEED"); env && *env)
      return uint64_t(std::strtoull(env, nullptr, 0));
    std::random_device rd;
    return (uint64_t(rd()) << 32) ^ uint64_t(rd());
  }();
  return seed;
}

std::mt19937_64 rng_for(std::string_view what) {
  // The name's hash keeps cases independent of the order they run in.
  std::seed_seq seq{uint32_t(test_seed()), uint32_t(test_seed() >> 32),
                    uint32_t(std::hash<std::string_view>{}(what))};
  return std::mt19937_64(seq);
}

std::string seed_note() { return "FLASHLAB_TEST_SEED=" + std::to_string(test_seed()); }

// ---- HostTensor -------------------------------------------------------------------------

namespace {

// The NaN each dtype is poisoned with (a payload no arithmetic produces).
void write_poison(std::byte* p, DType dtype) {
  switch (dtype) {
    case DType::kF32: { const uint32_t u = 0x7fc0dead; std::memcpy(p, &u, 4); return; }
    case DType::kF64: { const uint64_t u = 0x7ff8deaddeaddeadull; std::memcpy(p, &u, 8); return; }
    case DType::kF16: { const uint16_t u = 0x7e5a; std::memcpy(p, &u, 2); return; }
    case DType::kBF16: { const uint16_t u = 0x7fa5; std::memcpy(p, &u, 2); return; }
    case DType::kI32: { const int32_t u = INT32_MIN + 0x5a5a; std::memcpy(p, &u, 4); return; }
  }
}

bool is_poison(const std::byte* p, DType dtype) {
  std::byte ref[8];
  write_poison(ref, dtype);
  return std::memcmp(p, ref, dtype_size(dtype)) == 0;
}

}  // namespace

HostTensor::HostTensor(DType dtype, std::vector<int64_t> shape, std::vector<int64_t> pad)
    : dtype_(dtype), shape_(std::move(shape)) {
  const int r = rank();
  // pad aligns to the trailing dimensions: {.., pad_heads, pad_dim}.
  std::vector<int64_t> p(r, 0);
  for (int i = 0; i < r && i < int(pad.size()); ++i) p[r - 1 - i] = pad[pad.size() - 1 - i];
  extent_.resize(r);
  stride_.resize(r);
  int64_t st = 1;
  for (int i = r - 1; i >= 0; --i) {
    extent_[i] = shape_[i] + p[i];
    stride_[i] = st;
    st *= extent_[i];
  }
  const size_t view_bytes = size_t(st) * elem_bytes();
  storage_.assign(view_bytes + 2 * kCanaryBytes, std::byte{0});
}

size_t HostTensor::elem_bytes() const { return dtype_size(dtype_); }

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape_) n *= s;
  return shape_.empty() ? 0 : n;
}

bool HostTensor::contiguous() const {
  for (int i = 0; i < rank(); ++i)
    if (extent_[i] != shape_[i]) return false;
  return true;
}

Tensor HostTensor::view() const {
  Tensor t;
  if (shape_.empty()) return t;
  t.data = const_cast<void*>(data());
  t.dtype = dtype_;
  t.device = Device::kCPU;
  t.rank = rank();
  for (int i = 0; i < rank(); ++i) {
    t.shape[i] = shape_[i];
    t.stride[i] = stride_[i];
  }
  return t;
}

int64_t HostTensor::offset(int64_t i) const {
  int64_t off = 0;
  for (int d = rank() - 1; d >= 0; --d) {
    off += (i % shape_[d]) * stride_[d];
    i /= shape_[d];
  }
  return off;
}

double HostTensor::get(int64_t i) const { return load_as_double(data(), dtype_, offset(i)); }

void HostTensor::set(int64_t i, double x) { store_from_double(data(), dtype_, offset(i), x); }

std::vector<double> HostTensor::to_f64() const {
  std::vector<double> v(static_cast<size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i) v[i] = get(i);
  return v;
}

void HostTensor::assign(const std::vector<double>& xs) {
  for (int64_t i = 0; i < numel() && i < int64_t(xs.size()); ++i) set(i, xs[i]);
}

void HostTensor::fill_random(std::mt19937_64& rng) {
  std::normal_distribution<double> normal(0.0, 1.0);
  for (int64_t i = 0; i < numel(); ++i) {
    do set(i, normal(rng));
    while (get(i) == 0.0);
  }
}

void HostTensor::poison() {
  const size_t es = elem_bytes();
  for (size_t b = 0; b + es <= storage_.size(); b += es) write_poison(&storage_[b], dtype_);
}

std::vector<bool> HostTensor::seen_by_view() const {
  const size_t es = elem_bytes();
  std::vector<bool> seen(storage_.size() / es, false);
  const int64_t base = int64_t(kCanaryBytes / es);
  for (int64_t i = 0; i < numel(); ++i) seen[size_t(base + offset(i))] = true;
  return seen;
}

::testing::AssertionResult HostTensor::padding_untouched(std::string_view name) const {
  const size_t es = elem_bytes();
  const std::vector<bool> seen = seen_by_view();
  int64_t clobbered = 0, first = -1;
  for (size_t e = 0; e < seen.size(); ++e) {
    if (seen[e] || is_poison(&storage_[e * es], dtype_)) continue;
    if (first < 0) first = int64_t(e) - int64_t(kCanaryBytes / es);
    ++clobbered;
  }
  if (clobbered == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << name << ": " << clobbered << " element(s) outside the view were written (first at "
         << "element offset " << first << " from the view's start)";
}

::testing::AssertionResult HostTensor::untouched(std::string_view name) const {
  const size_t es = elem_bytes();
  for (size_t b = 0; b + es <= storage_.size(); b += es)
    if (!is_poison(&storage_[b], dtype_))
      return ::testing::AssertionFailure()
             << name << " was written (element offset "
             << (int64_t(b) - int64_t(kCanaryBytes)) / int64_t(es) << " from the view's start)";
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult HostTensor::written_exactly(std::string_view name, bool nan_written) const {
  int64_t unwritten = 0, first = -1;
  for (int64_t i = 0; i < numel(); ++i) {
    const std::byte* e = storage_.data() + kCanaryBytes + offset(i) * int64_t(elem_bytes());
    if (nan_written ? !is_poison(e, dtype_) : !std::isnan(get(i))) continue;
    if (first < 0) first = i;
    ++unwritten;
  }
  if (unwritten > 0)
    return ::testing::AssertionFailure()
           << name << ": " << unwritten << " of " << numel()
           << " elements still hold the poison (or NaN); first at logical element " << first;
  return padding_untouched(name);
}

HostTensor HostTensor::converted(DType dtype) const {
  HostTensor t(dtype, shape_);
  for (int64_t i = 0; i < numel(); ++i) t.set(i, get(i));
  return t;
}

// ---- errors -----------------------------------------------------------------------------

MaxError max_abs_err(const std::vector<double>& got, const std::vector<double>& want) {
  MaxError e;
  const size_t n = std::min(got.size(), want.size());
  if (got.size() != want.size()) {
    e.value = std::numeric_limits<double>::infinity();
    e.index = int64_t(n);
    return e;
  }
  for (size_t i = 0; i < n; ++i) {
    const double g = got[i], w = want[i];
    double d;
    if (std::isnan(g) || std::isnan(w)) d = std::numeric_limits<double>::infinity();
    else if (std::isinf(g) || std::isinf(w)) d = g == w ? 0.0 : std::numeric_limits<double>::infinity();
    else d = std::abs(g - w);
    if (e.index < 0 || d > e.value) {
      e.value = d;
      e.index = int64_t(i);
      e.got = g;
      e.want = w;
    }
  }
  return e;
}

std::string describe(const MaxError& e) {
  std::ostringstream s;
  s.precision(6);
  s << e.value;
  if (e.index >= 0) s << " (element " << e.index << ": got " << e.got << ", want " << e.want << ")";
  return s.str();
}

double magnitude_of(const std::vector<double>& oracle) {
  double magnitude = 1.0;
  for (double x : oracle)
    if (std::isfinite(x)) magnitude = std::max(magnitude, std::abs(x));
  return magnitude;
}

double gradient_magnitude(const std::vector<double>& oracle, double terms) {
  return std::max(magnitude_of(oracle), std::isfinite(terms) ? terms : 0.0);
}

double rule_bound(const MaxError& lowp, double magnitude, double from_out) {
  return kErrFactor * lowp.value + kErrSlack * std::max(1.0, magnitude) +
         (std::isfinite(from_out) ? from_out : 0.0);
}

::testing::AssertionResult within_rule(std::string_view name, const MaxError& kernel,
                                       const MaxError& lowp, double magnitude, double from_out) {
  const double bound = rule_bound(lowp, magnitude, from_out);
  if (std::isfinite(kernel.value) && kernel.value <= bound)
    return ::testing::AssertionSuccess() << name << " ok";
  return ::testing::AssertionFailure()
         << name << ": max abs error vs the fp64 oracle " << describe(kernel) << " > bound "
         << bound << " = 2 x low-precision path's " << describe(lowp) << " + 1e-5 x "
         << std::max(1.0, magnitude)
         << (from_out > 0 ? " + O's rounding " + std::to_string(from_out) : std::string());
}

double yardstick_cap(DType dtype, const std::vector<double>& oracle) {
  const double magnitude = magnitude_of(oracle);
  // Far above what rounding gives (fp16 ~1e-3, bf16 ~1e-2 relative), far below the O(1)
  // error of computing something else.
  switch (dtype) {
    case DType::kF16: return 0.02 * magnitude;
    case DType::kBF16: return 0.1 * magnitude;
    default: return 1e-4 * magnitude;
  }
}

::testing::AssertionResult status_is(const Status& s, StatusCode code,
                                     std::initializer_list<std::string_view> substrings) {
  if (s.code() != code)
    return ::testing::AssertionFailure() << "status is '" << to_string(s.code()) << "' ("
                                         << s.message() << "), expected '" << to_string(code)
                                         << "'";
  for (std::string_view sub : substrings)
    if (s.message().find(sub) == std::string::npos)
      return ::testing::AssertionFailure() << "message \"" << s.message()
                                           << "\" does not mention \"" << sub << "\"";
  return ::testing::AssertionSuccess() << "'" << to_string(code) << "': " << s.message();
}

// ---- problems ---------------------------------------------------------------------------

int64_t Problem::total_q() const {
  if (!varlen()) return int64_t(batch) * seqlen_q;
  int64_t t = 0;
  for (int l : lens_q) t += l;
  return t;
}

int64_t Problem::total_k() const {
  if (!varlen()) return int64_t(batch) * seqlen_k;
  int64_t t = 0;
  for (int l : lens_k) t += l;
  return t;
}

int Problem::max_len_q() const {
  if (!varlen()) return seqlen_q;
  return lens_q.empty() ? 0 : *std::max_element(lens_q.begin(), lens_q.end());
}

int Problem::max_len_k() const {
  if (!varlen()) return seqlen_k;
  return lens_k.empty() ? 0 : *std::max_element(lens_k.begin(), lens_k.end());
}

std::string Problem::describe() const {
  std::ostringstream s;
  auto list = [&](const std::vector<int>& v) {
    s << "{";
    for (size_t i = 0; i < v.size(); ++i) s << (i ? "," : "") << v[i];
    s << "}";
  };
  s << to_string(dtype);
  if (varlen()) {
    s << " varlen q";
    list(lens_q);
    s << " k";
    list(lens_k);
  } else {
    s << " b" << batch << " sq" << seqlen_q << " sk" << seqlen_k;
  }
  s << " h" << heads_q << "/" << heads_kv << " d" << head_dim;
  if (head_dim_v != head_dim) s << " dv" << head_dim_v;
  if (causal) s << " causal";
  if (window_left >= 0 || window_right >= 0) s << " window(" << window_left << "," << window_right << ")";
  if (softcap > 0) s << " softcap" << softcap;
  if (dropout_p > 0) s << " dropout" << dropout_p << " seed" << dropout_seed;
  if (scale) s << " scale" << *scale;
  if (key_growth > 0.f) s << " key_growth" << key_growth;
  if (!pad.empty()) {
    s << " pad{";
    for (size_t i = 0; i < pad.size(); ++i) s << (i ? "," : "") << pad[i];
    s << "}";
  }
  if (num_threads) s << " threads" << num_threads;
  if (!with_lse) s << " no-lse";
  return s.str();
}

Problem dense(DType dtype, int batch, int seqlen_q, int seqlen_k, int heads_q, int heads_kv,
              int head_dim) {
  Problem p;
  p.dtype = dtype;
  p.batch = batch;
  p.seqlen_q = seqlen_q;
  p.seqlen_k = seqlen_k;
  p.heads_q = heads_q;
  p.heads_kv = heads_kv;
  p.head_dim = p.head_dim_v = head_dim;
  return p;
}

Problem varlen(DType dtype, std::vector<int> lens_q, std::vector<int> lens_k, int heads_q,
               int heads_kv, int head_dim) {
  Problem p;
  p.dtype = dtype;
  p.batch = int(lens_q.size());
  p.lens_q = std::move(lens_q);
  p.lens_k = std::move(lens_k);
  p.seqlen_q = p.max_len_q();
  p.seqlen_k = p.max_len_k();
  p.heads_q = heads_q;
  p.heads_kv = heads_kv;
  p.head_dim = p.head_dim_v = head_dim;
  return p;
}

MaskPolicy mask_of(const Problem& p) {
  return MaskPolicy::make(p.window_left, p.window_right, p.causal, p.max_len_q(), p.max_len_k(),
                          p.softcap);
}

DropoutPolicy dropout_of(const Problem& p) {
  return DropoutPolicy::make(p.dropout_p, p.dropout_seed, p.dropout_offset);
}

float scale_of(const Problem& p) {
  return p.scale ? *p.scale : float(1.0 / std::sqrt(double(p.head_dim)));
}

namespace {

std::vector<int64_t> rows_shape(const Problem& p, int64_t total, int seqlen, int heads, int dim) {
  if (p.varlen()) return {total, heads, dim};
  return {p.batch, seqlen, heads, dim};
}

HostTensor cu_seqlens(const std::vector<int>& lens) {
  HostTensor t(DType::kI32, {int64_t(lens.size()) + 1});
  int64_t acc = 0;
  t.set(0, 0);
  for (size_t b = 0; b < lens.size(); ++b) t.set(int64_t(b) + 1, double(acc += lens[b]));
  return t;
}

}  // namespace

HostTensor make_like_q(const Problem& p) {
  HostTensor t(p.dtype, rows_shape(p, p.total_q(), p.seqlen_q, p.heads_q, p.head_dim), p.pad);
  t.poison();
  return t;
}

HostTensor make_like_kv(const Problem& p, int dim) {
  HostTensor t(p.dtype, rows_shape(p, p.total_k(), p.seqlen_k, p.heads_kv, dim), p.pad);
  t.poison();
  return t;
}

HostTensor make_out(const Problem& p) {
  HostTensor t(p.dtype, rows_shape(p, p.total_q(), p.seqlen_q, p.heads_q, p.head_dim_v), p.pad);
  t.poison();
  return t;
}

HostTensor make_lse(const Problem& p) {
  HostTensor t = p.varlen() ? HostTensor(DType::kF32, {p.heads_q, p.total_q()})
                            : HostTensor(DType::kF32, {p.batch, p.heads_q, p.seqlen_q});
  t.poison();
  return t;
}

Inputs make_inputs(const Problem& p, std::mt19937_64& rng) {
  Inputs in;
  in.q = make_like_q(p);
  in.k = make_like_kv(p, p.head_dim);
  in.v = make_like_kv(p, p.head_dim_v);
  in.dout = make_out(p);
  in.q.fill_random(rng);
  in.k.fill_random(rng);
  in.v.fill_random(rng);
  in.dout.fill_random(rng);
  if (p.key_growth > 0.f && !p.varlen()) {
    // k is [batch, seqlen_k, heads_kv, head_dim], row-major over its logical shape.
    const int64_t per_key = int64_t(p.heads_kv) * p.head_dim;
    for (int64_t i = 0; i < in.k.numel(); ++i) {
      const int64_t j = i / per_key % p.seqlen_k;
      in.k.set(i, in.k.get(i) * std::pow(double(p.key_growth), double(p.seqlen_k - 1 - j) / 128.0));
    }
  }
  if (p.varlen()) {
    in.cu_q = cu_seqlens(p.lens_q);
    in.cu_k = cu_seqlens(p.lens_k);
  }
  return in;
}

namespace {

void fill_common(const Problem& p, const Tensor& cu_q, const Tensor& cu_k, CommonArgs* a) {
  if (p.varlen()) {
    a->maybe_cu_seqlens_q = cu_q;
    a->maybe_cu_seqlens_k = cu_k;
    a->max_seqlen_q = p.max_len_q();
    a->max_seqlen_k = p.max_len_k();
  }
  a->softmax_scale = p.scale;
  a->causal = p.causal;
  a->window_left = p.window_left;
  a->window_right = p.window_right;
  a->softcap = p.softcap;
  a->dropout_p = p.dropout_p;
  a->dropout_seed = p.dropout_seed;
  a->dropout_offset = p.dropout_offset;
  a->num_threads = p.num_threads;
}

// What forward_args and backward_args share: the options and the q, k, v, out views.
template <class Args>
Args common_args(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                 const Tensor& out, const Tensor& cu_q, const Tensor& cu_k) {
  Args a;
  fill_common(p, cu_q, cu_k, &a);
  a.q = q;
  a.k = k;
  a.v = v;
  a.out = out;
  return a;
}

}  // namespace

ForwardArgs forward_args(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& out, const Tensor& lse, const Tensor& cu_q,
                         const Tensor& cu_k) {
  ForwardArgs a = common_args<ForwardArgs>(p, q, k, v, out, cu_q, cu_k);
  a.maybe_lse = lse;
  return a;
}

BackwardArgs backward_args(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                           const Tensor& out, const Tensor& dout, const Tensor& lse,
                           const Tensor& dq, const Tensor& dk, const Tensor& dv,
                           const Tensor& cu_q, const Tensor& cu_k) {
  BackwardArgs a = common_args<BackwardArgs>(p, q, k, v, out, cu_q, cu_k);
  a.dout = dout;
  a.lse = lse;
  a.dq = dq;
  a.dk = dk;
  a.dv = dv;
  return a;
}

// ---- the oracle -------------------------------------------------------------------------

Results run_reference_fp64(const Problem& p, const Inputs& in, bool with_backward) {
  Problem p64 = p;
  p64.dtype = DType::kF64;
  p64.pad.clear();
  const HostTensor q = in.q.converted(DType::kF64), k = in.k.converted(DType::kF64),
                   v = in.v.converted(DType::kF64), dout = in.dout.converted(DType::kF64);
  HostTensor out = make_out(p64), lse = make_lse(p64);
  const Tensor cu_q = in.cu_q.view(), cu_k = in.cu_k.view();

  ForwardArgs fa = forward_args(p64, q.view(), k.view(), v.view(), out.view(), lse.view(), cu_q, cu_k);
  fa.kernel = "cpu_reference";
  fa.quadratic_workspace_limit = SIZE_MAX;
  size_t bytes = 0;
  Status s = workspace_size(fa, &bytes);
  EXPECT_TRUE(status_is(s, StatusCode::kOk)) << "oracle forward refused " << p.describe();
  if (!s.ok()) return {};
  std::vector<double> ws(bytes / sizeof(double) + 1);
  fa.workspace = ws.data();
  fa.workspace_bytes = bytes;
  s = forward(fa);
  EXPECT_TRUE(status_is(s, StatusCode::kOk)) << "oracle forward failed " << p.describe();
  if (!s.ok()) return {};

  Results r;
  r.out = out.to_f64();
  r.lse = lse.to_f64();
  if (!with_backward) return r;

  HostTensor dq = make_like_q(p64), dk = make_like_kv(p64, p.head_dim),
             dv = make_like_kv(p64, p.head_dim_v);
  BackwardArgs ba = backward_args(p64, q.view(), k.view(), v.view(), out.view(), dout.view(),
                                  lse.view(), dq.view(), dk.view(), dv.view(), cu_q, cu_k);
  ba.kernel = "cpu_reference";
  ba.quadratic_workspace_limit = SIZE_MAX;
  s = workspace_size(ba, &bytes);
  EXPECT_TRUE(status_is(s, StatusCode::kOk)) << "oracle backward refused " << p.describe();
  if (!s.ok()) return {};
  ws.assign(bytes / sizeof(double) + 1, 0.0);
  ba.workspace = ws.data();
  ba.workspace_bytes = bytes;
  s = backward(ba);
  EXPECT_TRUE(status_is(s, StatusCode::kOk)) << "oracle backward failed " << p.describe();
  if (!s.ok()) return {};
  r.dq = dq.to_f64();
  r.dk = dk.to_f64();
  r.dv = dv.to_f64();
  return r;
}

}  // namespace flashlab::test
