// Every kernel against the scalar reference: the AVX2 and AVX-512 builds of each dot product and
// tile, matmul across threads, and each quantized dot against the dequantized weights in double
// precision.
#include "kernels/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backends.h"
#include "kernels/fp16.h"
#include "kernels/isa.h"
#include "kernels/quant_blocks.h"
#include "random_weights.h"
#include "test_util.h"

using namespace kernels;

namespace {

// Every weight type the table says the kernels run.
std::vector<uint32_t> all_types() {
  std::vector<uint32_t> v;
  for (uint32_t t = 0; t < 64; ++t)
    if (weight_type_supported(t)) v.push_back(t);
  return v;
}
const std::vector<uint32_t> kTypes = all_types();
// The kernels whose every instruction set gives the reference's bits.
const uint32_t kBitIdentical[] = {TQ1_0, Q2_0, Q5_1, IQ4_NL};

}  // namespace

TEST(Kernels, DotMatchesDequantizedReferenceOnEveryBackend) {
  std::mt19937_64 rng(7);
  std::normal_distribution<float> g(0.f, 1.f);
  const int64_t n = 512;
  for (uint32_t t : kTypes) {
    SCOPED_TRACE(t);
    auto w = random_weights(t, n, rng);
    std::vector<float> x(n), wf(n), xf(n);
    for (auto& v : x) v = g(rng);
    // Reference: dequantized weights against dequantized (quantized) activations, in double.
    std::vector<uint8_t> xq(row_size(vec_dot_type(t), n));
    quantize_activations(t, x.data(), xq.data(), n, Isa::Scalar);
    dequantize_row(t, w.data(), wf.data(), n);
    if (vec_dot_type(t) == Q8_K) {
      auto* b = reinterpret_cast<const BlockQ8K*>(xq.data());
      for (int64_t i = 0; i < n; ++i) xf[i] = b[i / 256].d * b[i / 256].qs[i % 256];
    } else {
      dequantize_row(vec_dot_type(t), xq.data(), xf.data(), n);
    }
    double ref = 0, mag = 0;
    for (int64_t i = 0; i < n; ++i)
      ref += double(wf[i]) * xf[i], mag += std::fabs(double(wf[i]) * xf[i]);
    if (vec_dot_type(t) == Q8_1) {
      // Q4_1 / Q5_1: the weights' min m (fp16 at byte 2 of each block) meets the activations
      // through Q8_1's fp16 s = d * sum(q), as in llama.cpp: m * s replaces m * sum(x).
      const size_t wb = row_size(t, 32);
      auto* yb = reinterpret_cast<const BlockQ8_1*>(xq.data());
      for (int64_t b = 0; b < n / 32; ++b) {
        uint16_t m;
        std::memcpy(&m, w.data() + b * wb + 2, 2);
        double sum_x = 0;
        for (int i = 0; i < 32; ++i) sum_x += xf[b * 32 + i];
        ref += double(fp16_to_fp32(m)) * (double(fp16_to_fp32(yb[b].s)) - sum_x);
      }
    }
    float scalar = dot(t, w.data(), xq.data(), n, Isa::Scalar);
    EXPECT_NEAR(scalar, ref, 1e-5 * mag + 1e-6);
    for (Isa be : runnable_backends()) {
      SCOPED_TRACE(isa_name(be));
      std::vector<uint8_t> xq2(xq.size());
      quantize_activations(t, x.data(), xq2.data(), n, be);
      EXPECT_EQ(0, std::memcmp(xq.data(), xq2.data(), xq.size()))
          << "activation quantization differs";
      // Integer block sums are exact; the float accumulation may round differently (FMA, lanes)
      // except in the kernels that scale each super-block's exact sum in the reference's order.
      const float got = dot(t, w.data(), xq.data(), n, be);
      EXPECT_NEAR(got, scalar, 1e-5 * mag + 1e-6);
      if (std::find(std::begin(kBitIdentical), std::end(kBitIdentical), t) !=
          std::end(kBitIdentical)) {
        EXPECT_EQ(got, scalar) << "not bit-identical to the reference";
      }
    }
  }
}

// A tile of one row x n tokens gives each token exactly what a single dot gives it, on every
// backend and for every tile width, so results never depend on how tokens are grouped.
TEST(Kernels, TileEqualsSingleDotsOnEveryBackend) {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> g(0.f, 1.f);
  const int64_t n = 768;
  for (uint32_t t : kTypes) {
    SCOPED_TRACE(t);
    auto w = random_weights(t, n, rng);
    const size_t xq_row = row_size(vec_dot_type(t), n);
    std::vector<uint8_t> xq(kMaxTile * xq_row);
    std::vector<float> x(n);
    const void* xs[kMaxTile];
    for (int k = 0; k < kMaxTile; ++k) {
      for (auto& v : x) v = g(rng) * (k + 1);
      quantize_activations(t, x.data(), xq.data() + k * xq_row, n);
      xs[k] = xq.data() + k * xq_row;
    }
    for (Isa be : runnable_backends()) {
      SCOPED_TRACE(isa_name(be));
      for (int nt = 1; nt <= kMaxTile; ++nt) {
        float out[kMaxTile] = {};
        dot_tile(t, w.data(), xs, nt, n, out, be);
        for (int k = 0; k < nt; ++k)
          EXPECT_EQ(out[k], dot(t, w.data(), xs[k], n, be)) << "width " << nt << " token " << k;
      }
    }
  }
}

