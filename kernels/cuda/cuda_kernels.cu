// CUDA kernels (see cuda_kernels.h). Reference: the scalar CPU kernels in kernels/impl.inc and
// dequantize_row in kernels/kernels.cpp; tests/gpu/cuda_kernels_test.cpp checks every one.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstring>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/dequant.h"
#include "kernels/fp16.h"
#include "kernels/kernels.h"
#include "kernels/quant_blocks.h"

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
namespace {

// Every weight type the table marks `cuda` runs through one decoder shared with the CPU reference
// (kernels/dequant.h); each instantiates the matmul below.
template <uint32_t T>
__host__ __device__ __forceinline__ void chunk32(const uint8_t* row, int64_t c, float* w) {
  kernels::dequant32<T>(row, c, w);
}

int64_t block_elems(uint32_t t) {
  return kernels::type_traits(t)->block_elems;
}

template <uint32_t T>
void dequantize_host(const void* row, float* y, int64_t n) {
  for (int64_t c = 0; c < n / 32; ++c) chunk32<T>(static_cast<const uint8_t*>(row), c, y + c * 32);
}

constexpr int kTokensPerBlock = 8;
constexpr int kWarpsPerBlock = 4;

// One warp per weight row and up to kTokensPerBlock tokens: each lane dequantizes chunks of 32
// weights once and applies them to every token.
template <uint32_t T>
__global__ void matmul_kernel(const uint8_t* w, int64_t rows, int64_t cols, size_t row_bytes,
                              const float* x, int64_t n_tokens, float* y) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = int64_t(blockIdx.x) * kWarpsPerBlock + warp;
  if (r >= rows) return;
  const int64_t t0 = int64_t(blockIdx.y) * kTokensPerBlock;
  const int nt =
      static_cast<int>(n_tokens - t0 < kTokensPerBlock ? n_tokens - t0 : kTokensPerBlock);
  const uint8_t* row = w + r * row_bytes;
  float acc[kTokensPerBlock] = {};
  float wv[32];
  for (int64_t c = lane; c < cols / 32; c += 32) {
    chunk32<T>(row, c, wv);
#pragma unroll
    for (int t = 0; t < kTokensPerBlock; ++t) {
      if (t >= nt) break;
      const float* xt = x + (t0 + t) * cols + c * 32;
      float s = 0;
#pragma unroll
      for (int i = 0; i < 32; ++i) s = fmaf(wv[i], xt[i], s);
      acc[t] += s;
    }
  }
#pragma unroll
  for (int t = 0; t < kTokensPerBlock; ++t) {
    if (t >= nt) break;  // nt is the same for the whole block: no lane leaves a shuffle early
    float v = acc[t];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) y[(t0 + t) * rows + r] = v;
  }
}

__device__ float block_sum(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // `shared` may still be read from a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = 0;
  for (int i = 0; i < int(blockDim.x / 32); ++i) v += shared[i];
  return v;
}

__device__ float block_max(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = -INFINITY;
  for (int i = 0; i < int(blockDim.x / 32); ++i) v = fmaxf(v, shared[i]);
  return v;
}

__global__ void rms_norm_kernel(const float* x, int64_t xs, const float* w, float* y, int64_t ys,
                                int64_t n, float eps) {
  __shared__ float red[32];
  const float* xr = x + int64_t(blockIdx.x) * xs;
  float* yr = y + int64_t(blockIdx.x) * ys;
  float s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += xr[i] * xr[i];
  s = block_sum(s, red);
  const float scale = rsqrtf(s / n + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * scale * (w ? w[i] : 1.0f);
}

__global__ void rope_kernel(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_stride,
                            int64_t n_rot, int64_t pos0, float base, bool neox, bool use_yarn,
                            kernels::Yarn yarn, bool inverse) {
  const int64_t half = n_rot / 2;
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n_tokens * n_heads * half) return;
  const int64_t i = idx % half, th = idx / half, t = th / n_heads;
  float* hx = x + th * head_stride;
  // As kernels::rope (and ggml): theta_i = pos * theta_scale^i by repeated products.
  const float theta_scale = powf(base, -2.0f / float(n_rot));
  float theta_extrap = float(pos0 + t);
  for (int64_t j = 0; j < i; ++j) theta_extrap *= theta_scale;
  float theta = theta_extrap, ms = 1.0f;
  if (use_yarn) {
    const float interp = yarn.freq_scale * theta_extrap;
    const float y = (float(i) - yarn.corr_low) / fmaxf(0.001f, yarn.corr_high - yarn.corr_low);
    const float ramp = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * yarn.ext_factor;
    theta = interp * (1.0f - ramp) + theta_extrap * ramp;
    ms = yarn.mscale;
  }
  const float c = cosf(theta) * ms, s = (inverse ? -sinf(theta) : sinf(theta)) * ms;
  const int64_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
  const float x0 = hx[a], x1 = hx[b];
  hx[a] = x0 * c - x1 * s;
  hx[b] = x0 * s + x1 * c;
}

