// CUDA kernels (see cuda_kernels.h; DeepSeek-V4's are in cuda_dsv4.cu, attention in
// cuda_attention.cu). Reference: the scalar CPU kernels in kernels/impl.inc and dequantize_row in
// kernels/kernels.cpp; tests/gpu/cuda_kernels_test.cpp checks every one.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstring>

#include "kernels/cuda/cuda_device.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/dequant.h"
#include "kernels/fp16.h"
#include "kernels/kernels.h"
#include "kernels/quant_blocks.h"

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
  for (int64_t i = n / 32 * 32; i < n; ++i)
    y[i] = kernels::float_elem<T>(static_cast<const uint8_t*>(row), i);
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
  // The float types' rows need not be whole chunks: the last cols % 32 columns, one per lane.
  for (int64_t i = cols / 32 * 32 + lane; i < cols; i += 32) {
    const float wi = kernels::float_elem<T>(row, i);
    for (int t = 0; t < nt; ++t) acc[t] = fmaf(wi, x[(t0 + t) * cols + i], acc[t]);
  }
#pragma unroll
  for (int t = 0; t < kTokensPerBlock; ++t) {
    if (t >= nt) break;  // nt is the same for the whole block: no lane leaves a shuffle early
    float v = acc[t];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) y[(t0 + t) * rows + r] = v;
  }
}

// As matmul_kernel, one slot per block row: slot j's weights are matrix ids[j] (matrix_bytes
// apart), its input row j / x_div; the same sums in the same order as matmul_kernel's for a token.
template <uint32_t T>
__global__ void matmul_id_kernel(const uint8_t* w, size_t matrix_bytes, int64_t rows, int64_t cols,
                                 size_t row_bytes, const int32_t* ids, const float* x,
                                 int64_t x_div, float* y) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = int64_t(blockIdx.x) * kWarpsPerBlock + warp;
  if (r >= rows) return;
  const int64_t j = blockIdx.y;
  const uint8_t* row = w + size_t(ids[j]) * matrix_bytes + r * row_bytes;
  const float* xt = x + (j / x_div) * cols;
  float acc = 0;
  float wv[32];
  for (int64_t c = lane; c < cols / 32; c += 32) {
    chunk32<T>(row, c, wv);
    float s = 0;
#pragma unroll
    for (int i = 0; i < 32; ++i) s = fmaf(wv[i], xt[c * 32 + i], s);
    acc += s;
  }
  for (int64_t i = cols / 32 * 32 + lane; i < cols; i += 32)  // as matmul_kernel's tail
    acc = fmaf(kernels::float_elem<T>(row, i), xt[i], acc);
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) y[j * rows + r] = acc;
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

__global__ void layer_norm_kernel(const float* x, const float* w, const float* b, float* y,
                                  int64_t n, float eps) {
  __shared__ float red[32];
  const float* xr = x + int64_t(blockIdx.x) * n;
  float* yr = y + int64_t(blockIdx.x) * n;
  float s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += xr[i];
  const float mean = block_sum(s, red) / float(n);
  float s2 = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s2 += (xr[i] - mean) * (xr[i] - mean);
  const float scale = rsqrtf(block_sum(s2, red) / float(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    yr[i] = (xr[i] - mean) * scale * (w ? w[i] : 1.0f) + (b ? b[i] : 0.0f);
}

__global__ void rope_kernel(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_stride,
                            int64_t n_rot, int64_t pos0, float base, bool neox, bool use_yarn,
                            kernels::Yarn yarn, bool inverse, const float* ff) {
  const int64_t half = n_rot / 2;
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n_tokens * n_heads * half) return;
  const int64_t i = idx % half, th = idx / half, t = th / n_heads;
  float* hx = x + th * head_stride;
  // As kernels::rope (and ggml): theta_i = pos * theta_scale^i by repeated products.
  const float theta_scale = powf(base, -2.0f / float(n_rot));
  float theta_extrap = float(pos0 + t);
  for (int64_t j = 0; j < i; ++j) theta_extrap *= theta_scale;
  if (ff) theta_extrap /= ff[i];
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
                                    float limit, bool after) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float y = fminf(fmaxf(u[i], -limit), limit);
  if (after) {
    out[i] = fminf(g[i] / (1.0f + expf(-g[i])), limit) * y;
    return;
  }
  const float x = fminf(g[i], limit);
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

__global__ void mul_act_kernel(float* y, const float* g, int64_t n, int op, int64_t span) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = g[i / span];
  y[i] *= op == 1   ? x / (1.0f + expf(-x))
          : op == 2 ? (x > 20.0f ? x : logf(1.0f + expf(x)))
                    : 1.0f / (1.0f + expf(-x));
}

