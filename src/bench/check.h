// The check before timing (bench.h, step 2): the operands of a problem, the slice of it
// that the fp64 reference computes, the reference itself (cpu_reference through the public
// API), and the comparison of an implementation's outputs with it.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "bench/memory.h"
#include "flashlab/bench.h"

namespace flashlab::bench {

// Every tensor of a problem; the first six and the last seven are Operand's.
enum Slot : int { kQ, kK, kV, kOut, kLse, kDout, kDq, kDk, kDv, kKNew, kVNew, kSeqlens, kTable, kCu, kCos, kSin, kSlots };
const char* slot_name(Slot s);
// A backward problem on its own (not a training step's): out and LSE are its inputs, made
// before timing by the device's best forward kernel.
inline bool backward_alone(const Problem& p) { return p.backward && !p.train; }
// [batch, seqlen, heads, dim]; LSE is [batch, heads_q, seqlen_q] (rank 3). Decode: k and v
// are the caches, paged [num_pages, page_size, heads_kv, dim]. Varlen: [total, heads, dim],
// LSE [heads_q, total], and cu_seqlens int32 [batch + 1]. The slots a problem does not use
// (slot_used) are absent.
Tensor slot_view(const Problem& p, Slot s, void* data);
size_t slot_bytes(const Problem& p, Slot s);
// The slots a pass's calls read and write: its inputs (random, or for the backward out and
// LSE from a forward kernel) and its outputs.
bool slot_used(const Problem& p, Slot s);
std::vector<Slot> outputs_of(const Problem& p);
std::vector<Slot> random_inputs_of(const Problem& p);
// forward(), backward() or forward_kvcache(), by the arguments' type.
Status run_pass(const ForwardArgs& a);
Status run_pass(const BackwardArgs& a);
Status run_pass(const KvCacheArgs& a);
// select_kernel(); the KV-cache call has none, so workspace_size() says whether it runs and
// `name` is the kernel asked for.
Status select_pass(const ForwardArgs& a, std::string* name);
Status select_pass(const BackwardArgs& a, std::string* name);
Status select_pass(const KvCacheArgs& a, std::string* name);
// Decode: pages per sequence (0 when contiguous) and the int32 tables of input set `set`
// (cache_seqlens = seqlen_k - seqlen_new; the block table a shuffled draw of the pool).
// Varlen: cu_seqlens (the same in every set).
int pages_per_sequence(const Problem& p);
std::vector<int32_t> table_values(const Problem& p, Slot table, uint64_t seed);

// The part of the problem compared with the fp64 reference: batch entries [0, batches),
// query heads [0, heads_q) with their kv heads [0, heads_kv), query rows [row0, seqlen_q),
// and for the backward's dk and dv the keys [key0, seqlen_k). The last rows are taken
// because with bottom-right alignment a problem of the last rows and all keys masks
// exactly as the full one does; dk and dv of a key are exact only when every row that
// sees it is in the slice, so when rows are cut they are compared on the keys that no
// earlier row sees (none without a right bound). A varlen problem is compared whole, or
// on one document (doc, the longest: the last of equals) sliced as a padded batch of one
// would be.
struct Slice {
  int batches = 0, heads_q = 0, heads_kv = 0, row0 = 0, rows = 0, key0 = 0;
  bool full = true;
  int doc = -1;  // varlen: the document compared; -1: all
  bool keys_compared() const;
};
Slice choose_slice(const Problem& p, double budget_flops, int threads);
std::string slice_string(const Problem& p, const Slice& s);

// The fp64 reference outputs of a slice of input set 0, and the comparison with them.
class Oracle {
 public:
  // `inputs` holds views of set 0's operands (any device); threads as the API takes them.
  Status compute(const Problem& p, const Slice& s, const std::array<Tensor, kSlots>& inputs,
                 int threads, void* stream, Progress* progress);
  // The outputs of a cpu_reference call on set 0 of an fp32 problem as the reference:
  // cpu_reference computes in fp64 whatever the dtype and rounds once to fp32 on store
  // (LSE is fp32 either way), so its checked call gives compute()'s outputs to within
  // that rounding (2^-24 relative, far below every tolerance) without a second fp64 run.
  Status adopt(const Problem& p, const Slice& s, const std::array<Tensor, kSlots>& got, void* stream);
  bool ready() const { return ready_; }

  // Fills the row's errors and, when an output is not fully written or is off by more
  // than the tolerance, sets kFail with the reason. Without a reference (check off) only
  // the writes are checked.
  Status compare(const Problem& p, const Slice& s, const std::array<Tensor, kSlots>& got,
                 void* stream, Row* row) const;

 private:
  void keep(Slot slot, std::vector<double> want);  // want_ and, from it, grad_scale_

  bool ready_ = false;
  std::array<std::vector<double>, kSlots> want_;  // reference outputs of the slice
  // max(1, max |reference|) of each gradient: its tolerance scales with it, since a
  // gradient's rounding error does (dk, dv sum over a GQA group; causal first keys).
  std::array<double, kSlots> grad_scale_{};
};

std::string format_err(double e);  // "1.2e-03"

}  // namespace flashlab::bench
