// The benchmark harness (include/flashlab/bench.h) for python/flashlab/bench.py, as the
// submodule _flashlab.bench. Python adds only the peers and the tables: the problems, the
// input sets, the fp64 check, the timing and the FLOPs are the native harness's.
//
// A peer is a callable run(set) that launches one call of its implementation on input set
// `set` (views of the harness's own buffers, handed out as DLPack arrays) on the current
// stream, and returns its outputs as a dict of DLPack arrays: {"out"} for a forward,
// {"dq", "dk", "dv"} for a backward, {"out", "dq", "dk", "dv"} for a training step ("lse"
// may join any of them); the harness checks what the first call returned, then times run() with the same
// events, warm-up and rounds as a registry kernel.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "flashlab/bench.h"

namespace nb = nanobind;
using namespace flashlab;
using namespace flashlab::bench;

std::string dlpack_dtype_name(const nb::dlpack::dtype& t);  // src/python/bindings.cpp

namespace {

using Array = nb::ndarray<nb::ro>;
using C = nb::dlpack::dtype_code;

// The dtypes that cross, both ways.
constexpr std::pair<DType, nb::dlpack::dtype> kDtypes[] = {
    {DType::kF32, {uint8_t(C::Float), 32, 1}},  {DType::kF16, {uint8_t(C::Float), 16, 1}},
    {DType::kBF16, {uint8_t(C::Bfloat), 16, 1}}, {DType::kF64, {uint8_t(C::Float), 64, 1}},
    {DType::kI32, {uint8_t(C::Int), 32, 1}}};

DType parse_dtype(const std::string& s) {
  for (const auto& [d, dl] : kDtypes)
    if (s == to_string(d)) return d;
  throw nb::value_error(("dtype must be fp32, fp16, bf16 or fp64, got '" + s + "'").c_str());
}

Device parse_device(const std::string& s) {
  if (s == "cpu") return Device::kCPU;
  if (s == "cuda") return Device::kCUDA;
  throw nb::value_error(("device must be cpu or cuda, got '" + s + "'").c_str());
}

// A harness tensor as a torch tensor or NumPy array (zero copy) that keeps `owner` (the
// Python Bench) alive.
template <class Framework>
nb::object export_tensor(const Tensor& t, nb::handle owner) {
  size_t shape[kMaxRank];
  for (int d = 0; d < t.rank; ++d) shape[d] = size_t(t.shape[d]);
  nb::dlpack::dtype dt{};
  for (const auto& [d, dl] : kDtypes)
    if (d == t.dtype) dt = dl;
  const int device = t.device == Device::kCUDA ? nb::device::cuda::value : nb::device::cpu::value;
  return nb::cast(nb::ndarray<Framework>(t.data, size_t(t.rank), shape, owner, t.stride.data(), dt,
                                         device, t.device_index));
}

// An output a peer returned, as a view for the check; `keep` holds the import until then.
Tensor import_tensor(nb::handle obj, const std::string& name, std::vector<Array>* keep) {
  Array a;
  if (!nb::try_cast(obj, a))
    throw nb::type_error((name + ": a peer's outputs must support DLPack").c_str());
  keep->push_back(a);
  Tensor t;
  t.data = const_cast<void*>(a.data());
  t.rank = int(a.ndim());
  if (t.rank < 1 || t.rank > kMaxRank) throw nb::value_error((name + ": rank 1 to 4").c_str());
  bool known = false;
  for (const auto& [d, dl] : kDtypes)
    if (dl == a.dtype()) t.dtype = d, known = true;
  if (!known)
    throw nb::type_error(
        (name + ".dtype must be fp16, bf16, fp32 or fp64, got " + dlpack_dtype_name(a.dtype())).c_str());
  if (a.device_type() != nb::device::cpu::value && a.device_type() != nb::device::cuda::value)
    throw nb::value_error((name + ": on the CPU or a CUDA device").c_str());
  t.device = a.device_type() == nb::device::cuda::value ? Device::kCUDA : Device::kCPU;
  t.device_index = int(a.device_id());
  for (int d = 0; d < t.rank; ++d) t.shape[d] = int64_t(a.shape(size_t(d))), t.stride[d] = a.stride(size_t(d));
  return t;
}

// "TypeError: message" (first line), for a row's reason.
std::string describe_error(nb::python_error& e) {
  std::string what = nb::str(e.value()).c_str();
  what = what.substr(0, what.find('\n'));
  return std::string(nb::str(e.type().attr("__name__")).c_str()) + ": " + what;
}

// What a peer's calls share: the callable, and the outputs of the call being checked.
struct PeerCalls {
  nb::object run;
  nb::object returned;
  bool keep = true;  // until the check has read the first call's outputs
};

Launch peer_launch(std::shared_ptr<PeerCalls> calls) {
  return [calls](int set) -> Status {
    try {
      nb::object r = calls->run(set);
      if (calls->keep) calls->returned = std::move(r);
      return {};
    } catch (nb::python_error& e) {
      if (e.matches(PyExc_KeyboardInterrupt)) throw;  // the user stops the sweep, not one row
      return {StatusCode::kInvalidArgument, describe_error(e)};
    }
  };
}

struct PyBench {
  std::unique_ptr<Bench> bench;
};

void raise_if_error(const Status& s) {
  if (!s.ok()) throw std::runtime_error(s.message());
}

Entry add_peer(PyBench& b, std::string name, nb::object run) {
  auto calls = std::make_shared<PeerCalls>();
  calls->run = std::move(run);
  std::vector<Array> keep;
  auto written = [&](Outputs* o) -> Status {
    calls->keep = false;
    if (!calls->returned.is_valid() || !nb::isinstance<nb::dict>(calls->returned))
      return {StatusCode::kInvalidArgument, "a peer's call must return a dict of its outputs"};
    const nb::dict d = nb::borrow<nb::dict>(calls->returned);
    const std::pair<const char*, Tensor*> slots[] = {{"out", &o->out}, {"lse", &o->lse},
                                                     {"dq", &o->dq}, {"dk", &o->dk}, {"dv", &o->dv}};
    try {
      for (const auto& [key, dst] : slots)
        if (d.contains(key)) *dst = import_tensor(d[key], key, &keep);
    } catch (const nb::builtin_exception& e) {
      return {StatusCode::kInvalidArgument, e.what()};
    }
    return {};
  };
  Entry e;
  raise_if_error(b.bench->add(std::move(name), peer_launch(calls), written, &e));
  calls->returned = nb::object();
  return e;
}

}  // namespace