__global__ void attn_temperature_kernel(float* x, int64_t rows, int64_t cols, int64_t pos0,
                                        float scale, float offset, int length) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  const float pos = float(pos0 + i / cols);
  x[i] *= float(log(floor((pos + offset) / float(length)) + 1.0) * scale + 1.0);
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
__global__ void delta_conv_kernel(float* x, const float* w, float* window, int64_t D, int64_t T,
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

// One block per (token, key head): the L2 norms of q and k.
__global__ void delta_norm_kernel(float* q, float* k, int64_t S, float eps) {
  __shared__ float red[32];
  float *qh = q + int64_t(blockIdx.x) * S, *kh = k + int64_t(blockIdx.x) * S;
  float sq = 0, sk = 0;
  for (int64_t i = threadIdx.x; i < S; i += blockDim.x) sq += qh[i] * qh[i], sk += kh[i] * kh[i];
  sq = block_sum(sq, red);
  sk = block_sum(sk, red);
  const float inv = rsqrtf(float(S));
  const float cq = rsqrtf(sq / S + eps / S) * inv, ck = rsqrtf(sk / S + eps / S) * inv;
  for (int64_t i = threadIdx.x; i < S; i += blockDim.x) qh[i] *= cq, kh[i] *= ck;
}

// One block per (token, value head): the decay gate (G values) and beta's sigmoid.
__global__ void delta_gate_kernel(float* g, float* beta, const float* a, int64_t Hv, int64_t G,
                                  float lower_bound, bool a_positive) {
  const int64_t th = blockIdx.x, h = th % Hv;
  float* gh = g + th * G;
  for (int64_t i = threadIdx.x; i < G; i += blockDim.x) {
    const float x = gh[i];
    gh[i] = lower_bound > -INFINITY
                ? lower_bound / (1.0f + expf(a_positive ? -(x * a[h]) : x * a[h]))
                : (x > 20.0f ? x : logf(1.0f + expf(x))) * a[h];
  }
  if (threadIdx.x == 0) beta[th] = 1.0f / (1.0f + expf(-beta[th]));
}

constexpr int64_t kMaxDeltaKeyDim = 256;

// One block per value head, thread j owns value j's column of the state (ggml's transposed
// layout): dk floats, decayed, updated and read against the head's key head.
__global__ void delta_scan_kernel(Delta a, float* states) {
  __shared__ float sh[3 * kMaxDeltaKeyDim];  // decay, k, q of the current token
  const int64_t h = blockIdx.x, dk = a.dk, dv = a.dv, Hk = a.n_k_head, Hv = a.n_v_head;
  const int64_t kh = a.tiled_heads ? h % Hk : h / (Hv / Hk), G = a.per_head_decay ? 1 : dk;
  float* M = states + h * dk * dv;
  const float inv = rsqrtf(float(dk));
  for (int64_t t = 0; t < a.n_tokens; ++t) {
    const int64_t kb = (t * Hk + kh) * dk, vb = (t * Hv + h) * dv, gb = (t * Hv + h) * G;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < dk; i += blockDim.x)
      sh[i] = expf(a.g[gb + (G == 1 ? 0 : i)]), sh[dk + i] = a.k[kb + i],
      sh[2 * dk + i] = a.q[kb + i];
    __syncthreads();
    const float b = a.beta[t * Hv + h];
    for (int64_t j = threadIdx.x; j < dv; j += blockDim.x) {
      float* row = M + j * dk;
      float sk = 0;
      for (int64_t i = 0; i < dk; ++i) row[i] *= sh[i];
      for (int64_t i = 0; i < dk; ++i) sk += row[i] * sh[dk + i];
      const float d = (a.v[vb + j] - sk) * b;
      float sq = 0;
      for (int64_t i = 0; i < dk; ++i) row[i] += sh[dk + i] * d;
      for (int64_t i = 0; i < dk; ++i) sq += row[i] * sh[2 * dk + i];
      a.out[vb + j] = sq * inv;
    }
  }
}

