// The mask policy: one definition of which keys a query row sees and how a logit is
// transformed, used by the CPU reference, cpu_flash and every GPU kernel, so that all of
// them mean the same thing.
//
// Alignment is bottom-right (FlashAttention >= 2.1): in a sequence with len_q queries and
// len_k keys, query row i sits on the diagonal key  diag(i) = i + len_k - len_q.
// Row i sees keys j with  diag(i) - window_left <= j <= diag(i) + window_right  (a bound of
// -1 is unbounded) and 0 <= j < len_k. A bound means exactly that, whatever its size:
// unlike FlashAttention-2, a right bound >= seqlen_k is not read as unbounded, which differs
// when seqlen_q > seqlen_k (window (-1, 2) with seqlen_q 4, seqlen_k 2 gives row 0 key 0 only).
// Causal is window_right = 0. MaskPolicy::make is the one place that folds causal in and
// drops bounds that cannot bind. A row that sees no key writes 0 and LSE = -inf.
//
//   len_q = 3, len_k = 5, causal           window (1, 0)
//        k0 k1 k2 k3 k4                     k0 k1 k2 k3 k4
//   q0    x  x  x  .  .                q0    .  x  x  .  .
//   q1    x  x  x  x  .                q1    .  .  x  x  .
//   q2    x  x  x  x  x                q2    .  .  .  x  x
//
// Softcap (Gemma 2 style) transforms the scaled logit s into  cap·tanh(s / cap).
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define FL_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FL_HOST_DEVICE inline
#endif

namespace flashlab {

struct MaskPolicy {
  int window_left = -1;   // -1: unbounded on the left
  int window_right = -1;  // -1: unbounded on the right; 0 with causal
  float softcap = 0.f;    // 0: off

  // The caller's (window_left, window_right, causal) for a problem of at most seqlen_q
  // queries and seqlen_k keys per sequence. Causal sets the right bound to 0. A bound that
  // cannot exclude any key of any row becomes -1, so kernels take their unmasked paths:
  // row i's left edge i + len_k - len_q - left is <= 0 for every row when left >= len_k - 1,
  // and its right edge i + len_k - len_q + right + 1 is >= len_k when right >= len_q - 1.
  // Both hold for every sequence of a varlen batch, whose lengths are at most seqlen_q/k.
  static MaskPolicy make(int window_left, int window_right, bool causal, int64_t seqlen_q,
                         int64_t seqlen_k, float softcap) {
    MaskPolicy m;
    m.window_left = window_left < 0 || window_left >= seqlen_k - 1 ? -1 : window_left;
    const int right = causal ? 0 : window_right;
    m.window_right = right < 0 || right >= seqlen_q - 1 ? -1 : right;
    m.softcap = softcap;
    return m;
  }

  FL_HOST_DEVICE bool is_local() const { return window_left >= 0 || window_right >= 0; }

  // First key row i may see (clamped to [0, len_k]).
  FL_HOST_DEVICE int key_begin(int i, int len_q, int len_k) const {
    if (window_left < 0) return 0;
    int64_t b = int64_t(i) + len_k - len_q - window_left;
    return b < 0 ? 0 : (b > len_k ? len_k : int(b));
  }
  // One past the last key row i may see (clamped to [0, len_k]).
  FL_HOST_DEVICE int key_end(int i, int len_q, int len_k) const {
    if (window_right < 0) return len_k;
    int64_t e = int64_t(i) + len_k - len_q + window_right + 1;
    return e < 0 ? 0 : (e > len_k ? len_k : int(e));
  }
  FL_HOST_DEVICE bool allowed(int i, int j, int len_q, int len_k) const {
    return j >= key_begin(i, len_q, len_k) && j < key_end(i, len_q, len_k);
  }

  // Keys that rows [i0, i1) see, as one range: both bounds grow with i.
  FL_HOST_DEVICE int block_key_begin(int i0, int /*i1*/, int len_q, int len_k) const {
    return key_begin(i0, len_q, len_k);
  }
  FL_HOST_DEVICE int block_key_end(int /*i0*/, int i1, int len_q, int len_k) const {
    return key_end(i1 - 1, len_q, len_k);
  }
  // True when every (row, key) pair of the tile rows [i0, i1) × keys [j0, j1) is allowed,
  // so the kernel may skip per-element masking (j1 <= len_k assumed).
  FL_HOST_DEVICE bool tile_is_full(int i0, int i1, int j0, int j1, int len_q, int len_k) const {
    return j0 >= key_begin(i1 - 1, len_q, len_k) && j1 <= key_end(i0, len_q, len_k);
  }

  // Logit transform applied to the scaled score s = scale·q·k.
  FL_HOST_DEVICE float logit(float s) const {
    return softcap > 0.f ? softcap * tanhf(s / softcap) : s;
  }
  FL_HOST_DEVICE double logit(double s) const {
    return softcap > 0.f ? double(softcap) * tanh(s / double(softcap)) : s;
  }
  // d logit / d s, given the transformed logit t = logit(s).
  FL_HOST_DEVICE float dlogit(float t) const {
    if (softcap <= 0.f) return 1.f;
    float u = t / softcap;
    return 1.f - u * u;
  }
  FL_HOST_DEVICE double dlogit(double t) const {
    if (softcap <= 0.f) return 1.0;
    double u = t / double(softcap);
    return 1.0 - u * u;
  }
};

}  // namespace flashlab
