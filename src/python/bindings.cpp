// The one binding file: DLPack arrays in (zero copy), flashlab::Status out as a Python
// exception. No PyTorch at build time: anything with __dlpack__ (PyTorch, NumPy, CuPy, JAX)
// crosses as a view. Workspace is allocated by the Python layer (with the caller's
// framework, on the tensors' device) from the *_workspace_size functions.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "flashlab/flashlab.h"

namespace nb = nanobind;
using flashlab::BackwardArgs;
using flashlab::CommonArgs;
using flashlab::ForwardArgs;
using flashlab::KvCacheArgs;
using flashlab::Status;
using flashlab::StatusCode;
using flashlab::Tensor;
using Array = nb::ndarray<nb::ro>;

namespace {

void raise_if_error(const Status& s) {
  if (s.ok()) return;
  if (s.code() == StatusCode::kCudaError) throw std::runtime_error(s.message());
  throw nb::value_error(s.message().c_str());
}

}  // namespace

// A DLPack dtype in the words NumPy and PyTorch use: "int64", "uint8", "bool", "complex64",
// "float8_e4m3fn"; a vector dtype adds "x<lanes>". Codes past bool are DLPack's low-precision
// floats, named here by number so that any nanobind version builds this.
std::string dlpack_dtype_name(const nb::dlpack::dtype& t) {
  using C = nb::dlpack::dtype_code;
  static constexpr const char* kNarrow[] = {
      "float8_e3m4",   "float8_e4m3",     "float8_e4m3b11fnuz", "float8_e4m3fn",
      "float8_e4m3fnuz", "float8_e5m2",   "float8_e5m2fnuz",    "float8_e8m0fnu",
      "float6_e2m3fn", "float6_e3m2fn",   "float4_e2m1fn"};  // codes 7 to 17
  constexpr int kFirstNarrow = 7, kNarrowCount = int(sizeof kNarrow / sizeof *kNarrow);
  const std::string bits = std::to_string(t.bits);
  std::string name;
  switch (t.code) {
    case uint8_t(C::Int): name = "int" + bits; break;
    case uint8_t(C::UInt): name = "uint" + bits; break;
    case uint8_t(C::Float): name = "float" + bits; break;
    case uint8_t(C::Bfloat): name = "bfloat" + bits; break;
    case uint8_t(C::Complex): name = "complex" + bits; break;
    case uint8_t(C::Bool): name = "bool"; break;
    default:
      name = t.code >= kFirstNarrow && t.code < kFirstNarrow + kNarrowCount
                 ? kNarrow[t.code - kFirstNarrow]
                 : "a dtype of DLPack code " + std::to_string(t.code) + " and " + bits + " bits";
  }
  return t.lanes == 1 ? name : name + "x" + std::to_string(t.lanes);
}