constexpr int kMaxTopK = 32, kMaxGroups = 64;

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

// engine::select_experts step for step, one thread per token (see RouteSelect).
__global__ void route_select_kernel(RouteSelect r) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= r.n_tokens) return;
  const int64_t X = r.n_expert;
  float* p = r.p + t * X;
  int32_t chosen[kMaxTopK];
  float w[kMaxTopK];
  // The k largest of v(e) not masked, ties to the lower id (a stable sort's order).
  auto pick = [&](auto v) {
    for (int kk = 0; kk < r.k; ++kk) {
      int32_t best = -1;
      for (int64_t e = 0; e < X; ++e) {
        bool taken = false;
        for (int j = 0; j < kk; ++j) taken |= chosen[j] == e;
        if (!taken && (best < 0 || v(e) > v(best))) best = static_cast<int32_t>(e);
      }
      chosen[kk] = best;
    }
  };
  auto softmax = [](float* x, int64_t n, int64_t stride) {  // kernels::softmax's steps
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; ++i) mx = x[i * stride] > mx ? x[i * stride] : mx;
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) x[i * stride] = expf(x[i * stride] - mx), sum += x[i * stride];
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t i = 0; i < n; ++i) x[i * stride] *= inv;
  };
  if (r.topk_then_softmax) {
    pick([&](int64_t e) { return p[e]; });
    for (int kk = 0; kk < r.k; ++kk) w[kk] = p[chosen[kk]];
    softmax(w, r.k, 1);
  } else {
    for (int64_t e = 0; e < X; ++e)
      if (r.sqrt_softplus)
        p[e] = sqrtf(p[e] > 20.0f ? p[e] : logf(1.0f + expf(p[e])));
      else if (r.sigmoid)
        p[e] = 1.0f / (1.0f + expf(-p[e]));
    if (!r.sqrt_softplus && !r.sigmoid) softmax(p, X, 1);
    auto sel = [&](int64_t e) { return r.bias ? p[e] + r.bias[e] : p[e]; };
    uint64_t dropped = 0;  // groups out of the selection
    if (r.n_group > 1) {
      const int64_t per = X / r.n_group;
      float score[kMaxGroups];
      for (int g = 0; g < r.n_group; ++g) {
        float b1 = -INFINITY, b2 = -INFINITY;
        for (int64_t e = g * per; e < (g + 1) * per; ++e) {
          const float v = sel(e);
          if (v > b1)
            b2 = b1, b1 = v;
          else if (v > b2)
            b2 = v;
        }
        score[g] = b1 + b2;
      }
      uint64_t kept = 0;
      for (int i = 0; i < r.n_group_used; ++i) {
        int best = -1;
        for (int g = 0; g < r.n_group; ++g)
          if (!(kept >> g & 1) && (best < 0 || score[g] > score[best])) best = g;
        kept |= uint64_t{1} << best;
      }
      dropped = ~kept;
    }
    const int64_t per = r.n_group > 1 ? X / r.n_group : X;
    pick([&](int64_t e) { return dropped >> (e / per) & 1 ? -INFINITY : sel(e); });
    float sum = 0;
    for (int kk = 0; kk < r.k; ++kk) w[kk] = p[chosen[kk]], sum += w[kk];
    for (int kk = 0; kk < r.k; ++kk) {
      if (r.norm_topk) w[kk] /= fmaxf(sum, 6.103515625e-5f);
      if (r.w_scale != 1.0f) w[kk] *= r.w_scale;
    }
  }
  for (int kk = 0; kk < r.k; ++kk)
    r.ids[t * r.k + kk] = chosen[kk], r.weights[t * r.k + kk] = w[kk];
}

