// DeepSeek-V4's CUDA kernels (see cuda_kernels.h): hyper-connections, the compressors, the
// lightning indexer's scores, the attention over the window ring and compressed entries.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstring>

#include "kernels/cuda/cuda_device.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace kernels::cuda {
namespace {

constexpr int kMaxHc = 16;

// Post weights and the Sinkhorn-normalised combination of one token's mixes (as the CPU's
// hc_weights, ggml's fused dsv4_hc_comb).
__device__ void hc_weights(const float* m, const float* sc, const float* b, int hc, int iters,
                           float eps, float* pc) {
  for (int h = 0; h < hc; ++h) pc[h] = 2.0f / (1.0f + expf(-(m[hc + h] * sc[1] + b[hc + h])));
  float* comb = pc + hc;
  for (int src = 0; src < hc; ++src) {
    float mx = -INFINITY;
    for (int dst = 0; dst < hc; ++dst) {
      const int i = dst + hc * src;
      comb[i] = m[2 * hc + i] * sc[2] + b[2 * hc + i];
      mx = fmaxf(mx, comb[i]);
    }
    float sum = 0.0f;
    for (int dst = 0; dst < hc; ++dst) {
      const int i = dst + hc * src;
      comb[i] = expf(comb[i] - mx);
      sum += comb[i];
    }
    const float inv = 1.0f / sum;
    for (int dst = 0; dst < hc; ++dst) comb[dst + hc * src] = comb[dst + hc * src] * inv + eps;
  }
  for (int it = 0; it < iters; ++it) {
    if (it > 0)
      for (int src = 0; src < hc; ++src) {  // rows: per src, over dst
        float sum = eps;
        for (int dst = 0; dst < hc; ++dst) sum += comb[dst + hc * src];
        const float inv = 1.0f / sum;
        for (int dst = 0; dst < hc; ++dst) comb[dst + hc * src] *= inv;
      }
    for (int dst = 0; dst < hc; ++dst) {  // columns: per dst, over src
      float sum = eps;
      for (int src = 0; src < hc; ++src) sum += comb[dst + hc * src];
      const float inv = 1.0f / sum;
      for (int src = 0; src < hc; ++src) comb[dst + hc * src] *= inv;
    }
  }
}

__global__ void hc_pre_kernel(const float* x, const float* mixes, const float* sc, const float* b,
                              int hc, int iters, float eps, bool head, float* out, float* pc,
                              int64_t n) {
  __shared__ float pre[kMaxHc];
  const int64_t t = blockIdx.x;
  const int mix_w = head ? hc : (2 + hc) * hc;
  if (threadIdx.x == 0) {
    const float* m = mixes ? mixes + t * mix_w : nullptr;
    for (int h = 0; h < hc; ++h)
      pre[h] = m ? 1.0f / (1.0f + expf(-(m[h] * sc[0] + b[h]))) + eps : 1.0f / float(hc);
    if (!head) hc_weights(m, sc, b, hc, iters, eps, pc + t * (hc + hc * hc));
  }
  __syncthreads();
  const float* xs = x + t * hc * n;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    float sum = 0.0f;
    for (int h = 0; h < hc; ++h) sum += xs[h * n + i] * pre[h];
    out[t * n + i] = sum;
  }
}

__global__ void hc_post_kernel(const float* f, const float* x, const float* pc, int hc, float* out,
                               int64_t n, int64_t total) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int64_t i = idx % n, dst = (idx / n) % hc, t = idx / (n * hc);
  const float* p = pc + t * (hc + hc * hc);
  const float* xs = x + t * hc * n;
  float sum = f[t * n + i] * p[dst];
  for (int src = 0; src < hc; ++src) sum += xs[src * n + i] * p[hc + dst + hc * src];
  out[idx] = sum;
}

__global__ void repeat_rows_kernel(const float* x, int n, float* out, int64_t cols, int64_t total) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int64_t c = idx % cols, r = idx / (cols * n);
  out[idx] = x[r * cols + c];
}

