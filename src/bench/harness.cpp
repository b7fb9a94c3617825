// flashlab::bench::Bench (bench.h): one problem's input sets on its device, the fp64
// reference, and the entries checked and timed on them.
#include <algorithm>
#include <cstdio>
#include <thread>

#include "bench/check.h"
#include "bench/memory.h"
#include "bench/timer.h"
#include "common/dtype.h"
#include "flashlab/bench.h"

namespace flashlab::bench {
namespace {

constexpr int kMaxInputSets = 32;  // input sets the CUDA timing rotates among
constexpr size_t kMaxRotationBytes = size_t(4) << 30;
constexpr int kFreeMemoryShare = 4;  // rotation uses at most 1/4 of free GPU memory

#define BENCH_TRY(expr)             \
  do {                              \
    ::flashlab::Status s_ = (expr); \
    if (!s_.ok()) return s_;        \
  } while (0)

using TensorSet = std::array<Buffer, kSlots>;

// "kernel 'x' does not support this call: why" reads "does not support ..." in x's row.
std::string without_kernel_prefix(const std::string& msg, std::string_view name) {
  const std::string prefix = "kernel '" + std::string(name) + "' ";
  return msg.rfind(prefix, 0) == 0 ? msg.substr(prefix.size()) : msg;
}

Status check_problem(const Problem& p) {
  const bool positive = p.batch > 0 && p.heads_q > 0 && p.heads_kv > 0 && p.seqlen_q > 0 &&
                        p.seqlen_k > 0 && p.head_dim > 0 && p.head_dim_v > 0;
  if (!positive) return {StatusCode::kInvalidArgument, "every size of the problem must be >= 1"};
  if (p.heads_q % p.heads_kv)
    return {StatusCode::kInvalidArgument, "heads_q (" + std::to_string(p.heads_q) +
                                              ") must be a multiple of heads_kv (" +
                                              std::to_string(p.heads_kv) + ")"};
  if (!p.lengths.empty()) {
    const int longest = *std::max_element(p.lengths.begin(), p.lengths.end());
    const bool shaped = *std::min_element(p.lengths.begin(), p.lengths.end()) >= 1 &&
                        p.batch == int(p.lengths.size()) && p.seqlen_q == longest && p.seqlen_k == longest;
    if (!shaped)
      return {StatusCode::kInvalidArgument, "varlen: every length must be >= 1, with batch their count and "
                                            "seqlen_q = seqlen_k the longest (set_lengths)"};
    if (p.decode) return {StatusCode::kInvalidArgument, "a decode problem is not varlen"};
  }
  if (p.rotary && (!p.decode || p.seqlen_new == 0))
    return {StatusCode::kInvalidArgument, "rotary turns the appended keys: it needs decode with seqlen_new >= 1"};
  if (!p.decode) return {};
  if (computes_gradients(p)) return {StatusCode::kInvalidArgument, "a decode problem has no backward"};
  if (p.page_size < 0 || p.seqlen_new < 0 || p.seqlen_new > p.seqlen_k)
    return {StatusCode::kInvalidArgument, "decode: page_size must be >= 0 and seqlen_new in [0, seqlen_k (" +
                                              std::to_string(p.seqlen_k) + ")]"};
  return {};
}

}  // namespace

struct Bench::State {
  State(const Problem& problem, const Options& options)
      : p(problem), o(options), progress(options.progress) {
    step[0] = step[1] = p;
    step[0].train = step[1].train = false;
    step[0].backward = false;
    step[1].backward = true;
  }
  ~State() {
    if (own_stream) destroy_stream(stream);
  }

  Problem p;
  std::array<Problem, 2> step;  // train: the forward and the backward of every call
  Options o;
  Progress progress;
  int threads = 1;
  void* stream = nullptr;  // cudaStream_t of every copy, fill and call (CUDA)
  bool own_stream = false;
  int set_count = 1;
  size_t set_bytes = 0, l2_bytes = 0;
  std::vector<TensorSet> sets;
  std::string fwd_kernel;   // backward alone: the kernel that wrote out and LSE
  std::string fwd_refusal;  // backward alone: why no forward kernel could
  Slice slice;
  Oracle oracle;
  bool reference_from_row = false;  // cpu_reference's checked call was the reference
  std::unique_ptr<Timer> timer;

  std::array<Tensor, kSlots> views(int set) const {
    std::array<Tensor, kSlots> v;
    for (int s = 0; s < kSlots; ++s)
      if (slot_used(p, Slot(s))) v[s] = slot_view(p, Slot(s), sets[size_t(set)][s].data());
    return v;
  }

