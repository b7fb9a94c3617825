// cpu_flash's shared pieces: tile sizes, element conversions, the branch-free exp2 and tanh
// that let the softmax loops vectorize, the per-thread workspace layout, and the
// query-block helpers that the forward (flash_forward.inc) and the backward
// (flash_backward.inc) both walk. The GEMM micro-kernels are in gemm.h.
//
// Everything here is inline in the namespace of the instruction set this translation unit
// is compiled for (flashlab::cpu::baseline, ::avx2, ...: isa.h), so each variant's copy
// of a helper is its own function, never merged with another variant's by the linker.
#pragma once

#include <omp.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "common/constants.h"
#include "common/dtype.h"
#include "common/mask.h"
#include "common/params.h"
#include "cpu/gemm.h"

namespace flashlab::cpu::FLASHLAB_CPU_ISA {

// ---- tile sizes -------------------------------------------------------------------------

// Chosen by measuring the forward at seqlen 4096, head dim 128 on Zen3: kBlockM 128 is ~5%
// faster than 64 (each K/V block copied into a tile serves more queries) and level with
// 256; kBlockN 32 and 64 are level, 128 slower. The backward is within noise of these
// across M, N in {64, 128, 256}.
constexpr int kBlockM = 128;    // queries per forward / dQ task (columns of the Qᵀ tile)
constexpr int kBlockN = 64;     // keys per step of the key loop, and per dK/dV task
constexpr size_t kAlign = 64;   // every tile starts on a cache line

static_assert(kBlockM % kMicroCols == 0 && kBlockN % kMicroCols == 0,
              "tiles that are a GEMM's B or C need whole micro-kernel column chunks");

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();

constexpr int round_up(int x, int to) { return (x + to - 1) / to * to; }
inline int threads_for(int64_t tasks, int wanted) {
  return int(std::max<int64_t>(1, std::min<int64_t>(tasks, wanted)));
}

// c ? a : b, done on the bit patterns. GCC leaves a float ?: that feeds more arithmetic as
// a branch under -ftrapping-math (the default), and a branch stops vectorization; this
// form becomes a compare and a blend.
inline float blend(bool c, float a, float b) {
  const uint32_t m = 0u - uint32_t(c);
  return std::bit_cast<float>((std::bit_cast<uint32_t>(a) & m) | (std::bit_cast<uint32_t>(b) & ~m));
}

// ---- element conversions ----------------------------------------------------------------

// fp16 bits -> float, branch-free so that a loop of it vectorizes: the exponent and
// mantissa bits, shifted into fp32 position, scaled by 2^(127−15) give every finite value
// exactly (subnormals included); exponent 31 (inf / NaN) is patched by a select.
inline float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7fffu;
  const float finite = std::bit_cast<float>(em << 13) * 0x1p112f;
  const float special = std::bit_cast<float>((em << 13) | 0x7f800000u);
  return std::bit_cast<float>(std::bit_cast<uint32_t>(blend(em >= 0x7c00u, special, finite)) | sign);
}

inline float bf16_to_float(uint16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }

// dst[c · dst_stride] = scale · row[c] for c < n, where row starts at element `offset` of
// `base`. The dtype switch sits outside the loops so each loop is one plain conversion.
inline void load_row(const void* base, DType dt, int64_t offset, int n, float scale, float* dst,
              int64_t dst_stride = 1) {
  switch (dt) {
    case DType::kF32: {
      const float* s = static_cast<const float*>(base) + offset;
#pragma omp simd
      for (int c = 0; c < n; ++c) dst[c * dst_stride] = scale * s[c];
      return;
    }
    case DType::kF16: {
      const uint16_t* s = static_cast<const uint16_t*>(base) + offset;
#pragma omp simd
      for (int c = 0; c < n; ++c) dst[c * dst_stride] = scale * half_to_float(s[c]);
      return;
    }
    case DType::kBF16: {
      const uint16_t* s = static_cast<const uint16_t*>(base) + offset;
#pragma omp simd
      for (int c = 0; c < n; ++c) dst[c * dst_stride] = scale * bf16_to_float(s[c]);
      return;
    }
    default: return;  // supports() admits only the three above
  }
}

