// cpu_flash — FlashAttention-2 on the CPU: tiled forward with online softmax, and the
// backward that recomputes P from the forward's LSE.
//
// What it adds over cpu_reference, and why:
//   - Tiling. Work is cut into tiles of kBlockM queries × kBlockN keys that live in L2
//     (at head dim 128, 230 KiB per thread in the forward, 330 KiB in the backward). The
//     score matrix S = QKᵀ is never formed:
//     the forward walks the key blocks of one query block, so extra memory is O(tile)
//     per thread instead of cpu_reference's O(seqlen_q · seqlen_k) per head.
//   - Online softmax. Each query keeps a running max m and sum l; a new key block that
//     raises m rescales l and the O accumulator by 2^(m_old − m_new). At the end
//     O /= l and LSE = m + log(l). Scores run in base 2 (Q is pre-scaled by
//     scale·log2(e), FlashAttention's scale_log2 trick), so each probability is one exp2.
//   - Block skipping. Only the key blocks in [mask.block_key_begin, block_key_end) of a
//     query block are visited, and per-element masking runs only on tiles that
//     mask.tile_is_full() says are partly masked.
//   - Backward by recomputation (FlashAttention-2, Algorithm 2). Nothing of the forward
//     but O and LSE is kept: P = exp(logit − LSE) is recomputed tile by tile. Pass 1, one
//     task per (batch, kv head, key block), owns dK and dV of its keys (summed over the
//     query heads of a GQA group) and needs no synchronization. dQ sums over key blocks
//     that different tasks own, so pass 2, one task per (batch, head, query block),
//     recomputes P and dS once more and accumulates dQ: 7 tile GEMMs instead of 5, but no
//     locks, no atomics and no per-thread dQ copies (those would be O(threads · total_q · D)).
//   - fp32 compute with vectorized inner loops. Every tile product is C (+)= A·B with B
//     row-major, done by a register-blocked micro-kernel (kMicroRows rows × kMicroCols
//     columns of C held in registers) whose innermost loop runs over contiguous columns of B,
//     so it vectorizes (AVX2/FMA on the build machine). Tile layouts are chosen so that no
//     tile is transposed inside the key loop: the query-side tile is transposed once per
//     task (Qᵀ in the forward and pass 2, Kᵀ and Vᵀ in pass 1), and P or dS enter a GEMM
//     through a transposed addressing of A. exp2 is a branch-free polynomial, since
//     std::exp2 does not vectorize without -ffast-math.
//
// fp16/bf16 inputs are converted to fp32 when tiles are loaded; outputs are rounded once.
// fp64 inputs stay with cpu_reference (the oracle computes in fp64; a fp32 kernel would
// lose the precision the caller asked for).
//
// Measured: (filled in by the bench)
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "common/dtype.h"
#include "common/mask.h"
#include "common/params.h"
#include "common/registry.h"
#include "common/registry.h"

