// Every CUDA kernel against the CPU reference (kernels/kernels.h: dequantize_row and the scalar
// float ops), on random but valid data of every supported weight type.
#include "kernels/cuda/cuda_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "gpu_util.h"
#include "kernels/fp16.h"
#include "kernels/kernels.h"
#include "kernels/quant_blocks.h"
#include "kernels/random_weights.h"

using namespace kernels;

namespace {

template <typename T>
struct Dev {
  T* p = nullptr;
  explicit Dev(size_t n) {
    EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess);
  }
  Dev(const std::vector<T>& v) : Dev(v.size()) {
    EXPECT_EQ(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~Dev() { cudaFree(p); }
  std::vector<T> get(size_t n) const {
    std::vector<T> v(n);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
};

std::vector<float> randn(size_t n, std::mt19937_64& rng, float s = 1.f) {
  std::normal_distribution<float> g(0.f, s);
  std::vector<float> v(n);
  for (auto& x : v) x = g(rng);
  return v;
}

}  // namespace

TEST(CudaKernels, MatmulOfEveryTypeMatchesTheDequantizedReference) {
  EXPERTD_REQUIRE_GPU();
  std::mt19937_64 rng(5);
  const int64_t rows = 37, cols = 1280;  // 40 chunks of 32: every lane of a warp has one, some two
  for (uint32_t t = 0; t < 64; ++t) {
    if (!weight_type_supported(t)) continue;
    ASSERT_TRUE(cuda::weight_type_supported(t)) << t;
    for (int64_t n_tok : {1, 3, 8, 13}) {
      SCOPED_TRACE(::testing::Message() << "type " << t << ", tokens " << n_tok);
      auto w = random_weights(t, rows * cols, rng);
      auto x = randn(n_tok * cols, rng);
      std::vector<float> wf(cols);
      Dev<uint8_t> dw(w);
      Dev<float> dx(x), dy(n_tok * rows);
      CUDA_OK(cuda::matmul(t, dw.p, rows, cols, dx.p, n_tok, dy.p, nullptr));
      auto y = dy.get(n_tok * rows);
      for (int64_t r = 0; r < rows; ++r) {
        dequantize_row(t, w.data() + r * row_size(t, cols), wf.data(), cols);
        for (int64_t k = 0; k < n_tok; ++k) {
          double ref = 0, mag = 0;
          for (int64_t c = 0; c < cols; ++c)
            ref += double(wf[c]) * x[k * cols + c],
                mag += std::fabs(double(wf[c]) * x[k * cols + c]);
          ASSERT_NEAR(y[k * rows + r], ref, 1e-5 * mag + 1e-6) << "row " << r << " token " << k;
        }
      }
    }
  }
}

TEST(CudaKernels, RmsNormRopeSwigluWeightedSum) {
  EXPERTD_REQUIRE_GPU();
  std::mt19937_64 rng(6);
  const int64_t n = 256, rows = 5;
  auto x = randn(n * rows, rng), w = randn(n, rng);
  Dev<float> dx(x), dw(w), dy(n * rows);
  CUDA_OK(cuda::rms_norm(dx.p, dw.p, dy.p, n, rows, 1e-6f, nullptr));
  auto y = dy.get(n * rows);
  std::vector<float> ref(n);
  for (int64_t r = 0; r < rows; ++r) {
    rms_norm(&x[r * n], w.data(), ref.data(), n, 1e-6f);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_NEAR(y[r * n + i], ref[i], 1e-5f * (1 + std::fabs(ref[i])));
  }
  // RoPE: 3 tokens x 4 heads of 64, both pairings, 48 rotated dims, from position 7.
  for (bool neox : {true, false}) {
    auto q = randn(3 * 4 * 64, rng);
    Dev<float> dq(q);
    CUDA_OK(cuda::rope(dq.p, 3, 4, 64, 48, 7, 10000.f, neox, nullptr, nullptr));
    auto got = dq.get(q.size());
    for (int t = 0; t < 3; ++t)
      for (int h = 0; h < 4; ++h) rope(&q[(t * 4 + h) * 64], 64, 48, 7 + t, 10000.f, neox);
    for (size_t i = 0; i < q.size(); ++i)
      ASSERT_NEAR(got[i], q[i], 2e-4f * (1 + std::fabs(q[i]))) << i << " neox " << neox;
  }
  auto g = randn(1000, rng, 3.f), u = randn(1000, rng);
  Dev<float> dg(g), du(u), dout(1000);
  CUDA_OK(cuda::swiglu(dg.p, du.p, dout.p, 1000, nullptr));
  auto sw = dout.get(1000);
  for (int i = 0; i < 1000; ++i)
    ASSERT_NEAR(sw[i], silu(g[i]) * u[i], 1e-5f * (1 + std::fabs(g[i] * u[i])));
  // Weighted sum of 2 tokens x 3 experts of 100.
  auto eo = randn(2 * 3 * 100, rng), wt = randn(2 * 3, rng);
  Dev<float> deo(eo), dwt(wt), dsum(200);
  CUDA_OK(cuda::weighted_sum(deo.p, dwt.p, dsum.p, 2, 3, 100, nullptr));
  auto s = dsum.get(200);
  for (int t = 0; t < 2; ++t)
    for (int i = 0; i < 100; ++i) {
      float r = 0;
      for (int k = 0; k < 3; ++k) r += wt[t * 3 + k] * eo[(t * 3 + k) * 100 + i];
      ASSERT_NEAR(s[t * 100 + i], r, 1e-5f * (1 + std::fabs(r)));
    }
}

// What DeepSeek (MLA) and gpt-oss need beyond the above: YaRN RoPE on the rotated tail of strided
// heads, a norm over part of strided rows, and gpt-oss's clamped SwiGLU.
TEST(CudaKernels, YarnRopeOnStridedHeadsStridedNormAndClampedSwiglu) {
  EXPERTD_REQUIRE_GPU();
  std::mt19937_64 rng(7);
  const int64_t T = 3, H = 4, stride = 96, nope = 64, R = 32;
  const kernels::Yarn yarn = yarn_params(40.0f, R, 10000.f, 4096);
  for (bool neox : {true, false}) {
    auto q = randn(T * H * stride, rng);
    Dev<float> dq(q);
    CUDA_OK(cuda::rope(dq.p + nope, T, H, stride, R, 11, 10000.f, neox, &yarn, nullptr));
    auto got = dq.get(q.size());
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        rope(&q[(t * H + h) * stride + nope], R, R, 11 + t, 10000.f, neox, &yarn);
    for (size_t i = 0; i < q.size(); ++i)
      ASSERT_NEAR(got[i], q[i], 2e-4f * (1 + std::fabs(q[i]))) << i << " neox " << neox;
  }
  auto x = randn(T * stride, rng), w = randn(nope, rng);
  Dev<float> dx(x), dw(w);
  CUDA_OK(cuda::rms_norm_strided(dx.p, stride, dw.p, dx.p, stride, nope, T, 1e-6f, nullptr));
  auto y = dx.get(x.size());
  std::vector<float> ref(nope);
  for (int64_t t = 0; t < T; ++t) {
    rms_norm(&x[t * stride], w.data(), ref.data(), nope, 1e-6f);
    for (int64_t i = 0; i < nope; ++i)
      ASSERT_NEAR(y[t * stride + i], ref[i], 1e-5f * (1 + std::fabs(ref[i])));
    for (int64_t i = nope; i < stride; ++i)
      ASSERT_EQ(y[t * stride + i], x[t * stride + i]) << "the rest of a row stays";
  }
  auto g = randn(1000, rng, 6.f), u = randn(1000, rng, 6.f);
  Dev<float> dg(g), du(u), dout(1000);
  CUDA_OK(cuda::swiglu_oai(dg.p, du.p, dout.p, 1000, nullptr));
  auto sw = dout.get(1000);
  for (int i = 0; i < 1000; ++i) {
    const float a = std::min(g[i], 7.0f), b = std::clamp(u[i], -7.0f, 7.0f);
    const float want = a / (1.0f + std::exp(-1.702f * a)) * (b + 1.0f);
    ASSERT_NEAR(sw[i], want, 1e-5f * (1 + std::fabs(want)));
  }
}

TEST(CudaKernels, SoftmaxTopKRoutesLikeTheCpu) {
  EXPERTD_REQUIRE_GPU();
  std::mt19937_64 rng(8);
  const int64_t T = 9, X = 128;
  const int K = 8;
  auto logits = randn(T * X, rng, 2.f);
  logits[3 * X + 5] = logits[3 * X + 6] = 9.f;  // a tie: the lower id comes first
  Dev<float> dl(logits), dw(T * K);
  Dev<int32_t> di(T * K);
  for (bool norm : {true, false}) {
    CUDA_OK(cuda::softmax_topk(dl.p, T, X, K, norm, di.p, dw.p, nullptr));
    auto ids = di.get(T * K);
    auto wts = dw.get(T * K);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<float> p(logits.begin() + t * X, logits.begin() + (t + 1) * X);
      softmax(p.data(), X);
      std::vector<int> idx(X);
      std::iota(idx.begin(), idx.end(), 0);
      std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return p[a] > p[b]; });
      float sum = 0;
      for (int k = 0; k < K; ++k) sum += p[idx[k]];
      for (int k = 0; k < K; ++k) {
        ASSERT_EQ(ids[t * K + k], idx[k]) << "token " << t << " rank " << k;
        ASSERT_NEAR(wts[t * K + k], norm ? p[idx[k]] / sum : p[idx[k]], 1e-5f);
      }
    }
  }
}

