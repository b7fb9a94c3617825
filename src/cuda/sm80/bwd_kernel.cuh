// The CuTe FlashAttention-2 backward kernels (sm80 path): the layers wired to the CTAs of
// three kernels, and their launch.
//   preprocess  bwd_softmax.cuh     D = rowsum(dO ∘ O), LSE in log2 units, the fp32 dQ
//                                   accumulator zeroed (bwd_workspace.cuh)
//   main        bwd_scheduler.cuh   which keys a CTA owns and which query blocks see them
//               bwd_mainloop.cuh    per query block: S = Q Kᵀ, dP = dO Vᵀ, dV += Pᵀ dO,
//                                   dK += dSᵀ Q, dQ += dS K (fp32 reductions)
//               bwd_softmax.cuh     P recomputed from the LSE, dS = P ∘ (dP − D)
//               (this file)         epilogue: dK and dV once, through shared memory, in the
//                                   output dtype
//   postprocess bwd_epilogue.cuh    the dQ accumulator → the output dtype
// Every compile-time choice comes from the traits (bwd_traits.h).
//
// The algorithm is FlashAttention-2's (Algorithm 2), the same as rung 5's (fa2_simt_bwd) on
// tensor cores: a CTA owns kBlockN keys of one (batch, KV head) and walks the query blocks
// whose rows see them, for every query head of its GQA group, so dK and dV stay private to
// the CTA (summed over the group in registers) and only dQ, shared between key blocks, goes
// through memory: fp32 atomics into the workspace. In deterministic mode the key blocks add
// into each query block's rows in a fixed order (first key block first), taking turns on a
// counter per (batch, head, query block), so the sums are bitwise reproducible.
//
// Scales: S is scaled into log2 units inside the exp2's FMA against LSE·log2 e, as in the
// forward; dS carries softcap's d logit but not the softmax scale, which dK takes once in
// the epilogue and dQ in the postprocess (one multiply per element of dK and dQ instead of
// one per score): dK = scale · dSᵀ Q, dQ = scale · dS K. Dropout regenerates the forward's
// Philox mask per m16n8 fragment (one call each, common/dropout.h): dV sees P ∘ M / (1 − p),
// dS = P ∘ (dP ∘ M / (1 − p) − D).
//
// What it adds over fa2_simt_bwd: the five products on m16n8k16 tensor cores with ldmatrix
// (transposed for the products that reduce over rows or keys), Q/dO double-buffered so that
// the next block's cp.async loads land during this one's products, key blocks of 128 at head
// dims 64 and 128, head dims to 256, dropout, and the deterministic mode.
// Measured on H100 (bf16, B·S = 16k tokens, hidden 2048, SDPA in the same process):
// 1.00–1.07x SDPA's FlashAttention-2 backward (head dim 128, 8k: 320 against 306 TFLOP/s).
// docs/sm80/bwd.md has the tables and what each of three choices adds: dQ's reductions
// spread over dK's k-steps and held there (after()), the MMAs of a k-step m-tile by m-tile
// (mma_k_step), and S's and dP's ldmatrix addresses computed per k-step (gemm_ss_lines).
#pragma once

#include <cute/tensor.hpp>

#include <cmath>
#include <cstdint>

#include "common/constants.h"
#include "common/params.h"
#include "cuda/common.cuh"
#include "cuda/sm80/bwd_epilogue.cuh"
#include "cuda/sm80/bwd_instance.h"
#include "cuda/sm80/bwd_mainloop.cuh"
#include "cuda/sm80/bwd_scheduler.cuh"
#include "cuda/sm80/bwd_softmax.cuh"
#include "cuda/sm80/bwd_traits.h"
#include "cuda/sm80/bwd_workspace.cuh"
#include "cuda/sm80/collective_common.cuh"