// row[c] = mul · src[c] rounded to dt, for c < n.
inline void store_row(void* base, DType dt, int64_t offset, int n, float mul, const float* src) {
  switch (dt) {
    case DType::kF32: {
      float* d = static_cast<float*>(base) + offset;
#pragma omp simd
      for (int c = 0; c < n; ++c) d[c] = mul * src[c];
      return;
    }
    case DType::kF16: {
      uint16_t* d = static_cast<uint16_t*>(base) + offset;
      for (int c = 0; c < n; ++c) d[c] = float_to_half_bits(mul * src[c]);
      return;
    }
    case DType::kBF16: {
      uint16_t* d = static_cast<uint16_t*>(base) + offset;
      for (int c = 0; c < n; ++c) d[c] = float_to_bf16_bits(mul * src[c]);
      return;
    }
    default: return;
  }
}

// Adds rows [0, rows) of a tensor (first row at element `offset`, each `width` elements)
// to the lines `pf` brings into cache (gemm.h).
inline void prefetch_rows(Prefetcher& pf, const void* base, DType dt, int64_t offset, int64_t row_stride,
                          int rows, int width) {
  const int64_t es = dt == DType::kF32 ? 4 : 2;  // the three dtypes cpu_flash supports
  pf.add(static_cast<const char*>(base) + offset * es, row_stride * es, rows, width * es);
}

// ---- exp2 -------------------------------------------------------------------------------

// 2^x for x <= 127; 0 for x <= −127, so −inf gives exactly 0 (a masked score, or a
// running max that was still −inf). Branch-free arithmetic, so loops calling it vectorize
// (a conditional around the polynomial would not if-convert under -ftrapping-math). x is
// split as n + f with n = round(x) (the 1.5·2^23 trick) and |f| <= 1/2; 2^f = e^(f·ln2)
// comes from its Taylor series to degree 7, whose truncation error (ln2/2)^8/8! < 6e-9 is
// below fp32 rounding, and 2^n from the exponent bits, where n = −127 gives the bit pattern
// of +0 (results below 2^−126 flush to 0; beside a sum >= 1 they are noise).
inline float exp2_fast(float x) {
  constexpr float kRound = 12582912.f;  // 1.5 · 2^23: adding it rounds to an integer
  constexpr double c1 = kLn2F64, c2 = c1 * kLn2F64 / 2, c3 = c2 * kLn2F64 / 3,
                   c4 = c3 * kLn2F64 / 4, c5 = c4 * kLn2F64 / 5, c6 = c5 * kLn2F64 / 6,
                   c7 = c6 * kLn2F64 / 7;
  const float lo = blend(x < -127.f, -127.f, x);
  const float xc = blend(lo > 127.f, 127.f, lo);
  const float t = xc + kRound;
  const float f = xc - (t - kRound);
  const int32_t n = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kRound);
  float poly = float(c7);
  poly = poly * f + float(c6);
  poly = poly * f + float(c5);
  poly = poly * f + float(c4);
  poly = poly * f + float(c3);
  poly = poly * f + float(c2);
  poly = poly * f + float(c1);
  poly = poly * f + 1.f;
  return poly * std::bit_cast<float>(uint32_t(n + 127) << 23);
}

