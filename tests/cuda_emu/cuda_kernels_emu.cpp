// kernels/cuda/cuda_kernels.cu, cuda_dsv4.cu and cuda_attention.cu compiled as C++ against the CUDA
// emulation (see include/cuda_runtime.h).
#include "kernels/cuda/cuda_attention.cu"
#include "kernels/cuda/cuda_dsv4.cu"
#include "kernels/cuda/cuda_kernels.cu"