namespace flashlab::sm80 {

using namespace cute;

// ---- preprocess and postprocess ----------------------------------------------------------
// grid (ceil(seqlen_q / kBlockM), heads_q, batch): one CTA per query block of the main kernel.
template <class Tr>
__global__ void __launch_bounds__(kRowKernelThreads)
    bwd_preprocess_kernel(const __grid_constant__ BwdParams p, const BwdWorkspace ws) {
  row_stats<Tr>(p, ws);
}

template <class Tr>
__global__ void __launch_bounds__(Tr::kNThreads)
    bwd_postprocess_kernel(const __grid_constant__ BwdParams p, const BwdWorkspace ws) {
  store_dq<Tr>(p, ws);
}

// ---- the kernel --------------------------------------------------------------------------
// grid (ceil(seqlen_k / kBlockN), heads_kv, batch), kNThreads threads, kSmemBytes dynamic.
// Three variants, picked at launch: plain, kSoftcap, and kDropout (which also takes softcap,
// decided at run time), so that the plain kernel carries neither's registers.
template <class Tr, bool kSoftcap, bool kDropout>
__global__ void __launch_bounds__(Tr::kNThreads, 1)
    bwd_kernel(const __grid_constant__ BwdParams p, const BwdWorkspace ws) {
  using Element = typename Tr::Element;
  using BlkM = typename Tr::BlkM;
  using BlkN = typename Tr::BlkN;
  using HeadDim = typename Tr::HeadDim;
  constexpr int kBlockM = Tr::kBlockM, kBlockN = Tr::kBlockN;

  const BwdBlock blk = schedule_bwd<Tr>(p);
  if (blk.keys <= 0) return;  // varlen: this sequence has fewer keys than the grid
  const int tid = int(threadIdx.x);
  const int len_q = blk.seq.len_q, len_k = blk.seq.len_k, j0 = blk.j0;
  const MaskPolicy mask = p.mask;
  const uint32_t opaque_zero = uint32_t(p.batch) >> 31;  // batch >= 0: see after()

  // ---- global tensors: this CTA's keys, and the rows of every query block ----
  const int64_t kv_row0 = blk.seq.start_k + j0;
  auto key_tile = [&](auto* base, int64_t batch_stride, int64_t row_stride, int64_t head_stride) {
    return make_tensor(make_gmem_ptr(base + blk.b * batch_stride + kv_row0 * row_stride +
                                     blk.hk * head_stride),
                       Shape<BlkN, HeadDim>{}, make_stride(row_stride, _1{}));  // (BLK_N, D)
  };
  Tensor gK = key_tile(static_cast<const Element*>(p.k), p.k_batch_stride, p.k_row_stride,
                       p.k_head_stride);  // (BLK_N, D)
  Tensor gV = key_tile(static_cast<const Element*>(p.v), p.v_batch_stride, p.v_row_stride,
                       p.v_head_stride);  // (BLK_N, D)
  Tensor gdK = key_tile(static_cast<Element*>(p.dk), p.dk_batch_stride, p.dk_row_stride,
                        p.dk_head_stride);  // (BLK_N, D)
  Tensor gdV = key_tile(static_cast<Element*>(p.dv), p.dv_batch_stride, p.dv_row_stride,
                        p.dv_head_stride);  // (BLK_N, D)
  // Rows [m·kBlockM, m·kBlockM + kBlockM) of query head h.
  auto row_tile = [&](auto* base, int64_t batch_stride, int64_t row_stride, int64_t head_stride,
                      int h, int m) {
    return make_tensor(
        make_gmem_ptr(base + blk.b * batch_stride +
                      (blk.seq.start_q + int64_t(m) * kBlockM) * row_stride + h * head_stride),
        Shape<BlkM, HeadDim>{}, make_stride(row_stride, _1{}));  // (BLK_M, D)
  };

  // ---- shared tensors ----
  extern __shared__ __align__(128) unsigned char smem[];
  // Q's stages, dO's stages, K, V, P, dS. The Q and dO tensors below are stage 0's; stage s
  // is the same view kQdOStageElems · s elements on (at_stage).
  constexpr int kQdOBytes = Tr::kStagesQdO * Tr::kSmemQdOBytes;
  Element* smem_q = reinterpret_cast<Element*>(smem);
  Element* smem_do = reinterpret_cast<Element*>(smem + kQdOBytes);
  Element* smem_k = reinterpret_cast<Element*>(smem + 2 * kQdOBytes);
  Element* smem_v = reinterpret_cast<Element*>(smem + 2 * kQdOBytes + Tr::kSmemKVBytes);
  Element* smem_p = reinterpret_cast<Element*>(smem + 2 * kQdOBytes + 2 * Tr::kSmemKVBytes);
  Element* smem_ds = reinterpret_cast<Element*>(smem + 2 * kQdOBytes + 2 * Tr::kSmemKVBytes +
                                                Tr::kSmemPdSBytes);
  auto at_stage = [](auto const& t, int stage) {
    return make_tensor(t.data() + stage * Tr::kQdOStageElems, t.layout());
  };
  // The shared tiles as CuTe tensors, one line each, as the forward declares its own.
  Tensor sQ = make_tensor(make_smem_ptr(smem_q), typename Tr::SmemLayoutQdO{});     // (BLK_M, D)
  Tensor sdO = make_tensor(make_smem_ptr(smem_do), typename Tr::SmemLayoutQdO{});   // (BLK_M, D)
  Tensor sQt = make_tensor(make_smem_ptr(smem_q), typename Tr::SmemLayoutQdOt{});   // (D, BLK_M)
  Tensor sdOt = make_tensor(make_smem_ptr(smem_do), typename Tr::SmemLayoutQdOt{}); // (D, BLK_M)
  Tensor sQdOtNoSwizzle =
      make_tensor(make_smem_ptr(smem_q), typename Tr::SmemLayoutQdOtNoSwizzle{});  // (D, BLK_M)
  Tensor sK = make_tensor(make_smem_ptr(smem_k), typename Tr::SmemLayoutKV{});      // (BLK_N, D)
  Tensor sV = make_tensor(make_smem_ptr(smem_v), typename Tr::SmemLayoutKV{});      // (BLK_N, D)
  Tensor sKt = make_tensor(make_smem_ptr(smem_k), typename Tr::SmemLayoutKt{});     // (D, BLK_N)
  Tensor sKtNoSwizzle =
      make_tensor(make_smem_ptr(smem_k), typename Tr::SmemLayoutKtNoSwizzle{});    // (D, BLK_N)
  Tensor sP = make_tensor(make_smem_ptr(smem_p), typename Tr::SmemLayoutPdS{});     // (BLK_M, BLK_N)
  Tensor sdS = make_tensor(make_smem_ptr(smem_ds), typename Tr::SmemLayoutPdS{});   // (BLK_M, BLK_N)
  Tensor sPt = make_tensor(make_smem_ptr(smem_p), typename Tr::SmemLayoutPdSt{});   // (BLK_N, BLK_M)
  Tensor sdSt = make_tensor(make_smem_ptr(smem_ds), typename Tr::SmemLayoutPdSt{}); // (BLK_N, BLK_M)
  Tensor sPdStNoSwizzle =
      make_tensor(make_smem_ptr(smem_p), typename Tr::SmemLayoutPdStNoSwizzle{});  // (BLK_N, BLK_M)
  Tensor sdK = sK;  // dK and dV leave through K's and V's bytes: (BLK_N, D)
  Tensor sdV = sV;

  // ---- global → shared partitions (cp.async) ----
  typename Tr::GmemTiledCopyQKV gmem_copy;
  auto gmem_thr = gmem_copy.get_thread_slice(tid);
  Tensor tQsQ = gmem_thr.partition_D(sQ);     // (CPY, CPY_M, CPY_D)
  Tensor tdOsdO = gmem_thr.partition_D(sdO);  // (CPY, CPY_M, CPY_D)
  Tensor tKsK = gmem_thr.partition_D(sK);     // (CPY, CPY_N, CPY_D)
  Tensor tVsV = gmem_thr.partition_D(sV);     // (CPY, CPY_N, CPY_D)
  // Row coordinates of this thread's chunks, for the guarded (ragged) tiles.
  Tensor tQcQ = gmem_thr.partition_S(make_identity_tensor(Shape<BlkM, HeadDim>{}));   // (CPY, CPY_M, CPY_D)
  Tensor tKVcKV = gmem_thr.partition_S(make_identity_tensor(Shape<BlkN, HeadDim>{}));  // (CPY, CPY_N, CPY_D)

  // Q and dO of (head h, block m) into `stage`, two cp.async groups: Q first (S needs it
  // first).
  auto load_q_do = [&](int h, int m, int stage) {
    Tensor tQsQ_s = at_stage(tQsQ, stage);        // (CPY, CPY_M, CPY_D)
    Tensor tdOsdO_s = at_stage(tdOsdO, stage);    // (CPY, CPY_M, CPY_D)
    const int rows = min(kBlockM, len_q - m * kBlockM);
    Tensor tQgQ = gmem_thr.partition_S(row_tile(static_cast<const Element*>(p.q), p.q_batch_stride,
                                                p.q_row_stride, p.q_head_stride, h, m));
    Tensor tdOgdO = gmem_thr.partition_S(row_tile(static_cast<const Element*>(p.dout),
                                                  p.do_batch_stride, p.do_row_stride,
                                                  p.do_head_stride, h, m));  // (CPY, CPY_M, CPY_D)
    if (rows < kBlockM) {
      copy_rows<true>(gmem_copy, tQgQ, tQsQ_s, tQcQ, rows);
      cp_async_fence();
      copy_rows<true>(gmem_copy, tdOgdO, tdOsdO_s, tQcQ, rows);
    } else {
      copy_rows<false>(gmem_copy, tQgQ, tQsQ_s, tQcQ, rows);
      cp_async_fence();
      copy_rows<false>(gmem_copy, tdOgdO, tdOsdO_s, tQcQ, rows);
    }
    cp_async_fence();
  };

  // ---- tensor-core partitions and shared → register copies (ldmatrix) ----
  // The GEMMs' partitions below read alike and stay spelled out one by one: folded into one
  // helper, the backward's PTX and its register allocation changed.
  // S = Q Kᵀ, dP = dO Vᵀ: (BLK_M, BLK_N)
  typename Tr::TiledMmaSdP mma_sdp;
  auto thr_sdp = mma_sdp.get_thread_slice(tid);
  Tensor tSrQ = thr_sdp.partition_fragment_A(sQ);    // (MMA, MMA_M, MMA_D)
  Tensor tSrK = thr_sdp.partition_fragment_B(sK);    // (MMA, MMA_N, MMA_D)
  Tensor tdPrdO = thr_sdp.partition_fragment_A(sdO); // (MMA, MMA_M, MMA_D)
  Tensor tdPrV = thr_sdp.partition_fragment_B(sV);   // (MMA, MMA_N, MMA_D)
  auto copy_sdp_a = make_tiled_copy_A(typename Tr::SmemCopyAtom{}, mma_sdp);
  auto copy_sdp_b = make_tiled_copy_B(typename Tr::SmemCopyAtom{}, mma_sdp);
  Tensor tSsQ = copy_sdp_a.get_thread_slice(tid).partition_S(sQ);     // (CPY, CPY_M, CPY_D)
  Tensor tdPsdO = copy_sdp_a.get_thread_slice(tid).partition_S(sdO);  // (CPY, CPY_M, CPY_D)
  Tensor tSsK = copy_sdp_b.get_thread_slice(tid).partition_S(sK);     // (CPY, CPY_N, CPY_D)
  Tensor tdPsV = copy_sdp_b.get_thread_slice(tid).partition_S(sV);    // (CPY, CPY_N, CPY_D)
  // This thread's ldmatrix addresses of the first k-step of Q, dO (stage 0), K and V, for
  // gemm_ss_lines; stage s is kQdOStageBytes · s further.
  const uint32_t q_addr0 = cast_smem_ptr_to_uint(&tSsQ(0, 0, 0));
  const uint32_t do_addr0 = cast_smem_ptr_to_uint(&tdPsdO(0, 0, 0));
  const uint32_t k_addr0 = cast_smem_ptr_to_uint(&tSsK(0, 0, 0));
  const uint32_t v_addr0 = cast_smem_ptr_to_uint(&tdPsV(0, 0, 0));
  constexpr uint32_t kQdOStageBytes = uint32_t(Tr::kQdOStageElems * sizeof(Element));
  // S = Q Kᵀ and dP = dO Vᵀ: both operands (rows, D) in smem.
  auto gemm_sdp = [&](auto& acc, auto& rA, auto& rB, auto const& sA, auto const& sB,
                      uint32_t a0, uint32_t b0) {
    if constexpr (Tr::kLineAddressing)
      gemm_ss_lines<Tr::kQdOTileBytes, Tr::kQdOBlockBytes, Tr::kKVTileBytes, Tr::kKVBlockBytes>(
          mma_sdp, acc, rA, rB, a0, b0, copy_sdp_a, copy_sdp_b);
    else
      gemm_ss(mma_sdp, acc, rA, rB, sA, sB, copy_sdp_a, copy_sdp_b);
  };
  // (row, key) of each score this thread holds: (MMA, MMA_M, MMA_N) and as (rows, cols).
  Tensor tScS = thr_sdp.partition_C(make_identity_tensor(Shape<BlkM, BlkN>{}));
  Tensor tScS_rc = make_tensor(tScS.data(), acc_rowcol(tScS.layout()));
  auto smem_copy_pds = make_tiled_copy_C(typename Tr::SmemCopyAtomC{}, mma_sdp);
  auto smem_thr_pds = smem_copy_pds.get_thread_slice(tid);
  Tensor tPsP = smem_thr_pds.partition_D(sP);     // (CPY, CPY_M, CPY_N)
  Tensor tdSsdS = smem_thr_pds.partition_D(sdS);  // (CPY, CPY_M, CPY_N)

  // dV = Pᵀ dO, dK = dSᵀ Q: (BLK_N, D), every operand read transposed
  typename Tr::TiledMmadKV mma_dkv;
  auto thr_dkv = mma_dkv.get_thread_slice(tid);
  Tensor tdVrPt = thr_dkv.partition_fragment_A(sPdStNoSwizzle);   // (MMA, MMA_N, MMA_M)
  Tensor tdVrdOt = thr_dkv.partition_fragment_B(sQdOtNoSwizzle);  // (MMA, MMA_D, MMA_M)
  Tensor tdKrdSt = thr_dkv.partition_fragment_A(sPdStNoSwizzle);  // (MMA, MMA_N, MMA_M)
  Tensor tdKrQt = thr_dkv.partition_fragment_B(sQdOtNoSwizzle);   // (MMA, MMA_D, MMA_M)
  auto copy_dkv_a = make_tiled_copy_A(typename Tr::SmemCopyAtomT{}, mma_dkv);
  auto copy_dkv_b = make_tiled_copy_B(typename Tr::SmemCopyAtomT{}, mma_dkv);
  Tensor tdVsPt = copy_dkv_a.get_thread_slice(tid).partition_S(sPt);    // (CPY, CPY_N, CPY_M)
  Tensor tdKsdSt = copy_dkv_a.get_thread_slice(tid).partition_S(sdSt);  // (CPY, CPY_N, CPY_M)
  Tensor tdVsdOt = copy_dkv_b.get_thread_slice(tid).partition_S(sdOt);  // (CPY, CPY_D, CPY_M)
  Tensor tdKsQt = copy_dkv_b.get_thread_slice(tid).partition_S(sQt);    // (CPY, CPY_D, CPY_M)
  Tensor acc_dk = partition_fragment_C(mma_dkv, Shape<BlkN, HeadDim>{});  // (MMA, MMA_N, MMA_D)
  Tensor acc_dv = partition_fragment_C(mma_dkv, Shape<BlkN, HeadDim>{});  // (MMA, MMA_N, MMA_D)
  clear(acc_dk);
  clear(acc_dv);

  // dQ = dS K: (BLK_M, D), K read transposed
  typename Tr::TiledMmadQ mma_dq;
  auto thr_dq = mma_dq.get_thread_slice(tid);
  Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);          // (MMA, MMA_M, MMA_N)
  Tensor tdQrKt = thr_dq.partition_fragment_B(sKtNoSwizzle);  // (MMA, MMA_D, MMA_N)
  auto copy_dq_a = make_tiled_copy_A(typename Tr::SmemCopyAtom{}, mma_dq);
  auto copy_dq_b = make_tiled_copy_B(typename Tr::SmemCopyAtomT{}, mma_dq);
  Tensor tdQsdS = copy_dq_a.get_thread_slice(tid).partition_S(sdS);  // (CPY, CPY_M, CPY_N)
  Tensor tdQsKt = copy_dq_b.get_thread_slice(tid).partition_S(sKt);  // (CPY, CPY_D, CPY_N)

