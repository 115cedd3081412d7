// kernels/cuda/cuda_kernels.cu, cuda_dsv4.cu and cuda_msa.cu compiled as C++ against the CUDA
// emulation (see include/cuda_runtime.h).
#include "kernels/cuda/cuda_dsv4.cu"
#include "kernels/cuda/cuda_kernels.cu"
#include "kernels/cuda/cuda_msa.cu"
