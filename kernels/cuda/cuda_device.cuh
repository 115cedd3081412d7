// What the CUDA kernel files (cuda_kernels.cu, cuda_dsv4.cu, cuda_attention.cu) share: launches and
// dynamic shared memory, block-wide reductions, the grid of an elementwise launch, the attention
// kernels' tiling.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/cuda_kernels.h"

// Kernel launches and dynamic shared memory, written so that the CPU emulation of the CUDA
// runtime (tests/cuda_emu, EXPERTD_CUDA_EMULATION) can compile this file as C++ and run it.
#ifdef EXPERTD_CUDA_EMULATION
#define EXPERTD_LAUNCH(kernel, grid, block, shared, stream) \
  ::cuda_emu::launch(kernel, dim3(grid), dim3(block), shared, stream)
#define EXPERTD_DYNAMIC_SHARED(type, name) \
  type* name = static_cast<type*>(::cuda_emu::dynamic_shared())
#else
#define EXPERTD_LAUNCH(kernel, grid, block, shared, stream) kernel<<<grid, block, shared, stream>>>
#define EXPERTD_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif

namespace kernels::cuda {

__device__ inline float block_sum(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // `shared` may still be read from a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = 0;
  for (int i = 0; i < int(blockDim.x / 32); ++i) v += shared[i];
  return v;
}

__device__ inline float block_max(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = -INFINITY;
  for (int i = 0; i < int(blockDim.x / 32); ++i) v = fmaxf(v, shared[i]);
  return v;
}

inline unsigned blocks_for(int64_t n, int threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

// Attention (attention_kernel, dsv4_attention_kernel): threads of a block, keys per chunk of
// scores in shared memory, output dims per thread.
inline constexpr int kAttnThreads = 128, kAttnChunk = 1024;
inline constexpr int kAttnDvPerThread = static_cast<int>(kMaxAttentionDv / kAttnThreads);

}  // namespace kernels::cuda
