#pragma once
// Kernel launches with programmatic dependent launch (PDL, compute capability 9.0+).
//
// A decode step is ~150-220 small kernels; between two of them the GPU otherwise drains
// the first grid, flushes, and only then starts scheduling the second (~1-2 us each, more
// than many of these kernels take). Launched through launch_pdl(), the next kernel may be
// launched once every block of the previous one has passed its own griddep_wait() (see
// common.cuh for why not earlier); its blocks do the work that does not depend on it
// (address math, loading their weights) and then wait in griddep_wait() until the previous
// grid's writes are visible.
//
// Contract for every kernel launched this way (checked by review, exercised by the kernel
// and engine tests with PDL on and off):
//  - griddep_wait() comes before the first read of anything an earlier kernel wrote and
//    before the first write of anything an earlier kernel may still read;
//  - before it, only reads of data no kernel of this step writes: weights, norms, biases,
//    and what was written before the step's first kernel (the step's io buffer with n_past,
//    copied from the host before it; KV cache rows below n_past, written by earlier steps).
// Because each kernel waits for its predecessor's completion, and that one waited for its
// own, the wait orders the kernel after every earlier kernel in the stream.
#include <cuda_runtime.h>

#include "cuda_check.h"

namespace worker::kern {

// False when WORKER_NO_PDL is set in the environment (A/B measurements) or the current
// device is older than compute capability 9.0. Read once per process.
bool pdl_enabled();
// True for a kernel named in WORKER_PDL_SKIP (comma-separated kernel names): launched
// without the PDL attribute (bisecting an ordering problem to one kernel).
bool pdl_skipped(const char* kernel_name);
// Sets `kernel`'s shared-memory carveout to what the blocks that its registers and warps
// allow per SM need (static + `dynamic_bytes` each), once per kernel (thread-safe; kernels
// without shared memory keep the driver's choice). Left to itself the driver picks the
// smallest carveout that holds one block, which let only 1-3 blocks of the exact decode
// products run per SM (ncu, H100: 6-19% theoretical occupancy, 16-65 KB carveouts); asking
// for the largest everywhere cost the kernels that need little shared memory their L1
// (fast decode -1 to -2%). launch_pdl_smem() calls it for every launch.
void carveout_for_occupancy(const void* kernel, unsigned threads, size_t dynamic_bytes);
// SMs of the current device, read once (132 if the query fails): tile choices that only need
// the order of magnitude.
int sm_count();
// Dynamic shared memory that lets one block per SM (H100 / H200: 228 KB an SM, 1 KB a block
// reserved; two blocks of this much do not fit). A grid no larger than the SMs launched with
// at least this much runs one block on each of its SMs: with room for two, the blocks of the
// next launch (PDL, launched early) doubled up on some SMs while others idled.
constexpr size_t kOneBlockPerSmSmem = size_t{116} * 1024;
// The most dynamic shared memory a kernel needing `need` bytes is launched with (its
// cudaFuncAttributeMaxDynamicSharedMemorySize) ...
constexpr size_t one_block_per_sm_smem(size_t need) {
  return need > kOneBlockPerSmSmem ? need : kOneBlockPerSmSmem;
}
// ... and what a launch of `grid` asks for: one_block_per_sm_smem(need) when the grid is no
// larger than the SMs (one block on each), else `need`.
inline size_t smem_for_grid(dim3 grid, size_t need) {
  const int64_t blocks = static_cast<int64_t>(grid.x) * grid.y * grid.z;
  return blocks <= sm_count() ? one_block_per_sm_smem(need) : need;
}

template <typename... KArgs, typename... Args>
void launch_pdl_smem(const char* name, void (*kernel)(KArgs...), dim3 grid, dim3 block,
                     size_t smem_bytes, cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem_bytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1] = {};
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() && !pdl_skipped(name) ? 1 : 0;
  carveout_for_occupancy(reinterpret_cast<const void*>(kernel), block.x * block.y * block.z,
                         smem_bytes);
  cuda_check(cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...), name, __FILE__,
             __LINE__);
}

template <typename... KArgs, typename... Args>
void launch_pdl(const char* name, void (*kernel)(KArgs...), dim3 grid, dim3 block,
                cudaStream_t stream, Args... args) {
  launch_pdl_smem(name, kernel, grid, block, 0, stream, args...);
}

}  // namespace worker::kern