// The activations' quantizers of every instruction set write the reference's bytes, on random rows
// and on the edges: an all-zero block, the largest magnitude twice with both signs (Q8_K keeps the
// first one's sign), products exactly between two integers (round half to even), a negative
// maximum, tiny and large magnitudes.
TEST(Kernels, ActivationQuantizersGiveTheReferencesBytes) {
  std::mt19937_64 rng(23);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<std::vector<float>> rows;
  for (int r = 0; r < 8; ++r) {
    std::vector<float> x(1024);
    for (auto& v : x) v = g(rng) * (r + 1) * 0.7f;
    rows.push_back(x);
  }
  std::vector<float> edge(1024, 0.0f);  // block 0 (of 256 and of 32) all zero
  for (int i = 256; i < 512; ++i) edge[i] = float(i % 7) - 3.0f;
  edge[300] = -5.0f, edge[301] = 5.0f;  // ties of the largest magnitude, the negative first
  for (int i = 512; i < 768; ++i) edge[i] = -float(i % 255) / 2.0f;  // x.5 products, max -127
  for (int i = 768; i < 1024; ++i) edge[i] = (i % 2 ? 1e-30f : -3e4f) * float(i % 5);
  rows.push_back(edge);
  for (uint32_t t : {Q8_0, Q4_K}) {  // Q8_0 and Q8_K activations
    SCOPED_TRACE(t);
    const size_t bytes = row_size(vec_dot_type(t), 1024);
    for (const auto& x : rows) {
      std::vector<uint8_t> ref(bytes), got(bytes);
      quantize_activations(t, x.data(), ref.data(), 1024, Isa::Scalar);
      for (Isa be : runnable_backends()) {
        SCOPED_TRACE(isa_name(be));
        quantize_activations(t, x.data(), got.data(), 1024, be);
        EXPECT_EQ(0, std::memcmp(ref.data(), got.data(), bytes));
      }
    }
  }
}

TEST(Kernels, Q8KQuantizationIsLlamaCpps) {
  std::vector<float> x(256);
  for (int i = 0; i < 256; ++i) x[i] = std::sin(i * 0.1f) * (i == 77 ? 5.f : 1.f);
  BlockQ8K b;
  quantize_activations(Q4_K, x.data(), &b, 256, Isa::Scalar);
  // iscale = -127 / max (max = the signed element of largest magnitude): x[77] maps to -127.
  EXPECT_EQ(b.qs[77], -127);
  EXPECT_FLOAT_EQ(b.d, 1.0f / (-127.f / x[77]));
  int sum = 0;
  for (int i = 0; i < 16; ++i) sum += b.qs[i];
  EXPECT_EQ(b.bsums[0], sum);
}

TEST(Kernels, MatmulIsTheSameOnOneOrManyThreads) {
  std::mt19937_64 rng(9);
  std::normal_distribution<float> g(0.f, 1.f);
  const int64_t rows = 96, cols = 512, tokens = 5;
  ThreadPool one(1), four(4);
  for (uint32_t t : kTypes) {
    auto w = random_weights(t, rows * cols, rng);
    std::vector<float> x(tokens * cols), y1(tokens * rows), y4(tokens * rows);
    for (auto& v : x) v = g(rng);
    Scratch s1, s4;
    matmul(t, w.data(), rows, cols, x.data(), tokens, y1.data(), s1, &one);
    matmul(t, w.data(), rows, cols, x.data(), tokens, y4.data(), s4, &four);
    EXPECT_EQ(0, std::memcmp(y1.data(), y4.data(), y1.size() * 4)) << t;
    std::vector<uint8_t> xq(row_size(vec_dot_type(t), cols));
    quantize_activations(t, x.data() + 2 * cols, xq.data(), cols);
    EXPECT_EQ(y1[2 * rows + 17], dot(t, w.data() + row_size(t, cols) * 17, xq.data(), cols)) << t;
  }
}

// n_tok tokens (rows of 2 x N(0, 1) picked by index among n_tok + 3 quantized ones, as an expert's
// tokens are) against the rows x cols weights w (and w8, their interleaved copy, or null) in one
// matmul_batch on every instruction set this CPU runs: each value bit for bit the single dot's.
void expect_each_tokens_dot(uint32_t t, const std::vector<uint8_t>& w, const void* w8, int64_t rows,
                            int64_t cols, int64_t n_tok, std::mt19937_64& rng, ThreadPool& pool,
                            bool w8_only = false) {
  SCOPED_TRACE(n_tok);
  std::normal_distribution<float> g(0.f, 1.f);
  const size_t xq_row = row_size(vec_dot_type(t), cols), w_row = row_size(t, cols);
  std::vector<float> x(n_tok * cols);
  for (auto& v : x) v = g(rng) * 2.0f;
  std::vector<uint8_t> xq((n_tok + 3) * xq_row);
  for (int64_t i = 0; i < n_tok + 3; ++i)
    quantize_activations(t, x.data() + (i % n_tok) * cols, xq.data() + i * xq_row, cols);
  std::vector<int32_t> tok(n_tok);
  for (int64_t i = 0; i < n_tok; ++i) tok[i] = int32_t((i * 7 + 3) % (n_tok + 3));
  for (Isa be : runnable_backends()) {
    SCOPED_TRACE(isa_name(be));
    std::vector<float> y(n_tok * rows, NAN);
    const MatmulJob job{
        t, w8_only ? nullptr : w.data(), rows, cols, xq.data(), xq_row, tok.data(), n_tok, y.data(),
        w8};
    matmul_batch(&job, 1, &pool, be);
    for (int64_t i = 0; i < n_tok; ++i)
      for (int64_t r = 0; r < rows; ++r)
        ASSERT_EQ(y[i * rows + r],
                  dot(t, w.data() + r * w_row, xq.data() + tok[i] * xq_row, cols, be))
            << "token " << i << " row " << r;
  }
}

