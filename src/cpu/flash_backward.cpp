// cpu_flash's backward: FlashAttention-2's Algorithm 2 on the CPU, with the tiles, loads
// and tile products of the forward (flash_common.h, gemm.h).
//
// Nothing of the forward but O and LSE is kept: P = exp(logit − LSE) is recomputed tile
// by tile. Pass 1, one task per (batch, kv head, key block), owns dK and dV of its keys
// (summed over the query heads of a GQA group) and needs no synchronization. dQ sums over
// key blocks that different tasks own, so pass 2, one task per (batch, head, query block),
// recomputes P and dS once more and accumulates dQ: 7 tile GEMMs instead of 5, but no
// locks, no atomics and no per-thread dQ copies (those would be O(threads · total_q · D)).
// On the split path (huge scales, flash_common.h) an fp32 LSE no longer holds a row's sum,
// so a pass 0 over the query blocks first recomputes each row's max and sum as the forward
// does, and passes 1 and 2 read those instead of LSE.
// Tile layouts avoid transposes inside the loops: pass 1 holds Kᵀ and Vᵀ for its keys and
// computes S = Q Kᵀ [queries, keys]; pass 2 holds Qᵀ and dOᵀ and computes Sᵀ = K Qᵀ.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu/flash_common.h"

namespace flashlab::cpu {
namespace {

// The split path's row statistics (see split_scale), written by pass 0 for every
// (batch, head, row) and read by passes 1 and 2; both null on the normal path.
struct RowStats {
  double* m2 = nullptr;    // [heads_q · total_q] row max in base 2 (0 for a row that saw no key)
  float* inv_l = nullptr;  // [heads_q · total_q] 1 / row sum (0 for a row that saw no key)
};

int64_t stat_index(const AttnParams& p, int b, int h, int64_t start_q, int i) {
  return p.varlen ? int64_t(h) * p.total_q + start_q + i : (int64_t(b) * p.heads_q + h) * p.seqlen_q + i;
}

// Row i's softmax as passes 1 and 2 read it. Normal path: LSE in base 2; a row with LSE
// −inf (it saw no key, or scored each key −inf) gets +inf, which makes its P exactly 0.
// Split path: the max and 1/sum of pass 0 (1/sum 0 for such a row).
void load_row_softmax(const BwdParams& p, const RowStats& st, int b, int h, int64_t start_q, int i,
                      float* lse2, double* m2, float* inv_l) {
  if (st.m2) {
    const int64_t e = stat_index(p, b, h, start_q, i);
    *m2 = st.m2[e];
    *inv_l = st.inv_l[e];
    return;
  }
  const float lse = p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + start_q + i];
  *lse2 = lse == kNegInf ? kPosInf : lse * kLog2e;
}

// D_i = dO_i · O_i, with dO_i already converted in `dO` and O_i converted into `row`. On the
// split path the sum runs in the order of the tile GEMM that computes dP (one multiply-add
// per d, from d = 0): a row whose probabilities are one-hot (P = 1 at key w, so O = v_w)
// then gets dP_w − D_i = 0 exactly, as it must, where any rounding difference would be
// multiplied by the huge scale.
float row_dot_out(const BwdParams& p, int b, int h, const SeqBounds& sb, int i, const float* dO,
                  float* row) {
  load_row(p.out, p.dtype, at(p.o_batch_stride, p.o_row_stride, p.o_head_stride, b, sb.start_q, i, h),
           p.head_dim_v, 1.f, row);
  if (split_scale(p)) return dot_like_gemm(dO, row, p.head_dim_v);
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int d = 0; d < p.head_dim_v; ++d) s += dO[d] * row[d];
  return s;
}

// Each query's softmax and D_i in a tile's per-query arrays ([kBlockM] each): lse2 on the
// normal path, m2 and inv_l on the split path.
struct QueryRows {
  const float* lse2;
  const double* m2;
  const float* inv_l;
  const float* drow;
};

