// The CUDA matmul's dispatch (kernels/cuda, compiled for the host as well) against
// kernels::dequantize_row, for every weight type the GPU takes. Both now run the one decoder of
// kernels/dequant.h, so what this checks is the CUDA side's wiring: a case for every type the
// table marks `cuda`, the right template for each, and its refusals. It needs no GPU; the device
// build of the decoder is checked by the gpu tests and, in CI, by their emulated twins.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/kernels.h"
#include "kernels/quant_blocks.h"
#include "kernels/random_weights.h"

using namespace kernels;

TEST(CudaDequantOnTheHost, EveryGpuWeightTypeMatchesTheCpuReferenceBitForBit) {
  std::mt19937_64 rng(11);
  const int64_t n = 1024;  // four super-blocks of the K types, 32 blocks of the others
  int n_types = 0;
  for (uint32_t t = 0; t < 64; ++t) {
    if (!weight_type_supported(t)) continue;
    ++n_types;
    SCOPED_TRACE(::testing::Message() << "type " << t);
    ASSERT_TRUE(cuda::weight_type_supported(t));
    auto w = random_weights(t, n, rng);
    if (t == MXFP4) {  // the exponent's extremes too: subnormal and huge scales
      auto* b = reinterpret_cast<BlockMxfp4*>(w.data());
      b[0].e = 0, b[1].e = 1, b[2].e = 2, b[3].e = 254, b[4].e = 128;
    }
    std::vector<float> ref(n), got(n, -12345.f);
    dequantize_row(t, w.data(), ref.data(), n);
    ASSERT_TRUE(cuda::dequantize_row_host(t, w.data(), got.data(), n));
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], ref[i]) << "element " << i;
  }
  EXPECT_EQ(n_types, 28) << "every weight type of ggml-cpu's type_traits";
}

TEST(CudaDequantOnTheHost, RejectsWhatTheGpuCannotTake) {
  std::vector<uint8_t> row(4096);
  std::vector<float> y(256);
  EXPECT_FALSE(cuda::dequantize_row_host(Q4_K, row.data(), y.data(), 128))
      << "not a multiple of 256";
  EXPECT_FALSE(cuda::dequantize_row_host(Q8_0, row.data(), y.data(), 48)) << "not a multiple of 32";
  EXPECT_FALSE(cuda::dequantize_row_host(Q8_K, row.data(), y.data(), 256)) << "activations only";
  EXPECT_FALSE(cuda::dequantize_row_host(I32, row.data(), y.data(), 256));
}