#if defined(__AVX512F__)
// exp2_fast() on 16 lanes, with the same result in every lane: the same clamps (max and min
// keep a NaN), n = round(x) by vrndscaleps (round to nearest even, as the 1.5 · 2^23 trick),
// the same polynomial, and 2^n applied by vscalefps, exact for n >= −126; n = −127 gives 0
// (the masked lanes), as exp2_fast's +0 bit pattern does. 13 instructions, against 20 for
// the vectorized exp2_fast: the softmax's exp pass is the forward's largest cost after
// the tile products.
inline __m512 exp2_fast16(__m512 x) {
  constexpr double c1 = kLn2F64, c2 = c1 * kLn2F64 / 2, c3 = c2 * kLn2F64 / 3,
                   c4 = c3 * kLn2F64 / 4, c5 = c4 * kLn2F64 / 5, c6 = c5 * kLn2F64 / 6,
                   c7 = c6 * kLn2F64 / 7;
  // The masked forms with every lane set: the plain ones pass GCC 12 an undefined vector,
  // which -Wmaybe-uninitialized reports.
  constexpr __mmask16 all = 0xffff;
  x = _mm512_mask_max_ps(x, all, _mm512_set1_ps(-127.f), x);
  x = _mm512_mask_min_ps(x, all, _mm512_set1_ps(127.f), x);
  const __m512 n = _mm512_mask_roundscale_ps(x, all, x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 poly = _mm512_set1_ps(float(c7));
  poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(float(c6)));
  poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(float(c5)));
  poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(float(c4)));
  poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(float(c3)));
  poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(float(c2)));
  poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(float(c1)));
  poly = _mm512_fmadd_ps(poly, f, _mm512_set1_ps(1.f));
  const __mmask16 normal = _mm512_cmp_ps_mask(n, _mm512_set1_ps(-127.f), _CMP_NLE_UQ);
  return _mm512_maskz_scalef_ps(normal, poly, n);
}
#endif

// tanh(u), branch-free so that loops calling it vectorize (std::tanh does not, and made
// softcapped calls ~2.7x slower than plain ones). |u| < 1/4: the odd Taylor series to u^9,
// whose truncation (1382/155925)·u^11 is below 2.1e-9; elsewhere 1 − 2/(e^(2|u|) + 1),
// whose cancellation costs at most ~2 ulp at |u| = 1/4 and nothing as |u| grows (exp2_fast
// clamps at 2^127, giving exactly ±1). Both are computed and one is blended in.
inline float tanh_fast(float u) {
  const float a = std::fabs(u), a2 = a * a;
  const float series =
      a * (1.f + a2 * (-1.f / 3 + a2 * (2.f / 15 + a2 * (-17.f / 315 + a2 * (62.f / 2835)))));
  const float exact = 1.f - 2.f / (exp2_fast(a * (2 * kLog2e)) + 1.f);
  return std::copysign(blend(a < 0.25f, series, exact), u);
}

// MaskPolicy::logit with softcap on, through tanh_fast: cap · tanh(s / cap).
inline float capped_logit(const MaskPolicy& mask, float s) {
  return mask.softcap * tanh_fast(s / mask.softcap);
}

// ---- workspace --------------------------------------------------------------------------

// Carves one thread's slot into tiles. With base == nullptr it only measures, so the
// workspace_* functions and the kernels share one layout.
class Arena {
 public:
  explicit Arena(char* base) : base_(base) {}
  template <class T>
  T* take(int64_t count) {
    T* r = base_ ? reinterpret_cast<T*>(base_ + used_) : nullptr;
    used_ += (size_t(count) * sizeof(T) + kAlign - 1) / kAlign * kAlign;
    return r;
  }
  size_t used() const { return used_; }

 private:
  char* base_;
  size_t used_ = 0;
};

// Slot i of the caller's workspace, aligned to kAlign (workspace sizes include kAlign
// bytes of slack for this).
inline char* thread_slot(void* workspace, size_t slot_bytes, int i) {
  const uintptr_t a = (reinterpret_cast<uintptr_t>(workspace) + kAlign - 1) / kAlign * kAlign;
  return reinterpret_cast<char*>(a) + slot_bytes * size_t(i);
}

// Widths of the tiles whose rows feed a GEMM as B or C: padded to whole micro-kernel
// column chunks (the padding is zero-filled, so it never carries NaN or denormals).
inline int padded(int d) { return round_up(d, kMicroCols); }