// P and dS of one tile, elementwise. X holds logits (base-2, natural when softcapped, raw
// dot products on the split path) and becomes P; Y holds dP and becomes
// dS = P ∘ (dP − D_i) ∘ dlogit · scale. The per-query arrays are indexed by the query,
// which is the row (kQueryIsColumn false: pass 1's [M, N] tiles) or the column (pass 2's
// [N, M] Sᵀ tiles). valid(r, c) says whether an entry is allowed by the mask; it is only
// consulted in the kMasked instantiation, where masked entries of P and dS are exactly 0
// (dP there may be NaN: it is dO · V of a key the row does not see).
template <bool kQueryIsColumn, bool kMasked, bool kCapped, bool kSplit, class Valid>
void p_and_ds(const BwdParams& p, float* X, float* Y, int rows, int cols, int64_t ld,
              const QueryRows& qr, Valid valid) {
  const float scale = p.scale;
  const MaskPolicy mask = p.mask;
  const float* lse2 = qr.lse2;
  const float* drow = qr.drow;
  for (int r = 0; r < rows; ++r) {
    float* x = X + r * ld;
    float* y = Y + r * ld;
#pragma omp simd
    for (int c = 0; c < cols; ++c) {
      const int qi = kQueryIsColumn ? c : r;
      float pr, g = scale;
      if constexpr (kSplit) {
        // The logit in fp64, as pass 0 computed the row max from it; exp2's argument is
        // <= 0 up to rounding, and clamped so that P <= 1/l.
        const double t2 = logit2(mask, p.scale, x[c]);
        g = float(mask.dlogit(t2 * kLn2F64) * double(p.scale));
        pr = exp2_fast(std::min(float(t2 - qr.m2[qi]), 0.f)) * qr.inv_l[qi];
      } else {
        float s = x[c];
        if constexpr (kCapped) {
          // MaskPolicy's logit and dlogit, written out: its dlogit branches on softcap > 0,
          // and a branch stops this loop from vectorizing.
          const float th = tanh_fast(s / mask.softcap);
          g = (1.f - th * th) * scale;
          s = mask.softcap * th * kLog2e;
        }
        pr = exp2_fast(s - lse2[qi]);
      }
      if constexpr (kMasked) pr = blend(valid(r, c), pr, 0.f);
      const float ds = pr * (y[c] - drow[qi]) * g;
      x[c] = pr;
      y[c] = kMasked ? blend(valid(r, c), ds, 0.f) : ds;
    }
  }
}

template <bool kQueryIsColumn, class Valid>
void p_and_ds_dispatch(const BwdParams& p, bool masked, float* X, float* Y, int rows, int cols,
                       int64_t ld, const QueryRows& qr, Valid valid) {
  const bool capped = p.mask.softcap > 0.f;
  if (split_scale(p)) {
    p_and_ds<kQueryIsColumn, true, false, true>(p, X, Y, rows, cols, ld, qr, valid);
  } else if (masked) {
    if (capped) p_and_ds<kQueryIsColumn, true, true, false>(p, X, Y, rows, cols, ld, qr, valid);
    else p_and_ds<kQueryIsColumn, true, false, false>(p, X, Y, rows, cols, ld, qr, valid);
  } else {
    if (capped) p_and_ds<kQueryIsColumn, false, true, false>(p, X, Y, rows, cols, ld, qr, valid);
    else p_and_ds<kQueryIsColumn, false, false, false>(p, X, Y, rows, cols, ld, qr, valid);
  }
}