__global__ void swiglu_kernel(const float* g, const float* u, float* out, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

__global__ void swiglu_oai_kernel(const float* g, const float* u, float* out, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = fminf(g[i], 7.0f), y = fminf(fmaxf(u[i], -7.0f), 7.0f);
  out[i] = x / (1.0f + expf(-1.702f * x)) * (y + 1.0f);
}

__global__ void swiglu_limit_kernel(const float* g, const float* u, float* out, int64_t n,
                                    float limit) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = fminf(g[i], limit), y = fminf(fmaxf(u[i], -limit), limit);
  out[i] = x / (1.0f + expf(-x)) * y;
}

__global__ void situ_kernel(const float* g, const float* u, float* out, int64_t n, float beta,
                            float linear_beta) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float a = tanhf(g[i] * (1.0f / beta)) * beta * (1.0f / (1.0f + expf(-g[i])));
  const float up = linear_beta > 0.0f ? tanhf(u[i] * (1.0f / linear_beta)) * linear_beta : u[i];
  out[i] = a * up;
}

__global__ void mul_sigmoid_kernel(float* y, const float* g, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] *= 1.0f / (1.0f + expf(-g[i]));
}

constexpr int kMaxResidualSources = 64;

// One block per token: the n + 1 scores (rms-normalised rows dotted with w), their softmax, the
// weighted sum of the raw rows.
__global__ void res_mix_kernel(const float* stack, int n, const float* cur, const float* w,
                               float* out, int64_t T, int64_t E, float eps) {
  __shared__ float red[32];
  __shared__ float p[kMaxResidualSources + 1];
  const int64_t t = blockIdx.x;
  for (int j = 0; j <= n; ++j) {
    const float* x = j < n ? stack + (j * T + t) * E : cur + t * E;
    float ss = 0, d = 0;
    for (int64_t i = threadIdx.x; i < E; i += blockDim.x) ss += x[i] * x[i], d += x[i] * w[i];
    ss = block_sum(ss, red);
    d = block_sum(d, red);
    if (threadIdx.x == 0) p[j] = d * rsqrtf(ss / E + eps);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = -INFINITY, sum = 0;
    for (int j = 0; j <= n; ++j) m = fmaxf(m, p[j]);
    for (int j = 0; j <= n; ++j) p[j] = expf(p[j] - m), sum += p[j];
    for (int j = 0; j <= n; ++j) p[j] /= sum;
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < E; i += blockDim.x) {
    float acc = 0;
    for (int j = 0; j < n; ++j) acc += stack[(j * T + t) * E + i] * p[j];
    out[t * E + i] = acc + cur[t * E + i] * p[n];
  }
}

// The short causal convolutions, one thread per channel walking the tokens; silu.
__global__ void kda_conv_kernel(float* x, const float* w, float* window, int64_t D, int64_t T,
                                int C) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= D) return;
  float* win = window + c * C;
  for (int64_t t = 0; t < T; ++t) {
    const float v = x[t * D + c];
    float sum = 0;
    for (int j = 0; j < C; ++j) sum += win[j] * w[c * (C + 1) + j];
    sum += v * w[c * (C + 1) + C];
    for (int j = 0; j + 1 < C; ++j) win[j] = win[j + 1];
    if (C > 0) win[C - 1] = v;
    x[t * D + c] = sum / (1.0f + expf(-sum));
  }
}