namespace {

// What an argument takes, in the words of the library's own dtype messages
// (src/api/validate.cpp): cu_seqlens and the KV cache's tables int32, lse fp32, every other
// tensor a float dtype.
const char* dtypes_taken(const std::string& name) {
  if (name.rfind("cu_seqlens", 0) == 0 || name.rfind("cache_", 0) == 0 || name == "block_table")
    return "int32";
  if (name == "lse") return "fp32";
  return "fp16, bf16, fp32 or fp64";
}

flashlab::DType dtype_of(const Array& a, const std::string& name) {
  const nb::dlpack::dtype t = a.dtype();
  using C = nb::dlpack::dtype_code;
  if (t.lanes == 1) {
    if (t.code == uint8_t(C::Float) && t.bits == 32) return flashlab::DType::kF32;
    if (t.code == uint8_t(C::Float) && t.bits == 16) return flashlab::DType::kF16;
    if (t.code == uint8_t(C::Float) && t.bits == 64) return flashlab::DType::kF64;
    if (t.code == uint8_t(C::Bfloat) && t.bits == 16) return flashlab::DType::kBF16;
    if (t.code == uint8_t(C::Int) && t.bits == 32) return flashlab::DType::kI32;
  }
  throw nb::type_error(
      (name + ".dtype must be " + dtypes_taken(name) + ", got " + dlpack_dtype_name(t)).c_str());
}

// The arrays of one call, held until it returns: a DLPack capsule (what the torch layer passes,
// to skip the stream sync of Tensor.__dlpack__()) is consumed on import, and releasing the
// import would release the producer's reference to the memory before the kernel ran.
using Keep = std::vector<Array>;

// A DLPack array as a flashlab view; `None` becomes an absent tensor.
Tensor view(nb::handle obj, const std::string& name, Keep* keep) {
  if (obj.is_none()) return {};
  Array a;
  if (!nb::try_cast(obj, a))
    throw nb::type_error(
        (name + " must be an array supporting DLPack (torch, numpy, ...)").c_str());
  keep->push_back(a);
  if (a.ndim() > size_t(flashlab::kMaxRank) || a.ndim() == 0)
    throw nb::value_error(
        (name + " must have rank 1 to 4, got " + std::to_string(a.ndim())).c_str());
  Tensor t;
  t.data = const_cast<void*>(a.data());
  t.dtype = dtype_of(a, name);
  if (a.device_type() == nb::device::cpu::value) {
    t.device = flashlab::Device::kCPU;
  } else if (a.device_type() == nb::device::cuda::value) {
    t.device = flashlab::Device::kCUDA;
  } else {
    throw nb::value_error((name + " must be on the CPU or a CUDA device").c_str());
  }
  t.device_index = int(a.device_id());
  t.rank = int(a.ndim());
  for (int i = 0; i < t.rank; ++i) {
    t.shape[i] = int64_t(a.shape(size_t(i)));
    t.stride[i] = int64_t(a.stride(size_t(i)));
  }
  // An empty array addresses nothing, and NumPy gives it all-zero strides: report the
  // contiguous ones so that a zero-length batch or sequence passes the layout rules.
  if (a.size() == 0) {
    int64_t step = 1;
    for (int i = t.rank - 1; i >= 0; --i) {
      t.stride[i] = step;
      step *= std::max<int64_t>(t.shape[i], 1);
    }
  }
  return t;
}

// The options shared by forward and backward, in the order the Python layer passes them.
// The nb::object members are Python references: the type's GC slots below let the cyclic
// collector see and clear them, so an Options inside a reference cycle (a traceback's frame
// that holds it, an array that refers back to it) is collected instead of outliving the
// interpreter, where nanobind reports it as leaked.
struct Options {
  nb::object cu_seqlens_q = nb::none(), cu_seqlens_k = nb::none();
  int max_seqlen_q = 0, max_seqlen_k = 0;
  std::optional<float> softmax_scale;
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.f;
  float dropout_p = 0.f;
  uint64_t dropout_seed = 0, dropout_offset = 0;
  std::string kernel = "auto";
  uintptr_t stream = 0;
  nb::object workspace = nb::none();
  int num_threads = 0;
  bool check_inputs = false;
  int num_splits = 0;  // forward_kvcache only
};

int options_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  if (!nb::inst_ready(self)) return 0;
  const Options* o = nb::inst_ptr<Options>(self);
  for (const nb::object* m : {&o->cu_seqlens_q, &o->cu_seqlens_k, &o->workspace}) Py_VISIT(m->ptr());
  return 0;
}

int options_clear(PyObject* self) {
  Options* o = nb::inst_ptr<Options>(self);
  for (nb::object* m : {&o->cu_seqlens_q, &o->cu_seqlens_k, &o->workspace}) *m = nb::none();
  return 0;
}

PyType_Slot options_slots[] = {{Py_tp_traverse, reinterpret_cast<void*>(options_traverse)},
                               {Py_tp_clear, reinterpret_cast<void*>(options_clear)},
                               {0, nullptr}};