// First row in [0, len_q) for which pred(i) holds, pred monotone (false...true); len_q if none.
template <class Pred>
int first_row(int len_q, Pred pred) {
  int lo = 0, hi = len_q;
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (pred(mid)) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

// Pass 1: dK, dV of keys [j0, j0 + n) of kv head hk, over every query head of its group
// and every query row that sees one of these keys.
void dkdv_block(const BwdParams& p, const RowStats& st, const KTiles& w, int b, int hk, int j0) {
  const SeqBounds sb = host_seq_bounds(p, b);
  const int lq = sb.len_q, lk = sb.len_k;
  const int D = p.head_dim, Dv = p.head_dim_v, Dp = padded(D), Dvp = padded(Dv);
  const int n = std::min(kBlockN, lk - j0);
  const int nc = round_up(n, kMicroCols);  // key columns computed
  const float kscale = prescale(p);

  // Kᵀ and Vᵀ once per task; columns n..nc zero so that S and dP stay finite there.
  zero_columns(w.Kt, D, kBlockN, n, nc);
  zero_columns(w.Vt, Dv, kBlockN, n, nc);
  const int64_t k_first = at(p.k_batch_stride, p.k_row_stride, p.k_head_stride, b, sb.start_k, j0, hk);
  const int64_t v_first = at(p.v_batch_stride, p.v_row_stride, p.v_head_stride, b, sb.start_k, j0, hk);
  for (int j = 0; j < n; ++j) {
    load_row(p.k, p.dtype, k_first + int64_t(j) * p.k_row_stride, D, kscale, w.Kt + j, kBlockN);
    load_row(p.v, p.dtype, v_first + int64_t(j) * p.v_row_stride, Dv, 1.f, w.Vt + j, kBlockN);
  }
  for (int64_t e = 0; e < int64_t(n) * Dp; ++e) w.dK[e] = 0.f;
  for (int64_t e = 0; e < int64_t(n) * Dvp; ++e) w.dV[e] = 0.f;
  zero_columns(w.Q, kBlockM, Dp, D, Dp);
  zero_columns(w.dO, kBlockM, Dvp, Dv, Dvp);

  // Rows that see a key of the block: key_end(i) > j0 and key_begin(i) < j0 + n; both
  // bounds grow with i, so they form one range.
  const int i_first = first_row(lq, [&](int i) { return p.mask.key_end(i, lq, lk) > j0; });
  const int i_end = first_row(lq, [&](int i) { return p.mask.key_begin(i, lq, lk) >= j0 + n; });

  for (int h = hk * p.group; h < (hk + 1) * p.group; ++h) {
    for (int i0 = i_first; i0 < i_end; i0 += kBlockM) {
      const int m = std::min(kBlockM, i_end - i0);
      const int64_t q_first = at(p.q_batch_stride, p.q_row_stride, p.q_head_stride, b, sb.start_q, i0, h);
      const int64_t do_first = at(p.do_batch_stride, p.do_row_stride, p.do_head_stride, b, sb.start_q, i0, h);
      for (int i = 0; i < m; ++i) {
        load_row(p.q, p.dtype, q_first + int64_t(i) * p.q_row_stride, D, 1.f, w.Q + int64_t(i) * Dp);
        float* dO = w.dO + int64_t(i) * Dvp;
        load_row(p.dout, p.dtype, do_first + int64_t(i) * p.do_row_stride, Dv, 1.f, dO);
        w.Drow[i] = row_dot_out(p, b, h, sb, i0 + i, dO, w.row);
        load_row_softmax(p, st, b, h, sb.start_q, i0 + i, w.lse2 + i, w.m2 + i, w.inv_l + i);
        w.kb[i] = p.mask.key_begin(i0 + i, lq, lk);
        w.ke[i] = p.mask.key_end(i0 + i, lq, lk);
      }
      const int next = std::min(kBlockM, i_end - i0 - m);
      const int64_t o_next = at(p.o_batch_stride, p.o_row_stride, p.o_head_stride, b, sb.start_q, i0 + m, h);
      prefetch_rows(p.q, p.dtype, q_first + int64_t(m) * p.q_row_stride, p.q_row_stride, next, D);
      prefetch_rows(p.dout, p.dtype, do_first + int64_t(m) * p.do_row_stride, p.do_row_stride, next, Dv);
      prefetch_rows(p.out, p.dtype, o_next, p.o_row_stride, next, Dv);
      // S = Q Kᵀ [m, nc] and dP = dO Vᵀ [m, nc].
      gemm<false, false>(m, nc, D, w.Q, Dp, w.Kt, kBlockN, w.S, kBlockN);
      gemm<false, false>(m, nc, Dv, w.dO, Dvp, w.Vt, kBlockN, w.dP, kBlockN);
      const bool masked = !p.mask.tile_is_full(i0, i0 + m, j0, j0 + n, lq, lk);
      const int* kb = w.kb;
      const int* ke = w.ke;
      auto valid = [&](int r, int c) { return (j0 + c >= kb[r]) & (j0 + c < ke[r]); };
      p_and_ds_dispatch<false>(p, masked, w.S, w.dP, m, nc, kBlockN, {w.lse2, w.m2, w.inv_l, w.Drow}, valid);
      // dV += Pᵀ dO and dK += dSᵀ Q: A read transposed from the [m, kBlockN] tiles; masked
      // pairs skipped where a 0 would meet a NaN or an Inf of Q or dO.
      if (masked && !(all_finite(w.Q, m, D, Dp) && all_finite(w.dO, m, Dv, Dvp))) {
        auto key_sees = [&](int j, int i) { return valid(i, j); };
        gemm_valid_pairs<true>(n, Dvp, m, w.S, kBlockN, w.dO, Dvp, w.dV, Dvp, key_sees);
        gemm_valid_pairs<true>(n, Dp, m, w.dP, kBlockN, w.Q, Dp, w.dK, Dp, key_sees);
      } else {
        gemm<true, true>(n, Dvp, m, w.S, kBlockN, w.dO, Dvp, w.dV, Dvp);
        gemm<true, true>(n, Dp, m, w.dP, kBlockN, w.Q, Dp, w.dK, Dp);
      }
    }
  }

  const int64_t dk_first = at(p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride, b, sb.start_k, j0, hk);
  const int64_t dv_first = at(p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride, b, sb.start_k, j0, hk);
  for (int j = 0; j < n; ++j) {
    store_row(p.dk, p.dtype, dk_first + int64_t(j) * p.dk_row_stride, D, 1.f, w.dK + int64_t(j) * Dp);
    store_row(p.dv, p.dtype, dv_first + int64_t(j) * p.dv_row_stride, Dv, 1.f, w.dV + int64_t(j) * Dvp);
  }
}

// Pass 2: dQ of one query block, recomputing P and dS over its key blocks.
void dq_block(const BwdParams& p, const RowStats& st, const QTiles& w, const QBlock& q) {
  const int D = p.head_dim, Dv = p.head_dim_v, Dp = padded(D), Dvp = padded(Dv);

  load_q_block(p, q, w.Qt);
  // dOᵀ, D_i and the softmax per query column; padding columns get D = 0 and P = 0 (LSE
  // +inf, or 1/l = 0).
  for (int d = 0; d < Dv; ++d)
    for (int i = q.m; i < q.mc; ++i) w.dOt[int64_t(d) * kBlockM + i] = 0.f;
  const int64_t do_first = at(p.do_batch_stride, p.do_row_stride, p.do_head_stride, q.b, q.sb.start_q, q.i0, q.h);
  float* dO_row = w.row;  // [Dvp]
  float* o_row = w.row + Dvp;
  for (int i = 0; i < q.m; ++i) {
    load_row(p.dout, p.dtype, do_first + int64_t(i) * p.do_row_stride, Dv, 1.f, dO_row);
    for (int d = 0; d < Dv; ++d) w.dOt[int64_t(d) * kBlockM + i] = dO_row[d];
    w.Drow[i] = row_dot_out(p, q.b, q.h, q.sb, q.i0 + i, dO_row, o_row);
    load_row_softmax(p, st, q.b, q.h, q.sb.start_q, q.i0 + i, w.lse2 + i, w.m2 + i, w.inv_l + i);
  }
  for (int i = q.m; i < q.mc; ++i) {
    w.Drow[i] = 0.f;
    w.lse2[i] = kPosInf;
    w.m2[i] = 0.0;
    w.inv_l[i] = 0.f;
  }
  key_ranges(p, q, w.kb, w.ke);
  float* dQ = w.acc;  // [m, Dp]
  for (int64_t e = 0; e < int64_t(q.m) * Dp; ++e) dQ[e] = 0.f;
  zero_columns(w.K, kBlockN, Dp, D, Dp);

  for_each_key_block(p, w, q, [&](int j0, int n, bool masked) {
    // dPᵀ = V dOᵀ [n, mc].
    gemm<false, false>(n, q.mc, Dv, w.V, Dvp, w.dOt, kBlockM, w.dPt, kBlockM);
    const int* kb = w.kb;
    const int* ke = w.ke;
    auto valid = [&](int r, int c) { return (j0 + r >= kb[c]) & (j0 + r < ke[c]); };
    p_and_ds_dispatch<true>(p, masked, w.St, w.dPt, n, q.mc, kBlockM, {w.lse2, w.m2, w.inv_l, w.Drow}, valid);
    // dQ[i][:] += Σ_j dS[i][j] K[j][:], dS read from the dSᵀ tile; masked pairs skipped
    // where a 0 would meet a NaN or an Inf of K.
    if (masked && !all_finite(w.K, n, D, Dp))
      gemm_valid_pairs<true>(q.m, Dp, n, w.dPt, kBlockM, w.K, Dp, dQ, Dp,
                             [&](int i, int j) { return valid(j, i); });
    else
      gemm<true, true>(q.m, Dp, n, w.dPt, kBlockM, w.K, Dp, dQ, Dp);
  });

  const int64_t dq_first = at(p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride, q.b, q.sb.start_q, q.i0, q.h);
  for (int i = 0; i < q.m; ++i)
    store_row(p.dq, p.dtype, dq_first + int64_t(i) * p.dq_row_stride, D, 1.f, dQ + int64_t(i) * Dp);
}

// Pass 0, split path only: each row's max and sum, computed as the forward computes them.
void stats_block(const BwdParams& p, const RowStats& st, const QTiles& w, const QBlock& q) {
  load_q_block(p, q, w.Qt);
  key_ranges(p, q, w.kb, w.ke);
  for (int i = 0; i < q.mc; ++i) {
    w.m2[i] = -std::numeric_limits<double>::infinity();
    w.l[i] = 0.f;
  }
  for_each_key_block(p, w, q, [&](int j0, int n, bool) { split_softmax_step(p, w, q, j0, n); });
  for (int i = 0; i < q.m; ++i) {
    const int64_t e = stat_index(p, q.b, q.h, q.sb.start_q, q.i0 + i);
    st.m2[e] = w.l[i] == 0.f ? 0.0 : w.m2[i];
    st.inv_l[e] = w.l[i] == 0.f ? 0.f : 1.f / w.l[i];
  }
}

size_t bwd_slot_bytes(const BwdParams& p) { return std::max(q_slot_bytes(p, true), k_slot_bytes(p)); }
int bwd_threads(const BwdParams& p) {
  return std::max(threads_for(k_tasks(p), p.num_threads), threads_for(q_tasks(p), p.num_threads));
}
size_t stats_bytes(const BwdParams& p) {
  return split_scale(p) ? size_t(p.heads_q) * size_t(p.total_q) * (sizeof(double) + sizeof(float)) : 0;
}

}  // namespace