// Many tokens at once (prefill): the types with a matrix-matrix body on an instruction set run it
// (panels of rows x tokens); every value is still bit for bit the single dot's, for token counts
// that fill panels or not, rows that are not a multiple of the panel, activations picked by index
// (the experts' tokens) and on one thread or several.
TEST(Kernels, MatmulOfManyTokensIsEachTokensDot) {
  std::mt19937_64 rng(13);
  const int64_t rows = 37;
  ThreadPool pool(3);
  // 2 super-blocks a row, and 11 (a full group of 8 float lanes, then 3 more)
  for (int64_t cols : {512, 2816})
    for (uint32_t t : kTypes) {
      SCOPED_TRACE(t);
      SCOPED_TRACE(cols);
      auto w = random_weights(t, rows * cols, rng);
      for (int64_t n_tok : {2, 5, 8, 16, 21, 40})
        expect_each_tokens_dot(t, w, nullptr, rows, cols, n_tok, rng, pool);
    }
}

// Weights interleaved eight rows at a time (rows8.h) give every row exactly the dot's bits, for
// one token (decode) and tiles of several, tokens picked by index, a row's last super-blocks short
// of a group of 8 float lanes, and a parallel loop whose chunks split the groups of eight (3
// threads, 40 rows); the scalar reference reads the rows and ignores the copy.
TEST(Kernels, InterleavedRowsGiveTheDotsBits) {
  std::mt19937_64 rng(19);
  const int64_t rows = 40;
  ThreadPool pool(3);
  for (int64_t cols : {256, 512, 2816})
    for (uint32_t t : kTypes) {
      if (!rows8_supported(t)) continue;
      SCOPED_TRACE(t);
      SCOPED_TRACE(cols);
      auto w = random_weights(t, rows * cols, rng);
      std::vector<uint8_t> w8(rows8_bytes(t, rows, cols));
      rows8_pack(t, w.data(), rows, cols, w8.data(), &pool);
      for (int64_t n_tok : {1, 2, 3, 4, 5, 9})
        expect_each_tokens_dot(t, w, w8.data(), rows, cols, n_tok, rng, pool);
    }
}

// A matrix with only its interleaved layout (an expert from a pack built with --layout rows8):
// unpacking gives back the rows byte for byte, and a job with w8 alone gives every row the dot's
// bits on every instruction set, through the interleaved bodies (few tokens) and through the
// panels and the scalar reference, which read the rows it unpacks (many tokens), in jobs batched
// with others of either kind.
TEST(Kernels, InterleavedOnlyMatricesGiveTheRowsBits) {
  std::mt19937_64 rng(29);
  const int64_t rows = 200;  // 25 groups: the unpacking loop runs on several threads
  ThreadPool pool(3);
  for (int64_t cols : {256, 2816})
    for (uint32_t t : kTypes) {
      if (!rows8_supported(t)) continue;
      SCOPED_TRACE(t);
      SCOPED_TRACE(cols);
      auto w = random_weights(t, rows * cols, rng);
      std::vector<uint8_t> w8(rows8_bytes(t, rows, cols)), back(w.size(), 0xAB);
      rows8_pack(t, w.data(), rows, cols, w8.data(), &pool);
      rows8_unpack(t, w8.data(), rows, cols, back.data(), &pool);
      ASSERT_EQ(back, w);
      for (int64_t n_tok : {1, 3, 8, 21, 40})
        expect_each_tokens_dot(t, w, w8.data(), rows, cols, n_tok, rng, pool, /*w8_only=*/true);
      // Two jobs in one loop: the interleaved-only one between one with rows.
      const size_t xq_row = row_size(vec_dot_type(t), cols), w_row = row_size(t, cols);
      const int64_t n_tok = 24;
      std::vector<float> x(cols);
      std::normal_distribution<float> g(0.f, 1.f);
      std::vector<uint8_t> xq(n_tok * xq_row);
      for (int64_t i = 0; i < n_tok; ++i) {
        for (auto& v : x) v = g(rng);
        quantize_activations(t, x.data(), xq.data() + i * xq_row, cols);
      }
      for (Isa be : runnable_backends()) {
        SCOPED_TRACE(isa_name(be));
        std::vector<float> y0(n_tok * rows), y1(n_tok * rows), y2(n_tok * rows);
        const MatmulJob jobs[3] = {
            {t, w.data(), rows, cols, xq.data(), xq_row, nullptr, n_tok, y0.data()},
            {t, nullptr, rows, cols, xq.data(), xq_row, nullptr, n_tok, y1.data(), w8.data()},
            {t, nullptr, rows, cols, xq.data(), xq_row, nullptr, 1, y2.data(), w8.data()}};
        matmul_batch(jobs, 3, &pool, be);
        for (int64_t i = 0; i < n_tok; ++i)
          for (int64_t r = 0; r < rows; ++r) {
            const float want = dot(t, w.data() + r * w_row, xq.data() + i * xq_row, cols, be);
            ASSERT_EQ(y0[i * rows + r], want);
            ASSERT_EQ(y1[i * rows + r], want);
            if (i == 0) {
              ASSERT_EQ(y2[r], want);
            }
          }
      }
    }
}