__global__ void add_rows_id_kernel(float* y, const float* b, const int32_t* ids, int64_t n,
                                   int64_t total) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < total) y[i] += b[int64_t(ids[i / n]) * n + i % n];
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

__global__ void scale_rows_kernel(float* y, const float* f, int64_t n, int64_t total) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < total) y[i] *= f[i / n];
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

cudaError_t matmul_id(uint32_t wtype, const void* w, size_t matrix_bytes, int64_t rows,
                      int64_t cols, const int32_t* ids, int64_t n_slots, const float* x,
                      int64_t x_div, float* y, cudaStream_t stream) {
  if (rows <= 0 || n_slots <= 0) return cudaSuccess;
  if (!weight_type_supported(wtype) || cols % block_elems(wtype) != 0 || x_div < 1)
    return cudaErrorInvalidValue;
  const size_t rb = kernels::row_size(wtype, cols);
  const dim3 grid(static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock),
                  static_cast<unsigned>(n_slots));
  const dim3 block(32 * kWarpsPerBlock);
  auto* wb = static_cast<const uint8_t*>(w);
  switch (wtype) {
#define EXPERTD_CASE(T)                                                  \
  case kernels::T:                                                       \
    EXPERTD_LAUNCH(matmul_id_kernel<kernels::T>, grid, block, 0, stream) \
    (wb, matrix_bytes, rows, cols, rb, ids, x, x_div, y);                \
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

cudaError_t layer_norm(const float* x, const float* w, const float* b, float* y, int64_t n,
                       int64_t n_rows, float eps, cudaStream_t stream) {
  if (n_rows <= 0) return cudaSuccess;
  EXPERTD_LAUNCH(layer_norm_kernel, static_cast<unsigned>(n_rows), 256, 0, stream)
  (x, w, b, y, n, eps);
  return cudaGetLastError();
}

cudaError_t rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_stride, int64_t n_rot,
                 int64_t pos0, float base, bool neox, const kernels::Yarn* yarn,
                 cudaStream_t stream, bool inverse, const float* freq_factors) {
  const int64_t n = n_tokens * n_heads * (n_rot / 2);
  if (n <= 0) return cudaSuccess;
  EXPERTD_LAUNCH(rope_kernel, blocks_for(n, 256), 256, 0, stream)
  (x, n_tokens, n_heads, head_stride, n_rot, pos0, base, neox, yarn != nullptr,
   yarn ? *yarn : kernels::Yarn{}, inverse, freq_factors);
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
                         bool after, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  EXPERTD_LAUNCH(swiglu_limit_kernel, blocks_for(n, 256), 256, 0, stream)
  (gate, up, out, n, limit, after);
  return cudaGetLastError();
}

cudaError_t situ(const float* gate, const float* up, float* out, int64_t n, float beta,
                 float linear_beta, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  EXPERTD_LAUNCH(situ_kernel, blocks_for(n, 256), 256, 0, stream)
  (gate, up, out, n, beta, linear_beta);
  return cudaGetLastError();
}