// One block, tokens in order (a block's entry needs its positions' rows).
__global__ void dsv4_compress_kernel(Dsv4Compress c) {
  __shared__ float red[32];
  EXPERTD_DYNAMIC_SHARED(float, ent);  // dim floats
  const int64_t w = c.width, d = c.dim, r = c.ratio;
  const bool overlap = w == 2 * d;
  const int64_t n = overlap ? 2 * r : r;
  for (int64_t t = 0; t < c.n_tokens; ++t) {
    const int64_t p = c.pos0 + t, slot = p % c.slots;
    const float* bias = c.ape + (p % r) * w;
    for (int64_t i = threadIdx.x; i < w; i += blockDim.x) {
      c.pend_kv[slot * w + i] = c.kv[t * w + i];
      c.pend_score[slot * w + i] = c.score[t * w + i] + bias[i];
    }
    __syncthreads();
    if ((p + 1) % r != 0) continue;
    const int64_t blk = p / r, start = blk * r;
    for (int64_t ch = threadIdx.x; ch < d; ch += blockDim.x) {
      float mx = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        int64_t pos = start + j, off = ch;
        if (overlap) pos = j < r ? start - r + j : start + j - r, off = j < r ? ch : d + ch;
        if (pos >= 0) mx = fmaxf(mx, c.pend_score[(pos % c.slots) * w + off]);
      }
      double sum = 0, acc = 0;
      for (int64_t j = 0; j < n; ++j) {
        int64_t pos = start + j, off = ch;
        if (overlap) pos = j < r ? start - r + j : start + j - r, off = j < r ? ch : d + ch;
        if (pos < 0) continue;
        sum += expf(c.pend_score[(pos % c.slots) * w + off] - mx);
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t j = 0; j < n; ++j) {
        int64_t pos = start + j, off = ch;
        if (overlap) pos = j < r ? start - r + j : start + j - r, off = j < r ? ch : d + ch;
        if (pos < 0) continue;
        const int64_t sl = pos % c.slots;
        acc += double(c.pend_kv[sl * w + off] * (expf(c.pend_score[sl * w + off] - mx) * inv));
      }
      ent[ch] = static_cast<float>(acc);
    }
    float ss = 0;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) ss += ent[i] * ent[i];
    ss = block_sum(ss, red);  // its barriers also publish ent[]
    const float scale = rsqrtf(ss / d + c.eps);
    float* e = c.entries + blk * d;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) e[i] = ent[i] * scale * c.norm[i];
    __syncthreads();
    // the rotation at the block's first position, adjacent pairs of the last n_rot dims
    const float theta_scale = powf(c.rope_base, -2.0f / float(c.n_rot));
    for (int64_t i = threadIdx.x; i < c.n_rot / 2; i += blockDim.x) {
      float theta_extrap = float(start);
      for (int64_t j = 0; j < i; ++j) theta_extrap *= theta_scale;
      float theta = theta_extrap, ms = 1.0f;
      if (c.use_yarn) {
        const float interp = c.yarn.freq_scale * theta_extrap;
        const float y =
            (float(i) - c.yarn.corr_low) / fmaxf(0.001f, c.yarn.corr_high - c.yarn.corr_low);
        const float ramp = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * c.yarn.ext_factor;
        theta = interp * (1.0f - ramp) + theta_extrap * ramp;
        ms = c.yarn.mscale;
      }
      float* x = e + d - c.n_rot + 2 * i;
      const float cs = cosf(theta) * ms, sn = sinf(theta) * ms, x0 = x[0], x1 = x[1];
      x[0] = x0 * cs - x1 * sn;
      x[1] = x0 * sn + x1 * cs;
    }
    __syncthreads();
  }
}

__global__ void dsv4_index_kernel(const float* q, const float* w, const float* entries,
                                  float* scores, int64_t pos0, int64_t ratio, int64_t heads,
                                  int64_t dim, int64_t n_max, float scale) {
  const int64_t t = blockIdx.y, j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= n_max) return;
  const int64_t n_vis = (pos0 + t + 1) / ratio;
  if (j >= n_vis) {
    scores[t * n_max + j] = -INFINITY;
    return;
  }
  const float* k = entries + j * dim;
  float sum = 0.0f;
  for (int64_t h = 0; h < heads; ++h) {
    const float* qh = q + (t * heads + h) * dim;
    float d = 0;
    for (int64_t i = 0; i < dim; ++i) d = fmaf(qh[i], k[i], d);
    sum += fmaxf(d, 0.0f) * (w[t * heads + h] * scale);
  }
  scores[t * n_max + j] = sum;
}