void fill_common(const Options& o, CommonArgs* a, Keep* keep) {
  a->maybe_cu_seqlens_q = view(o.cu_seqlens_q, "cu_seqlens_q", keep);
  a->maybe_cu_seqlens_k = view(o.cu_seqlens_k, "cu_seqlens_k", keep);
  a->max_seqlen_q = o.max_seqlen_q;
  a->max_seqlen_k = o.max_seqlen_k;
  a->softmax_scale = o.softmax_scale;
  a->causal = o.causal;
  a->window_left = o.window_left;
  a->window_right = o.window_right;
  a->softcap = o.softcap;
  a->dropout_p = o.dropout_p;
  a->dropout_seed = o.dropout_seed;
  a->dropout_offset = o.dropout_offset;
  a->kernel = o.kernel;
  a->stream = reinterpret_cast<void*>(o.stream);
  a->num_threads = o.num_threads;
  a->check_inputs = o.check_inputs;
  if (!o.workspace.is_none()) {  // raw bytes of any dtype (the Python layer passes uint8)
    Array ws;
    if (!nb::try_cast(o.workspace, ws)) throw nb::type_error("workspace must be a DLPack array");
    keep->push_back(ws);
    a->workspace = const_cast<void*>(ws.data());
    a->workspace_bytes = ws.nbytes();
  }
}

// The workspace bytes the call needs (`size_only`), else runs it without the GIL; 0.
template <class Args>
size_t size_or_run(const Args& a, bool size_only, Status (*run)(const Args&) noexcept) {
  if (size_only) {
    size_t bytes = 0;
    raise_if_error(flashlab::workspace_size(a, &bytes));
    return bytes;
  }
  Status s;
  {
    nb::gil_scoped_release release;
    s = run(a);
  }
  raise_if_error(s);
  return 0;
}

// The options, q, k, v and out: what both passes take.
template <class Args>
void fill_qkvo(const Options& o, nb::handle q, nb::handle k, nb::handle v, nb::handle out,
               Args* a, Keep* keep) {
  fill_common(o, a, keep);
  a->q = view(q, "q", keep);
  a->k = view(k, "k", keep);
  a->v = view(v, "v", keep);
  a->out = view(out, "out", keep);
}

// `size_only`: return the workspace bytes instead of running.
size_t forward(nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse,
               const Options& o, bool size_only) {
  Keep keep;
  ForwardArgs a;
  fill_qkvo(o, q, k, v, out, &a, &keep);
  a.maybe_lse = view(lse, "lse", &keep);
  return size_or_run(a, size_only, flashlab::forward);
}

size_t backward(nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle dout,
                nb::handle lse, nb::handle dq, nb::handle dk, nb::handle dv, bool deterministic,
                const Options& o, bool size_only) {
  Keep keep;
  BackwardArgs a;
  fill_qkvo(o, q, k, v, out, &a, &keep);
  a.dout = view(dout, "dout", &keep);
  a.lse = view(lse, "lse", &keep);
  a.dq = view(dq, "dq", &keep);
  a.dk = view(dk, "dk", &keep);
  a.dv = view(dv, "dv", &keep);
  a.deterministic = deterministic;
  return size_or_run(a, size_only, flashlab::backward);
}

// forward_kvcache (FlashAttention-2's flash_attn_with_kvcache): k_cache and v_cache are
// written in place when k_new and v_new are given, k_new rotated with rotary_cos/rotary_sin.
// `size_only`: return the workspace bytes.
size_t forward_kvcache(nb::handle q, nb::handle k_cache, nb::handle v_cache, nb::handle k_new,
                       nb::handle v_new, nb::handle cache_seqlens, nb::handle cache_batch_idx,
                       nb::handle block_table, nb::handle cache_leftpad, nb::handle rotary_cos,
                       nb::handle rotary_sin, bool rotary_interleaved, nb::handle out,
                       nb::handle lse, const Options& o, bool size_only) {
  Keep keep;
  KvCacheArgs a;
  fill_common(o, &a, &keep);
  const struct {
    Tensor* field;
    nb::handle array;
    const char* name;
  } views[] = {{&a.q, q, "q"},
               {&a.k_cache, k_cache, "k_cache"},
               {&a.v_cache, v_cache, "v_cache"},
               {&a.maybe_k_new, k_new, "k_new"},
               {&a.maybe_v_new, v_new, "v_new"},
               {&a.maybe_cache_seqlens, cache_seqlens, "cache_seqlens"},
               {&a.maybe_cache_batch_idx, cache_batch_idx, "cache_batch_idx"},
               {&a.maybe_block_table, block_table, "block_table"},
               {&a.maybe_cache_leftpad, cache_leftpad, "cache_leftpad"},
               {&a.maybe_rotary_cos, rotary_cos, "rotary_cos"},
               {&a.maybe_rotary_sin, rotary_sin, "rotary_sin"},
               {&a.out, out, "out"},
               {&a.maybe_lse, lse, "lse"}};
  for (const auto& v : views) *v.field = view(v.array, v.name, &keep);
  a.rotary_interleaved = rotary_interleaved;
  a.num_splits = o.num_splits;
  return size_or_run(a, size_only, flashlab::forward_kvcache);
}

}  // namespace

