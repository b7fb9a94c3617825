// cpu_flash's tile products. Every product in the forward and backward is C (+)= A·B with B
// row-major, done by a register-blocked micro-kernel (kMicroRows rows × kMicroCols columns
// of C held in registers) whose innermost loop runs over contiguous columns of B, so it
// vectorizes (SSE2 in the baseline variant, AVX2/FMA or AVX-512 in the others: isa.h). A may be read transposed (kATrans),
// which is how P and dS enter a product from a tile that holds them as Pᵀ / dSᵀ: no tile
// is transposed inside a key loop. gemm_valid_pairs() is the masked tiles' product when B
// holds a non-finite value (docs/DESIGN.md: a masked key's values never reach a row).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

// The variant being compiled: a src/cpu/flash_<isa>.cpp defines it (isa.h).
#ifndef FLASHLAB_CPU_ISA
#error "cpu_flash's headers are compiled inside one of its variants, a src/cpu/flash_<isa>.cpp"
#endif

namespace flashlab::cpu::FLASHLAB_CPU_ISA {

// The register block of C a micro-kernel keeps: kMicroRows rows × kMicroCols columns.
// SSE2/AVX2 (16 vector registers): 6 × 16, 12 accumulators two AVX vectors wide, which beat
// 5 × 16 and 4 × 16 on Zen3 (it hides the FMA latency with loads to spare). AVX-512 (32
// registers): 8 × 16, one zmm per row. On Zen 4 (forward, seqlen 2048, head dim 128, one
// thread) it is 2–4% faster than 6 × 16, whose 64- and 128-row products end in a 4- or
// 2-row remainder, and faster than 6 × 32, 8 × 32, 4 × 32 and 16 × 16 (docs/RESULTS.md).
#if defined(__AVX512F__)
constexpr int kMicroRows = 8;
#else
constexpr int kMicroRows = 6;
#endif
constexpr int kMicroCols = 16;  // columns of C a micro-kernel keeps in registers
static_assert(kMicroRows <= 16, "micro_kernel() unrolls its row loops 16 deep");

// ---- prefetching -------------------------------------------------------------------------

// Up to three row sets (`rows` rows of `bytes` bytes each, `stride` bytes apart: the next
// K/V block, or the next Q/dO/O rows) to be brought into cache while the tile products run,
// a row or two per micro-kernel call. Rows of [B, S, H, D] tensors are a page or more
// apart, which the hardware prefetcher does not follow, and a block's lines issued all at
// once (64 rows of 512 bytes each of K and V: 1024 lines) are more misses than a core keeps
// in flight, so the copy that reads them next waited on memory. Each row's first line is
// a load, which maps its page (a prefetch that misses the TLB does little); the rest are
// prefetches.
class Prefetcher {
 public:
  void add(const void* first, int64_t stride, int rows, int64_t bytes) {
    if (rows <= 0 || bytes <= 0 || count_ == kMaxRegions) return;
    const int lines = int((bytes + kLine - 1) / kLine);
    regions_[count_++] = {static_cast<const char*>(first), stride, rows, lines};
    left_ += rows;
  }
  // Rows not yet requested.
  int left() const { return left_; }
  // Requests the next `rows` rows (fewer when fewer are left).
  void issue(int rows) {
    for (; rows > 0 && left_ > 0; --rows, --left_) {
      const Region& r = regions_[region_];
      const char* row = r.first + row_ * r.stride;
      (void)*static_cast<const volatile char*>(row);
      for (int l = 1; l < r.lines; ++l) __builtin_prefetch(row + l * kLine);
      if (++row_ < r.rows) continue;
      row_ = 0;
      ++region_;
    }
  }
  void finish() { issue(left_); }