// Each instruction set's interleaved bodies (rows8_avx2.cpp; rows8_avx512.cpp's VNNI ones for
// Q2_K, Q3_K and IQ4_XS) called directly: every row within rounding of the scalar reference's dot
// of the row, and the instruction sets bit for bit the same.
TEST(Kernels, InterleavedBodiesMatchTheReference) {
  std::mt19937_64 rng(23);
  std::normal_distribution<float> g(0.f, 1.f);
  const int64_t rows = 16, cols = 2816;
  for (uint32_t t : kTypes) {
    if (!rows8_supported(t)) continue;
    SCOPED_TRACE(t);
    auto w = random_weights(t, rows * cols, rng);
    std::vector<uint8_t> w8(rows8_bytes(t, rows, cols));
    rows8_pack(t, w.data(), rows, cols, w8.data());
    const size_t xq_row = row_size(vec_dot_type(t), cols), w_row = row_size(t, cols);
    std::vector<uint8_t> xq(kMaxTile * xq_row);
    std::vector<float> x(cols);
    const void* xs[kMaxTile];
    for (int i = 0; i < kMaxTile; ++i) {
      for (auto& v : x) v = g(rng);
      quantize_activations(t, x.data(), xq.data() + i * xq_row, cols);
      xs[i] = xq.data() + i * xq_row;
    }
    for (int n_tok = 1; n_tok <= kMaxTile; ++n_tok)
      for (int64_t grp = 0; grp < rows / 8; ++grp) {
        std::vector<float> first;
        for (Isa be : runnable_backends()) {
          if (be == Isa::Scalar) continue;
          SCOPED_TRACE(isa_name(be));
          std::vector<float> out(kMaxTile * 8, NAN);
          rows8_group(t, w8.data(), cols, grp, xs, n_tok, out.data(), be);
          for (int i = 0; i < n_tok; ++i)
            for (int r = 0; r < 8; ++r) {
              const uint8_t* row = w.data() + (8 * grp + r) * w_row;
              const float ref = dot(t, row, xs[i], cols, Isa::Scalar);
              EXPECT_NEAR(out[8 * i + r], ref, 1e-5 * std::fabs(ref) + 1e-3) << "row " << r;
            }
          if (first.empty()) first = out;
          EXPECT_EQ(0, std::memcmp(first.data(), out.data(), 8 * n_tok * sizeof(float)));
        }
      }
  }
}

// The super-block types' AVX2 and AVX-512 bodies compute one arithmetic (each super-block's exact
// integer sums into float lane b % 8, avx2.h's sb_lanes): a dot and every tile width give the
// same bits on both, so a CPU may run either (AMD's Zen 4 runs the AVX2 ones: kernels/types.cpp).
TEST(Kernels, SuperBlockBodiesGiveTheSameBitsOnBothIsas) {
  if (best_isa() != Isa::Avx512) GTEST_SKIP() << "no AVX-512 VNNI on this CPU";
  std::mt19937_64 rng(17);
  std::normal_distribution<float> g(0.f, 1.f);
  using Tile = void (*)(const void*, const void* const*, int, int64_t, float*);
  struct Bodies {
    uint32_t type;
    Tile avx2, avx512;
  };
#define EXPERTD_BODIES_AS(T, Block, name, name512)                                             \
  Bodies {                                                                                     \
    T,                                                                                         \
        [](const void* w, const void* const* ys, int n_tok, int64_t n, float* out) {           \
          avx2::tile_##name(static_cast<const Block*>(w),                                      \
                            reinterpret_cast<const BlockQ8K* const*>(ys), n_tok, n, out);      \
        },                                                                                     \
        [](const void* w, const void* const* ys, int n_tok, int64_t n, float* out) {           \
          avx512::tile_##name512(static_cast<const Block*>(w),                                 \
                                 reinterpret_cast<const BlockQ8K* const*>(ys), n_tok, n, out); \
        }                                                                                      \
  }
#define EXPERTD_BODIES(T, Block, name) EXPERTD_BODIES_AS(T, Block, name, name)
  // avx512's tiles run avx512_vbmi.cpp's bodies where the CPU has VBMI and GFNI: the plain ones
  // are listed too.
  const Bodies bodies[] = {
      EXPERTD_BODIES_AS(IQ2_XXS, BlockIq2Xxs, iq2_xxs, iq2_xxs_plain),
      EXPERTD_BODIES_AS(IQ3_XXS, BlockIq3Xxs, iq3_xxs, iq3_xxs_plain),
      EXPERTD_BODIES_AS(IQ3_S, BlockIq3S, iq3_s, iq3_s_plain),
      EXPERTD_BODIES(IQ2_XS, BlockIq2Xs, iq2_xs),
      EXPERTD_BODIES(IQ2_S, BlockIq2S, iq2_s),
      EXPERTD_BODIES(Q4_K, BlockQ4K, q4_k),
      EXPERTD_BODIES(Q5_K, BlockQ5K, q5_k),
      EXPERTD_BODIES(Q6_K, BlockQ6K, q6_k),
      EXPERTD_BODIES(Q2_K, BlockQ2K, q2_k),
      EXPERTD_BODIES(Q3_K, BlockQ3K, q3_k),
      EXPERTD_BODIES(IQ2_XXS, BlockIq2Xxs, iq2_xxs),
      EXPERTD_BODIES(IQ4_XS, BlockIq4Xs, iq4_xs),
      EXPERTD_BODIES(IQ1_S, BlockIq1S, iq1_s),
      EXPERTD_BODIES(IQ1_M, BlockIq1M, iq1_m),
      EXPERTD_BODIES(IQ3_XXS, BlockIq3Xxs, iq3_xxs),
      EXPERTD_BODIES(IQ3_S, BlockIq3S, iq3_s),
  };