void bind_bench(nb::module_& m);  // src/python/bench_bindings.cpp

NB_MODULE(_flashlab, m) {
  m.doc() = "FlashLab native module (use the flashlab package, not this module)";

  nb::class_<Options>(m, "Options", nb::type_slots(options_slots))
      .def(nb::init<>())
      .def_rw("cu_seqlens_q", &Options::cu_seqlens_q, nb::for_setter(nb::arg("value").none()))
      .def_rw("cu_seqlens_k", &Options::cu_seqlens_k, nb::for_setter(nb::arg("value").none()))
      .def_rw("max_seqlen_q", &Options::max_seqlen_q)
      .def_rw("max_seqlen_k", &Options::max_seqlen_k)
      .def_rw("softmax_scale", &Options::softmax_scale, nb::for_setter(nb::arg("value").none()))
      .def_rw("causal", &Options::causal)
      .def_rw("window_left", &Options::window_left)
      .def_rw("window_right", &Options::window_right)
      .def_rw("softcap", &Options::softcap)
      .def_rw("dropout_p", &Options::dropout_p)
      .def_rw("dropout_seed", &Options::dropout_seed)
      .def_rw("dropout_offset", &Options::dropout_offset)
      .def_rw("kernel", &Options::kernel)
      .def_rw("stream", &Options::stream)
      .def_rw("workspace", &Options::workspace, nb::for_setter(nb::arg("value").none()))
      .def_rw("num_threads", &Options::num_threads)
      .def_rw("check_inputs", &Options::check_inputs)
      .def_rw("num_splits", &Options::num_splits);

  m.def("forward", &forward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"),
        nb::arg("lse").none(), nb::arg("options"), nb::arg("size_only") = false);
  m.def("backward", &backward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"),
        nb::arg("dout"), nb::arg("lse"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"),
        nb::arg("deterministic"), nb::arg("options"), nb::arg("size_only") = false);
  m.def("forward_kvcache", &forward_kvcache, nb::arg("q"), nb::arg("k_cache"), nb::arg("v_cache"),
        nb::arg("k_new").none(), nb::arg("v_new").none(), nb::arg("cache_seqlens").none(),
        nb::arg("cache_batch_idx").none(), nb::arg("block_table").none(),
        nb::arg("cache_leftpad").none(), nb::arg("rotary_cos").none(), nb::arg("rotary_sin").none(),
        nb::arg("rotary_interleaved"), nb::arg("out"),
        nb::arg("lse").none(), nb::arg("options"), nb::arg("size_only") = false);
  m.def("kernels", [] {
    nb::list out;
    for (const flashlab::KernelInfo& k : flashlab::kernels()) {
      nb::dict d;
      d["name"] = std::string(k.name);
      d["arch"] = std::string(k.arch);
      d["summary"] = std::string(k.summary);
      d["forward"] = k.has_forward;
      d["backward"] = k.has_backward;
      d["kvcache"] = k.has_kvcache;
      out.append(d);
    }
    return out;
  });
  m.def("cuda_available", &flashlab::cuda_available);
  bind_bench(m);
}