// The per-query-row vectors both kinds of task keep, [kBlockM] each, carved once by
// carve_rows for QTiles and KTiles alike.
struct RowTiles {
  float* lse2;   // LSE · log2(e) (backward)
  double* m2;    // split path: running max (base 2, fp64); in the backward the row's max
  float* inv_l;  // split path, backward: 1 / row sum (0 for a row that saw no key)
  float* Drow;   // rowsum(dO ∘ O) (backward)
  int* kb;       // first key each query row sees
  int* ke;       // one past its last key
};

inline void carve_rows(Arena& a, RowTiles& t) {
  t.lse2 = a.take<float>(kBlockM);
  t.m2 = a.take<double>(kBlockM);
  t.inv_l = a.take<float>(kBlockM);
  t.Drow = a.take<float>(kBlockM);
  t.kb = a.take<int>(kBlockM);
  t.ke = a.take<int>(kBlockM);
}

// One thread's tiles in the forward and in dQ (pass 2) tasks: queries are the columns of
// the transposed tiles, keys the rows.
struct QTiles : RowTiles {
  float* Qt;     // [D, kBlockM]   transposed Q block, pre-scaled
  float* dOt;    // [Dv, kBlockM]  transposed dO block (backward only)
  float* K;      // [kBlockN, Dp]  K block, row-major (columns D..Dp zero in pass 2, where
                 //                it is also B of dQ += dS K)
  float* V;      // [kBlockN, Dvp] V block, row-major (columns Dv..Dvp zero in the forward,
                 //                where it is B of O += P V)
  float* St;     // [kBlockN, kBlockM] Sᵀ: logits, then Pᵀ
  float* dPt;    // [kBlockN, kBlockM] dPᵀ, then dSᵀ (backward only)
  float* acc;    // [kBlockM, Dvp] O accumulator (forward) or [kBlockM, Dp] dQ (backward)
  float* m;      // [kBlockM] running max (base-2 units)
  float* l;      // [kBlockM] running sum
  float* alpha;  // [kBlockM] rescale factor of this key block
  float* msafe;  // [kBlockM] max to subtract: 0 while the max is still −inf
  double* m2safe;  // [kBlockM] split path: max to subtract (0 while the max is still −inf)
  float* row;    // [2, Dvp] one converted row of dO and one of O (backward)
};

inline QTiles carve_q(const AttnParams& p, char* base, bool backward, size_t* bytes) {
  const int D = p.head_dim, Dv = p.head_dim_v, Dp = padded(D), Dvp = padded(Dv);
  Arena a(base);
  QTiles t{};
  t.Qt = a.take<float>(int64_t(D) * kBlockM);
  t.dOt = backward ? a.take<float>(int64_t(Dv) * kBlockM) : nullptr;
  t.K = a.take<float>(int64_t(kBlockN) * Dp);
  t.V = a.take<float>(int64_t(kBlockN) * Dvp);
  t.St = a.take<float>(int64_t(kBlockN) * kBlockM);
  t.dPt = backward ? a.take<float>(int64_t(kBlockN) * kBlockM) : nullptr;
  t.acc = a.take<float>(int64_t(kBlockM) * (backward ? Dp : Dvp));
  t.m = a.take<float>(kBlockM);
  t.l = a.take<float>(kBlockM);
  t.alpha = a.take<float>(kBlockM);
  t.msafe = a.take<float>(kBlockM);
  t.m2safe = a.take<double>(kBlockM);
  t.row = a.take<float>(2 * int64_t(Dvp));
  carve_rows(a, t);
  *bytes = a.used();
  return t;
}

