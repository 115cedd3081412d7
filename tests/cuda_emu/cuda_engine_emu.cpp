// engine/cuda_ops.cpp compiled against the CUDA emulation (see include/cuda_runtime.h).
#include "engine/cuda_ops.cpp"