#undef EXPERTD_BODIES
#undef EXPERTD_BODIES_AS
  for (const Bodies& k : bodies)
    for (int64_t n : {256, 2816}) {  // 1 super-block; a full group of 8 lanes and 3 more
      SCOPED_TRACE(k.type);
      SCOPED_TRACE(n);
      auto w = random_weights(k.type, n, rng);
      std::vector<std::vector<uint8_t>> xq(4, std::vector<uint8_t>(row_size(Q8_K, n)));
      std::vector<float> x(n);
      const void* ys[4];
      for (int t = 0; t < 4; ++t) {
        for (auto& v : x) v = g(rng) * 2.0f;
        quantize_activations(k.type, x.data(), xq[t].data(), n);
        ys[t] = xq[t].data();
      }
      for (int n_tok = 1; n_tok <= 4; ++n_tok) {
        float a[4], b[4];
        k.avx2(w.data(), ys, n_tok, n, a);
        k.avx512(w.data(), ys, n_tok, n, b);
        for (int t = 0; t < n_tok; ++t) ASSERT_EQ(a[t], b[t]) << n_tok << " tokens, token " << t;
        // the dot on either instruction set (each the tile of one)
        ASSERT_EQ(dot(k.type, w.data(), ys[0], n, Isa::Avx2), b[0]);
        ASSERT_EQ(dot(k.type, w.data(), ys[0], n, Isa::Avx512), b[0]);
      }
    }
}

// The F16 and BF16 rows' dots: AVX-512's chains are AVX2's four chains of eight lanes (F16 two
// to a register, BF16's even and odd elements), the same products in the same order, so the same
// bits, leftovers included. The values span 2^-6..2^6 (F16's range allows no more) so that the
// sums round: products of values of equal magnitude sum exactly in a float, and any order would
// agree.
TEST(Kernels, FloatRowDotsGiveTheSameBitsOnBothIsas) {
  if (best_isa() != Isa::Avx512) GTEST_SKIP() << "no AVX-512 VNNI on this CPU";
  std::mt19937_64 rng(23);
  std::normal_distribution<float> g(0.f, 1.f);
  std::uniform_int_distribution<int> e(-6, 6);
  for (uint32_t type : {F16, BF16})
    for (int64_t n : {32, 48, 2048, 2816 + 7}) {
      SCOPED_TRACE(type);
      SCOPED_TRACE(n);
      std::vector<float> w(n), x(n);
      for (auto& v : w) v = std::ldexp(g(rng), e(rng));
      for (auto& v : x) v = std::ldexp(g(rng), e(rng));
      std::vector<uint16_t> wq(n), xq(n);
      quantize_activations(type, w.data(), wq.data(), n);  // the weights' own type
      quantize_activations(type, x.data(), xq.data(), n);
      const float a = dot(type, wq.data(), xq.data(), n, Isa::Avx2);
      ASSERT_EQ(a, dot(type, wq.data(), xq.data(), n, Isa::Avx512));
      double mass = 0;  // the rounding of any order is a small part of the products' magnitudes
      std::vector<float> wf(n), xf(n);
      dequantize_row(type, wq.data(), wf.data(), n);
      dequantize_row(type, xq.data(), xf.data(), n);
      for (int64_t i = 0; i < n; ++i) mass += std::fabs(double(wf[i]) * xf[i]);
      ASSERT_NEAR(a, dot(type, wq.data(), xq.data(), n, Isa::Scalar), 1e-5 * mass);
    }
}

// NVFP4's body is one (x86.h's nvfp4_rows) with each instruction set's 4-element sums (AVX2's
// vpmaddubsw + vpmaddwd, AVX-512's vpdpbusd): the same integers, the same float steps, so the
// same bits, the tiles' too.
TEST(Kernels, Nvfp4GivesTheSameBitsOnBothIsas) {
  if (best_isa() != Isa::Avx512) GTEST_SKIP() << "no AVX-512 VNNI on this CPU";
  std::mt19937_64 rng(29);
  std::normal_distribution<float> g(0.f, 1.f);
  for (int64_t n : {64, 2048 + 64}) {
    SCOPED_TRACE(n);
    auto w = random_weights(NVFP4, n, rng);
    const size_t xq_row = row_size(vec_dot_type(NVFP4), n);
    std::vector<uint8_t> xq(kMaxTile * xq_row);
    std::vector<float> x(n);
    const void* xs[kMaxTile];
    for (int k = 0; k < kMaxTile; ++k) {
      for (auto& v : x) v = g(rng) * float(1 << k);
      quantize_activations(NVFP4, x.data(), xq.data() + k * xq_row, n);
      xs[k] = xq.data() + k * xq_row;
    }
    for (int nt = 1; nt <= kMaxTile; ++nt) {
      float a[kMaxTile] = {}, b[kMaxTile] = {};
      dot_tile(NVFP4, w.data(), xs, nt, n, a, Isa::Avx2);
      dot_tile(NVFP4, w.data(), xs, nt, n, b, Isa::Avx512);
      for (int k = 0; k < nt; ++k) ASSERT_EQ(a[k], b[k]) << nt << " tokens, token " << k;
    }
  }
}

