// kernels/cuda/cuda_kernels.cu compiled as C++ against the CUDA emulation (see
// include/cuda_runtime.h).
#include "kernels/cuda/cuda_kernels.cu"
