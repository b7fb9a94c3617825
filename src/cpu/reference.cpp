// cpu_reference — the oracle every other kernel is tested against.
//
// Straightforward attention in fp64, the way a textbook writes it: for each (batch, head)
// materialize the whole score matrix S = scale·Q Kᵀ (transformed by the mask policy's
// softcap), softmax each row as P = exp(S − m) / l (m the row max, l the row sum, kept
// apart so that huge logits keep their weights; see RowSoftmax), multiply by V. Extra
// memory is O(seqlen_q · seqlen_k) per thread — exactly what FlashAttention avoids, and
// what `flashlab bench` shows next to cpu_flash.
//
// The backward recomputes P from the scores (not from the given LSE, so a wrong LSE cannot
// hide), then with FlashAttention-2's preprocessing D_i = rowsum(dO_i ∘ O_i):
//   dV = Pᵀ dO,  dP = dO Vᵀ,  dS = P ∘ (dP − D) ∘ dlogit,  dQ = scale·dS K,  dK = scale·dSᵀ Q.
// GQA: one task per kv head sums dK/dV over the query heads of its group.
// Dropout (common/dropout.h) replaces P by Z = P ∘ M / (1 − p) in O = Z V and dV = Zᵀ dO, and
// dP by dP ∘ M / (1 − p); D = rowsum(dO ∘ O) is unchanged in form (O already holds Z).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/dtype.h"
#include "common/params.h"
#include "common/registry.h"