// One block per (token, head): the L2 norms of q and k, the decay gate and beta's sigmoid.
__global__ void kda_prep_kernel(float* q, float* k, float* g, float* beta, const float* a,
                                int64_t H, int64_t S, float lower_bound, float eps) {
  __shared__ float red[32];
  const int64_t th = blockIdx.x, h = th % H;
  float *qh = q + th * S, *kh = k + th * S, *gh = g + th * S;
  float sq = 0, sk = 0;
  for (int64_t i = threadIdx.x; i < S; i += blockDim.x) sq += qh[i] * qh[i], sk += kh[i] * kh[i];
  sq = block_sum(sq, red);
  sk = block_sum(sk, red);
  const float inv = rsqrtf(float(S));
  const float cq = rsqrtf(sq / S + eps / S) * inv, ck = rsqrtf(sk / S + eps / S) * inv;
  for (int64_t i = threadIdx.x; i < S; i += blockDim.x) {
    qh[i] *= cq, kh[i] *= ck;
    const float x = gh[i];
    gh[i] = lower_bound > -INFINITY ? lower_bound / (1.0f + expf(x * a[h]))
                                    : (x > 20.0f ? x : logf(1.0f + expf(x))) * a[h];
  }
  if (threadIdx.x == 0) beta[th] = 1.0f / (1.0f + expf(-beta[th]));
}

constexpr int64_t kMaxKdaHeadDim = 256;

// One block per head, thread j owns value j's column of the state (ggml's transposed layout).
__global__ void kda_scan_kernel(const float* q, const float* k, const float* v, const float* g,
                                const float* beta, float* states, float* out, int64_t H, int64_t S,
                                int64_t T) {
  __shared__ float sh[3 * kMaxKdaHeadDim];  // decay, k, q of the current token
  const int64_t h = blockIdx.x;
  float* M = states + h * S * S;
  const float inv = rsqrtf(float(S));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t base = (t * H + h) * S;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < S; i += blockDim.x)
      sh[i] = expf(g[base + i]), sh[S + i] = k[base + i], sh[2 * S + i] = q[base + i];
    __syncthreads();
    const float b = beta[t * H + h];
    for (int64_t j = threadIdx.x; j < S; j += blockDim.x) {
      float* row = M + j * S;
      float sk = 0;
      for (int64_t i = 0; i < S; ++i) row[i] *= sh[i];
      for (int64_t i = 0; i < S; ++i) sk += row[i] * sh[S + i];
      const float d = (v[base + j] - sk) * b;
      float sq = 0;
      for (int64_t i = 0; i < S; ++i) row[i] += sh[S + i] * d;
      for (int64_t i = 0; i < S; ++i) sq += row[i] * sh[2 * S + i];
      out[base + j] = sq * inv;
    }
  }
}

constexpr int kMaxTopK = 32;

__global__ void softmax_topk_kernel(const float* logits, int64_t n_tokens, int64_t n_expert, int k,
                                    bool norm, int32_t* ids, float* weights) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n_tokens) return;
  const float* l = logits + t * n_expert;
  float mx = -INFINITY;
  for (int64_t e = 0; e < n_expert; ++e) mx = fmaxf(mx, l[e]);
  float sum = 0;
  for (int64_t e = 0; e < n_expert; ++e) sum += expf(l[e] - mx);
  int32_t chosen[kMaxTopK];
  float p[kMaxTopK], psum = 0;
  for (int kk = 0; kk < k; ++kk) {
    int32_t best = -1;
    for (int64_t e = 0; e < n_expert; ++e) {
      bool taken = false;
      for (int j = 0; j < kk; ++j) taken |= chosen[j] == e;
      if (!taken && (best < 0 || l[e] > l[best])) best = static_cast<int32_t>(e);
    }
    chosen[kk] = best;
    p[kk] = expf(l[best] - mx) / sum;
    psum += p[kk];
  }
  for (int kk = 0; kk < k; ++kk) {
    ids[t * k + kk] = chosen[kk];
    weights[t * k + kk] = norm ? p[kk] / fmaxf(psum, 6.103515625e-5f) : p[kk];
  }
}

constexpr int kAttnThreads = 128, kAttnChunk = 1024;
constexpr int kAttnDvPerThread = static_cast<int>(kMaxAttentionDv / kAttnThreads);

