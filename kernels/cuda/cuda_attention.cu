// Attention on CUDA (see cuda_kernels.h): the attention kernel every architecture's attention
// runs on (grouped queries, windows, chunks, sinks, position lists), the Walsh-Hadamard rotation of
// the lightning indexer's rows, and MiniMax-M3's sparse attention (MSA): the block scores of the
// indexer and each (token, KV head)'s position list of its selected blocks.
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_device.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace kernels::cuda {
namespace {

// One block per (token, head). The visible keys go by in chunks whose scores sit in shared memory;
// a running maximum, denominator and output (softmax rescaled as each chunk raises the maximum)
// carry across chunks, so any context fits. Each thread owns output dims d = tid + i * 128.
__global__ void attention_kernel(Attention a) {
  __shared__ float s[kAttnChunk];
  __shared__ float red[32];
  const int64_t t = blockIdx.x / a.n_head, h = blockIdx.x % a.n_head,
                kvh = h / (a.n_head / a.n_head_kv);
  const int64_t n_keys = a.n_past + t + 1;  // causal
  int64_t first = a.window > 0 && n_keys > a.window ? n_keys - a.window : 0;
  if (a.chunk > 0 && (n_keys - 1) / a.chunk * a.chunk > first)
    first = (n_keys - 1) / a.chunk * a.chunk;
  const int64_t list = a.sel_per_kv ? t * a.n_head_kv + kvh : t,
                n = a.sel ? a.sel_n[list] : n_keys - first;
  const int32_t* sel = a.sel ? a.sel + list * a.sel_stride : nullptr;
  // key j of the token's list: its position's row
  auto at = [&](int64_t j) { return sel ? int64_t(sel[j]) : first + j; };
  const float* qh = a.q + (t * a.n_head + h) * a.dk;
  const float* kb = a.k + kvh * a.dk;
  const float* vb = a.v + kvh * a.dv;
  const float sink = a.sinks ? a.sinks[h] : -INFINITY;
  float m = sink, l = 0, acc[kAttnDvPerThread] = {};
  for (int64_t c0 = 0; c0 < n; c0 += kAttnChunk) {
    const int64_t cn = n - c0 < kAttnChunk ? n - c0 : kAttnChunk;
    float cmax = -INFINITY;
    for (int64_t j = threadIdx.x; j < cn; j += blockDim.x) {
      const float* kj = kb + at(c0 + j) * a.k_row;
      float d = 0;
      for (int64_t i = 0; i < a.dk; ++i) d = fmaf(qh[i], kj[i], d);
      s[j] = d * a.scale;
      cmax = fmaxf(cmax, s[j]);
    }
    const float m_new = fmaxf(m, block_max(cmax, red));  // its barriers also publish s[]
    float csum = 0;
    for (int64_t j = threadIdx.x; j < cn; j += blockDim.x) {
      s[j] = expf(s[j] - m_new);
      csum += s[j];
    }
    csum = block_sum(csum, red);         // publishes the exponentials
    const float corr = expf(m - m_new);  // 0 on the first chunk without a sink
    l = l * corr + csum;
#pragma unroll
    for (int i = 0; i < kAttnDvPerThread; ++i) {
      const int64_t d = threadIdx.x + int64_t(i) * blockDim.x;
      if (d >= a.dv) break;
      float v = acc[i] * corr;
      for (int64_t j = 0; j < cn; ++j) v = fmaf(s[j], vb[at(c0 + j) * a.v_row + d], v);
      acc[i] = v;
    }
    m = m_new;
    __syncthreads();  // everyone is done with s[] before the next chunk overwrites it
  }
  if (a.sinks) l += expf(sink - m);
  const float inv = 1.0f / l;
  float* o = a.out + (t * a.n_head + h) * a.dv;
#pragma unroll
  for (int i = 0; i < kAttnDvPerThread; ++i) {
    const int64_t d = threadIdx.x + int64_t(i) * blockDim.x;
    if (d >= a.dv) break;
    o[d] = acc[i] * inv;
  }
}

__global__ void hadamard_kernel(float* x, int64_t n_blocks, int64_t n) {
  const int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= n_blocks) return;
  float* r = x + b * n;
  const float scale = 1.0f / sqrtf(float(n));
  for (int64_t i = 0; i < n; ++i) r[i] *= scale;
  for (int64_t len = 1; len < n; len <<= 1)
    for (int64_t i = 0; i < n; i += 2 * len)
      for (int64_t j = i; j < i + len; ++j) {
        const float u = r[j], v = r[j + len];
        r[j] = u + v, r[j + len] = u - v;
      }
}

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

cudaError_t attention(const Attention& a, cudaStream_t stream) {
  if (a.n_tokens <= 0) return cudaSuccess;
  if (a.n_head_kv <= 0 || a.n_head % a.n_head_kv != 0 || a.dk <= 0 || a.dv <= 0)
    return cudaErrorInvalidValue;
  if (a.dv > kMaxAttentionDv) return cudaErrorInvalidValue;
  EXPERTD_LAUNCH(attention_kernel, static_cast<unsigned>(a.n_tokens * a.n_head), kAttnThreads, 0,
                 stream)
  (a);
  return cudaGetLastError();
}

cudaError_t hadamard(float* x, int64_t n_blocks, int64_t n, cudaStream_t stream) {
  if (n_blocks <= 0) return cudaSuccess;
  if (n < 1 || (n & (n - 1))) return cudaErrorInvalidValue;
  EXPERTD_LAUNCH(hadamard_kernel, blocks_for(n_blocks, 64), 64, 0, stream)(x, n_blocks, n);
  return cudaGetLastError();
}
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