  constexpr int kRowsS = decltype(size<0>(acc_rowcol(tScS.layout())))::value;
  // Softcap: logit = cap·tanh(s·scale / cap); P's exponent is tanh(·) scaled by cap·log2 e.
  const bool softcap = kSoftcap || (kDropout && mask.softcap > 0.f);
  const float scale_log2 = softcap ? mask.softcap * kLog2e : p.scale_log2;
  const float softcap_pre = softcap ? p.scale / mask.softcap : 0.f;
  const int m_blocks_all = (p.seqlen_q + kBlockM - 1) / kBlockM;  // dq_turn's last extent
  const int h_begin = blk.hk * p.group, h_end = h_begin + p.group;
  // Dropout's P for dV is P ∘ M / (1 − p), known only once the mask is drawn with dP.
  constexpr bool kStorePEarly = Tr::kStorePEarly && !kDropout;

  // ---- mainloop ----
  // K and V once, with the first Q (one cp.async group), then the first dO (another).
  if (blk.m_begin < blk.m_end) {
    Tensor tKgK = gmem_thr.partition_S(gK);  // (CPY, CPY_N, CPY_D)
    Tensor tVgV = gmem_thr.partition_S(gV);  // (CPY, CPY_N, CPY_D)
    if (blk.keys < kBlockN) {
      copy_rows<true>(gmem_copy, tKgK, tKsK, tKVcKV, blk.keys);
      copy_rows<true>(gmem_copy, tVgV, tVsV, tKVcKV, blk.keys);
    } else {
      copy_rows<false>(gmem_copy, tKgK, tKsK, tKVcKV, blk.keys);
      copy_rows<false>(gmem_copy, tVgV, tVsV, tKVcKV, blk.keys);
    }
    load_q_do(h_begin, blk.m_begin, 0);
  }
  int stage = 0;  // the Q/dO buffer of the current block