namespace flashlab::cpu {
namespace {

// The summary `flashlab list` shows; the registry entry closes this file.
constexpr char kSummary[] =
    "fp64 textbook attention: materializes S = QKᵀ per head; every mask, GQA, varlen, dropout; "
    "forward and backward";

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// rows × cols of a head, starting at element `offset`, into a dense double matrix.
void gather(const void* base, DType dt, int64_t offset, int64_t row_stride, int rows, int cols,
            double* dst) {
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      dst[int64_t(r) * cols + c] = load_as_double(base, dt, offset + r * row_stride + c);
}

void scatter(void* base, DType dt, int64_t offset, int64_t row_stride, int rows, int cols,
             const double* src) {
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      store_from_double(base, dt, offset + r * row_stride + c, src[int64_t(r) * cols + c]);
}

double dot(const double* a, const double* b, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// How a pass splits its work: one task per (batch, head) in the forward or per
// (batch, kv head) in the backward, on at most num_threads threads, each with `per`
// doubles of workspace.
struct Split {
  int tasks, threads;
  size_t per;
  size_t bytes() const { return per * sizeof(double) * size_t(threads); }
};
Split split(const AttnParams& p, int tasks, size_t per) {
  return {tasks, std::max(1, std::min(tasks, p.num_threads)), per};
}

// Dropout's factor for element (bh, i, j): 0 when dropped, 1/(1 − p) when kept, 1 when off.
double kept(const AttnParams& p, int bh, int i, int j) {
  if (!p.dropout.enabled()) return 1.0;
  return p.dropout.keep(uint32_t(bh), i, j) ? 1.0 / (1.0 - double(p.dropout.p)) : 0.0;
}

// The softmax of each row of one (batch, head), kept as its max logit m and its sum
// l = Σ exp(s − m) over the keys the row sees, not as LSE = m + log(l): when the logits are
// huge, m + log(l) rounds log(l) away, and exp(s − LSE) would give each of n tied keys
// weight 1 instead of 1/n. A row that sees no key, or scores every key it sees −inf, has
// l = 0 (its true log-sum-exp is −inf) and weights 0; a NaN score makes l NaN.
struct RowSoftmax {
  double* m;  // [len_q]
  double* l;  // [len_q]
  double prob(int i, double s) const { return l[i] == 0 ? 0.0 : std::exp(s - m[i]) / l[i]; }
  double lse(int i) const { return l[i] == 0 ? kNegInf : m[i] + std::log(l[i]); }
};

// Logits of one (batch, head): S[i][j] for the allowed keys, and each row's softmax.
void scores_and_softmax(const AttnParams& p, int len_q, int len_k, const double* Q, const double* K,
                        double* S, const RowSoftmax& rows) {
  const int D = p.head_dim;
  for (int i = 0; i < len_q; ++i) {
    const int jb = p.mask.key_begin(i, len_q, len_k), je = p.mask.key_end(i, len_q, len_k);
    double* s = S + int64_t(i) * p.seqlen_k;
    double m = kNegInf;
    bool nan = false;
    for (int j = jb; j < je; ++j) {
      s[j] = p.mask.logit(double(p.scale) * dot(Q + int64_t(i) * D, K + int64_t(j) * D, D));
      m = std::max(m, s[j]);
      nan = nan || std::isnan(s[j]);
    }
    double l = nan ? std::numeric_limits<double>::quiet_NaN() : 0.0;
    if (m > kNegInf)
      for (int j = jb; j < je; ++j) l += std::exp(s[j] - m);
    rows.m[i] = m;
    rows.l[i] = l;
  }
}

// ---- forward ----------------------------------------------------------------------------

Split fwd_split(const AttnParams& p) {
  const size_t sq = size_t(p.seqlen_q), sk = size_t(p.seqlen_k);
  return split(p, p.batch * p.heads_q,
               sq * p.head_dim + sk * (p.head_dim + p.head_dim_v) + sq * sk + 2 * sq + sq * p.head_dim_v);
}

size_t ref_fwd_workspace(const FwdParams& p) { return fwd_split(p).bytes(); }

Status ref_fwd(const FwdParams& p) {
  const Split sp = fwd_split(p);
  const size_t per = sp.per;
  const int D = p.head_dim, Dv = p.head_dim_v, Sk = p.seqlen_k;
#pragma omp parallel for num_threads(sp.threads) schedule(dynamic, 1)
  for (int t = 0; t < sp.tasks; ++t) {
    const int b = t / p.heads_q, h = t % p.heads_q, hk = h / p.group;
    const SeqBounds sb = host_seq_bounds(p, b);
    double* Q = static_cast<double*>(p.workspace) + per * omp_get_thread_num();
    double* K = Q + int64_t(p.seqlen_q) * D;        // [len_k, D]
    double* V = K + int64_t(Sk) * D;                // [len_k, Dv]
    double* S = V + int64_t(Sk) * Dv;               // [len_q, Sk]
    const RowSoftmax rows{S + int64_t(p.seqlen_q) * Sk, S + int64_t(p.seqlen_q) * (Sk + 1)};
    double* O = rows.l + p.seqlen_q;                // [len_q, Dv]
    gather(p.q, p.dtype, b * p.q_batch_stride + sb.start_q * p.q_row_stride + h * p.q_head_stride,
           p.q_row_stride, sb.len_q, D, Q);
    gather(p.k, p.dtype, b * p.k_batch_stride + sb.start_k * p.k_row_stride + hk * p.k_head_stride,
           p.k_row_stride, sb.len_k, D, K);
    gather(p.v, p.dtype, b * p.v_batch_stride + sb.start_k * p.v_row_stride + hk * p.v_head_stride,
           p.v_row_stride, sb.len_k, Dv, V);
    scores_and_softmax(p, sb.len_q, sb.len_k, Q, K, S, rows);
    for (int i = 0; i < sb.len_q; ++i) {
      double* o = O + int64_t(i) * Dv;
      std::fill(o, o + Dv, 0.0);
      const int jb = p.mask.key_begin(i, sb.len_q, sb.len_k), je = p.mask.key_end(i, sb.len_q, sb.len_k);
      for (int j = jb; j < je; ++j) {
        const double zij = rows.prob(i, S[int64_t(i) * Sk + j]) * kept(p, t, i, j);
        for (int d = 0; d < Dv; ++d) o[d] += zij * V[int64_t(j) * Dv + d];
      }
      if (p.lse)
        p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + sb.start_q + i] = float(rows.lse(i));
    }
    scatter(p.out, p.dtype, b * p.o_batch_stride + sb.start_q * p.o_row_stride + h * p.o_head_stride,
            p.o_row_stride, sb.len_q, Dv, O);
  }
  return {};
}

// ---- backward ---------------------------------------------------------------------------

Split bwd_split(const AttnParams& p) {
  const size_t sq = size_t(p.seqlen_q), sk = size_t(p.seqlen_k);
  const size_t D = p.head_dim, Dv = p.head_dim_v;
  return split(p, p.batch * p.heads_kv, sk * (2 * D + 2 * Dv) + sq * (2 * D + 2 * Dv) + sq * sk + 3 * sq);
}

size_t ref_bwd_workspace(const BwdParams& p) { return bwd_split(p).bytes(); }

Status ref_bwd(const BwdParams& p) {
  const Split sp = bwd_split(p);
  const size_t per = sp.per;
  const int D = p.head_dim, Dv = p.head_dim_v, Sk = p.seqlen_k, Sq = p.seqlen_q;
#pragma omp parallel for num_threads(sp.threads) schedule(dynamic, 1)
  for (int t = 0; t < sp.tasks; ++t) {
    const int b = t / p.heads_kv, hk = t % p.heads_kv;
    const SeqBounds sb = host_seq_bounds(p, b);
    const int lq = sb.len_q, lk = sb.len_k;
    double* K = static_cast<double*>(p.workspace) + per * omp_get_thread_num();  // [lk, D]
    double* V = K + int64_t(Sk) * D;       // [lk, Dv]
    double* dK = V + int64_t(Sk) * Dv;     // [lk, D]
    double* dV = dK + int64_t(Sk) * D;     // [lk, Dv]
    double* Q = dV + int64_t(Sk) * Dv;     // [lq, D]
    double* dQ = Q + int64_t(Sq) * D;      // [lq, D]
    double* O = dQ + int64_t(Sq) * D;      // [lq, Dv]
    double* dO = O + int64_t(Sq) * Dv;     // [lq, Dv]
    double* S = dO + int64_t(Sq) * Dv;     // [lq, Sk] logits
    const RowSoftmax rows{S + int64_t(Sq) * Sk, S + int64_t(Sq) * (Sk + 1)};  // [lq] each
    double* Drow = rows.l + Sq;            // [lq]
    gather(p.k, p.dtype, b * p.k_batch_stride + sb.start_k * p.k_row_stride + hk * p.k_head_stride,
           p.k_row_stride, lk, D, K);
    gather(p.v, p.dtype, b * p.v_batch_stride + sb.start_k * p.v_row_stride + hk * p.v_head_stride,
           p.v_row_stride, lk, Dv, V);
    std::fill(dK, dK + int64_t(lk) * D, 0.0);
    std::fill(dV, dV + int64_t(lk) * Dv, 0.0);
    for (int h = hk * p.group; h < (hk + 1) * p.group; ++h) {
      gather(p.q, p.dtype, b * p.q_batch_stride + sb.start_q * p.q_row_stride + h * p.q_head_stride,
             p.q_row_stride, lq, D, Q);
      gather(p.out, p.dtype, b * p.o_batch_stride + sb.start_q * p.o_row_stride + h * p.o_head_stride,
             p.o_row_stride, lq, Dv, O);
      gather(p.dout, p.dtype,
             b * p.do_batch_stride + sb.start_q * p.do_row_stride + h * p.do_head_stride,
             p.do_row_stride, lq, Dv, dO);
      scores_and_softmax(p, lq, lk, Q, K, S, rows);
      for (int i = 0; i < lq; ++i) Drow[i] = dot(dO + int64_t(i) * Dv, O + int64_t(i) * Dv, Dv);
      std::fill(dQ, dQ + int64_t(lq) * D, 0.0);
      const int bh = b * p.heads_q + h;
      for (int i = 0; i < lq; ++i) {
        const int jb = p.mask.key_begin(i, lq, lk), je = p.mask.key_end(i, lq, lk);
        for (int j = jb; j < je; ++j) {
          const double logit = S[int64_t(i) * Sk + j];
          const double pij = rows.prob(i, logit);
          const double mij = kept(p, bh, i, j);  // 1 without dropout
          const double dpij = dot(dO + int64_t(i) * Dv, V + int64_t(j) * Dv, Dv) * mij;
          const double dsij = pij * (dpij - Drow[i]) * p.mask.dlogit(logit) * double(p.scale);
          for (int d = 0; d < Dv; ++d) dV[int64_t(j) * Dv + d] += pij * mij * dO[int64_t(i) * Dv + d];
          for (int d = 0; d < D; ++d) {
            dQ[int64_t(i) * D + d] += dsij * K[int64_t(j) * D + d];
            dK[int64_t(j) * D + d] += dsij * Q[int64_t(i) * D + d];
          }
        }
      }
      scatter(p.dq, p.dtype,
              b * p.dq_batch_stride + sb.start_q * p.dq_row_stride + h * p.dq_head_stride,
              p.dq_row_stride, lq, D, dQ);
    }
    scatter(p.dk, p.dtype, b * p.dk_batch_stride + sb.start_k * p.dk_row_stride + hk * p.dk_head_stride,
            p.dk_row_stride, lk, D, dK);
    scatter(p.dv, p.dtype, b * p.dv_batch_stride + sb.start_k * p.dv_row_stride + hk * p.dv_head_stride,
            p.dv_row_stride, lk, Dv, dV);
  }
  return {};
}

std::string ref_supports(const AttnParams& p, size_t workspace) {
  if (p.device != Device::kCPU) return "runs on CPU tensors only";
  if (workspace > p.quadratic_workspace_limit)
    return "needs " + std::to_string(workspace >> 20) +
           " MiB of O(seqlen_q·seqlen_k) workspace, above quadratic_workspace_limit (" +
           std::to_string(p.quadratic_workspace_limit >> 20) + " MiB); raise it to run";
  return "";
}

std::string ref_supports_fwd(const FwdParams& p) { return ref_supports(p, ref_fwd_workspace(p)); }
std::string ref_supports_bwd(const BwdParams& p) { return ref_supports(p, ref_bwd_workspace(p)); }

}  // namespace

KernelEntry reference_entry() {
  return {.info = {.name = "cpu_reference", .arch = "cpu", .summary = kSummary,
                   .forward_dropout = true, .backward_dropout = true},
          .auto_priority = 1, .supports_fwd = ref_supports_fwd, .workspace_fwd = ref_fwd_workspace,
          .run_fwd = ref_fwd, .supports_bwd = ref_supports_bwd, .workspace_bwd = ref_bwd_workspace,
          .run_bwd = ref_bwd};
}

}  // namespace flashlab::cpu