// One thread's tiles in dK/dV (pass 1) tasks: keys are the columns of the transposed
// tiles, queries the rows.
struct KTiles : RowTiles {
  float* Kt;    // [D, kBlockN]   transposed K block, pre-scaled (columns n..kBlockN zero)
  float* Vt;    // [Dv, kBlockN]  transposed V block
  float* dK;    // [kBlockN, Dp]  dK accumulator
  float* dV;    // [kBlockN, Dvp] dV accumulator
  float* Q;     // [kBlockM, Dp]  Q block, row-major (columns D..Dp zero)
  float* dO;    // [kBlockM, Dvp] dO block, row-major (columns Dv..Dvp zero)
  float* S;     // [kBlockM, kBlockN] logits, then P
  float* dP;    // [kBlockM, kBlockN] dP, then dS
  float* row;   // [Dvp] one converted row of O
};

inline KTiles carve_k(const AttnParams& p, char* base, size_t* bytes) {
  const int D = p.head_dim, Dv = p.head_dim_v, Dp = padded(D), Dvp = padded(Dv);
  Arena a(base);
  KTiles t{};
  t.Kt = a.take<float>(int64_t(D) * kBlockN);
  t.Vt = a.take<float>(int64_t(Dv) * kBlockN);
  t.dK = a.take<float>(int64_t(kBlockN) * Dp);
  t.dV = a.take<float>(int64_t(kBlockN) * Dvp);
  t.Q = a.take<float>(int64_t(kBlockM) * Dp);
  t.dO = a.take<float>(int64_t(kBlockM) * Dvp);
  t.S = a.take<float>(int64_t(kBlockM) * kBlockN);
  t.dP = a.take<float>(int64_t(kBlockM) * kBlockN);
  t.row = a.take<float>(Dvp);
  carve_rows(a, t);
  *bytes = a.used();
  return t;
}

inline size_t q_slot_bytes(const AttnParams& p, bool backward) {
  size_t bytes = 0;
  carve_q(p, nullptr, backward, &bytes);
  return bytes;
}
inline size_t k_slot_bytes(const AttnParams& p) {
  size_t bytes = 0;
  carve_k(p, nullptr, &bytes);
  return bytes;
}

inline int64_t blocks(int len, int block) { return (int64_t(len) + block - 1) / block; }
// Tasks of the forward and of pass 2: (batch, head, query block), over the longest sequence.
inline int64_t q_tasks(const AttnParams& p) { return int64_t(p.batch) * p.heads_q * blocks(p.seqlen_q, kBlockM); }
// Tasks of pass 1: (batch, kv head, key block).
inline int64_t k_tasks(const AttnParams& p) { return int64_t(p.batch) * p.heads_kv * blocks(p.seqlen_k, kBlockN); }

// ---- shared pieces of the query-block tasks ---------------------------------------------

// The rows [i0, i0 + m) of one (batch, head) that a query-block task owns.
struct QBlock {
  int b, h, hk;
  SeqBounds sb;
  int i0, m, mc;  // first row, rows, rows rounded up to kMicroCols (columns of Qᵀ computed)
};

// Element offset of row i of head h in a tensor with the given strides.
inline int64_t at(int64_t batch_stride, int64_t row_stride, int64_t head_stride, int b, int64_t start,
           int64_t i, int h) {
  return b * batch_stride + (start + i) * row_stride + h * head_stride;
}

// Task t -> (b, h, query block). Within a head the last query blocks come first: under a
// causal mask they see the most keys, and dynamic scheduling balances best when the
// longest tasks start first.
inline bool decode_q_task(const AttnParams& p, int64_t t, QBlock* q) {
  const int64_t nqb = blocks(p.seqlen_q, kBlockM);
  q->b = int(t / (int64_t(p.heads_q) * nqb));
  q->h = int(t / nqb % p.heads_q);
  q->hk = q->h / p.group;
  q->sb = host_seq_bounds(p, q->b);
  q->i0 = int(nqb - 1 - t % nqb) * kBlockM;
  if (q->i0 >= q->sb.len_q) return false;
  q->m = std::min(kBlockM, q->sb.len_q - q->i0);
  q->mc = round_up(q->m, kMicroCols);
  return true;
}