TEST(CudaKernels, CausalAttentionWithAKvCache) {
  EXPERTD_REQUIRE_GPU();
  std::mt19937_64 rng(10);
  const int64_t T = 4, past = 5, H = 8, HKV = 2, D = 64, KV = HKV * D;
  auto q = randn(T * H * D, rng), k = randn((past + T) * KV, rng), v = randn((past + T) * KV, rng);
  Dev<float> dq(q), dk(k), dv(v), dout(T * H * D);
  const float scale = 1.0f / std::sqrt(float(D));
  cuda::Attention a;
  a.q = dq.p, a.k = dk.p, a.v = dv.p, a.out = dout.p, a.n_tokens = T, a.n_past = past, a.n_head = H,
  a.n_head_kv = HKV;
  a.dk = a.dv = D, a.k_row = a.v_row = KV, a.scale = scale;
  CUDA_OK(cuda::attention(a, nullptr));
  auto out = dout.get(T * H * D);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kvh = h / (H / HKV), n_keys = past + t + 1;
      std::vector<double> s(n_keys);
      double mx = -1e300, sum = 0;
      for (int64_t j = 0; j < n_keys; ++j) {
        double d = 0;
        for (int64_t i = 0; i < D; ++i)
          d += double(q[(t * H + h) * D + i]) * k[j * KV + kvh * D + i];
        s[j] = d * scale, mx = std::max(mx, s[j]);
      }
      for (auto& x : s) x = std::exp(x - mx), sum += x;
      for (int64_t i = 0; i < D; ++i) {
        double r = 0;
        for (int64_t j = 0; j < n_keys; ++j) r += s[j] / sum * v[j * KV + kvh * D + i];
        ASSERT_NEAR(out[(t * H + h) * D + i], r, 1e-4)
            << "token " << t << " head " << h << " dim " << i;
      }
    }
}