  // The arguments of `kernel` on input set `set`, passed to f.
  template <class F>
  Status with_args(const Problem& q, std::string_view kernel, int set, const Buffer* ws, F&& f) const {
    const std::array<Tensor, kSlots> v = [&] {
      std::array<Tensor, kSlots> t;
      for (int s = 0; s < kSlots; ++s) t[s] = slot_view(q, Slot(s), sets[size_t(set)][s].data());
      return t;
    }();
    auto finish = [&](auto& a) {
      a.causal = q.causal;
      a.window_left = q.window_left;
      a.window_right = q.window_right;
      a.softcap = q.softcap;
      a.num_threads = o.threads;
      a.stream = stream;
      a.quadratic_workspace_limit = q.quadratic_workspace_limit;
      a.kernel = kernel;
      if (v[kCu].present()) {
        a.maybe_cu_seqlens_q = a.maybe_cu_seqlens_k = v[kCu];
        a.max_seqlen_q = q.seqlen_q;
        a.max_seqlen_k = q.seqlen_k;
      }
      if (ws) {
        a.workspace = ws->data();
        a.workspace_bytes = ws->bytes();
      }
      return f(a);
    };
    if (q.decode) {
      KvCacheArgs a;
      a.q = v[kQ], a.k_cache = v[kK], a.v_cache = v[kV], a.out = v[kOut], a.maybe_lse = v[kLse];
      a.maybe_k_new = v[kKNew], a.maybe_v_new = v[kVNew];
      a.maybe_cache_seqlens = v[kSeqlens], a.maybe_block_table = v[kTable];
      a.maybe_rotary_cos = v[kCos], a.maybe_rotary_sin = v[kSin];
      a.num_splits = q.num_splits;
      return finish(a);
    }
    if (q.backward) {
      BackwardArgs a;
      a.q = v[kQ], a.k = v[kK], a.v = v[kV], a.out = v[kOut], a.lse = v[kLse], a.dout = v[kDout];
      a.dq = v[kDq], a.dk = v[kDk], a.dv = v[kDv];
      return finish(a);
    }
    ForwardArgs a;
    a.q = v[kQ], a.k = v[kK], a.v = v[kV], a.out = v[kOut], a.maybe_lse = v[kLse];
    return finish(a);
  }

  // f(q) for each pass a call of `p` runs: p itself, or a train problem's forward then its
  // backward (their views are of the same buffers).
  template <class F>
  Status each_pass(F&& f) const {
    if (!p.train) return f(p);
    BENCH_TRY(f(step[0]));
    return f(step[1]);
  }
  // A registry kernel through every pass of a call: selected, its workspace sized (the
  // larger pass's: one buffer serves both), or run on input set `set`.
  Status select(std::string_view kernel) const {
    std::string chosen;
    return each_pass([&](const Problem& q) {
      return with_args(q, kernel, 0, nullptr, [&](auto& a) { return select_pass(a, &chosen); });
    });
  }
  Status workspace(std::string_view kernel, size_t* bytes) const {
    *bytes = 0;
    return each_pass([&](const Problem& q) {
      size_t b = 0;
      BENCH_TRY(with_args(q, kernel, 0, nullptr, [&](auto& a) { return workspace_size(a, &b); }));
      *bytes = std::max(*bytes, b);
      return Status{};
    });
  }
  Status call(std::string_view kernel, int set, const Buffer* ws) const {
    return each_pass([&](const Problem& q) {
      return with_args(q, kernel, set, ws, [](auto& a) { return run_pass(a); });
    });
  }