void bind_bench(nb::module_& m) {
  nb::module_ b = m.def_submodule("bench", "The benchmark harness (include/flashlab/bench.h)");

  nb::class_<Problem>(b, "Problem")
      .def(nb::init<>())
      .def_rw("batch", &Problem::batch)
      .def_rw("heads_q", &Problem::heads_q)
      .def_rw("heads_kv", &Problem::heads_kv)
      .def_rw("seqlen_q", &Problem::seqlen_q)
      .def_rw("seqlen_k", &Problem::seqlen_k)
      .def_rw("head_dim", &Problem::head_dim)
      .def_rw("head_dim_v", &Problem::head_dim_v)
      .def_prop_rw("dtype", [](const Problem& p) { return std::string(to_string(p.dtype)); },
                   [](Problem& p, const std::string& s) { p.dtype = parse_dtype(s); })
      .def_prop_rw("device", [](const Problem& p) { return std::string(to_string(p.device)); },
                   [](Problem& p, const std::string& s) { p.device = parse_device(s); })
      .def_rw("causal", &Problem::causal)
      .def_rw("window_left", &Problem::window_left)
      .def_rw("window_right", &Problem::window_right)
      .def_rw("softcap", &Problem::softcap)
      .def_rw("backward", &Problem::backward)
      .def_rw("train", &Problem::train, "a training step per call: forward then backward (backward ignored)")
      .def_rw("decode", &Problem::decode)
      .def_rw("page_size", &Problem::page_size)
      .def_rw("seqlen_new", &Problem::seqlen_new)
      .def_rw("quadratic_workspace_limit", &Problem::quadratic_workspace_limit)
      .def_prop_rw("lengths", [](const Problem& p) { return p.lengths; },
                   [](Problem& p, std::vector<int> lengths) { set_lengths(p, std::move(lengths)); },
                   "varlen: the documents' lengths (batch and seqlen_q/seqlen_k follow); [] padded")
      .def("__copy__", [](const Problem& p) { return p; })
      .def_prop_ro("flops", &pass_flops)
      .def_prop_ro("kv_bytes", &kv_bytes)
      .def_prop_ro("shape", &shape_string)
      .def_prop_ro("mask", &mask_string);

  b.def("sweep_problems",
        [](std::vector<int> head_dims, std::vector<int> seqlens, std::vector<bool> causal,
           bool forward, bool backward, const std::string& dtype, const std::string& device, bool train) {
          Sweep s;
          s.head_dims = std::move(head_dims), s.seqlens = std::move(seqlens), s.causal = std::move(causal);
          s.forward = forward, s.backward = backward, s.train = train;
          s.dtype = parse_dtype(dtype), s.device = parse_device(device);
          return sweep_problems(s);
        },
        nb::arg("head_dims"), nb::arg("seqlens"), nb::arg("causal"), nb::arg("forward"),
        nb::arg("backward"), nb::arg("dtype"), nb::arg("device"), nb::arg("train") = false);
  b.def("decode_problems",
        [](std::vector<int> seqlens, int batch, const std::string& dtype, const std::string& device,
           int heads_q, int heads_kv, int head_dim, int seqlen_q, int page_size, int seqlen_new) {
          Sweep s;
          s.decode_seqlens = std::move(seqlens), s.decode_batch = batch;
          s.dtype = parse_dtype(dtype), s.device = parse_device(device);
          s.decode_heads_q = heads_q, s.decode_heads_kv = heads_kv, s.decode_head_dim = head_dim;
          s.decode_seqlen_q = seqlen_q, s.decode_page_size = page_size, s.decode_seqlen_new = seqlen_new;
          return decode_problems(s);
        },
        nb::arg("seqlens"), nb::arg("batch"), nb::arg("dtype"), nb::arg("device"), nb::arg("heads_q") = 32,
        nb::arg("heads_kv") = 8, nb::arg("head_dim") = 128, nb::arg("seqlen_q") = 1, nb::arg("page_size") = 0,
        nb::arg("seqlen_new") = 0,
        "KV-cache problems (Problem.decode), one per cache length in `seqlens`");

  b.def("document_lengths",
        [](int tokens, int lo, int hi, uint64_t seed) {
          std::vector<int> lengths;
          raise_if_error(document_lengths(tokens, lo, hi, seed, &lengths));
          return lengths;
        },
        nb::arg("tokens"), nb::arg("lo"), nb::arg("hi"), nb::arg("seed") = 0,
        "Lengths drawn uniformly from [lo, hi] (seeded) until they fill `tokens`, the last cut to fit");
  b.def("varlen_problems",
        [](std::vector<int> head_dims, std::vector<bool> causal, bool forward, bool backward,
           const std::string& dtype, const std::string& device, const std::vector<int>& lengths,
           bool train) {
          Sweep s;
          s.head_dims = std::move(head_dims), s.causal = std::move(causal);
          s.forward = forward, s.backward = backward, s.train = train;
          s.dtype = parse_dtype(dtype), s.device = parse_device(device);
          return varlen_problems(s, lengths);
        },
        nb::arg("head_dims"), nb::arg("causal"), nb::arg("forward"), nb::arg("backward"),
        nb::arg("dtype"), nb::arg("device"), nb::arg("lengths"), nb::arg("train") = false,
        "The sweep as one varlen problem per (head dim, causal, pass), heads = hidden / head dim");
  b.def("sweep_tokens", [] { return Sweep{}.tokens; }, "The sweep's token count");

  // Like Problem's above: nanobind lists a struct's fields one .def_rw each.
  nb::class_<TimingOptions>(b, "TimingOptions")
      .def(nb::init<>())
      .def_rw("warmup", &TimingOptions::warmup)
      .def_rw("warmup_ms", &TimingOptions::warmup_ms)
      .def_rw("iters", &TimingOptions::iters)
      .def_rw("budget_ms", &TimingOptions::budget_ms)
      .def_rw("rounds", &TimingOptions::rounds);
  b.def("plan_runs", [](double call_ms, const TimingOptions& o) {
    const RunPlan p = plan_runs(call_ms, o);
    return std::make_tuple(p.warmup, p.timed);
  });
  b.def("median", &median);

  nb::class_<Row>(b, "Row")
      .def_ro("kernel", &Row::kernel)
      .def_ro("problem", &Row::problem)
      .def_prop_ro("status", [](const Row& r) { return std::string(to_string(r.status)); })
      .def_ro("reason", &Row::reason)
      .def_ro("time_ms", &Row::time_ms)
      .def_ro("warmup_runs", &Row::warmup_runs)
      .def_ro("timed_runs", &Row::timed_runs)
      .def_ro("round_ms", &Row::round_ms)
      .def_ro("flops", &Row::flops)
      .def_ro("tflops", &Row::tflops)
      .def_ro("kv_bytes", &Row::kv_bytes)
      .def_prop_ro("gbps", &Row::gbps)
      .def_ro("workspace_bytes", &Row::workspace_bytes)
      .def_prop_ro("errors", [](const Row& r) {
        nb::dict d;
        const std::pair<const char*, double> errs[] = {
            {"out", r.err_out}, {"lse", r.err_lse}, {"dq", r.err_dq}, {"dk", r.err_dk}, {"dv", r.err_dv}};
        for (const auto& [name, e] : errs)
          if (e == e) d[name] = e;
        return d;
      });

  nb::class_<Entry>(b, "Entry")
      .def_prop_ro("row", [](const Entry& e) { return e.row; })  // a copy: it outlives the entry
      .def_prop_ro("timed", [](const Entry& e) { return bool(e.launch); })
      .def_ro("call_ms", &Entry::call_ms);

  nb::class_<Progress>(b, "Progress")
      .def(nb::init<bool, int>(), nb::arg("enabled"), nb::arg("total"))
      .def("step", [](Progress& p, const std::string& what) { p.step(what); });

  nb::class_<PyBench>(b, "Bench")
      .def("__init__",
           [](PyBench* self, const Problem& p, const TimingOptions& timing, uint64_t seed, int threads,
              bool check, double check_gflops, uintptr_t stream, bool progress) {
             new (self) PyBench();
             Options o;
             o.timing = timing, o.seed = seed, o.threads = threads, o.check = check;
             o.check_flops = check_gflops * 1e9, o.progress = progress;
             o.stream = reinterpret_cast<void*>(stream);
             raise_if_error(Bench::create(p, o, &self->bench));
           },
           nb::arg("problem"), nb::arg("timing"), nb::arg("seed"), nb::arg("threads") = 0,
           nb::arg("check") = true, nb::arg("check_gflops") = 80.0, nb::arg("stream") = 0,
           nb::arg("progress") = false)
      .def_prop_ro("set_count", [](const PyBench& s) { return s.bench->set_count(); })
      .def("input",
           [](PyBench& s, int set, const std::string& name, const std::string& framework) {
             static const std::pair<const char*, Operand> kOperands[] = {
                 {"q", Operand::kQ}, {"k", Operand::kK}, {"v", Operand::kV},
                 {"out", Operand::kOut}, {"lse", Operand::kLse}, {"dout", Operand::kDout},
                 {"k_new", Operand::kKNew}, {"v_new", Operand::kVNew},
                 {"cache_seqlens", Operand::kCacheSeqlens}, {"block_table", Operand::kBlockTable},
                 {"cu_seqlens", Operand::kCuSeqlens}};
             for (const auto& [n, op] : kOperands)
               if (name == n) {
                 const Tensor t = s.bench->input(set, op);
                 if (!t.present()) return nb::object(nb::none());
                 if (framework == "numpy") return export_tensor<nb::numpy>(t, nb::find(&s));
                 return export_tensor<nb::pytorch>(t, nb::find(&s));
               }
             throw nb::value_error(("no operand '" + name + "'").c_str());
           },
           nb::arg("set"), nb::arg("name"), nb::arg("framework") = "torch",
           "A view of one operand of input set `set` as a torch tensor (or framework='numpy'); "
           "None when the pass has no such operand. Decode: k and v are the caches, with "
           "k_new, v_new, cache_seqlens and block_table; varlen: cu_seqlens")
      .def("add_kernel",
           [](PyBench& s, const std::string& name) {
             Entry e;
             raise_if_error(s.bench->add_kernel(name, &e));
             return e;
           })
      .def("add", &add_peer, nb::arg("name"), nb::arg("run"))
      .def("refused",
           [](PyBench& s, std::string name, std::string reason, bool error) {
             return s.bench->refused(std::move(name), std::move(reason),
                                     error ? RowStatus::kError : RowStatus::kUnsupported);
           },
           nb::arg("name"), nb::arg("reason"), nb::arg("error") = false)
      .def("time", [](PyBench& s, const std::vector<Entry*>& entries) { raise_if_error(s.bench->time(entries)); })
      .def("describe", [](PyBench& s) {
        Report r;
        s.bench->describe(&r);
        nb::dict d;
        d["device"] = r.device, d["checked"] = r.checked, d["timing"] = r.timing, d["inputs"] = r.inputs;
        return d;
      });
}
