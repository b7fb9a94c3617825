// cpu_flash — FlashAttention-2 on the CPU: the forward and the kernel's registry entry.
// The backward is in flash_backward.cpp; the tiles and helpers both share are in
// flash_common.h, the tile products in gemm.h.
//
// What it adds over cpu_reference, and why:
//   - Tiling. Work is cut into tiles of kBlockM queries × kBlockN keys that live in L2
//     (at head dim 128, 230 KiB per thread in the forward, 330 KiB in the backward). The
//     score matrix S = QKᵀ is never formed: the forward walks the key blocks of one query
//     block, so extra memory is O(tile) per thread instead of cpu_reference's
//     O(seqlen_q · seqlen_k) per head.
//   - Online softmax. Each query keeps a running max m and sum l; a new key block that
//     raises m rescales l and the O accumulator by 2^(m_old − m_new). At the end
//     O /= l and LSE = m + log(l). Scores run in base 2 (Q is pre-scaled by
//     scale·log2(e), FlashAttention's scale_log2 trick), so each probability is one exp2.
//   - Block skipping. Only the key blocks in [mask.block_key_begin, block_key_end) of a
//     query block are visited, and per-element masking runs only on tiles that
//     mask.tile_is_full() says are partly masked.
//   - Any finite scale. Above |scale·log2(e)| = 2^16 pre-scaled fp32 scores would overflow
//     or lose ties, so such calls keep raw dot products in the tiles and apply the scale
//     and the softcap to each score in fp64 (the split path, flash_common.h).
//   - fp32 compute with vectorized inner loops: register-blocked tile products (gemm.h),
//     and exp2 as a branch-free polynomial, since std::exp2 does not vectorize without
//     -ffast-math. The query-side tile is transposed once per task (Qᵀ), so that the
//     score tile Sᵀ = K Qᵀ holds one query per column and the softmax runs across queries.
//
// fp16/bf16 inputs are converted to fp32 when tiles are loaded; outputs are rounded once.
// fp64 inputs stay with cpu_reference (the oracle computes in fp64; a fp32 kernel would
// lose the precision the caller asked for).
//
// Measured: docs/RESULTS.md (CPU) has its times next to cpu_reference and PyTorch's CPU
// SDPA, with the method and the machine.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "common/registry.h"
#include "cpu/flash_common.h"