// One block per (token, head). The visible keys go by in chunks whose scores sit in shared memory;
// a running maximum, denominator and output (softmax rescaled as each chunk raises the maximum)
// carry across chunks, so any context fits. Each thread owns output dims d = tid + i * 128.
__global__ void attention_kernel(Attention a) {
  __shared__ float s[kAttnChunk];
  __shared__ float red[32];
  const int64_t t = blockIdx.x / a.n_head, h = blockIdx.x % a.n_head,
                kvh = h / (a.n_head / a.n_head_kv);
  const int64_t n_keys = a.n_past + t + 1;  // causal
  const int64_t first = a.window > 0 && n_keys > a.window ? n_keys - a.window : 0,
                n = n_keys - first;
  const float* qh = a.q + (t * a.n_head + h) * a.dk;
  const float* kb = a.k + first * a.k_row + kvh * a.dk;
  const float* vb = a.v + first * a.v_row + kvh * a.dv;
  const float sink = a.sinks ? a.sinks[h] : -INFINITY;
  float m = sink, l = 0, acc[kAttnDvPerThread] = {};
  for (int64_t c0 = 0; c0 < n; c0 += kAttnChunk) {
    const int64_t cn = n - c0 < kAttnChunk ? n - c0 : kAttnChunk;
    float cmax = -INFINITY;
    for (int64_t j = threadIdx.x; j < cn; j += blockDim.x) {
      const float* kj = kb + (c0 + j) * a.k_row;
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
      for (int64_t j = 0; j < cn; ++j) v = fmaf(s[j], vb[(c0 + j) * a.v_row + d], v);
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

__global__ void weighted_sum_kernel(const float* eo, const float* wts, float* out, int64_t n_tokens,
                                    int64_t k_used, int64_t n) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n_tokens * n) return;
  const int64_t t = idx / n, i = idx % n;
  float acc = 0;
  for (int64_t k = 0; k < k_used; ++k) acc += wts[t * k_used + k] * eo[(t * k_used + k) * n + i];
  out[idx] = acc;
}

__global__ void add_kernel(float* y, const float* x, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] += x[i];
}

__global__ void add_rows_kernel(float* y, const float* b, int64_t n, int64_t total) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < total) y[i] += b[i % n];
}

__global__ void move_rows_kernel(const float* src, const int32_t* idx, float* dst, int64_t n,
                                 int64_t total, bool gather) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int64_t r = i / n, c = i % n;
  if (gather)
    dst[i] = src[int64_t(idx[r]) * n + c];
  else
    dst[int64_t(idx[r]) * n + c] = src[i];
}

__global__ void add_gated_kernel(float* y, const float* x, const float* gate, int64_t n,
                                 int64_t total) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const float g = gate ? 1.0f / (1.0f + expf(-gate[i / n])) : 1.0f;
  y[i] += g * x[i];
}

unsigned blocks_for(int64_t n, int threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

// --- DeepSeek-V4 ---------------------------------------------------------------------------

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

__global__ void dsv4_ring_kernel(const float* kv, float* ring, int64_t first, int64_t pos0,
                                 int64_t window, int64_t dim, int64_t total) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int64_t pos = first + idx / dim, i = idx % dim;
  ring[(pos % window) * dim + i] = kv[(pos - pos0) * dim + i];
}

}  // namespace

bool weight_type_supported(uint32_t t) {
  const kernels::TypeTraits* tr = kernels::type_traits(t);
  return tr && tr->cuda;
}

bool dequantize_row_host(uint32_t type, const void* row, float* y, int64_t n) {
  if (!weight_type_supported(type) || n % block_elems(type) != 0) return false;
  switch (type) {
#define EXPERTD_CASE(T)                     \
  case kernels::T:                          \
    dequantize_host<kernels::T>(row, y, n); \
    break;
    KERNELS_WEIGHT_TYPES(EXPERTD_CASE)
#undef EXPERTD_CASE
    default:
      return false;
  }
  return true;
}

