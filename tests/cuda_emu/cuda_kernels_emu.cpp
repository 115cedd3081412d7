// kernels/cuda/cuda_kernels.cu and cuda_dsv4.cu compiled as C++ against the CUDA emulation (see
// include/cuda_runtime.h).
#include "kernels/cuda/cuda_dsv4.cu"
#include "kernels/cuda/cuda_kernels.cu"