// The general attention against kernels::attend: MLA's shape (one latent KV head, keys of 96 and
// values of their first 64 floats from the same rows), gpt-oss's sliding window with sinks, and a
// long context whose keys take three of the kernel's chunks of 1024 (window and sinks too).
TEST(CudaKernels, AttentionOfMlaShapeSlidingWindowWithSinksAndALongContext) {
  EXPERTD_REQUIRE_GPU();
  std::mt19937_64 rng(13);
  for (int which = 0; which < 3; ++which) {
    SCOPED_TRACE(which == 0 ? "mla" : which == 1 ? "window + sinks" : "long context");
    const bool mla = which == 0, long_ctx = which == 2;
    const int64_t T = long_ctx ? 3 : 5, past = long_ctx ? 2500 : 6;
    const int64_t H = 4, HKV = mla ? 1 : 2, dk = mla ? 96 : 64, dv = 64,
                  k_row = mla ? 96 : HKV * 64, v_row = mla ? 96 : HKV * 64,
                  window = mla        ? 0
                           : long_ctx ? 2100
                                      : 4;
    auto q = randn(T * H * dk, rng), k = randn((past + T) * k_row, rng),
         v = randn((past + T) * v_row, rng);
    auto sinks = randn(H, rng, 2.f);
    Dev<float> dq(q), dk_(k), dv_(v), dsinks(sinks), dout(T * H * dv);
    cuda::Attention a;
    a.q = dq.p, a.k = dk_.p, a.v = mla ? dk_.p : dv_.p, a.out = dout.p, a.n_tokens = T,
    a.n_past = past, a.n_head = H;
    a.n_head_kv = HKV, a.dk = dk, a.dv = dv, a.k_row = k_row, a.v_row = v_row, a.scale = 0.125f,
    a.window = window;
    a.sinks = mla ? nullptr : dsinks.p;
    CUDA_OK(cuda::attention(a, nullptr));
    auto out = dout.get(T * H * dv);
    std::vector<float> s(past + T), ref(dv);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t kvh = h / (H / HKV), n_keys = past + t + 1,
                      first = window ? std::max<int64_t>(0, n_keys - window) : 0;
        const float* vv = mla ? k.data() : v.data();
        attend(&q[(t * H + h) * dk], &k[first * k_row + kvh * dk], vv + first * v_row + kvh * dv,
               n_keys - first, k_row, v_row, dk, dv, 0.125f, mla ? -INFINITY : sinks[h], s.data(),
               ref.data(), Isa::Scalar);
        for (int64_t i = 0; i < dv; ++i)
          ASSERT_NEAR(out[(t * H + h) * dv + i], ref[i], 1e-4)
              << "token " << t << " head " << h << " dim " << i;
      }
  }
}