  for (int h = h_begin; h < h_end && blk.m_begin < blk.m_end; ++h) {
    const int64_t ws_row0 = bwd_ws_row(p, blk.seq, blk.b, h);
    const uint32_t bh = uint32_t(blk.b * p.heads_q + h);  // dropout's (batch, head) index
    for (int m = blk.m_begin; m < blk.m_end; ++m) {
      const RowBlock rb = row_block<Tr>(mask, m, len_q, len_k);
      const int i0 = rb.i0, rows = rb.rows;

      // LSE (log2 units) and D of this thread's rows; rows past the block's end get +inf
      // and 0, so that their P, and with it their dS, is 0.
      float lse_log2[kRowsS], dsum[kRowsS];
      CUTE_UNROLL
      for (int r = 0; r < kRowsS; ++r) {
        const int row = get<0>(tScS_rc(r, 0));
        lse_log2[r] = row < rows ? ws.lse_log2[ws_row0 + i0 + row] : INFINITY;
        dsum[r] = row < rows ? ws.dsum[ws_row0 + i0 + row] : 0.f;
      }

      // S = Q Kᵀ, while dO is still landing.
      Tensor acc_s = partition_fragment_C(mma_sdp, Shape<BlkM, BlkN>{});  // (MMA, MMA_M, MMA_N)
      clear(acc_s);
      cp_async_wait<1>();  // Q (and the first time K, V) have landed ...
      __syncthreads();     // ... for every thread, and every warp is done with the last block
      const bool last_m = m + 1 == blk.m_end;
      const bool has_next = !last_m || h + 1 < h_end;
      const int next_h = last_m ? h + 1 : h, next_m = last_m ? blk.m_begin : m + 1;
      if constexpr (Tr::kStagesQdO == 2) {
        // The next block's Q and dO land in the other buffer during this whole block; on
        // the last block two empty groups keep the wait counts below the same.
        if (has_next) {
          load_q_do(next_h, next_m, stage ^ 1);
        } else {
          cp_async_fence();
          cp_async_fence();
        }
      }
      gemm_sdp(acc_s, tSrQ, tSrK, at_stage(tSsQ, stage), tSsK, q_addr0 + stage * kQdOStageBytes,
               k_addr0);

      // P = 2^(logit·log2 e − LSE·log2 e), recomputed; d logit / d s for softcap.
      Tensor s = make_tensor(acc_s.data(), acc_rowcol(acc_s.layout()));  // (rows, cols)
      Tensor dlogit = make_tensor_like(s);                                // (rows, cols)
      if constexpr (kSoftcap || kDropout) {
        if (softcap) softcap_scores(s, dlogit, softcap_pre);
      }
      probs_from_lse(s, scale_log2, lse_log2);
      if (blk.keys < kBlockN || !mask.tile_is_full(i0, i0 + rows, j0, j0 + kBlockN, len_q, len_k))
        mask_probs(s, tScS_rc, mask, i0, j0, len_q, len_k);
      if constexpr (kStorePEarly) {  // its stores interleave with dP's products
        Tensor rP = round_to<Element>(acc_s);  // (MMA, MMA_M, MMA_N)
        copy(smem_copy_pds, smem_thr_pds.retile_S(rP), tPsP);
      }

      // dP = dO Vᵀ.
      Tensor acc_dp = partition_fragment_C(mma_sdp, Shape<BlkM, BlkN>{});  // (MMA, MMA_M, MMA_N)
      clear(acc_dp);
      cp_async_wait<Tr::kStagesQdO == 2 ? 2 : 0>();  // dO has landed ...
      __syncthreads();  // ... for every thread, and every warp is done with the last dS
      gemm_sdp(acc_dp, tdPrdO, tdPrV, at_stage(tdPsdO, stage), tdPsV,
               do_addr0 + stage * kQdOStageBytes, v_addr0);

      // dS = P ∘ (dP − D) · d logit (the scale comes later), in dP's registers; P for dV
      // (dropped: 0).
      Tensor dp = make_tensor(acc_dp.data(), acc_rowcol(acc_dp.layout()));  // (rows, cols)
      Tensor keep = make_tensor_like(acc_s);                                  // (MMA, MMA_M, MMA_N)
      Tensor keep_rc = make_tensor(keep.data(), acc_rowcol(keep.layout()));   // (rows, cols)
      if constexpr (kDropout) dropout_factors(keep, tScS, p.dropout, bh, i0, j0);
      ds_from_dp<kDropout, kSoftcap || kDropout>(dp, s, keep_rc, dlogit, dsum, softcap);
      if constexpr (!kStorePEarly) {
        Tensor rP = round_to<Element>(acc_s);    // (MMA, MMA_M, MMA_N)
        copy(smem_copy_pds, smem_thr_pds.retile_S(rP), tPsP);
      }
      Tensor rdS = round_to<Element>(acc_dp);  // (MMA, MMA_M, MMA_N)
      copy(smem_copy_pds, smem_thr_pds.retile_S(rdS), tdSsdS);
      __syncthreads();  // P and dS are complete

      // dQ += dS K: this key block's share, added to the fp32 accumulator while dK's product
      // runs. Order: dV = Pᵀ dO, dQ's product, then dK = dSᵀ Q with dQ's reductions spread
      // over its k-steps (and held there by after()), so each step's red.global waits under
      // the next step's MMAs (after dK, or issued in one batch, they stall on their source
      // registers: docs/sm80/bwd.md).
      Tensor acc_dq = partition_fragment_C(mma_dq, Shape<BlkM, HeadDim>{});  // (MMA, MMA_M, MMA_D)
      // This thread's float4s of the block's accumulator chunk: a base address and constant
      // offsets. A ragged block's rows past the end add into the chunk's padding.
      float4* dq_chunk = DqChunk<Tr>::at(p, ws, blk.seq, blk.b, h, i0) + tid;
      constexpr int kQuads = DqChunk<Tr>::kQuadsPerThread;
      constexpr int kDkSteps = decltype(size<2>(tdKrdSt))::value;
      constexpr int kQuadsPerStep = (kQuads + kDkSteps - 1) / kDkSteps;

      gemm_ss(mma_dkv, acc_dv, tdVrPt, tdVrdOt, tdVsPt, at_stage(tdVsdOt, stage), copy_dkv_a,
              copy_dkv_b);
      clear(acc_dq);
      gemm_ss(mma_dq, acc_dq, tdQrdS, tdQrKt, tdQsdS, tdQsKt, copy_dq_a, copy_dq_b);
      int* turn = nullptr;
      if (p.deterministic) {
        // Key blocks take turns on this query block, first key block first.
        turn = ws.dq_turn + (int64_t(blk.b) * p.heads_q + h) * m_blocks_all + m;
        wait_turn(turn, blk.n_block - rb.key_begin / kBlockN, tid);
      }
      // The reductions after k-step k wait for its first accumulator (acc_dk(0), m-tile 0
      // and n-tile 0 of mma_k_step's order): see after().
      gemm_ss(mma_dkv, acc_dk, tdKrdSt, tdKrQt, tdKsdSt, at_stage(tdKsQt, stage), copy_dkv_a,
              copy_dkv_b, [&](int k) {
                add_dq_quads<kQuads, kQuadsPerStep, Tr::kNThreads>(dq_chunk, acc_dq, k, acc_dk(0),
                                                                   opaque_zero);
              });
      if (p.deterministic) pass_turn(turn, tid);
      if constexpr (Tr::kStagesQdO == 1) {
        __syncthreads();  // every warp is done with Q and dO: the next block's may land
        if (has_next) load_q_do(next_h, next_m, 0);
      } else {
        stage ^= 1;
      }
    }
  }
  // ---- epilogue ----
  // dK and dV: registers → shared (K's and V's bytes) → 16-byte global stores; keys that
  // no row sees get 0. The stores are collective_common.cuh's store_rows written out: as a
  // call (or this epilogue as a function in bwd_epilogue.cuh) ptxas allocated the kernel's
  // registers differently (the plain kernel at head dim 128 spilled 24 bytes), so the kernel
  // keeps them inline.
  CUTE_UNROLL
  for (int i = 0; i < size(acc_dk); ++i) acc_dk(i) *= p.scale;  // dS came unscaled
  Tensor rdK = round_to<Element>(acc_dk);  // (MMA, MMA_N, MMA_D)
  Tensor rdV = round_to<Element>(acc_dv);  // (MMA, MMA_N, MMA_D)
  auto smem_copy_dkv = make_tiled_copy_C(typename Tr::SmemCopyAtomC{}, mma_dkv);
  auto smem_thr_dkv = smem_copy_dkv.get_thread_slice(tid);
  __syncthreads();  // every warp's last read of K (the last dQ) is behind us
  copy(smem_copy_dkv, smem_thr_dkv.retile_S(rdK), smem_thr_dkv.partition_D(sdK));
  copy(smem_copy_dkv, smem_thr_dkv.retile_S(rdV), smem_thr_dkv.partition_D(sdV));
  __syncthreads();

