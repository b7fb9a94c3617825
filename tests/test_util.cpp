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

::testing::AssertionResult HostTensor::written_exactly(std::string_view name) const {
  int64_t unwritten = 0, first = -1;
  for (int64_t i = 0; i < numel(); ++i) {
    if (!std::isnan(get(i))) continue;
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

::testing::AssertionResult within_rule(std::string_view name, const MaxError& kernel,
                                       const MaxError& lowp) {
  const double bound = kErrFactor * lowp.value + kErrSlack;
  if (std::isfinite(kernel.value) && kernel.value <= bound)
    return ::testing::AssertionSuccess() << name << " ok";
  return ::testing::AssertionFailure()
         << name << ": max abs error vs the fp64 oracle " << describe(kernel) << " > bound "
         << bound << " = 2 x low-precision path's " << describe(lowp) << " + 1e-5";
}

double yardstick_cap(DType dtype, const std::vector<double>& oracle) {
  double magnitude = 1.0;
  for (double x : oracle)
    if (std::isfinite(x)) magnitude = std::max(magnitude, std::abs(x));
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
  MaskPolicy m;
  const int sk = p.max_len_k();
  m.window_left = p.window_left >= sk ? -1 : p.window_left;
  m.window_right = p.window_right >= sk ? -1 : p.window_right;
  if (p.causal) m.window_right = 0;
  m.softcap = p.softcap;
  return m;
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

}  // namespace

ForwardArgs forward_args(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& out, const Tensor& lse, const Tensor& cu_q,
                         const Tensor& cu_k) {
  ForwardArgs a;
  fill_common(p, cu_q, cu_k, &a);
  a.q = q;
  a.k = k;
  a.v = v;
  a.out = out;
  a.maybe_lse = lse;
  return a;
}

BackwardArgs backward_args(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                           const Tensor& out, const Tensor& dout, const Tensor& lse,
                           const Tensor& dq, const Tensor& dk, const Tensor& dv,
                           const Tensor& cu_q, const Tensor& cu_k) {
  BackwardArgs a;
  fill_common(p, cu_q, cu_k, &a);
  a.q = q;
  a.k = k;
  a.v = v;
  a.out = out;
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

// ---- the low-precision yardstick ----------------------------------------------------------

namespace {

std::vector<float> as_floats(const HostTensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = float(t.get(i));
  return v;
}

// Where sequence b starts in the packed row numbering that padded and varlen inputs
// share, and where LSE row (b, h, i) lives: the bookkeeping of both emulations below.
struct Packing {
  explicit Packing(const Problem& p)
      : varlen(p.varlen()), heads_q(p.heads_q), seqlen_q(p.seqlen_q), total_q(p.total_q()),
        start_q(size_t(p.batch) + 1, 0), start_k(size_t(p.batch) + 1, 0) {
    for (int b = 0; b < p.batch; ++b) {
      start_q[b + 1] = start_q[b] + (varlen ? p.lens_q[b] : p.seqlen_q);
      start_k[b + 1] = start_k[b] + (varlen ? p.lens_k[b] : p.seqlen_k);
    }
  }
  int64_t lse_index(int b, int h, int i) const {
    if (varlen) return int64_t(h) * total_q + start_q[b] + i;
    return (int64_t(b) * heads_q + h) * seqlen_q + i;
  }
  bool varlen;
  int heads_q, seqlen_q;
  int64_t total_q;
  std::vector<int64_t> start_q, start_k;
};

// Outputs of the right sizes, zeroed (rows a sequence leaves unwritten stay 0).
Results zero_results(const Problem& p, bool with_backward) {
  const int64_t Tq = p.total_q(), Tk = p.total_k();
  Results r;
  r.out.assign(size_t(Tq * p.heads_q * p.head_dim_v), 0.0);
  r.lse.assign(size_t(Tq * p.heads_q), 0.0);
  if (with_backward) {
    r.dq.assign(size_t(Tq * p.heads_q * p.head_dim), 0.0);
    r.dk.assign(size_t(Tk * p.heads_kv * p.head_dim), 0.0);
    r.dv.assign(size_t(Tk * p.heads_kv * p.head_dim_v), 0.0);
  }
  return r;
}

}  // namespace

Results run_lowp(const Problem& p, const Inputs& in, bool with_backward) {
  const DType dt = p.dtype;
  auto rnd = [dt](float x) { return round_to(dt, x); };
  const MaskPolicy mask = mask_of(p);
  const float scale = scale_of(p);
  // PyTorch multiplies q by -sqrt(|scale|) for a negative scale.
  const float root = float(std::sqrt(std::abs(double(scale))));
  const float q_mul = scale < 0.f ? -root : root, k_mul = root;
  const float cap = p.softcap;
  const DropoutPolicy drop = dropout_of(p);
  const int B = p.batch, Hq = p.heads_q, Hkv = p.heads_kv, G = Hq / Hkv;
  const int D = p.head_dim, Dv = p.head_dim_v;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();

  std::vector<float> Qs = as_floats(in.q), Ks = as_floats(in.k);
  for (float& x : Qs) x = rnd(x * q_mul);
  for (float& x : Ks) x = rnd(x * k_mul);
  const std::vector<float> V = as_floats(in.v), dO = as_floats(in.dout);
  // Row r of sequence b, in the packed numbering both layouts share.
  const Packing pk(p);
  const std::vector<int64_t>&start_q = pk.start_q, &start_k = pk.start_k;
  auto lse_index = [&](int b, int h, int i) { return pk.lse_index(b, h, i); };
  Results r = zero_results(p, with_backward);

  const int tasks = B * Hkv;
#pragma omp parallel for schedule(dynamic, 1)
  for (int t = 0; t < tasks; ++t) {
    const int b = t / Hkv, hk = t % Hkv;
    const int lq = int(start_q[b + 1] - start_q[b]), lk = int(start_k[b + 1] - start_k[b]);
    auto q_at = [&](int i, int h) { return &Qs[size_t(((start_q[b] + i) * Hq + h) * D)]; };
    auto do_at = [&](int i, int h) { return &dO[size_t(((start_q[b] + i) * Hq + h) * Dv)]; };
    auto k_at = [&](int j) { return &Ks[size_t(((start_k[b] + j) * Hkv + hk) * D)]; };
    auto v_at = [&](int j) { return &V[size_t(((start_k[b] + j) * Hkv + hk) * Dv)]; };
    // Dropout's factor (torch: x · mask · 1/(1 − p)): 0, 1/(1 − p), or 1 when off.
    auto zf = [&](int h, int i, int j) {
      if (!drop.enabled()) return 1.f;
      return drop.keep(uint32_t(b * Hq + h), i, j) ? drop.rescale : 0.f;
    };

    // Per (row, key) of one head: U (the rounded tanh, softcap only), P, then dS.
    std::vector<float> U(size_t(lq) * lk), P(size_t(lq) * lk), dS(size_t(lq) * lk);
    std::vector<float> dk_sum(size_t(lk) * D, 0.f), dv_sum(size_t(lk) * Dv, 0.f);
    std::vector<float> dk_h(size_t(lk) * D), dv_h(size_t(lk) * Dv), S(lk), acc(std::max(D, Dv));

    for (int h = hk * G; h < (hk + 1) * G; ++h) {
      for (int i = 0; i < lq; ++i) {
        const int jb = mask.key_begin(i, lq, lk), je = mask.key_end(i, lq, lk);
        float* urow = &U[size_t(i) * lk];
        float* prow = &P[size_t(i) * lk];
        std::fill(prow, prow + lk, 0.f);
        const int64_t orow = ((start_q[b] + i) * Hq + h) * Dv;
        if (jb >= je) {  // sees no key
          r.lse[size_t(lse_index(b, h, i))] = -std::numeric_limits<double>::infinity();
          continue;
        }
        float m = kNegInf;
        for (int j = jb; j < je; ++j) {
          const float* qi = q_at(i, h);
          const float* kj = k_at(j);
          float dot = 0.f;
          for (int d = 0; d < D; ++d) dot += qi[d] * kj[d];
          float s = rnd(dot);
          if (cap > 0.f) {
            urow[j] = rnd(std::tanh(rnd(s / cap)));
            s = rnd(urow[j] * cap);
          }
          S[j] = s;
          m = std::max(m, s);
        }
        float l = 0.f;
        for (int j = jb; j < je; ++j) l += std::exp(S[j] - m);
        r.lse[size_t(lse_index(b, h, i))] = m + std::log(l);
        for (int j = jb; j < je; ++j) prow[j] = rnd(std::exp(S[j] - m) / l);
        std::fill(acc.begin(), acc.begin() + Dv, 0.f);
        for (int j = jb; j < je; ++j) {
          const float* vj = v_at(j);
          const float z = rnd(prow[j] * zf(h, i, j));
          for (int d = 0; d < Dv; ++d) acc[d] += z * vj[d];
        }
        for (int d = 0; d < Dv; ++d) r.out[size_t(orow + d)] = rnd(acc[d]);
      }
      if (!with_backward) continue;

      std::fill(dv_h.begin(), dv_h.end(), 0.f);
      std::fill(dk_h.begin(), dk_h.end(), 0.f);
      for (int i = 0; i < lq; ++i) {
        const int jb = mask.key_begin(i, lq, lk), je = mask.key_end(i, lq, lk);
        const float* prow = &P[size_t(i) * lk];
        const float* urow = &U[size_t(i) * lk];
        const float* doi = do_at(i, h);
        float* dsrow = &dS[size_t(i) * lk];
        float rowsum = 0.f;
        for (int j = jb; j < je; ++j) {
          const float* vj = v_at(j);
          float dp = 0.f;
          for (int d = 0; d < Dv; ++d) dp += doi[d] * vj[d];
          const float f = zf(h, i, j);
          dsrow[j] = f == 1.f ? rnd(dp) : rnd(rnd(dp) * f);  // dP
          rowsum += dsrow[j] * prow[j];
          const float z = f == 1.f ? prow[j] : rnd(prow[j] * f);
          for (int d = 0; d < Dv; ++d) dv_h[size_t(j) * Dv + d] += z * doi[d];
        }
        for (int j = jb; j < je; ++j) {
          float ds = rnd(prow[j] * (dsrow[j] - rowsum));
          if (cap > 0.f) ds = rnd(rnd(rnd(ds * cap) * (1.f - urow[j] * urow[j])) / cap);
          dsrow[j] = ds;
        }
        std::fill(acc.begin(), acc.begin() + D, 0.f);
        const float* qi = q_at(i, h);
        for (int j = jb; j < je; ++j) {
          const float* kj = k_at(j);
          for (int d = 0; d < D; ++d) {
            acc[d] += dsrow[j] * kj[d];
            dk_h[size_t(j) * D + d] += dsrow[j] * qi[d];
          }
        }
        const int64_t qrow = ((start_q[b] + i) * Hq + h) * D;
        for (int d = 0; d < D; ++d) r.dq[size_t(qrow + d)] = rnd(rnd(acc[d]) * q_mul);
      }
      for (size_t e = 0; e < dk_h.size(); ++e) dk_sum[e] += rnd(rnd(dk_h[e]) * k_mul);
      for (size_t e = 0; e < dv_h.size(); ++e) dv_sum[e] += rnd(dv_h[e]);
    }
    if (!with_backward) continue;
    for (int j = 0; j < lk; ++j) {
      const int64_t krow = (start_k[b] + j) * Hkv + hk;
      for (int d = 0; d < D; ++d) r.dk[size_t(krow * D + d)] = rnd(dk_sum[size_t(j) * D + d]);
      for (int d = 0; d < Dv; ++d) r.dv[size_t(krow * Dv + d)] = rnd(dv_sum[size_t(j) * Dv + d]);
    }
  }
  return r;
}

Results run_fa2_emulation(const Problem& p, const Inputs& in, bool with_backward) {
  const DType dt = p.dtype;
  auto rnd = [dt](float x) { return round_to(dt, x); };
  const MaskPolicy mask = mask_of(p);
  const float scale = scale_of(p);
  const DropoutPolicy drop = dropout_of(p);
  const int B = p.batch, Hq = p.heads_q, Hkv = p.heads_kv, G = Hq / Hkv;
  const int D = p.head_dim, Dv = p.head_dim_v;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();

  const std::vector<float> Q = as_floats(in.q), K = as_floats(in.k), V = as_floats(in.v),
                           dO = as_floats(in.dout);
  const Packing pk(p);
  const std::vector<int64_t>&start_q = pk.start_q, &start_k = pk.start_k;
  auto lse_index = [&](int b, int h, int i) { return pk.lse_index(b, h, i); };
  Results r = zero_results(p, with_backward);

  const int tasks = B * Hkv;
#pragma omp parallel for schedule(dynamic, 1)
  for (int t = 0; t < tasks; ++t) {
    const int b = t / Hkv, hk = t % Hkv;
    const int lq = int(start_q[b + 1] - start_q[b]), lk = int(start_k[b + 1] - start_k[b]);
    auto q_at = [&](int i, int h) { return &Q[size_t(((start_q[b] + i) * Hq + h) * D)]; };
    auto do_at = [&](int i, int h) { return &dO[size_t(((start_q[b] + i) * Hq + h) * Dv)]; };
    auto k_at = [&](int j) { return &K[size_t(((start_k[b] + j) * Hkv + hk) * D)]; };
    auto v_at = [&](int j) { return &V[size_t(((start_k[b] + j) * Hkv + hk) * Dv)]; };
    // Dropout's mask (0 or 1; FA2 applies 1/(1 − p) with the final normalization).
    auto kept = [&](int h, int i, int j) {
      return !drop.enabled() || drop.keep(uint32_t(b * Hq + h), i, j) ? 1.f : 0.f;
    };
    std::vector<float> S(size_t(lq) * lk), lse(lq), O(size_t(lq) * Dv);
    std::vector<float> dk_acc(size_t(lk) * D, 0.f), dv_acc(size_t(lk) * Dv, 0.f);
    std::vector<float> acc(std::max(D, Dv));

    for (int h = hk * G; h < (hk + 1) * G; ++h) {
      for (int i = 0; i < lq; ++i) {
        const int jb = mask.key_begin(i, lq, lk), je = mask.key_end(i, lq, lk);
        float* srow = &S[size_t(i) * lk];
        float* o = &O[size_t(i) * Dv];
        std::fill(o, o + Dv, 0.f);
        if (jb >= je) {
          lse[i] = kNegInf;
          r.lse[size_t(lse_index(b, h, i))] = kNegInf;
          continue;
        }
        float m = kNegInf;
        for (int j = jb; j < je; ++j) {
          float dot = 0.f;
          for (int d = 0; d < D; ++d) dot += q_at(i, h)[d] * k_at(j)[d];
          srow[j] = mask.logit(dot * scale);
          m = std::max(m, srow[j]);
        }
        float l = 0.f;
        std::fill(acc.begin(), acc.begin() + Dv, 0.f);
        for (int j = jb; j < je; ++j) {
          const float e = std::exp(srow[j] - m);
          l += e;
          const float pe = rnd(e) * kept(h, i, j);
          for (int d = 0; d < Dv; ++d) acc[d] += pe * v_at(j)[d];
        }
        lse[i] = m + std::log(l);
        r.lse[size_t(lse_index(b, h, i))] = lse[i];
        const int64_t orow = ((start_q[b] + i) * Hq + h) * Dv;
        for (int d = 0; d < Dv; ++d) {
          o[d] = rnd(acc[d] / l * drop.rescale);
          r.out[size_t(orow + d)] = o[d];
        }
      }
      if (!with_backward) continue;
      for (int i = 0; i < lq; ++i) {
        const int jb = mask.key_begin(i, lq, lk), je = mask.key_end(i, lq, lk);
        const float* doi = do_at(i, h);
        float Di = 0.f;
        for (int d = 0; d < Dv; ++d) Di += doi[d] * O[size_t(i) * Dv + d];
        std::fill(acc.begin(), acc.begin() + D, 0.f);
        for (int j = jb; j < je; ++j) {
          const float t_ij = S[size_t(i) * lk + j];
          const float pij = std::exp(t_ij - lse[i]);
          const float f = kept(h, i, j) * drop.rescale;
          float dp = 0.f;
          for (int d = 0; d < Dv; ++d) {
            dp += doi[d] * v_at(j)[d];
            dv_acc[size_t(j) * Dv + d] += rnd(pij) * f * doi[d];
          }
          dp *= f;
          const float ds = rnd(pij * (dp - Di) * mask.dlogit(t_ij));
          for (int d = 0; d < D; ++d) {
            acc[d] += ds * k_at(j)[d];
            dk_acc[size_t(j) * D + d] += ds * q_at(i, h)[d];
          }
        }
        const int64_t qrow = ((start_q[b] + i) * Hq + h) * D;
        for (int d = 0; d < D; ++d) r.dq[size_t(qrow + d)] = rnd(acc[d] * scale);
      }
    }
    if (!with_backward) continue;
    for (int j = 0; j < lk; ++j) {
      const int64_t krow = (start_k[b] + j) * Hkv + hk;
      for (int d = 0; d < D; ++d) r.dk[size_t(krow * D + d)] = rnd(dk_acc[size_t(j) * D + d] * scale);
      for (int d = 0; d < Dv; ++d) r.dv[size_t(krow * Dv + d)] = rnd(dv_acc[size_t(j) * Dv + d]);
    }
  }
  return r;
}

}  // namespace flashlab::test