  Status plan_sets();
  Status fill_inputs();
  Status make_forward_outputs();
  Status ensure_oracle();
  // Whether `kernel`'s checked call gives the reference (Oracle::adopt): cpu_reference on
  // an fp32 CPU problem before the reference exists.
  bool gives_reference(std::string_view kernel) const {
    return o.check && !oracle.ready() && kernel == "cpu_reference" && p.device == Device::kCPU &&
           p.dtype == DType::kF32;
  }
  // The reference from that call's outputs when it wrote every element, else computed.
  Status reference_from(const std::array<Tensor, kSlots>& got, const std::string& kernel);
  Row new_row(std::string name) const;
  // The checked call's end: compare, then set the launch and what a call costs.
  Status finish_entry(const std::array<Tensor, kSlots>& got, double first_ms, Launch launch, Entry* e);
};

// CUDA: enough input sets that one rotation exceeds 2x the L2 cache, within a memory cap.
Status Bench::State::plan_sets() {
  set_bytes = 0;
  for (int s = 0; s < kSlots; ++s)
    if (slot_used(p, Slot(s))) set_bytes += slot_bytes(p, Slot(s));
  set_count = 1;
  if (p.device == Device::kCPU) return {};
  size_t free_bytes = 0;
  BENCH_TRY(l2_cache_bytes(&l2_bytes));
  BENCH_TRY(free_device_bytes(&free_bytes));
  const size_t cap = std::min(kMaxRotationBytes, free_bytes / kFreeMemoryShare);
  const size_t per_set = std::max<size_t>(set_bytes, 1);
  int n = int(std::min<size_t>(2 * l2_bytes / per_set + 1, kMaxInputSets));
  while (n > 1 && size_t(n) * per_set > cap) --n;
  set_count = std::max(n, 1);
  return {};
}

// Every set gets its own values; on CUDA they are made on the host and uploaded. Decode
// tables are values, not noise: cache_seqlens, and each set's own shuffle of the pages;
// so is a varlen problem's cu_seqlens.
Status Bench::State::fill_inputs() {
  sets.resize(size_t(set_count));
  Buffer host;
  for (int set = 0; set < set_count; ++set) {
    for (int s = 0; s < kSlots; ++s)
      if (slot_used(p, Slot(s))) BENCH_TRY(sets[size_t(set)][s].allocate(p.device, slot_bytes(p, Slot(s))));
    for (Slot s : {kSeqlens, kTable, kCu}) {
      if (!slot_used(p, s)) continue;
      const std::vector<int32_t> values = table_values(p, s, mix_seed(o.seed, uint64_t(set), uint64_t(s) + 1));
      BENCH_TRY(host.allocate(Device::kCPU, values.size() * sizeof(int32_t)));
      std::copy(values.begin(), values.end(), static_cast<int32_t*>(host.data()));
      BENCH_TRY(upload(sets[size_t(set)][s], host.data(), stream));
    }
    for (Slot s : {kCos, kSin}) {  // rotary's identity tables: cos 1, sin 0
      if (!slot_used(p, s)) continue;
      const int64_t n = slot_view(p, s, nullptr).numel();
      BENCH_TRY(host.allocate(Device::kCPU, slot_bytes(p, s)));
      for (int64_t i = 0; i < n; ++i) store_from_double(host.data(), p.dtype, i, s == kCos ? 1.0 : 0.0);
      BENCH_TRY(upload(sets[size_t(set)][s], host.data(), stream));
    }
    for (Slot s : random_inputs_of(p)) {
      const Buffer& dst = sets[size_t(set)][s];
      const int64_t n = slot_view(p, s, nullptr).numel();
      const uint64_t seed = mix_seed(o.seed, uint64_t(set), uint64_t(s) + 1);
      if (p.device == Device::kCPU) {
        fill_normalish(dst.data(), p.dtype, n, seed);
        continue;
      }
      if (host.bytes() < dst.bytes()) BENCH_TRY(host.allocate(Device::kCPU, dst.bytes()));
      fill_normalish(host.data(), p.dtype, n, seed);
      BENCH_TRY(upload(dst, host.data(), stream));
    }
  }
  return {};
}

// The backward needs the forward's out and LSE: the best forward kernel of the device
// ("auto"), else the highest rung of the registry that runs the problem.
Status Bench::State::make_forward_outputs() {
  std::vector<std::string> candidates = {std::string(kAutoKernel)};
  const auto infos = kernels();
  for (auto it = infos.rbegin(); it != infos.rend(); ++it)
    if (it->has_forward) candidates.emplace_back(it->name);
  Problem fwd = p;
  fwd.backward = false;
  std::string first_refusal;
  for (const std::string& name : candidates) {
    std::string chosen;
    const Status s = with_args(fwd, name, 0, nullptr, [&](auto& a) { return select_pass(a, &chosen); });
    if (s.ok()) {
      fwd_kernel = chosen;
      break;
    }
    if (first_refusal.empty()) first_refusal = s.message();
  }
  if (fwd_kernel.empty()) {
    fwd_refusal = "no forward kernel to make out and LSE: " + first_refusal;
    return {};
  }
  for (int set = 0; set < set_count; ++set) {
    size_t bytes = 0;
    BENCH_TRY(with_args(fwd, fwd_kernel, set, nullptr, [&](auto& a) { return workspace_size(a, &bytes); }));
    Buffer ws;
    BENCH_TRY(ws.allocate(p.device, bytes));
    BENCH_TRY(with_args(fwd, fwd_kernel, set, &ws, [](auto& a) { return run_pass(a); }));
    BENCH_TRY(synchronize(p.device, stream));
  }
  return {};
}

Status Bench::State::ensure_oracle() {
  if (!o.check || oracle.ready()) return {};
  return oracle.compute(p, slice, views(0), o.threads, stream, &progress);
}

Status Bench::State::reference_from(const std::array<Tensor, kSlots>& got, const std::string& kernel) {
  Row written = new_row(kernel);  // the writes alone: no reference yet
  BENCH_TRY(oracle.compare(p, slice, got, stream, &written));
  if (written.status != RowStatus::kOk) return ensure_oracle();
  reference_from_row = true;
  return oracle.adopt(p, slice, got, stream);
}

Row Bench::State::new_row(std::string name) const {
  Row row;
  row.kernel = std::move(name);
  row.problem = p;
  row.flops = pass_flops(p);
  row.kv_bytes = kv_bytes(p);
  return row;
}

Status Bench::State::finish_entry(const std::array<Tensor, kSlots>& got, double first_ms,
                                  Launch launch, Entry* e) {
  BENCH_TRY(oracle.compare(p, slice, got, stream, &e->row));
  if (e->row.status == RowStatus::kOk && !o.check) e->row.status = RowStatus::kUnchecked;
  if (!e->row.timed()) return {};
  e->first_ms = first_ms;
  const Status s = timer->call_cost(launch, first_ms, o.timing, e->row.kernel, &e->call_ms);
  if (!s.ok()) {
    e->row.status = RowStatus::kError;
    e->row.reason = s.message();
    return {};
  }
  e->launch = std::move(launch);
  return {};
}

// ---- Bench ------------------------------------------------------------------------------

Bench::Bench() = default;
Bench::~Bench() = default;

Status Bench::create(const Problem& p, const Options& o, std::unique_ptr<Bench>* out) {
  BENCH_TRY(check_problem(p));
  std::unique_ptr<Bench> b(new Bench());
  b->s_ = std::make_unique<State>(p, o);
  State& s = *b->s_;
  s.threads = o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  if (p.device == Device::kCUDA) {
    s.stream = o.stream;
    if (!s.stream) {
      BENCH_TRY(create_stream(&s.stream));
      s.own_stream = true;
    }
  }
  BENCH_TRY(s.plan_sets());
  BENCH_TRY(s.fill_inputs());
  if (backward_alone(p)) BENCH_TRY(s.make_forward_outputs());
  s.slice = choose_slice(p, o.check_flops, s.threads);
  s.timer = std::make_unique<Timer>(p.device, s.stream, s.set_count, &s.progress);
  *out = std::move(b);
  return {};
}

const Problem& Bench::problem() const { return s_->p; }
const Options& Bench::options() const { return s_->o; }
int Bench::set_count() const { return s_->set_count; }
void* Bench::stream() const { return s_->stream; }

Tensor Bench::input(int set, Operand which) const {
  const Slot slot = Slot(int(which));
  if (set < 0 || set >= s_->set_count || !slot_used(s_->p, slot)) return {};
  return s_->views(set)[slot];
}

Entry Bench::refused(std::string name, std::string reason, RowStatus status) const {
  Entry e;
  e.row = s_->new_row(std::move(name));
  e.row.status = status;
  e.row.reason = std::move(reason);
  return e;
}

Status Bench::add_kernel(std::string_view name, Entry* e) {
  State& s = *s_;
  *e = refused(std::string(name), s.fwd_refusal);
  if (!s.fwd_refusal.empty()) return {};
  e->row.status = RowStatus::kOk;
  size_t bytes = 0;
  Status st = s.select(name);
  if (st.ok()) st = s.workspace(name, &bytes);
  auto give_row = [&](RowStatus status, const std::string& why) {
    e->row.status = status;
    e->row.reason = without_kernel_prefix(why, name);
    return Status{};
  };
  if (!st.ok())
    return give_row(st.code() == StatusCode::kUnsupported || st.code() == StatusCode::kNotFound
                        ? RowStatus::kUnsupported : RowStatus::kError,
                    st.message());
  e->row.workspace_bytes = bytes;
  // The reference is computed once, for the first entry; if it cannot be, no entry can be
  // judged and the benchmark stops. cpu_reference on fp32 gives it with its checked call.
  const bool gives_reference = s.gives_reference(name);
  if (!gives_reference) BENCH_TRY(s.ensure_oracle());
  auto ws = std::make_shared<Buffer>();
  if (Status a = ws->allocate(s.p.device, bytes); !a.ok()) return give_row(RowStatus::kError, a.message());
  Launch launch = [&s, kernel = std::string(name), ws](int set) { return s.call(kernel, set, ws.get()); };
  for (Slot slot : outputs_of(s.p)) BENCH_TRY(poison(s.sets[0][slot], s.stream));
  double first_ms = 0;
  const std::string label = std::string(name) + (s.o.check ? ": checked run" : ": first run");
  if (Status c = s.timer->once(launch, 0, label, &first_ms); !c.ok())
    return give_row(RowStatus::kError, c.message());
  BENCH_TRY(synchronize(s.p.device, s.stream));
  std::array<Tensor, kSlots> got = s.views(0);
  for (Slot slot : random_inputs_of(s.p)) got[slot] = {};
  if (backward_alone(s.p)) got[kOut] = got[kLse] = {};  // the backward's inputs
  if (gives_reference) BENCH_TRY(s.reference_from(got, e->row.kernel));
  return s.finish_entry(got, first_ms, std::move(launch), e);
}

Status Bench::add(std::string name, Launch launch, const std::function<Status(Outputs*)>& written,
                  Entry* e) {
  State& s = *s_;
  *e = refused(std::move(name), s.fwd_refusal);
  if (!s.fwd_refusal.empty()) return {};
  e->row.status = RowStatus::kOk;
  BENCH_TRY(s.ensure_oracle());
  double first_ms = 0;
  Outputs out;
  Status st = s.timer->once(launch, 0, e->row.kernel, &first_ms);
  if (st.ok()) st = synchronize(s.p.device, s.stream);
  if (st.ok()) st = written(&out);
  if (!st.ok()) {
    e->row.status = RowStatus::kError;
    e->row.reason = st.message();
    return {};
  }
  std::array<Tensor, kSlots> got;
  got[kOut] = out.out, got[kLse] = out.lse, got[kDq] = out.dq, got[kDk] = out.dk, got[kDv] = out.dv;
  return s.finish_entry(got, first_ms, std::move(launch), e);
}

Status Bench::time(std::span<Entry* const> entries) {
  s_->timer->time_entries(entries, s_->o.timing);
  return {};
}

void Bench::describe(Report* r) const {
  const State& s = *s_;
  const Options& o = s.o;
  r->device = device_description(s.p.device, s.threads);
  const Tolerance tol = tolerance_for(s.p.dtype);
  if (o.check) {
    r->checked = std::string("max abs error vs cpu_reference in fp64 on the same inputs") +
                 (s.reference_from_row ? " (its checked call, outputs rounded once to fp32)" : "") + ", on " +
                 slice_string(s.p, s.slice) + "; every output element checked written; tolerance (" +
                 to_string(s.p.dtype) + ") " +
                 (s.p.train ? "out/lse " + format_err(tol.out) + ", " : "") +
                 (computes_gradients(s.p) ? "dq/dk/dv " + format_err(tol.grad) + " x max(1, max |reference|)"
                                          : "out/lse " + format_err(tol.out));
  } else {
    r->checked = "not compared (--no-check); every output element checked written";
  }
  const TimingOptions& t = o.timing;
  char plan[400];
  std::snprintf(plan, sizeof plan,
                "after the checked call, %d warm-up calls%s, then the median of <= %d timed "
                "calls, as many as fit %.3g s per entry (at least %d, warm-up at most a quarter "
                "of them; a call over %.3g s is its own sample)%s",
                t.warmup, t.warmup_ms > 0 ? (" lasting >= " + std::to_string(int(t.warmup_ms)) + " ms").c_str() : "",
                t.iters, t.budget_ms / 1e3, kMinTimedRuns, kSelfTimedMs / 1e3,
                t.rounds > 1 ? (", in " + std::to_string(t.rounds) +
                                " alternating rounds (median of the rounds' medians)").c_str()
                             : "");
  if (s.p.device == Device::kCPU) {
    r->timing = std::string("std::chrono::steady_clock; ") + plan;
  } else {
    r->timing = std::string("a cudaEvent pair per call on one stream; ") + plan + "; rotating " +
                std::to_string(s.set_count) + " input set" + (s.set_count > 1 ? "s" : "") + " of " +
                format_bytes(s.set_bytes) + " (" +
                (size_t(s.set_count) * s.set_bytes > 2 * s.l2_bytes ? "> 2x" : "capped; ") + " the " +
                format_bytes(s.l2_bytes) + " L2)";
  }
  r->inputs = "unit-normal-ish random values, seed " + std::to_string(o.seed) + " (--seed to repeat)";
  if (!s.fwd_kernel.empty()) r->inputs += "; out and LSE for the backward from " + s.fwd_kernel;
  if (!s.p.lengths.empty()) {
    r->inputs += "; documents (tokens):";
    for (size_t b = 0; b < s.p.lengths.size(); ++b) r->inputs += (b ? ", " : " ") + std::to_string(s.p.lengths[b]);
  }
}

}  // namespace flashlab::bench
