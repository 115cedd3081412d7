// The SIMD bodies that decode a byte with vector operations (TQ1_0's base-3 digits, IQ2_XXS's sign
// indices) against the scalar reference, every byte or index in every place a block has: part of
// kernels_test.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backends.h"
#include "kernels/kernels.h"
#include "kernels/quant_blocks.h"

using namespace kernels;

// TQ1_0's SIMD bodies turn each byte times 3^n into a digit by comparisons (below 86, below 171),
// or (AVX-512, one token) take the digit as (3x - x') / 256 of that product x and the next, x':
// every byte value at every one of a block's 52 places, against activations none of which is
// zero (so every digit counts), gives each backend the reference's bits, for one token and four.
TEST(Kernels, Tq1_0EveryByteInEveryPlace) {
  std::mt19937_64 rng(37);
  std::uniform_real_distribution<float> u(1.f, 4.f);
  const int64_t n = 256 * kQK_K;  // block j holds byte (j + 97 p) % 256 at place p
  std::vector<BlockTq1_0> w(n / kQK_K);
  for (int j = 0; j < 256; ++j) {
    uint8_t* q = w[j].qs;  // qs[48] then qh[4]
    for (int p = 0; p < 52; ++p) q[p] = uint8_t(j + 97 * p);
    w[j].d = 0x3C00;  // 1.0
  }
  const size_t xq_row = row_size(Q8_K, n);
  std::vector<uint8_t> xq(kMaxTile * xq_row);
  std::vector<float> x(n);
  const void* xs[kMaxTile];
  for (int k = 0; k < kMaxTile; ++k) {
    for (auto& v : x) v = (rng() & 1 ? u(rng) : -u(rng)) * float(1 << k);
    quantize_activations(TQ1_0, x.data(), xq.data() + k * xq_row, n, Isa::Scalar);
    xs[k] = xq.data() + k * xq_row;
  }
  for (int k = 0; k < kMaxTile; ++k) {
    const float want = dot(TQ1_0, w.data(), xs[k], n, Isa::Scalar);
    for (Isa be : runnable_backends()) {
      ASSERT_EQ(dot(TQ1_0, w.data(), xs[k], n, be), want)
          << "token " << k << ", backend " << int(be);
      float got[kMaxTile] = {};
      dot_tile(TQ1_0, w.data(), xs, kMaxTile, n, got, be);
      ASSERT_EQ(got[k], want) << "token " << k << " of a tile, backend " << int(be);
    }
  }
}

// TQ2_0's AVX-512 body masks each code in place (the code times 4^k, no shift) and divides its
// i32 sums by 4^k: every byte value (codes of 3 included, which a 16-bit step would saturate
// against) at every one of a block's 64 places, each block its own scale, gives the AVX2 row
// dot's bits (its lanes: the same integers, the same float steps), for one token and in a tile.
TEST(Kernels, Tq2_0EveryByteInEveryPlace) {
  if (best_isa() != Isa::Avx512) GTEST_SKIP() << "no AVX-512 VNNI on this CPU";
  std::mt19937_64 rng(41);
  std::normal_distribution<float> g(0.f, 1.f);
  const int64_t n = 256 * kQK_K;  // block j holds byte (j + 97 p) % 256 at place p
  std::vector<BlockTq2_0> w(n / kQK_K);
  for (int j = 0; j < 256; ++j) {
    for (int p = 0; p < 64; ++p) w[j].qs[p] = uint8_t(j + 97 * p);
    w[j].d = uint16_t(0x3000 + 37 * j);  // 0.125 and up, a different mantissa each
  }
  const size_t xq_row = row_size(Q8_K, n);
  std::vector<uint8_t> xq(kMaxTile * xq_row);
  std::vector<float> x(n);
  const void* xs[kMaxTile];
  for (int k = 0; k < kMaxTile; ++k) {
    for (auto& v : x) v = g(rng) * float(1 << k);
    quantize_activations(TQ2_0, x.data(), xq.data() + k * xq_row, n, Isa::Scalar);
    xs[k] = xq.data() + k * xq_row;
  }
  for (int k = 0; k < kMaxTile; ++k) {
    const float want = dot(TQ2_0, w.data(), xs[k], n, Isa::Avx2);
    ASSERT_EQ(dot(TQ2_0, w.data(), xs[k], n, Isa::Avx512), want) << "token " << k;
    float got[kMaxTile] = {};
    dot_tile(TQ2_0, w.data(), xs, kMaxTile, n, got, Isa::Avx512);
    ASSERT_EQ(got[k], want) << "token " << k << " of a tile";
  }
}

// IQ2_XXS's signs (a 7-bit index per 8 weights, the eighth sign its parity), decoded for a whole
// block at once by the SIMD bodies: every index at every one of a group's four places, in every
// group of a block, gives each backend the scalar reference's dot (one block: the same exact
// integer sums, then a few float products; a wrong sign moves the dot by far more).
TEST(Kernels, Iq2XxsEverySignIndexInEveryPlace) {
  std::mt19937_64 rng(23);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> x(256);
  for (auto& v : x) v = g(rng);
  std::vector<uint8_t> xq(row_size(Q8_K, 256));
  quantize_activations(IQ2_XXS, x.data(), xq.data(), 256, Isa::Scalar);
  int checked = 0;
  for (int place = 0; place < 4; ++place)
    for (uint32_t i = 0; i < 128; ++i) {
      BlockIq2Xxs b{};
      b.d = 0x3C00;  // 1.0
      uint8_t* q = reinterpret_cast<uint8_t*>(b.qs);
      for (int ib = 0; ib < 8; ++ib) {
        for (int l = 0; l < 4; ++l) q[8 * ib + l] = uint8_t(rng());
        uint32_t aux = uint32_t(rng()) & 0xF0000000u;  // the scale
        for (int l = 0; l < 4; ++l)
          aux |= (l == place ? (i + 37 * uint32_t(ib)) % 128 : uint32_t(rng()) % 128) << (7 * l);
        std::memcpy(q + 8 * ib + 4, &aux, 4);
      }
      const float want = dot(IQ2_XXS, &b, xq.data(), 256, Isa::Scalar);
      for (Isa be : runnable_backends()) {
        const float got = dot(IQ2_XXS, &b, xq.data(), 256, be);
        ASSERT_NEAR(got, want, 1e-5f * (1.0f + std::fabs(want)))
            << "index " << i << " at place " << place << ", backend " << int(be);
      }
      ++checked;
    }
  EXPECT_EQ(checked, 512);
}