  typename Tr::GmemTiledCopydKV gmem_copy_dkv;
  auto gmem_thr_dkv = gmem_copy_dkv.get_thread_slice(tid);
  Tensor tdKVcdKV = gmem_thr_dkv.partition_D(make_identity_tensor(Shape<BlkN, HeadDim>{}));  // (CPY, CPY_N, CPY_D)
  auto store_tile = [&](auto const& s_tile, auto& g_tile) {
    Tensor src = gmem_thr_dkv.partition_S(s_tile);  // (CPY, CPY_N, CPY_D)
    Tensor dst = gmem_thr_dkv.partition_D(g_tile);  // (CPY, CPY_N, CPY_D)
    Tensor staged = make_tensor<Element>(shape(dst));
    copy(gmem_copy_dkv, src, staged);
    CUTE_UNROLL
    for (int n = 0; n < size<1>(dst); ++n)
      if (get<0>(tdKVcdKV(0, n, 0)) < blk.keys) copy(gmem_copy_dkv, staged(_, n, _), dst(_, n, _));
  };
  store_tile(sdK, gdK);
  store_tile(sdV, gdV);
}

// ---- launch ------------------------------------------------------------------------------
template <class Tr, bool kSoftcap, bool kDropout>
Status launch_bwd(const BwdParams& p, const BwdWorkspace& ws) {
  const auto stream = static_cast<cudaStream_t>(p.stream);
  const dim3 row_grid((p.seqlen_q + Tr::kBlockM - 1) / Tr::kBlockM, p.heads_q, p.batch);
  if (p.seqlen_q > 0) {
    bwd_preprocess_kernel<Tr><<<row_grid, kRowKernelThreads, 0, stream>>>(p, ws);
    FL_CUDA_CHECK_LAUNCH();
  }
  if (p.seqlen_k > 0) {
    const auto kernel = bwd_kernel<Tr, kSoftcap, kDropout>;
    if (Tr::kSmemBytes > 48 * 1024)
      FL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         Tr::kSmemBytes));
    const dim3 grid((p.seqlen_k + Tr::kBlockN - 1) / Tr::kBlockN, p.heads_kv, p.batch);
    kernel<<<grid, Tr::kNThreads, Tr::kSmemBytes, stream>>>(p, ws);
    FL_CUDA_CHECK_LAUNCH();
  }
  if (p.seqlen_q > 0) {
    bwd_postprocess_kernel<Tr><<<row_grid, Tr::kNThreads, 0, stream>>>(p, ws);
    FL_CUDA_CHECK_LAUNCH();
  }
  return {};
}