cudaError_t matmul(uint32_t wtype, const void* w, int64_t rows, int64_t cols, const float* x,
                   int64_t n_tokens, float* y, cudaStream_t stream) {
  if (rows <= 0 || n_tokens <= 0) return cudaSuccess;
  if (!weight_type_supported(wtype) || cols % block_elems(wtype) != 0) return cudaErrorInvalidValue;
  const size_t rb = kernels::row_size(wtype, cols);
  const dim3 grid(static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock),
                  static_cast<unsigned>((n_tokens + kTokensPerBlock - 1) / kTokensPerBlock));
  const dim3 block(32 * kWarpsPerBlock);
  auto* wb = static_cast<const uint8_t*>(w);
  switch (wtype) {
#define EXPERTD_CASE(T)                                               \
  case kernels::T:                                                    \
    EXPERTD_LAUNCH(matmul_kernel<kernels::T>, grid, block, 0, stream) \
    (wb, rows, cols, rb, x, n_tokens, y);                             \
    break;
    KERNELS_WEIGHT_TYPES(EXPERTD_CASE)
#undef EXPERTD_CASE
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t rms_norm(const float* x, const float* w, float* y, int64_t n, int64_t n_rows, float eps,
                     cudaStream_t stream) {
  return rms_norm_strided(x, n, w, y, n, n, n_rows, eps, stream);
}

cudaError_t rms_norm_strided(const float* x, int64_t x_stride, const float* w, float* y,
                             int64_t y_stride, int64_t n, int64_t n_rows, float eps,
                             cudaStream_t stream) {
  if (n_rows <= 0) return cudaSuccess;
  EXPERTD_LAUNCH(rms_norm_kernel, static_cast<unsigned>(n_rows), 256, 0, stream)
  (x, x_stride, w, y, y_stride, n, eps);
  return cudaGetLastError();
}

cudaError_t rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_stride, int64_t n_rot,
                 int64_t pos0, float base, bool neox, const kernels::Yarn* yarn,
                 cudaStream_t stream, bool inverse) {
  const int64_t n = n_tokens * n_heads * (n_rot / 2);
  if (n <= 0) return cudaSuccess;
  EXPERTD_LAUNCH(rope_kernel, blocks_for(n, 256), 256, 0, stream)
  (x, n_tokens, n_heads, head_stride, n_rot, pos0, base, neox, yarn != nullptr,
   yarn ? *yarn : kernels::Yarn{}, inverse);
  return cudaGetLastError();
}

cudaError_t swiglu(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  EXPERTD_LAUNCH(swiglu_kernel, blocks_for(n, 256), 256, 0, stream)(gate, up, out, n);
  return cudaGetLastError();
}

cudaError_t swiglu_oai(const float* gate, const float* up, float* out, int64_t n,
                       cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  EXPERTD_LAUNCH(swiglu_oai_kernel, blocks_for(n, 256), 256, 0, stream)(gate, up, out, n);
  return cudaGetLastError();
}

cudaError_t swiglu_limit(const float* gate, const float* up, float* out, int64_t n, float limit,
                         cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  EXPERTD_LAUNCH(swiglu_limit_kernel, blocks_for(n, 256), 256, 0, stream)(gate, up, out, n, limit);
  return cudaGetLastError();
}

cudaError_t situ(const float* gate, const float* up, float* out, int64_t n, float beta,
                 float linear_beta, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  EXPERTD_LAUNCH(situ_kernel, blocks_for(n, 256), 256, 0, stream)
  (gate, up, out, n, beta, linear_beta);
  return cudaGetLastError();
}

cudaError_t mul_sigmoid(float* y, const float* g, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  EXPERTD_LAUNCH(mul_sigmoid_kernel, blocks_for(n, 256), 256, 0, stream)(y, g, n);
  return cudaGetLastError();
}

cudaError_t res_mix(const float* stack, int n, const float* cur, const float* w, float* out,
                    int64_t n_tokens, int64_t n_embd, float eps, cudaStream_t stream) {
  if (n < 0 || n > kMaxResidualSources) return cudaErrorInvalidValue;
  if (n_tokens <= 0) return cudaSuccess;
  EXPERTD_LAUNCH(res_mix_kernel, static_cast<unsigned>(n_tokens), 256, 0, stream)
  (stack, n, cur, w, out, n_tokens, n_embd, eps);
  return cudaGetLastError();
}

