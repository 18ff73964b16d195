// Shared-memory load throughput by access pattern (perf-notes v39): how many cycles an SM spends
// on one warp-wide LDS.32 / LDS.64 / LDS.128 when the warp's threads share addresses in
// different ways, i.e. whether the hardware merges identical addresses across the quarter
// warps of a 128-bit load (the question behind the exact tinyBLAS tile's layout).
//   nvcc -O3 -arch=sm_90a -o /tmp/lds_probe tools/probes/lds_probe.cu && /tmp/lds_probe
// Each block (512 threads, one an SM) issues kIters independent loads a thread from its pattern;
// the figure is the block's cycles (clock64 between two barriers around the loop) over the warp
// instructions it issued: at one wavefront a cycle, that is the wavefronts an instruction.
// Measured on an H100 80GB HBM3 (2026-12-06, before the loads were volatile): LDS.128 4.00 when
// the warp's 32 addresses are distinct or only quarter warps share them, 2.02 when threads Tn
// and Tn ^ 1 (or Tn ^ 2) share theirs (the whole warp on one address is the same case): a
// 128-bit load costs 4 wavefronts unless adjacent threads pair up. The LDS.32 / LDS.64 rows of
// that run (0.29 / 0.54) were loads ptxas hoisted out of the loop, not a measurement.
#include <cstdint>
#include <cstdio>

constexpr int kThreads = 512, kIters = 4096;

// slot (16-byte unit for V = 4, 8-byte for V = 2, 4-byte for V = 1) thread t reads
__device__ __forceinline__ int slot_of(int pattern, int t) {
  switch (pattern) {
    case 0: return 0;       // the whole warp one address
    case 1: return t % 8;   // each quarter warp the same 8 adjacent slots
    case 2: return t / 4;   // each quarter warp 2 slots, the warp 8 adjacent slots
    case 3: return t;       // 32 distinct adjacent slots
    case 4: return t % 16;  // the two half warps the same 16 slots
    default: return (t % 8) + 8 * ((t / 16) % 2);  // quarters 0, 2 share; 1, 3 share
  }
}

template <int V>
__global__ void probe(int pattern, unsigned long long* cycles, uint32_t* sink) {
  __shared__ __align__(16) uint32_t sm[8192];
  for (int i = threadIdx.x; i < 8192; i += kThreads) sm[i] = i * 2654435761u;
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const int base = slot_of(pattern, lane) * V;
  uint32_t acc0 = 0, acc1 = 0;
  __syncthreads();
  const unsigned long long t0 = clock64();
#pragma unroll 16
  for (int i = 0; i < kIters; ++i) {
    const int off = base + ((i & 15) * 256);  // 16 different regions, same banks
    // ld.volatile and volatile asm: neither nvcc nor ptxas may merge or hoist the loads (a plain
    // ld.shared was hoisted out of the loop by ptxas for LDS.32 / LDS.64: impossible 0.29 / 0.54)
    const auto a = static_cast<uint32_t>(__cvta_generic_to_shared(sm + off));
    if constexpr (V == 4) {
      uint32_t x, y, z, w;
      asm volatile("ld.volatile.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(x), "=r"(y), "=r"(z), "=r"(w)
                   : "r"(a));
      acc0 ^= x ^ y ^ z;
      acc1 ^= w;
    } else if constexpr (V == 2) {
      uint32_t x, y;
      asm volatile("ld.volatile.shared.v2.u32 {%0, %1}, [%2];" : "=r"(x), "=r"(y) : "r"(a));
      acc0 ^= x;
      acc1 ^= y;
    } else {
      uint32_t x;
      asm volatile("ld.volatile.shared.u32 %0, [%1];" : "=r"(x) : "r"(a));
      acc0 ^= x;
    }
  }
  __syncthreads();  // the block's time: every warp's loads done
  const unsigned long long t1 = clock64();
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
  if ((acc0 ^ acc1) == 0x12345678u) sink[0] = acc0;  // keeps the loads (both accumulators live)
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  unsigned long long* cyc = nullptr;
  uint32_t* sink = nullptr;
  cudaMalloc(&cyc, sizeof(unsigned long long) * sms);
  cudaMalloc(&sink, 4);
  const char* names[] = {"all one address",   "quarters share 8 slots", "warp 8 slots (4 thr each)",
                         "32 distinct slots", "halves share 16 slots",  "quarters 0,2 / 1,3 share"};
  const double warp_instr = static_cast<double>(kThreads / 32) * kIters;
  std::printf("cycles an SM per warp-wide load (one block of %d threads an SM)\n", kThreads);
  for (int v : {1, 2, 4}) {
    for (int p = 0; p < 6; ++p) {
      cudaMemset(cyc, 0, sizeof(unsigned long long) * sms);
      if (v == 1) probe<1><<<sms, kThreads>>>(p, cyc, sink);
      if (v == 2) probe<2><<<sms, kThreads>>>(p, cyc, sink);
      if (v == 4) probe<4><<<sms, kThreads>>>(p, cyc, sink);
      const cudaError_t le = cudaGetLastError();
      if (le != cudaSuccess) {
        std::printf("launch failed: %s\n", cudaGetErrorString(le));
        return 1;
      }
      unsigned long long h[1024] = {};
      cudaMemcpy(h, cyc, sizeof(unsigned long long) * sms, cudaMemcpyDeviceToHost);
      std::printf("LDS.%-3d %-28s %6.2f\n", 32 * v, names[p],
                  static_cast<double>(h[0]) / warp_instr);
    }
  }
  const cudaError_t e = cudaDeviceSynchronize();
  std::printf("%s\n", cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