// The per-(dtype, head dim) entry points that dispatch.cu calls (bwd_instance.h); each
// instantiations/bwd_hdim*_*.cu file instantiates one. kernel() and smem_bytes() read as
// FwdInstance's in fwd_kernel.cuh: each names its own pass's kernel and traits.
template <DType kDtype, int kHeadDim>
Status BwdInstance<kDtype, kHeadDim>::run(const BwdParams& p) {
  using Config = BwdConfig<kDtype, kHeadDim>;
  using Tr = typename Config::Traits;
  const BwdWorkspace ws = bwd_workspace(p, Tr::kBlockM);
  if (p.dropout.enabled()) return launch_bwd<Tr, false, true>(p, ws);
  if (p.mask.softcap > 0.f) return launch_bwd<Tr, true, false>(p, ws);
  if constexpr (Config::kHasLargeSmem) {
    using TrL = typename Config::TraitsLargeSmem;
    int smem_optin = 0;
    FL_CUDA_CHECK(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                         p.device_index));
    if (smem_optin >= TrL::kSmemBytes) return launch_bwd<TrL, false, false>(p, ws);
  }
  return launch_bwd<Tr, false, false>(p, ws);
}
template <DType kDtype, int kHeadDim>
size_t BwdInstance<kDtype, kHeadDim>::workspace_bytes(const BwdParams& p) {
  return bwd_workspace_layout(p, BwdConfig<kDtype, kHeadDim>::Traits::kBlockM).total;
}
template <DType kDtype, int kHeadDim>
const void* BwdInstance<kDtype, kHeadDim>::kernel() {
  return reinterpret_cast<const void*>(
      bwd_kernel<typename BwdConfig<kDtype, kHeadDim>::Traits, false, false>);
}
template <DType kDtype, int kHeadDim>
int BwdInstance<kDtype, kHeadDim>::smem_bytes() {
  return BwdConfig<kDtype, kHeadDim>::Traits::kSmemBytes;
}

}  // namespace flashlab::sm80
