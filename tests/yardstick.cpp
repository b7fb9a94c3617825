// The low-precision yardstick of the correctness rule (docs/DESIGN.md): a straightforward
// attention in the input dtype, rounded where PyTorch's math path rounds (run_lowp), and an
// emulation of FlashAttention-2's own rounding points (run_fa2_emulation) that shows the
// rule is not tighter than what a real FlashAttention achieves.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/dtype.h"
#include "test_util.h"

namespace flashlab::test {

// ---- the low-precision yardstick ----------------------------------------------------------

namespace {

std::vector<float> as_floats(const HostTensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = float(t.get(i));
  return v;
}

// The largest relative error of rounding to dtype (half its spacing at 1).
double unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return 0x1p-8;
    case DType::kF16: return 0x1p-11;
    case DType::kF32: return 0x1p-24;
    default: return 0x1p-53;
  }
}

// The inputs both emulations read, as float copies.
struct Floats {
  std::vector<float> q, k, v, dout;
};
Floats as_floats(const Inputs& in) {
  return {as_floats(in.q), as_floats(in.k), as_floats(in.v), as_floats(in.dout)};
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

// One task of both emulations: batch entry b and kv head hk, with its sequence's rows in
// the packed float copies `floats` (row i of q/dout at packed row start_q + i, heads_q per
// row; key j of k/v at start_k + j, heads_kv per row).
struct Task {
  int b = 0, hk = 0, lq = 0, lk = 0;
  int64_t start_q = 0, start_k = 0;
  int heads_q = 0, heads_kv = 0, D = 0, Dv = 0;
  const Floats* floats = nullptr;
  const float* q(int i, int h) const {
    return floats->q.data() + size_t(((start_q + i) * heads_q + h) * D);
  }
  const float* dout(int i, int h) const {
    return floats->dout.data() + size_t(((start_q + i) * heads_q + h) * Dv);
  }
  const float* k(int j) const {
    return floats->k.data() + size_t(((start_k + j) * heads_kv + hk) * D);
  }
  const float* v(int j) const {
    return floats->v.data() + size_t(((start_k + j) * heads_kv + hk) * Dv);
  }
  // Writes the task's dK and dV rows ([lk, D] and [lk, Dv] sums over the group's heads)
  // into the results, through the emulation's last rounding step.
  template <class Round>
  void store_kv_grads(const std::vector<float>& dk, const std::vector<float>& dv, Round last,
                      Results* r) const {
    for (int j = 0; j < lk; ++j) {
      const int64_t krow = (start_k + j) * heads_kv + hk;
      for (int d = 0; d < D; ++d) r->dk[size_t(krow * D + d)] = last(dk[size_t(j) * D + d], true);
      for (int d = 0; d < Dv; ++d) r->dv[size_t(krow * Dv + d)] = last(dv[size_t(j) * Dv + d], false);
    }
  }
};

// Calls f(task) for every (batch entry, kv head) of the inputs `floats`, in parallel.
template <class F>
void for_each_task(const Problem& p, const Packing& pk, const Floats& floats, F&& f) {
  const int tasks = p.batch * p.heads_kv;
#pragma omp parallel for schedule(dynamic, 1)
  for (int t = 0; t < tasks; ++t) {
    Task k;
    k.b = t / p.heads_kv;
    k.hk = t % p.heads_kv;
    k.start_q = pk.start_q[k.b];
    k.start_k = pk.start_k[k.b];
    k.lq = int(pk.start_q[k.b + 1] - k.start_q);
    k.lk = int(pk.start_k[k.b + 1] - k.start_k);
    k.heads_q = p.heads_q;
    k.heads_kv = p.heads_kv;
    k.D = p.head_dim;
    k.Dv = p.head_dim_v;
    k.floats = &floats;
    f(k);
  }
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
  const int Hq = p.heads_q, G = Hq / p.heads_kv;
  const int D = p.head_dim, Dv = p.head_dim_v;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();

  Floats floats = as_floats(in);
  for (float& e : floats.q) e = rnd(e * q_mul);
  for (float& e : floats.k) e = rnd(e * k_mul);
  // Row r of sequence b, in the packed numbering both layouts share.
  const Packing pk(p);
  Results r = zero_results(p, with_backward);
  // Per task, the largest size of the terms dq's and dk's sums cancel (Results::dq_terms),
  // and the most that O's rounding moves them (Results::dq_from_out).
  std::vector<double> dq_terms(size_t(p.batch) * p.heads_kv, 0.0), dk_terms(dq_terms);
  std::vector<double> dq_from_out(dq_terms), dk_from_out(dq_terms);
  // A backward reads O as stored, in the input dtype, computed by some forward: O_d is off
  // by at most 2u · Σ_j P_j |v_jd| (u the dtype's unit roundoff: P rounded before P·V, then
  // O itself), so D = rowsum(dO ∘ O) by 2u · Σ_j P_j Σ_d |dO_d v_jd|.
  const double two_u = 2 * unit_roundoff(dt);

  for_each_task(p, pk, floats, [&](const Task& t) {
    const int b = t.b, hk = t.hk, lq = t.lq, lk = t.lk;
    const size_t task = size_t(b) * p.heads_kv + hk;
    // Each key's largest |Ks| entry.
    std::vector<float> kmax(with_backward ? lk : 0, 0.f);
    for (int j = 0; j < int(kmax.size()); ++j)
      for (int d = 0; d < D; ++d) kmax[j] = std::max(kmax[j], std::abs(t.k(j)[d]));
    // Per key, two sums over the group's rows: the terms of its dk, and O's rounding in it.
    std::vector<double> key_sums(2 * kmax.size(), 0.0);
    double* key_terms = key_sums.data();
    double* key_from_out = key_terms + kmax.size();
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
        float* urow = U.data() + size_t(i) * lk;
        float* prow = P.data() + size_t(i) * lk;
        std::fill(prow, prow + lk, 0.f);
        const int64_t orow = ((t.start_q + i) * Hq + h) * Dv;
        if (jb >= je) {  // sees no key
          r.lse[size_t(pk.lse_index(b, h, i))] = -std::numeric_limits<double>::infinity();
          continue;
        }
        float m = kNegInf;
        for (int j = jb; j < je; ++j) {
          const float* qi = t.q(i, h);
          const float* kj = t.k(j);
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
        r.lse[size_t(pk.lse_index(b, h, i))] = m + std::log(l);
        for (int j = jb; j < je; ++j) prow[j] = rnd(std::exp(S[j] - m) / l);
        std::fill(acc.begin(), acc.begin() + Dv, 0.f);
        for (int j = jb; j < je; ++j) {
          const float* vj = t.v(j);
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
        const float* prow = P.data() + size_t(i) * lk;
        const float* urow = U.data() + size_t(i) * lk;
        const float* doi = t.dout(i, h);
        float* dsrow = dS.data() + size_t(i) * lk;
        float rowsum = 0.f;
        double d_abs = 0;  // Σ_j |P_j f_j| Σ_d |dO_d v_jd|: D's size, for O's rounding
        for (int j = jb; j < je; ++j) {
          const float* vj = t.v(j);
          float dp = 0.f;
          double dp_abs = 0;
          for (int d = 0; d < Dv; ++d) {
            dp += doi[d] * vj[d];
            dp_abs += std::abs(double(doi[d]) * vj[d]);
          }
          const float f = zf(h, i, j);
          d_abs += std::abs(double(prow[j]) * f) * dp_abs;
          dsrow[j] = f == 1.f ? rnd(dp) : rnd(rnd(dp) * f);  // dP
          rowsum += dsrow[j] * prow[j];
          const float z = f == 1.f ? prow[j] : rnd(prow[j] * f);
          for (int d = 0; d < Dv; ++d) dv_h[size_t(j) * Dv + d] += z * doi[d];
        }
        const float* qi = t.q(i, h);
        float qmax = 0.f;
        for (int d = 0; d < D; ++d) qmax = std::max(qmax, std::abs(qi[d]));
        const double d_err = two_u * d_abs;  // how far O's rounding can move D
        double row_terms = 0, row_from_out = 0;
        for (int j = jb; j < je; ++j) {
          const float dlogit = cap > 0.f ? 1.f - urow[j] * urow[j] : 1.f;
          const double pd = std::abs(double(prow[j]) * dlogit);
          const double term = pd * (std::abs(dsrow[j]) + std::abs(rowsum));
          row_terms += term * kmax[j];
          key_terms[j] += term * qmax;
          row_from_out += pd * d_err * kmax[j];
          key_from_out[j] += pd * d_err * qmax;
          float ds = rnd(prow[j] * (dsrow[j] - rowsum));
          if (cap > 0.f) ds = rnd(rnd(rnd(ds * cap) * dlogit) / cap);
          dsrow[j] = ds;
        }
        dq_terms[task] = std::max(dq_terms[task], std::abs(double(q_mul)) * row_terms);
        dq_from_out[task] = std::max(dq_from_out[task], std::abs(double(q_mul)) * row_from_out);
        std::fill(acc.begin(), acc.begin() + D, 0.f);
        for (int j = jb; j < je; ++j) {
          const float* kj = t.k(j);
          for (int d = 0; d < D; ++d) {
            acc[d] += dsrow[j] * kj[d];
            dk_h[size_t(j) * D + d] += dsrow[j] * qi[d];
          }
        }
        const int64_t qrow = ((t.start_q + i) * Hq + h) * D;
        for (int d = 0; d < D; ++d) r.dq[size_t(qrow + d)] = rnd(rnd(acc[d]) * q_mul);
      }
      for (size_t e = 0; e < dk_h.size(); ++e) dk_sum[e] += rnd(rnd(dk_h[e]) * k_mul);
      for (size_t e = 0; e < dv_h.size(); ++e) dv_sum[e] += rnd(dv_h[e]);
    }
    if (!with_backward) return;
    t.store_kv_grads(dk_sum, dv_sum, [&](float x, bool) { return rnd(x); }, &r);
    for (size_t j = 0; j < kmax.size(); ++j) {
      dk_terms[task] = std::max(dk_terms[task], double(k_mul) * key_terms[j]);
      dk_from_out[task] = std::max(dk_from_out[task], double(k_mul) * key_from_out[j]);
    }
  });
  for (double x : dq_terms) r.dq_terms = std::max(r.dq_terms, x);
  for (double x : dk_terms) r.dk_terms = std::max(r.dk_terms, x);
  for (double x : dq_from_out) r.dq_from_out = std::max(r.dq_from_out, x);
  for (double x : dk_from_out) r.dk_from_out = std::max(r.dk_from_out, x);
  return r;
}

Results run_fa2_emulation(const Problem& p, const Inputs& in, bool with_backward) {
  const DType dt = p.dtype;
  auto rnd = [dt](float x) { return round_to(dt, x); };
  const MaskPolicy mask = mask_of(p);
  const float scale = scale_of(p);
  const DropoutPolicy drop = dropout_of(p);
  const int Hq = p.heads_q, G = Hq / p.heads_kv;
  const int D = p.head_dim, Dv = p.head_dim_v;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();

  const Floats floats = as_floats(in);
  const Packing pk(p);
  Results r = zero_results(p, with_backward);

  for_each_task(p, pk, floats, [&](const Task& t) {
    const int b = t.b, hk = t.hk, lq = t.lq, lk = t.lk;
    // Dropout's mask (0 or 1; FA2 applies 1/(1 − p) with the final normalization).
    auto kept = [&](int h, int i, int j) {
      return !drop.enabled() || drop.keep(uint32_t(b * Hq + h), i, j) ? 1.f : 0.f;
    };
    std::vector<float> S(size_t(lq) * lk), lse(lq), O(size_t(lq) * Dv);
    std::vector<float> dk_acc(size_t(lk) * D, 0.f), dv_acc(size_t(lk) * Dv, 0.f);
    std::vector<float> acc(std::max(D, Dv));

    // run_lowp's loops over heads, rows and key ranges, alike on purpose: the two
    // emulations differ in where they round, and side by side that difference shows.
    for (int h = hk * G; h < (hk + 1) * G; ++h) {
      for (int i = 0; i < lq; ++i) {
        const int jb = mask.key_begin(i, lq, lk), je = mask.key_end(i, lq, lk);
        float* srow = S.data() + size_t(i) * lk;
        float* o = O.data() + size_t(i) * Dv;
        std::fill(o, o + Dv, 0.f);
        if (jb >= je) {
          lse[i] = kNegInf;
          r.lse[size_t(pk.lse_index(b, h, i))] = kNegInf;
          continue;
        }
        float m = kNegInf;
        for (int j = jb; j < je; ++j) {
          float dot = 0.f;
          for (int d = 0; d < D; ++d) dot += t.q(i, h)[d] * t.k(j)[d];
          srow[j] = mask.logit(dot * scale);
          m = std::max(m, srow[j]);
        }
        float l = 0.f;
        std::fill(acc.begin(), acc.begin() + Dv, 0.f);
        for (int j = jb; j < je; ++j) {
          const float e = std::exp(srow[j] - m);
          l += e;
          const float pe = rnd(e) * kept(h, i, j);
          for (int d = 0; d < Dv; ++d) acc[d] += pe * t.v(j)[d];
        }
        lse[i] = m + std::log(l);
        r.lse[size_t(pk.lse_index(b, h, i))] = lse[i];
        const int64_t orow = ((t.start_q + i) * Hq + h) * Dv;
        for (int d = 0; d < Dv; ++d) {
          o[d] = rnd(acc[d] / l * drop.rescale);
          r.out[size_t(orow + d)] = o[d];
        }
      }
      if (!with_backward) continue;
      for (int i = 0; i < lq; ++i) {
        const int jb = mask.key_begin(i, lq, lk), je = mask.key_end(i, lq, lk);
        const float* doi = t.dout(i, h);
        float Di = 0.f;
        for (int d = 0; d < Dv; ++d) Di += doi[d] * O[size_t(i) * Dv + d];
        std::fill(acc.begin(), acc.begin() + D, 0.f);
        for (int j = jb; j < je; ++j) {
          const float t_ij = S[size_t(i) * lk + j];
          const float pij = std::exp(t_ij - lse[i]);
          const float f = kept(h, i, j) * drop.rescale;
          float dp = 0.f;
          for (int d = 0; d < Dv; ++d) {
            dp += doi[d] * t.v(j)[d];
            dv_acc[size_t(j) * Dv + d] += rnd(pij) * f * doi[d];
          }
          dp *= f;
          const float ds = rnd(pij * (dp - Di) * mask.dlogit(t_ij));
          for (int d = 0; d < D; ++d) {
            acc[d] += ds * t.k(j)[d];
            dk_acc[size_t(j) * D + d] += ds * t.q(i, h)[d];
          }
        }
        const int64_t qrow = ((t.start_q + i) * Hq + h) * D;
        for (int d = 0; d < D; ++d) r.dq[size_t(qrow + d)] = rnd(acc[d] * scale);
      }
    }
    if (with_backward)
      t.store_kv_grads(dk_acc, dv_acc, [&](float x, bool is_dk) { return rnd(is_dk ? x * scale : x); }, &r);
  });
  return r;
}

}  // namespace flashlab::test