// NVFP4's interleaved rows turn eight rows' UE4M3 scale bytes into floats with vector operations
// (rows8_body.h's nvfp4x8_scales), the rows' dot through a table of ue4m3_half: every one of the
// 256 bytes (0 and 0x7F zero, the subnormal exponent 0, bit 7 set) in every sub-block position and
// lane gives the dot's bits, on every instruction set, for one token and four.
TEST(Kernels, Nvfp4InterleavedRowsReadEveryScaleByte) {
  std::mt19937_64 rng(31);
  const int64_t rows = 16, cols = 2048;  // 32 blocks, 128 scales a row
  ThreadPool pool(2);
  auto w = random_weights(NVFP4, rows * cols, rng);
  const size_t w_row = row_size(NVFP4, cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < cols / 64; ++b)
      for (int k = 0; k < 4; ++k)
        w[r * w_row + b * sizeof(BlockNvfp4) + k] = uint8_t(r * 131 + b * 4 + k);
  std::vector<uint8_t> w8(rows8_bytes(NVFP4, rows, cols));
  rows8_pack(NVFP4, w.data(), rows, cols, w8.data(), &pool);
  for (int64_t n_tok : {1, 4})
    expect_each_tokens_dot(NVFP4, w, w8.data(), rows, cols, n_tok, rng, pool);
}

// ggml's order of the f32 dot and mad (the KDA recurrence): the 32-float steps through four FMA
// accumulators, then ggml's pairwise reduction; leftovers one at a time. Checked here against
// the same arithmetic written out in scalar code (std::fma per lane), on a length with leftovers.
TEST(Kernels, GgmlOrderDotAndMad) {
  if (best_isa() == Isa::Scalar) GTEST_SKIP() << "no SIMD backend on this CPU";
  std::mt19937 rng(3);
  std::normal_distribution<float> g;
  const int n = 75;  // two steps of 32 and 11 leftovers
  std::vector<float> a(n), b(n), y(n), want(n);
  for (int i = 0; i < n; ++i) a[i] = g(rng), b[i] = g(rng), y[i] = want[i] = g(rng);
  float lane[32] = {};
  for (int i = 0; i + 32 <= n; i += 32)
    for (int l = 0; l < 32; ++l) lane[l] = std::fma(a[i + l], b[i + l], lane[l]);
  float r[8];
  for (int l = 0; l < 8; ++l)  // (acc0 + acc2) + (acc1 + acc3)
    r[l] = (lane[l] + lane[16 + l]) + (lane[8 + l] + lane[24 + l]);
  const float h0 = r[0] + r[4], h1 = r[1] + r[5], h2 = r[2] + r[6], h3 = r[3] + r[7];
  float dot = (h0 + h1) + (h2 + h3);
  for (int i = 64; i < n; ++i) dot += a[i] * b[i];
  EXPECT_EQ(dot_f32_ggml(a.data(), b.data(), n), dot);
  EXPECT_NEAR(dot_f32_ggml(a.data(), b.data(), n), dot_f32(a.data(), b.data(), n, Isa::Scalar),
              1e-4);
  axpy_ggml(0.37f, a.data(), y.data(), n);
  for (int i = 0; i < n; ++i)
    want[i] = i < 64 ? std::fma(a[i], 0.37f, want[i]) : want[i] + a[i] * 0.37f;
  EXPECT_EQ(y, want);
}

TEST(Kernels, NormsRopeSoftmax) {
  std::vector<float> x = {1, 2, 3, 4}, w = {1, 1, 2, 2}, y(4);
  rms_norm(x.data(), w.data(), y.data(), 4, 0.0f);
  float inv = 1.0f / std::sqrt(7.5f);
  EXPECT_FLOAT_EQ(y[0], 1 * inv);
  EXPECT_FLOAT_EQ(y[3], 8 * inv);
  std::vector<float> r = {1, 0, 0, 1};  // NeoX pairs (0,2) and (1,3); at pos 0 nothing turns
  rope(r.data(), 4, 4, 0, 10000.f, true);
  EXPECT_EQ(r, (std::vector<float>{1, 0, 0, 1}));
  rope(r.data(), 4, 4, 1, 10000.f, true);  // pair (0,2) turns by 1 rad, pair (1,3) by 0.01 rad
  EXPECT_NEAR(r[0], std::cos(1.0f), 1e-6);
  EXPECT_NEAR(r[2], std::sin(1.0f), 1e-6);
  std::vector<float> a = {1, 0, 0, 1};  // adjacent pairs (0,1) and (2,3)
  rope(a.data(), 4, 4, 1, 10000.f, false);
  EXPECT_NEAR(a[1], std::sin(1.0f), 1e-6);
  std::vector<float> s = {1, 2, 3};
  softmax(s.data(), 3);
  EXPECT_NEAR(s[0] + s[1] + s[2], 1.0, 1e-6);
  EXPECT_NEAR(s[2] / s[1], std::exp(1.0), 1e-5);
  EXPECT_EQ(fp16_to_fp32(fp32_to_fp16(0.333333f)), 0.33325195f);
  EXPECT_EQ(bf16_to_fp32(fp32_to_bf16(1.00390625f)), 1.0f);  // ties to even
}