namespace flashlab::cpu {
namespace {

// The summary `flashlab list` shows; the registry entry closes this file.
constexpr char kSummary[] =
    "FlashAttention-2 on the CPU: fp32 tiles, online softmax, O(tile) memory, backward recomputed "
    "from LSE; fp32/fp16/bf16, head dims up to 512, every mask, GQA, varlen";

void fwd_block(const FwdParams& p, const QTiles& w, const QBlock& q) {
  const int Dv = p.head_dim_v, Dvp = padded(Dv);
  const bool capped = p.mask.softcap > 0.f;
  const bool split = split_scale(p);

  load_q_block(p, q, w.Qt);
  key_ranges(p, q, w.kb, w.ke);
  float* O = w.acc;  // [m, Dvp]
  for (int64_t e = 0; e < int64_t(q.m) * Dvp; ++e) O[e] = 0.f;
  for (int i = 0; i < q.mc; ++i) {
    w.m[i] = kNegInf;
    w.m2[i] = -std::numeric_limits<double>::infinity();
    w.l[i] = 0.f;
  }
  zero_columns(w.V, kBlockN, Dvp, Dv, Dvp);

  for_each_key_block(p, w, q, [&](int j0, int n, bool masked) {
    if (split) {
      split_softmax_step(p, w, q, j0, n);
    } else {
      if (capped) softcap_tile(p.mask, w.St, n, q.mc, kBlockM);
      if (masked) mask_transposed(w.St, n, q.mc, j0, w.kb, w.ke);

      // Online softmax, vectorized across the query columns.
      for (int i = 0; i < q.mc; ++i) w.alpha[i] = w.m[i];  // alpha holds the new max for now
      for (int j = 0; j < n; ++j) {
        const float* s = w.St + int64_t(j) * kBlockM;
#pragma omp simd
        for (int i = 0; i < q.mc; ++i) w.alpha[i] = std::max(w.alpha[i], s[i]);
      }
#pragma omp simd
      for (int i = 0; i < q.mc; ++i) {
        const float m_new = w.alpha[i];
        w.msafe[i] = blend(m_new == kNegInf, 0.f, m_new);
        w.alpha[i] = exp2_fast(w.m[i] - w.msafe[i]);
        w.m[i] = m_new;
        w.l[i] *= w.alpha[i];
      }
      for (int j = 0; j < n; ++j) {
        float* s = w.St + int64_t(j) * kBlockM;
#pragma omp simd
        for (int i = 0; i < q.mc; ++i) {
          s[i] = exp2_fast(s[i] - w.msafe[i]);
          w.l[i] += s[i];
        }
      }
    }
    for (int i = 0; i < q.m; ++i) {
      if (w.alpha[i] == 1.f) continue;
      float* o = O + int64_t(i) * Dvp;
      const float a = w.alpha[i];
#pragma omp simd
      for (int d = 0; d < Dvp; ++d) o[d] *= a;
    }
    // O[i][:] += Σ_j P[i][j] V[j][:], P read from the Pᵀ tile. A masked P is exactly 0, but
    // 0 · NaN is not: a partly masked tile whose V holds a NaN or an Inf skips its masked pairs.
    if (masked && !all_finite(w.V, n, Dv, Dvp))
      gemm_valid_pairs<true>(q.m, Dvp, n, w.St, kBlockM, w.V, Dvp, O, Dvp,
                             [&](int i, int j) { return j0 + j >= w.kb[i] && j0 + j < w.ke[i]; });
    else
      gemm<true, true>(q.m, Dvp, n, w.St, kBlockM, w.V, Dvp, O, Dvp);
  });

  const int64_t o_first = at(p.o_batch_stride, p.o_row_stride, p.o_head_stride, q.b, q.sb.start_q, q.i0, q.h);
  for (int i = 0; i < q.m; ++i) {
    const float l = w.l[i];
    // l == 0: the row saw no key (O = 0), or scored each key it sees −inf (O = Σ 0 · v: 0,
    // or NaN where one of those v is NaN or Inf); LSE = log(0) = −inf. l NaN (a NaN score,
    // or +inf among its scores): O and LSE NaN.
    store_row(p.out, p.dtype, o_first + int64_t(i) * p.o_row_stride, Dv, l == 0.f ? 1.f : 1.f / l,
              O + int64_t(i) * Dvp);
    if (p.lse)
      p.lse[q.b * p.lse_batch_stride + q.h * p.lse_head_stride + q.sb.start_q + q.i0 + i] =
          l == 0.f ? kNegInf : float((split ? w.m2[i] : double(w.m[i])) * kLn2F64 + std::log(double(l)));
  }
}

size_t flash_fwd_workspace(const FwdParams& p) {
  return kAlign + q_slot_bytes(p, false) * threads_for(q_tasks(p), p.num_threads);
}

Status flash_fwd(const FwdParams& p) {
  for_each_q_block(p, q_slot_bytes(p, false), false,
                   [&](const QTiles& w, const QBlock& q) { fwd_block(p, w, q); });
  return {};
}

// ---- registration -----------------------------------------------------------------------

std::string flash_supports(const AttnParams& p) {
  if (p.device != Device::kCPU) return "runs on CPU tensors only";
  if (p.dtype == DType::kF64) return "fp64 inputs run on cpu_reference only";
  if (p.dtype != DType::kF32 && p.dtype != DType::kF16 && p.dtype != DType::kBF16)
    return std::string("dtype ") + to_string(p.dtype) + " is not supported (fp32, fp16, bf16)";
  if (p.head_dim > kMaxHeadDim || p.head_dim_v > kMaxHeadDim)
    return "head_dim " + std::to_string(p.head_dim) + " / head_dim_v " + std::to_string(p.head_dim_v) +
           " above the supported " + std::to_string(kMaxHeadDim);
  return "";
}

std::string flash_supports_fwd(const FwdParams& p) { return flash_supports(p); }
std::string flash_supports_bwd(const BwdParams& p) { return flash_supports(p); }

}  // namespace

KernelEntry flash_entry() {
  return {.info = {"cpu_flash", "cpu", kSummary}, .auto_priority = 10,
          .supports_fwd = flash_supports_fwd, .workspace_fwd = flash_fwd_workspace,
          .run_fwd = flash_fwd, .supports_bwd = flash_supports_bwd,
          .workspace_bwd = flash_bwd_workspace, .run_bwd = flash_bwd};
}

}  // namespace flashlab::cpu
