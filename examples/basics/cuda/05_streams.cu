// Basics 5 — streams: pinned memory, async copies, and copy/compute overlap.
//
// A host array goes to the GPU, a kernel hashes every element (`rounds` rounds of
// v = (v ^ v >> 16)·0x45d9f3b), and the result comes back, three ways:
//   pageable_serial  malloc'd host memory, cudaMemcpy in, kernel, cudaMemcpy out: the driver
//                    stages pageable memory through its own pinned buffer
//   pinned_serial    cudaMallocHost memory, the same three steps with cudaMemcpyAsync on one
//                    stream: copies run by DMA straight from the page-locked buffer
//   pinned_streams   the array cut into chunks, chunk c on stream c % 4: the copy in of one
//                    chunk, the kernel of another and the copy out of a third run at once (the
//                    copy engines for each direction and the SMs are separate hardware)
//
// What it shows: on one stream, time = in + kernel + out; overlapped, it approaches the
// longest of the three plus one chunk of the others. The program prints each stage's time,
// their sum, the three totals (host wall clock, median of 5), and a per-chunk timeline of
// the streamed run from cudaEvents. Measured: docs/learn/basics/05-streams.md.
//
// CPU check: the hash over the whole array against the hash applied chunk by chunk with
// the chunk bounds the streamed run uses (a chunk skipped or done twice changes the result).
// Every GPU result must equal the CPU one exactly (integer arithmetic).
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "basics.cuh"

__host__ __device__ inline uint32_t hash_rounds(uint32_t v, int rounds) {
  for (int r = 0; r < rounds; ++r) v = (v ^ (v >> 16)) * 0x45d9f3bu;
  return v;
}

__global__ void hash_kernel(uint32_t* x, size_t n, int rounds) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    x[i] = hash_rounds(x[i], rounds);
}

// Chunk c of `chunks` over n elements: [begin, end); the last chunk takes the remainder.
struct Range {
  size_t begin, end;
};
static Range chunk_range(size_t n, int chunks, int c) {
  size_t size = (n + chunks - 1) / chunks;
  return {std::min(n, c * size), std::min(n, (c + 1) * size)};
}

