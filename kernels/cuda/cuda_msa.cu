// MiniMax-M3's sparse attention (MSA) on CUDA (see cuda_kernels.h): the block scores of the
// indexer and each (token, KV head)'s position list of its selected blocks for attention_kernel.
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_device.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace kernels::cuda {
namespace {

// One block per (token, head, block of positions): the largest score of the block's visible
// positions (a thread per position, the dot in order as fmaf), -inf past the token's own block,
// plus the forcing bias on the local blocks.
__global__ void msa_block_scores_kernel(BlockScores a) {
  __shared__ float red[32];
  const int64_t b = blockIdx.x, h = blockIdx.y, t = blockIdx.z, pos = a.pos0 + t, L = pos / a.block;
  const float* qh = a.q + (t * a.heads + h) * a.dim;
  float m = -INFINITY;
  const int64_t first = b * a.block, last = first + a.block - 1 < pos ? first + a.block - 1 : pos;
  for (int64_t p = first + threadIdx.x; p <= last; p += blockDim.x) {
    const float* k = a.keys + p * a.key_row;
    float d = 0;
    for (int64_t i = 0; i < a.dim; ++i) d = fmaf(qh[i], k[i], d);
    m = fmaxf(m, d);
  }
  m = block_max(m, red);
  if (threadIdx.x == 0) {
    if (b <= L && L - b < a.local) m += 1e30f;
    a.scores[(t * a.heads + h) * a.n_blocks + b] = m;
  }
}

constexpr int64_t kMsaMaxBlocks = 256;  // block ids per (token, KV head)

// One thread per (token, KV head): its block ids in ascending order (insertion; k is small),
// then each block's positions the token sees.
__global__ void msa_block_positions_kernel(const int32_t* blocks, int64_t n_tokens,
                                           int64_t n_head_kv, int64_t per_kv, int64_t block,
                                           int64_t pos0, int64_t window, int32_t* sel,
                                           int32_t* sel_n, int64_t stride) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_tokens * n_head_kv) return;
  const int64_t t = i / n_head_kv, n_keys = pos0 + t + 1,
                first = window > 0 && n_keys > window ? n_keys - window : 0;
  const int32_t* ids = blocks + i * per_kv;  // the token's row, this KV head's part
  int32_t sorted[kMsaMaxBlocks];
  int64_t n = 0;
  for (int64_t j = 0; j < per_kv; ++j) {
    const int32_t v = ids[j];
    if (v < 0) continue;
    int64_t at = n++;
    for (; at > 0 && sorted[at - 1] > v; --at) sorted[at] = sorted[at - 1];
    sorted[at] = v;
  }
  int32_t* s = sel + i * stride;
  int64_t m = 0;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t b = sorted[j];
    const int64_t lo = b * block > first ? b * block : first,
                  hi = (b + 1) * block < n_keys ? (b + 1) * block : n_keys;
    for (int64_t p = lo; p < hi; ++p) s[m++] = int32_t(p);
  }
  sel_n[i] = int32_t(m);
}

}  // namespace

cudaError_t msa_block_scores(const BlockScores& a, cudaStream_t stream) {
  if (a.n_tokens <= 0 || a.n_blocks <= 0) return cudaSuccess;
  EXPERTD_LAUNCH(msa_block_scores_kernel,
                 dim3(unsigned(a.n_blocks), unsigned(a.heads), unsigned(a.n_tokens)), 128, 0,
                 stream)
  (a);
  return cudaGetLastError();
}

cudaError_t msa_block_positions(const int32_t* blocks, int64_t n_tokens, int64_t n_head_kv,
                                int64_t per_kv, int64_t block, int64_t pos0, int64_t window,
                                int32_t* sel, int32_t* sel_n, int64_t stride, cudaStream_t stream) {
  const int64_t n = n_tokens * n_head_kv;
  if (n <= 0) return cudaSuccess;
  if (stride < per_kv * block || per_kv > kMsaMaxBlocks) return cudaErrorInvalidValue;
  EXPERTD_LAUNCH(msa_block_positions_kernel, blocks_for(n, 128), 128, 0, stream)
  (blocks, n_tokens, n_head_kv, per_kv, block, pos0, window, sel, sel_n, stride);
  return cudaGetLastError();
}

}  // namespace kernels::cuda