// The float types' rows may be of any length (embeddings, F32 tables): every element is
// dequantized, the tail past the last 32 too (it was left unwritten).
TEST(Kernels, FloatRowsOfAnyLengthDequantizeWhole) {
  for (int64_t n : {1, 4, 24, 45, 100}) {
    std::vector<float> x(static_cast<size_t>(n)), y(static_cast<size_t>(n), -7.0f);
    for (int64_t i = 0; i < n; ++i) x[size_t(i)] = 0.25f * float(i + 1);
    dequantize_row(F32, x.data(), y.data(), n);
    EXPECT_EQ(x, y) << "F32, n = " << n;
    std::vector<uint16_t> h(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      h[size_t(i)] = fp32_to_fp16(x[size_t(i)]), b[size_t(i)] = fp32_to_bf16(x[size_t(i)]);
    std::fill(y.begin(), y.end(), -7.0f);
    dequantize_row(F16, h.data(), y.data(), n);
    EXPECT_EQ(x, y) << "F16, n = " << n;  // quarters below 32: exact in both
    std::fill(y.begin(), y.end(), -7.0f);
    dequantize_row(BF16, b.data(), y.data(), n);
    EXPECT_EQ(x, y) << "BF16, n = " << n;
  }
}

// attend over an F16 cache (--kv-type f16): on every instruction set, bit for bit attend over the
// same rows widened to float (keys with a stride past their head, a window of values, a sink).
TEST(Kernels, AttendOverF16IsAttendOverTheWidenedRows) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const int64_t dk : {int64_t{64}, int64_t{72}, int64_t{13}}) {
    const int64_t n_keys = 37, stride = dk + 8, dv = dk - 5;
    std::vector<float> q(dk), kf(n_keys * stride), widened(kf.size());
    std::vector<uint16_t> k16(kf.size());
    for (auto& x : q) x = nd(rng);
    for (auto& x : kf) x = nd(rng);
    to_f16(kf.data(), k16.data(), int64_t(kf.size()));
    from_f16(k16.data(), widened.data(), int64_t(kf.size()));
    for (size_t i = 0; i < kf.size(); ++i) ASSERT_EQ(widened[i], fp16_to_fp32(fp32_to_fp16(kf[i])));
    for (Isa be : runnable_backends())
      for (const float sink : {-INFINITY, 0.7f}) {
        SCOPED_TRACE(int(be));
        std::vector<float> s(n_keys), want(dv), got(dv);
        attend(q.data(), widened.data(), widened.data() + 3, n_keys, stride, stride, dk, dv, 0.125f,
               sink, s.data(), want.data(), be);
        attend_f16(q.data(), k16.data(), k16.data() + 3, n_keys, stride, stride, dk, dv, 0.125f,
                   sink, s.data(), got.data(), be);
        EXPECT_EQ(std::memcmp(got.data(), want.data(), dv * sizeof(float)), 0);
      }
  }
}

// attend_group (the query heads that share a KV head, in one pass over the keys): each query's
// result is attend's for it alone, bit for bit, on every instruction set, F32 and F16 caches,
// with and without sinks.
TEST(Kernels, AttendGroupIsAttendPerQuery) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int G = 6;
  const int64_t dk = 72, dv = 64, n_keys = 53, stride = 80, q_stride = 96, out_stride = 70;
  std::vector<float> q(G * q_stride), kf(n_keys * stride), sinks(G), widened(kf.size());
  std::vector<uint16_t> k16(kf.size());
  for (auto& x : q) x = nd(rng);
  for (auto& x : kf) x = nd(rng);
  for (auto& x : sinks) x = nd(rng);
  to_f16(kf.data(), k16.data(), int64_t(kf.size()));
  from_f16(k16.data(), widened.data(), int64_t(kf.size()));
  for (Isa be : runnable_backends())
    for (const float* sk :
         {static_cast<const float*>(nullptr), static_cast<const float*>(sinks.data())}) {
      SCOPED_TRACE(int(be));
      std::vector<float> s(G * n_keys), got(G * out_stride), got16(G * out_stride), want(dv);
      attend_group(q.data(), q_stride, G, kf.data(), kf.data() + 5, n_keys, stride, stride, dk, dv,
                   0.1f, sk, s.data(), got.data(), out_stride, be);
      attend_group_f16(q.data(), q_stride, G, k16.data(), k16.data() + 5, n_keys, stride, stride,
                       dk, dv, 0.1f, sk, s.data(), got16.data(), out_stride, be);
      for (int g = 0; g < G; ++g) {
        const float sink = sk ? sk[g] : -INFINITY;
        attend(q.data() + g * q_stride, kf.data(), kf.data() + 5, n_keys, stride, stride, dk, dv,
               0.1f, sink, s.data(), want.data(), be);
        EXPECT_EQ(std::memcmp(got.data() + g * out_stride, want.data(), dv * sizeof(float)), 0)
            << "query " << g;
        attend(q.data() + g * q_stride, widened.data(), widened.data() + 5, n_keys, stride, stride,
               dk, dv, 0.1f, sink, s.data(), want.data(), be);
        EXPECT_EQ(std::memcmp(got16.data() + g * out_stride, want.data(), dv * sizeof(float)), 0)
            << "f16 query " << g;
      }
    }
}