static double wall_ms(const std::chrono::steady_clock::time_point& t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

int main(int argc, char** argv) {
  const bool quick = basics::quick_mode(argc, argv);
  const size_t n = quick ? (size_t(1) << 20) + 5 : size_t(1) << 26;  // 4 MiB or 256 MiB
  const int rounds = int(basics::int_flag(argc, argv, "--rounds", quick ? 8 : 64));
  const int chunks = int(basics::int_flag(argc, argv, "--chunks", quick ? 4 : 16));
  constexpr int kStreams = 4;
  std::printf("streams, n = %zu uint32 (%.0f MiB), %d rounds, %d chunks on %d streams\n", n,
              n * 4.0 / (1 << 20), rounds, chunks, kStreams);

  std::vector<uint32_t> in(n), ref(n), by_chunk(n);
  for (size_t i = 0; i < n; ++i) in[i] = uint32_t(i) * 2654435761u;
  for (size_t i = 0; i < n; ++i) ref[i] = hash_rounds(in[i], rounds);
  for (int c = 0; c < chunks; ++c) {
    Range r = chunk_range(n, chunks, c);
    for (size_t i = r.begin; i < r.end; ++i) by_chunk[i] = hash_rounds(in[i], rounds);
  }
  basics::require(by_chunk == ref, "cpu check: chunk by chunk equals the whole array");
  if (!basics::gpu_or_skip()) return 0;

  const size_t bytes = n * sizeof(uint32_t);
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int blocks = 4 * sms, threads = 256;
  uint32_t *pinned_in = nullptr, *pinned_out = nullptr, *d = nullptr;
  CUDA_CHECK(cudaMallocHost(&pinned_in, bytes));
  CUDA_CHECK(cudaMallocHost(&pinned_out, bytes));
  std::copy(in.begin(), in.end(), pinned_in);
  std::vector<uint32_t> pageable_out(n);
  CUDA_CHECK(cudaMalloc(&d, bytes));
  cudaStream_t streams[kStreams];
  for (cudaStream_t& s : streams) CUDA_CHECK(cudaStreamCreate(&s));

  auto pageable_serial = [&] {
    CUDA_CHECK(cudaMemcpy(d, in.data(), bytes, cudaMemcpyHostToDevice));
    hash_kernel<<<blocks, threads>>>(d, n, rounds);
    CUDA_CHECK(cudaMemcpy(pageable_out.data(), d, bytes, cudaMemcpyDeviceToHost));
  };
  auto pinned_serial = [&] {
    CUDA_CHECK(cudaMemcpyAsync(d, pinned_in, bytes, cudaMemcpyHostToDevice, streams[0]));
    hash_kernel<<<blocks, threads, 0, streams[0]>>>(d, n, rounds);
    CUDA_CHECK(cudaMemcpyAsync(pinned_out, d, bytes, cudaMemcpyDeviceToHost, streams[0]));
    CUDA_CHECK(cudaStreamSynchronize(streams[0]));
  };
  // events: when non-null, 4 per chunk are recorded on its stream: before the copy in, then
  // after the copy in, the kernel and the copy out (each stage ends where the next begins).
  auto pinned_streams = [&](cudaEvent_t* events) {
    for (int c = 0; c < chunks; ++c) {
      Range r = chunk_range(n, chunks, c);
      cudaStream_t s = streams[c % kStreams];
      size_t len = r.end - r.begin;
      auto mark = [&](int k) { if (events) CUDA_CHECK(cudaEventRecord(events[4 * c + k], s)); };
      mark(0);
      CUDA_CHECK(cudaMemcpyAsync(d + r.begin, pinned_in + r.begin, len * 4,
                                 cudaMemcpyHostToDevice, s));
      mark(1);
      hash_kernel<<<blocks / kStreams, threads, 0, s>>>(d + r.begin, len, rounds);
      mark(2);
      CUDA_CHECK(cudaMemcpyAsync(pinned_out + r.begin, d + r.begin, len * 4,
                                 cudaMemcpyDeviceToHost, s));
      mark(3);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
  };

  struct Variant {
    const char* name;
    std::function<void()> run;
    const uint32_t* out;
  };
  const std::vector<Variant> variants = {
      {"pageable_serial", pageable_serial, pageable_out.data()},
      {"pinned_serial", pinned_serial, pinned_out},
      {"pinned_streams", [&] { pinned_streams(nullptr); }, pinned_out},
  };
  for (const Variant& v : variants) {
    std::fill(pinned_out, pinned_out + n, 0u);
    std::fill(pageable_out.begin(), pageable_out.end(), 0u);
    v.run();
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaGetLastError());
    std::string what = std::string("gpu check: ") + v.name + " equals the CPU exactly";
    basics::require(std::equal(ref.begin(), ref.end(), v.out), what.c_str());
  }

  // Each stage alone, pinned, one stream, the whole array (cudaEvent timer).
  const float t_in = basics::median_ms([&] {
    CUDA_CHECK(cudaMemcpyAsync(d, pinned_in, bytes, cudaMemcpyHostToDevice, streams[0]));
  }, 5, streams[0]);
  const float t_kernel = basics::median_ms([&] {
    hash_kernel<<<blocks, threads, 0, streams[0]>>>(d, n, rounds);
  }, 5, streams[0]);
  const float t_out = basics::median_ms([&] {
    CUDA_CHECK(cudaMemcpyAsync(pinned_out, d, bytes, cudaMemcpyDeviceToHost, streams[0]));
  }, 5, streams[0]);
  std::printf("\nstages alone: copy in %.2f ms (%.1f GB/s), kernel %.2f ms, copy out %.2f ms "
              "(%.1f GB/s); sum %.2f ms\n", t_in, basics::gbps(bytes, t_in), t_kernel, t_out,
              basics::gbps(bytes, t_out), t_in + t_kernel + t_out);

  std::printf("\n%-16s %10s %14s\n", "variant", "ms", "of stage sum");
  for (const Variant& v : variants) {
    std::vector<double> ms;
    for (int rep = 0; rep < 6; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      v.run();
      CUDA_CHECK(cudaDeviceSynchronize());
      if (rep > 0) ms.push_back(wall_ms(t0));  // the first run is a warm-up
    }
    std::sort(ms.begin(), ms.end());
    std::printf("%-16s %10.2f %13.0f%%\n", v.name, ms[2],
                100.0 * ms[2] / (t_in + t_kernel + t_out));
  }

  // The timeline of one streamed run: each chunk's three stages, ms after the first event.
  std::vector<cudaEvent_t> events(4 * chunks);
  for (cudaEvent_t& e : events) CUDA_CHECK(cudaEventCreate(&e));
  pinned_streams(events.data());
  std::printf("\ntimeline of pinned_streams (ms from the first copy's start)\n");
  std::printf("%-6s %-7s %16s %16s %16s\n", "chunk", "stream", "copy in", "kernel", "copy out");
  for (int c = 0; c < chunks; ++c) {
    float t[4];
    for (int k = 0; k < 4; ++k)
      CUDA_CHECK(cudaEventElapsedTime(&t[k], events[0], events[4 * c + k]));
    std::printf("%-6d %-7d %7.2f - %6.2f %7.2f - %6.2f %7.2f - %6.2f\n", c, c % kStreams, t[0],
                t[1], t[1], t[2], t[2], t[3]);
  }
  for (cudaEvent_t& e : events) CUDA_CHECK(cudaEventDestroy(e));
  for (cudaStream_t& s : streams) CUDA_CHECK(cudaStreamDestroy(s));
  CUDA_CHECK(cudaFreeHost(pinned_in));
  CUDA_CHECK(cudaFreeHost(pinned_out));
  CUDA_CHECK(cudaFree(d));
  return 0;
}
