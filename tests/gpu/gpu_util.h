// GPU tests skip (ctest shows them as skipped) when no CUDA device is present, and run in full
// when one is: they never pass without exercising the device.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

namespace expertd::test {

inline bool have_cuda_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define EXPERTD_REQUIRE_GPU() \
  if (!::expertd::test::have_cuda_device()) GTEST_SKIP() << "no CUDA device on this machine"

#define CUDA_OK(expr)                                                      \
  do {                                                                     \
    cudaError_t _e = (expr);                                               \
    ASSERT_EQ(_e, cudaSuccess) << #expr << ": " << cudaGetErrorString(_e); \
  } while (0)

}  // namespace expertd::test
