// One fuzz call: which pass and kernel, the problem, how each tensor is laid out, what is
// wrong with it (if anything) and what the API must therefore answer.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "buffer.h"
#include "flashlab/flashlab.h"
#include "test_util.h"

namespace flashlab::fuzz {

// The tensors of a call, in the order they are allocated: a view may only be placed inside
// the storage of a slot allocated before it.
enum Slot : int { kCuQ, kCuK, kQ, kK, kV, kDout, kOut, kLse, kDq, kDk, kDv, kSlots };
const char* slot_name(int slot);

enum class Pass { kForward, kBackward };

// What the API must answer.
enum class Expect {
  kValid,            // ok (then every output written and right) or kUnsupported with a reason
  kInvalid,          // any non-ok Status; accepting it is a failure
  kRefuseOrCorrect,  // extreme but not meaningless: refused, or accepted and right
  kNoCrash,          // contents the API need not read (cu_seqlens): any Status, no stray access
};
const char* to_string(Expect e);

enum class Workspace { kGiven, kShort, kNull };

struct NonFinite {
  int slot;       // kQ, kK or kV
  int64_t index;  // logical element
  double value;   // NaN, +inf or -inf
};

// The arguments a twist may edit just before the call: pointers into the pass's Args.
struct Target {
  std::array<Tensor*, kSlots> t{};
  CommonArgs* c = nullptr;
};

// The kernel's outputs in logical order, for the analytic checks of the regression corpus.
using ValueCheck = std::function<std::string(const test::Results& got)>;

struct Call {
  Pass pass = Pass::kForward;
  std::string kernel = "auto";
  Expect expect = Expect::kValid;
  test::Problem p;
  std::array<Layout, kSlots> layout;  // rank 0: absent
  uint64_t data_seed = 0;             // the inputs' random values

  int max_seqlen_q = -1, max_seqlen_k = -1;  // varlen, when >= 0: replaces the longest length
  size_t quadratic_limit = 0;                // 0: the API's default
  bool check_inputs = false;                 // where the API has the opt-in cu_seqlens check
  std::vector<NonFinite> nonfinite;
  bool nan_padding = false;              // NaN in the unseen elements of q, k, v
  std::array<int, kSlots> same_as;       // -1, or the slot whose buffer this one is
  int alias_slot = -1, alias_into = -1;  // alias_slot's view inside alias_into's storage
  size_t alias_byte_offset = 0;
  Workspace workspace = Workspace::kGiven;
  bool deterministic = false;  // backward

  std::string kind = "valid";                               // the generator's name for the call
  std::string twist;                                        // what is wrong, in words
  std::function<void(std::array<Buf, kSlots>&)> edit_data;  // before the upload
  std::function<void(Target&)> edit_args;                   // after the Args are built
  ValueCheck check_values;                                  // analytic expectations (corpus)

  Call() { same_as.fill(-1); }
  bool backward() const { return pass == Pass::kBackward; }
  DType dtype_of(int slot) const;
  std::string describe() const;  // one line
};

// Whether the API has the opt-in host check of cu_seqlens contents (CommonArgs::check_inputs).
template <class A>
inline constexpr bool kHasCheckInputs = requires(const A& a) {
  a.check_inputs;
};

// What the fuzzer runs against: the device and the registry's kernels there.
struct Env {
  Device device = Device::kCPU;
  int device_index = 0;
  void* stream = nullptr;
  std::vector<KernelInfo> kernels;  // on this device
  bool has(Pass pass) const;
};

// The slots each pass reads and writes.
bool is_input(const Call& c, int slot);
bool is_output(const Call& c, int slot);

// The tensors' shapes for the problem (absent slots stay empty).
std::array<std::vector<int64_t>, kSlots> shapes_of(const Call& c);
// Contiguous layouts for every slot the pass uses, and cu_seqlens from the lengths.
void contiguous_layouts(Call* c);

}  // namespace flashlab::fuzz