// Key range of each query column: kb/ke for the rows of the block; the padding columns
// m..mc get the empty range [0, 0), so masking always removes them.
inline void key_ranges(const AttnParams& p, const QBlock& q, int* kb, int* ke) {
  for (int i = 0; i < q.mc; ++i) {
    const bool row = i < q.m;
    kb[i] = row ? p.mask.key_begin(q.i0 + i, q.sb.len_q, q.sb.len_k) : 0;
    ke[i] = row ? p.mask.key_end(q.i0 + i, q.sb.len_q, q.sb.len_k) : 0;
  }
}

// Loads the transposed, scaled query-side tile Xt[d][i] = scale · X[i0 + i][d], zeroing the
// padding columns m..mc so that they stay finite.
inline void load_transposed_rows(const void* base, DType dt, int64_t first, int64_t row_stride,
                          const QBlock& q, int width, float scale, float* Xt) {
  // All rows' lines requested up front: the copy below scatters each row into a column of
  // Xt, too many instructions per row for the core to run ahead to the next rows' misses.
  Prefetcher rows;
  prefetch_rows(rows, base, dt, first, row_stride, q.m, width);
  rows.finish();
  for (int d = 0; d < width; ++d)
    for (int i = q.m; i < q.mc; ++i) Xt[int64_t(d) * kBlockM + i] = 0.f;
  for (int i = 0; i < q.m; ++i)
    load_row(base, dt, first + int64_t(i) * row_stride, width, scale, Xt + i, kBlockM);
}

// Zero columns [from, to) of rows [0, rows) of a row-major tile with leading dim ld.
inline void zero_columns(float* X, int rows, int64_t ld, int from, int to) {
  for (int r = 0; r < rows; ++r)
    for (int c = from; c < to; ++c) X[r * ld + c] = 0.f;
}

// Softcap on a tile of natural-unit logits: t = logit(s), then to base 2.
inline void softcap_tile(const MaskPolicy& mask, float* X, int rows, int cols, int64_t ld) {
  for (int r = 0; r < rows; ++r) {
    float* x = X + r * ld;
#pragma omp simd
    for (int c = 0; c < cols; ++c) x[c] = capped_logit(mask, x[c]) * kLog2e;
  }
}

// Sets the disallowed (key row j, query column i) entries of a Sᵀ tile to −inf.
inline void mask_transposed(float* St, int n, int mc, int j0, const int* kb, const int* ke) {
  for (int j = 0; j < n; ++j) {
    const int key = j0 + j;
    float* s = St + int64_t(j) * kBlockM;
#pragma omp simd
    for (int i = 0; i < mc; ++i) s[i] = blend((key >= kb[i]) & (key < ke[i]), s[i], kNegInf);
  }
}

// Element offsets of key j0's row in the block's K and V heads.
inline int64_t k_row(const AttnParams& p, const QBlock& q, int j0) {
  return at(p.k_batch_stride, p.k_row_stride, p.k_head_stride, q.b, q.sb.start_k, j0, q.hk);
}
inline int64_t v_row(const AttnParams& p, const QBlock& q, int j0) {
  return at(p.v_batch_stride, p.v_row_stride, p.v_head_stride, q.b, q.sb.start_k, j0, q.hk);
}

// Keys [j0, j0 + n) of the block's K and V heads into K [n, Dp] and V [n, Dvp] (fp32).
inline void load_kv_block(const AttnParams& p, const QBlock& q, int j0, int n, float* K, float* V) {
  const int D = p.head_dim, Dv = p.head_dim_v, Dp = padded(D), Dvp = padded(Dv);
  const int64_t k_first = k_row(p, q, j0), v_first = v_row(p, q, j0);
  for (int j = 0; j < n; ++j) {
    load_row(p.k, p.dtype, k_first + int64_t(j) * p.k_row_stride, D, 1.f, K + int64_t(j) * Dp);
    load_row(p.v, p.dtype, v_first + int64_t(j) * p.v_row_stride, Dv, 1.f, V + int64_t(j) * Dvp);
  }
}