cudaError_t attn_temperature(float* x, int64_t rows, int64_t cols, int64_t pos0, float scale,
                             float offset, int length, cudaStream_t stream) {
  if (length <= 0) return cudaErrorInvalidValue;
  if (rows * cols <= 0) return cudaSuccess;
  EXPERTD_LAUNCH(attn_temperature_kernel, blocks_for(rows * cols, 256), 256, 0, stream)
  (x, rows, cols, pos0, scale, offset, length);
  return cudaGetLastError();
}

cudaError_t mul_act(float* y, const float* g, int64_t n, int op, int64_t span,
                    cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  EXPERTD_LAUNCH(mul_act_kernel, blocks_for(n, 256), 256, 0, stream)(y, g, n, op, span);
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

cudaError_t delta_rule(const Delta& a, cudaStream_t stream) {
  const int64_t Dq = a.n_k_head * a.dk, Dv = a.n_v_head * a.dv, C = a.d_conv - 1;
  if (a.dk > kMaxDeltaKeyDim || a.n_k_head <= 0 || a.n_v_head % a.n_k_head != 0)
    return cudaErrorInvalidValue;
  if (a.n_tokens <= 0) return cudaSuccess;
  float* xs[3] = {a.q, a.k, a.v};
  const float* ws[3] = {a.conv_q, a.conv_k, a.conv_v};
  const int64_t widths[3] = {Dq, Dq, Dv};
  float* window = a.state;
  for (int m = 0; m < 3; ++m) {
    EXPERTD_LAUNCH(delta_conv_kernel, blocks_for(widths[m], 128), 128, 0, stream)
    (xs[m], ws[m], window, widths[m], a.n_tokens, static_cast<int>(C));
    if (auto e = cudaGetLastError(); e != cudaSuccess) return e;
    window += C * widths[m];
  }
  EXPERTD_LAUNCH(delta_norm_kernel, static_cast<unsigned>(a.n_tokens * a.n_k_head), 128, 0, stream)
  (a.q, a.k, a.dk, a.eps);
  if (auto e = cudaGetLastError(); e != cudaSuccess) return e;
  EXPERTD_LAUNCH(delta_gate_kernel, static_cast<unsigned>(a.n_tokens * a.n_v_head), 128, 0, stream)
  (a.g, a.beta, a.a, a.n_v_head, a.per_head_decay ? 1 : a.dk, a.lower_bound, a.a_positive);
  if (auto e = cudaGetLastError(); e != cudaSuccess) return e;
  const int threads = static_cast<int>(std::min<int64_t>(a.dv, 256));
  EXPERTD_LAUNCH(delta_scan_kernel, static_cast<unsigned>(a.n_v_head), threads, 0, stream)
  (a, window);
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

cudaError_t route_select(const RouteSelect& r, cudaStream_t stream) {
  if (r.k < 1 || r.k > kMaxTopK || r.k > r.n_expert || r.n_group > kMaxGroups ||
      (r.n_group > 1 &&
       (r.n_expert % r.n_group != 0 || r.n_group_used < 1 || r.n_group_used > r.n_group)))
    return cudaErrorInvalidValue;
  if (r.n_tokens <= 0) return cudaSuccess;
  EXPERTD_LAUNCH(route_select_kernel, blocks_for(r.n_tokens, 64), 64, 0, stream)(r);
  return cudaGetLastError();
}

cudaError_t add_rows_id(float* y, const float* b, const int32_t* ids, int64_t n, int64_t n_rows,
                        cudaStream_t stream) {
  if (n * n_rows <= 0) return cudaSuccess;
  EXPERTD_LAUNCH(add_rows_id_kernel, blocks_for(n * n_rows, 256), 256, 0, stream)
  (y, b, ids, n, n * n_rows);
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

cudaError_t scale_rows(float* y, const float* f, int64_t n, int64_t n_rows, cudaStream_t stream) {
  if (n * n_rows <= 0) return cudaSuccess;
  EXPERTD_LAUNCH(scale_rows_kernel, blocks_for(n * n_rows, 256), 256, 0, stream)
  (y, f, n, n * n_rows);
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

}  // namespace kernels::cuda