namespace flashlab {
namespace {

// ---- tile sizes -------------------------------------------------------------------------

// Chosen by measuring the forward at seqlen 4096, head dim 128 on Zen3: kBlockM 128 is ~5%
// faster than 64 (each K/V block copied into a tile serves more queries) and level with
// 256; kBlockN 32 and 64 are level, 128 slower. The backward is within noise of these
// across M, N in {64, 128, 256}. A 6 × 16 register block (12 accumulators, two AVX
// vectors wide) beats 5 × 16 and 4 × 16: it hides the FMA latency with loads to spare.
constexpr int kBlockM = 128;    // queries per forward / dQ task (columns of the Qᵀ tile)
constexpr int kBlockN = 64;     // keys per step of the key loop, and per dK/dV task
constexpr int kMicroRows = 6;   // rows of C a micro-kernel keeps in registers
constexpr int kMicroCols = 16;  // columns of C a micro-kernel keeps in registers (2 AVX vectors)
constexpr int kMaxHeadDim = 512;
constexpr size_t kAlign = 64;   // every tile starts on a cache line

static_assert(kBlockM % kMicroCols == 0 && kBlockN % kMicroCols == 0,
              "tiles that are a GEMM's B or C need whole micro-kernel column chunks");
static_assert(kMicroRows == 6, "gemm()'s remainder switch covers 1..kMicroRows-1 rows");

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();
constexpr double kLn2 = 0.6931471805599453;
constexpr float kLog2e = 1.4426950408889634f;

constexpr int round_up(int x, int to) { return (x + to - 1) / to * to; }
int threads_for(int64_t tasks, int wanted) {
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
void load_row(const void* base, DType dt, int64_t offset, int n, float scale, float* dst,
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
void store_row(void* base, DType dt, int64_t offset, int n, float mul, const float* src) {
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

// Asks for rows [0, rows) of a tensor (first row at element `offset`) to be brought into
// cache. The key loop calls it for the next K/V block while it computes on this one: rows
// sit heads·head_dim elements apart, usually a page or more, so the hardware prefetcher
// does not follow them and each copy would otherwise wait on memory.
void prefetch_rows(const void* base, DType dt, int64_t offset, int64_t row_stride, int rows,
                   int width) {
  constexpr int kLine = 64;
  const size_t es = dtype_size(dt);
  const char* b = static_cast<const char*>(base);
  for (int r = 0; r < rows; ++r) {
    const char* row = b + (offset + r * row_stride) * int64_t(es);
    for (size_t byte = 0; byte < width * es; byte += kLine) __builtin_prefetch(row + byte);
  }
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
  constexpr double c1 = kLn2, c2 = c1 * kLn2 / 2, c3 = c2 * kLn2 / 3, c4 = c3 * kLn2 / 4,
                   c5 = c4 * kLn2 / 5, c6 = c5 * kLn2 / 6, c7 = c6 * kLn2 / 7;
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

// ---- GEMM micro-kernel ------------------------------------------------------------------

// C[r][0..kMicroCols) (+)= Σ_k A(r, k) · B[k][0..kMicroCols) for r < R, where
// A(r, k) = A[r·lda + k] (row-major) or A[k·lda + r] (kATrans: A is stored transposed, as
// P and dS are when they come from a Sᵀ tile). The R × kMicroCols accumulators stay in
// registers over the whole k loop; each k step is R broadcasts of A, one row chunk of B
// and R·kMicroCols/8 FMAs, vectorized over the contiguous columns of B.
template <int R, bool kAccumulate, bool kATrans>
inline void micro_kernel(const float* __restrict A, int64_t lda, const float* __restrict B,
                         int64_t ldb, float* __restrict C, int64_t ldc, int K) {
  float acc[R][kMicroCols];  // [R, kMicroCols] block of C
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma omp simd
    for (int c = 0; c < kMicroCols; ++c) acc[r][c] = kAccumulate ? C[r * ldc + c] : 0.f;
  for (int k = 0; k < K; ++k) {
    const float* b = B + k * ldb;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const float a = kATrans ? A[k * lda + r] : A[r * lda + k];
#pragma omp simd
      for (int c = 0; c < kMicroCols; ++c) acc[r][c] += a * b[c];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma omp simd
    for (int c = 0; c < kMicroCols; ++c) C[r * ldc + c] = acc[r][c];
}

// C[rows][cols] (+)= A[rows][K] · B[K][cols], cols a multiple of kMicroCols. Column chunks
// outside, row groups inside: one chunk of B ([K, kMicroCols], <= 32 KiB) stays in L1
// while every row group of A streams past it.
template <bool kAccumulate, bool kATrans>
void gemm(int rows, int cols, int K, const float* A, int64_t lda, const float* B, int64_t ldb,
          float* C, int64_t ldc) {
  auto a_rows = [&](int r) { return kATrans ? A + r : A + r * lda; };
  for (int c0 = 0; c0 < cols; c0 += kMicroCols) {
    const float* Bc = B + c0;
    float* Cc = C + c0;
    int r = 0;
    for (; r + kMicroRows <= rows; r += kMicroRows)
      micro_kernel<kMicroRows, kAccumulate, kATrans>(a_rows(r), lda, Bc, ldb, Cc + r * ldc, ldc, K);
    switch (rows - r) {
      case 5: micro_kernel<5, kAccumulate, kATrans>(a_rows(r), lda, Bc, ldb, Cc + r * ldc, ldc, K); break;
      case 4: micro_kernel<4, kAccumulate, kATrans>(a_rows(r), lda, Bc, ldb, Cc + r * ldc, ldc, K); break;
      case 3: micro_kernel<3, kAccumulate, kATrans>(a_rows(r), lda, Bc, ldb, Cc + r * ldc, ldc, K); break;
      case 2: micro_kernel<2, kAccumulate, kATrans>(a_rows(r), lda, Bc, ldb, Cc + r * ldc, ldc, K); break;
      case 1: micro_kernel<1, kAccumulate, kATrans>(a_rows(r), lda, Bc, ldb, Cc + r * ldc, ldc, K); break;
      default: break;
    }
  }
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
char* thread_slot(void* workspace, size_t slot_bytes, int i) {
  const uintptr_t a = (reinterpret_cast<uintptr_t>(workspace) + kAlign - 1) / kAlign * kAlign;
  return reinterpret_cast<char*>(a) + slot_bytes * size_t(i);
}

// Widths of the tiles whose rows feed a GEMM as B or C: padded to whole micro-kernel
// column chunks (the padding is zero-filled, so it never carries NaN or denormals).
int padded(int d) { return round_up(d, kMicroCols); }

// One thread's tiles in the forward and in dQ (pass 2) tasks: queries are the columns of
// the transposed tiles, keys the rows.
struct QTiles {
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
  float* lse2;   // [kBlockM] LSE · log2(e) (backward)
  float* Drow;   // [kBlockM] rowsum(dO ∘ O) (backward)
  float* row;    // [2, Dvp] one converted row of dO and one of O (backward)
  int* kb;       // [kBlockM] first key each query sees
  int* ke;       // [kBlockM] one past its last key
};

QTiles carve_q(const AttnParams& p, char* base, bool backward, size_t* bytes) {
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
  t.lse2 = a.take<float>(kBlockM);
  t.Drow = a.take<float>(kBlockM);
  t.row = a.take<float>(2 * int64_t(Dvp));
  t.kb = a.take<int>(kBlockM);
  t.ke = a.take<int>(kBlockM);
  *bytes = a.used();
  return t;
}

// One thread's tiles in dK/dV (pass 1) tasks: keys are the columns of the transposed
// tiles, queries the rows.
struct KTiles {
  float* Kt;    // [D, kBlockN]   transposed K block, pre-scaled (columns n..kBlockN zero)
  float* Vt;    // [Dv, kBlockN]  transposed V block
  float* dK;    // [kBlockN, Dp]  dK accumulator
  float* dV;    // [kBlockN, Dvp] dV accumulator
  float* Q;     // [kBlockM, Dp]  Q block, row-major (columns D..Dp zero)
  float* dO;    // [kBlockM, Dvp] dO block, row-major (columns Dv..Dvp zero)
  float* S;     // [kBlockM, kBlockN] logits, then P
  float* dP;    // [kBlockM, kBlockN] dP, then dS
  float* lse2;  // [kBlockM] LSE · log2(e)
  float* Drow;  // [kBlockM] rowsum(dO ∘ O)
  float* row;   // [Dvp] one converted row of O
  int* kb;      // [kBlockM] first key each query row sees
  int* ke;      // [kBlockM] one past its last key
};

KTiles carve_k(const AttnParams& p, char* base, size_t* bytes) {
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
  t.lse2 = a.take<float>(kBlockM);
  t.Drow = a.take<float>(kBlockM);
  t.row = a.take<float>(Dvp);
  t.kb = a.take<int>(kBlockM);
  t.ke = a.take<int>(kBlockM);
  *bytes = a.used();
  return t;
}

size_t q_slot_bytes(const AttnParams& p, bool backward) {
  size_t bytes = 0;
  carve_q(p, nullptr, backward, &bytes);
  return bytes;
}
size_t k_slot_bytes(const AttnParams& p) {
  size_t bytes = 0;
  carve_k(p, nullptr, &bytes);
  return bytes;
}

int64_t blocks(int len, int block) { return (int64_t(len) + block - 1) / block; }
// Tasks of the forward and of pass 2: (batch, head, query block), over the longest sequence.
int64_t q_tasks(const AttnParams& p) { return int64_t(p.batch) * p.heads_q * blocks(p.seqlen_q, kBlockM); }
// Tasks of pass 1: (batch, kv head, key block).
int64_t k_tasks(const AttnParams& p) { return int64_t(p.batch) * p.heads_kv * blocks(p.seqlen_k, kBlockN); }

// ---- shared pieces of the query-block tasks ---------------------------------------------

// The rows [i0, i0 + m) of one (batch, head) that a query-block task owns.
struct QBlock {
  int b, h, hk;
  SeqBounds sb;
  int i0, m, mc;  // first row, rows, rows rounded up to kMicroCols (columns of Qᵀ computed)
};

// Element offset of row i of head h in a tensor with the given strides.
int64_t at(int64_t batch_stride, int64_t row_stride, int64_t head_stride, int b, int64_t start,
           int64_t i, int h) {
  return b * batch_stride + (start + i) * row_stride + h * head_stride;
}

// Task t -> (b, h, query block). Within a head the last query blocks come first: under a
// causal mask they see the most keys, and dynamic scheduling balances best when the
// longest tasks start first.
bool decode_q_task(const AttnParams& p, int64_t t, QBlock* q) {
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
void key_ranges(const AttnParams& p, const QBlock& q, int* kb, int* ke) {
  for (int i = 0; i < q.mc; ++i) {
    const bool row = i < q.m;
    kb[i] = row ? p.mask.key_begin(q.i0 + i, q.sb.len_q, q.sb.len_k) : 0;
    ke[i] = row ? p.mask.key_end(q.i0 + i, q.sb.len_q, q.sb.len_k) : 0;
  }
}

// Loads the transposed, scaled query-side tile Xt[d][i] = scale · X[i0 + i][d], zeroing the
// padding columns m..mc so that they stay finite.
void load_transposed_rows(const void* base, DType dt, int64_t first, int64_t row_stride,
                          const QBlock& q, int width, float scale, float* Xt) {
  for (int d = 0; d < width; ++d)
    for (int i = q.m; i < q.mc; ++i) Xt[int64_t(d) * kBlockM + i] = 0.f;
  for (int i = 0; i < q.m; ++i)
    load_row(base, dt, first + int64_t(i) * row_stride, width, scale, Xt + i, kBlockM);
}

// Zero columns [from, to) of rows [0, rows) of a row-major tile with leading dim ld.
void zero_columns(float* X, int rows, int64_t ld, int from, int to) {
  for (int r = 0; r < rows; ++r)
    for (int c = from; c < to; ++c) X[r * ld + c] = 0.f;
}

// Softcap on a tile of natural-unit logits: t = logit(s), then to base 2.
void softcap_tile(const MaskPolicy& mask, float* X, int rows, int cols, int64_t ld) {
  for (int r = 0; r < rows; ++r) {
    float* x = X + r * ld;
#pragma omp simd
    for (int c = 0; c < cols; ++c) x[c] = capped_logit(mask, x[c]) * kLog2e;
  }
}

// Sets the disallowed (key row j, query column i) entries of a Sᵀ tile to −inf.
void mask_transposed(float* St, int n, int mc, int j0, const int* kb, const int* ke) {
  for (int j = 0; j < n; ++j) {
    const int key = j0 + j;
    float* s = St + int64_t(j) * kBlockM;
#pragma omp simd
    for (int i = 0; i < mc; ++i) s[i] = blend((key >= kb[i]) & (key < ke[i]), s[i], kNegInf);
  }
}

// ---- forward ----------------------------------------------------------------------------

// Keys [j0, j0 + n) of the block's K and V heads into K [n, Dp] and V [n, Dvp] (fp32),
// and a prefetch of the next block's rows (up to key je) while this one is computed.
void load_kv_block(const AttnParams& p, const QBlock& q, int j0, int n, int je, float* K, float* V) {
  const int D = p.head_dim, Dv = p.head_dim_v, Dp = padded(D), Dvp = padded(Dv);
  const int64_t k_first = at(p.k_batch_stride, p.k_row_stride, p.k_head_stride, q.b, q.sb.start_k, 0, q.hk);
  const int64_t v_first = at(p.v_batch_stride, p.v_row_stride, p.v_head_stride, q.b, q.sb.start_k, 0, q.hk);
  for (int j = 0; j < n; ++j) {
    load_row(p.k, p.dtype, k_first + int64_t(j0 + j) * p.k_row_stride, D, 1.f, K + int64_t(j) * Dp);
    load_row(p.v, p.dtype, v_first + int64_t(j0 + j) * p.v_row_stride, Dv, 1.f, V + int64_t(j) * Dvp);
  }
  const int next = std::min(kBlockN, je - j0 - n);
  prefetch_rows(p.k, p.dtype, k_first + int64_t(j0 + n) * p.k_row_stride, p.k_row_stride, next, D);
  prefetch_rows(p.v, p.dtype, v_first + int64_t(j0 + n) * p.v_row_stride, p.v_row_stride, next, Dv);
}

void fwd_block(const FwdParams& p, const QTiles& w, const QBlock& q) {
  const int D = p.head_dim, Dv = p.head_dim_v, Dp = padded(D), Dvp = padded(Dv);
  const int lq = q.sb.len_q, lk = q.sb.len_k;
  const bool capped = p.mask.softcap > 0.f;
  // With softcap the logit transform needs the natural-unit score; without, fold log2(e)
  // into Q so that scores come out in base 2.
  const float qscale = capped ? p.scale : p.scale_log2;

  load_transposed_rows(p.q, p.dtype,
                       at(p.q_batch_stride, p.q_row_stride, p.q_head_stride, q.b, q.sb.start_q, q.i0, q.h),
                       p.q_row_stride, q, D, qscale, w.Qt);
  key_ranges(p, q, w.kb, w.ke);
  float* O = w.acc;  // [m, Dvp]
  for (int64_t e = 0; e < int64_t(q.m) * Dvp; ++e) O[e] = 0.f;
  for (int i = 0; i < q.mc; ++i) {
    w.m[i] = kNegInf;
    w.l[i] = 0.f;
  }
  zero_columns(w.V, kBlockN, Dvp, Dv, Dvp);

  const int jb = p.mask.block_key_begin(q.i0, q.i0 + q.m, lq, lk);
  const int je = p.mask.block_key_end(q.i0, q.i0 + q.m, lq, lk);
  for (int j0 = jb; j0 < je; j0 += kBlockN) {
    const int n = std::min(kBlockN, je - j0);
    load_kv_block(p, q, j0, n, je, w.K, w.V);
    // Sᵀ[j][i] = k_j · q_i: the K block is A, Qᵀ is B.
    gemm<false, false>(n, q.mc, D, w.K, Dp, w.Qt, kBlockM, w.St, kBlockM);
    if (capped) softcap_tile(p.mask, w.St, n, q.mc, kBlockM);
    if (!p.mask.tile_is_full(q.i0, q.i0 + q.m, j0, j0 + n, lq, lk))
      mask_transposed(w.St, n, q.mc, j0, w.kb, w.ke);

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
    for (int i = 0; i < q.m; ++i) {
      if (w.alpha[i] == 1.f) continue;
      float* o = O + int64_t(i) * Dvp;
      const float a = w.alpha[i];
#pragma omp simd
      for (int d = 0; d < Dvp; ++d) o[d] *= a;
    }
    // O[i][:] += Σ_j P[i][j] V[j][:], P read from the Pᵀ tile.
    gemm<true, true>(q.m, Dvp, n, w.St, kBlockM, w.V, Dvp, O, Dvp);
  }

  const int64_t o_first = at(p.o_batch_stride, p.o_row_stride, p.o_head_stride, q.b, q.sb.start_q, q.i0, q.h);
  for (int i = 0; i < q.m; ++i) {
    const float l = w.l[i];
    // l == 0: the row saw no key (its O accumulator is still 0): O = 0, LSE = −inf.
    store_row(p.out, p.dtype, o_first + int64_t(i) * p.o_row_stride, Dv, l > 0.f ? 1.f / l : 0.f,
              O + int64_t(i) * Dvp);
    if (p.lse)
      p.lse[q.b * p.lse_batch_stride + q.h * p.lse_head_stride + q.sb.start_q + q.i0 + i] =
          l > 0.f ? float(double(w.m[i]) * kLn2 + std::log(double(l))) : kNegInf;
  }
}

size_t flash_fwd_workspace(const FwdParams& p) {
  return kAlign + q_slot_bytes(p, false) * threads_for(q_tasks(p), p.num_threads);
}

Status flash_fwd(const FwdParams& p) {
  const int64_t tasks = q_tasks(p);
  const int nt = threads_for(tasks, p.num_threads);
  const size_t slot = q_slot_bytes(p, false);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
  for (int64_t t = 0; t < tasks; ++t) {
    QBlock q;
    if (!decode_q_task(p, t, &q)) continue;
    size_t unused = 0;
    const QTiles w = carve_q(p, thread_slot(p.workspace, slot, omp_get_thread_num()), false, &unused);
    fwd_block(p, w, q);
  }
  return {};
}

// ---- backward ---------------------------------------------------------------------------

// LSE of row i in base 2. A row that saw no key has LSE −inf; +inf makes its P exactly 0
// (its entries are masked anyway; this keeps an unmasked stray from becoming inf).
float lse_base2(const BwdParams& p, int b, int h, int64_t start_q, int i) {
  const float lse = p.lse[b * p.lse_batch_stride + h * p.lse_head_stride + start_q + i];
  return lse == kNegInf ? kPosInf : lse * kLog2e;
}

// D_i = dO_i · O_i, with dO_i already converted in `dO` and O_i converted into `row`.
float row_dot_out(const BwdParams& p, int b, int h, const SeqBounds& sb, int i, const float* dO,
                  float* row) {
  load_row(p.out, p.dtype, at(p.o_batch_stride, p.o_row_stride, p.o_head_stride, b, sb.start_q, i, h),
           p.head_dim_v, 1.f, row);
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int d = 0; d < p.head_dim_v; ++d) s += dO[d] * row[d];
  return s;
}

// P and dS of one tile, elementwise. X holds logits (base-2, or natural when softcapped)
// and becomes P; Y holds dP and becomes dS = P ∘ (dP − D_i) ∘ dlogit · scale. `lse2` and
// `drow` are indexed by the query, which is the row (kQueryIsColumn false: pass 1's
// [M, N] tiles) or the column (pass 2's [N, M] Sᵀ tiles). valid(r, c) says whether an
// entry is allowed by the mask; it is only consulted in the kMasked instantiation.
template <bool kQueryIsColumn, bool kMasked, bool kCapped, class Valid>
void p_and_ds(const BwdParams& p, float* X, float* Y, int rows, int cols, int64_t ld,
              const float* lse2, const float* drow, Valid valid) {
  const float scale = p.scale;
  const MaskPolicy mask = p.mask;
  for (int r = 0; r < rows; ++r) {
    float* x = X + r * ld;
    float* y = Y + r * ld;
#pragma omp simd
    for (int c = 0; c < cols; ++c) {
      const int qi = kQueryIsColumn ? c : r;
      float s = x[c], g = scale;
      if constexpr (kCapped) {
        // MaskPolicy's logit and dlogit, written out: its dlogit branches on softcap > 0,
        // and a branch stops this loop from vectorizing.
        const float th = tanh_fast(s / mask.softcap);
        g = (1.f - th * th) * scale;
        s = mask.softcap * th * kLog2e;
      }
      float pr = exp2_fast(s - lse2[qi]);
      if constexpr (kMasked) pr = blend(valid(r, c), pr, 0.f);
      x[c] = pr;
      y[c] = pr * (y[c] - drow[qi]) * g;
    }
  }
}

template <bool kQueryIsColumn, class Valid>
void p_and_ds_dispatch(const BwdParams& p, bool masked, float* X, float* Y, int rows, int cols,
                       int64_t ld, const float* lse2, const float* drow, Valid valid) {
  const bool capped = p.mask.softcap > 0.f;
  if (masked) {
    if (capped) p_and_ds<kQueryIsColumn, true, true>(p, X, Y, rows, cols, ld, lse2, drow, valid);
    else p_and_ds<kQueryIsColumn, true, false>(p, X, Y, rows, cols, ld, lse2, drow, valid);
  } else {
    if (capped) p_and_ds<kQueryIsColumn, false, true>(p, X, Y, rows, cols, ld, lse2, drow, valid);
    else p_and_ds<kQueryIsColumn, false, false>(p, X, Y, rows, cols, ld, lse2, drow, valid);
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
void dkdv_block(const BwdParams& p, const KTiles& w, int b, int hk, int j0) {
  const SeqBounds sb = host_seq_bounds(p, b);
  const int lq = sb.len_q, lk = sb.len_k;
  const int D = p.head_dim, Dv = p.head_dim_v, Dp = padded(D), Dvp = padded(Dv);
  const int n = std::min(kBlockN, lk - j0);
  const int nc = round_up(n, kMicroCols);  // key columns computed
  const bool capped = p.mask.softcap > 0.f;
  const float kscale = capped ? p.scale : p.scale_log2;

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
        w.lse2[i] = lse_base2(p, b, h, sb.start_q, i0 + i);
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
      p_and_ds_dispatch<false>(p, masked, w.S, w.dP, m, nc, kBlockN, w.lse2, w.Drow, valid);
      // dV += Pᵀ dO and dK += dSᵀ Q: A read transposed from the [m, kBlockN] tiles.
      gemm<true, true>(n, Dvp, m, w.S, kBlockN, w.dO, Dvp, w.dV, Dvp);
      gemm<true, true>(n, Dp, m, w.dP, kBlockN, w.Q, Dp, w.dK, Dp);
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
void dq_block(const BwdParams& p, const QTiles& w, const QBlock& q) {
  const int D = p.head_dim, Dv = p.head_dim_v, Dp = padded(D), Dvp = padded(Dv);
  const int lq = q.sb.len_q, lk = q.sb.len_k;
  const bool capped = p.mask.softcap > 0.f;
  const float qscale = capped ? p.scale : p.scale_log2;

  load_transposed_rows(p.q, p.dtype,
                       at(p.q_batch_stride, p.q_row_stride, p.q_head_stride, q.b, q.sb.start_q, q.i0, q.h),
                       p.q_row_stride, q, D, qscale, w.Qt);
  // dOᵀ, D_i and LSE per query column; padding columns get D = 0 and LSE = +inf (P = 0).
  for (int d = 0; d < Dv; ++d)
    for (int i = q.m; i < q.mc; ++i) w.dOt[int64_t(d) * kBlockM + i] = 0.f;
  const int64_t do_first = at(p.do_batch_stride, p.do_row_stride, p.do_head_stride, q.b, q.sb.start_q, q.i0, q.h);
  float* dO_row = w.row;  // [Dvp]
  float* o_row = w.row + Dvp;
  for (int i = 0; i < q.m; ++i) {
    load_row(p.dout, p.dtype, do_first + int64_t(i) * p.do_row_stride, Dv, 1.f, dO_row);
    for (int d = 0; d < Dv; ++d) w.dOt[int64_t(d) * kBlockM + i] = dO_row[d];
    w.Drow[i] = row_dot_out(p, q.b, q.h, q.sb, q.i0 + i, dO_row, o_row);
    w.lse2[i] = lse_base2(p, q.b, q.h, q.sb.start_q, q.i0 + i);
  }
  for (int i = q.m; i < q.mc; ++i) {
    w.Drow[i] = 0.f;
    w.lse2[i] = kPosInf;
  }
  key_ranges(p, q, w.kb, w.ke);
  float* dQ = w.acc;  // [m, Dp]
  for (int64_t e = 0; e < int64_t(q.m) * Dp; ++e) dQ[e] = 0.f;
  zero_columns(w.K, kBlockN, Dp, D, Dp);

  const int jb = p.mask.block_key_begin(q.i0, q.i0 + q.m, lq, lk);
  const int je = p.mask.block_key_end(q.i0, q.i0 + q.m, lq, lk);
  for (int j0 = jb; j0 < je; j0 += kBlockN) {
    const int n = std::min(kBlockN, je - j0);
    load_kv_block(p, q, j0, n, je, w.K, w.V);
    // Sᵀ = K Qᵀ [n, mc] and dPᵀ = V dOᵀ [n, mc].
    gemm<false, false>(n, q.mc, D, w.K, Dp, w.Qt, kBlockM, w.St, kBlockM);
    gemm<false, false>(n, q.mc, Dv, w.V, Dvp, w.dOt, kBlockM, w.dPt, kBlockM);
    const bool masked = !p.mask.tile_is_full(q.i0, q.i0 + q.m, j0, j0 + n, lq, lk);
    const int* kb = w.kb;
    const int* ke = w.ke;
    auto valid = [&](int r, int c) { return (j0 + r >= kb[c]) & (j0 + r < ke[c]); };
    p_and_ds_dispatch<true>(p, masked, w.St, w.dPt, n, q.mc, kBlockM, w.lse2, w.Drow, valid);
    // dQ[i][:] += Σ_j dS[i][j] K[j][:], dS read from the dSᵀ tile.
    gemm<true, true>(q.m, Dp, n, w.dPt, kBlockM, w.K, Dp, dQ, Dp);
  }

  const int64_t dq_first = at(p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride, q.b, q.sb.start_q, q.i0, q.h);
  for (int i = 0; i < q.m; ++i)
    store_row(p.dq, p.dtype, dq_first + int64_t(i) * p.dq_row_stride, D, 1.f, dQ + int64_t(i) * Dp);
}

size_t bwd_slot_bytes(const BwdParams& p) { return std::max(q_slot_bytes(p, true), k_slot_bytes(p)); }
int bwd_threads(const BwdParams& p) {
  return std::max(threads_for(k_tasks(p), p.num_threads), threads_for(q_tasks(p), p.num_threads));
}

size_t flash_bwd_workspace(const BwdParams& p) { return kAlign + bwd_slot_bytes(p) * bwd_threads(p); }

Status flash_bwd(const BwdParams& p) {
  const size_t slot = bwd_slot_bytes(p);

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
    dkdv_block(p, w, b, hk, j0);
  }

  const int64_t qtasks = q_tasks(p);
#pragma omp parallel for num_threads(threads_for(qtasks, p.num_threads)) schedule(dynamic, 1)
  for (int64_t t = 0; t < qtasks; ++t) {
    QBlock q;
    if (!decode_q_task(p, t, &q)) continue;
    size_t unused = 0;
    const QTiles w = carve_q(p, thread_slot(p.workspace, slot, omp_get_thread_num()), true, &unused);
    dq_block(p, w, q);
  }
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

KernelEntry cpu_flash_entry() {
  KernelEntry e;
  e.info = {"cpu_flash", "cpu",
            "FlashAttention-2 on the CPU: fp32 tiles, online softmax, O(tile) memory, backward "
            "recomputed from LSE; fp32/fp16/bf16, head dims up to 512, every mask, GQA, varlen",
            true, true};
  e.auto_priority = 10;
  e.supports_fwd = flash_supports_fwd;
  e.workspace_fwd = flash_fwd_workspace;
  e.run_fwd = flash_fwd;
  e.supports_bwd = flash_supports_bwd;
  e.workspace_bwd = flash_bwd_workspace;
  e.run_bwd = flash_bwd;
  return e;
}

}  // namespace flashlab