 private:
  static constexpr int kMaxRegions = 3;
  static constexpr int kLine = 64;
  struct Region {
    const char* first;
    int64_t stride;
    int rows, lines;
  };
  Region regions_[kMaxRegions] = {};
  int count_ = 0, left_ = 0, region_ = 0, row_ = 0;
};

// ---- GEMM micro-kernel ------------------------------------------------------------------

// C[r][0..kMicroCols) (+)= Σ_k A(r, k) · B[k][0..kMicroCols) for r < R, where
// A(r, k) = A[r·lda + k] (row-major) or A[k·lda + r] (kATrans: A is stored transposed, as
// P and dS are when they come from a Sᵀ tile). The R × kMicroCols accumulators stay in
// registers over the whole k loop; each k step is R broadcasts of A, one row chunk of B
// and R·kMicroCols/8 FMAs, vectorized over the contiguous columns of B.
// With kAccumulate, row r of C is first multiplied by c_scale[r] (1 without c_scale).
template <int R, bool kAccumulate, bool kATrans>
inline void micro_kernel(const float* __restrict A, int64_t lda, const float* __restrict B,
                         int64_t ldb, float* __restrict C, int64_t ldc, int K, const float* c_scale) {
  float acc[R][kMicroCols];  // [R, kMicroCols] block of C
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    const float s = c_scale ? c_scale[r] : 1.f;
#pragma omp simd
    for (int c = 0; c < kMicroCols; ++c) acc[r][c] = kAccumulate ? C[r * ldc + c] * s : 0.f;
  }
  for (int k = 0; k < K; ++k) {
    const float* b = B + k * ldb;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const float a = kATrans ? A[k * lda + r] : A[r * lda + k];
#pragma omp simd
      for (int c = 0; c < kMicroCols; ++c) acc[r][c] += a * b[c];
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma omp simd
    for (int c = 0; c < kMicroCols; ++c) C[r * ldc + c] = acc[r][c];
}

// micro_kernel<left> for the last left < kMicroRows rows of a column chunk, with R the
// largest row count still to try.
template <int R, bool kAccumulate, bool kATrans>
inline void remainder(int left, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
                      int64_t ldc, int K, const float* c_scale) {
  if constexpr (R > 0) {
    if (left == R) return micro_kernel<R, kAccumulate, kATrans>(A, lda, B, ldb, C, ldc, K, c_scale);
    remainder<R - 1, kAccumulate, kATrans>(left, A, lda, B, ldb, C, ldc, K, c_scale);
  }
}

// What a gemm() does besides the product: request `pf_rows` rows of `pf`, spread evenly
// over its micro-kernel calls, and (accumulating) scale row r of C by c_scale[r] first,
// which is how the forward rescales O when the running max grows.
struct GemmExtras {
  Prefetcher* pf = nullptr;
  int pf_rows = 0;
  const float* c_scale = nullptr;
};

// C[rows][cols] (+)= A[rows][K] · B[K][cols], cols a multiple of kMicroCols. Column chunks
// outside, row groups inside: one chunk of B ([K, kMicroCols], <= 32 KiB) stays in L1
// while every row group of A streams past it.
template <bool kAccumulate, bool kATrans>
inline void gemm(int rows, int cols, int K, const float* A, int64_t lda, const float* B, int64_t ldb,
          float* C, int64_t ldc, GemmExtras x = {}) {
  auto a_rows = [&](int r) { return kATrans ? A + r : A + r * lda; };
  auto scale = [&](int r) { return x.c_scale ? x.c_scale + r : nullptr; };
  const int calls = (rows + kMicroRows - 1) / kMicroRows * (cols / kMicroCols);
  const int per_call = x.pf && calls > 0 ? (x.pf_rows + calls - 1) / calls : 0;
  int budget = x.pf ? x.pf_rows : 0;
  for (int c0 = 0; c0 < cols; c0 += kMicroCols) {
    const float* Bc = B + c0;
    float* Cc = C + c0;
    int r = 0;
    for (; r + kMicroRows <= rows; r += kMicroRows) {
      if (budget > 0) {
        x.pf->issue(std::min(per_call, budget));
        budget -= per_call;
      }
      micro_kernel<kMicroRows, kAccumulate, kATrans>(a_rows(r), lda, Bc, ldb, Cc + r * ldc, ldc, K, scale(r));
    }
    if (r < rows) remainder<kMicroRows - 1, kAccumulate, kATrans>(rows - r, a_rows(r), lda, Bc, ldb, Cc + r * ldc, ldc, K, scale(r));
  }
}

// Σ_k a[k]·b[k] in the order and rounding micro_kernel() gives one element of C: one
// multiply-add per k from k = 0, fused where the target has FMA (the kernel's vectorized
// multiply-adds are contracted to FMAs there). Written out, because a plain scalar loop is
// not contracted once the vectorizer has split it into vector multiplies and an in-order
// sum of their lanes.
inline float dot_like_gemm(const float* a, const float* b, int K) {
  float s = 0.f;
  for (int k = 0; k < K; ++k) {
#if defined(__FMA__)
    s = std::fma(a[k], b[k], s);
#else
    s += a[k] * b[k];
#endif
  }
  return s;
}

// True when none of X[r][c] (r < rows, c < cols) is NaN or ±inf. The exponent bits are
// all ones exactly for those, and an OR over the rows vectorizes.
inline bool all_finite(const float* X, int rows, int cols, int64_t ld) {
  uint32_t special = 0;
  for (int r = 0; r < rows; ++r) {
    const float* x = X + r * ld;
#pragma omp simd reduction(| : special)
    for (int c = 0; c < cols; ++c)
      special |= uint32_t((std::bit_cast<uint32_t>(x[c]) & 0x7f800000u) == 0x7f800000u);
  }
  return special == 0;
}

// C[r][0..cols) += Σ_{k : valid(r, k)} A(r, k) · B[k][0..cols), A addressed as in gemm().
// The masked pairs are skipped, not multiplied by a zero probability: 0 · NaN is NaN, so
// gemm() would carry a non-finite B row that the mask hides into rows that never see it.
// One row of C at a time, so it runs only on partly masked tiles whose B holds a NaN or an
// Inf (all_finite).
template <bool kATrans, class Valid>
void gemm_valid_pairs(int rows, int cols, int K, const float* A, int64_t lda, const float* B,
                      int64_t ldb, float* C, int64_t ldc, Valid valid) {
  for (int r = 0; r < rows; ++r) {
    float* c = C + r * ldc;
    for (int k = 0; k < K; ++k) {
      if (!valid(r, k)) continue;
      const float a = kATrans ? A[k * lda + r] : A[r * lda + k];
      const float* b = B + k * ldb;
#pragma omp simd
      for (int x = 0; x < cols; ++x) c[x] += a * b[x];
    }
  }
}

}  // namespace flashlab::cpu::FLASHLAB_CPU_ISA