// ---- huge scales ------------------------------------------------------------------------

// Scores normally come out of the tile GEMM already scaled (the query-side or key-side tile
// is multiplied by scale·log2(e) as it is loaded), and the backward recomputes each
// probability as exp2(s − LSE·log2(e)). Both need |scale·log2(e)| well inside fp32: above
// 2^16, scores of unit-size inputs are beyond 2^16, where an fp32 ulp is a sizeable part of
// one unit of log2 (and scale·log2(e) itself overflows fp32 above 2.36e38), so pre-scaled
// scores would overflow or lose the ties between keys, and an fp32 LSE = m + log(l) no
// longer holds log(l). Such calls take the split path: tiles hold raw dot products q·k, the
// scale, the softcap and log2(e) are applied to each one in fp64 (logit2), the row max is
// kept in fp64, and the backward recomputes every row's max and sum (its pass 0) instead
// of reading them from LSE. That costs time only on calls that need it: at batch 1,
// 2 heads, seqlen 2048, head dim 128, fp32, one thread of an AMD EPYC (AVX-512), the split
// path took 113 ms for the forward (50 ms pre-scaled), 490 ms for the backward (176 ms),
// and 278 ms for a softcapped forward, whose tanh runs in fp64 (thread CPU time, best of 3).
constexpr double kMaxPrescale = 65536.0;

inline bool split_scale(const AttnParams& p) {
  return !(std::fabs(double(p.scale) * kLog2eF64) <= kMaxPrescale);
}

// The base-2 logit of raw dot product r: log2(e) · logit(scale · r), in fp64. Never
// inlined: the split path compares and subtracts its results, so each must be the same
// rounded double wherever it is computed, and an inlined copy could have its last multiply
// fused into the caller's subtraction (GCC contracts a·b − c into an FMA across
// statements). One unrounded product next to its rounded twin differs by up to half an
// ulp of 2^128 — enough to make a tied key's probability 0 or 2^127.
[[gnu::noinline]] inline double logit2(const MaskPolicy& mask, double scale, float r) {
  return kLog2eF64 * mask.logit(scale * double(r));
}

// What the query-side (or, in the backward's pass 1, key-side) tile is multiplied by as it
// is loaded: scale·log2(e), so that scores come out in base 2, or with softcap the plain
// scale (the cap's tanh needs natural units; softcap_tile converts to base 2 after it).
// The split path keeps raw dot products.
inline float prescale(const AttnParams& p) {
  if (split_scale(p)) return 1.f;
  return p.mask.softcap > 0.f ? p.scale : p.scale_log2;
}

// The block's transposed, pre-scaled query tile Qᵀ [D, kBlockM].
inline void load_q_block(const AttnParams& p, const QBlock& q, float* Qt) {
  load_transposed_rows(p.q, p.dtype,
                       at(p.q_batch_stride, p.q_row_stride, p.q_head_stride, q.b, q.sb.start_q, q.i0, q.h),
                       p.q_row_stride, q, p.head_dim, prescale(p), Qt);
}

// One step of a query block's key loop: keys [j0, j0 + n) of its K and V heads into the
// K and V tiles, and the score tile Sᵀ[j][i] = k_j · q_i [n, mc] (the K block is A, Qᵀ is
// B), which prefetches the first half of `next` (the next block's K rows). True when the
// tile is partly masked, so that per-element masking must run.
inline bool score_tile(const AttnParams& p, const QTiles& w, const QBlock& q, int j0, int n, Prefetcher& next) {
  load_kv_block(p, q, j0, n, w.K, w.V);
  gemm<false, false>(n, q.mc, p.head_dim, w.K, padded(p.head_dim), w.Qt, kBlockM, w.St, kBlockM,
                     {.pf = &next, .pf_rows = next.left() / 2});
  return !p.mask.tile_is_full(q.i0, q.i0 + q.m, j0, j0 + n, q.sb.len_q, q.sb.len_k);
}

