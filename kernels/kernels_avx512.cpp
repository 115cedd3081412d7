// The AVX-512 (F, BW, VL, VNNI) build of the kernel bodies (compile flags set in CMakeLists.txt).
#define KERNELS_NS avx512
#include "kernels/impl.inc"
