// The API's allocation promise, measured: after one warm-up call (which starts OpenMP's
// thread pool), a successful forward, backward, forward_kvcache, workspace_size or
// select_kernel on CPU tensors makes no call to the global operator new. This file replaces
// operator new for the whole test binary with a counting one (malloc underneath); error
// paths do allocate (their message string), which the last test uses to show that the
// counter counts.
#include <atomic>
#include <cstdlib>
#include <new>

#include "cpu/validation_fixture.h"

namespace {
std::atomic<long> g_news{0};

void* counted(std::size_t n, std::size_t align) {
  g_news.fetch_add(1, std::memory_order_relaxed);
  n = n ? n : 1;
  void* p = align <= alignof(std::max_align_t) ? std::malloc(n)
                                                : std::aligned_alloc(align, (n + align - 1) / align * align);
  if (!p) throw std::bad_alloc();
  return p;
}
}  // namespace

// Every form of the global operator new and delete, so that no memory allocated by the
// library's default operator new is freed here with free() (AddressSanitizer reports that
// mismatch: the benchmark harness allocates through the nothrow, aligned form).
void* operator new(std::size_t n) { return counted(n, 0); }
void* operator new(std::size_t n, std::align_val_t a) { return counted(n, std::size_t(a)); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted(n, 0);
  } catch (...) {
    return nullptr;
  }
}
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  try {
    return counted(n, std::size_t(a));
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }

namespace flashlab::test {
namespace {

class AllocationTest : public VarlenValidationTest {
 protected:
  // Operator new calls made by `f`, run once before counting.
  template <class F>
  long news_of(F&& f) {
    f();
    const long before = g_news.load();
    f();
    return g_news.load() - before;
  }
};

TEST_F(AllocationTest, SuccessfulCallsDoNotAllocate) {
  std::string name;
  name.reserve(64);
  for (std::string_view kernel : {std::string_view("cpu_reference"), std::string_view("cpu_flash"), kAutoKernel}) {
    SCOPED_TRACE(std::string(kernel));
    ForwardArgs f = fwd();
    BackwardArgs b = bwd();
    ForwardArgs vf = vfwd();
    f.kernel = b.kernel = vf.kernel = kernel;
    // cpu_flash's workspace grows with its threads: pin them, so the fixture's workspace
    // fits on any machine.
    f.num_threads = b.num_threads = vf.num_threads = 2;
    Status sf, sb, sv, sw, sk;
    size_t bytes = 0;
    EXPECT_EQ(news_of([&] { sf = forward(f); }), 0);
    EXPECT_EQ(news_of([&] { sb = backward(b); }), 0);
    EXPECT_EQ(news_of([&] { sv = forward(vf); }), 0);
    EXPECT_EQ(news_of([&] { sw = workspace_size(b, &bytes); }), 0);
    EXPECT_EQ(news_of([&] { sk = select_kernel(f, &name); }), 0);
    for (const Status& s : {sf, sb, sv, sw, sk}) EXPECT_OK(s);
  }
}

// forward_kvcache composes forward() per sequence, with and without new rows: its success
// path allocates nothing either (a contiguous cache: the fixture's k and v, one row of each
// sequence's cache overwritten by the new one).
TEST_F(AllocationTest, KvCacheDoesNotAllocate) {
  HostTensor k_new(DType::kF32, {B, 1, Hkv, D}), v_new(DType::kF32, {B, 1, Hkv, D});
  std::mt19937_64 rng = rng_for("AllocationTest.KvCache");
  k_new.fill_random(rng);
  v_new.fill_random(rng);
  HostTensor lens(DType::kI32, {B});
  for (int b = 0; b < B; ++b) lens.set(b, Sk - 1);
  for (std::string_view kernel : {std::string_view("cpu_reference"), std::string_view("cpu_flash")}) {
    SCOPED_TRACE(std::string(kernel));
    const ForwardArgs f = fwd();
    KvCacheArgs a;
    static_cast<CommonArgs&>(a) = static_cast<const CommonArgs&>(f);
    a.kernel = kernel;
    a.num_threads = 2;
    a.q = f.q, a.k_cache = f.k, a.v_cache = f.v, a.out = f.out, a.maybe_lse = f.maybe_lse;
    size_t bytes = 0;
    ASSERT_OK(workspace_size(a, &bytes));
    ASSERT_LE(bytes, a.workspace_bytes);
    Status plain, appended;
    EXPECT_EQ(news_of([&] { plain = forward_kvcache(a); }), 0);
    a.maybe_k_new = k_new.view(), a.maybe_v_new = v_new.view(), a.maybe_cache_seqlens = lens.view();
    EXPECT_EQ(news_of([&] { appended = forward_kvcache(a); }), 0);
    EXPECT_OK(plain);
    EXPECT_OK(appended);
  }
}

// Dropout under "auto": cpu_flash has no dropout, cpu_reference takes the call. The kernel
// that refuses must not cost an allocation when another one accepts.
TEST_F(AllocationTest, AutoSkipsARefusingKernelWithoutAllocating) {
  ForwardArgs f = fwd();
  f.kernel = kAutoKernel;
  f.dropout_p = 0.25f;
  f.dropout_seed = 7;
  std::string name;
  name.reserve(64);
  Status s;
  EXPECT_EQ(news_of([&] { s = select_kernel(f, &name); }), 0);
  EXPECT_OK(s);
  EXPECT_EQ(name, "cpu_reference");
  EXPECT_EQ(news_of([&] { s = forward(f); }), 0);
  EXPECT_OK(s);
}

TEST_F(AllocationTest, TheCounterCountsAnErrorMessage) {
  ForwardArgs f = fwd();
  f.num_threads = -1;
  Status s;
  EXPECT_GT(news_of([&] { s = forward(f); }), 0);
  EXPECT_FALSE(s.ok());
}

}  // namespace
}  // namespace flashlab::test