size_t flash_bwd_workspace(const BwdParams& p) {
  return kAlign + bwd_slot_bytes(p) * bwd_threads(p) + stats_bytes(p);
}

Status flash_bwd(const BwdParams& p) {
  const size_t slot = bwd_slot_bytes(p);
  RowStats st;
  if (split_scale(p)) {
    st.m2 = reinterpret_cast<double*>(thread_slot(p.workspace, slot, bwd_threads(p)));
    st.inv_l = reinterpret_cast<float*>(st.m2 + int64_t(p.heads_q) * p.total_q);
    for_each_q_block(p, slot, true, [&](const QTiles& w, const QBlock& q) { stats_block(p, st, w, q); });
  }

  const int64_t nkb = blocks(p.seqlen_k, kBlockN);
  const int64_t ktasks = k_tasks(p);
  // Task t -> (b, kv head, key block), first key blocks first: under a causal mask the
  // most query rows see them.
#pragma omp parallel for num_threads(threads_for(ktasks, p.num_threads)) schedule(dynamic, 1)
  for (int64_t t = 0; t < ktasks; ++t) {
    const int b = int(t / (int64_t(p.heads_kv) * nkb));
    const int hk = int(t / nkb % p.heads_kv);
    const int j0 = int(t % nkb) * kBlockN;
    if (j0 >= host_seq_bounds(p, b).len_k) continue;
    size_t unused = 0;
    const KTiles w = carve_k(p, thread_slot(p.workspace, slot, omp_get_thread_num()), &unused);
    dkdv_block(p, st, w, b, hk, j0);
  }

  for_each_q_block(p, slot, true, [&](const QTiles& w, const QBlock& q) { dq_block(p, st, w, q); });
  return {};
}

}  // namespace flashlab::cpu