// As attention_kernel: chunks of keys, a running maximum and denominator, the sink last.
__global__ void dsv4_attention_kernel(Dsv4Attention a) {
  __shared__ float s[kAttnChunk];
  __shared__ float red[32];
  const int64_t t = blockIdx.x / a.n_head, h = blockIdx.x % a.n_head, p = a.pos0 + t, D = a.dim;
  const int64_t first = p - a.window + 1 > 0 ? p - a.window + 1 : 0, n_raw = p - first + 1;
  const int64_t n = n_raw + a.sel_n[t];
  const int32_t* sel = a.sel + t * a.sel_stride;
  auto key = [&](int64_t j) -> const float* {
    if (j < n_raw) {
      const int64_t pos = first + j;
      return pos >= a.pos0 ? a.kv + (pos - a.pos0) * D : a.ring + (pos % a.window) * D;
    }
    return a.entries + int64_t(sel[j - n_raw]) * D;
  };
  const float* qh = a.q + (t * a.n_head + h) * D;
  const float sink = a.sinks ? a.sinks[h] : -INFINITY;
  float m = sink, l = 0, acc[kAttnDvPerThread] = {};
  for (int64_t c0 = 0; c0 < n; c0 += kAttnChunk) {
    const int64_t cn = n - c0 < kAttnChunk ? n - c0 : kAttnChunk;
    float cmax = -INFINITY;
    for (int64_t j = threadIdx.x; j < cn; j += blockDim.x) {
      const float* kj = key(c0 + j);
      float d = 0;
      for (int64_t i = 0; i < D; ++i) d = fmaf(qh[i], kj[i], d);
      s[j] = d * a.scale;
      cmax = fmaxf(cmax, s[j]);
    }
    const float m_new = fmaxf(m, block_max(cmax, red));
    float csum = 0;
    for (int64_t j = threadIdx.x; j < cn; j += blockDim.x) {
      s[j] = expf(s[j] - m_new);
      csum += s[j];
    }
    csum = block_sum(csum, red);
    const float corr = expf(m - m_new);
    l = l * corr + csum;
#pragma unroll
    for (int i = 0; i < kAttnDvPerThread; ++i) {
      const int64_t d = threadIdx.x + int64_t(i) * blockDim.x;
      if (d >= D) break;
      float v = acc[i] * corr;
      for (int64_t j = 0; j < cn; ++j) v = fmaf(s[j], key(c0 + j)[d], v);
      acc[i] = v;
    }
    m = m_new;
    __syncthreads();
  }
  if (a.sinks) l += expf(sink - m);
  const float inv = 1.0f / l;
  float* o = a.out + (t * a.n_head + h) * D;
#pragma unroll
  for (int i = 0; i < kAttnDvPerThread; ++i) {
    const int64_t d = threadIdx.x + int64_t(i) * blockDim.x;
    if (d >= D) break;
    o[d] = acc[i] * inv;
  }
}

// One thread per token: its ids kept in ascending order by insertion (k is the indexer's top-k).
__global__ void dsv4_select_kernel(const int32_t* ids, int64_t n_tokens, int64_t pos0,
                                   int64_t ratio, int32_t* sel, int32_t* sel_n, int64_t stride) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n_tokens) return;
  int32_t* s = sel + t * stride;
  int64_t n = 0;
  if (ids) {
    for (int64_t j = 0; j < stride; ++j) {
      const int32_t v = ids[t * stride + j];
      if (v < 0) continue;
      int64_t i = n++;
      for (; i > 0 && s[i - 1] > v; --i) s[i] = s[i - 1];
      s[i] = v;
    }
  } else if (ratio > 0) {
    const int64_t n_vis = (pos0 + t + 1) / ratio;
    for (; n < n_vis && n < stride; ++n) s[n] = int32_t(n);
  }
  sel_n[t] = int32_t(n);
}

__global__ void dsv4_ring_kernel(const float* kv, float* ring, int64_t first, int64_t pos0,
                                 int64_t window, int64_t dim, int64_t total) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int64_t pos = first + idx / dim, i = idx % dim;
  ring[(pos % window) * dim + i] = kv[(pos - pos0) * dim + i];
}

}  // namespace

