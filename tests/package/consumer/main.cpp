// Uses FlashLab through its public header only: lists the registered kernels and runs one
// small forward on cpu_reference, checked against attention computed here in double.
// Prints "ok" and exits 0 when every check holds.
#include <flashlab/flashlab.h>

#include <cmath>
#include <cstdio>
#include <string_view>
#include <vector>

namespace {

int fail(const char* what) {
  std::printf("FAILED: %s\n", what);
  return 1;
}

}  // namespace

int main() {
  bool has_reference = false;
  for (const flashlab::KernelInfo& k : flashlab::kernels()) {
    std::printf("%-24.*s %.*s\n", int(k.name.size()), k.name.data(), int(k.arch.size()),
                k.arch.data());
    has_reference = has_reference || k.name == "cpu_reference";
  }
  if (!has_reference) return fail("cpu_reference is not in flashlab::kernels()");

  // One batch, 3 queries, 5 keys, 2 heads, head dim 4: [batch, seqlen, heads, head_dim].
  constexpr int Sq = 3, Sk = 5, H = 2, D = 4;
  std::vector<float> q(Sq * H * D), k(Sk * H * D), v(Sk * H * D), out(Sq * H * D, NAN);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.7f * float(i));
  for (size_t i = 0; i < k.size(); ++i) k[i] = std::cos(0.3f * float(i));
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.1f * float(i % 7) - 0.3f;

  using flashlab::DType;
  using flashlab::Tensor;
  flashlab::ForwardArgs a;
  a.q = Tensor::contiguous(q.data(), DType::kF32, {1, Sq, H, D});
  a.k = Tensor::contiguous(k.data(), DType::kF32, {1, Sk, H, D});
  a.v = Tensor::contiguous(v.data(), DType::kF32, {1, Sk, H, D});
  a.out = Tensor::contiguous(out.data(), DType::kF32, {1, Sq, H, D});
  a.kernel = "cpu_reference";
  size_t bytes = 0;
  flashlab::Status s = flashlab::workspace_size(a, &bytes);
  if (!s.ok()) return fail(s.message().c_str());
  std::vector<unsigned char> workspace(bytes);
  a.workspace = workspace.data();
  a.workspace_bytes = bytes;
  s = flashlab::forward(a);
  if (!s.ok()) return fail(s.message().c_str());

  // O = softmax(Q Kᵀ / sqrt(D)) V, row by row, in double.
  double max_err = 0;
  for (int h = 0; h < H; ++h) {
    for (int i = 0; i < Sq; ++i) {
      double p[Sk], m = -INFINITY, sum = 0;
      for (int j = 0; j < Sk; ++j) {
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += double(q[(i * H + h) * D + d]) * k[(j * H + h) * D + d];
        p[j] = dot / std::sqrt(double(D));
        m = std::fmax(m, p[j]);
      }
      for (double& x : p) sum += (x = std::exp(x - m));
      for (int d = 0; d < D; ++d) {
        double o = 0;
        for (int j = 0; j < Sk; ++j) o += p[j] / sum * v[(j * H + h) * D + d];
        const double err = std::fabs(o - out[(i * H + h) * D + d]);
        if (!(err <= max_err)) max_err = err;  // a NaN (an element not written) stays
      }
    }
  }
  std::printf("cpu_reference forward: max |error| %.3g\n", max_err);
  if (!(max_err < 1e-5)) return fail("cpu_reference's output differs from attention in double");
  std::printf("ok\n");
  return 0;
}