TEST(CudaKernels, AddGatherScatterAndGatedAdd) {
  EXPERTD_REQUIRE_GPU();
  std::mt19937_64 rng(12);
  const int64_t n = 50, rows = 6;
  auto y = randn(n * rows, rng), x = randn(n * rows, rng), b = randn(n, rng), g = randn(rows, rng);
  const std::vector<int32_t> idx = {4, 0, 5, 1};
  Dev<float> dy(y), dx(x), db(b), dg(g), dout(n * rows);
  Dev<int32_t> di(idx);
  CUDA_OK(cuda::add(dy.p, dx.p, n * rows, nullptr));
  CUDA_OK(cuda::add_rows(dy.p, db.p, n, rows, nullptr));
  CUDA_OK(cuda::add_gated(dy.p, dx.p, dg.p, n, rows, nullptr));
  auto got = dy.get(n * rows);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) {
      float want =
          y[r * n + i] + x[r * n + i] + b[i] + 1.0f / (1.0f + std::exp(-g[r])) * x[r * n + i];
      ASSERT_NEAR(got[r * n + i], want, 1e-5f * (1 + std::fabs(want)));
    }
  CUDA_OK(cuda::gather_rows(dx.p, di.p, dout.p, 4, n, nullptr));
  auto gathered = dout.get(4 * n);
  for (int k = 0; k < 4; ++k)
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(gathered[k * n + i], x[idx[k] * n + i]);
  CUDA_OK(cudaMemset(dout.p, 0, n * rows * sizeof(float)));
  CUDA_OK(cuda::scatter_rows(dx.p, di.p, dout.p, 4, n, nullptr));
  auto scattered = dout.get(n * rows);
  for (int k = 0; k < 4; ++k)
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(scattered[idx[k] * n + i], x[k * n + i]);
  EXPECT_EQ(scattered[2 * n], 0.0f);  // rows nobody scattered to stay untouched
}