cudaError_t kda(const Kda& a, cudaStream_t stream) {
  const int64_t D = a.n_head * a.head_dim, C = a.d_conv - 1;
  if (a.head_dim > kMaxKdaHeadDim) return cudaErrorInvalidValue;
  if (a.n_tokens <= 0) return cudaSuccess;
  float* xs[3] = {a.q, a.k, a.v};
  const float* ws[3] = {a.conv_q, a.conv_k, a.conv_v};
  for (int m = 0; m < 3; ++m) {
    EXPERTD_LAUNCH(kda_conv_kernel, blocks_for(D, 128), 128, 0, stream)
    (xs[m], ws[m], a.state + m * C * D, D, a.n_tokens, static_cast<int>(C));
    if (auto e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  EXPERTD_LAUNCH(kda_prep_kernel, static_cast<unsigned>(a.n_tokens * a.n_head), 128, 0, stream)
  (a.q, a.k, a.g, a.beta, a.a, a.n_head, a.head_dim, a.lower_bound, a.eps);
  if (auto e = cudaGetLastError(); e != cudaSuccess) return e;
  const int threads = static_cast<int>(std::min<int64_t>(a.head_dim, 256));
  EXPERTD_LAUNCH(kda_scan_kernel, static_cast<unsigned>(a.n_head), threads, 0, stream)
  (a.q, a.k, a.v, a.g, a.beta, a.state + 3 * C * D, a.out, a.n_head, a.head_dim, a.n_tokens);
  return cudaGetLastError();
}

cudaError_t softmax_topk(const float* logits, int64_t n_tokens, int64_t n_expert, int k,
                         bool norm_topk, int32_t* ids, float* weights, cudaStream_t stream) {
  if (k < 1 || k > kMaxTopK || k > n_expert) return cudaErrorInvalidValue;
  if (n_tokens <= 0) return cudaSuccess;
  EXPERTD_LAUNCH(softmax_topk_kernel, blocks_for(n_tokens, 64), 64, 0, stream)
  (logits, n_tokens, n_expert, k, norm_topk, ids, weights);
  return cudaGetLastError();
}

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

cudaError_t weighted_sum(const float* expert_out, const float* weights, float* out,
                         int64_t n_tokens, int64_t k_used, int64_t n, cudaStream_t stream) {
  if (n_tokens * n <= 0) return cudaSuccess;
  EXPERTD_LAUNCH(weighted_sum_kernel, blocks_for(n_tokens * n, 256), 256, 0, stream)
  (expert_out, weights, out, n_tokens, k_used, n);
  return cudaGetLastError();
}

cudaError_t add(float* y, const float* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  EXPERTD_LAUNCH(add_kernel, blocks_for(n, 256), 256, 0, stream)(y, x, n);
  return cudaGetLastError();
}

cudaError_t add_rows(float* y, const float* b, int64_t n, int64_t n_rows, cudaStream_t stream) {
  if (n * n_rows <= 0) return cudaSuccess;
  EXPERTD_LAUNCH(add_rows_kernel, blocks_for(n * n_rows, 256), 256, 0, stream)(y, b, n, n * n_rows);
  return cudaGetLastError();
}

cudaError_t gather_rows(const float* src, const int32_t* idx, float* dst, int64_t n_rows, int64_t n,
                        cudaStream_t stream) {
  if (n * n_rows <= 0) return cudaSuccess;
  EXPERTD_LAUNCH(move_rows_kernel, blocks_for(n * n_rows, 256), 256, 0, stream)
  (src, idx, dst, n, n * n_rows, true);
  return cudaGetLastError();
}

cudaError_t scatter_rows(const float* src, const int32_t* idx, float* dst, int64_t n_rows,
                         int64_t n, cudaStream_t stream) {
  if (n * n_rows <= 0) return cudaSuccess;
  EXPERTD_LAUNCH(move_rows_kernel, blocks_for(n * n_rows, 256), 256, 0, stream)
  (src, idx, dst, n, n * n_rows, false);
  return cudaGetLastError();
}

cudaError_t add_gated(float* y, const float* x, const float* gate, int64_t n, int64_t n_rows,
                      cudaStream_t stream) {
  if (n * n_rows <= 0) return cudaSuccess;
  EXPERTD_LAUNCH(add_gated_kernel, blocks_for(n * n_rows, 256), 256, 0, stream)
  (y, x, gate, n, n * n_rows);
  return cudaGetLastError();
}

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