// attention_softmax: the same bits on every instruction set (its SIMD body's eight scores at once
// and its reference's one at a time), each probability within 4e-7 (relative, ~3 ulp) of a float64
// softmax of the same differences, masked scores (-INFINITY) 0, a sink in the denominator only.
TEST(Kernels, AttentionSoftmaxIsOneDefinitionOnEveryIsaNearFloat64) {
  std::mt19937 rng(17);
  for (const int64_t n : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{13}, int64_t{300}})
    for (const float spread : {0.5f, 8.0f, 60.0f})
      for (const float sink : {-INFINITY, 1.5f}) {
        SCOPED_TRACE(testing::Message() << "n " << n << " spread " << spread << " sink " << sink);
        std::normal_distribution<float> nd(0.0f, spread);
        std::vector<float> x(n);
        for (auto& v : x) v = nd(rng);
        if (n > 2) x[1] = -INFINITY;
        // exp in float64 of each score less the maximum as float gives it (the subtraction's
        // rounding is the input's, not the softmax's).
        std::vector<double> want(n);
        float mx = sink;
        for (float v : x) mx = std::max(mx, v);
        double sum = sink == -INFINITY ? 0.0 : std::exp(double(sink - mx));
        for (int64_t j = 0; j < n; ++j) sum += want[j] = std::exp(double(x[j] - mx));
        for (auto& w : want) w /= sum;
        std::vector<float> first;
        for (Isa be : runnable_backends()) {
          std::vector<float> got = x;
          attention_softmax(got.data(), n, sink, be);
          if (first.empty())
            first = got;
          else
            EXPECT_EQ(std::memcmp(got.data(), first.data(), n * sizeof(float)), 0)
                << "isa " << int(be);
          // exp's floor (-87): a probability below e^-87 may be 0.
          for (int64_t j = 0; j < n; ++j)
            EXPECT_NEAR(got[j], want[j], std::max(4e-7 * want[j], 2e-38)) << "score " << j;
        }
      }
}

// swiglu: the same bits on every instruction set (eight at a time and one at a time, a tail past
// the last eight), each value within 4e-7 (relative) of silu(g) * u in float64 over the whole range
// (|g| up to 120, where exp alone would overflow), NaN kept, and in place.
TEST(Kernels, SwigluIsOneDefinitionOnEveryIsaNearFloat64) {
  std::mt19937 rng(19);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t n = 203;
  std::vector<float> g(n), u(n);
  for (int64_t i = 0; i < n; ++i) g[i] = nd(rng) * (i % 3 == 0 ? 30.0f : 3.0f), u[i] = nd(rng);
  g[0] = 120.0f, g[1] = -120.0f, g[2] = 0.0f, g[3] = -0.0f, g[4] = 88.5f, g[5] = -87.5f;
  g[6] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> first;
  for (Isa be : runnable_backends()) {
    SCOPED_TRACE(int(be));
    std::vector<float> got(n), in_place = g;
    swiglu(g.data(), u.data(), got.data(), n, be);
    swiglu(in_place.data(), u.data(), in_place.data(), n, be);
    EXPECT_EQ(std::memcmp(got.data(), in_place.data(), n * sizeof(float)), 0);
    EXPECT_TRUE(std::isnan(got[6]));
    got[6] = 0.0f;
    if (first.empty())
      first = got;
    else
      EXPECT_EQ(std::memcmp(got.data(), first.data(), n * sizeof(float)), 0);
    for (int64_t i = 0; i < n; ++i) {
      if (i == 6) continue;
      const double x = g[i], want = x / (1.0 + std::exp(-x)) * u[i];
      EXPECT_NEAR(got[i], want, std::max(4e-7 * std::abs(want), 1e-30)) << "g " << g[i];
    }
  }
}

// attend's scores and values pass (two queries a key or value load, out held in registers across
// the keys) give what one dot_f32 and one axpy per key do, bit for bit: attend against the plain
// loop of dot_f32, attention_softmax and axpy on every instruction set.
TEST(Kernels, AttendIsTheLoopOfDotAndAxpy) {
  std::mt19937 rng(13);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const int64_t dv : {int64_t{128}, int64_t{72}, int64_t{13}}) {
    const int64_t dk = dv, n_keys = 300, stride = dv + 3;
    std::vector<float> q(dk), kv(n_keys * stride);
    for (auto& x : q) x = nd(rng);
    for (auto& x : kv) x = nd(rng);
    for (Isa be : runnable_backends()) {
      SCOPED_TRACE(int(be));
      std::vector<float> s(n_keys), got(dv), want(dv, 0.0f);
      attend(q.data(), kv.data(), kv.data() + 1, n_keys, stride, stride, dk, dv, 0.2f, -INFINITY,
             s.data(), got.data(), be);
      for (int64_t j = 0; j < n_keys; ++j)
        s[j] = dot_f32(q.data(), kv.data() + j * stride, dk, be) * 0.2f;
      attention_softmax(s.data(), n_keys, -INFINITY, be);
      for (int64_t j = 0; j < n_keys; ++j)
        axpy(s[j], kv.data() + 1 + j * stride, want.data(), dv, be);
      EXPECT_EQ(std::memcmp(got.data(), want.data(), dv * sizeof(float)), 0) << "dv " << dv;
    }
  }
}
