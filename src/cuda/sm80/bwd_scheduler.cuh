// The backward's tile scheduler (sm80 path): one CTA per (batch entry, KV head, block of
// kBlockN keys), and for it the range of query blocks whose rows see one of its keys. The
// CTA walks those blocks for every query head of its GQA group, so that dK and dV stay in
// its registers; a key block no row sees walks none and stores zeros.
#pragma once

#include "common/mask.h"
#include "common/params.h"
#include "cuda/common.cuh"

namespace flashlab::sm80 {

// Keys [j0, j0 + keys) of batch entry b, KV head hk; the query blocks [m_begin, m_end) with
// a row that sees one of them (an interval: both ends of a row's key range grow with the row).
struct BwdBlock {
  int b, hk, n_block, j0, keys;
  int m_begin, m_end;
  cuda::SeqInfo seq;
};

// Rows [i0, i1) that see keys [key_begin, key_end) of their sequence, as one range.
struct RowBlock {
  int i0, rows, key_begin, key_end;
};

template <class Tr>
__device__ __forceinline__ RowBlock row_block(const MaskPolicy& mask, int m, int len_q,
                                              int len_k) {
  RowBlock r;
  r.i0 = m * Tr::kBlockM;
  r.rows = min(Tr::kBlockM, len_q - r.i0);
  r.key_begin = mask.block_key_begin(r.i0, r.i0 + r.rows, len_q, len_k);
  r.key_end = mask.block_key_end(r.i0, r.i0 + r.rows, len_q, len_k);
  return r;
}

template <class Tr>
__device__ __forceinline__ BwdBlock schedule_bwd(const BwdParams& p) {
  BwdBlock blk;
  blk.n_block = int(blockIdx.x);
  blk.hk = int(blockIdx.y);
  blk.b = int(blockIdx.z);
  blk.seq = cuda::seq_info(p, blk.b);
  const int len_q = blk.seq.len_q, len_k = blk.seq.len_k;
  blk.j0 = blk.n_block * Tr::kBlockN;
  blk.keys = min(Tr::kBlockN, len_k - blk.j0);
  const int m_blocks = blk.keys > 0 ? (len_q + Tr::kBlockM - 1) / Tr::kBlockM : 0;
  // Both ends of a block's key range grow with the block (MaskPolicy), so the blocks that
  // see a key of [j0, j0 + keys) are those from the first whose range ends past j0 up to the
  // first whose range begins at or past j0 + keys: two binary searches.
  using cuda::first_true;
  blk.m_begin = first_true(0, m_blocks, [&](int m) {
    return row_block<Tr>(p.mask, m, len_q, len_k).key_end > blk.j0;
  });
  blk.m_end = first_true(blk.m_begin, m_blocks, [&](int m) {
    return row_block<Tr>(p.mask, m, len_q, len_k).key_begin >= blk.j0 + blk.keys;
  });
  return blk;
}

}  // namespace flashlab::sm80