// The online softmax of one key block on the split path: the Sᵀ tile [n, mc] holds raw dot
// products and becomes Pᵀ (exactly 0 where masked); m2 and l are each query column's running
// max (base 2, fp64) and sum, alpha the factor that rescales its O row and l.
inline void split_softmax_step(const AttnParams& p, const QTiles& w, const QBlock& q, int j0, int n) {
  const double scale = p.scale;
  auto valid = [&](int j, int i) { return j0 + j >= w.kb[i] && j0 + j < w.ke[i]; };
  for (int i = 0; i < q.mc; ++i) w.m2safe[i] = w.m2[i];  // the new max, for now
  for (int j = 0; j < n; ++j) {
    const float* s = w.St + int64_t(j) * kBlockM;
    for (int i = 0; i < q.mc; ++i)
      if (valid(j, i)) w.m2safe[i] = std::max(w.m2safe[i], logit2(p.mask, scale, s[i]));
  }
  for (int i = 0; i < q.mc; ++i) {
    const double m_new = w.m2safe[i];
    w.m2safe[i] = m_new == -std::numeric_limits<double>::infinity() ? 0.0 : m_new;
    w.alpha[i] = exp2_fast(float(w.m2[i] - w.m2safe[i]));
    w.m2[i] = m_new;
    w.l[i] *= w.alpha[i];
  }
  for (int j = 0; j < n; ++j) {
    float* s = w.St + int64_t(j) * kBlockM;
    for (int i = 0; i < q.mc; ++i) {
      s[i] = valid(j, i) ? exp2_fast(float(logit2(p.mask, scale, s[i]) - w.m2safe[i])) : 0.f;
      w.l[i] += s[i];
    }
  }
}

// A query block's key loop: for each block of keys [j0, j0 + n) that a row of the query
// block sees, score_tile(), then f(j0, n, masked, next), where `next` holds the rows of
// the next block's K and V rows not yet prefetched (f's tile products may prefetch them;
// what is left is prefetched when f returns).
template <class F>
void for_each_key_block(const AttnParams& p, const QTiles& w, const QBlock& q, F f) {
  const int lq = q.sb.len_q, lk = q.sb.len_k;
  const int jb = p.mask.block_key_begin(q.i0, q.i0 + q.m, lq, lk);
  const int je = p.mask.block_key_end(q.i0, q.i0 + q.m, lq, lk);
  for (int j0 = jb; j0 < je; j0 += kBlockN) {
    const int n = std::min(kBlockN, je - j0);
    const int n_next = std::min(kBlockN, je - j0 - n);
    Prefetcher next;
    prefetch_rows(next, p.k, p.dtype, k_row(p, q, j0 + n), p.k_row_stride, n_next, p.head_dim);
    prefetch_rows(next, p.v, p.dtype, v_row(p, q, j0 + n), p.v_row_stride, n_next, p.head_dim_v);
    const bool masked = score_tile(p, w, q, j0, n, next);
    f(j0, n, masked, next);
    next.finish();
  }
}

// Runs f(w, q) for every query-block task of the problem (the forward's, the backward's
// pass 2), each task on its thread's tiles, carved from slot-sized slices of the workspace.
template <class F>
void for_each_q_block(const AttnParams& p, size_t slot, bool backward, F f) {
  const int64_t tasks = q_tasks(p);
#pragma omp parallel for num_threads(threads_for(tasks, p.num_threads)) schedule(dynamic, 1)
  for (int64_t t = 0; t < tasks; ++t) {
    QBlock q;
    if (!decode_q_task(p, t, &q)) continue;
    size_t unused = 0;
    const QTiles w = carve_q(p, thread_slot(p.workspace, slot, omp_get_thread_num()), backward, &unused);
    f(w, q);
  }
}

}  // namespace flashlab::cpu::FLASHLAB_CPU_ISA