cudaError_t hc_pre(const float* x, const float* mixes, const float* scale, const float* base,
                   int hc, int sinkhorn_iters, float eps, bool head, float* out, float* pc,
                   int64_t n_tokens, int64_t n, cudaStream_t stream) {
  if (hc < 1 || hc > kMaxHc) return cudaErrorInvalidValue;
  if (n_tokens <= 0) return cudaSuccess;
  EXPERTD_LAUNCH(hc_pre_kernel, static_cast<unsigned>(n_tokens), 256, 0, stream)
  (x, mixes, scale, base, hc, sinkhorn_iters, eps, head, out, pc, n);
  return cudaGetLastError();
}

cudaError_t hc_post(const float* f, const float* x, const float* pc, int hc, float* out,
                    int64_t n_tokens, int64_t n, cudaStream_t stream) {
  const int64_t total = n_tokens * hc * n;
  if (total <= 0) return cudaSuccess;
  EXPERTD_LAUNCH(hc_post_kernel, blocks_for(total, 256), 256, 0, stream)
  (f, x, pc, hc, out, n, total);
  return cudaGetLastError();
}

cudaError_t repeat_rows(const float* x, int n, float* out, int64_t rows, int64_t cols,
                        cudaStream_t stream) {
  const int64_t total = rows * n * cols;
  if (total <= 0) return cudaSuccess;
  EXPERTD_LAUNCH(repeat_rows_kernel, blocks_for(total, 256), 256, 0, stream)
  (x, n, out, cols, total);
  return cudaGetLastError();
}

cudaError_t dsv4_compress(const Dsv4Compress& c, cudaStream_t stream) {
  if (c.n_tokens <= 0) return cudaSuccess;
  if (c.ratio < 1 || c.n_rot % 2 || c.n_rot > c.dim) return cudaErrorInvalidValue;
  EXPERTD_LAUNCH(dsv4_compress_kernel, 1, 256, c.dim * sizeof(float), stream)(c);
  return cudaGetLastError();
}

cudaError_t dsv4_index_scores(const float* q, const float* w, const float* entries, float* scores,
                              int64_t n_tokens, int64_t pos0, int64_t ratio, int64_t heads,
                              int64_t dim, int64_t n_max, float scale, cudaStream_t stream) {
  if (n_tokens <= 0 || n_max <= 0) return cudaSuccess;
  EXPERTD_LAUNCH(dsv4_index_kernel, dim3(blocks_for(n_max, 128), unsigned(n_tokens)), 128, 0,
                 stream)
  (q, w, entries, scores, pos0, ratio, heads, dim, n_max, scale);
  return cudaGetLastError();
}

cudaError_t dsv4_attention(const Dsv4Attention& a, cudaStream_t stream) {
  if (a.n_tokens <= 0) return cudaSuccess;
  if (a.dim > kMaxAttentionDv || a.window < 1) return cudaErrorInvalidValue;
  EXPERTD_LAUNCH(dsv4_attention_kernel, static_cast<unsigned>(a.n_tokens * a.n_head), kAttnThreads,
                 0, stream)
  (a);
  return cudaGetLastError();
}

cudaError_t dsv4_select(const int32_t* ids, int64_t n_tokens, int64_t pos0, int64_t ratio,
                        int32_t* sel, int32_t* sel_n, int64_t stride, cudaStream_t stream) {
  if (n_tokens <= 0) return cudaSuccess;
  EXPERTD_LAUNCH(dsv4_select_kernel, blocks_for(n_tokens, 64), 64, 0, stream)
  (ids, n_tokens, pos0, ratio, sel, sel_n, stride);
  return cudaGetLastError();
}

cudaError_t dsv4_ring_store(const float* kv, float* ring, int64_t n_tokens, int64_t pos0,
                            int64_t window, int64_t dim, cudaStream_t stream) {
  const int64_t first = std::max(pos0, pos0 + n_tokens - window);
  const int64_t total = (pos0 + n_tokens - first) * dim;
  if (total <= 0) return cudaSuccess;
  EXPERTD_LAUNCH(dsv4_ring_kernel, blocks_for(total, 256), 256, 0, stream)
  (kv, ring, first, pos0, window, dim, total);
  return cudaGetLastError();
}

}  // namespace kernels::cuda
