// The AVX2 + FMA + F16C build of the kernel bodies (compile flags set in CMakeLists.txt).
#define KERNELS_NS avx2
#include "kernels/impl.inc"
