// One CPU kernel run by name through the public API on inputs the test wrote itself (the
// numerics and non-finite tests set exact values instead of drawing random ones): the
// forward, then optionally the backward on the kernel's own out and LSE. Results come back
// in logical order, as run_reference_fp64 returns the oracle's.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "test_util.h"

namespace flashlab::test {

// Logical index of element (b, i, h, d) of a [batch, seqlen, heads, dim] tensor, and of
// LSE row (b, h, i) of [batch, heads_q, seqlen_q].
inline int64_t bshd(int64_t b, int64_t i, int64_t h, int64_t d, int64_t seqlen, int64_t heads, int64_t dim) {
  return ((b * seqlen + i) * heads + h) * dim + d;
}
inline int64_t lse_index(const Problem& p, int64_t b, int64_t h, int64_t i) {
  return (b * p.heads_q + h) * p.seqlen_q + i;
}

template <class Args>
bool run_with_workspace(Args a, Status (*run)(const Args&)) {
  size_t bytes = 0;
  const Status s = workspace_size(a, &bytes);
  EXPECT_TRUE(status_is(s, StatusCode::kOk)) << "workspace_size";
  if (!s.ok()) return false;
  std::vector<double> ws(bytes / sizeof(double) + 1);
  a.workspace = ws.data();
  a.workspace_bytes = bytes;
  const Status r = run(a);
  EXPECT_TRUE(status_is(r, StatusCode::kOk)) << "run";
  return r.ok();
}

inline Results run_kernel(std::string_view kernel, const Problem& p, const Inputs& in, bool with_backward) {
  HostTensor out = make_out(p), lse = make_lse(p);
  ForwardArgs fa = forward_args(p, in.q.view(), in.k.view(), in.v.view(), out.view(), lse.view(),
                                in.cu_q.view(), in.cu_k.view());
  fa.kernel = kernel;
  if (!run_with_workspace<ForwardArgs>(fa, forward)) return {};
  Results r{out.to_f64(), lse.to_f64(), {}, {}, {}};
  if (!with_backward) return r;

  HostTensor dq = make_like_q(p), dk = make_like_kv(p, p.head_dim), dv = make_like_kv(p, p.head_dim_v);
  BackwardArgs ba = backward_args(p, in.q.view(), in.k.view(), in.v.view(), out.view(), in.dout.view(),
                                  lse.view(), dq.view(), dk.view(), dv.view(), in.cu_q.view(),
                                  in.cu_k.view());
  ba.kernel = kernel;
  if (!run_with_workspace<BackwardArgs>(ba, backward)) return {};
  r.dq = dq.to_f64();
  r.dk = dk.to_f64();
  r.dv = dv.to_f64();
  return r;
}

}  // namespace flashlab::test
